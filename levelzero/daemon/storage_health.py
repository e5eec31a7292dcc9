"""Is the storage taking writes? `/readyz`, `status`, `levelzero_ready` and systemd's `STATUS=`
line follow this.

During an object-store outage, with a missing bucket or a full disk, every produce fails with a
retriable 503, and a readiness probe that answered 200 all the while sent traffic into it. So
each store (the object store, the log store) has a health with hysteresis, fed by the outcome
of the daemon's own storage operations (`observed.py` reports them):

- `STORAGE_FAILURES_TO_UNHEALTHY` operations in a row failing with a storage error make the
  store unhealthy (a lone failure among successes does not);
- `STORAGE_SUCCESSES_TO_HEALTHY` successful *writes* in a row make it healthy again. A read
  that succeeds proves nothing about writes (a full disk still serves reads), so reads only
  ever count as failures.

While the object store is unhealthy the daemon probes it with a small PUT every
`STORAGE_PROBE_INTERVAL_S` (`probe_object_store`), so it recovers without traffic, which an
unready daemon may not get; the log store recovers with its next writes (the epoch timer,
GC rounds, the housekeeper, produces). A refusal (unknown topic, not leader, an object not
found, corrupt data) is the store's answer, not its failure, and does not count
(`observed.is_store_failure` decides).

No I/O here besides the probe: the rule is `StoreHealth`, driven synchronously in tests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from levelzero.storage.protocols import ObjectStore

log = logging.getLogger("levelzero.storage_health")

STORAGE_FAILURES_TO_UNHEALTHY = 3
STORAGE_SUCCESSES_TO_HEALTHY = 3
STORAGE_PROBE_INTERVAL_S = 1.0
ERROR_SHOWN_CHARS_MAX = 300
PROBE_KEY = "levelzero/health-probe"  # outside level_zero/ and level_one/: no GC, no reader
PROBE_BODY = b"levelzero storage health probe\n"


@dataclass(frozen=True, slots=True)
class StoreCondition:
    store: str
    healthy: bool
    unhealthy_since: float | None  # wall clock (time.time) of the first failure of the run
    failures_in_a_row: int
    last_error: str

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.unhealthy_since or 0))
        return f"{self.store} failing since {when}: {self.last_error}"


class StoreHealth:
    """One store's health with hysteresis (module docstring)."""

    def __init__(self, store: str) -> None:
        self.store = store
        self.healthy = True
        self._failures = 0
        self._successes = 0
        self._first_failure_at: float | None = None
        self._since: float | None = None
        self.last_error = ""
        self.transitions = 0

    def failed(self, now: float, operation: str, error: BaseException) -> bool:
        """Note a failed operation; True when this made the store unhealthy."""
        self._successes = 0
        self._failures += 1
        if self._first_failure_at is None:
            self._first_failure_at = now
        text = f"{operation}: {error}" if str(error) else f"{operation}: {type(error).__name__}"
        self.last_error = text[:ERROR_SHOWN_CHARS_MAX]
        if self.healthy and self._failures >= STORAGE_FAILURES_TO_UNHEALTHY:
            self.healthy = False
            self._since = self._first_failure_at
            self.transitions += 1
            return True
        return False

    def wrote(self, now: float) -> bool:
        """Note a successful write; True when this made the store healthy again."""
        self._failures = 0
        self._first_failure_at = None
        if self.healthy:
            return False
        self._successes += 1
        if self._successes >= STORAGE_SUCCESSES_TO_HEALTHY:
            self.healthy = True
            self._successes = 0
            self._since = None
            self.transitions += 1
            return True
        return False

    def condition(self) -> StoreCondition:
        return StoreCondition(self.store, self.healthy, self._since, self._failures, self.last_error)


class StorageHealth:
    """Both stores' health; `on_change` runs (synchronously) whenever either one flips."""

    def __init__(
        self,
        on_change: Callable[[StorageHealth], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.object_store = StoreHealth("object store")
        self.log_store = StoreHealth("log store")
        self.on_change = on_change
        self.clock = clock

    @property
    def healthy(self) -> bool:
        return self.object_store.healthy and self.log_store.healthy

    def problem(self) -> str | None:
        """What is wrong, in one line, or None when both stores take writes."""
        failing = [s.condition().describe() for s in (self.object_store, self.log_store) if not s.healthy]
        return "; ".join(failing) or None

    def failed(self, store: StoreHealth, operation: str, error: BaseException) -> None:
        """`error` is a store failure (`observed.is_store_failure`), not a refusal."""
        if store.failed(self.clock(), operation, error):
            log.warning("storage unhealthy: not ready until it recovers: %s", store.condition().describe())
            self._changed()

    def wrote(self, store: StoreHealth) -> None:
        if store.wrote(self.clock()):
            log.info("storage healthy again: the %s takes writes", store.store)
            self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self)


async def probe_object_store(store: ObjectStore, health: StorageHealth) -> None:
    """Forever: while the object store is unhealthy, PUT a small probe object every
    `STORAGE_PROBE_INTERVAL_S` through `store` (the observed store: the outcome feeds
    `health`). Cancelled with the daemon's task group."""
    while True:
        await anyio.sleep(STORAGE_PROBE_INTERVAL_S)
        if health.object_store.healthy:
            continue
        try:
            await store.put(PROBE_KEY, PROBE_BODY)
        except Exception as exc:  # noqa: BLE001 - noted by the observed store; keep probing
            log.debug("storage probe failed: %s", exc)
