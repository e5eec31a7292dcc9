"""The partition state machine, rule by rule (DESIGN.md "The partition state machine").

Everything is synchronous: records are built by hand and fed to `PartitionState.apply`.
"""

from __future__ import annotations

import msgspec
import pytest

from levelzero.testing.entries import placeholder
from levelzero.core.entries import (
    AbandonUnreconciled,
    AdvanceEpoch,
    AdvanceReconciledOffset,
    Entry,
    LogRecord,
    ProducerSpan,
    SetStartOffset,
    TermStart,
)
from levelzero.core.errors import InvariantViolation
from levelzero.core.fence import Admitted, BecomeUpdater, Fence
from levelzero.core.producers import PartitionProducers
from levelzero.core.state import PartitionSnapshot, PartitionState, ReaderPins
from levelzero.sim.mutations import applied

KEY = "level_zero/data/007/000000000000000005/" + "ab" * 16


def record_for(state: PartitionState, entry: Entry, term: int | None = None) -> LogRecord:
    """The record a leader would append next: next log offset, current hwm as base offset."""
    return LogRecord(
        log_offset=state.next_log_offset,
        term=state.term if term is None else term,
        base_offset=state.high_watermark,
        entry=entry,
    )


def apply(state: PartitionState, entry: Entry, term: int | None = None) -> LogRecord:
    record = record_for(state, entry, term)
    assert state.apply(record) is True
    return record


def new_state(creation_epoch: int = 1, term: int = 1) -> PartitionState:
    state = PartitionState(creation_epoch)
    apply(state, TermStart(term), term=term)  # log offset 0
    return state


# ---------------------------------------------------------------- initial state


def test_new_state_has_no_epoch_and_no_watermark() -> None:
    state = PartitionState(creation_epoch=3)
    assert state.creation_epoch == 3
    assert state.max_applied_epoch is None
    assert state.previous_applied_epoch is None
    assert state.min_epoch_lower_bound is None
    assert state.epoch_window_offset is None
    assert state.applied_window is None
    assert state.mp is None
    assert state.last_applied_log_offset == -1
    assert state.next_log_offset == 0
    assert (state.lro, state.lrlo, state.start_offset) == (-1, -1, 0)
    assert (state.high_watermark, state.size_bytes, state.term) == (0, 0, 0)


def test_creation_epoch_must_be_positive() -> None:
    with pytest.raises(AssertionError):
        PartitionState(creation_epoch=0)


# ---------------------------------------------------------------- advancing the applied epoch


@pytest.mark.parametrize("entry", [placeholder(5), AdvanceEpoch(5)])
def test_first_epoch_sets_all_three_fields_and_window_offset(entry: Entry) -> None:
    state = new_state(creation_epoch=5)
    record = apply(state, entry)
    assert record.log_offset == 1
    assert state.max_applied_epoch == 5
    assert state.previous_applied_epoch == 5
    assert state.min_epoch_lower_bound == 5
    assert state.epoch_window_offset == 1
    assert state.applied_window == (5, 5)
    assert state.mp == 4


@pytest.mark.parametrize("kind", ["placeholder", "advance_epoch"])
def test_higher_epoch_slides_applied_window(kind: str) -> None:
    state = new_state()
    apply(state, placeholder(3))  # offset 1
    apply(state, placeholder(3))  # offset 2
    entry: Entry = placeholder(7) if kind == "placeholder" else AdvanceEpoch(7)
    record = apply(state, entry)  # offset 3
    assert state.applied_window == (3, 7)
    assert state.previous_applied_epoch == 3
    assert state.max_applied_epoch == 7
    assert state.epoch_window_offset == record.log_offset == 3
    # the lower bound only moves on catch-up, never on a slide
    assert state.min_epoch_lower_bound == 3
    apply(state, AdvanceEpoch(9))
    assert state.applied_window == (7, 9)
    assert state.epoch_window_offset == 4
    assert state.min_epoch_lower_bound == 3


@pytest.mark.parametrize("epoch", [4, 5, 6])
def test_epoch_inside_applied_window_changes_nothing(epoch: int) -> None:
    state = new_state()
    apply(state, placeholder(4))
    apply(state, placeholder(6))  # window [4, 6] opened at log offset 2
    before = state.to_snapshot()
    apply(state, placeholder(epoch, records=2, byte_length=10))
    assert state.applied_window == (4, 6)
    assert state.epoch_window_offset == 2
    assert state.min_epoch_lower_bound == before.min_epoch_lower_bound == 4
    assert state.high_watermark == before.high_watermark + 2


@pytest.mark.parametrize("entry", [placeholder(3), AdvanceEpoch(3), AdvanceEpoch(1)])
def test_epoch_below_applied_window_raises_and_changes_nothing(entry: Entry) -> None:
    state = new_state()
    apply(state, placeholder(4))
    apply(state, placeholder(6))  # window [4, 6]
    before = state.to_snapshot()
    with pytest.raises(InvariantViolation, match=r"below the window \[4, 6\]"):
        state.apply(record_for(state, entry))
    assert state.to_snapshot() == before


@pytest.mark.parametrize("entry", [placeholder(4), AdvanceEpoch(4)])
def test_epoch_below_creation_epoch_raises(entry: Entry) -> None:
    state = new_state(creation_epoch=5)
    before = state.to_snapshot()
    with pytest.raises(InvariantViolation, match="below the creation epoch 5"):
        state.apply(record_for(state, entry))
    assert state.to_snapshot() == before
    apply(state, AdvanceEpoch(5))  # the creation epoch itself is fine
    assert state.applied_window == (5, 5)


def test_max_applied_epoch_never_decreases_across_in_window_applies() -> None:
    state = new_state()
    seen = []
    for epoch in [2, 2, 5, 2, 5, 4, 9, 5, 9, 7]:
        apply(state, AdvanceEpoch(epoch))
        seen.append(state.max_applied_epoch)
    assert seen == [2, 2, 5, 5, 5, 5, 9, 9, 9, 9]


# ---------------------------------------------------------------- data offsets


def test_placeholder_advances_high_watermark_and_size() -> None:
    state = new_state()
    first = apply(state, placeholder(1, records=3, byte_length=300))
    second = apply(state, placeholder(1, records=2, byte_length=50))
    assert (first.base_offset, second.base_offset) == (0, 3)
    assert state.high_watermark == 5
    assert state.size_bytes == 350
    assert state.has_unreconciled_data
    apply(state, AdvanceEpoch(2))
    apply(state, SetStartOffset(1))
    apply(state, AdvanceReconciledOffset(lro=4, lrlo=2))
    assert (state.high_watermark, state.size_bytes) == (5, 350)  # control entries carry no data
    assert not state.has_unreconciled_data


def test_set_start_offset_takes_the_max() -> None:
    state = new_state()
    apply(state, placeholder(1, records=10))
    apply(state, SetStartOffset(6))
    assert state.start_offset == 6
    apply(state, SetStartOffset(2))
    assert state.start_offset == 6
    apply(state, SetStartOffset(10))
    assert state.start_offset == 10


def test_term_start_raises_the_term() -> None:
    state = new_state(term=1)
    assert state.term == 1
    apply(state, TermStart(4), term=4)
    assert state.term == 4
    apply(state, placeholder(1), term=4)
    assert state.term == 4


@pytest.mark.parametrize("term", [3, 2])
def test_term_start_that_does_not_raise_the_term_is_a_violation(term: int) -> None:
    state = new_state(term=3)
    with pytest.raises(InvariantViolation, match=f"TermStart\\({term}\\) does not raise term 3"):
        state.apply(record_for(state, TermStart(term), term=max(term, 3)))


def test_record_with_a_term_below_the_current_term_is_a_violation() -> None:
    state = new_state(term=3)
    before = state.to_snapshot()
    with pytest.raises(InvariantViolation, match="term 2 below the current term 3"):
        state.apply(record_for(state, placeholder(1), term=2))
    assert state.to_snapshot() == before


# ---------------------------------------------------------------- catch-up


def test_advance_reconciled_offset_takes_max_of_lro_and_lrlo() -> None:
    state = new_state()
    apply(state, placeholder(1, records=10))  # offset 1, data 0..9
    apply(state, placeholder(1, records=10))  # offset 2, data 10..19
    apply(state, AdvanceReconciledOffset(lro=15, lrlo=2))
    assert (state.lro, state.lrlo) == (15, 2)
    apply(state, AdvanceReconciledOffset(lro=3, lrlo=1))
    assert (state.lro, state.lrlo) == (15, 2)
    apply(state, AdvanceReconciledOffset(lro=19, lrlo=0))
    assert (state.lro, state.lrlo) == (19, 2)


def test_lower_bound_moves_only_once_lrlo_reaches_the_window_offset() -> None:
    state = new_state()
    apply(state, placeholder(2, records=5))  # offset 1: data 0..4
    apply(state, placeholder(2, records=5))  # offset 2: data 5..9
    apply(state, placeholder(5, records=5))  # offset 3: window [2, 5] opens here, data 10..14
    apply(state, placeholder(5, records=5))  # offset 4: data 15..19
    assert state.epoch_window_offset == 3
    assert state.min_epoch_lower_bound == 2
    apply(state, AdvanceReconciledOffset(lro=9, lrlo=2))  # lrlo < window offset
    assert state.min_epoch_lower_bound == 2
    assert state.mp == 1
    apply(state, AdvanceReconciledOffset(lro=14, lrlo=3))  # lrlo == window offset
    assert state.min_epoch_lower_bound == 2  # previous_applied is 2: nothing to move yet
    apply(state, AdvanceEpoch(8))  # offset 7: window [5, 8]
    assert state.epoch_window_offset == 7
    apply(state, AdvanceReconciledOffset(lro=19, lrlo=6))  # still below the new window offset
    assert state.min_epoch_lower_bound == 2
    apply(state, AdvanceReconciledOffset(lro=19, lrlo=7))
    assert state.min_epoch_lower_bound == 5  # previous_applied, not max_applied (8)
    assert state.mp == 4


def test_lower_bound_follows_previous_applied_not_max_applied() -> None:
    state = new_state()
    apply(state, placeholder(3))  # offset 1
    apply(state, placeholder(4))  # offset 2, window [3, 4]
    apply(state, AdvanceReconciledOffset(lro=1, lrlo=2))
    assert state.applied_window == (3, 4)
    assert state.min_epoch_lower_bound == 3
    assert state.mp == 2


def test_lower_bound_never_decreases_on_a_later_catch_up() -> None:
    state = new_state()
    apply(state, placeholder(3))
    apply(state, placeholder(6))
    apply(state, AdvanceReconciledOffset(lro=1, lrlo=2))
    assert state.min_epoch_lower_bound == 3
    apply(state, AdvanceReconciledOffset(lro=0, lrlo=0))  # older report: max keeps lrlo at 2
    assert state.min_epoch_lower_bound == 3
    assert state.mp == 2


def catch_up_with_lower_edge_write_in_flight(n: int, mutate: bool) -> tuple[PartitionState, Fence, Admitted]:
    """Window [n, n+1] applied; a write at the lower edge n is admitted and holds its read unit;
    then the reconciler catches up through everything applied so far."""
    state = new_state()
    fence = Fence(creation_epoch=1)
    for epoch in (n, n + 1):
        decision = fence.try_fence(epoch, state.term, state.applied_window)
        assert decision == BecomeUpdater(epoch)
        fence.complete_slide(state.term, state.applied_window)
        apply(state, placeholder(epoch))
        fence.release()
    assert state.applied_window == (n, n + 1)
    assert state.epoch_window_offset == 2
    in_flight = fence.try_fence(n, state.term, state.applied_window)
    assert isinstance(in_flight, Admitted) and in_flight.window == (n, n + 1)
    caught_up = AdvanceReconciledOffset(lro=state.high_watermark - 1, lrlo=state.last_applied_log_offset)
    # The classic bug is the simulation's mutant, applied from outside the core.
    with applied("lower_bound_follows_max" if mutate else None):
        apply(state, caught_up)
    return state, fence, in_flight


def test_lower_edge_write_in_flight_during_catch_up_stays_above_mp() -> None:
    """The reason the lower bound follows previous_applied: an admitted write at the window's
    lower edge may land after the catch-up; its object must keep an epoch above M(p)."""
    n = 10
    state, fence, in_flight = catch_up_with_lower_edge_write_in_flight(n, mutate=False)
    assert state.min_epoch_lower_bound == n
    assert state.mp == n - 1
    assert in_flight.epoch > state.mp  # while in flight
    record = apply(state, placeholder(in_flight.epoch))
    fence.release()
    assert fence.drained
    assert record.epoch == n
    assert record.epoch > state.mp  # after it landed
    assert record.base_offset > state.lro  # its data is unreconciled: GC must keep its object


def test_mutation_lower_bound_follows_max_breaks_the_in_flight_lower_edge() -> None:
    """The same scenario with the classic bug switched on: M(p) reaches the in-flight epoch."""
    n = 10
    state, _fence, in_flight = catch_up_with_lower_edge_write_in_flight(n, mutate=True)
    assert state.min_epoch_lower_bound == n + 1
    # M(p) reached the in-flight epoch: GC may delete the object of an unacknowledged write
    assert in_flight.epoch <= state.mp
    # and when its placeholder lands, the state's own postcondition trips
    with pytest.raises(AssertionError):
        state.apply(record_for(state, placeholder(in_flight.epoch)))


# ---------------------------------------------------------------- log structure


def test_reapplying_an_applied_log_offset_is_a_noop() -> None:
    state = new_state()
    records = [apply(state, placeholder(2, records=3)), apply(state, AdvanceEpoch(4))]
    records.append(apply(state, AdvanceReconciledOffset(lro=1, lrlo=1)))
    before = state.to_snapshot()
    for record in records:
        assert state.apply(record) is False
    # even a different entry at an applied offset is ignored: the log offset is the identity
    assert state.apply(LogRecord(1, 1, 0, placeholder(99, records=50))) is False
    assert state.to_snapshot() == before


def test_log_gap_raises() -> None:
    state = new_state()
    before = state.to_snapshot()
    with pytest.raises(InvariantViolation, match="log gap: record at 2, last applied 0"):
        state.apply(LogRecord(2, 1, 0, placeholder(1)))
    assert state.to_snapshot() == before


@pytest.mark.parametrize("base_offset", [0, 2, 4])
def test_wrong_base_offset_raises(base_offset: int) -> None:
    state = new_state()
    apply(state, placeholder(1, records=3))
    before = state.to_snapshot()
    with pytest.raises(InvariantViolation, match="high watermark is 3"):
        state.apply(LogRecord(state.next_log_offset, 1, base_offset, placeholder(1)))
    assert state.to_snapshot() == before


def test_lro_beyond_high_watermark_raises() -> None:
    state = new_state()
    apply(state, placeholder(1, records=3))  # data 0..2, hwm 3
    before = state.to_snapshot()
    with pytest.raises(InvariantViolation, match="lro 3 beyond the high watermark 3"):
        state.apply(record_for(state, AdvanceReconciledOffset(lro=3, lrlo=1)))
    assert state.to_snapshot() == before
    apply(state, AdvanceReconciledOffset(lro=2, lrlo=1))
    assert state.lro == 2


def test_lrlo_at_or_beyond_its_own_log_offset_raises() -> None:
    state = new_state()
    apply(state, placeholder(1))
    own_offset = state.next_log_offset
    with pytest.raises(InvariantViolation, match="lrlo 2 at or beyond itself"):
        state.apply(record_for(state, AdvanceReconciledOffset(lro=0, lrlo=own_offset)))


# ---------------------------------------------------------------- snapshots and replay


def build_log() -> list[LogRecord]:
    """A log that exercises every entry kind, two terms and several windows."""
    state = PartitionState(creation_epoch=2)
    log = [apply(state, TermStart(1), term=1)]
    entries: list[tuple[Entry, int]] = [
        (AdvanceEpoch(2), 1),
        (placeholder(2, records=4, byte_length=400), 1),
        (placeholder(3, records=1, byte_length=10), 1),
        (placeholder(2, records=2, byte_length=20), 1),
        (AdvanceReconciledOffset(lro=4, lrlo=3), 1),
        (placeholder(3, records=3, byte_length=30), 1),
        (TermStart(2), 2),
        (placeholder(6, records=2, byte_length=5), 2),
        (SetStartOffset(3), 2),
        (AdvanceReconciledOffset(lro=9, lrlo=8), 2),
        (placeholder(6, records=1, byte_length=7), 2),
        (AdvanceEpoch(8), 2),
        (AdvanceReconciledOffset(lro=10, lrlo=12), 2),
        (placeholder(8, records=5, byte_length=50), 2),
        (SetStartOffset(1), 2),
    ]
    for entry, term in entries:
        log.append(apply(state, entry, term=term))
    return log


def replay(log: list[LogRecord], state: PartitionState | None = None) -> PartitionState:
    state = PartitionState(creation_epoch=2) if state is None else state
    for record in log:
        state.apply(record)
    return state


def test_build_log_reaches_an_interesting_state() -> None:
    full = replay(build_log())
    snapshot = full.to_snapshot()
    assert snapshot.creation_epoch == 2
    assert snapshot.last_applied_log_offset == 15
    assert snapshot.term == 2
    assert (snapshot.previous_applied_epoch, snapshot.max_applied_epoch) == (6, 8)
    assert snapshot.min_epoch_lower_bound == 6
    assert snapshot.epoch_window_offset == 12
    assert (snapshot.lro, snapshot.lrlo) == (10, 12)
    assert snapshot.start_offset == 3
    assert snapshot.high_watermark == 18
    assert snapshot.size_bytes == 522
    assert full.mp == 5


def test_snapshot_encode_decode_round_trip() -> None:
    full = replay(build_log())
    data = full.encode_snapshot()
    restored = PartitionState.decode_snapshot(data)
    assert restored == full
    assert restored is not full
    assert restored.to_snapshot() == full.to_snapshot()
    assert restored.applied_window == (6, 8)
    assert restored.mp == full.mp == 5
    assert PartitionState.from_snapshot(full.to_snapshot()) == full


def test_states_that_differ_in_one_field_are_not_equal() -> None:
    full = replay(build_log())
    other = replay(build_log()[:-1])
    assert other != full
    assert full != object()


def test_snapshot_persists_no_seen_window() -> None:
    # the windowed-fencing seed: the in-memory seen window is not persisted
    fields = set(PartitionSnapshot.__struct_fields__)
    assert not {"max_seen", "previous_seen", "seen_term"} & fields
    assert {
        "max_applied_epoch",
        "previous_applied_epoch",
        "min_epoch_lower_bound",
        "epoch_window_offset",
        "lro",
        "lrlo",
        "start_offset",
        "high_watermark",
        "term",
        "creation_epoch",
    } <= fields


def test_corrupt_snapshot_bytes_raise_msgspec_errors() -> None:
    with pytest.raises(msgspec.DecodeError):
        PartitionState.decode_snapshot(b"\xc1\xff\x00")
    with pytest.raises(msgspec.ValidationError):
        PartitionState.decode_snapshot(msgspec.msgpack.encode({"creation_epoch": "one"}))


def test_replay_from_every_snapshot_point_equals_full_replay() -> None:
    log = build_log()
    full = replay(log)
    for cut in range(len(log) + 1):
        partial = replay(log[:cut])
        restored = PartitionState.decode_snapshot(partial.encode_snapshot())
        assert replay(log[cut:], restored) == full, cut
        # replaying the whole log over the snapshot is idempotent for the applied prefix
        again = PartitionState.decode_snapshot(partial.encode_snapshot())
        assert replay(log, again) == full, cut


# ---------------------------------------------------------------- reader pins


def test_reader_pins_hold_published_mp_at_captured_value() -> None:
    pins = ReaderPins()
    assert pins.published(4) == 4
    reader, pinned = pins.register(4)
    assert pinned == 4
    assert pins.active == 1
    assert pins.published(7) == 4  # the state moved on; the reader holds M(p) at 4
    assert pins.pinned_below(7) == 4
    pins.release(reader)
    assert pins.active == 0
    assert pins.pinned_below(7) is None
    assert pins.published(7) == 7  # rises once the reader is gone


def test_published_mp_is_the_min_of_state_and_all_pins() -> None:
    pins = ReaderPins()
    first, _ = pins.register(3)
    second, _ = pins.register(5)
    assert first != second
    assert pins.published(9) == 3
    pins.release(first)
    assert pins.published(9) == 5
    third, _ = pins.register(9)
    assert pins.published(12) == 5
    pins.release(second)
    assert pins.published(12) == 9
    pins.release(third)
    pins.release(third)  # releasing twice is harmless
    assert pins.published(12) == 12


def test_published_mp_never_decreases() -> None:
    pins = ReaderPins()
    assert pins.published(6) == 6
    with pytest.raises(InvariantViolation, match="published M\\(p\\) fell from 6 to 5"):
        pins.published(5)
    # a reader that registers with a stale capture would pull it down: caught too
    pins2 = ReaderPins()
    assert pins2.published(6) == 6
    pins2.register(2)
    with pytest.raises(InvariantViolation, match="fell from 6 to 2"):
        pins2.published(6)


def test_unknown_mp_pins_nothing_and_cannot_return_after_a_value() -> None:
    pins = ReaderPins()
    reader, pinned = pins.register(None)
    assert pinned is None
    assert pins.active == 0
    assert pins.published(None) is None
    pins.release(reader)
    assert pins.published(2) == 2
    with pytest.raises(AssertionError):
        pins.published(None)


def test_reader_pins_follow_a_partition_state() -> None:
    state = new_state()
    pins = ReaderPins()
    apply(state, placeholder(3))
    apply(state, placeholder(5))
    apply(state, AdvanceReconciledOffset(lro=1, lrlo=2))
    assert pins.published(state.mp) == 2
    reader, pinned = pins.register(state.mp)
    assert pinned == 2
    apply(state, placeholder(7))  # offset 4 opens window [5, 7]
    apply(state, AdvanceReconciledOffset(lro=2, lrlo=4))
    assert state.mp == 4
    assert pins.published(state.mp) == 2
    pins.release(reader)
    assert pins.published(state.mp) == 4


# ---------------------------------------------------------------- abandon-unreconciled


def abandon(state: PartitionState, upto: int | None = None) -> LogRecord:
    entry = AbandonUnreconciled(
        upto=state.high_watermark - 1 if upto is None else upto,
        lrlo=state.last_applied_log_offset,
        operator="ops",
        reason="objects lost",
        at=1.0,
    )
    return apply(state, entry)


def test_abandon_gives_up_exactly_the_unreconciled_offsets_and_lets_mp_rise() -> None:
    state = new_state()
    apply(state, placeholder(3, records=4))  # offsets 0..3
    apply(state, AdvanceReconciledOffset(lro=3, lrlo=1))
    apply(state, placeholder(5, records=3))  # offsets 4..6
    apply(state, placeholder(7, records=3))  # offsets 7..9, window [5, 7] opened at log offset 4
    mp_before = state.mp
    assert mp_before == 2
    abandon(state)
    assert state.abandoned == ((4, 9),)
    assert (state.lro, state.lrlo) == (9, 4)
    assert not state.has_unreconciled_data
    assert state.mp == 4  # the lower bound at previous_applied (5), not max_applied (7)
    assert [state.abandoned_range(o) for o in (3, 4, 9, 10)] == [None, (4, 9), (4, 9), None]
    assert state.reconciled_by_term == {1: 3}, "no L1 object of any term holds abandoned offsets"


def test_abandon_keeps_a_lower_edge_write_in_flight_above_mp() -> None:
    """The escape hatch moves the lower bound by the catch-up's rule, so the GC inequality
    holds for a write admitted at the window's lower edge that lands after it."""
    n = 10
    state = new_state()
    fence = Fence(creation_epoch=1)
    for epoch in (n, n + 1):
        assert fence.try_fence(epoch, state.term, state.applied_window) == BecomeUpdater(epoch)
        fence.complete_slide(state.term, state.applied_window)
        apply(state, placeholder(epoch))
        fence.release()
    in_flight = fence.try_fence(n, state.term, state.applied_window)
    assert isinstance(in_flight, Admitted)
    abandon(state)
    assert state.mp == n - 1 and in_flight.epoch > state.mp
    record = apply(state, placeholder(in_flight.epoch))
    assert record.epoch > state.mp and record.base_offset > state.lro
    assert state.abandoned_range(record.base_offset) is None, "a later write is readable"


def test_abandon_after_a_catch_up_landed_first_gives_up_only_what_is_left() -> None:
    state = new_state()
    apply(state, placeholder(2, records=5))  # offsets 0..4, log offset 1
    asked = AbandonUnreconciled(upto=4, lrlo=1, operator="ops", reason="lost", at=1.0)
    apply(state, AdvanceReconciledOffset(lro=2, lrlo=1))  # landed between the ask and the append
    apply(state, asked)
    assert state.abandoned == ((3, 4),)
    apply(state, AdvanceReconciledOffset(lro=4, lrlo=1))
    apply(state, AbandonUnreconciled(upto=4, lrlo=1, operator="ops", reason="again", at=2.0))
    assert state.abandoned == ((3, 4),), "nothing left: nothing more given up"


def test_abandon_beyond_the_high_watermark_is_a_violation() -> None:
    state = new_state()
    apply(state, placeholder(2, records=2))
    with pytest.raises(InvariantViolation, match="beyond the high watermark"):
        state.apply(record_for(state, AbandonUnreconciled(upto=2, lrlo=1, operator="o", reason="r", at=0.0)))


def test_abandoned_ranges_survive_a_snapshot_and_old_snapshots_have_none() -> None:
    state = new_state()
    apply(state, placeholder(2, records=3))
    abandon(state)
    restored = PartitionState.decode_snapshot(state.encode_snapshot())
    assert restored == state and restored.abandoned == ((0, 2),)
    old = msgspec.msgpack.encode({"creation_epoch": 1, "lro": 4})  # written before the field
    assert PartitionState.decode_snapshot(old).abandoned == ()


# ---------------------------------------------------------------- leader epochs (KIP-320)


def test_term_starts_are_kafkas_leader_epoch_cache() -> None:
    state = new_state(term=1)
    apply(state, placeholder(epoch=1, records=5))  # offsets 0-4 by term 1
    apply(state, TermStart(2), term=2)  # term 2 writes nothing: dropped when term 3 starts
    apply(state, TermStart(3), term=3)
    apply(state, placeholder(epoch=1, records=5))  # offsets 5-9 by term 3
    assert state.term_starts == ((1, 0), (3, 5))
    assert [state.term_at(o) for o in (0, 4, 5, 9)] == [1, 1, 3, 3]
    # LeaderEpochFileCache.endOffsetFor: the floor term and where the next term began.
    assert state.term_end_offset(1) == (1, 5)
    assert state.term_end_offset(2) == (1, 5)
    assert state.term_end_offset(3) == (3, 10)
    assert state.term_end_offset(0) == (0, 0)
    assert state.term_end_offset(4) == (-1, -1)
    assert state.term_end_offset(-1) == (-1, -1)
    # Survives a snapshot; truncated from the start as Kafka's cache is.
    restored = PartitionState.decode_snapshot(state.encode_snapshot())
    assert restored.term_starts == state.term_starts
    apply(state, SetStartOffset(7))
    assert state.term_starts == ((3, 7),)
    assert state.term_at(7) == 3


# ---------------------------------------------------------------- idempotent producers


def test_the_state_holds_each_producers_last_batches_from_the_placeholders_and_its_snapshots() -> None:
    """Kafka's ProducerStateManager: a placeholder's producer spans are applied at their data
    offsets; the last five batches per producer and epoch are kept, and ride in the snapshot (a
    snapshot written before the field existed restores none)."""
    state = new_state()
    apply(state, placeholder(1, 3))  # offsets 0..2, no producer
    spans = (ProducerSpan(7, 0, 0, 2, 0), ProducerSpan(8, 0, 10, 1, 2))
    apply(state, msgspec.structs.replace(placeholder(1, 3), producers=spans))  # offsets 3..5
    for sequence in range(2, 8):  # producer 7: six more one-record batches at 6..11
        apply(state, msgspec.structs.replace(placeholder(1), producers=(ProducerSpan(7, 0, sequence, 1, 0),)))
    producers = state.producers
    assert producers.next_sequence(7, 0) == 8
    assert producers.next_sequence(8, 0) == 11
    assert producers.next_sequence(7, 1) is None  # another epoch: it starts over
    assert producers.duplicate_of(8, 0, 10).base_offset == 5
    assert producers.duplicate_of(7, 0, 7).base_offset == 11
    assert producers.duplicate_of(7, 0, 3).base_offset == 7  # the oldest of the last five
    assert producers.duplicate_of(7, 0, 2) is None  # pushed out by five later ones
    restored = PartitionState.decode_snapshot(state.encode_snapshot())
    assert restored == state
    assert restored.producers.rows() == producers.rows()
    assert restored.producers.duplicate_of(8, 0, 10).base_offset == 5
    old = PartitionSnapshot(creation_epoch=1, last_applied_log_offset=0, term=1)  # before the field
    assert len(PartitionState.decode_snapshot(msgspec.msgpack.encode(old)).producers) == 0


def test_the_state_forgets_the_least_recently_appended_producer_past_its_bound() -> None:
    producers = PartitionProducers(producers_max=2)
    producers.append(1, 0, 0, 1, 0)
    producers.append(2, 0, 0, 1, 1)
    producers.append(1, 0, 1, 1, 2)  # producer 1 appended again: 2 is the least recent
    producers.append(3, 0, 0, 1, 3)
    assert [row[0] for row in producers.rows()] == [1, 3]


def test_the_first_readable_offset_skips_abandoned_ranges_at_the_start_only() -> None:
    snapshot = PartitionSnapshot(creation_epoch=1, start_offset=0, abandoned=((0, 49), (50, 99), (120, 129)))
    assert snapshot.first_readable_offset == 100  # back-to-back ranges; not the one after a gap
    assert (
        PartitionSnapshot(creation_epoch=1, start_offset=10, abandoned=((0, 49),)).first_readable_offset == 50
    )
    assert (
        PartitionSnapshot(creation_epoch=1, start_offset=50, abandoned=((0, 49),)).first_readable_offset == 50
    )
    assert PartitionSnapshot(creation_epoch=1).first_readable_offset == 0


def test_terms_that_reconcile_nothing_new_leave_the_term_lineage_as_it_was() -> None:
    """Each term's first catch-up recorded its end, even one at an earlier term's end (a restart
    or a lease move with nothing new to reconcile): a partition's map grew by one entry per term
    for ever (in memory and in every snapshot). Such an entry validates no object of its term and
    bounds no later one; every object's validity is what it was with them."""
    state = new_state(term=1)
    apply(state, placeholder(1, records=10))  # data 0..9
    apply(state, AdvanceReconciledOffset(lro=9, lrlo=1))
    with_every_term = dict(state.reconciled_by_term)
    for term in range(2, 50):  # restarts: each term catches up to where the last one was
        apply(state, TermStart(term), term=term)
        apply(state, AdvanceReconciledOffset(lro=9, lrlo=state.next_log_offset - 1), term=term)
        with_every_term[term] = 9
    assert state.reconciled_by_term == {1: 9}
    apply(state, placeholder(1, records=5), term=49)  # data 10..14, reconciled in term 49
    apply(state, AdvanceReconciledOffset(lro=14, lrlo=state.next_log_offset - 1), term=49)
    with_every_term[49] = 14
    assert state.reconciled_by_term == {1: 9, 49: 14}
    before = PartitionState(1)
    before.reconciled_by_term = with_every_term  # as the map was kept before
    for term in (1, 2, 30, 48, 49, 50):
        for base in range(0, 16):
            for last in range(base, 16):
                assert state.l1_range_valid(term, base, last) == before.l1_range_valid(term, base, last), (
                    term,
                    base,
                    last,
                )
