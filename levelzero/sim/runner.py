"""Run seeds: one deterministic loop per seed running the world, and a result per seed."""

from __future__ import annotations

import contextlib
import logging
import random
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from levelzero.core.fence import FenceMode

from .config import SimConfig
from .loop import Deadlock, DeterministicLoop, Livelock, run_deterministic
from .mutations import MUTATIONS, applied
from .violation import Violation
from .world import World

DEFAULT_CONFIG = SimConfig()


@dataclass(frozen=True, slots=True)
class SimResult:
    seed: int
    mode: str
    mutation: str | None
    nodes: int
    virtual_s: float
    callbacks: int
    writes_submitted: int
    writes_acked: int
    records_acked: int
    writes_failed: int
    reads: int
    records_read: int
    stale_rejections: int
    stale_retries: int
    objects_uploaded: int
    objects_deleted: int
    orphans: int
    l1_written: int
    l1_rounds_deferred: int
    l0_cache_served: int  # extents the readers' L0 cache served without a GET of their own
    l0_cache_loads: int
    deletes_under_pins: int  # L0 deletes while a live reader held a pin (checked against it)
    crashes: int
    graceful_stops: int
    stops_killed: int  # graceful stops killed just after a drain's control-plane call
    late_control_requests: int  # control-plane requests that landed after their sender died
    pauses: int
    epoch_bumps: int
    gc_rounds: int
    topics_created: int
    partitions_created_during_gc: int
    faults: int
    l0_left: int
    records_checked: int
    records_dropped: int  # acknowledged, then dropped by retention (below the start offset)
    # invariant 6: write stall after a new incarnation takes over (virtual seconds)
    leadership_changes: int
    max_stall_s: float
    total_stall_s: float
    rejections_after_change: int
    writes_over_one_retry_after_change: int
    stale_cache_changes: int  # the new incarnation's cache started behind the cluster epoch
    stale_cache_max_stall_s: float
    stale_cache_total_stall_s: float
    stale_cache_rejections: int
    heal_s: float
    quiet_s: float
    healed_writes: int
    healed_attempts_max: int
    healed_write_s_max: float
    collect_wait_s_max: float
    reconcile_wait_s_max: float
    # compaction (`compaction.py`): accepted and refused results, scans whose rules were checked
    compaction_passes: int
    compaction_refused: int
    compaction_scans: int
    compaction_interrupted: int  # passes under way when their node crashed or stopped
    # transactions (`transactions.py`): ended by EndTxn commit / abort, given up (a restart, a
    # timeout), and the records read_committed consumers were given and skipped (aborted)
    txn_committed: int
    txn_aborted: int
    txn_given_up: int
    txn_records_read: int
    txn_records_skipped: int
    txn_deletes: int  # DeleteRecords answered
    txn_deletes_held: int  # ... with the start offset held below the offset asked
    txn_compacted: int  # 1: the transactional topic is compacted
    txn_compactions: int  # ... its compaction passes accepted
    txn_refetched: int  # empty read_committed answers below their LSO, fetched again
    violation: Violation | None
    trace_digest: int
    wall_s: float = field(default=0.0, compare=False)

    @property
    def violations(self) -> int:
        return 0 if self.violation is None else 1


def run_seed(
    seed: int,
    *,
    mutation: str | None = None,
    fencing_mode: str | FenceMode = FenceMode.WINDOWED,
    workload_s: float | None = None,
    config: SimConfig = DEFAULT_CONFIG,
    nodes: int = 1,
) -> SimResult:
    """Simulate one seed. Same seed, same arguments -> the same result, trace included.

    A violation does not raise: it is in `result.violation` with the invariant and the trace.
    """
    if mutation is not None and mutation not in MUTATIONS:
        raise ValueError(f"unknown mutation {mutation!r}; one of {', '.join(MUTATIONS)}")
    if workload_s is not None:
        config = replace(config, workload_s=workload_s)
    started = time.perf_counter()
    world = World(seed, config, mode=FenceMode(fencing_mode), mutation=mutation, nodes=nodes)
    loop_rng = random.Random(f"loop-{seed}")
    callbacks = 0
    virtual_s = 0.0
    violation: Violation | None = None
    with applied(mutation), _quiet_logs():
        loop = DeterministicLoop(loop_rng)
        try:
            run_deterministic(world.run(), loop_rng, loop=loop)
        except BaseException as exc:  # sorted below; anything else re-raised
            violation = _violation_of(world, exc, loop.time())
            if violation is None:
                exc.add_note(
                    f"levelzero.sim seed {seed}, mode {world.mode}, mutation {mutation}, nodes {nodes}"
                )
                exc.add_note("\n".join(world.trace))
                raise
        finally:
            callbacks = loop.callbacks_run
            virtual_s = loop.time()
    if violation is None and world.violation is not None:
        violation = _violation(world, world.violation.invariant, world.violation.message, virtual_s)
    world.finish()
    return _result(world, violation, callbacks, virtual_s, time.perf_counter() - started)


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """The actors log what an operator needs (faults, retries); thousands of seeds of injected
    faults are not that. The simulation reports through its trace instead."""
    logger = logging.getLogger("levelzero")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _violation_of(world: World, exc: BaseException, now: float) -> Violation | None:
    if world.violation is not None:  # the first one, wherever it was raised and caught
        return _violation(world, world.violation.invariant, world.violation.message, now)
    for leaf in _leaves(exc):
        if isinstance(leaf, Deadlock):
            return _violation(world, "livelock" if isinstance(leaf, Livelock) else "deadlock", str(leaf), now)
    for leaf in _leaves(exc):
        if isinstance(leaf, AssertionError):  # the core's or the actors' own assertions
            where = traceback.extract_tb(leaf.__traceback__)[-1]
            message = (
                f"{type(leaf).__name__}: {leaf} at {where.filename.rsplit('levelzero/', 1)[-1]}:"
                f"{where.lineno} ({where.name})"
            )
            return _violation(world, "assert", message, now)
    return None


def _violation(world: World, invariant: str, message: str, now: float) -> Violation:
    return Violation(
        invariant=invariant,
        message=message,
        seed=world.seed,
        mode=str(world.mode),
        mutation=world.mutation,
        time_s=now,
        trace=tuple(world.trace),
    )


def _result(
    world: World, violation: Violation | None, callbacks: int, virtual_s: float, wall_s: float
) -> SimResult:
    s = world.stats
    t = world.transactions.stats
    changes = world.changes
    stale = [c for c in changes if c.stale]
    return SimResult(
        seed=world.seed,
        mode=str(world.mode),
        mutation=world.mutation,
        nodes=world.nodes,
        virtual_s=round(virtual_s, 6),
        callbacks=callbacks,
        writes_submitted=s.writes_submitted,
        writes_acked=s.writes_acked,
        records_acked=s.records_acked,
        writes_failed=s.writes_failed,
        reads=s.reads,
        records_read=s.records_read,
        stale_rejections=s.stale_rejections,
        stale_retries=s.stale_retries,
        objects_uploaded=s.objects_uploaded,
        objects_deleted=s.objects_deleted,
        orphans=s.orphans,
        l1_written=s.l1_written,
        l1_rounds_deferred=s.l1_rounds_deferred,
        l0_cache_served=s.l0_cache_served,
        l0_cache_loads=s.l0_cache_loads,
        deletes_under_pins=world.truth.deletes_under_pins,
        crashes=s.crashes,
        graceful_stops=s.graceful_stops,
        stops_killed=s.stops_killed,
        late_control_requests=sum(link.late for link in world.control_links),
        pauses=s.pauses,
        epoch_bumps=world.log_store.cluster_epoch - 1,
        gc_rounds=s.gc_rounds,
        topics_created=s.topics_created,
        partitions_created_during_gc=s.partitions_created_during_gc,
        faults=world.faults.injected,
        l0_left=sum(1 for k in world.objects.keys() if k.startswith("level_zero/")),
        records_checked=world.records_checked,
        records_dropped=world.truth.dropped,
        leadership_changes=len(changes),
        max_stall_s=max((c.stall_s for c in changes), default=0.0),
        total_stall_s=sum(c.stall_s for c in changes),
        rejections_after_change=sum(c.rejections for c in changes),
        writes_over_one_retry_after_change=sum(c.writes_over_one_retry for c in changes),
        stale_cache_changes=len(stale),
        stale_cache_max_stall_s=max((c.stall_s for c in stale), default=0.0),
        stale_cache_total_stall_s=sum(c.stall_s for c in stale),
        stale_cache_rejections=sum(c.rejections for c in stale),
        heal_s=round(s.heal_s, 6),
        quiet_s=round(s.quiet_s, 6),
        healed_writes=s.healed_writes,
        healed_attempts_max=s.healed_attempts_max,
        healed_write_s_max=round(s.healed_write_s_max, 6),
        collect_wait_s_max=round(s.collect_wait_s_max, 6),
        reconcile_wait_s_max=round(s.reconcile_wait_s_max, 6),
        compaction_passes=world.compaction.stats.passes,
        compaction_refused=world.compaction.stats.refused,
        compaction_scans=world.compaction.stats.scans_checked,
        compaction_interrupted=world.compaction.stats.interrupted,
        txn_committed=world.transactions.stats.committed,
        txn_aborted=world.transactions.stats.aborted,
        txn_given_up=t.transactions - t.committed - t.aborted,
        txn_records_read=t.records_read,
        txn_records_skipped=t.aborted_skipped,
        txn_deletes=t.deletes,
        txn_deletes_held=t.deletes_held,
        txn_compacted=t.compacted,
        txn_compactions=t.compactions,
        txn_refetched=t.refetched,
        violation=violation,
        trace_digest=world.digest,
        wall_s=wall_s,
    )


def run_many(
    seeds: Iterable[int],
    *,
    mutation: str | None = None,
    fencing_mode: str | FenceMode = FenceMode.WINDOWED,
    workload_s: float | None = None,
    config: SimConfig = DEFAULT_CONFIG,
    stop_on_violation: bool = False,
    progress: Callable[[SimResult], None] | None = None,
    nodes: int = 1,
) -> list[SimResult]:
    """Run seeds in order; with `stop_on_violation`, stop at the first seed that finds one."""
    results = []
    for seed in seeds:
        result = run_seed(
            seed,
            mutation=mutation,
            fencing_mode=fencing_mode,
            workload_s=workload_s,
            config=config,
            nodes=nodes,
        )
        results.append(result)
        if progress is not None:
            progress(result)
        if stop_on_violation and result.violation is not None:
            break
    return results


@dataclass(frozen=True, slots=True)
class Summary:
    seeds: int
    violations: int
    first_violation: Violation | None
    wall_s: float
    virtual_s: float
    callbacks: int
    writes_acked: int
    records_acked: int
    writes_failed: int
    reads: int
    stale_rejections: int
    objects_uploaded: int
    objects_deleted: int
    orphans: int
    l1_written: int
    l1_rounds_deferred: int
    l0_cache_served: int
    l0_cache_loads: int
    deletes_under_pins: int
    crashes: int
    graceful_stops: int
    stops_killed: int  # graceful stops killed just after a drain's control-plane call
    late_control_requests: int  # control-plane requests that landed after their sender died
    pauses: int
    epoch_bumps: int
    gc_rounds: int
    partitions_created_during_gc: int
    faults: int
    l0_left: int
    records_checked: int
    records_dropped: int
    leadership_changes: int
    total_stall_s: float
    rejections_after_change: int
    writes_over_one_retry_after_change: int
    stale_cache_changes: int
    stale_cache_total_stall_s: float
    stale_cache_rejections: int
    max_stall_s: float
    stale_cache_max_stall_s: float
    compaction_passes: int
    compaction_refused: int
    compaction_scans: int
    compaction_interrupted: int
    txn_committed: int
    txn_aborted: int
    txn_given_up: int
    txn_records_read: int
    txn_records_skipped: int
    txn_deletes: int
    txn_deletes_held: int
    txn_compacted: int
    txn_compactions: int
    txn_refetched: int

    @property
    def seeds_per_s(self) -> float:
        return self.seeds / self.wall_s if self.wall_s > 0 else float("inf")


_SUMMED = (
    "virtual_s",
    "callbacks",
    "writes_acked",
    "records_acked",
    "writes_failed",
    "reads",
    "stale_rejections",
    "objects_uploaded",
    "objects_deleted",
    "orphans",
    "l1_written",
    "l1_rounds_deferred",
    "l0_cache_served",
    "l0_cache_loads",
    "deletes_under_pins",
    "crashes",
    "graceful_stops",
    "stops_killed",
    "late_control_requests",
    "pauses",
    "epoch_bumps",
    "gc_rounds",
    "partitions_created_during_gc",
    "faults",
    "l0_left",
    "records_checked",
    "records_dropped",
    "leadership_changes",
    "total_stall_s",
    "rejections_after_change",
    "writes_over_one_retry_after_change",
    "stale_cache_changes",
    "stale_cache_total_stall_s",
    "stale_cache_rejections",
    "compaction_passes",
    "compaction_refused",
    "compaction_scans",
    "compaction_interrupted",
    "txn_committed",
    "txn_aborted",
    "txn_given_up",
    "txn_records_read",
    "txn_records_skipped",
    "txn_deletes",
    "txn_deletes_held",
    "txn_compacted",
    "txn_compactions",
    "txn_refetched",
)
_MAXED = ("max_stall_s", "stale_cache_max_stall_s")


class Totals:
    """Sums of results as they come (a run of 100,000 seeds keeps no list of results)."""

    def __init__(self) -> None:
        self.seeds = 0
        self.violations = 0
        self.first_violation: Violation | None = None
        self.wall_s = 0.0
        # Ints or floats, as the Summary fields they become.
        self._sums: dict[str, Any] = dict.fromkeys(_SUMMED, 0)
        self._maxes: dict[str, Any] = dict.fromkeys(_MAXED, 0.0)

    def add(self, result: SimResult) -> None:
        self.seeds += 1
        self.wall_s += result.wall_s
        if result.violation is not None:
            self.violations += 1
            if self.first_violation is None:
                self.first_violation = result.violation
        for name in _SUMMED:
            self._sums[name] += getattr(result, name)
        for name in _MAXED:
            self._maxes[name] = max(self._maxes[name], getattr(result, name))

    def summary(self) -> Summary:
        return Summary(
            seeds=self.seeds,
            violations=self.violations,
            first_violation=self.first_violation,
            wall_s=self.wall_s,
            **self._sums,
            **self._maxes,
        )


def summarize(results: Iterable[SimResult]) -> Summary:
    totals = Totals()
    for result in results:
        totals.add(result)
    return totals.summary()


__all__ = ["MUTATIONS", "SimResult", "Summary", "Totals", "run_many", "run_seed", "summarize"]
