"""Latency and errors of every storage operation, observed from outside the stores.

`ObservedObjectStore` wraps the daemon's object store: a histogram of each operation's latency
(`put`, `get`, `head`, `list`, `delete`: PUT, GET, HEAD, LIST and DeleteObjects requests, each
including the client's own retries) and a counter of the operations that raised, by error code.
A DeleteObjects request can also fail for single keys while succeeding as a whole: those are
counted per key. `ObservedLogStore` wraps the log store the same way for its writes: each write
returns once the group commit that holds it is durable, so its latency is the commit latency a
producer waits for (`append`) or a component waits for (the others).

A slow object store fails nothing and may not stall either (every request is answered, each
after seconds): an object store request that took longer than `SLOW_REQUEST_WARNING_S` is
logged at WARNING, naming the operation and its duration, at most once every 10 s per
operation with the count of the others (`core.throttled_warning`).

Both also tell the daemon's `StorageHealth` (when given one) what failed and which writes
succeeded: readiness follows the stores' health (`storage_health.py`).

The stores know nothing of this; the daemon wraps them (`service.Daemon._serve`). The metric
objects are unregistered and exported by `StoreMetrics.collect`, one registry per daemon.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from levelzero.core.errors import LevelZeroError, ObjectNotFound, StorageError
from levelzero.core.throttled_warning import ThrottledWarnings
from levelzero.storage.protocols import (
    LIST_PAGE_KEYS_MAX,
    DeleteResult,
    ListPage,
    LogStore,
    ObjectInfo,
    ObjectStore,
)

from levelzero.daemon.storage_health import StorageHealth

log = logging.getLogger("levelzero.storage")

# A request slower than this is worth a line in the log: a healthy one takes well under a second
# (a large PUT a few), the S3 client's read timeout is 30 s; the stall bound is the same.
SLOW_REQUEST_WARNING_S = 10.0

# 0.5 ms (a local fsync) .. 30 s (an S3 request with its retries).
STORE_LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
OBJECT_STORE_OPERATIONS = ("put", "get", "head", "list", "delete")
OBJECT_READS = ("get", "head")  # the operations that answer ObjectNotFound
# Writes of the roles a store may lack (`ProducerBatchStore`, `TransactionStore`, ...): wrapped
# where the inner store has them.
OPTIONAL_LOG_STORE_WRITES = (
    "record_producer_batches",
    "expire_producer_batches",
    "put_transaction",
    "expire_transaction",
    "open_txn_range",
    "close_txn_range",
    "prune_txn_ranges",
)
# The log store's writes: each returns when its group commit is durable. Every coroutine of the
# store's protocols is either here or in LOG_STORE_READS (`test_daemon_observability` checks
# it): a write left out was neither timed nor watched for stalls, and its failures did not count
# against the store's health.
LOG_STORE_WRITES = (
    "append",
    "begin_term",
    "create_topic",
    "add_partitions",
    "delete_topic",
    "forget_deleted_partition",
    "save_snapshot",
    "truncate_below",
    "set_cluster_epoch",
    "probe_write",
    "l1_insert",
    "l1_transition",
    "l1_compaction_commit",
    "record_l0_object",
    "mark_l0_deleted",
    "record_gc_round",
    "record_fence_events",
    "record_state_samples",
    "prune_history",
    "commit_offsets",
    "delete_offsets",
    "expire_offsets",
    "store_group_metadata",
    "set_topic_configs",
    *OPTIONAL_LOG_STORE_WRITES,
)
# Reads go to the inner store untouched (their failures reach their callers as errors).
LOG_STORE_READS = (
    "list_partitions",
    "deleted_partitions",
    "read_log",
    "read_placeholders",
    "load_snapshot",
    "get_cluster_epoch",
    "l1_list",
    "l1_compaction_state",
    "l0_live_objects",
    "committed_offsets",
    "offset_groups",
    "group_metadata",
    "metadata_groups",
    "topic_configs",
    "producer_batches",
    "transactions",
    "txn_ranges",
)


def error_code(error: BaseException) -> str:
    return getattr(error, "code", None) or "internal_error"


def is_store_failure(error: Exception) -> bool:
    """A refusal (NotLeader, a violated invariant) is the store's answer, not its failure."""
    return isinstance(error, StorageError) or not isinstance(error, (LevelZeroError, AssertionError))


class StoreMetrics(Collector):
    def __init__(self) -> None:
        self.object_latency = Histogram(
            "levelzero_object_store_request_duration_seconds",
            "Object store operation latency (PUT, GET, HEAD, LIST, DeleteObjects), retries included.",
            ["operation"],
            buckets=STORE_LATENCY_BUCKETS_S,
            registry=None,
        )
        self.object_errors = Counter(
            "levelzero_object_store_errors",
            "Object store operations that failed, by operation and error code.",
            ["operation", "error"],
            registry=None,
        )
        self.object_delete_key_errors = Counter(
            "levelzero_object_store_delete_key_errors",
            "Keys a DeleteObjects request reported as not deleted (the request itself succeeded).",
            registry=None,
        )
        self.log_latency = Histogram(
            "levelzero_log_store_commit_duration_seconds",
            "Log store write latency until its group commit is durable, by operation.",
            ["operation"],
            buckets=STORE_LATENCY_BUCKETS_S,
            registry=None,
        )
        self.log_errors = Counter(
            "levelzero_log_store_errors",
            "Log store writes that failed with a storage error, by operation and error code.",
            ["operation", "error"],
            registry=None,
        )
        # Series exist from the start (a dashboard shows 0, not "no data"; alerts can rate()).
        for operation in OBJECT_STORE_OPERATIONS:
            self.object_latency.labels(operation)
            self.object_errors.labels(operation, "storage_error")
        # A missing object (acknowledged data unreadable) pages at its first increase: a series
        # born at 1 would show none.
        for operation in OBJECT_READS:
            self.object_errors.labels(operation, ObjectNotFound.code)
        for operation in LOG_STORE_WRITES:
            self.log_latency.labels(operation)
            self.log_errors.labels(operation, "storage_error")

    def collect(self) -> Iterable[Metric]:
        for metric in (
            self.object_latency,
            self.object_errors,
            self.object_delete_key_errors,
            self.log_latency,
            self.log_errors,
        ):
            yield from metric.collect()


class ObservedObjectStore:
    """An `ObjectStore` whose every operation is timed and whose failures are counted."""

    def __init__(
        self,
        inner: ObjectStore,
        metrics: StoreMetrics,
        health: StorageHealth | None = None,
        *,
        clock: Callable[[], float] = time.perf_counter,
        slow_request_s: float = SLOW_REQUEST_WARNING_S,
    ) -> None:
        self.inner = inner
        self._health = health
        self._latency = {op: metrics.object_latency.labels(op) for op in OBJECT_STORE_OPERATIONS}
        self._errors = metrics.object_errors
        self._delete_key_errors = metrics.object_delete_key_errors
        self._clock = clock
        self._slow_request_s = slow_request_s
        self._slow = ThrottledWarnings(log, clock)

    async def _timed(self, operation: str, call: Awaitable[Any]) -> Any:
        health = self._health
        token = None if health is None else health.started(health.object_store, operation)
        answered = False
        started = self._clock()
        try:
            result = await call
        except Exception as error:  # a cancelled operation is neither a latency nor an error
            self._errors.labels(operation, error_code(error)).inc()
            self._took(operation, self._clock() - started, "failed")
            answered = not is_store_failure(error)
            if health is not None and not answered:
                health.failed(health.object_store, operation, error)
            raise
        else:
            answered = True
        finally:  # outstanding until here, whatever the outcome (`storage_health`: stalls)
            if health is not None and token is not None:
                health.finished(health.object_store, token, answered)
        self._took(operation, self._clock() - started, "succeeded")
        if health is not None and operation == "put":  # only a write proves writes work
            health.wrote(health.object_store)
        return result

    def _took(self, operation: str, elapsed_s: float, outcome: str) -> None:
        self._latency[operation].observe(elapsed_s)
        if elapsed_s > self._slow_request_s:
            self._slow.warn(
                operation,
                "object store slow: a %s request took %.1f s (%s; more than %g s)",
                operation,
                elapsed_s,
                outcome,
                self._slow_request_s,
                extra={"operation": operation, "duration_s": round(elapsed_s, 3)},
            )

    async def put(self, key: str, data: bytes | bytearray) -> None:
        await self._timed("put", self.inner.put(key, data))

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        return await self._timed("get", self.inner.get(key, offset, length))

    async def head(self, key: str) -> ObjectInfo | None:
        return await self._timed("head", self.inner.head(key))

    async def list_page(
        self, prefix: str, start_after: str | None = None, limit: int = LIST_PAGE_KEYS_MAX
    ) -> ListPage:
        return await self._timed("list", self.inner.list_page(prefix, start_after, limit))

    async def delete_many(self, keys: Sequence[str]) -> DeleteResult:
        result: DeleteResult = await self._timed("delete", self.inner.delete_many(keys))
        if result.errors:
            self._delete_key_errors.inc(len(result.errors))
        return result

    async def aclose(self) -> None:
        await self.inner.aclose()


class ObservedLogStore:
    """A `LogStore` whose writes are timed and watched for stalls; everything else is the inner
    store's, untouched (reads, `statistics()`, what a concrete store offers beyond the
    protocol)."""

    def __init__(self, inner: LogStore, metrics: StoreMetrics, health: StorageHealth | None = None) -> None:
        self.inner = inner
        for operation in LOG_STORE_WRITES:
            method = getattr(inner, operation, None)
            if method is None and operation in OPTIONAL_LOG_STORE_WRITES:
                continue  # a role this store does not play: `hasattr` stays false, as the inner's
            assert method is not None, f"the log store has no {operation}"
            setattr(self, operation, self._timed(operation, method, metrics, health))
        # Many partitions' appends in one call: the commit a producer waits for, as `append`.
        self.append_many = self._timed("append", inner.append_many, metrics, health)

    @staticmethod
    def _timed(
        operation: str,
        method: Callable[..., Awaitable[Any]],
        metrics: StoreMetrics,
        health: StorageHealth | None,
    ) -> Callable[..., Awaitable[Any]]:
        latency = metrics.log_latency.labels(operation)
        errors = metrics.log_errors

        async def timed(*args: Any, **kwargs: Any) -> Any:
            # Outstanding until answered, as the object store's requests (`storage_health`:
            # a hung database, a blackholed connection, is a stall before it is a failure).
            token = None if health is None else health.started(health.log_store, operation)
            answered = False
            started = time.perf_counter()
            try:
                result = await method(*args, **kwargs)
            except Exception as error:
                answered = not is_store_failure(error)
                if not answered:
                    errors.labels(operation, error_code(error)).inc()
                    if health is not None:
                        health.failed(health.log_store, operation, error)
                raise
            else:
                answered = True
            finally:
                if health is not None and token is not None:
                    health.finished(health.log_store, token, answered)
            latency.observe(time.perf_counter() - started)
            if health is not None:
                health.wrote(health.log_store)
            return result

        timed.__name__ = operation
        return timed

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
