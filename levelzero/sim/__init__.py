"""Seeded deterministic simulation of the shipping code with fault injection.

`run_seed(seed)` runs the real `Node` (partition actors, batcher, reconciler, housekeeper, GC)
on a deterministic asyncio loop (virtual time, a seeded order among ready callbacks) over the
memory log store and the memory object store with seeded latency and faults, with producers,
readers, epoch bumps, partition creation and crashes, and checks the invariants of DESIGN.md
against the real stores. A failing seed replays exactly.
"""

from .config import SimConfig
from .mutations import MUTATIONS
from .runner import SimResult, Summary, run_many, run_seed, summarize
from .violation import INVARIANTS, SimulationViolation, Violation

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
