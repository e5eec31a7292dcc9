"""Seeded deterministic simulation of the levelzero core with fault injection.

`run_seed(seed)` drives the real core objects (`PartitionState`, `Fence`, `ReaderPins`, the GC
selection, keys and the L0 format) through a simulated cluster — nodes with stale epoch caches,
batchers, partition leaders that move and crash, zombie reconcilers, a housekeeper, GC rounds
that span virtual time — on one thread, with one `random.Random(seed)` and virtual time, and
checks the invariants of DESIGN.md after every step. A failing seed replays exactly.
"""

from .config import SimConfig
from .runner import SimResult, Summary, run_many, run_seed, summarize
from .violation import INVARIANTS, SimulationViolation, Violation
from .world import MUTATIONS

__all__ = [
    "INVARIANTS",
    "MUTATIONS",
    "SimConfig",
    "SimResult",
    "SimulationViolation",
    "Summary",
    "Violation",
    "run_many",
    "run_seed",
    "summarize",
]
