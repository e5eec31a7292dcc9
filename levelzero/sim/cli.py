"""`levelzero sim`: run seeds of the simulation of the shipping code and print a summary.

    levelzero sim --seeds 500                 # seeds 0..499, windowed fencing
    levelzero sim --seeds 100000              # unattended: a progress line every 1,000 seeds
    levelzero sim --seeds 100000 --jobs 2     # the same seeds on two processes (two cores)
    levelzero sim --seeds 300 --mode strict   # the strict baseline (more rejections)
    levelzero sim --seeds 500 --nodes 3       # a three-node cluster over one control plane
    levelzero sim --seed 1234                 # replay one seed; prints its trace on a violation
    levelzero sim --mutate                    # each deliberately broken rule must be caught
    levelzero sim --seed 7 --mutation gc_ignores_cap   # replay a mutation's catching seed

Exit status: 0 when no invariant broke (with --mutate: when every mutation was caught), 1 when
one did, 2 on a usage error. The daemon's CLI hooks this in with `add_arguments` + `run`;
`python -m levelzero.sim` uses `main`.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import TextIO, TypeVar

from levelzero.core.fence import FenceMode

from .mutations import CLUSTER_MUTATIONS, CLUSTER_NODES, MUTATIONS
from .runner import SimResult, Summary, Totals, run_seed
from .world import NODE_IDS

DEFAULT_SEEDS = 100
MUTATE_SEEDS_DEFAULT = 300
PROGRESS_EVERY_SEEDS = 1000
FAILING_SEEDS_SHOWN_MAX = 20
JOBS_MAX = 256
# Seeds a worker process takes at a time: few enough that the processes end together, enough
# that handing them out costs nothing next to a seed (~0.1-0.3 s each).
SEEDS_PER_HAND_OUT = 4

_T = TypeVar("_T")
_R = TypeVar("_R")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seeds",
        type=int,
        default=None,
        help=(
            f"how many seeds (default {DEFAULT_SEEDS}; with --mutate: the most to try per "
            f"mutation, default {MUTATE_SEEDS_DEFAULT})"
        ),
    )
    parser.add_argument("--seed", type=int, default=None, help="first seed; alone: replay just this seed")
    parser.add_argument(
        "--mode",
        choices=[m.value for m in FenceMode],
        default=FenceMode.WINDOWED.value,
        help="fencing mode (default windowed)",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=1,
        help=(
            "nodes of the simulated cluster over one memory control plane (default 1; with "
            f"--mutate: the cluster-only mutations always run with {CLUSTER_NODES})"
        ),
    )
    parser.add_argument(
        "--mutate", action="store_true", help="run each mutation until a violation catches it"
    )
    parser.add_argument(
        "--mutation",
        choices=sorted(MUTATIONS),
        default=None,
        help="run with one mutation (to replay a catching seed)",
    )
    parser.add_argument(
        "--catches",
        type=int,
        default=1,
        help="with --mutate: catches to collect per mutation (the median seeds-to-catch)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help=(
            "processes running seeds at once (default 1; 0: one per CPU). A seed runs the same "
            "in any process: the results, and a failing seed's replay, are those of one process"
        ),
    )
    parser.add_argument(
        "--workload-s",
        type=float,
        default=None,
        help="virtual seconds of workload per seed before the quiet period",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="levelzero sim",
        description="Seeded deterministic simulation of the shipping code with fault injection.",
    )
    add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def _usage(message: str) -> int:
    print(f"levelzero sim: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if args.seeds is not None and args.seeds < 1:
        return _usage("--seeds must be >= 1")
    if args.seed is not None and args.seed < 0:
        return _usage("--seed must be >= 0")
    if args.workload_s is not None and not 0 < args.workload_s <= 3600:
        return _usage("--workload-s must be in (0, 3600]")
    if args.catches < 1:
        return _usage("--catches must be >= 1")
    if not 1 <= args.nodes <= len(NODE_IDS):
        return _usage(f"--nodes must be in 1..{len(NODE_IDS)}")
    if not 0 <= args.jobs <= JOBS_MAX:
        return _usage(f"--jobs must be in 0..{JOBS_MAX}")
    if args.jobs == 0:
        args.jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if args.mutation in CLUSTER_MUTATIONS and args.nodes == 1:
        args.nodes = CLUSTER_NODES  # a rule only a cluster exercises
    if args.mutate:
        return _mutate(args, out)
    first = args.seed if args.seed is not None else 0
    count = args.seeds if args.seeds is not None else (1 if args.seed is not None else DEFAULT_SEEDS)
    totals = Totals()
    failed: list[SimResult] = []
    started = time.perf_counter()
    one_seed = functools.partial(
        run_seed, mutation=args.mutation, fencing_mode=args.mode, workload_s=args.workload_s, nodes=args.nodes
    )
    for result in _in_processes(one_seed, range(first, first + count), args.jobs, SEEDS_PER_HAND_OUT):
        totals.add(result)
        if result.violation is not None and len(failed) < FAILING_SEEDS_SHOWN_MAX:
            failed.append(result)
        if count > PROGRESS_EVERY_SEEDS and totals.seeds % PROGRESS_EVERY_SEEDS == 0:
            rate = totals.seeds / (time.perf_counter() - started)
            print(
                f"  {totals.seeds} seeds, {totals.violations} violations, {rate:.1f} seeds/s",
                file=out,
                flush=True,
            )
    _print_summary(totals.summary(), first, count, args, time.perf_counter() - started, out)
    if failed:
        violation = failed[0].violation
        assert violation is not None
        print("", file=out)
        print(violation.describe(), file=out)
        print(f"\nreplay: {_replay(failed[0])}", file=out)
        if len(failed) > 1:
            print(f"other failing seeds: {', '.join(str(r.seed) for r in failed[1:])}", file=out)
    if args.mutation is not None:
        return 0  # a mutation is supposed to break things; replaying one is not a failure
    return 1 if failed else 0


def _in_processes(
    work: Callable[[_T], _R], items: Iterable[_T], jobs: int, per_hand_out: int
) -> Iterator[_R]:
    """`work(item)` for each item, in the items' order: here when `jobs` is 1, else on `jobs`
    fresh worker processes (spawned, not forked: a worker starts from nothing the parent ran,
    as a replay in a new process does), handed `per_hand_out` items at a time. The results
    come back in order; a worker's exception is raised here."""
    items = list(items)
    if jobs == 1 or len(items) == 1:
        yield from map(work, items)
        return
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(items)), mp_context=context) as pool:
        yield from pool.map(work, items, chunksize=per_hand_out)


def _replay(result: SimResult) -> str:
    cmd = f"levelzero sim --seed {result.seed} --mode {result.mode}"
    if result.nodes > 1:
        cmd += f" --nodes {result.nodes}"
    if result.mutation:
        cmd += f" --mutation {result.mutation}"
    return cmd


def _row(out: TextIO, name: str, value: object) -> None:
    print(f"  {name:<40} {value}", file=out)


def _print_summary(
    s: Summary, first: int, count: int, args: argparse.Namespace, elapsed_s: float, out: TextIO
) -> None:
    seeds = f"{first}..{first + count - 1}" if count > 1 else f"{first}"
    mutation = f", mutation {args.mutation}" if args.mutation else ""
    nodes = f", {args.nodes} nodes" if args.nodes > 1 else ""
    print(f"levelzero sim: {s.seeds} seeds ({seeds}), mode {args.mode}{nodes}{mutation}", file=out)
    _row(out, "violations", s.violations)
    _row(out, "virtual seconds / loop callbacks", f"{s.virtual_s:.0f} / {s.callbacks}")
    _row(out, "writes acknowledged (records)", f"{s.writes_acked} ({s.records_acked})")
    _row(out, "writes failed (not acknowledged)", s.writes_failed)
    _row(out, "reads", s.reads)
    _row(out, "stale-epoch rejections", s.stale_rejections)
    _row(
        out,
        "L0 objects uploaded / deleted / left",
        f"{s.objects_uploaded} / {s.objects_deleted} / {s.l0_left}",
    )
    _row(out, "orphan objects (rejected everywhere)", s.orphans)
    _row(
        out,
        "L1 objects written / copies in a later wave",
        f"{s.l1_written} / {s.l1_rounds_deferred}",
    )
    _row(out, "L0 cache: extents served / object loads", f"{s.l0_cache_served} / {s.l0_cache_loads}")
    _row(out, "L0 deletes checked against readers' pins", s.deletes_under_pins)
    _row(out, "crashes / epoch bumps / GC rounds", f"{s.crashes} / {s.epoch_bumps} / {s.gc_rounds}")
    if args.nodes > 1:
        _row(out, "graceful stops / pauses past the lease", f"{s.graceful_stops} / {s.pauses}")
        _row(
            out,
            "stops killed mid-drain / control requests landing late",
            f"{s.stops_killed} / {s.late_control_requests}",
        )
    _row(out, "partitions created during GC rounds", s.partitions_created_during_gc)
    _row(out, "faults injected", s.faults)
    _row(
        out,
        "compactions accepted / refused / cut by a crash",
        f"{s.compaction_passes} / {s.compaction_refused} / {s.compaction_interrupted}",
    )
    _row(out, "compacted-partition scans checked", s.compaction_scans)
    _row(
        out,
        "transactions committed / aborted / given up",
        f"{s.txn_committed} / {s.txn_aborted} / {s.txn_given_up}",
    )
    _row(
        out,
        "read_committed records read / aborted skipped",
        f"{s.txn_records_read} / {s.txn_records_skipped}",
    )
    _row(out, "DeleteRecords answered / held at a transaction", f"{s.txn_deletes} / {s.txn_deletes_held}")
    _row(
        out,
        "compacted transactional topics / their compactions",
        f"{s.txn_compacted} / {s.txn_compactions}",
    )
    _row(out, "read_committed empty below the LSO, fetched again", s.txn_refetched)
    _row(out, "acknowledged records read back at the end", s.records_checked)
    _row(out, "acknowledged records dropped by retention", s.records_dropped)
    _row(out, "wall time (s) / seeds per s", f"{elapsed_s:.2f} / {s.seeds / max(elapsed_s, 1e-9):.1f}")
    if args.jobs > 1:
        # (each seed's own wall time, summed: the rate of one process)
        _row(out, "processes / seeds per s of one", f"{args.jobs} / {s.seeds_per_s:.1f}")


@dataclass(frozen=True, slots=True)
class _Hunt:
    """One mutation's search: its catching seeds' results, how many seeds it took between
    catches, how many were tried."""

    name: str
    catches: list[SimResult] = field(default_factory=list)
    seeds_to_catch: list[int] = field(default_factory=list)
    tried: int = 0


def _hunt(
    name: str, *, first: int, count: int, catches_wanted: int, mode: str, workload_s: float | None, nodes: int
) -> _Hunt:
    """Seeds from `first` with mutation `name` until `catches_wanted` violations or `count` seeds."""
    catches: list[SimResult] = []
    seeds_to_catch: list[int] = []
    tried = since = 0  # `since`: seeds since the previous catch
    nodes = CLUSTER_NODES if name in CLUSTER_MUTATIONS and nodes == 1 else nodes
    for seed in range(first, first + count):
        result = run_seed(seed, mutation=name, fencing_mode=mode, workload_s=workload_s, nodes=nodes)
        tried += 1
        since += 1
        if result.violation is not None:
            catches.append(result)
            seeds_to_catch.append(since)
            since = 0
            if len(catches) >= catches_wanted:
                break
    return _Hunt(name, catches, seeds_to_catch, tried)


def _mutate(args: argparse.Namespace, out: TextIO) -> int:
    first = args.seed if args.seed is not None else 0
    count = args.seeds if args.seeds is not None else MUTATE_SEEDS_DEFAULT
    print(
        f"levelzero sim --mutate: up to {count} seeds per mutation from seed {first}, mode "
        f"{args.mode}, {args.nodes} node(s) ({CLUSTER_NODES} for the cluster-only mutations), "
        f"{args.catches} catch(es) each",
        file=out,
    )
    print(
        f"  {'mutation':<32} {'caught':<7} {'first':>6} {'median':>7} {'tried':>6}  invariant: violation",
        file=out,
    )
    hunt = functools.partial(
        _hunt,
        first=first,
        count=count,
        catches_wanted=args.catches,
        mode=args.mode,
        workload_s=args.workload_s,
        nodes=args.nodes,
    )
    missed = 0
    for found in _in_processes(hunt, MUTATIONS, args.jobs, 1):
        name, what = found.name, MUTATIONS[found.name]
        if not found.catches:
            missed += 1
            print(
                f"  {name:<32} {'NO':<7} {'-':>6} {'-':>7} {found.tried:>6}  ({what})", file=out, flush=True
            )
            continue
        v = found.catches[0].violation
        assert v is not None
        message = v.message.splitlines()[0]
        if len(message) > 120:
            message = message[:117] + "..."
        median = statistics.median(found.seeds_to_catch)
        print(
            f"  {name:<32} {'yes':<7} {v.seed:>6} {median:>7g} {found.tried:>6}  {v.invariant}: {message}",
            file=out,
        )
        print(f"  {'':<32} replay: {_replay(found.catches[0])}", file=out, flush=True)
    return 1 if missed else 0
