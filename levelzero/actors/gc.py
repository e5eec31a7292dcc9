"""The GC actor: deletes the L0 objects at or below the cluster watermark `M`.

A thin shell over `levelzero.core.gc`, which decides everything: `M` (`compute_cluster_watermark`,
asserted monotone), which listed objects may go (`RangeScan`), when the next round runs
(`GcPacer`), what is throttling, and explain. This module lists, deletes, sleeps and records.

Where the keys come from. The batcher records every L0 object this node uploads in the log
store's catalog (`l0_objects`, written once the object's placeholders are durable, the rows of
objects fenced meanwhile together: `Batcher._record_objects`); each round
deletes the catalog's objects with epoch <= `M` straight away, without listing: on S3 a LIST
costs as much as a PUT and is slower than a DELETE of 1,000 keys. The catalog misses strays —
an object whose upload finished but whose row never landed (a crash in between), objects of
another node — so every `sweep_interval_s` (and the first round, and every dry run) a round
lists this worker's prefixes instead: the listing is the authority that nothing is leaked
forever; the catalog makes the common case cheap. Either way the rule is the same: a key's
epoch, parsed from the key itself, <= `M`, and old enough.

A round keeps no durable state: deletes are idempotent and `M` only grows, so a crash mid-round
loses nothing (the next round lists again), and several GC instances over one store, or a
zombie with an old `M`, delete nothing live. Per-key delete failures are simply listed again
next round.

Pipeline of one round: `list_concurrency_max` scanners, one per contiguous range of this
worker's prefixes (or one reader of the catalog), cut eligible keys into batches of <=
`delete_batch_keys_max` and hand them over a stream of `deletes_in_flight_max` batches to as
many deleters, which hand the keys they deleted to one marking task (a mark stamps every key
gathered since the last, in one statement); memory stays bounded by `(scanners + 3 * deleters)
* batch` keys (plus a catalog page and a mark of at most `MARK_KEYS_MAX`) whatever the backlog.
"""

from __future__ import annotations

import functools
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectSendStream
import msgspec

from levelzero.core.errors import InvalidInput, LevelZeroError, MalformedKey, StorageError
from levelzero.core.gc import (
    DELETE_BATCH_KEYS_MAX,
    BlockedChange,
    BlockedWatch,
    Eligible,
    Explanation,
    GcPacer,
    MonotoneWatermark,
    PartitionFacts,
    RangeScan,
    WatermarkDecision,
    compute_cluster_watermark,
    explain,
    is_throttling,
    split_prefixes,
    worker_prefixes,
)
from levelzero.core.keys import PREFIX_COUNT, l0_key_epoch, parse_l0_key
from levelzero.core.reconcile_health import ReconcileFailing
from levelzero.core.throttled_warning import ThrottledWarnings
from levelzero.core.leader import WatermarkBoard
from levelzero.storage.protocols import (
    DeleteResult,
    GcRoundRow,
    L0ObjectRow,
    LogStore,
    ObjectStore,
)

from .partition import PartitionView

log = logging.getLogger("levelzero.gc")

THROTTLE_RETRIES_MAX = 3  # per request; then the keys wait for the next round
DELETES_IN_FLIGHT_LIMIT = 64
# Keys one catalog mark stamps (one statement): four DeleteObjects' worth; within what one call
# of the SQLite log store may carry (`GROUP_COMMIT_MAX_RECORDS`, 4,096 rows).
MARK_KEYS_MAX = 4 * DELETE_BATCH_KEYS_MAX
LIST_CONCURRENCY_LIMIT = 64
DRY_RUN_KEYS_LIMIT = 1_000_000
BLOCKED_BY_SHOWN_MAX = 20
ERROR_SAMPLES_MAX = 10

T = TypeVar("T")


def _finite(value: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True, slots=True)
class GcConfig:
    interval_s: float = 5.0
    idle_backoff_max_s: float = 60.0
    grace_s: float = 30.0
    delete_batch_keys_max: int = DELETE_BATCH_KEYS_MAX
    deletes_in_flight_max: int = 4
    list_concurrency_max: int = 8
    worker_index: int = 0
    worker_count: int = 1
    jitter_fraction: float = 0.1
    throttle_backoff_s: float = 1.0
    dry_run_keys_max: int = 10_000
    sweep_interval_s: float = 60.0  # list the prefixes at least this often (0: every round)
    enabled: bool = True

    def __post_init__(self) -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise InvalidInput(f"gc {message}")

        for name in (
            "interval_s",
            "idle_backoff_max_s",
            "grace_s",
            "jitter_fraction",
            "throttle_backoff_s",
            "sweep_interval_s",
        ):
            need(_finite(getattr(self, name)), f"{name} must be a finite number")
        for name in (
            "delete_batch_keys_max",
            "deletes_in_flight_max",
            "list_concurrency_max",
            "worker_index",
            "worker_count",
            "dry_run_keys_max",
        ):
            value = getattr(self, name)
            need(isinstance(value, int) and not isinstance(value, bool), f"{name} must be an integer")
        need(self.interval_s > 0, f"interval_s must be > 0 (got {self.interval_s})")
        need(
            self.idle_backoff_max_s >= self.interval_s,
            f"idle_backoff_max_s ({self.idle_backoff_max_s}) must be >= interval_s ({self.interval_s})",
        )
        need(self.grace_s >= 0, f"grace_s must be >= 0 (got {self.grace_s})")
        need(
            1 <= self.delete_batch_keys_max <= DELETE_BATCH_KEYS_MAX,
            f"delete_batch_keys_max must be in 1..{DELETE_BATCH_KEYS_MAX} (got {self.delete_batch_keys_max})",
        )
        need(
            1 <= self.deletes_in_flight_max <= DELETES_IN_FLIGHT_LIMIT,
            f"deletes_in_flight_max must be in 1..{DELETES_IN_FLIGHT_LIMIT} "
            f"(got {self.deletes_in_flight_max})",
        )
        need(
            1 <= self.list_concurrency_max <= LIST_CONCURRENCY_LIMIT,
            f"list_concurrency_max must be in 1..{LIST_CONCURRENCY_LIMIT} (got {self.list_concurrency_max})",
        )
        need(
            1 <= self.worker_count <= PREFIX_COUNT,
            f"worker_count must be in 1..{PREFIX_COUNT} (got {self.worker_count})",
        )
        need(
            0 <= self.worker_index < self.worker_count,
            f"worker_index must be in 0..{self.worker_count - 1} (got {self.worker_index})",
        )
        need(
            0 <= self.jitter_fraction < 1,
            f"jitter_fraction must be in [0, 1) (got {self.jitter_fraction})",
        )
        need(self.throttle_backoff_s >= 0, f"throttle_backoff_s must be >= 0 (got {self.throttle_backoff_s})")
        need(
            0 <= self.dry_run_keys_max <= DRY_RUN_KEYS_LIMIT,
            f"dry_run_keys_max must be in 0..{DRY_RUN_KEYS_LIMIT} (got {self.dry_run_keys_max})",
        )
        need(
            self.sweep_interval_s >= 0,
            f"sweep_interval_s must be >= 0 (got {self.sweep_interval_s})",
        )
        need(isinstance(self.enabled, bool), "enabled must be true or false")

    @property
    def prefixes(self) -> range:
        return worker_prefixes(self.worker_index, self.worker_count, PREFIX_COUNT)


class RoundCounts(msgspec.Struct, kw_only=True):
    """The counters of GC rounds: one round's (a `RoundReport`'s, the tally its scanners and
    deleters fill), or the totals since start (`GcStatistics.totals`: the sum of every round's).
    Typed here once; the HTTP API, the metrics and the CLI read these fields."""

    listed: int = 0
    eligible: int = 0  # epoch <= M and old enough
    eligible_bytes: int = 0
    deleted: int = 0
    deleted_bytes: int = 0
    too_young: int = 0
    above_m: int = 0  # prefixes that stopped at an epoch above M
    malformed: int = 0
    delete_requests: int = 0
    delete_errors: int = 0  # keys the store reported failed, or whose batch failed
    list_requests: int = 0
    list_errors: int = 0  # list requests that failed (their prefix range ends for this round)
    throttled: int = 0  # requests answered with "slow down", backed off and retried
    catalog_read: int = 0  # catalog rows (epoch <= M, not yet deleted) read
    catalog_eligible: int = 0  # of those, eligible (the rest of `eligible` came from listings)
    max_deleted_epoch: int | None = None

    @property
    def errors(self) -> int:
        return self.delete_errors + self.list_errors

    def add(self, other: RoundCounts) -> None:
        """Add `other`'s counters to these (totals absorbing a round)."""
        for name in _COUNTER_FIELDS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        if other.max_deleted_epoch is not None:
            self.max_deleted_epoch = max(self.max_deleted_epoch or 0, other.max_deleted_epoch)

    def counts(self) -> RoundCounts:
        """These counters alone (a copy: a subclass's other fields left out)."""
        return RoundCounts(**{name: getattr(self, name) for name in RoundCounts.__struct_fields__})


_COUNTER_FIELDS = tuple(name for name in RoundCounts.__struct_fields__ if name != "max_deleted_epoch")


# msgspec lets a frozen Struct extend a mutable one; mypy's reading of dataclass_transform does not.
class RoundReport(RoundCounts, frozen=True, kw_only=True):  # type: ignore[misc]
    """What one round saw and did (JSON-friendly: the HTTP API returns it as is): its
    `RoundCounts` and these."""

    round_id: int
    dry_run: bool
    started_at: float
    finished_at: float
    cluster_epoch: int
    m: int | None
    blocked_by: list[str]  # partitions without an M(p): no deletes this round
    holders: list[str]  # partitions whose M(p) is M ("cap" when E - 1 binds)
    backlog: int  # eligible but not deleted at the end of the round
    oldest_young_at: float | None
    would_delete: list[str] = []  # dry run: eligible keys, up to dry_run_keys_max
    would_delete_truncated: bool = False
    error_samples: list[str] = []
    swept: bool = False  # this round listed the prefixes (else: it read the catalog)
    failed: bool = False  # it got nothing done that it set out to (`_Tally.failed`)

    @property
    def blocked(self) -> bool:
        return self.m is None


@dataclass(frozen=True, slots=True)
class GcStatistics:
    """An immutable snapshot for metrics. Counters are totals since start; gauges are from the
    last round (dry runs change counters of what they listed, never deletion counters)."""

    rounds: int
    dry_runs: int
    failed_rounds: int
    safety_blocked_rounds: int
    sweeps: int  # rounds that listed the prefixes
    totals: RoundCounts  # every round's counters added up
    m: int | None
    cluster_epoch: int | None
    epoch_lag: int | None  # E - M
    backlog: int
    blocked_by: tuple[str, ...]
    paused: bool
    last_round_at: float | None
    next_round_in_s: float | None
    pace_reason: str | None


@dataclass(frozen=True, slots=True)
class WatermarkReading:
    """`M` as a round computes it, from one snapshot of E and every partition's M(p) (in a
    cluster, the control plane's), with that snapshot and when it was read (wall clock)."""

    decision: WatermarkDecision
    mps: dict[str, int | None]
    read_at: float


class _Tally(RoundCounts, kw_only=True):
    """Counters of one round, filled by scanners and deleters, and what the report shows
    besides."""

    oldest_young_at: float | None = None
    would_delete: list[str] = []
    would_delete_truncated: bool = False
    error_samples: list[str] = []
    swept: bool = False
    lists_answered: int = 0  # list requests that returned a page

    @property
    def failed(self) -> bool:
        """The round's rule of failure: every list request it sent failed, or it had keys to
        delete and deleted none of them (an outage of the store fails every round, although
        each request's failure is caught and counted)."""
        every_list_failed = self.list_errors > 0 and self.lists_answered == 0
        deleted_none = self.delete_errors > 0 and self.deleted == 0
        return every_list_failed or deleted_none

    def note_error(self, text: str) -> None:
        if len(self.error_samples) < ERROR_SAMPLES_MAX:
            self.error_samples.append(text)

    def note_eligible(self, eligible: list[Eligible]) -> None:
        self.eligible += len(eligible)
        self.eligible_bytes += sum(e.size for e in eligible)

    def absorb_scan(self, scan: RangeScan) -> None:
        self.listed += scan.listed
        self.too_young += scan.too_young
        self.above_m += scan.above_m
        self.malformed += scan.malformed
        if scan.oldest_young_at is not None and (
            self.oldest_young_at is None or scan.oldest_young_at < self.oldest_young_at
        ):
            self.oldest_young_at = scan.oldest_young_at


@dataclass(slots=True)
class _Totals:
    rounds: int = 0
    dry_runs: int = 0
    failed_rounds: int = 0
    safety_blocked_rounds: int = 0
    sweeps: int = 0
    counts: RoundCounts = field(default_factory=RoundCounts)


OPERATOR = "operator"  # a pause by `levelzero gc pause` (or `gc.enabled = false`)

# The round ids of a node in a cluster: a range of ROUND_IDS_PER_INCARNATION per registration,
# above every id the wall clock in milliseconds makes (before the year 2500) and, for the first
# two million registrations of a control plane, below 2**53 (JSON numbers stay exact).
CLUSTER_ROUND_IDS_FROM = 2**44
ROUND_IDS_PER_INCARNATION = 2**32


def cluster_round_id(incarnation: int, n: int) -> int:
    """The id of round `n` of the node whose first registration got `incarnation`: incarnations
    come from one sequence of the control plane, so no two nodes (or runs) share a range."""
    assert incarnation >= 0 and 0 <= n < ROUND_IDS_PER_INCARNATION, (incarnation, n)
    return CLUSTER_ROUND_IDS_FROM + incarnation * ROUND_IDS_PER_INCARNATION + n


class GcActor:
    def __init__(
        self,
        config: GcConfig,
        object_store: ObjectStore,
        log_store: LogStore,
        *,
        cluster_epoch: Callable[[], int],
        board: WatermarkBoard,
        views: Callable[[], list[PartitionView]],
        reconcile_failing: Callable[[str], ReconcileFailing | None] = lambda _partition: None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[object]] = anyio.sleep,
        watermarks: Callable[[], Awaitable[tuple[int, dict[str, int | None]]]] | None = None,
        share: Callable[[], range] | None = None,
        leaders: Callable[[], Mapping[str, str]] | None = None,
        collect_deleted: Callable[[], Awaitable[int]] | None = None,
        incarnation: Callable[[], int | None] | None = None,
        released: Callable[[int], object] | None = None,
    ) -> None:
        """`clock` is the wall clock object ages are measured with (object stores stamp
        `last_modified` in unix seconds); `sleep` is what the loop and throttle backoffs wait
        with (tests inject one that records and returns, or never returns). `watermarks`: in a
        cluster, `(E, every partition's published M(p))` read in one transaction of the control
        plane (`ClusterControl.watermark_snapshot`); otherwise this node's board and epoch.
        `share`: in a cluster, the key prefixes this node's rounds list and delete in (read each
        round, from the membership); otherwise the configured worker's prefixes. `leaders`: in a
        cluster, partition -> the node leading it by the last cluster view, or
        `core.gc.NO_LIVE_LEADER` (explain says where a partition led elsewhere is).
        `collect_deleted`: collects deleted topics' L1 objects at the start of every round
        that is not a dry run (`L1Catalog.collect_deleted`); their L0 data needs nothing: a
        deleted partition has left the partition set, so it no longer holds `M` back.
        `incarnation`: in a cluster, the node's incarnation from its first registration (None
        before it), which makes the round ids of every node unique (`cluster_round_id`).
        `released`: told `M` each time a round takes one (dry runs too: `M` says what is
        garbage, whether or not it is deleted yet); the node's readers' cache drops the
        objects at or below it (`L0ObjectCache.release_through`)."""
        self.config = config
        self._objects = object_store
        self._log = log_store
        self._cluster_epoch = cluster_epoch
        self._board = board
        self._watermarks = watermarks
        self._share = share
        self._leaders = leaders if leaders is not None else dict
        self._collect_deleted = collect_deleted
        self.deleted_topic_objects = 0  # L1 objects of deleted topics collected by rounds
        self._views = views
        self._reconcile_failing = reconcile_failing
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._sleep = sleep
        self._prefixes = config.prefixes
        self._ranges = split_prefixes(self._prefixes, config.list_concurrency_max)
        self._watermark = MonotoneWatermark()
        self._pacer = GcPacer(
            config.interval_s, config.idle_backoff_max_s, config.grace_s, config.jitter_fraction
        )
        self._round_lock = anyio.Lock()
        self._request_failures = ThrottledWarnings(log, clock)
        # Round ids stay unique across restarts (the log store's gc_rounds table is keyed by
        # them, a row of an earlier process's round would be overwritten): start from the wall
        # clock in milliseconds, then count (rounds come far less often than one a millisecond,
        # so a later start begins above the ids before it). Status, logs and exports show it.
        # In a cluster every node's rounds go to one table, and each node counting from its own
        # start met the ids of a node started later: from the node's first registration, its
        # ids count in a range of their own (`cluster_round_id`).
        self._next_round_id = max(1, int(clock() * 1000))
        self._incarnation = incarnation
        self._released = released
        self._round_ids_own = incarnation is None  # the range is taken (or none is needed)
        self._totals = _Totals()
        self._last: RoundReport | None = None
        self._last_decision: WatermarkDecision | None = None
        self._reading: WatermarkReading | None = None  # the newest `read_watermark`
        # Why rounds are paused: "operator" (`levelzero gc pause`, or the GC disabled in the
        # configuration), "foreign_marker" (the store names another cluster: `MarkerWatch`).
        # Each is lifted by its own resume; rounds run while none holds.
        self._paused_by: set[str] = set() if config.enabled else {OPERATOR}
        self._wake = anyio.Event()
        self._waiting: anyio.CancelScope | None = None  # the loop's wait for its next round
        self._round_done = anyio.Event()
        self._rounds_finished = 0  # successful or not: what wait_round_finished counts
        self._next_round_in_s: float | None = None
        self._pace_reason: str | None = None
        self._last_sweep_at: float | None = None  # None: the next round lists
        self._blocked = BlockedWatch()

    # ------------------------------------------------------------------ controls

    def pause(self, by: str = OPERATOR) -> None:
        """No new rounds until `resume(by)` and every other pause is lifted (a round in
        progress finishes)."""
        self._paused_by.add(by)

    def resume(self, by: str = OPERATOR) -> None:
        """Lift the pause `by` set; with none left, rounds run again, the first one now."""
        self._paused_by.discard(by)
        if not self._paused_by:
            self._wake_up()

    def run_now(self) -> None:
        """Wake the loop for a round now (ignored while paused)."""
        self._wake_up()

    @property
    def paused(self) -> bool:
        return bool(self._paused_by)

    @property
    def paused_by(self) -> frozenset[str]:
        return frozenset(self._paused_by)

    async def wait_round_finished(self, after: int) -> None:
        """Wait until more than `after` rounds (dry runs included) have finished."""
        while self._rounds_finished <= after:
            await self._round_done.wait()

    @property
    def rounds_finished(self) -> int:
        return self._rounds_finished

    @property
    def last_round(self) -> RoundReport | None:
        """The report of the last round that finished (a dry run included)."""
        return self._last

    def statistics(self) -> GcStatistics:
        t, last, decision = self._totals, self._last, self._last_decision
        m = self._watermark.value
        epoch = None if decision is None else decision.cluster_epoch
        return GcStatistics(
            rounds=t.rounds,
            dry_runs=t.dry_runs,
            failed_rounds=t.failed_rounds,
            safety_blocked_rounds=t.safety_blocked_rounds,
            sweeps=t.sweeps,
            totals=t.counts.counts(),
            m=m,
            cluster_epoch=epoch,
            epoch_lag=None if epoch is None or m is None else epoch - m,
            backlog=0 if last is None or last.dry_run else last.backlog,
            blocked_by=() if decision is None else decision.blocked_by,
            paused=self.paused,
            last_round_at=None if last is None else last.finished_at,
            next_round_in_s=self._next_round_in_s,
            pace_reason=self._pace_reason,
        )

    # ------------------------------------------------------------------ the loop

    async def run(self, *, task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        """Run rounds forever, paced by `GcPacer`; cancel to stop. A failing store fails the
        round, not the actor; a violated invariant crashes it."""
        task_status.started()
        pace = self._pacer.first(self._jitter_unit())
        while True:
            self._next_round_in_s, self._pace_reason = pace.delay_s, str(pace.reason)
            await self._wait_turn(pace.delay_s)
            self._next_round_in_s = None
            try:
                report = await self.run_round()
            except LevelZeroError as exc:
                log.warning("gc round failed", extra={"error": exc.code, "detail": str(exc)})
                pace = self._pacer.after_round(
                    deleted=0,
                    backlog=0,
                    failed=True,
                    oldest_young_at=None,
                    now=self._clock(),
                    jitter_unit=self._jitter_unit(),
                )
                continue
            pace = self._pacer.after_round(
                deleted=report.deleted,
                backlog=report.backlog,
                failed=False,
                oldest_young_at=report.oldest_young_at,
                now=self._clock(),
                jitter_unit=self._jitter_unit(),
            )

    def _jitter_unit(self) -> float:
        return self._rng.uniform(-1.0, 1.0)

    async def _wait_turn(self, delay_s: float) -> None:
        await self._sleep_or_wake(delay_s)
        while self._paused_by:
            await self._sleep_or_wake(math.inf)

    async def _sleep_or_wake(self, delay_s: float) -> None:
        """Sleep `delay_s`, or less if woken (`_wake_up`: the wait's scope is cancelled). One
        cancel scope a wait, not a task group and a sleeper task racing the wake event."""
        if not self._wake.is_set():
            with anyio.CancelScope() as self._waiting:
                if delay_s == math.inf:
                    await anyio.sleep_forever()
                await self._sleep(delay_s)
            self._waiting = None
        self._wake = anyio.Event()

    def _wake_up(self) -> None:
        self._wake.set()
        if self._waiting is not None:
            self._waiting.cancel()

    # ------------------------------------------------------------------ one round

    async def run_round(self, dry_run: bool = False) -> RoundReport:
        """One round now (serialized with the loop's). A dry run lists what it would delete."""
        async with self._round_lock:
            if not self._round_ids_own:
                assert self._incarnation is not None
                incarnation = self._incarnation()
                if incarnation is not None:
                    self._next_round_id = cluster_round_id(incarnation, 0)
                    self._round_ids_own = True
            round_id = self._next_round_id
            self._next_round_id += 1
            try:
                report = await self._round(round_id, dry_run)
            except Exception:
                self._totals.failed_rounds += 1
                raise
            else:
                self._totals.rounds += 1
                self._totals.failed_rounds += report.failed
                return report
            finally:
                self._rounds_finished += 1
                self._round_done.set()
                self._round_done = anyio.Event()

    async def _round(self, round_id: int, dry_run: bool) -> RoundReport:
        if self._collect_deleted is not None and not dry_run:
            try:
                self.deleted_topic_objects += await self._collect_deleted()
            except LevelZeroError as exc:  # the rest is found again next round
                log.warning("collecting deleted topics' L1 objects failed: %s", exc)
        started_at = self._clock()
        decision = (await self.read_watermark()).decision
        self._watermark.observe(decision.m)
        self._last_decision = decision
        if decision.m is not None and self._released is not None:
            self._released(decision.m)
        self._say_if_blocked(decision, started_at)
        tally = _Tally()
        try:
            if decision.m is not None:
                if dry_run or self._sweep_due(started_at):
                    tally.swept = True
                    await self._list_and_delete(decision.m, started_at, dry_run, tally)
                    if not dry_run and tally.list_errors == 0:
                        self._last_sweep_at = started_at
                else:
                    await self._delete_from_catalog(decision.m, started_at, tally)
        finally:
            self._absorb(tally, decision, dry_run)
        finished_at = self._clock()
        report = RoundReport(
            **msgspec.structs.asdict(tally.counts()),
            round_id=round_id,
            dry_run=dry_run,
            started_at=started_at,
            finished_at=finished_at,
            cluster_epoch=decision.cluster_epoch,
            m=decision.m,
            blocked_by=list(decision.blocked_by),
            holders=list(decision.holders),
            backlog=0 if dry_run else tally.eligible - tally.deleted,
            oldest_young_at=tally.oldest_young_at,
            would_delete=tally.would_delete,
            would_delete_truncated=tally.would_delete_truncated,
            error_samples=tally.error_samples,
            swept=tally.swept,
            failed=tally.failed,
        )
        assert report.backlog >= 0, report
        self._last = report
        await self._log.record_gc_round(self._round_row(report))
        # The round's figures are fields of the event (JSON logs: JSON fields), not message text.
        # A round that did nothing, found nothing wrong and was not asked for is DEBUG: an idle
        # daemon's log is not a line per round.
        idle = not (dry_run or report.deleted or report.errors or report.failed or report.blocked)
        log.log(
            logging.DEBUG if idle else logging.INFO,
            "gc dry run" if dry_run else "gc round",
            extra={
                "round": round_id,
                "dry_run": dry_run,
                "cluster_epoch": report.cluster_epoch,
                "m": report.m,
                "catalog": report.catalog_read,
                "swept": report.swept,
                "listed": report.listed,
                "eligible": report.eligible,
                "deleted": report.deleted,
                "deleted_bytes": report.deleted_bytes,
                "too_young": report.too_young,
                "above_m": report.above_m,
                "errors": report.errors,
                "throttled": report.throttled,
                "backlog": report.backlog,
                "failed": report.failed,
                "blocked_by": _shown(report.blocked_by) if report.blocked else None,
                "duration_s": round(finished_at - started_at, 3),
            },
        )
        return report

    def _say_if_blocked(self, decision: WatermarkDecision, now: float) -> None:
        """Every blocked round's line is INFO; a GC blocked for long (`BlockedWatch`) is a
        WARNING once, naming the partitions without an `M(p)`; its end is said once (INFO)."""
        rounds, blocked_for_s = self._blocked.rounds, self._blocked.blocked_for_s(now)
        match self._blocked.observe(decision.blocked, now):
            case BlockedChange.STAYS_BLOCKED:
                log.warning(
                    "gc blocked for %d rounds (%.0f s): no L0 object is deleted while partitions "
                    "have no M(p): %s (levelzero gc explain says why)",
                    self._blocked.rounds,
                    self._blocked.blocked_for_s(now),
                    _shown(decision.blocked_by),
                    extra={"blocked_by": list(decision.blocked_by[:BLOCKED_BY_SHOWN_MAX])},
                )
            case BlockedChange.UNBLOCKED:
                log.info(
                    "gc unblocked after %d rounds (%.0f s): M is %s, L0 objects are deleted again",
                    rounds,
                    blocked_for_s,
                    decision.m,
                )
            case None:
                pass

    async def read_watermark(self) -> WatermarkReading:
        """`M` now, as a round computes it: one snapshot (`_snapshot`) through
        `compute_cluster_watermark`. Rounds, explain, and (through `watermark`) status and
        metrics all take `M` from here, so what they show is what the GC acts on."""
        return self._read(*await self._snapshot())

    def watermark(self) -> WatermarkReading | None:
        """The newest `M` without waiting (status and metrics read it on the event loop). In
        a cluster, the last `read_watermark` (a round's, explain's, or the node's, which reads
        it every third of the lease TTL); None before the first. Alone, read now: the board
        and the epoch are in memory."""
        if self._watermarks is not None:
            return self._reading
        return self._read(*self._local_snapshot())

    def _read(self, epoch: int, mps: dict[str, int | None]) -> WatermarkReading:
        reading = WatermarkReading(compute_cluster_watermark(epoch, mps), mps, self._clock())
        self._reading = reading
        return reading

    async def _snapshot(self) -> tuple[int, dict[str, int | None]]:
        """E and the partition set's M(p), taken together. In a cluster, one transaction of
        the control plane (a partition created later has creation epoch >= E: the store
        creates it at least at the stored epoch, under a lock). Alone, the board then the
        epoch with no await between: a partition registered on the board after this has
        creation epoch >= E. Either way the cap E - 1 protects partitions the snapshot missed."""
        if self._watermarks is not None:
            return await self._watermarks()
        return self._local_snapshot()

    def _local_snapshot(self) -> tuple[int, dict[str, int | None]]:
        mps = self._board.snapshot()
        return self._cluster_epoch(), mps

    def _round_row(self, report: RoundReport) -> GcRoundRow:
        blocked = None
        if report.blocked:
            blocked = f"partitions without M(p): {_shown(report.blocked_by)}"
        return GcRoundRow(
            round_id=report.round_id,
            started_at=report.started_at,
            finished_at=report.finished_at,
            cluster_epoch=report.cluster_epoch,
            m=report.m,
            dry_run=report.dry_run,
            listed=report.listed,
            deleted=report.deleted,
            deleted_bytes=report.deleted_bytes,
            too_young=report.too_young,
            above_m=report.above_m,
            errors=report.errors,
            blocked_by=blocked,
        )

    def _absorb(self, tally: _Tally, decision: WatermarkDecision, dry_run: bool) -> None:
        t = self._totals
        t.dry_runs += dry_run
        t.safety_blocked_rounds += decision.blocked
        t.sweeps += tally.swept
        t.counts.add(tally)

    def _sweep_due(self, now: float) -> bool:
        last = self._last_sweep_at
        # A wall clock that stepped back counts as due: better one listing too many.
        return last is None or not 0 <= now - last < self.config.sweep_interval_s

    async def _delete_from_catalog(self, m: int, now: float, tally: _Tally) -> None:
        """Delete the catalog's objects with epoch <= `m` that are old enough: pages of
        `delete_batch_keys_max * deletes_in_flight_max` rows in (epoch, key) order (one query
        feeds every deleter: a query per batch came back late while the event loop was busy
        serializing the previous delete; only the first page is one batch, so that the first
        delete does not wait for the rest), cut into batches of `delete_batch_keys_max`. Rows
        whose delete failed stay in the catalog (next round). Alone, the catalog holds this
        node's uploads in every prefix; deleting outside this worker's share is as safe as
        inside it (the rule is `M`, not the prefix). In a cluster the catalog is shared: each
        node deletes the rows of its prefix share, so no object is deleted by every node."""
        batch_max = self.config.delete_batch_keys_max
        page_max = batch_max * self.config.deletes_in_flight_max
        young_before = now - self.config.grace_s

        async def read_catalog(send: MemoryObjectSendStream[list[Eligible]]) -> None:
            after: tuple[int, str] | None = None
            limit = batch_max  # the first page is one batch: the first delete starts sooner
            while True:
                rows = await self._log.l0_live_objects(m, after, limit)
                if not rows:
                    return
                after = (rows[-1].epoch, rows[-1].key)
                tally.catalog_read += len(rows)
                eligible = self._catalog_eligible(rows, m, young_before, tally)
                for start in range(0, len(eligible), batch_max):
                    await send.send(eligible[start : start + batch_max])
                if len(rows) < limit:
                    return
                limit = page_max

        await self._with_deleters(m, tally, read_catalog)

    def _catalog_eligible(
        self, rows: list[L0ObjectRow], m: int, young_before: float, tally: _Tally
    ) -> list[Eligible]:
        eligible: list[Eligible] = []
        share = self._share() if self._share is not None else None
        for row in rows:
            if share is not None and _key_prefix(row.key) not in share:
                continue  # another node's share of the shared catalog
            try:
                epoch = l0_key_epoch(row.key)  # the key decides, not the row beside it
            except ValueError:
                tally.malformed += 1
                continue
            if epoch != row.epoch or epoch > m:
                tally.malformed += 1
                tally.note_error(f"catalog row {row.key} says epoch {row.epoch}")
                continue
            if row.created_at > young_before:
                tally.too_young += 1
                if tally.oldest_young_at is None or row.created_at < tally.oldest_young_at:
                    tally.oldest_young_at = row.created_at
                continue
            eligible.append(Eligible(row.key, row.size, epoch))
        tally.note_eligible(eligible)
        tally.catalog_eligible += len(eligible)
        return eligible

    async def _list_and_delete(self, m: int, now: float, dry_run: bool, tally: _Tally) -> None:
        batch_max = self.config.delete_batch_keys_max
        pending: list[Eligible] = []

        async def scan_range(prefixes: range, out: anyio.abc.ObjectSendStream[list[Eligible]]) -> None:
            async with out:
                scan = RangeScan(prefixes, m, now, self.config.grace_s)
                try:
                    while not scan.done:
                        prefix, start_after = scan.request()
                        page = await self._retrying(
                            "list",
                            functools.partial(self._objects.list_page, prefix, start_after),
                            tally,
                        )
                        if page is None:
                            return  # this range waits for the next round
                        tally.lists_answered += 1
                        eligible = scan.feed(page.objects, page.next_start_after is None)
                        tally.note_eligible(eligible)
                        if dry_run:
                            self._note_would_delete(eligible, tally)
                            continue
                        pending.extend(eligible)
                        while len(pending) >= batch_max:  # cut before any await: no batch twice
                            batch = pending[:batch_max]
                            del pending[:batch_max]
                            try:
                                await out.send(batch)
                            except anyio.BrokenResourceError:
                                return  # the deleters died; their error fails the round
                finally:
                    tally.absorb_scan(scan)

        ranges = self._ranges
        if self._share is not None:
            ranges = split_prefixes(self._share(), self.config.list_concurrency_max)

        async def scan_all(send: MemoryObjectSendStream[list[Eligible]]) -> None:
            async with anyio.create_task_group() as scanners:
                for prefixes in ranges:
                    scanners.start_soon(scan_range, prefixes, send.clone())
            while pending:
                batch = pending[:batch_max]
                del pending[:batch_max]
                await send.send(batch)

        await self._with_deleters(m, tally, scan_all)

    async def _with_deleters(
        self,
        m: int,
        tally: _Tally,
        feed: Callable[[MemoryObjectSendStream[list[Eligible]]], Awaitable[None]],
    ) -> None:
        """Run `feed`, which sends batches of eligible keys, beside `deletes_in_flight_max`
        deleters taking them over a stream that holds as many batches (so that a deleter
        finds the next batch ready while the feed reads a page; memory stays bounded by the
        batches waiting, being sent and being deleted). A deleter adds the keys it deleted to
        the round's unmarked keys and takes the next batch at once; one marking task stamps
        them in the catalog, every key unmarked so far (up to `MARK_KEYS_MAX`) in one call, so
        that while a commit is on its way the next keys gather for one more: a round of 20
        deletes commits a handful of marks, not 20 (each mark is a statement and a commit of
        the log store's writer, whose CPU the deletes share). Deleters wait only while
        `deletes_in_flight_max` batches' worth of keys are unmarked. The round ends when every
        deleted key is marked. A mark lost to a failed or cancelled round costs nothing but a
        repeated delete: its row stays live, and the next round deletes the (missing) key
        again, which succeeds, and marks it."""
        in_flight = self.config.deletes_in_flight_max
        send, receive = anyio.create_memory_object_stream[list[Eligible]](in_flight)
        unmarked_max = in_flight * self.config.delete_batch_keys_max
        unmarked: list[str] = []
        gathered = anyio.Event()  # keys were added to `unmarked`, or the deletes are over
        taken = anyio.Event()  # the marker took keys: room for more
        deletes_over = False

        async def marker() -> None:
            nonlocal gathered, taken
            while True:
                if not unmarked:
                    if deletes_over:
                        return
                    await gathered.wait()
                    gathered = anyio.Event()
                    continue
                keys = unmarked[:MARK_KEYS_MAX]
                del unmarked[:MARK_KEYS_MAX]
                taken.set()
                taken = anyio.Event()
                await self._log.mark_l0_deleted(keys, self._clock(), m)

        async def delete_batches(batches: anyio.abc.ObjectReceiveStream[list[Eligible]]) -> None:
            async with batches:
                async for batch in batches:
                    deleted, throttled = await self._delete_batch(batch, m, tally)
                    if deleted:
                        while len(unmarked) >= unmarked_max:
                            await taken.wait()
                        unmarked.extend(deleted)
                        gathered.set()
                    if throttled:  # "slow down" for some keys: the next request waits
                        await self._sleep(self.config.throttle_backoff_s)

        try:
            async with anyio.create_task_group() as markers:
                markers.start_soon(marker)
                try:
                    async with anyio.create_task_group() as tg:
                        async with receive:
                            for _ in range(in_flight):
                                tg.start_soon(delete_batches, receive.clone())
                        async with send:
                            await feed(send)
                finally:  # the marker marks what is left, then ends
                    deletes_over = True
                    gathered.set()
        except BaseExceptionGroup as group:
            raise _root_cause(group) from None

    def _note_would_delete(self, eligible: list[Eligible], tally: _Tally) -> None:
        room = self.config.dry_run_keys_max - len(tally.would_delete)
        tally.would_delete.extend(e.key for e in eligible[: max(room, 0)])
        if len(eligible) > room:
            tally.would_delete_truncated = True

    async def _delete_batch(self, batch: list[Eligible], m: int, tally: _Tally) -> tuple[list[str], bool]:
        """Delete one batch. Returns the keys deleted (for the catalog to mark), and whether
        the store answered "slow down" for some of the others."""
        keys = [e.key for e in batch]
        result: DeleteResult | None = await self._retrying(
            "delete", lambda: self._objects.delete_many(keys), tally
        )
        if result is None:
            tally.delete_errors += len(keys)  # listed again next round
            return [], False
        if result.errors or len(result.deleted) != len(keys):
            by_key = {e.key: e for e in batch}
            deleted = [key for key in result.deleted if key in by_key]
            done = [by_key[key] for key in deleted]
        else:  # the common case: every key went
            deleted, done = keys, batch
        assert len(deleted) + len(result.errors) == len(keys), (len(deleted), result.errors)
        if done:
            top = max(e.epoch for e in done)
            assert top <= m, (top, m)
            tally.deleted += len(done)
            tally.deleted_bytes += sum(e.size for e in done)
            if tally.max_deleted_epoch is None or top > tally.max_deleted_epoch:
                tally.max_deleted_epoch = top
        if result.errors:
            tally.delete_errors += len(result.errors)
            key, error = next(iter(result.errors.items()))
            tally.note_error(f"delete {key}: {error}")
            log.warning(
                "gc: keys not deleted, retried next round",
                extra={
                    "not_deleted": len(result.errors),
                    "asked": len(keys),
                    "example_key": key,
                    "detail": str(error),
                },
            )
        throttled = any(is_throttling(error) for error in result.errors.values())
        tally.throttled += throttled
        return deleted, throttled

    async def _retrying(self, op: str, call: Callable[[], Awaitable[T]], tally: _Tally) -> T | None:
        """One store request; "slow down" answers back off (doubling) and retry, bounded.
        Returns None when the request failed for this round (counted and sampled)."""
        backoff_s = self.config.throttle_backoff_s
        for attempt in range(THROTTLE_RETRIES_MAX + 1):
            if op == "list":
                tally.list_requests += 1
            else:
                tally.delete_requests += 1
            try:
                return await call()
            except StorageError as exc:
                if is_throttling(str(exc)) and attempt < THROTTLE_RETRIES_MAX:
                    tally.throttled += 1
                    log.info(
                        "gc request throttled, backing off",
                        extra={"op": op, "backoff_s": backoff_s, "detail": str(exc)},
                    )
                    await self._sleep(backoff_s)
                    backoff_s *= 2
                    continue
                if op == "list":
                    tally.list_errors += 1
                tally.note_error(f"{op}: {exc}")
                # Once an interval per operation (a round lists its prefixes in up to
                # list_concurrency_max ranges: an outage failed each, every round)
                self._request_failures.warn(
                    op,
                    "gc request failed, retried next round: %s: %s",
                    op,
                    exc,
                    extra={"op": op, "detail": str(exc)},
                )
                return None
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ explain

    async def explain(self, key: str | None = None, epoch: int | None = None) -> Explanation:
        """Why `key` (or any object of `epoch`) is or is not deleted, with `M` computed now and
        the partitions that hold it back. Neither given: what holds `M` where it is."""
        if key is not None and epoch is not None:
            raise InvalidInput("explain takes a key or an epoch, not both")
        if key is not None and not isinstance(key, str):
            raise InvalidInput("explain key must be a string")
        if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1):
            raise InvalidInput(f"explain epoch must be an integer >= 1 (got {epoch!r})")
        obj = None
        if key is not None and _parses(key):
            obj = await self._objects.head(key)
        reading = await self.read_watermark()
        facts = {view.name: _facts(view, self._reconcile_failing(view.name)) for view in self._views()}
        return explain(
            reading.decision,
            reading.mps,
            facts,
            key=key,
            epoch=epoch,
            obj=obj,
            now=self._clock(),
            grace_s=self.config.grace_s,
            prefixes=self._share() if self._share is not None else self._prefixes,
            leaders=self._leaders(),
        )


def _root_cause(group: BaseExceptionGroup) -> BaseException:
    """The error that failed a round's task group (callers catch `LevelZeroError`, not a
    group): the one error, or the first when every one is a `LevelZeroError` (a failed log
    store commit fails every mark waiting in it at once); else the group itself, so that a
    bug is never hidden behind an operating error."""
    leaves: list[BaseException] = []

    def collect(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                collect(inner)
        elif not isinstance(exc, anyio.BrokenResourceError):
            leaves.append(exc)

    collect(group)
    if len(leaves) == 1 or (leaves and all(isinstance(e, LevelZeroError) for e in leaves)):
        for other in leaves[1:]:
            if type(other) is not type(leaves[0]) or str(other) != str(leaves[0]):
                log.warning("gc round: also failed: %s: %s", type(other).__name__, other)
        return leaves[0]
    return group


def _key_prefix(key: str) -> int:
    """The prefix of an L0 key (-1 for a malformed one: no share holds it)."""
    try:
        return parse_l0_key(key).prefix
    except MalformedKey:
        return -1


def _parses(key: str) -> bool:
    try:
        parse_l0_key(key)
    except ValueError:
        return False
    return True


def _facts(view: PartitionView, reconcile_failing: ReconcileFailing | None) -> PartitionFacts:
    return PartitionFacts(
        name=view.name,
        state_mp=view.mp,
        pinned_mp=view.pinned_mp,
        lro=view.state.lro,
        high_watermark=view.state.high_watermark,
        max_applied_epoch=view.state.max_applied_epoch,
        reconcile_failing=None if reconcile_failing is None else reconcile_failing.describe(),
        reconcile_failing_since=None if reconcile_failing is None else reconcile_failing.since,
    )


def _shown(names: list[str] | tuple[str, ...]) -> str:
    shown = ", ".join(names[:BLOCKED_BY_SHOWN_MAX])
    more = len(names) - BLOCKED_BY_SHOWN_MAX
    return shown + (f" and {more} more" if more > 0 else "")
