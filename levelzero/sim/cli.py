"""`levelzero sim`: run seeds of the simulation and print a summary table.

    levelzero sim --seeds 300                 # seeds 0..299, windowed fencing
    levelzero sim --seeds 300 --mode strict   # the strict baseline (more rejections and stall)
    levelzero sim --seed 1234                 # replay one seed; prints its trace on a violation
    levelzero sim --mutate                    # each deliberately broken rule must be caught
    levelzero sim --seed 7 --mutation gc_ignores_cap   # replay a mutation's catching seed

Exit status: 0 when no invariant broke (with --mutate: when every mutation was caught), else 1.
The daemon's CLI hooks this in with `add_arguments` + `run`; `python -m levelzero.sim` uses `main`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from levelzero.core.fence import FenceMode

from .runner import SimResult, run_many, summarize
from .world import MUTATIONS

DEFAULT_SEEDS = 100
MUTATE_SEEDS_DEFAULT = 300


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
    parser.add_argument(
        "--seed", type=int, default=None, help="first seed; alone: replay just this seed"
    )
    parser.add_argument(
        "--mode",
        choices=[m.value for m in FenceMode],
        default=FenceMode.WINDOWED.value,
        help="fencing mode (default windowed)",
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
        "--steps", type=int, default=None, help="workload events per seed before the quiet period"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="levelzero sim",
        description="Seeded deterministic simulation of the levelzero core with fault injection.",
    )
    add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if args.seeds is not None and args.seeds < 1:
        print("--seeds must be >= 1", file=sys.stderr)
        return 2
    if args.mutate:
        return _mutate(args, out)
    first = args.seed if args.seed is not None else 0
    count = (
        args.seeds if args.seeds is not None else (1 if args.seed is not None else DEFAULT_SEEDS)
    )
    results = run_many(
        range(first, first + count),
        mutation=args.mutation,
        fencing_mode=args.mode,
        steps=args.steps,
    )
    _print_summary(results, args, out)
    failed = [r for r in results if r.violation is not None]
    if failed:
        first_failed = failed[0]
        assert first_failed.violation is not None
        print("", file=out)
        print(first_failed.violation.describe(), file=out)
        print(f"\nreplay: {_replay(first_failed)}", file=out)
        if len(failed) > 1:
            print(f"other failing seeds: {', '.join(str(r.seed) for r in failed[1:20])}", file=out)
    if args.mutation is not None:
        return 0  # a mutation is supposed to break things; replaying one is not a failure
    return 1 if failed else 0


def _replay(result: SimResult) -> str:
    cmd = f"levelzero sim --seed {result.seed} --mode {result.mode}"
    if result.mutation:
        cmd += f" --mutation {result.mutation}"
    return cmd


def _row(out: TextIO, name: str, value: object) -> None:
    print(f"  {name:<40} {value}", file=out)


def _print_summary(results: list[SimResult], args: argparse.Namespace, out: TextIO) -> None:
    s = summarize(results)
    seeds = f"{results[0].seed}..{results[-1].seed}" if len(results) > 1 else f"{results[0].seed}"
    mutation = f", mutation {args.mutation}" if args.mutation else ""
    print(f"levelzero sim: {s.seeds} seeds ({seeds}), mode {args.mode}{mutation}", file=out)
    _row(out, "violations", s.violations)
    _row(out, "events", s.steps)
    _row(out, "writes acknowledged (records)", f"{s.writes_acked} ({s.records_acked})")
    _row(out, "writes failed (not acknowledged)", s.writes_failed)
    _row(out, "stale-epoch rejections", s.stale_rejections)
    _row(
        out,
        "L0 objects written / deleted / left",
        f"{s.objects_written} / {s.objects_deleted} / {s.l0_left}",
    )
    _row(out, "orphan objects (rejected everywhere)", s.orphans)
    _row(out, "L1 objects written", s.l1_written)
    _row(out, "leadership changes / crashes", f"{s.leadership_changes} / {s.crashes}")
    _row(out, "epoch bumps / GC rounds", f"{s.epoch_bumps} / {s.gc_rounds}")
    _row(out, "partitions created during GC rounds", s.partitions_created_during_gc)
    _row(out, "stall after leadership change: max (s)", f"{s.max_stall_s:.3f}")
    _row(out, "stall after leadership change: total (s)", f"{s.total_stall_s:.3f}")
    _row(out, "rejections after leadership change", s.rejections_after_change)
    _row(out, "writes needing >1 retry after a change", s.writes_over_one_retry_after_change)
    _row(out, "changes to a stale-cache leader", s.stale_cache_changes)
    _row(
        out,
        "  their stall: max / total (s)",
        f"{s.stale_cache_max_stall_s:.3f} / {s.stale_cache_total_stall_s:.3f}",
    )
    _row(out, "  their rejections", s.stale_cache_rejections)
    _row(out, "wall time (s) / seeds per s", f"{s.wall_s:.2f} / {s.seeds_per_s:.1f}")


def _mutate(args: argparse.Namespace, out: TextIO) -> int:
    first = args.seed if args.seed is not None else 0
    count = args.seeds if args.seeds is not None else MUTATE_SEEDS_DEFAULT
    print(
        f"levelzero sim --mutate: up to {count} seeds per mutation from seed {first}, mode {args.mode}",
        file=out,
    )
    print(
        f"  {'mutation':<26} {'caught':<7} {'seed':>6} {'tried':>6}  invariant: violation", file=out
    )
    missed = 0
    for name, what in MUTATIONS.items():
        results = run_many(
            range(first, first + count),
            mutation=name,
            fencing_mode=args.mode,
            steps=args.steps,
            stop_on_violation=True,
        )
        last = results[-1]
        if last.violation is None:
            missed += 1
            print(f"  {name:<26} {'NO':<7} {'-':>6} {len(results):>6}  ({what})", file=out)
            continue
        v = last.violation
        message = v.message.splitlines()[0]
        if len(message) > 150:
            message = message[:147] + "..."
        print(
            f"  {name:<26} {'yes':<7} {v.seed:>6} {len(results):>6}  {v.invariant}: {message}",
            file=out,
        )
        print(f"  {'':<26} replay: {_replay(last)}", file=out)
    return 1 if missed else 0
