"""Randomized interleavings of one partition's fence, log, reconciler, recoveries and readers.

A `Model` is one partition: its state machine, its fence, its durable log (a list) and the
writes in flight. Operations are `(name, n)` pairs; the same operation lists come from
hypothesis (the property) and from `random.Random(seed)` (the mutation hunts, which must find
a violation — proof that the property can fail). After every step the model checks the GC's
safety argument: `M(p)` and `max_applied_epoch` never decrease, no placeholder above LRO (and no
admitted write still in flight) has an epoch <= `M(p)`, and every applied epoch is >= the
window's lower edge at its log offset.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import levelzero.core.fence as fence_module

from levelzero.core.entries import (
    AdvanceEpoch,
    AdvanceReconciledOffset,
    Entry,
    LogRecord,
    Placeholder,
    TermStart,
)
from levelzero.core.errors import InvariantViolation
from levelzero.core.fence import Admitted, BecomeUpdater, Fence, Rejected, Wait
from levelzero.core.state import PartitionState, ReaderPins
from levelzero.sim.mutations import applied

CREATION_EPOCH = 3
KEY = "level_zero/data/000/000000000000000003/" + "0" * 32


class PropertyViolation(AssertionError):
    """The model saw the safety argument broken."""


@dataclass(frozen=True)
class Write:
    epoch: int
    term: int
    housekeeping: bool  # AdvanceEpoch (housekeeper) instead of a placeholder
    records: int


class Model:
    def __init__(self) -> None:
        self.state = self._new_state(PartitionState(CREATION_EPOCH))
        self.fence = self._new_fence()
        self.log: list[LogRecord] = []
        self.term = 0
        self.in_flight: list[Write] = []
        self.updater: Write | None = None
        self.pins = ReaderPins()
        self.readers: list[int] = []
        self.last_mp: int | None = None
        self.last_published: int | None = None
        self.last_max_applied: int | None = None
        self.counts: dict[str, int] = {}
        self._start_term()

    # ------------------------------------------------------------------ plumbing

    def _new_state(self, state: PartitionState) -> PartitionState:
        return state

    def _new_fence(self) -> Fence:
        return Fence(CREATION_EPOCH)

    def _append(self, entry: Entry) -> LogRecord:
        record = LogRecord(self.state.next_log_offset, self.term, self.state.high_watermark, entry)
        assert self.state.apply(record) is True
        self.log.append(record)
        return record

    def _start_term(self) -> None:
        self.term += 1
        self._append(TermStart(self.term))

    def _top_epoch(self) -> int:
        window = self.fence.effective_window(self.term, self.state.applied_window)
        return CREATION_EPOCH if window is None else window[1]

    def _hwm_after(self, log_offset: int) -> int:
        """High watermark just after the record at `log_offset` applied."""
        record = self.log[log_offset]
        if isinstance(record.entry, Placeholder):
            return record.base_offset + record.entry.record_count
        return record.base_offset

    # ------------------------------------------------------------------ operations

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def step(self, name: str, n: int) -> None:
        self._count(name)
        getattr(self, "op_" + name)(n)
        self.check()

    def op_fence(self, n: int) -> None:
        """A producer's write with an epoch near the window: below, at an edge, inside, above."""
        window = self.fence.effective_window(self.term, self.state.applied_window)
        low, high = (CREATION_EPOCH, CREATION_EPOCH) if window is None else window
        pick, rest = n % 8, n // 8
        if pick == 0:
            epoch = max(1, low - 1 - rest % 3)
        elif pick == 1:
            epoch = low
        elif pick in (2, 3):
            epoch = low + rest % (high - low + 1)
        elif pick == 4:
            epoch = high
        else:
            epoch = high + pick - 4
        self._fence(Write(epoch, self.term, housekeeping=False, records=1 + rest % 3))

    def op_housekeep(self, n: int) -> None:
        """The housekeeper fences the (maybe newer) cluster epoch to append AdvanceEpoch."""
        self._fence(Write(self._top_epoch() + n % 2, self.term, housekeeping=True, records=0))

    def _fence(self, write: Write) -> None:
        applied = self.state.applied_window
        window = self.fence.effective_window(self.term, applied)
        decision = self.fence.try_fence(write.epoch, self.term, applied)
        match decision:
            case Admitted(epoch=epoch, term=term, window=admitted_window):
                self._count("admitted")
                assert (epoch, term, admitted_window) == (write.epoch, self.term, window)
                self._check_admissible(epoch)
                self.in_flight.append(write)
            case BecomeUpdater(epoch=epoch):
                self._count("updater")
                assert epoch == write.epoch and self.updater is None
                assert window is None or epoch > window[1]
                self.updater = write
            case Wait(updater_epoch=epoch):
                self._count("waited")
                assert self.updater is not None and epoch == self.updater.epoch
            case Rejected(error=error):
                assert error.epoch == write.epoch
                expected = window if window is not None else (CREATION_EPOCH, CREATION_EPOCH)
                assert (error.window_min, error.window_max) == expected
                low, high = expected
                below = write.epoch < low
                # inside the window, only an epoch that could land below the applied window
                # is refused: never the upper edge, never one inside the applied window
                inside = low <= write.epoch < high and not (
                    applied is not None and applied[0] <= write.epoch <= applied[1]
                )
                assert below or inside, (write, expected, applied)
                self._count("rejected_below" if below else "rejected_inside")

    def op_slide(self, n: int) -> None:
        """The updater, once every read unit of the old window is released."""
        if self.updater is None or not self.fence.drained:
            return
        admitted = self.fence.complete_slide(self.term, self.state.applied_window)
        assert admitted.new_epoch and admitted.epoch == self.updater.epoch
        self._check_admissible(admitted.epoch)
        self._count("slid")
        self.in_flight.append(self.updater)
        self.updater = None

    def op_land(self, n: int) -> None:
        """One admitted write (any of them) appends; it is applied, then releases its unit."""
        if not self.in_flight:
            return
        write = self.in_flight.pop(n % len(self.in_flight))
        if write.term == self.term:
            entry: Entry
            if write.housekeeping:
                entry = AdvanceEpoch(write.epoch)
            else:
                entry = Placeholder(write.epoch, KEY, 0, 10 * write.records, write.records, 0)
            window = self.state.applied_window
            if window is not None and write.epoch < window[0]:
                raise PropertyViolation(
                    f"write {write} lands below the applied window {window} "
                    f"at log offset {self.state.next_log_offset}"
                )
            self._append(entry)  # raises InvariantViolation if the window says no
            self._count("landed")
        # else: the append carried a stale term and failed (NotLeader); nothing was appended
        self.fence.release()

    def op_fail(self, n: int) -> None:
        """An admitted write's append fails (or it was a fence probe): release, append nothing."""
        if not self.in_flight:
            return
        self.in_flight.pop(n % len(self.in_flight))
        self.fence.release()

    def op_catch_up(self, n: int) -> None:
        """The reconciler reports everything up to some applied log offset as reconciled."""
        lrlo = n % self.state.next_log_offset
        lro = self._hwm_after(lrlo) - 1
        self._append(AdvanceReconciledOffset(lro=lro, lrlo=lrlo))

    def op_term(self, n: int) -> None:
        """Leadership moves away and back: same Fence object, new term."""
        if self.updater is not None:
            self.fence.abandon_update()
            self.updater = None
        self._start_term()

    def op_restore(self, n: int) -> None:
        """Restart from a snapshot: new state object, new Fence, readers gone, new term."""
        self.state = self._new_state(PartitionState.decode_snapshot(self.state.encode_snapshot()))
        self.fence = self._new_fence()
        self.in_flight.clear()
        self.updater = None
        self.pins = ReaderPins()
        self.readers.clear()
        self._start_term()

    def op_pin(self, n: int) -> None:
        reader, _ = self.pins.register(self.state.mp)
        self.readers.append(reader)

    def op_unpin(self, n: int) -> None:
        if self.readers:
            self.pins.release(self.readers.pop(n % len(self.readers)))

    # ------------------------------------------------------------------ checks

    def _check_admissible(self, epoch: int) -> None:
        window = self.state.applied_window
        if window is not None and epoch < window[0]:
            raise PropertyViolation(f"admitted epoch {epoch} is below the applied window {window}")

    def check(self) -> None:
        state = self.state
        mp = state.mp
        if self.last_mp is not None and (mp is None or mp < self.last_mp):
            raise PropertyViolation(f"M(p) fell from {self.last_mp} to {mp}")
        self.last_mp = mp
        max_applied = state.max_applied_epoch
        if self.last_max_applied is not None and (max_applied is None or max_applied < self.last_max_applied):
            raise PropertyViolation(f"max_applied fell from {self.last_max_applied}")
        self.last_max_applied = max_applied
        published = self.pins.published(mp)  # asserts its own monotonicity
        if self.last_published is not None and (published is None or published < self.last_published):
            raise PropertyViolation(f"published M(p) fell from {self.last_published}")
        self.last_published = published
        if mp is None:
            return
        for record in self.log:
            entry = record.entry
            if not isinstance(entry, Placeholder):
                continue
            last_data_offset = record.base_offset + entry.record_count - 1
            if last_data_offset > state.lro and entry.epoch <= mp:
                raise PropertyViolation(
                    f"unreconciled placeholder at log offset {record.log_offset} (data up to "
                    f"{last_data_offset} > lro {state.lro}) has epoch {entry.epoch} <= M(p) {mp}"
                )
        for write in self.in_flight:
            if write.term == self.term and write.epoch <= mp:
                raise PropertyViolation(f"in-flight write {write} has epoch <= M(p) {mp}")

    def check_replay(self) -> None:
        """The whole log replayed from scratch gives the same state (snapshots included)."""
        replayed = PartitionState(CREATION_EPOCH)
        for record in self.log:
            replayed.apply(record)
        assert replayed == self.state


# ---------------------------------------------------------------- operation lists

OPS = {
    "fence": 10,
    "housekeep": 1,
    "slide": 4,
    "land": 5,
    "fail": 2,
    "catch_up": 3,
    "term": 1,
    "restore": 1,
    "pin": 1,
    "unpin": 1,
}
WEIGHTED_NAMES = [name for name, weight in OPS.items() for _ in range(weight)]
N_MAX = 10_000

operations = st.lists(
    st.tuples(st.sampled_from(WEIGHTED_NAMES), st.integers(0, N_MAX)), min_size=30, max_size=150
)


def random_operations(seed: int, length: int = 120) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [(rng.choice(WEIGHTED_NAMES), rng.randrange(N_MAX + 1)) for _ in range(length)]


def run(ops: list[tuple[str, int]]) -> Model:
    model = Model()
    for name, n in ops:
        model.step(name, n)
    return model


def find_violation(seeds: range) -> tuple[int, str] | None:
    for seed in seeds:
        try:
            run(random_operations(seed))
        except (InvariantViolation, PropertyViolation) as violation:
            return seed, f"{type(violation).__name__}: {violation}"
        except AssertionError as violation:
            # a postcondition asserted inside the core tripped: also a catch (but a failing
            # assert of the model itself is a bug of this test, so it propagates)
            if not raised_in_core(violation):
                raise
            return seed, f"core assertion: {violation!r}"
    return None


def raised_in_core(error: BaseException) -> bool:
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and "levelzero/core/" in tb.tb_frame.f_code.co_filename


# ---------------------------------------------------------------- the property


@settings(max_examples=800, deadline=None, database=None)
@given(operations)
def test_gc_safety_holds_under_any_interleaving(ops: list[tuple[str, int]]) -> None:
    model = run(ops)
    model.check_replay()


def test_random_walks_exercise_every_path() -> None:
    """The seeded walks reach every decision, catch-ups and a rising M(p): not vacuous."""
    totals: dict[str, int] = {}
    highest_mp = 0
    for seed in range(40):
        model = run(random_operations(seed))
        model.check_replay()
        for what, count in model.counts.items():
            totals[what] = totals.get(what, 0) + count
        highest_mp = max(highest_mp, model.state.mp or 0)
    for what in ("slid", "waited", "rejected_below", "rejected_inside", "landed", "restore"):
        assert totals.get(what, 0) >= 10, (what, totals)
    assert totals["admitted"] > totals["slid"]
    assert highest_mp > CREATION_EPOCH + 5


# ---------------------------------------------------------------- the property can fail


def test_mutation_admit_below_window_is_found() -> None:
    # The mutants are the simulation's: applied from outside, no flag in the core.
    with applied("admit_below_window"):
        found = find_violation(range(300))
    assert found is not None, "admitting below the window went unnoticed"


def test_mutation_lower_bound_follows_max_is_found() -> None:
    with applied("lower_bound_follows_max"):
        found = find_violation(range(300))
    assert found is not None, "moving the lower bound to max_applied went unnoticed"


def test_literal_window_rule_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """Admitting every epoch inside the seen window (DESIGN.md read literally, without the
    fence's `lands_in_any_order`) lets a write land below the applied window."""
    monkeypatch.setattr(fence_module, "lands_in_any_order", lambda *_: True)
    found = find_violation(range(300))
    assert found is not None, "the fence's landing-order rule is not needed?"


def test_unmutated_seeds_find_nothing() -> None:
    assert find_violation(range(300)) is None
