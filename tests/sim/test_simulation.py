"""The seeded simulation (levelzero/sim): invariants hold over a fixed range of seeds, a seed
replays exactly, each deliberately broken rule is caught, and windowed fencing stalls less than
the strict baseline. Seeds are fixed so a failure here replays with `levelzero sim --seed S`.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import levelzero.sim
from levelzero.sim import MUTATIONS, SimResult, run_many, run_seed, summarize
from levelzero.sim.cli import main

SEEDS = range(300)
COMPARE_SEEDS = range(100)
MUTATION_SEEDS_MAX = 300


@pytest.fixture(scope="module")
def windowed_results() -> list[SimResult]:
    return run_many(SEEDS)


def test_seeds_keep_every_invariant_and_leave_no_l0_object(
    windowed_results: list[SimResult],
) -> None:
    failed = [r for r in windowed_results if r.violation is not None]
    assert not failed, failed[0].violation.describe()  # type: ignore[union-attr]
    assert [r.seed for r in windowed_results if r.l0_left] == []
    s = summarize(windowed_results)
    print(
        f"\n{s.seeds} seeds in {s.wall_s:.1f} s ({s.seeds_per_s:.0f} seeds/s, "
        f"{s.steps // s.seeds} events/seed): {s.writes_acked} writes acked, "
        f"{s.objects_written} L0 objects written and collected"
    )
    # The run exercised what it claims to: faults, zombies, orphans, creations during GC rounds.
    assert s.writes_acked > 1000 and s.objects_deleted == s.objects_written
    assert s.crashes > 0 and s.leadership_changes > 0 and s.orphans > 0
    assert s.stale_rejections > 0 and s.partitions_created_during_gc > 0
    assert sum(r.catch_ups_rejected for r in windowed_results) > 0  # zombie reconcilers
    assert sum(r.l1_deleted for r in windowed_results) > 0
    # Every acknowledged record was read back byte for byte at the end of each seed.
    assert sum(r.records_checked for r in windowed_results) == s.records_acked


def test_a_seed_replays_exactly() -> None:
    first, second = run_seed(12345), run_seed(12345)
    assert first == second  # every count, the violation (none) and the digest of the whole trace
    assert first.steps > 100 and first.writes_acked > 0
    assert run_seed(12346).trace_digest != first.trace_digest


def test_a_failing_seed_replays_with_the_same_trace() -> None:
    first = run_seed(3, mutation="admit_below_window")
    second = run_seed(3, mutation="admit_below_window")
    assert first.violation is not None
    assert first == second
    assert first.violation.trace == second.violation.trace  # type: ignore[union-attr]
    assert 0 < len(first.violation.trace) <= 50


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_each_mutation_is_caught(mutation: str) -> None:
    results = run_many(range(MUTATION_SEEDS_MAX), mutation=mutation, stop_on_violation=True)
    caught = results[-1].violation
    assert caught is not None, f"{mutation} survived {MUTATION_SEEDS_MAX} seeds"
    print(
        f"\n{mutation}: caught by seed {caught.seed}, invariant {caught.invariant}: {caught.message[:160]}"
    )
    assert caught.invariant in {"1", "2", "3", "5"}


def test_windowed_fencing_rejects_and_stalls_less_than_strict(
    windowed_results: list[SimResult],
) -> None:
    windowed = summarize([r for r in windowed_results if r.seed in COMPARE_SEEDS])
    strict_results = run_many(COMPARE_SEEDS, fencing_mode="strict")
    assert all(r.violation is None for r in strict_results)  # strict is slower, not unsafe
    strict = summarize(strict_results)
    print(
        f"\nover seeds {COMPARE_SEEDS.start}..{COMPARE_SEEDS.stop - 1}:"
        f"\n  windowed: {windowed.stale_rejections} rejections, stall after leadership changes "
        f"total {windowed.total_stall_s:.1f} s (max {windowed.max_stall_s:.2f} s), stale-cache leaders "
        f"{windowed.stale_cache_changes}: {windowed.stale_cache_rejections} rejections, "
        f"{windowed.stale_cache_total_stall_s:.1f} s stall"
        f"\n  strict:   {strict.stale_rejections} rejections, stall after leadership changes "
        f"total {strict.total_stall_s:.1f} s (max {strict.max_stall_s:.2f} s), stale-cache leaders "
        f"{strict.stale_cache_changes}: {strict.stale_cache_rejections} rejections, "
        f"{strict.stale_cache_total_stall_s:.1f} s stall"
    )
    assert windowed.stale_rejections < strict.stale_rejections
    assert windowed.rejections_after_change < strict.rejections_after_change
    assert windowed.total_stall_s < strict.total_stall_s
    assert windowed.stale_cache_rejections < strict.stale_cache_rejections
    assert windowed.writes_over_one_retry_after_change < strict.writes_over_one_retry_after_change


def test_cli_prints_a_summary_and_fails_on_violations(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seeds", "3", "--seed", "10"]) == 0
    out = capsys.readouterr().out
    assert "3 seeds (10..12), mode windowed" in out and "violations" in out

    assert main(["--mutate", "--seeds", str(MUTATION_SEEDS_MAX)]) == 0
    out = capsys.readouterr().out
    for mutation in MUTATIONS:
        assert f"{mutation}" in out
    assert " NO " not in out

    # Replaying a mutation's catching seed prints the violation, its trace and the replay command.
    assert main(["--seed", "3", "--mutation", "admit_below_window"]) == 0
    out = capsys.readouterr().out
    assert "invariant 5 violated" in out and "replay: levelzero sim --seed 3" in out


def test_simulation_imports_only_the_core_and_the_stdlib() -> None:
    package = Path(levelzero.sim.__file__).parent
    allowed_stdlib = sys.stdlib_module_names
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level > 0:
                    continue  # inside levelzero.sim
                modules = [node.module or ""]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                ok = module.startswith("levelzero.core") or (
                    top in allowed_stdlib and top not in {"asyncio", "threading"}
                )
                assert ok, f"{path.name} imports {module}"
