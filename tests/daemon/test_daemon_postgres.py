"""The daemon with `control.kind = "postgres"`: a round trip whose state outlives the daemon in
the database, the password kept out of the configuration file and the logs, bad settings
refused with exit status 2, and a PostgreSQL restart under load (readiness follows, the daemon
reconnects by itself, nothing acknowledged is lost)."""

from __future__ import annotations

import base64
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from levelzero.config import ConfigError, load_config
from levelzero.testing.postgres import ServerUnavailable, start_throwaway

from daemon_support import (
    DaemonProcess,
    clean_environ,
    daemon_and_client,
    postgres_control,
    postgres_overrides,
)


async def test_round_trip_and_state_kept_in_the_database(tmp_path: Path, postgres_dsn: str) -> None:
    objects = tmp_path / "data"  # local objects; the control plane is the database
    async with daemon_and_client(objects, **postgres_overrides(postgres_dsn)) as (_, client):
        await client.create_topic("t", 2)
        ack = await client.produce("t", 1, [(None, b"v0"), (b"k", b"v1")])
        assert (ack.base_offset, ack.last_offset) == (0, 1)
        epoch = await client.advance_epoch()
    assert not (objects / "levelzero.db").exists()  # nothing went to SQLite
    async with daemon_and_client(objects, **postgres_overrides(postgres_dsn)) as (_, client):
        fetched = await client.fetch("t", 1, 0)
        assert [(r.offset, r.key, r.value) for r in fetched.records] == [(0, None, b"v0"), (1, b"k", b"v1")]
        assert (await client.status()).cluster_epoch >= epoch
        ack = await client.produce("t", 1, [b"v2"])
        assert ack.base_offset == 2


def test_the_password_comes_from_the_environment_or_a_file_never_the_toml(tmp_path: Path) -> None:
    toml = tmp_path / "levelzero.toml"
    toml.write_text(
        '[control]\nkind = "postgres"\ndsn = "postgresql://u@127.0.0.1/db"\npassword = "s3cret"\n'
    )
    with pytest.raises(ConfigError, match="control.password may only come from the environment"):
        load_config(str(toml), environ={})
    for dsn in [
        "postgresql://u:s3cret@127.0.0.1/db",
        # as a parameter too (it was taken, then shown by `config show` and the start-up log)
        "postgresql://u@127.0.0.1/db?password=s3cret",
        "postgresql://u@127.0.0.1/db?sslmode=require&PASSWORD=s3cret",
        "postgresql://u@127.0.0.1/db?sslpassword=s3cret",
    ]:
        toml.write_text(f'[control]\nkind = "postgres"\ndsn = "{dsn}"\n')
        with pytest.raises(ConfigError, match="dsn must not hold a password"):
            load_config(str(toml), environ={})
    toml.write_text('[control]\nkind = "postgres"\ndsn = "postgresql://u@127.0.0.1/db?sslmode=require"\n')
    assert load_config(str(toml), environ={}).control.dsn.endswith("?sslmode=require")
    # ?port= (or ?host=) beside a host in the URL: the driver connected to port 5432, and its
    # refusal named no address (an operator's trial); a socket directory as ?host= stays valid.
    for dsn in ["postgresql://u@127.0.0.1/db?port=25432", "postgresql://u@db.example/db?host=10.0.0.1"]:
        toml.write_text(f'[control]\nkind = "postgres"\ndsn = "{dsn}"\n')
        with pytest.raises(ConfigError, match="which the PostgreSQL driver ignores beside a host"):
            load_config(str(toml), environ={})
    toml.write_text(
        '[control]\nkind = "postgres"\ndsn = "postgresql://u@/db?host=/run/postgresql&port=5433"\n'
    )
    assert load_config(str(toml), environ={}).control.dsn.endswith("port=5433")
    secret_file = tmp_path / "pw"
    secret_file.write_text("from-file\n")
    toml.write_text(
        '[control]\nkind = "postgres"\ndsn = "postgresql://u@127.0.0.1/db"\n'
        f'password_file = "{secret_file}"\n'
    )
    assert load_config(str(toml), environ={}).control.read_password() == "from-file"
    config = load_config(
        None,
        environ={
            "LEVELZERO_CONTROL_KIND": "postgres",
            "LEVELZERO_CONTROL_DSN": "postgresql://u@127.0.0.1/db",
            "LEVELZERO_CONTROL_PASSWORD": "from-env",
        },
    )
    assert config.control.read_password() == "from-env"
    with pytest.raises(ConfigError, match="control.dsn is required"):
        load_config(None, environ={"LEVELZERO_CONTROL_KIND": "postgres"})


def test_wrong_password_exits_2_without_logging_it(tmp_path: Path, postgres_dsn: str) -> None:
    env = clean_environ(
        **{**postgres_control(postgres_dsn), "LEVELZERO_CONTROL_PASSWORD": "not-the-password-42"}
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "levelzero.cli",
            "run",
            "--data-dir",
            str(tmp_path / "d"),
            "--listen",
            "127.0.0.1:0",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "authentication failed" in done.stderr
    # ... saying how levelzero takes the password
    assert "give the password as LEVELZERO_CONTROL_PASSWORD in the environment" in done.stderr
    assert "control.password_file" in done.stderr
    assert "not-the-password-42" not in done.stderr + done.stdout


def test_postgres_restart_under_load_readiness_and_reconnect(tmp_path: Path) -> None:
    """Producers keep writing while PostgreSQL stops and starts again: while it is down
    readiness is 503 and no produce succeeds without its commit; afterwards the daemon is ready
    again without a restart, and every acknowledged record reads back."""
    try:
        server = start_throwaway()
    except ServerUnavailable as error:
        pytest.fail(str(error), pytrace=False)
    env = {**postgres_control(server.dsn()), "LEVELZERO_CONTROL_RECONNECT_TIMEOUT_S": "120"}
    daemon = DaemonProcess(tmp_path / "data", tmp_path, env)
    acked: list[tuple[int, bytes]] = []
    statuses: list[int] = []
    stop = threading.Event()

    def produce() -> None:
        with daemon.http() as http:
            i = 0
            while not stop.is_set():
                value = f"v{i}".encode()
                i += 1
                r = http.post(RECORDS, json={"records": [{"value": _b64(value)}]}, timeout=150)
                statuses.append(r.status_code)
                if r.status_code == 200:
                    acked.append((r.json()["base_offset"], value))
                else:
                    assert r.status_code == 503, r.text
                    time.sleep(0.05)

    try:
        daemon.start()
        with daemon.http() as http:
            assert http.post("/v1/topics", json={"name": "t", "partitions": 1}).status_code in (200, 201)
            producer = threading.Thread(target=produce)
            producer.start()
            _wait(lambda: len(acked) >= 20, "acks before the restart")
            server.stop("fast")
            _wait(lambda: http.get("/readyz").status_code == 503, "readiness 503 while down")
            before = len(acked)
            server.start()
            daemon.wait_ready()  # reconnected by itself
            _wait(lambda: len(acked) >= before + 20, "acks after the restart")
            stop.set()
            producer.join(timeout=160)
            assert not producer.is_alive()
            for offset, value in acked:
                r = http.get(RECORDS, params={"offset": offset})
                assert r.status_code == 200, r.text
                assert _b64d(r.json()["records"][0]["value"]) == value
        assert daemon.proc is not None and daemon.proc.poll() is None  # never restarted
        assert daemon.stop() == 0
    finally:
        stop.set()
        daemon.cleanup()
        server.close()


RECORDS = "/v1/topics/t/partitions/0/records"
WAIT_S = 60.0


def _wait(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _b64d(text: str) -> bytes:
    return base64.b64decode(text)
