"""Run seeds: the workload phase, the quiet period, the checks, and a result per seed."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from levelzero.core.fence import FenceMode

from .config import SimConfig
from .violation import SimulationViolation, Violation
from .world import MUTATIONS, World

DEFAULT_CONFIG = SimConfig()


@dataclass(frozen=True, slots=True)
class SimResult:
    seed: int
    mode: str
    mutation: str | None
    steps: int
    virtual_s: float
    writes_submitted: int
    writes_acked: int
    records_acked: int
    writes_failed: int
    stale_rejections: int
    stale_retries: int
    objects_written: int
    objects_deleted: int
    orphans: int
    l1_written: int
    l1_deleted: int
    catch_ups_rejected: int
    leadership_changes: int
    crashes: int
    epoch_bumps: int
    gc_rounds: int
    partitions_created_during_gc: int
    faults: int
    # invariant 6: write stall after leadership changes (virtual seconds)
    max_stall_s: float
    total_stall_s: float
    stalled_changes: int
    stale_cache_changes: int  # new leader's cache fresh but below the partition's max epoch
    stale_cache_max_stall_s: float
    stale_cache_total_stall_s: float
    stale_cache_rejections: int
    rejections_after_change: int
    writes_over_one_retry_after_change: int
    l0_left: int
    records_checked: int
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
    steps: int | None = None,
    config: SimConfig = DEFAULT_CONFIG,
) -> SimResult:
    """Simulate one seed. Same seed, same arguments → the same result, trace included.

    `steps` is the number of events of the workload phase (faults included); the quiet period
    that follows runs until every L0 object is collected (invariant 4) or its bound runs out.
    A violation does not raise: it is in `result.violation` with the invariant and the trace.
    """
    if steps is not None:
        config = replace(config, workload_steps=steps)
    started = time.perf_counter()
    world = World(seed, config, mode=FenceMode(fencing_mode), mutation=mutation)
    violation: Violation | None = None
    records_checked = 0
    try:
        records_checked = _run(world)
    except SimulationViolation as exc:
        violation = _violation(world, exc.invariant, exc.message)
        exc.violation = violation
    except AssertionError as exc:  # the core's or the model's own assertions
        where = traceback.extract_tb(exc.__traceback__)[-1]
        message = f"{type(exc).__name__}: {exc} at {where.filename}:{where.lineno} ({where.name})"
        violation = _violation(world, "assert", message)
    except Exception as exc:
        exc.add_note(f"levelzero.sim seed {seed}, mode {world.mode}, mutation {mutation}")
        exc.add_note("\n".join(world.sched.trace))
        raise
    return _result(world, violation, records_checked, time.perf_counter() - started)


def _run(world: World) -> int:
    cfg = world.cfg
    sched = world.sched
    truth = world.truth
    world.start()
    while sched.steps < cfg.workload_steps:
        assert sched.step(), "the workload ran out of events"
        truth.check_monotone()
        if sched.steps % cfg.check_every_steps == 0:
            truth.check_readable()
    world.begin_quiet()
    quiet_from, quiet_steps_from = sched.now, sched.steps
    while not world.settled:
        if (
            sched.now - quiet_from > cfg.quiet_s_max
            or sched.steps - quiet_steps_from > cfg.quiet_steps_max
        ):
            raise SimulationViolation("4", world.explain_leftovers())
        assert sched.step(), "the quiet period ran out of events"
        truth.check_monotone()
        if sched.steps % cfg.check_every_steps == 0:
            truth.check_readable()
    return truth.check_readable()


def _violation(world: World, invariant: str, message: str) -> Violation:
    return Violation(
        invariant=invariant,
        message=message,
        seed=world.seed,
        mode=str(world.mode),
        mutation=world.mutation,
        time_s=world.sched.now,
        step=world.sched.steps,
        trace=tuple(world.sched.trace),
    )


def _result(
    world: World, violation: Violation | None, records_checked: int, wall_s: float
) -> SimResult:
    s = world.stats
    changes = world.changes
    return SimResult(
        seed=world.seed,
        mode=str(world.mode),
        mutation=world.mutation,
        steps=world.sched.steps,
        virtual_s=round(world.sched.now, 6),
        writes_submitted=s.writes_submitted,
        writes_acked=s.writes_acked,
        records_acked=s.records_acked,
        writes_failed=s.writes_failed,
        stale_rejections=s.stale_rejections,
        stale_retries=s.stale_retries,
        objects_written=s.objects_written,
        objects_deleted=s.objects_deleted,
        orphans=s.orphans,
        l1_written=s.l1_written,
        l1_deleted=s.l1_deleted,
        catch_ups_rejected=s.catch_ups_rejected,
        leadership_changes=s.leadership_changes,
        crashes=s.crashes,
        epoch_bumps=s.epoch_bumps,
        gc_rounds=s.gc_rounds,
        partitions_created_during_gc=s.partitions_created_during_gc,
        faults=s.faults,
        max_stall_s=max((c.stall_s for c in changes), default=0.0),
        total_stall_s=sum(c.stall_s for c in changes),
        stalled_changes=sum(1 for c in changes if c.stall_s > 0),
        stale_cache_changes=sum(1 for c in changes if c.stale),
        stale_cache_max_stall_s=max((c.stall_s for c in changes if c.stale), default=0.0),
        stale_cache_total_stall_s=sum(c.stall_s for c in changes if c.stale),
        stale_cache_rejections=sum(c.rejections for c in changes if c.stale),
        rejections_after_change=sum(c.rejections for c in changes),
        writes_over_one_retry_after_change=sum(c.writes_over_one_retry for c in changes),
        l0_left=world.store.l0_count,
        records_checked=records_checked,
        violation=violation,
        trace_digest=world.sched.digest,
        wall_s=wall_s,
    )


def run_many(
    seeds: Iterable[int],
    *,
    mutation: str | None = None,
    fencing_mode: str | FenceMode = FenceMode.WINDOWED,
    steps: int | None = None,
    config: SimConfig = DEFAULT_CONFIG,
    stop_on_violation: bool = False,
    progress: Callable[[SimResult], None] | None = None,
) -> list[SimResult]:
    """Run seeds in order; with `stop_on_violation`, stop at the first seed that finds one."""
    results = []
    for seed in seeds:
        result = run_seed(
            seed, mutation=mutation, fencing_mode=fencing_mode, steps=steps, config=config
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
    steps: int
    writes_acked: int
    records_acked: int
    writes_failed: int
    stale_rejections: int
    objects_written: int
    objects_deleted: int
    orphans: int
    l1_written: int
    leadership_changes: int
    crashes: int
    epoch_bumps: int
    gc_rounds: int
    partitions_created_during_gc: int
    max_stall_s: float
    total_stall_s: float
    rejections_after_change: int
    writes_over_one_retry_after_change: int
    stale_cache_changes: int
    stale_cache_max_stall_s: float
    stale_cache_total_stall_s: float
    stale_cache_rejections: int
    l0_left: int

    @property
    def seeds_per_s(self) -> float:
        return self.seeds / self.wall_s if self.wall_s > 0 else float("inf")


def summarize(results: list[SimResult]) -> Summary:
    def total(name: str) -> int:
        return sum(getattr(r, name) for r in results)

    failed = [r for r in results if r.violation is not None]
    return Summary(
        seeds=len(results),
        violations=len(failed),
        first_violation=failed[0].violation if failed else None,
        wall_s=sum(r.wall_s for r in results),
        steps=total("steps"),
        writes_acked=total("writes_acked"),
        records_acked=total("records_acked"),
        writes_failed=total("writes_failed"),
        stale_rejections=total("stale_rejections"),
        objects_written=total("objects_written"),
        objects_deleted=total("objects_deleted"),
        orphans=total("orphans"),
        l1_written=total("l1_written"),
        leadership_changes=total("leadership_changes"),
        crashes=total("crashes"),
        epoch_bumps=total("epoch_bumps"),
        gc_rounds=total("gc_rounds"),
        partitions_created_during_gc=total("partitions_created_during_gc"),
        max_stall_s=max((r.max_stall_s for r in results), default=0.0),
        total_stall_s=sum(r.total_stall_s for r in results),
        rejections_after_change=total("rejections_after_change"),
        writes_over_one_retry_after_change=total("writes_over_one_retry_after_change"),
        stale_cache_changes=total("stale_cache_changes"),
        stale_cache_max_stall_s=max((r.stale_cache_max_stall_s for r in results), default=0.0),
        stale_cache_total_stall_s=sum(r.stale_cache_total_stall_s for r in results),
        stale_cache_rejections=total("stale_cache_rejections"),
        l0_left=total("l0_left"),
    )


__all__ = ["MUTATIONS", "SimResult", "Summary", "run_many", "run_seed", "summarize"]
