"""Item 2: write stall after leadership moves to a node with a stale epoch cache (simulation).

`levelzero.sim` runs the shipping `Node` on a deterministic loop in virtual time: the node
crashes mid-flight and a new incarnation takes every partition over (new terms), often with an
epoch cache that is fresh by its TTL but behind the cluster epoch. A "stale-cache change" is
such a takeover; its stall is the longest a write submitted soon after it waited, counted for
writes that needed more than one attempt (a stale-epoch rejection and a retry).

The same seeds run in both modes; a round is a block of seeds, and its ratio is windowed over
strict. Virtual time: the figures do not depend on the machine at all.
"""

from __future__ import annotations

import anyio

from levelzero.core.fence import FenceMode
from levelzero.sim import Summary, run_many, summarize

from .common import Figure, Settings, figure, interleave

ITEM = "stall"


async def _block(mode: FenceMode, seeds: range) -> Summary:
    # The simulation runs its own event loop: on a worker thread, beside the bench's loop.
    return await anyio.to_thread.run_sync(lambda: summarize(run_many(seeds, fencing_mode=mode)))


def _per(a: float, b: int) -> float:
    return a / b if b else 0.0


async def run(settings: Settings) -> list[Figure]:
    seeds_per_round = settings.pick(60, 10)
    rounds = settings.pick(settings.rounds, 1)

    def block(r: int) -> range:
        return range(r * seeds_per_round, (r + 1) * seeds_per_round)

    pairs = await interleave(
        rounds,
        lambda r: _block(FenceMode.WINDOWED, block(r)),
        lambda r: _block(FenceMode.STRICT, block(r)),
    )
    violations = sum(w.violations + s.violations for w, s in pairs)
    assert violations == 0, f"the simulation found {violations} invariant violations"
    notes = {
        "seeds_per_mode": seeds_per_round * rounds,
        "windowed": _totals([w for w, _ in pairs]),
        "strict": _totals([s for _, s in pairs]),
    }
    return [
        figure(
            ITEM,
            "write stall per leadership change to a stale epoch cache, windowed vs strict",
            "virtual s",
            [
                (
                    _per(w.stale_cache_total_stall_s, w.stale_cache_changes),
                    _per(s.stale_cache_total_stall_s, s.stale_cache_changes),
                )
                for w, s in pairs
            ],
            sut_label="windowed",
            floor_label="strict",
            notes=notes,
        ),
        figure(
            ITEM,
            "max write stall after a change to a stale epoch cache, windowed vs strict",
            "virtual s",
            [(w.stale_cache_max_stall_s, s.stale_cache_max_stall_s) for w, s in pairs],
            sut_label="windowed",
            floor_label="strict",
        ),
        figure(
            ITEM,
            "stale rejections per change to a stale epoch cache, windowed vs strict",
            "rejections/change",
            [
                (
                    _per(w.stale_cache_rejections, w.stale_cache_changes),
                    _per(s.stale_cache_rejections, s.stale_cache_changes),
                )
                for w, s in pairs
            ],
            sut_label="windowed",
            floor_label="strict",
        ),
        figure(
            ITEM,
            "writes needing more than one retry after a leadership change, windowed vs strict",
            "writes/100 changes",
            [
                (
                    100 * _per(w.writes_over_one_retry_after_change, w.leadership_changes),
                    100 * _per(s.writes_over_one_retry_after_change, s.leadership_changes),
                )
                for w, s in pairs
            ],
            sut_label="windowed",
            floor_label="strict",
        ),
        figure(
            ITEM,
            "write stall per leadership change (any cache), windowed vs strict",
            "virtual s",
            [
                (
                    _per(w.total_stall_s, w.leadership_changes),
                    _per(s.total_stall_s, s.leadership_changes),
                )
                for w, s in pairs
            ],
            sut_label="windowed",
            floor_label="strict",
        ),
    ]


def _totals(summaries: list[Summary]) -> dict[str, float]:
    names = (
        "seeds",
        "leadership_changes",
        "stale_cache_changes",
        "stale_cache_total_stall_s",
        "stale_cache_rejections",
        "total_stall_s",
        "rejections_after_change",
        "writes_over_one_retry_after_change",
        "writes_acked",
        "stale_rejections",
    )
    out: dict[str, float] = {name: sum(getattr(s, name) for s in summaries) for name in names}
    out["max_stall_s"] = max(s.max_stall_s for s in summaries)
    out["stale_cache_max_stall_s"] = max(s.stale_cache_max_stall_s for s in summaries)
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in out.items()}
