"""Run kafka-python's own integration suite against a levelzero daemon.

kafka-python (https://github.com/dpkp/kafka-python) ships an integration suite,
``test/integration``, whose broker fixture can point at an external broker
(``KAFKA_URI``). This script starts ``levelzero run`` on embedded defaults (SQLite, local
objects, a fresh temporary data directory) with a Kafka listener on a free loopback port,
topic auto-creation on and 4 partitions per auto-created topic (what the suite's own broker
template sets: ``auto.create.topics.enable=true``, ``num.partitions=4``), runs the suite
against it with the suite's own kafka-python package, prints the count and stops the daemon.

The suite's source is not in this repository and CI does not have it, so this is not part of
``make test``. Get it at the tag the counts in docs/testing.md were taken at::

    git clone --branch 3.0.11 --depth 1 https://github.com/dpkp/kafka-python /tmp/kafka-python
    .venv/bin/python scripts/kafka_python_suite.py /tmp/kafka-python [pytest args...]

Extra arguments go to pytest (e.g. ``-k test_admin`` or ``-x``). The suite's pytest options
need pytest-timeout, and it skips its compression tests without the codecs' libraries::

    .venv/bin/pip install pytest-timeout lz4 zstandard python-snappy

``KAFKA_VERSION`` (default 4.2.0, the suite's own default) is the broker version the suite
assumes: it picks tests and the clients' ``api_version`` by it. The daemon's log is checked for
errors at the end (printed if any).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

READY_WAIT_S = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_listening(port: int, daemon: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_WAIT_S
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise SystemExit(f"levelzero exited with status {daemon.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"levelzero's Kafka listener did not open port {port} within {READY_WAIT_S:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a kafka-python checkout (tag 3.0.11)")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="passed to pytest")
    args = parser.parse_args()
    source = args.source.resolve()
    if not (source / "test" / "integration" / "conftest.py").is_file():
        raise SystemExit(f"{source} has no test/integration/conftest.py: not a kafka-python checkout")
    levelzero = Path(sys.executable).with_name("levelzero")
    with tempfile.TemporaryDirectory(prefix="levelzero-kafka-python-") as tmp:
        kafka_port, http_port = free_port(), free_port()
        env = {
            **os.environ,
            "LEVELZERO_KAFKA_LISTEN": f"127.0.0.1:{kafka_port}",
            "LEVELZERO_KAFKA_AUTO_CREATE_TOPICS": "true",
            "LEVELZERO_KAFKA_DEFAULT_PARTITIONS": "4",
        }
        log = open(Path(tmp) / "levelzero.log", "wb")  # noqa: SIM115 - closed below
        run = [
            str(levelzero),
            "run",
            "--data-dir",
            str(Path(tmp) / "data"),
            "--listen",
            f"127.0.0.1:{http_port}",
        ]
        daemon = subprocess.Popen(  # noqa: S603 - our own executable, our own arguments
            run,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_listening(kafka_port, daemon)
            suite_env = {
                **os.environ,
                "KAFKA_URI": f"PLAINTEXT://127.0.0.1:{kafka_port}",
                "KAFKA_VERSION": os.environ.get("KAFKA_VERSION", "4.2.0"),
                # The fixture checks that a Kafka installation directory exists even when the
                # broker is external; it never runs anything from it then.
                "KAFKA_ROOT": tmp,
            }
            suite_env.pop("PYTHONPATH", None)
            command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs"]
            command += ["test/integration", *args.pytest_args]
            # the suite the user pointed at, run as they asked
            done = subprocess.run(command, cwd=source, env=suite_env, check=False)  # noqa: S603
            return done.returncode
        finally:
            daemon.terminate()
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
            log.close()
            if daemon.returncode not in (0, -15):
                print(f"levelzero exited with status {daemon.returncode}; its log:", file=sys.stderr)
            errors = [
                line
                for line in (Path(tmp) / "levelzero.log").read_text(errors="replace").splitlines()
                if "level=error" in line or "Traceback" in line
            ]
            if errors:
                print(f"levelzero logged {len(errors)} error lines, the first:", file=sys.stderr)
                print(*errors[:20], sep="\n", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
