"""Readiness follows the storage's health: an object-store outage turns `/readyz` 503, `status`
says why, systemd's STATUS= line says what is wrong, and recovery (found by the probe, with no
traffic) turns it all back. The hysteresis rule itself is driven synchronously."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import uuid
from collections.abc import Sequence
from pathlib import Path

import anyio
import httpx
import pytest
from daemon_support import daemon_config

from levelzero.core.errors import ObjectNotFound, StorageError, StoreNeedsRestart
from levelzero.client import ApiError, Client
from levelzero.daemon.observed import ObservedLogStore, ObservedObjectStore, StoreMetrics
from levelzero.cli.commands import leaf_errors
from levelzero.daemon.service import Daemon, StartupError
from levelzero.daemon.storage_health import (
    STORAGE_FAILURES_TO_UNHEALTHY,
    STORAGE_STALL_UNHEALTHY_S,
    STORAGE_SUCCESSES_TO_HEALTHY,
    StorageHealth,
    StoreHealth,
    probe_stores,
)
from levelzero.daemon.systemd import Notifier
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.protocols import ObjectStore

WAIT_S = 20.0


def test_a_store_turns_unhealthy_only_after_failures_in_a_row_and_back_only_after_writes() -> None:
    store = StoreHealth("object store")
    error = StorageError("S3 put timed out")
    for _ in range(5):  # failures with a success between them: never unhealthy
        assert store.failed(1.0, "put", error) is False
        assert store.wrote(2.0) is False
    assert store.healthy
    flips = [store.failed(10.0 + n, "put", error) for n in range(STORAGE_FAILURES_TO_UNHEALTHY)]
    assert flips == [False] * (STORAGE_FAILURES_TO_UNHEALTHY - 1) + [True]
    condition = store.condition()
    assert not condition.healthy and condition.unhealthy_since == 10.0
    assert condition.last_error == "put: S3 put timed out"
    assert condition.describe().startswith("object store failing since 1970-01-01T00:00:10Z: put:")
    assert store.failed(20.0, "get", error) is False  # still unhealthy; since stays
    flips = [store.wrote(30.0 + n) for n in range(STORAGE_SUCCESSES_TO_HEALTHY)]
    assert flips == [False] * (STORAGE_SUCCESSES_TO_HEALTHY - 1) + [True]
    assert store.healthy and store.condition().unhealthy_since is None and store.transitions == 2


def test_a_failure_between_recovering_writes_starts_the_count_again() -> None:
    store = StoreHealth("log store")
    for n in range(STORAGE_FAILURES_TO_UNHEALTHY):
        store.failed(float(n), "append", StorageError("disk full"))
    for _ in range(STORAGE_SUCCESSES_TO_HEALTHY - 1):
        store.wrote(5.0)
    store.failed(6.0, "append", StorageError("disk full"))
    for _ in range(STORAGE_SUCCESSES_TO_HEALTHY - 1):
        assert store.wrote(7.0) is False
    assert not store.healthy
    assert store.wrote(8.0) is True


def test_storage_health_names_every_failing_store_and_reports_changes() -> None:
    changes: list[bool] = []
    health = StorageHealth(on_change=lambda h: changes.append(h.healthy), clock=lambda: 0.0)
    assert health.healthy and health.problem() is None
    for _ in range(STORAGE_FAILURES_TO_UNHEALTHY):
        health.failed(health.log_store, "append", StorageError("database or disk is full"))
    assert changes == [False]
    assert health.problem() == (
        "log store failing since 1970-01-01T00:00:00Z: append: database or disk is full"
    )
    for _ in range(STORAGE_SUCCESSES_TO_HEALTHY):
        health.wrote(health.log_store)
    assert changes == [False, True] and health.problem() is None


class Outage:
    """An object store whose every operation fails while `down` (an S3 outage, a missing
    bucket, a full disk all look like this to the daemon)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.down = False

    def _check(self, op: str) -> None:
        if self.down:
            raise StorageError(f"S3 {op} failed: simulated outage")

    async def put(self, key: str, data: bytes | bytearray) -> None:
        self._check("put")
        await self.inner.put(key, data)

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        self._check("get")
        return await self.inner.get(key, offset, length)

    async def head(self, key: str):
        self._check("head")
        return await self.inner.head(key)

    async def list_page(self, prefix: str, start_after: str | None = None, limit: int = 1000):
        self._check("list")
        return await self.inner.list_page(prefix, start_after, limit)

    async def delete_many(self, keys: Sequence[str]):
        self._check("delete")
        return await self.inner.delete_many(keys)

    async def aclose(self) -> None:
        await self.inner.aclose()


def received(sock: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


async def test_an_outage_turns_readiness_and_status_off_and_recovery_back_on(tmp_path: Path) -> None:
    outages: list[Outage] = []

    def wrap(store: ObjectStore) -> Outage:
        outages.append(Outage(store))
        return outages[-1]

    name = f"levelzero-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(b"\0" + name.encode())
        notify.setblocking(False)
        daemon = Daemon(
            daemon_config(tmp_path, gc__enabled=False),
            notifier=Notifier(environ={"NOTIFY_SOCKET": f"@{name}"}),
            wrap_object_store=wrap,
        )
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            assert daemon.url is not None
            async with (
                Client(daemon.url) as client,
                httpx.AsyncClient(base_url=daemon.url, trust_env=False) as http,
            ):
                await client.create_topic("t", 1)
                assert (await http.get("/readyz")).status_code == 200
                received(notify)  # READY=1 and start-up lines

                outages[0].down = True
                for _ in range(STORAGE_FAILURES_TO_UNHEALTHY):
                    with pytest.raises(ApiError) as caught:
                        await client.produce("t", 0, [b"lost to the outage"])
                    assert (caught.value.status, caught.value.code) == (503, "storage_error")
                ready = await http.get("/readyz")
                assert ready.status_code == 503 and ready.headers["retry-after"] == "1"
                assert ready.json()["error"] == "storage_error"
                assert "object store failing since" in ready.json()["message"]
                assert "simulated outage" in ready.json()["message"]
                status = await client.status()
                assert status.accepting is False
                assert status.not_accepting_reason is not None
                assert "storage unhealthy: object store failing" in status.not_accepting_reason
                text = await client.metrics()
                assert "levelzero_ready 0.0" in text
                assert 'levelzero_storage_healthy{store="object_store"} 0.0' in text
                [line] = received(notify)
                assert line.startswith("STATUS=NOT READY, storage unhealthy: object store failing since")
                assert "simulated outage" in line

                outages[0].down = False  # no traffic from here: the probe finds the recovery
                with anyio.fail_after(WAIT_S):
                    while (await http.get("/readyz")).status_code != 200:
                        await anyio.sleep(0.05)
                status = await client.status()
                assert status.accepting is True and status.not_accepting_reason is None
                assert "levelzero_ready 1.0" in await client.metrics()
                [line] = received(notify)
                assert line.startswith("STATUS=serving on ")
                assert (await client.produce("t", 0, [b"after"])).base_offset == 0
            daemon.request_stop("test")
    assert daemon.stopped_cleanly


def _idle_daemon(tmp_path: Path) -> Daemon:
    """A daemon none of whose own tasks writes to the log store (no epoch timer, GC,
    housekeeper or reconciler): only requests and the health probe do."""
    return Daemon(
        daemon_config(
            tmp_path,
            gc__enabled=False,
            housekeeper__enabled=False,
            reconciler__enabled=False,
            node__epoch_bump_interval_s=0,
        )
    )


async def test_an_idle_daemon_finds_its_log_store_recovered_by_the_probe(tmp_path: Path) -> None:
    """Nothing of its own writes to the log store (no epoch timer, no GC, no housekeeper): after
    a log-store outage the daemon stayed unready until traffic it no longer got. Its probe
    writes, and the third answered write turns it ready."""
    daemon = _idle_daemon(tmp_path)
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        assert daemon.url is not None
        async with httpx.AsyncClient(base_url=daemon.url, trust_env=False) as http:
            assert (await http.get("/readyz")).status_code == 200
            health = daemon.storage_health
            for _ in range(STORAGE_FAILURES_TO_UNHEALTHY):  # an outage, over by now
                health.failed(health.log_store, "append", StorageError("SQLite write failed: disk I/O error"))
            ready = await http.get("/readyz")
            assert ready.status_code == 503 and "log store failing since" in ready.json()["message"]
            with anyio.fail_after(WAIT_S):
                while (await http.get("/readyz")).status_code != 200:
                    await anyio.sleep(0.05)
            assert health.healthy
        daemon.request_stop("test")
    assert daemon.stopped_cleanly


async def test_a_log_store_that_refuses_writes_until_a_restart_stops_an_idle_daemon(tmp_path: Path) -> None:
    """The SQLite log store refuses every write once a batch failed (here: its writer process
    killed), until it is opened again. The daemon was to stop at a partition's next failed
    append, but an unready daemon gets no produce: it stayed up and unready, its probe failing
    every second, until someone restarted it. The probe's refusal stops it (status 1: systemd
    restarts it, and the restart replays the log)."""
    daemon = _idle_daemon(tmp_path)

    async def until_it_stops() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            assert daemon.url is not None and daemon.node is not None
            async with Client(daemon.url) as client:
                await client.create_topic("t", 1)  # (no produce: its fence events, written a
                # second later, would stop the daemon as a failed append does)
                store = daemon.node.log_store.inner  # type: ignore[attr-defined]
                os.kill(store.writer_pid, signal.SIGKILL)
                for name in ("u", "v", "w"):  # writes that are no partition's append
                    with pytest.raises(ApiError) as refused:
                        await client.create_topic(name, 1)
                    assert refused.value.status == 503
                with anyio.fail_after(WAIT_S):
                    await anyio.sleep_forever()  # the daemon's group fails: it stops itself

    with pytest.raises(BaseExceptionGroup) as stopped:
        await until_it_stops()
    leaves = leaf_errors(stopped.value)
    assert leaves and all(isinstance(leaf, StoreNeedsRestart) for leaf in leaves), leaves
    assert "refuses writes until the daemon restarts" in str(leaves[0])
    # Its restart opens the store again: writes work.
    daemon = Daemon(daemon_config(tmp_path))
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        assert daemon.url is not None
        async with Client(daemon.url) as client:
            assert (await client.produce("t", 0, [b"after"])).base_offset == 0
        daemon.request_stop("test")
    assert daemon.stopped_cleanly


async def test_a_missing_object_is_not_a_storage_failure() -> None:
    """ObjectNotFound is the store's answer (a data problem, 500), never an unhealthy store."""
    health = StorageHealth()
    store = ObservedObjectStore(MemoryObjectStore(), StoreMetrics(), health)
    for _ in range(STORAGE_FAILURES_TO_UNHEALTHY + 1):
        with pytest.raises(ObjectNotFound):
            await store.get("level_zero/data/000/000000000000000001/missing")
    assert health.healthy


class Hang:
    """An object store whose PUTs hang while `hung` is set, until `release` is set (a
    SIGSTOPped S3 endpoint: nothing fails, nothing answers)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.hung = False
        self.release = anyio.Event()
        self.waiting = 0

    async def put(self, key: str, data: bytes | bytearray) -> None:
        if self.hung:
            self.waiting += 1
            await self.release.wait()
        await self.inner.put(key, data)

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        return await self.inner.get(key, offset, length)

    async def head(self, key: str):
        return await self.inner.head(key)

    async def list_page(self, prefix: str, start_after: str | None = None, limit: int = 1000):
        return await self.inner.list_page(prefix, start_after, limit)

    async def delete_many(self, keys: Sequence[str]):
        return await self.inner.delete_many(keys)

    async def aclose(self) -> None:
        await self.inner.aclose()


class HangFirstPut(Hang):
    """A store whose first PUT hangs until `release` (a proxy that accepted the request and
    went silent) while every later one is answered: the store itself has recovered."""

    async def put(self, key: str, data: bytes | bytearray) -> None:
        self.waiting += 1
        if self.waiting == 1:
            await self.release.wait()
        await self.inner.put(key, data)


async def test_a_hung_probe_is_given_up_at_its_deadline_and_the_next_probes_find_the_recovery() -> None:
    health = StorageHealth()
    hang = HangFirstPut(MemoryObjectStore())
    store = ObservedObjectStore(hang, StoreMetrics(), health)
    for _ in range(STORAGE_FAILURES_TO_UNHEALTHY):
        health.failed(health.object_store, "put", StorageError("S3 put failed: simulated outage"))
    assert not health.healthy
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: probe_stores(store, MemoryLogStore(), health, probe_timeout_s=0.2, interval_s=0.01)
        )
        with anyio.fail_after(WAIT_S):  # never, without the probe's own deadline
            while not health.healthy:
                await anyio.sleep(0.01)
        assert not hang.release.is_set()  # the first probe was given up, not answered
        assert hang.waiting == 1 + STORAGE_SUCCESSES_TO_HEALTHY
        tg.cancel_scope.cancel()


async def test_a_request_outstanding_too_long_makes_the_store_unhealthy_until_answered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [1000.0]
    changes: list[bool] = []
    health = StorageHealth(on_change=lambda h: changes.append(h.healthy), clock=lambda: now[0])
    hang = Hang(MemoryObjectStore())
    store = ObservedObjectStore(hang, StoreMetrics(), health)
    await store.put("a", b"before")  # answered at 1000
    hang.hung = True
    async with anyio.create_task_group() as tg:
        tg.start_soon(store.put, "b", b"hangs")
        with anyio.fail_after(1):
            while hang.waiting == 0:
                await anyio.sleep(0.001)
        now[0] += STORAGE_STALL_UNHEALTHY_S  # at the bound: not yet
        assert health.problem() is None and health.object_store.healthy
        now[0] += 2.5
        with caplog.at_level(logging.WARNING, logger="levelzero.storage_health"):
            problem = health.problem()
        assert problem is not None
        assert problem.startswith("object store stalled: a put request outstanding for 12.5 s")
        assert not health.healthy and not health.object_store.healthy and changes == [False]
        [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert "object store stalled" in record.getMessage() and "12.5 s" in record.getMessage()
        health.check_stalled()  # still stalled: said once
        assert changes == [False]
        hang.release.set()  # the store answers
    assert health.healthy and health.problem() is None and changes == [False, True]


async def test_one_hung_request_among_answered_ones_is_not_a_stalled_store() -> None:
    now = [0.0]
    health = StorageHealth(clock=lambda: now[0])
    hang = Hang(MemoryObjectStore())
    store = ObservedObjectStore(hang, StoreMetrics(), health)
    hang.hung = True
    async with anyio.create_task_group() as tg:
        tg.start_soon(store.put, "b", b"hangs")
        with anyio.fail_after(1):
            while hang.waiting == 0:
                await anyio.sleep(0.001)
        now[0] = STORAGE_STALL_UNHEALTHY_S + 5
        assert await store.head("x") is None  # the store answers a HEAD
        now[0] += STORAGE_STALL_UNHEALTHY_S - 1
        assert health.problem() is None
        now[0] += 2  # nothing answered for longer than the bound: stalled
        assert health.problem() is not None
        tg.cancel_scope.cancel()  # given up: no longer outstanding, but still no answer
    assert health.problem() is not None  # stalled until the store answers something
    assert await store.head("x") is None
    assert health.problem() is None


async def test_a_stalled_request_given_up_is_not_a_recovery(caplog: pytest.LogCaptureFixture) -> None:
    """At shutdown the drain cancels requests a hung store never answered. Each end was taken
    for the end of the stall: "storage healthy again" was logged (twice, once where the store
    had just turned unhealthy) while the store still answered nothing."""
    now = [0.0]
    changes: list[bool] = []
    health = StorageHealth(on_change=lambda h: changes.append(h.healthy), clock=lambda: now[0])
    hang = Hang(MemoryObjectStore())
    store = ObservedObjectStore(hang, StoreMetrics(), health)
    hang.hung = True
    with caplog.at_level(logging.INFO, logger="levelzero.storage_health"):
        async with anyio.create_task_group() as tg:
            for key in ("a", "b"):
                tg.start_soon(store.put, key, b"hangs")
            with anyio.fail_after(1):
                while hang.waiting < 2:
                    await anyio.sleep(0.001)
            now[0] = STORAGE_STALL_UNHEALTHY_S + 5  # no check ran meanwhile
            tg.cancel_scope.cancel()  # the drain gives both up
        assert changes == [False] and not health.object_store.healthy
        assert "object store stalled: a put request" in (health.problem() or "")
        hang.hung = False
        await store.put("c", b"answered")  # the store answers: the stall is over
    assert changes == [False, True] and health.healthy
    said = [r.getMessage() for r in caplog.records]
    assert [m.split(":")[0] for m in said] == ["storage unhealthy", "storage healthy again"], said


class HungLog:
    """A log store whose appends hang until `release` is set (a database on a blackholed
    connection: nothing fails before the command timeout, nothing answers)."""

    def __init__(self) -> None:
        self.inner = MemoryLogStore()
        self.release = anyio.Event()
        self.waiting = 0

    async def append(self, *args, **kwargs):
        self.waiting += 1
        await self.release.wait()

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


async def start_a_hung_append(tg: anyio.abc.TaskGroup, log: HungLog, store: ObservedLogStore) -> None:
    """An append through `store` that `log` never answers, started in `tg`; back once it waits."""
    tg.start_soon(store.append, 1, 0, [])
    with anyio.fail_after(1):
        while log.waiting == 0:
            await anyio.sleep(0.001)


class ProbedLog(HungLog):
    """`HungLog` whose probe writes are counted, the first `hang_probes` of them hanging until
    `release`; while `failing`, each probe write fails as a database refusing writes would."""

    def __init__(self, hang_probes: int = 0) -> None:
        super().__init__()
        self.hang_probes = hang_probes
        self.probes = 0
        self.failing = False

    async def probe_write(self) -> None:
        self.probes += 1
        if self.probes <= self.hang_probes:
            await self.release.wait()
        if self.failing:
            raise StorageError("SQLite write failed: database or disk is full")
        await self.inner.probe_write()


async def test_a_stalled_log_store_write_given_up_is_found_answering_by_the_probe() -> None:
    """A log store write stalled, then given up (the client gone): the store stayed "stalled"
    until the daemon's next answered write, and an idle node (in a cluster, one the epoch timer
    does not bump on) made none: it stayed unready. The probe's write is that answer."""
    now = [0.0]
    health = StorageHealth(clock=lambda: now[0])
    log = ProbedLog()
    store = ObservedLogStore(log, StoreMetrics(), health)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        await start_a_hung_append(tg, log, store)
        now[0] = STORAGE_STALL_UNHEALTHY_S + 1
        health.check_stalled()
        assert not health.healthy and log.probes == 0  # no probe while healthy
        tg.cancel_scope.cancel()  # the append given up, never answered
    assert not health.log_store.healthy
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: probe_stores(MemoryObjectStore(), store, health, probe_timeout_s=1, interval_s=0.01)
        )
        with anyio.fail_after(WAIT_S):
            while not health.healthy:
                await anyio.sleep(0.01)
        probes = log.probes
        assert probes >= 1
        await anyio.sleep(0.1)  # healthy: no more probes
        assert log.probes == probes
        tg.cancel_scope.cancel()


async def test_a_failing_log_store_is_probed_until_writes_succeed_and_a_hung_probe_is_given_up() -> None:
    health = StorageHealth()
    log = ProbedLog(hang_probes=1)
    log.failing = True
    store = ObservedLogStore(log, StoreMetrics(), health)  # type: ignore[arg-type]
    for _ in range(STORAGE_FAILURES_TO_UNHEALTHY):
        health.failed(health.log_store, "append", StorageError("SQLite write failed: disk I/O error"))
    assert not health.healthy
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: probe_stores(
                MemoryObjectStore(),
                store,
                health,
                probe_timeout_s=1,
                log_probe_timeout_s=0.2,
                interval_s=0.01,
            )
        )
        with anyio.fail_after(WAIT_S):
            while log.probes < 4:  # the first hung and given up, the next ones failing
                await anyio.sleep(0.01)
        assert not health.healthy and not log.release.is_set()
        condition = health.log_store.condition()
        assert condition.last_error is not None and "disk is full" in condition.last_error
        log.failing = False  # the disk has room again
        probes = log.probes
        with anyio.fail_after(WAIT_S):
            while not health.healthy:
                await anyio.sleep(0.01)
        assert log.probes - probes >= STORAGE_SUCCESSES_TO_HEALTHY
        assert health.object_store.healthy
        tg.cancel_scope.cancel()


async def test_a_hung_log_store_write_is_a_stall_until_the_store_answers() -> None:
    """As the object store's: a log store write outstanding longer than the bound, with nothing
    answered meanwhile, turns the storage unhealthy before the database client's own timeout
    would fail it; any answer turns it healthy again."""
    now = [0.0]
    health = StorageHealth(clock=lambda: now[0])
    log = HungLog()
    store = ObservedLogStore(log, StoreMetrics(), health)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        await start_a_hung_append(tg, log, store)
        now[0] = STORAGE_STALL_UNHEALTHY_S - 1
        health.check_stalled()
        assert health.healthy
        now[0] = STORAGE_STALL_UNHEALTHY_S + 1.5
        health.check_stalled()
        assert not health.healthy
        problem = health.problem() or ""
        assert problem.startswith("log store stalled: an append request outstanding for 11.5 s"), problem
        assert await store.record_fence_events([]) is None  # the store answers another write
        health.check_stalled()
        assert health.healthy and health.problem() is None
        now[0] += STORAGE_STALL_UNHEALTHY_S + 1  # nothing answered since: stalled again
        health.check_stalled()
        assert not health.healthy
        log.release.set()  # the append is answered
    assert health.healthy and health.problem() is None


async def test_a_hung_object_store_turns_readiness_off_before_its_retries_run_out(tmp_path: Path) -> None:
    hangs: list[Hang] = []

    def wrap(store: ObjectStore) -> Hang:
        hangs.append(Hang(store))
        return hangs[-1]

    now = [0.0]
    daemon = Daemon(daemon_config(tmp_path, gc__enabled=False), wrap_object_store=wrap)
    daemon.storage_health.clock = lambda: now[0]
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        assert daemon.url is not None
        async with (
            Client(daemon.url) as client,
            httpx.AsyncClient(base_url=daemon.url, trust_env=False) as http,
        ):
            await client.create_topic("t", 1)
            assert (await client.produce("t", 0, [b"first"])).base_offset == 0
            hangs[0].hung = True
            produced: list[int] = []

            async def produce() -> None:
                produced.append((await client.produce("t", 0, [b"waits"])).base_offset)

            tg.start_soon(produce)
            with anyio.fail_after(WAIT_S):
                while hangs[0].waiting == 0:
                    await anyio.sleep(0.01)
            assert (await http.get("/readyz")).status_code == 200
            now[0] += STORAGE_STALL_UNHEALTHY_S + 1
            ready = await http.get("/readyz")
            assert ready.status_code == 503 and "object store stalled" in ready.json()["message"]
            status = await client.status()
            assert status.accepting is False and "stalled" in (status.not_accepting_reason or "")
            text = await client.metrics()
            assert "levelzero_ready 0.0" in text
            assert 'levelzero_storage_healthy{store="object_store"} 0.0' in text
            hangs[0].release.set()
            with anyio.fail_after(WAIT_S):
                while not produced:
                    await anyio.sleep(0.01)
            assert produced == [1]
            assert (await http.get("/readyz")).status_code == 200
            assert 'levelzero_storage_healthy{store="object_store"} 1.0' in await client.metrics()
        daemon.request_stop("test")
    assert daemon.stopped_cleanly


async def test_a_stop_forced_by_a_hung_store_answers_the_produce_in_progress_503_interrupted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The drain waits for in-flight produces; a hung store keeps one past
    server.shutdown_timeout_s and the stop is forced. The produce was cancelled as the event
    loop closed: uvicorn answered a bare 500 and logged a CancelledError traceback at ERROR.
    It is answered 503 `interrupted` (it may have been carried out), with no traceback."""
    hangs: list[Hang] = []

    def wrap(store: ObjectStore) -> Hang:
        hangs.append(Hang(store))
        return hangs[-1]

    config = daemon_config(
        tmp_path, gc__enabled=False, server__shutdown_timeout_s=2.0, node__drain_timeout_s=1.0
    )
    daemon = Daemon(config, wrap_object_store=wrap)
    answers: list[httpx.Response] = []
    with caplog.at_level(logging.INFO):
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            assert daemon.url is not None
            async with httpx.AsyncClient(base_url=daemon.url, trust_env=False, timeout=WAIT_S) as http:
                assert (await http.post("/v1/topics", json={"name": "t", "partitions": 1})).status_code == 201
                hangs[0].hung = True

                async def produce() -> None:
                    body = {"records": [{"value": "d2FpdHM="}]}
                    answers.append(await http.post("/v1/topics/t/partitions/0/records", json=body))

                tg.start_soon(produce)
                with anyio.fail_after(WAIT_S):
                    while hangs[0].waiting == 0:
                        await anyio.sleep(0.01)
                daemon.request_stop("the test")
                with anyio.fail_after(WAIT_S):
                    while not answers:
                        await anyio.sleep(0.01)
    (answer,) = answers
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"] == "interrupted" and "may or may not have been" in answer.json()["message"]
    assert answer.headers["retry-after"] == "1"
    assert not daemon.stopped_cleanly
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "Exception in ASGI application" in m], said
    assert any("were interrupted (answered 503 interrupted" in m for m in said), said


async def test_a_request_whose_body_is_still_arriving_at_a_stop_is_answered_503_interrupted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """uvicorn's graceful stop waits a third of server.shutdown_timeout_s for the requests in
    progress, then cancels them: a request whose body a slow client was still sending got a
    bare 500 in plain text and an ERROR traceback (found by a new user's trial). It is
    answered 503 `interrupted` in JSON, with no traceback."""
    config = daemon_config(
        tmp_path, gc__enabled=False, server__shutdown_timeout_s=3.0, node__drain_timeout_s=1.0
    )
    daemon = Daemon(config)
    with caplog.at_level(logging.INFO):
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            assert daemon.url is not None and daemon.port is not None
            async with httpx.AsyncClient(base_url=daemon.url, trust_env=False) as http:
                assert (await http.post("/v1/topics", json={"name": "t", "partitions": 1})).status_code == 201
            stream = await anyio.connect_tcp("127.0.0.1", daemon.port)
            async with stream:
                head = (
                    "POST /v1/topics/t/partitions/0/records HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
                )
                await stream.send(head.encode() + b'{"records":[')  # and the rest never comes
                await anyio.sleep(0.2)  # the request is in the app, reading its body
                daemon.request_stop("the test")
                answer = b""
                with anyio.fail_after(WAIT_S):
                    while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                        try:
                            answer += await stream.receive()
                        except (anyio.EndOfStream, anyio.BrokenResourceError):
                            break
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 503 Service Unavailable", answer
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in headers.lower(), answer
    assert json.loads(body)["error"] == "interrupted"
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "Exception in ASGI application" in m], said


class HangGets(Hang):
    """A store whose GETs hang (an endpoint that took the connection and went silent)."""

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        self.waiting += 1
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


async def test_a_store_hung_at_start_up_is_a_clear_start_up_error_before_systemd_gives_up(
    tmp_path: Path,
) -> None:
    """Claiming the store reads its marker; an endpoint that answers nothing kept the start
    waiting through the S3 client's retries (up to 175 s), past the unit's TimeoutStartSec=90:
    systemd killed it, and the log said nothing of why."""
    daemon = Daemon(daemon_config(tmp_path), wrap_object_store=HangGets)
    daemon.object_store_start_timeout_s = 0.2
    with anyio.fail_after(WAIT_S), pytest.raises(BaseException) as caught:  # noqa: PT011 - a group
        await daemon.run()
    [error] = [e for e in leaf_errors(caught.value) if isinstance(e, StartupError)]
    assert str(error).startswith(
        f"the object store {tmp_path / 'objects'} did not answer within 0.2 s while claiming it"
    )
