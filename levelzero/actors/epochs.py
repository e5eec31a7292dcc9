"""The cluster epoch: a durable counter that only rises, and each node's cached copy of it.

The cache may be stale by design; the windowed fence absorbs recent staleness, and a rejection
(`StaleClusterEpoch`) tells the cache exactly how far behind it is (`invalidate_below`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from levelzero.core.errors import InvariantViolation
from levelzero.storage.protocols import EpochStore

log = logging.getLogger("levelzero.epoch")


@dataclass(frozen=True, slots=True)
class SharedEpoch:
    """The cluster epoch shared by several nodes (see EpochService)."""

    advance: Callable[[], Awaitable[int]]  # the store's atomic increment: the new epoch
    bumps: Callable[[], bool]  # whether this node's timer bumps it


class EpochService:
    """Persists the cluster epoch in the log store; advances on demand and on a timer."""

    def __init__(
        self,
        log_store: EpochStore,
        bump_interval_s: float | None = None,
        *,
        shared: SharedEpoch | None = None,
    ) -> None:
        """`shared`: in a cluster the epoch is the control plane's, raised by any node: reads
        go to the store, an advance is the store's atomic increment, and the timer bumps only
        on the node `shared.bumps()` names (one bumper keeps the cluster's rate)."""
        assert bump_interval_s is None or bump_interval_s > 0
        self._store = log_store
        self._bump_interval_s = bump_interval_s
        self._shared = shared
        self._current: int | None = None
        self._lock = anyio.Lock()
        self.advances = 0

    async def load(self) -> int:
        self._current = await self._store.get_cluster_epoch()
        assert self._current >= 1
        return self._current

    @property
    def current(self) -> int:
        assert self._current is not None, "EpochService.load() first"
        return self._current

    async def get(self) -> int:
        """The epoch for a cache refresh: this node's, or in a cluster the store's (which
        other nodes raise too)."""
        if self._shared is not None:
            stored = await self._store.get_cluster_epoch()
            self._current = max(self.current, stored)
        return self.current

    async def advance(self) -> int:
        """Bump the epoch by one; durable before it is visible to anybody."""
        async with self._lock:
            if self._shared is not None:
                new = await self._shared.advance()  # the store's increment: nodes never collide
                self._current = max(self.current, new)
                self.advances += 1
                log.info("cluster epoch advanced", extra={"epoch": new})
                return new
            new = self.current + 1
            await self._store.set_cluster_epoch(new)
            if new <= self.current:
                raise InvariantViolation(f"cluster epoch fell from {self.current} to {new}")
            self._current = new
            self.advances += 1
        log.info("cluster epoch advanced", extra={"epoch": new})
        return new

    async def run(self, *, task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        """Advance every `bump_interval_s` (forever; cancel to stop)."""
        task_status.started()
        interval_s = self._bump_interval_s
        if interval_s is None:
            await anyio.sleep_forever()
            return
        while True:
            await anyio.sleep(interval_s)
            if self._shared is None or self._shared.bumps():
                await self.advance()
            else:
                await self.get()  # follow the bumping node: the housekeeper keys off `current`


class EpochCache:
    """A node's cached cluster epoch with a TTL. Refreshes are coalesced: one in flight."""

    def __init__(
        self,
        fetch: Callable[[], Awaitable[int]],
        ttl_s: float,
        clock: Callable[[], float] = anyio.current_time,
    ) -> None:
        assert ttl_s >= 0
        self._fetch = fetch
        self._ttl_s = ttl_s
        self._clock = clock
        self._value: int | None = None
        self._fetched_at = -math.inf
        self._refreshing: anyio.Event | None = None
        self._refresh_error: Exception | None = None
        self.refreshes = 0
        self.invalidations = 0

    @property
    def cached(self) -> int | None:
        return self._value

    def _fresh(self) -> bool:
        return self._value is not None and self._clock() - self._fetched_at < self._ttl_s

    async def get(self) -> int:
        if self._fresh():
            assert self._value is not None
            return self._value
        await self.refresh()
        assert self._value is not None
        return self._value

    async def refresh(self) -> int:
        """Fetch the epoch; concurrent callers share one fetch and its outcome."""
        if self._refreshing is not None:
            done = self._refreshing
            await done.wait()
            if self._refresh_error is not None and self._value is None:
                raise self._refresh_error
            assert self._value is not None
            return self._value
        self._refreshing = done = anyio.Event()
        self._refresh_error = None
        try:
            value = await self._fetch()
            # The service never goes back, but a slow fetch may race a newer one: keep the max.
            self._value = value if self._value is None else max(self._value, value)
            self._fetched_at = self._clock()
            self.refreshes += 1
        except Exception as exc:
            # Waiters fall back to the cached value (stale by design) or see the error.
            self._refresh_error = exc
            raise
        finally:
            self._refreshing = None
            done.set()
        return self._value

    def invalidate_below(self, epoch: int) -> None:
        """A rejection showed the cluster is at least at `epoch`: refresh on next use."""
        if self._value is None or self._value < epoch:
            self._fetched_at = -math.inf
            self.invalidations += 1

    def invalidate(self) -> None:
        self._fetched_at = -math.inf
        self.invalidations += 1
