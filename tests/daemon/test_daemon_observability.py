"""What an operator scrapes besides the node's own counters: process metrics and the build,
the data directory's free space, readiness, and the latency and errors of every object-store
operation and log-store commit."""

from __future__ import annotations

import inspect
import json
import logging
import os
import socket
from pathlib import Path

import httpx
import pytest
from daemon_support import TOKEN, daemon_and_client
from prometheus_client import CollectorRegistry, enable_created_metrics
from prometheus_client.parser import text_string_to_metric_families

from levelzero.cli.commands import leaf_errors
from levelzero.core.errors import NotLeader, ObjectNotFound, StorageError
from levelzero.daemon.buildinfo import version
from levelzero.daemon.logs import JsonFormatter
from levelzero.daemon.service import StartupError
from levelzero.daemon.observed import (
    LOG_STORE_READS,
    LOG_STORE_WRITES,
    OPTIONAL_LOG_STORE_WRITES,
    ObservedLogStore,
    ObservedObjectStore,
    StoreMetrics,
)
from levelzero.daemon.storage_health import STORAGE_FAILURES_TO_UNHEALTHY, StorageHealth
from levelzero.storage import protocols
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.sqlite import SqliteLogStore


def registry_of(metrics: StoreMetrics) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    return registry


async def test_object_store_operations_are_timed_and_failures_counted() -> None:
    metrics = StoreMetrics()
    registry = registry_of(metrics)
    store = ObservedObjectStore(MemoryObjectStore(), metrics)
    await store.put("a/1", b"x")
    await store.put("a/2", b"y")
    assert await store.get("a/1") == b"x"
    with pytest.raises(ObjectNotFound):
        await store.get("a/missing")
    assert [o.key for o in (await store.list_page("a/")).objects] == ["a/1", "a/2"]
    assert (await store.head("a/2")).size == 1
    assert sorted((await store.delete_many(["a/1", "a/2"])).deleted) == ["a/1", "a/2"]

    def count(operation: str) -> float | None:
        return registry.get_sample_value(
            "levelzero_object_store_request_duration_seconds_count", {"operation": operation}
        )

    assert (count("put"), count("get"), count("list"), count("head"), count("delete")) == (2, 2, 1, 1, 1)
    assert (
        registry.get_sample_value(
            "levelzero_object_store_errors_total", {"operation": "get", "error": "object_not_found"}
        )
        == 1
    )
    assert (
        registry.get_sample_value(
            "levelzero_object_store_errors_total", {"operation": "put", "error": "storage_error"}
        )
        == 0
    )


def test_missing_object_series_exist_before_the_first_missing_object() -> None:
    """LevelZeroObjectsMissing is an increase(): a series born at 1 with the first missing
    object would show no increase, and the first loss would not page."""
    registry = registry_of(StoreMetrics())
    for operation in ("get", "head"):
        labels = {"operation": operation, "error": "object_not_found"}
        assert registry.get_sample_value("levelzero_object_store_errors_total", labels) == 0


class _Slow:
    """An object store whose requests take `took_s` each, on the test's clock."""

    def __init__(self, now: list[float]) -> None:
        self.inner = MemoryObjectStore()
        self.now = now
        self.took_s = 0.0

    async def put(self, key: str, data: bytes | bytearray) -> None:
        self.now[0] += self.took_s
        await self.inner.put(key, data)

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        self.now[0] += self.took_s
        return await self.inner.get(key, offset, length)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


async def test_a_slow_object_store_request_is_a_throttled_warning_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    slow = _Slow(now)
    store = ObservedObjectStore(slow, StoreMetrics(), clock=lambda: now[0])  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="levelzero.storage"):
        slow.took_s = 3.0
        await store.put("a/1", b"x")  # slow, not that slow
        slow.took_s = 12.5
        for _ in range(3):  # within 10 s of the first line: held back but one
            await store.put("a/2", b"y")
            now[0] -= 12.0
        assert await store.get("a/1") == b"x"  # another operation: a line of its own
        now[0] += 30.0
        await store.put("a/3", b"z")
    assert [r.getMessage() for r in caplog.records] == [
        "object store slow: a put request took 12.5 s (succeeded; more than 10 s)",
        "object store slow: a get request took 12.5 s (succeeded; more than 10 s)",
        "object store slow: a put request took 12.5 s (succeeded; more than 10 s)"
        " (and 2 more like it since the last such warning)",
    ]
    assert (caplog.records[0].operation, caplog.records[0].duration_s) == ("put", 12.5)


class _Refusing:
    """The two ways a log-store write fails: the store broke, or it refused (a stale term)."""

    async def append(self, pid: int, expected_term: int, records: list) -> None:
        if pid == 0:
            raise StorageError("disk I/O error")
        if pid == 1:
            raise NotLeader("t/1", expected_term, 3)

    async def begin_term(self, *args: object) -> None: ...

    def __getattr__(self, name: str):
        async def write(*args: object, **kwargs: object) -> None: ...

        return write

    def statistics(self) -> str:
        return "inner statistics"


async def test_log_store_commits_are_timed_and_only_store_failures_are_errors() -> None:
    metrics = StoreMetrics()
    registry = registry_of(metrics)
    store = ObservedLogStore(_Refusing(), metrics)  # type: ignore[arg-type]
    await store.append(2, 1, [])
    with pytest.raises(StorageError):
        await store.append(0, 1, [])
    with pytest.raises(NotLeader):
        await store.append(1, 2, [])
    assert store.statistics() == "inner statistics"  # the rest is the inner store's
    assert (
        registry.get_sample_value(
            "levelzero_log_store_commit_duration_seconds_count", {"operation": "append"}
        )
        == 1
    )
    assert (
        registry.get_sample_value(
            "levelzero_log_store_errors_total", {"operation": "append", "error": "storage_error"}
        )
        == 1
    )


async def test_a_running_daemon_exports_process_build_disk_readiness_and_store_metrics(
    tmp_path: Path,
) -> None:
    async with daemon_and_client(tmp_path) as (daemon, client):
        await client.create_topic("t", 1)
        await client.produce("t", 0, [(None, b"record")])
        await client.fetch("t", 0, 0, None)
        text = (await client._http.get("/metrics")).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("process_resident_memory_bytes") > 10 * 1024 * 1024
    assert value("process_open_fds") > 3 and value("process_start_time_seconds") > 1.6e9
    assert value("process_cpu_seconds_total") > 0
    build = [k for k in samples if k[0] == "levelzero_build_info"]
    assert len(build) == 1 and ("version", version()) in build[0][1] and samples[build[0]] == 1
    disk = os.statvfs(tmp_path)
    assert 0 < value("levelzero_data_dir_free_bytes") <= value("levelzero_data_dir_size_bytes")
    assert value("levelzero_data_dir_size_bytes") == disk.f_blocks * disk.f_frsize
    assert value("levelzero_ready") == 1
    # The upload of the record and the store ownership marker; the record's placeholder commit.
    assert value("levelzero_object_store_request_duration_seconds_count", operation="put") >= 1
    assert value("levelzero_log_store_commit_duration_seconds_count", operation="append") >= 1
    assert value("levelzero_log_store_commit_duration_seconds_count", operation="create_topic") == 1


async def test_a_scrape_has_no_created_series(tmp_path: Path) -> None:
    """prometheus_client would add a `*_created` series to every counter and histogram (per
    label set), doubling them; the daemon turns that off as it sets up its registry."""
    enable_created_metrics()  # the library's default, whatever an earlier test did
    async with daemon_and_client(tmp_path) as (daemon, client):
        await client.create_topic("t", 1)
        await client.produce("t", 0, [(None, b"record")])
        text = (await client._http.get("/metrics")).text
    names = {s.name for family in text_string_to_metric_families(text) for s in family.samples}
    assert "levelzero_http_requests_total" in names
    assert "levelzero_produce_latency_seconds_count" in names
    assert "levelzero_object_store_errors_total" in names
    assert sorted(name for name in names if name.endswith("_created")) == []


async def test_metrics_listener_serves_metrics_alone_without_the_token(tmp_path: Path) -> None:
    async with daemon_and_client(
        tmp_path, token=TOKEN, server__token=TOKEN, metrics__listen="127.0.0.1:0"
    ) as (daemon, client):
        assert daemon.metrics_url is not None and daemon.metrics_url != daemon.url
        async with httpx.AsyncClient(base_url=daemon.metrics_url) as scraper:
            scraped = await scraper.get("/metrics")
            assert scraped.status_code == 200
            assert scraped.headers["content-type"].startswith("text/plain")
            assert "levelzero_cluster_epoch 1.0" in scraped.text
            assert (await scraper.get("/v1/status")).status_code == 404  # nothing else here
            assert (await scraper.post("/metrics")).status_code == 405
        async with httpx.AsyncClient(base_url=daemon.url) as anonymous:
            assert (await anonymous.get("/metrics")).status_code == 401  # the API keeps its token


async def test_a_busy_metrics_port_is_named_as_the_metrics_listener(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(BaseException) as caught:  # noqa: PT011 - the group's leaf is checked
            async with daemon_and_client(tmp_path, metrics__listen=f"127.0.0.1:{port}"):
                pass
    [error] = leaf_errors(caught.value)
    assert isinstance(error, StartupError)
    assert str(error) == (
        f"cannot listen on 127.0.0.1:{port} for the metrics listener (metrics.listen): Address already in use"
    )


async def test_access_log_and_gc_round_are_structured_events(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="levelzero")
    async with daemon_and_client(tmp_path, server__access_log=True) as (daemon, client):
        await client.create_topic("t", 1)
        await client.advance_epoch()
        await client.gc_run(dry_run=False)
    [access] = [r for r in caplog.records if r.name == "levelzero.access" and r.path == "/v1/topics"]
    event = json.loads(JsonFormatter().format(access))
    assert event["msg"] == "http request"
    assert (event["method"], event["status"]) == ("POST", 201)
    assert event["duration_ms"] > 0 and event["bytes"] > 0 and event["client"].startswith("127.0.0.1:")
    [round_record] = [r for r in caplog.records if r.getMessage() == "gc round"]
    event = json.loads(JsonFormatter().format(round_record))
    # The round's figures are JSON fields of the event, not text inside its message.
    assert event["cluster_epoch"] == 2 and event["deleted"] == 0 and event["dry_run"] is False
    assert event["m"] is None and event["blocked_by"] == "t/0"  # t/0 has no M(p) yet
    assert event["duration_s"] >= 0


_STORE_ROLES = (
    protocols.LogStore,
    protocols.ProducerBatchStore,
    protocols.ProducerBatchExpiry,
    protocols.TransactionStore,
)


def _store_coroutines() -> set[str]:
    """Every coroutine the log store's protocols declare (its lifecycle's `aclose` aside)."""
    names = set()
    for role in _STORE_ROLES:
        for cls in role.__mro__:
            if cls.__module__ != protocols.__name__:
                continue
            names |= {name for name, value in vars(cls).items() if inspect.iscoroutinefunction(value)}
    return names - {"aclose"}


def test_every_log_store_coroutine_is_classified_as_a_write_or_a_read() -> None:
    """A write left out of LOG_STORE_WRITES (a transaction's state, a topic's deletion, its
    configs, a producer's batches) was neither timed nor watched for stalls, and a store failing
    only those writes never turned the storage unhealthy."""
    declared = _store_coroutines() - {"append_many"}  # observed as "append" (the same commit)
    writes, reads = set(LOG_STORE_WRITES), set(LOG_STORE_READS)
    assert not writes & reads
    assert declared - writes - reads == set(), "classify these in daemon/observed.py"
    assert (writes | reads) - declared == set(), "names no protocol declares"
    assert set(OPTIONAL_LOG_STORE_WRITES) <= writes


async def test_every_write_of_the_sqlite_store_is_observed(tmp_path: Path) -> None:
    metrics = StoreMetrics()
    registry = registry_of(metrics)
    health = StorageHealth()
    async with await SqliteLogStore.open(tmp_path / "log.db") as inner:
        store = ObservedLogStore(inner, metrics, health)
        for operation in (*LOG_STORE_WRITES, "append_many"):  # the daemon's store plays every role
            assert getattr(store, operation) != getattr(inner, operation), operation
        for operation in LOG_STORE_READS:
            assert getattr(store, operation) == getattr(inner, operation), operation
        assert isinstance(store, protocols.TransactionStore)
        await store.create_topic("t", 1, creation_epoch=1, now=1.0)
        await store.set_topic_configs("t", {"retention.ms": "1000"}, now=1.0)
        assert await store.topic_configs("t") == {"t": {"retention.ms": "1000"}}

        async def broken(*args: object, **kwargs: object) -> None:
            raise StorageError("SQLite write failed: disk I/O error")

        inner.put_transaction = broken  # type: ignore[method-assign]
        store = ObservedLogStore(inner, metrics, health)
        for _ in range(STORAGE_FAILURES_TO_UNHEALTHY):
            with pytest.raises(StorageError):
                await store.put_transaction(None)  # type: ignore[arg-type]
    assert not health.log_store.healthy
    assert (
        registry.get_sample_value(
            "levelzero_log_store_errors_total",
            {"operation": "put_transaction", "error": "storage_error"},
        )
        == STORAGE_FAILURES_TO_UNHEALTHY
    )
    assert (
        registry.get_sample_value(
            "levelzero_log_store_commit_duration_seconds_count", {"operation": "set_topic_configs"}
        )
        == 1
    )


async def test_a_store_without_a_role_is_observed_without_it() -> None:
    """The in-memory log store keeps no transactions: the observed store has none either (the
    coordinator looks for the role with `isinstance`)."""
    inner = MemoryLogStore()
    store = ObservedLogStore(inner, StoreMetrics())  # type: ignore[arg-type]
    for operation in OPTIONAL_LOG_STORE_WRITES:
        assert hasattr(store, operation) == hasattr(inner, operation), operation
    assert isinstance(store, protocols.TransactionStore) == isinstance(inner, protocols.TransactionStore)
