"""A throwaway PostgreSQL server for tests and `levelzero bench`: `initdb` + `pg_ctl` from the
machine's PostgreSQL binaries in a temporary directory, listening on a free loopback port and a
Unix socket in that directory, `fsync` off (nothing in it outlives the run).

`initdb` refuses to run as root, so as root the server runs as the `postgres` user (Debian's
`postgresql` package creates it) and the directory is handed to that user.

Never imported by the daemon: only tests and the bench start servers.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from levelzero.testing.loopback import free_local_port

BINARIES = ("initdb", "pg_ctl", "postgres")
INSTALL_HINT = (
    "PostgreSQL server binaries (initdb, pg_ctl, postgres) are not on PATH: install them "
    "(Debian/Ubuntu: apt-get install postgresql, then add /usr/lib/postgresql/15/bin to PATH) "
    "or set LEVELZERO_TEST_POSTGRES_DSN to an existing server"
)
START_TIMEOUT_S = 60
SERVER_USER = "postgres"  # the account the server runs as when we are root
SUPERUSER = "levelzero"
SUPERUSER_PASSWORD = "levelzero-test"
DATABASE = "postgres"  # every server has it; tests create their own databases in it


class ServerUnavailable(RuntimeError):
    """No PostgreSQL binaries here, or the server would not start."""


@dataclass
class ThrowawayServer:
    root: Path
    port: int
    _as_user: list[str]
    fsync: bool = False  # tests: off; the bench turns it on to measure real commits

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root

    def dsn(self, database: str = DATABASE, password: str | None = SUPERUSER_PASSWORD) -> str:
        auth = SUPERUSER if password is None else f"{SUPERUSER}:{password}"
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{database}"

    def pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self._as_user, "pg_ctl", "-D", str(self.data_dir), *args],
            capture_output=True,
            text=True,
            check=check,
            timeout=START_TIMEOUT_S,
        )

    def start(self) -> None:
        options = (
            f"-c port={self.port} -c listen_addresses=127.0.0.1"
            f" -c unix_socket_directories={self.socket_dir}"
            f" -c fsync={'on' if self.fsync else 'off'}"
            f" -c full_page_writes={'on' if self.fsync else 'off'} -c max_connections=200"
        )
        done = self.pg_ctl(
            "-w",
            "-t",
            str(START_TIMEOUT_S),
            "-l",
            str(self.root / "server.log"),
            "-o",
            options,
            "start",
            check=False,
        )
        if done.returncode != 0:
            log = (self.root / "server.log").read_text(errors="replace")[-2000:]
            raise ServerUnavailable(f"pg_ctl start failed: {done.stderr.strip()} {log}")

    def stop(self, mode: str = "fast") -> None:
        self.pg_ctl("-w", "-m", mode, "stop", check=False)

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def close(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def binaries_missing() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None]


def start_throwaway() -> ThrowawayServer:
    """initdb and start; the caller closes it. Raises ServerUnavailable."""
    missing = binaries_missing()
    if missing:
        raise ServerUnavailable(INSTALL_HINT)
    root = Path(tempfile.mkdtemp(prefix="levelzero-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        try:
            account = pwd.getpwnam(SERVER_USER)
        except KeyError:
            raise ServerUnavailable(
                f"running as root, and there is no '{SERVER_USER}' user to run the server as"
            ) from None
        os.chown(root, account.pw_uid, account.pw_gid)
        as_user = ["runuser", "-u", SERVER_USER, "--"]
    password_file = root / "password"
    password_file.write_text(SUPERUSER_PASSWORD + "\n")
    if as_user:
        os.chown(password_file, pwd.getpwnam(SERVER_USER).pw_uid, -1)
    server = ThrowawayServer(root, free_local_port(), as_user)
    done = subprocess.run(
        [
            *as_user,
            "initdb",
            "-D",
            str(server.data_dir),
            "-U",
            SUPERUSER,
            f"--pwfile={password_file}",
            "--auth=scram-sha-256",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        ],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )
    password_file.unlink()
    if done.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise ServerUnavailable(f"initdb failed: {done.stderr.strip()}")
    try:
        server.start()
    except BaseException:
        server.close()
        raise
    return server
