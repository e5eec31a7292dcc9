"""An in-memory ObjectStore for tests and the deterministic simulation.

It keeps the S3 contract (sorted listing, range reads, per-key delete results, ObjectNotFound)
and makes every source of nondeterminism injectable: the clock that stamps `last_modified`,
the sleep used for delays, and a `FaultPlan` consulted around every operation. With the
defaults and no faults configured it never yields to the event loop, so a simulation that wants
interleavings configures delays (and a virtual-time sleep) explicitly.

Data survives `aclose()` on purpose: the simulation models a daemon restart by opening a new
daemon over the same store.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import anyio

from levelzero.core.errors import ObjectNotFound
from levelzero.storage.keys_check import (
    check_delete_batch,
    check_list_limit,
    check_object_key,
    check_range,
    check_range_within,
    slice_range,
)
from levelzero.storage.protocols import (
    DELETE_BATCH_KEYS_MAX,
    LIST_PAGE_KEYS_MAX,
    DeleteResult,
    ListPage,
    ObjectInfo,
)

ObjectOp = Literal["put", "get", "head", "list", "delete_many"]
OBJECT_OPS: tuple[ObjectOp, ...] = ("put", "get", "head", "list", "delete_many")


@dataclass
class _FailRule:
    op: ObjectOp
    error: BaseException
    remaining: int
    key: str | None
    after_effect: bool


@dataclass
class FaultPlan:
    """The faults the memory store injects, consulted around every operation.

    Configure it from a test or a seeded simulation; for anything scripted beyond this,
    subclass it and override the four consultation methods (`delay_s`, `before`, `after`,
    `delete_error`). `key` is the object key; for `list` it is the prefix, for `delete_many`
    it is None (per-key failures of a delete come from `delete_error`).

    - `fail_next(op, error, count, key=None, after_effect=False)`: the next `count` matching
      operations raise `error` (before the effect, or after it when `after_effect`).
    - `set_delay(op, seconds)`: every `op` first sleeps `seconds`.
    - `fail_deletes(keys, error, count=None)`: delete_many reports these keys in
      `DeleteResult.errors` and keeps them, `count` times per key (None: until cleared).
    - `hook`: an optional callable `(op, key) -> None` run before each operation; raise to fail.
    """

    hook: Callable[[ObjectOp, str | None], None] | None = None
    _rules: list[_FailRule] = field(default_factory=list, init=False, repr=False)
    _delays_s: dict[ObjectOp, float] = field(default_factory=dict, init=False, repr=False)
    _delete_errors: dict[str, tuple[str, int | None]] = field(default_factory=dict, init=False, repr=False)

    def fail_next(
        self,
        op: ObjectOp,
        error: BaseException,
        count: int = 1,
        *,
        key: str | None = None,
        after_effect: bool = False,
    ) -> None:
        assert op in OBJECT_OPS, op
        assert count >= 1, count
        self._rules.append(_FailRule(op, error, count, key, after_effect))

    def set_delay(self, op: ObjectOp, seconds: float) -> None:
        assert op in OBJECT_OPS, op
        assert seconds >= 0, seconds
        self._delays_s[op] = seconds

    def fail_deletes(
        self, keys: Sequence[str], error: str = "InternalError", count: int | None = None
    ) -> None:
        assert count is None or count >= 1, count
        for key in keys:
            self._delete_errors[key] = (error, count)

    def clear(self) -> None:
        self.hook = None
        self._rules.clear()
        self._delays_s.clear()
        self._delete_errors.clear()

    # -- consulted by the store

    def delay_s(self, op: ObjectOp, key: str | None) -> float:  # noqa: ARG002 - the fault hook's signature
        """Seconds to sleep (with the store's sleep function) before the operation."""
        return self._delays_s.get(op, 0.0)

    def before(self, op: ObjectOp, key: str | None) -> None:
        """Raise to fail the operation before it has any effect."""
        if self.hook is not None:
            self.hook(op, key)
        self._fire(op, key, after_effect=False)

    def after(self, op: ObjectOp, key: str | None) -> None:
        """Raise to fail the operation after its effect (the caller cannot tell it happened)."""
        self._fire(op, key, after_effect=True)

    def delete_error(self, key: str) -> str | None:
        """An error to report for `key` in a delete_many (the key is kept), or None."""
        entry = self._delete_errors.get(key)
        if entry is None:
            return None
        error, remaining = entry
        if remaining is not None:
            if remaining == 1:
                del self._delete_errors[key]
            else:
                self._delete_errors[key] = (error, remaining - 1)
        return error

    def _fire(self, op: ObjectOp, key: str | None, *, after_effect: bool) -> None:
        for rule in self._rules:
            if rule.op == op and rule.after_effect == after_effect and (rule.key is None or rule.key == key):
                rule.remaining -= 1
                if rule.remaining == 0:
                    self._rules.remove(rule)
                raise rule.error


@dataclass(frozen=True, slots=True)
class MemoryStoreStatistics:
    """Requests issued to the store (faulted ones included) and what it holds now."""

    puts: int
    gets: int
    heads: int
    lists: int
    delete_requests: int
    deletes: int  # keys reported deleted (missing keys included)
    delete_errors: int  # keys reported in DeleteResult.errors
    faults: int  # operations failed by the fault policy (raised errors)
    objects: int
    bytes: int


class MemoryObjectStore:
    """Dict-backed ObjectStore. Not thread-safe; meant for one event loop."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[object]] = anyio.sleep,
        faults: FaultPlan | None = None,
    ) -> None:
        self.clock = clock
        self.sleep = sleep
        self.faults = faults if faults is not None else FaultPlan()
        self._objects: dict[str, tuple[bytes, float]] = {}
        self._sorted_keys: list[str] = []
        self._bytes = 0
        self._counts = dict.fromkeys(
            ("puts", "gets", "heads", "lists", "delete_requests", "deletes", "delete_errors", "faults"),
            0,
        )

    # -- ObjectStore

    async def put(self, key: str, data: bytes | bytearray) -> None:
        check_object_key(key)
        data = bytes(data)
        self._counts["puts"] += 1
        await self._before("put", key)
        old = self._objects.get(key)
        if old is None:
            bisect.insort(self._sorted_keys, key)
        else:
            self._bytes -= len(old[0])
        self._objects[key] = (data, self.clock())
        self._bytes += len(data)
        self._after("put", key)

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        check_object_key(key)
        check_range(key, offset, length)
        self._counts["gets"] += 1
        await self._before("get", key)
        stored = self._objects.get(key)
        if stored is None:
            raise ObjectNotFound(key, "the memory store")
        data = stored[0]
        check_range_within(key, offset, len(data))
        self._after("get", key)
        return slice_range(data, offset, length)

    async def head(self, key: str) -> ObjectInfo | None:
        check_object_key(key)
        self._counts["heads"] += 1
        await self._before("head", key)
        stored = self._objects.get(key)
        self._after("head", key)
        if stored is None:
            return None
        return ObjectInfo(key=key, size=len(stored[0]), last_modified=stored[1])

    async def list_page(
        self, prefix: str, start_after: str | None = None, limit: int = LIST_PAGE_KEYS_MAX
    ) -> ListPage:
        check_list_limit(limit, LIST_PAGE_KEYS_MAX)
        self._counts["lists"] += 1
        await self._before("list", prefix)
        if start_after is not None and start_after >= prefix:
            i = bisect.bisect_right(self._sorted_keys, start_after)
        else:
            i = bisect.bisect_left(self._sorted_keys, prefix)
        objects: list[ObjectInfo] = []
        truncated = False
        for key in self._sorted_keys[i:]:
            if not key.startswith(prefix):
                break
            if len(objects) == limit:
                truncated = True
                break
            data, last_modified = self._objects[key]
            objects.append(ObjectInfo(key=key, size=len(data), last_modified=last_modified))
        self._after("list", prefix)
        return ListPage(objects=objects, next_start_after=objects[-1].key if truncated else None)

    async def delete_many(self, keys: Sequence[str]) -> DeleteResult:
        unique = check_delete_batch(keys, DELETE_BATCH_KEYS_MAX)
        self._counts["delete_requests"] += 1
        await self._before("delete_many", None)
        deleted: list[str] = []
        errors: dict[str, str] = {}
        for key in unique:
            error = self.faults.delete_error(key)
            if error is not None:
                errors[key] = error
                continue
            stored = self._objects.pop(key, None)
            if stored is not None:
                self._bytes -= len(stored[0])
                del self._sorted_keys[bisect.bisect_left(self._sorted_keys, key)]
            deleted.append(key)
        self._counts["deletes"] += len(deleted)
        self._counts["delete_errors"] += len(errors)
        self._after("delete_many", None)
        return DeleteResult(deleted=deleted, errors=errors)

    async def aclose(self) -> None:
        """Nothing to release; the objects stay (see the module docstring)."""

    # -- for tests and the simulation

    def statistics(self) -> MemoryStoreStatistics:
        return MemoryStoreStatistics(**self._counts, objects=len(self._objects), bytes=self._bytes)

    def keys(self) -> list[str]:
        """Every key, sorted (a copy)."""
        return list(self._sorted_keys)

    # -- internals

    async def _before(self, op: ObjectOp, key: str | None) -> None:
        delay_s = self.faults.delay_s(op, key)
        if delay_s > 0:
            await self.sleep(delay_s)
        try:
            self.faults.before(op, key)
        except BaseException:
            self._counts["faults"] += 1
            raise

    def _after(self, op: ObjectOp, key: str | None) -> None:
        try:
            self.faults.after(op, key)
        except BaseException:
            self._counts["faults"] += 1
            raise
