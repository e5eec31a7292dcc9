"""What a failed simulation reports: the invariant (DESIGN.md numbering), the seed and a trace."""

from __future__ import annotations

from dataclasses import dataclass

# DESIGN.md "Invariants"; "replay" and "assert" are the simulation's own consistency checks
# (a replayed leader differs from the durable truth; an assertion inside the core or the model).
INVARIANTS = {
    "1": "no L0 object holding an extent above LRO (or pinned by an active reader) is deleted",
    "2": "M(p), M and max_applied_epoch never decrease",
    "3": "every acknowledged record is readable byte for byte at its offset",
    "4": "after the quiet period every L0 object is deleted (no leaks, orphans included)",
    "5": "no admitted placeholder has an epoch below the window at its log offset",
    "epoch-rule": "an L0 object's epoch is at least the creation epoch of every partition inside",
    "replay": "a leader replayed from snapshot + log equals the state of the durable log",
    "assert": "an assertion of the core or of the actors failed",
    "deadlock": "the world waits for something nothing will ever do",
    # compaction (issue 34, `compaction.py`)
    "latest": "a compacted partition serves each key's latest acknowledged record (a tombstone "
    "until delete.retention.ms)",
    "resurrect": "no key comes back after its tombstone was removed",
    "zombie": "no compaction result written under an older term is applied",
    # Kafka transactions (issues 35, 36, `transactions.py`)
    "txn": "read_committed never returns an aborted or unfinished transaction's record, the last "
    "stable offset never moves back, and every transaction ends whole, as its EndTxn answered",
}


@dataclass(frozen=True, slots=True)
class Violation:
    invariant: str
    message: str
    seed: int
    mode: str
    mutation: str | None
    time_s: float
    trace: tuple[str, ...]

    def describe(self) -> str:
        what = INVARIANTS.get(self.invariant, "")
        mutation = f", mutation {self.mutation}" if self.mutation else ""
        head = (
            f"invariant {self.invariant} violated ({what}) — seed {self.seed}, mode {self.mode}"
            f"{mutation}, t={self.time_s:.4f}s\n  {self.message}"
        )
        return (
            head
            + f"\n  last {len(self.trace)} trace lines:\n"
            + "\n".join(f"    {line}" for line in self.trace)
        )


class SimulationViolation(AssertionError):
    """Raised inside a run when an invariant breaks; `run_seed` turns it into a `Violation`."""

    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"invariant {invariant}: {message}")
        self.invariant = invariant
        self.message = message
        self.violation: Violation | None = None  # filled in with seed and trace by the runner

    def __str__(self) -> str:
        if self.violation is not None:
            return self.violation.describe()
        return super().__str__()
