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

While a store is unhealthy the daemon probes it with a write every `STORAGE_PROBE_INTERVAL_S`
(`probe_stores`: the object store with a small PUT, the log store with a write that changes
nothing), each with a deadline, so it recovers without traffic, which an unready daemon may not
get. A refusal (unknown topic, not leader, an object not
found, corrupt data) is the store's answer, not its failure, and does not count
(`observed.is_store_failure` decides).

A hung store fails nothing for a long time: the S3 client gives up on a request only after its
retries (5 attempts of up to 30 s each), a PostgreSQL statement on a blackholed connection after
its command timeout (60 s), and until then every produce waits. So the observed stores (the
object store's requests, the log store's writes) also tell the health which operations are
outstanding, and a store is also
unhealthy (*stalled*) while a request has been outstanding longer than
`STORAGE_STALL_UNHEALTHY_S` and the store has answered nothing in that time (one hung
connection among answered requests is not a stalled store). It is healthy again as soon as it
answers anything (the stalled request, the probe, any other), and only then: a stalled request
given up (a client gone, the drain at shutdown) is no answer; a stall and failures are
independent, the store is healthy only when neither holds. `check_stalled` turns a stall into
unhealthy (called every `STORAGE_PROBE_INTERVAL_S` by `probe_stores` and by `problem`).

No I/O here besides the probe: the rule is `StoreHealth`, driven synchronously in tests.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from levelzero.core.errors import StoreNeedsRestart
from levelzero.storage.protocols import EpochStore, ObjectStore

log = logging.getLogger("levelzero.storage_health")

STORAGE_FAILURES_TO_UNHEALTHY = 3
STORAGE_SUCCESSES_TO_HEALTHY = 3
STORAGE_PROBE_INTERVAL_S = 1.0
# A third of the S3 client's read timeout (30 s): well before its retries run out (150 s), well
# above a healthy request's latency (a large PUT takes a few seconds at most).
STORAGE_STALL_UNHEALTHY_S = 10.0
ERROR_SHOWN_CHARS_MAX = 300
# A log store's probe write (SQLite: a one-row upsert; PostgreSQL: a commit of a transaction
# given an id) waits behind at most one group commit: a few seconds on a slow disk.
LOG_STORE_PROBE_TIMEOUT_S = 10.0
PROBE_KEY = "levelzero/health-probe"  # outside level_zero/ and level_one/: no GC, no reader
PROBE_BODY = b"levelzero storage health probe\n"


@dataclass(frozen=True, slots=True)
class StoreCondition:
    store: str
    healthy: bool
    unhealthy_since: float | None  # wall clock (time.time) of the first failure of the run
    failures_in_a_row: int
    last_error: str
    stalled_operation: str | None = None  # the oldest outstanding request, while stalled
    stalled_for_s: float = 0.0  # how long it had been outstanding when last checked
    stalled_since: float | None = None  # wall clock when that request started

    def describe(self) -> str:
        parts = []
        if self.stalled_operation is not None:
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.stalled_since or 0))
            article = "an" if self.stalled_operation[:1] in ("a", "e", "i", "o", "u") else "a"
            parts.append(
                f"{self.store} stalled: {article} {self.stalled_operation} request outstanding for "
                f"{self.stalled_for_s:.1f} s (since {when}) with no answer from the store"
            )
        if self.unhealthy_since is not None:
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.unhealthy_since))
            parts.append(f"{self.store} failing since {when}: {self.last_error}")
        return "; ".join(parts)


class StoreHealth:
    """One store's health with hysteresis, and its stalls (module docstring)."""

    def __init__(self, store: str) -> None:
        self.store = store
        self._failing = False
        self._failures = 0
        self._successes = 0
        self._first_failure_at: float | None = None
        self._since: float | None = None
        self.last_error = ""
        self.transitions = 0
        self._outstanding: dict[int, tuple[float, str]] = {}  # token -> (started, operation)
        self._tokens = itertools.count()
        self._last_answer: float | None = None
        self._stall: tuple[str, float, float] | None = None  # (operation, started, age)
        # A stalled request that ended without an answer (cancelled: a client gone, a drain at
        # shutdown): the store has still answered nothing, so the stall holds until it does.
        self._unanswered: tuple[str, float] | None = None  # (operation, started)

    @property
    def healthy(self) -> bool:
        return not self._failing and self._stall is None

    def _flipped(self, was_healthy: bool) -> bool:
        if was_healthy != self.healthy:
            self.transitions += 1
            return True
        return False

    def failed(self, now: float, operation: str, error: BaseException) -> bool:
        """Note a failed operation; True when this made the store unhealthy."""
        was = self.healthy
        self._successes = 0
        self._failures += 1
        if self._first_failure_at is None:
            self._first_failure_at = now
        text = f"{operation}: {error}" if str(error) else f"{operation}: {type(error).__name__}"
        self.last_error = text[:ERROR_SHOWN_CHARS_MAX]
        if not self._failing and self._failures >= STORAGE_FAILURES_TO_UNHEALTHY:
            self._failing = True
            self._since = self._first_failure_at
        return self._flipped(was)

    def wrote(self, now: float) -> bool:
        """Note a successful write; True when this made the store healthy again."""
        was = self.healthy
        self._failures = 0
        self._first_failure_at = None
        if self._failing:
            self._successes += 1
            if self._successes >= STORAGE_SUCCESSES_TO_HEALTHY:
                self._failing = False
                self._successes = 0
                self._since = None
        return self._flipped(was)

    def started(self, now: float, operation: str) -> int:
        """A request to the store begins; returns its token for `finished`."""
        token = next(self._tokens)
        self._outstanding[token] = (now, operation)
        return token

    def finished(self, now: float, token: int, answered: bool) -> bool:
        """The request `token` ended; `answered`: the store answered it (a success or a
        refusal, not a store failure nor a cancellation). True when this ended a stall."""
        was = self.healthy
        if not answered:  # the request ending unanswered may be the one stalled
            self._update_stall(now)
            if self._stall is not None and self._unanswered is None:
                self._unanswered = self._stall[:2]
        self._outstanding.pop(token, None)
        if answered:
            self._last_answer = now
            self._unanswered = None
        self._update_stall(now)
        return self._flipped(was)

    def check_stalled(self, now: float) -> bool:
        """Re-evaluate the stall; True when the store's health flipped."""
        was = self.healthy
        self._update_stall(now)
        return self._flipped(was)

    def _update_stall(self, now: float) -> None:
        self._stall = None
        if self._unanswered is not None:  # nothing answered since a stalled request ended
            operation, started = self._unanswered
            self._stall = (operation, started, now - started)
            return
        if not self._outstanding:
            return
        if self._last_answer is not None and now - self._last_answer <= STORAGE_STALL_UNHEALTHY_S:
            return
        started, operation = min(self._outstanding.values())
        if now - started > STORAGE_STALL_UNHEALTHY_S:
            self._stall = (operation, started, now - started)

    def condition(self) -> StoreCondition:
        stalled_op, stalled_since, stalled_for = self._stall or (None, None, 0.0)
        return StoreCondition(
            self.store,
            self.healthy,
            self._since,
            self._failures,
            self.last_error,
            stalled_op,
            stalled_for,
            stalled_since,
        )


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
        self.check_stalled()
        failing = [s.condition().describe() for s in (self.object_store, self.log_store) if not s.healthy]
        return "; ".join(failing) or None

    def failed(self, store: StoreHealth, operation: str, error: BaseException) -> None:
        """`error` is a store failure (`observed.is_store_failure`), not a refusal."""
        if store.failed(self.clock(), operation, error):
            self._turned_unhealthy(store)

    def wrote(self, store: StoreHealth) -> None:
        if store.wrote(self.clock()):
            self._turned_healthy(store)

    def started(self, store: StoreHealth, operation: str) -> int:
        return store.started(self.clock(), operation)

    def finished(self, store: StoreHealth, token: int, answered: bool) -> None:
        """A request ended: an answer may end a stall, and the end of one request may show
        another outstanding for too long (a stall found here, not by `check_stalled`)."""
        if store.finished(self.clock(), token, answered):
            if store.healthy:
                self._turned_healthy(store)
            else:
                self._turned_unhealthy(store)

    def check_stalled(self) -> None:
        """Turn a store with a stalled request unhealthy (and back); cheap, no I/O."""
        now = self.clock()
        for store in (self.object_store, self.log_store):
            if store.check_stalled(now):
                if store.healthy:
                    self._turned_healthy(store)
                else:
                    self._turned_unhealthy(store)

    def _turned_unhealthy(self, store: StoreHealth) -> None:
        log.warning("storage unhealthy: not ready until it recovers: %s", store.condition().describe())
        self._changed()

    def _turned_healthy(self, store: StoreHealth) -> None:
        log.info("storage healthy again: the %s takes writes", store.store)
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self)


async def probe_stores(
    objects: ObjectStore,
    log_store: EpochStore,
    health: StorageHealth,
    *,
    probe_timeout_s: float,
    log_probe_timeout_s: float = LOG_STORE_PROBE_TIMEOUT_S,
    interval_s: float = STORAGE_PROBE_INTERVAL_S,
) -> None:
    """Forever: while a store is unhealthy, probe it with a write every `interval_s` through
    the observed store (the outcome feeds `health`): the object store with a PUT of a small
    object, the log store with a write that changes nothing (`EpochStore.probe_write`). So a
    store recovers without traffic, which an unready daemon may not get: the log store had only
    the daemon's own writes to recover by (the epoch timer, GC rounds, the housekeeper), and in
    a cluster a node the epoch timer does not bump on, with idle partitions, stayed unready
    after a stalled write given up. Meanwhile, every `interval_s`, turn a stalled store
    unhealthy (`StorageHealth.check_stalled`), also while a probe hangs. Cancelled with the
    daemon's task group.

    Each probe has a deadline of its own (`probe_timeout_s` for the object store: the daemon
    gives one attempt's bound of the S3 client; `log_probe_timeout_s` for the log store): a
    write that is never answered (a proxy that accepted the connection and went silent, a
    blackholed database connection) would otherwise hold up the next probe for the client's
    whole retry budget or longer, and the node would stay unready long after the store
    recovered. A probe past its deadline is cancelled and counts as a failed write.

    A store that refuses every write until it is opened again (`StoreNeedsRestart`: the SQLite
    log store once a write batch failed) is raised out of here: probing it would find it
    failing forever, and an unready node gets no produce whose failed append would stop it.
    The daemon then exits with status 1 and systemd restarts it."""
    assert probe_timeout_s > 0 and log_probe_timeout_s > 0 and interval_s > 0, (
        probe_timeout_s,
        log_probe_timeout_s,
        interval_s,
    )

    async def watch_stalls() -> None:
        while True:
            await anyio.sleep(interval_s)
            health.check_stalled()

    async def probe(
        store: StoreHealth, operation: str, write: Callable[[], Awaitable[None]], timeout_s: float
    ) -> None:
        while True:
            await anyio.sleep(interval_s)
            if store.healthy:
                continue
            with anyio.move_on_after(timeout_s) as deadline:
                try:
                    await write()
                except StoreNeedsRestart as exc:
                    # Waiting cannot fix it, a restart does: out of the daemon (status 1), and
                    # systemd starts it again.
                    log.error("the %s refuses writes until a restart: stopping: %s", store.store, exc)
                    raise
                except Exception as exc:  # noqa: BLE001 - noted by the observed store; keep probing
                    log.debug("%s probe failed: %s", store.store, exc)
            if deadline.cancelled_caught:  # the observed store notes no failure for a cancel
                unanswered = TimeoutError(f"health probe unanswered after {timeout_s:g} s")
                health.failed(store, operation, unanswered)

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch_stalls)
        tg.start_soon(
            probe, health.object_store, "put", lambda: objects.put(PROBE_KEY, PROBE_BODY), probe_timeout_s
        )
        tg.start_soon(probe, health.log_store, "probe_write", log_store.probe_write, log_probe_timeout_s)
