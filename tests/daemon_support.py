"""Helpers to run the daemon in tests: in-process (real HTTP on a free loopback port) and as a
subprocess (`python -m levelzero.cli run`), polled with bounded loops. Importable from any
test directory as `daemon_support` (tests/ is on sys.path through tests/conftest.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from levelzero.client import Client
from levelzero.config import Config, load_config
from levelzero.daemon.service import Daemon, running_daemon
from levelzero.testing.loopback import free_local_port

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 40.0
POLL_S = 0.05
TOKEN = "test-token-0123456789abcdef"


def daemon_config(data_dir: Path, **overrides: Any) -> Config:
    """Embedded defaults on `data_dir`, a free port, and `section__key=value` overrides."""
    settings: dict[tuple[str, str], Any] = {
        ("storage", "data_dir"): str(data_dir),
        ("server", "listen"): "127.0.0.1:0",
        ("batcher", "linger_ms"): 5.0,
        ("node", "epoch_bump_interval_s"): 0.0,
        ("reconciler", "object_age_max_s"): 0.0,  # an L1 object every pass: tests wait less
    }
    for name, value in overrides.items():
        section, key = name.split("__")
        settings[(section, key)] = value
    return load_config(None, environ={}, overrides=settings)


@asynccontextmanager
async def daemon_and_client(
    data_dir: Path,
    *,
    token: str | None = None,
    wrap_object_store=None,
    **overrides: Any,
) -> AsyncIterator[tuple[Daemon, Client]]:
    config = daemon_config(data_dir, **overrides)
    async with running_daemon(config, wrap_object_store=wrap_object_store) as daemon:
        assert daemon.url is not None
        async with Client(daemon.url, token=token) as client:
            yield daemon, client


def _kafka_produce_and_refused_create(port: int, topic: str) -> None:
    """A Kafka produce, and a CreateTopics answered TOPIC_ALREADY_EXISTS (an error code): the
    Kafka listener's series."""
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}"})
    producer.produce(topic, b"over kafka", partition=1)
    assert producer.flush(20) == 0
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    refused = admin.create_topics([NewTopic(topic, 1, 1)])[topic].exception(20)
    assert refused is not None and "TOPIC_ALREADY_EXISTS" in str(refused), refused


async def scrape_of_a_working_daemon(data_dir: Path) -> str:
    """/metrics of a daemon that has done a little of everything a node alone does (created
    topics, one compacted, produced over HTTP and Kafka, fetched, advanced the epoch,
    housekept, run a GC round),
    so that the series that appear only once something happened are there."""
    async with daemon_and_client(data_dir, gc__grace_s=0.0, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("t", 2)
        await client.create_topic("c", 1, {"cleanup.policy": "compact"})
        await client.produce("t", 0, [(None, b"a"), (b"k", b"b")])
        await anyio.to_thread.run_sync(_kafka_produce_and_refused_create, daemon.kafka_port, "t")
        await client.produce("c", 0, [(b"k", b"1"), (b"k", b"2")])
        await client.fetch("t", 0, 0, None)
        await client.advance_epoch()
        assert (await client._http.post("/v1/housekeeper/run", json={"force": True})).status_code == 200
        await client.gc_run(dry_run=False)  # the GC's per-round gauges appear after a round
        response = await client._http.get("/metrics")
    assert response.status_code == 200
    return response.text


# ------------------------------------------------------------------------------ subprocess


free_port = free_local_port  # below the ephemeral range: see levelzero/testing/loopback.py


def apps_python_for(module: str, application: str) -> str:
    """The interpreter of the Kafka acceptance applications (`.venv-apps`, which `make test`
    builds from tests/apps/requirements.txt; LEVELZERO_TEST_APPS_PYTHON names another) that can
    import `module`; a one-line instruction where there is none."""
    repo = Path(__file__).resolve().parents[1]
    python = os.environ.get("LEVELZERO_TEST_APPS_PYTHON") or str(repo / ".venv-apps" / "bin" / "python")
    probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.fail(f"{application} is not installed for {python}: run `make .venv-apps/.installed`")
    return python


def clean_environ(**extra: str) -> dict[str, str]:
    """This environment without LEVELZERO_* settings or systemd variables, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("LEVELZERO_") and k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
    }
    env.update(extra)
    return env


class DaemonProcess:
    """`levelzero run` as a child process on a fixed data dir and port (restartable)."""

    def __init__(self, data_dir: Path, log_dir: Path, env: Mapping[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = clean_environ(**{"LEVELZERO_BATCHER_LINGER_MS": "5", **(env or {})})
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"daemon-{self.starts}.log"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "levelzero.cli",
            "run",
            "--data-dir",
            str(self.data_dir),
            "--listen",
            f"127.0.0.1:{self.port}",
        ]

    def start(self, wait: bool = True) -> DaemonProcess:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        with self.log_path.open("wb") as log_file:
            self.proc = subprocess.Popen(
                self.command(), stdout=log_file, stderr=subprocess.STDOUT, env=self.env
            )
        if wait:
            self.wait_ready()
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        with httpx.Client(trust_env=False, timeout=2.0) as http:
            while time.monotonic() < deadline:
                try:
                    if http.get(f"{self.url}/readyz").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                try:
                    self.proc.wait(timeout=POLL_S)  # doubles as the pause between polls
                except subprocess.TimeoutExpired:
                    continue
                pytest.fail(f"daemon exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
        pytest.fail(f"daemon not ready within {START_TIMEOUT_S} s:\n{self.log()[-4000:]}")

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def wait_exit(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"daemon did not exit within {timeout_s} s:\n{self.log()[-4000:]}")

    def stop(self) -> int:
        self.signal(signal.SIGTERM)
        return self.wait_exit()

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def http(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, trust_env=False, timeout=30.0, headers=headers)

    def cli(
        self, *args: str, input: bytes | None = None, timeout_s: float = 60.0
    ) -> subprocess.CompletedProcess[bytes]:
        """A `levelzero` client command against this daemon."""
        return subprocess.run(
            [sys.executable, "-m", "levelzero.cli", *args],
            input=input,
            capture_output=True,
            timeout=timeout_s,
            env=clean_environ(LEVELZERO_URL=self.url),
        )


def postgres_control(dsn: str) -> dict[str, str]:
    """`[control]` settings for a PostgreSQL DSN as environment variables: the DSN without its
    password, the password apart (the daemon takes it from the environment only)."""
    parts = urllib.parse.urlsplit(dsn)
    host = parts.netloc.rsplit("@", 1)[-1]
    bare = urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}@{host}"))
    return {
        "LEVELZERO_CONTROL_KIND": "postgres",
        "LEVELZERO_CONTROL_DSN": bare,
        "LEVELZERO_CONTROL_PASSWORD": parts.password or "",
    }


def postgres_overrides(dsn: str) -> dict[str, Any]:
    """The same as `daemon_config` overrides (`control__key=value`)."""
    env = postgres_control(dsn)
    return {
        "control__kind": "postgres",
        "control__dsn": env["LEVELZERO_CONTROL_DSN"],
        "control__password": env["LEVELZERO_CONTROL_PASSWORD"],
    }


def s3_environ(endpoint, bucket: str) -> dict[str, str]:
    """`[storage]` on S3 (the test endpoint, path style) as environment variables."""
    return {
        "LEVELZERO_STORAGE_KIND": "s3",
        "LEVELZERO_S3_ENDPOINT": endpoint.endpoint_url,
        "LEVELZERO_S3_BUCKET": bucket,
        "LEVELZERO_S3_REGION": endpoint.region,
        "LEVELZERO_S3_PATH_STYLE": "true",
        "LEVELZERO_S3_ACCESS_KEY": endpoint.access_key,
        "LEVELZERO_S3_SECRET_KEY": endpoint.secret_key,
        "LEVELZERO_S3_MAX_ATTEMPTS": "2",
    }


# Short intervals of every background task, so a test can wait for the collection of every L0
# object after its workload (quiescence).
QUIESCENT_ENVIRON = {
    "LEVELZERO_NODE_EPOCH_BUMP_INTERVAL_S": "0.3",
    "LEVELZERO_NODE_EPOCH_CACHE_TTL_S": "1",
    "LEVELZERO_RECONCILER_INTERVAL_S": "0.2",
    "LEVELZERO_RECONCILER_OBJECT_AGE_MAX_S": "0",  # an L1 object every pass: quiet sooner
    "LEVELZERO_HOUSEKEEPER_INTERVAL_S": "0.2",
    "LEVELZERO_HOUSEKEEPER_IDLE_AFTER_S": "0.3",
    "LEVELZERO_GC_INTERVAL_S": "0.2",
    "LEVELZERO_GC_IDLE_BACKOFF_MAX_S": "0.5",
    "LEVELZERO_GC_GRACE_S": "0",
}


# ------------------------------------------------------------------------------ network faults


class BlackholeProxy:
    """A TCP proxy on loopback in front of `target_port` (asyncio, in the test's loop) whose
    connections can be blackholed: `blackhole()` stops forwarding bytes either way and answers
    nothing, without closing a connection (a silent network partition: the client's calls hang
    on their own timeouts); connections opened meanwhile are accepted and hang too. `heal()`
    closes every connection it held (as TCP keep-alive would end them) and forwards again."""

    CHUNK_BYTES = 65_536

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.blackholed = False
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> BlackholeProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def dsn(self, dsn: str) -> str:
        """`dsn` with its host and port replaced by this proxy's."""
        parts = urllib.parse.urlsplit(dsn)
        user, _, _ = parts.netloc.rpartition("@")
        netloc = f"{user}@127.0.0.1:{self.port}" if user else f"127.0.0.1:{self.port}"
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))

    def blackhole(self) -> None:
        self.blackholed = True

    def heal(self) -> None:
        self.blackholed = False
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    async def aclose(self) -> None:
        self.heal()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self._writers.add(client_w)
        if self.blackholed:
            return  # accepted, never connected on: it hangs until healed
        try:
            target_r, target_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        self._writers.add(target_w)
        for reader, writer in ((client_r, target_w), (target_r, client_w)):
            task = asyncio.get_running_loop().create_task(self._pipe(reader, writer))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(self.CHUNK_BYTES):
                if self.blackholed:
                    continue  # read and dropped: the sender is not blocked, nobody answers
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if not self.blackholed:
                writer.close()


# ---------------------------------------------------------------- raw HTTP requests and errors

JSON = {"content-type": "application/json"}


async def raw(client, method: str, path: str, **kwargs) -> httpx.Response:
    """A request as given; a POST says it is JSON unless the test gives its own headers."""
    if method == "POST":
        kwargs.setdefault("headers", JSON)
    return await client._http.request(method, path, **kwargs)


def assert_error(response: httpx.Response, status: int, code: str, fragment: str = "") -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error", "message"}
    assert body["error"] == code, body
    assert fragment in body["message"], body
