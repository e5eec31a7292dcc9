"""The leader protocol's pure rules (levelzero/core/leader.py), driven without an event loop."""

from __future__ import annotations

import pytest

from levelzero.testing.entries import placeholder
from levelzero.core.entries import (
    AdvanceEpoch,
    AdvanceReconciledOffset,
    LogRecord,
    SetStartOffset,
    TermStart,
)
from levelzero.core.errors import InvalidInput, NotLeader
from levelzero.core.fence import Admitted, BecomeUpdater, Fence
from levelzero.core.leader import (
    Admit,
    AppendQueue,
    FenceDispatch,
    Refuse,
    WatermarkBoard,
    advance_epoch_needed,
    catch_up_needed,
    control_refusal,
    l1_collect_reason,
    object_epoch,
    validate_control,
)
from levelzero.core.state import PartitionState


def started(creation_epoch: int = 1) -> PartitionState:
    state = PartitionState(creation_epoch)
    state.apply(LogRecord(0, 1, 0, TermStart(1)))
    return state


def test_object_epoch_is_the_cache_raised_to_every_creation_epoch() -> None:
    assert object_epoch(3, [1, 2]) == 3
    assert object_epoch(3, [1, 5, 4]) == 5  # a partition created at 5: never below it
    assert object_epoch(7, []) == 7


def test_reserved_records_get_consecutive_offsets_and_apply_in_log_order() -> None:
    state = started()
    fence = Fence(1)
    queue: AppendQueue[str] = AppendQueue(state)
    assert (queue.next_log_offset, queue.projected_hwm) == (1, 0)
    assert fence.try_fence(2, 1, state.applied_window) == BecomeUpdater(2)
    fence.complete_slide(1, state.applied_window)
    first = queue.reserve(1, placeholder(2, 3), "a", holds_read_unit=True)
    second = queue.reserve(1, AdvanceEpoch(2), "b", holds_read_unit=False)
    assert (first.log_offset, first.base_offset) == (1, 0)
    assert (second.log_offset, second.base_offset) == (2, 3)  # after the placeholder's records
    assert (queue.next_log_offset, queue.projected_hwm) == (3, 3)
    assert queue.durable(0, state, fence) == []  # nothing of ours is durable yet
    done = queue.durable(1, state, fence)
    assert [r.token for r in done] == ["a"]
    assert state.high_watermark == 3 and fence.read_units == 0  # applied, then released
    assert [r.token for r in queue.durable(5, state, fence)] == ["b"]
    assert len(queue) == 0 and state.last_applied_log_offset == 2


class CountingFence(Fence):
    __slots__ = ("releases",)

    def __init__(self, creation_epoch: int) -> None:
        super().__init__(creation_epoch)
        self.releases: list[int] = []

    def release(self, units: int = 1) -> None:
        self.releases.append(units)
        super().release(units)


def test_a_durable_batch_applies_in_order_and_releases_exactly_its_writes_read_units() -> None:
    state = started()
    fence = CountingFence(1)
    queue: AppendQueue[str] = AppendQueue(state)
    assert fence.try_fence(2, 1, state.applied_window) == BecomeUpdater(2)
    fence.complete_slide(1, state.applied_window)  # "a"'s unit
    for _ in range(2):
        assert isinstance(fence.try_fence(2, 1, state.applied_window), Admitted)  # "b", "d"
    assert fence.read_units == 3
    queue.reserve(1, placeholder(2, 3), "a", holds_read_unit=True)
    queue.reserve(1, placeholder(2, 1), "b", holds_read_unit=True)
    queue.reserve(1, AdvanceEpoch(2), "c", holds_read_unit=False)  # a control entry: no unit
    queue.reserve(1, placeholder(2, 2), "d", holds_read_unit=True)
    done = queue.durable(3, state, fence)  # one batch: "a", "b", "c"
    assert [r.token for r in done] == ["a", "b", "c"]
    assert [r.record.log_offset for r in done] == [1, 2, 3]
    assert state.high_watermark == 4 and state.last_applied_log_offset == 3
    assert fence.read_units == 1  # "a" and "b" released, "c" held none; "d" still out
    assert fence.releases == [2]  # one call for the batch, not one per record
    assert [r.token for r in queue.durable(4, state, fence)] == ["d"]
    assert fence.read_units == 0 and fence.drained and fence.releases == [2, 1]


def test_a_durable_record_that_breaks_the_state_still_releases_what_was_applied() -> None:
    state = started()
    fence = Fence(1)
    queue: AppendQueue[str] = AppendQueue(state)
    fence.try_fence(2, 1, state.applied_window)
    fence.complete_slide(1, state.applied_window)
    fence.try_fence(2, 1, state.applied_window)
    queue.reserve(1, placeholder(2, 3), "a", holds_read_unit=True)
    queue.projected_hwm += 1  # a bug: "b" claims a base offset one past where "a" ends
    queue.reserve(1, placeholder(2, 1), "b", holds_read_unit=True)
    with pytest.raises(Exception, match="claims base offset"):
        queue.durable(2, state, fence)
    assert fence.read_units == 1  # "a" was applied and released; "b" was not applied


def test_dropped_reservations_come_back_oldest_first() -> None:
    state = started()
    queue: AppendQueue[int] = AppendQueue(state)
    for token in range(3):
        queue.reserve(1, AdvanceEpoch(1), token, holds_read_unit=False)
    assert [r.token for r in queue.drop_all()] == [0, 1, 2]
    assert len(queue) == 0


def test_a_control_entry_for_another_term_is_refused() -> None:
    assert control_refusal("t/0", 3, 3) is None
    assert control_refusal("t/0", None, 3) is None
    refusal = control_refusal("t/0", 2, 3)
    assert isinstance(refusal, NotLeader) and "t/0" in str(refusal)


def test_control_entries_must_lie_inside_the_log() -> None:
    ok = validate_control("t/0", AdvanceReconciledOffset(lro=4, lrlo=2), 5, 3)
    assert ok is None
    assert isinstance(validate_control("t/0", AdvanceReconciledOffset(5, 2), 5, 3), InvalidInput)
    assert isinstance(validate_control("t/0", AdvanceReconciledOffset(4, 3), 5, 3), InvalidInput)
    assert validate_control("t/0", SetStartOffset(5), 5, 3) is None
    assert isinstance(validate_control("t/0", SetStartOffset(6), 5, 3), InvalidInput)
    with pytest.raises(AssertionError, match="not a control entry"):
        validate_control("t/0", AdvanceEpoch(1), 5, 3)


def test_the_board_only_rises() -> None:
    board = WatermarkBoard()
    board.register("t/0")
    assert board.snapshot() == {"t/0": None}  # registered: blocks a GC round until it has one
    assert board.publish("t/0", 3) and board.get("t/0") == 3
    assert not board.publish("t/0", 2) and board.get("t/0") == 3
    assert not board.publish("t/0", None) and board.get("t/0") == 3
    board.register("t/0")
    assert board.get("t/0") == 3  # registering again keeps the value


def test_housekeeping_advances_an_idle_partition_then_catches_it_up() -> None:
    state = started(creation_epoch=2)
    assert advance_epoch_needed(state, 2) == 2  # no epoch yet: the first one
    state.apply(LogRecord(1, 1, 0, AdvanceEpoch(2)))
    assert advance_epoch_needed(state, 2) is None
    assert advance_epoch_needed(state, 4) == 4
    # nothing unreconciled, the window opened at log offset 1, not reconciled: catch up to it
    assert catch_up_needed(state) == (-1, 1)
    state.apply(LogRecord(2, 1, 0, AdvanceReconciledOffset(-1, 1)))
    assert catch_up_needed(state) is None  # nothing would move
    state.apply(LogRecord(3, 1, 0, placeholder(2, 2)))
    assert catch_up_needed(state) is None  # unreconciled data: the reconciler's turn


def test_admission_and_reservation_keep_the_old_window_before_the_slide() -> None:
    """Why the drain is what it is: offsets are reserved at admission, so a write admitted
    under the old window is ahead, in the log, of the updater's write."""
    state = started()
    fence = Fence(1)
    queue: AppendQueue[str] = AppendQueue(state)
    assert isinstance(fence.try_fence(2, 1, state.applied_window), BecomeUpdater)
    queue.reserve(1, placeholder(2, 2), "first", holds_read_unit=True)
    fence.complete_slide(1, state.applied_window)
    old = fence.try_fence(2, 1, state.applied_window)
    assert isinstance(old, Admitted)
    queue.reserve(1, placeholder(2, 2), "old window", holds_read_unit=True)
    assert isinstance(fence.try_fence(5, 1, state.applied_window), BecomeUpdater)
    assert not fence.drained  # the old window's write still holds its unit
    done = queue.durable(2, state, fence)
    assert [r.token for r in done] == ["first", "old window"] and fence.drained


def test_l1_collect_reasons() -> None:
    state = started()
    state.apply(LogRecord(1, 1, 0, placeholder(1, 4)))
    state.apply(LogRecord(2, 1, 4, AdvanceReconciledOffset(lro=3, lrlo=1)))

    def reason(**row: object) -> str | None:
        fields = dict(
            row_term=1,
            last_offset=3,
            lineage_valid=True,
            copy_finished=True,
            delete_started=False,
            stale_copy=False,
        )
        fields.update(row)
        return l1_collect_reason(state, 2, **fields)  # type: ignore[arg-type]

    assert reason() is None  # valid, serving: kept
    assert reason(delete_started=True, copy_finished=False) == "resuming an unfinished delete"
    assert reason(stale_copy=True, copy_finished=False) == "stale COPY_STARTED"
    assert reason(lineage_valid=False) == "outside the term lineage (term 1)"
    state.start_offset = 4  # every offset of the object below it
    assert reason(start_moved_by="DeleteRecords") == "below the start offset (moved by DeleteRecords)"
    assert reason(start_moved_by="retention") == "below the start offset (moved by retention)"
    assert (
        reason()
        == "below the start offset (moved by retention or DeleteRecords before this node took the lead)"
    )
    state.start_offset = 0
    # the current term's own out-of-lineage object: its catch-up may still come
    assert reason(lineage_valid=False, row_term=2) is None
    assert reason(copy_finished=False) is None  # a copy in progress, not stale


def test_dispatch_queues_writes_behind_the_updater_until_the_old_window_drains() -> None:
    state = started()
    fence = Fence(1)
    dispatch: FenceDispatch[str] = FenceDispatch(fence)
    (first,) = dispatch.offer(2, "first", 1, state.applied_window)  # no window: slides at once
    assert isinstance(first, Admit) and first.admitted.new_epoch and first.token == "first"
    (old,) = dispatch.offer(2, "old", 1, state.applied_window)
    assert isinstance(old, Admit) and not old.admitted.new_epoch
    # a newer epoch becomes the updater, but two read units of window [2, 2] are out
    assert dispatch.offer(4, "updater", 1, state.applied_window) == []
    assert dispatch.offer(5, "newer", 1, state.applied_window) == []  # waits behind it
    assert dispatch.offer(4, "same", 1, state.applied_window) == []
    assert dispatch.waiting == 3 and fence.updater_epoch == 4
    fence.release()
    assert dispatch.slide_if_drained(1, state.applied_window) == []  # one unit still out
    fence.release()
    outcomes = dispatch.slide_if_drained(1, state.applied_window)
    # the updater slides to [2, 4]; the waiters are offered again in order: "newer" (5) becomes
    # the next updater (the updater's own unit is out), so "same" (4) waits behind it
    assert [(type(o).__name__, o.token) for o in outcomes] == [("Admit", "updater")]
    assert outcomes[0].admitted.window == (2, 4)  # type: ignore[union-attr]
    assert fence.updater_epoch == 5 and dispatch.waiting == 2
    fence.release()
    outcomes = dispatch.slide_if_drained(1, state.applied_window)
    # [4, 5]; "same" (4) is refused: nothing is applied yet, so with 5 in flight it could land
    # below the applied window (the fence's landing-order rule); it retries with a fresh epoch
    assert [(type(o).__name__, o.token) for o in outcomes] == [("Admit", "newer"), ("Refuse", "same")]
    assert dispatch.waiting == 0 and fence.updater_epoch is None


def test_dispatch_admits_the_common_write_as_the_fences_own_admission() -> None:
    state = started()
    fence = Fence(1)
    dispatch: FenceDispatch[str] = FenceDispatch(fence)
    (first,) = dispatch.admit(2, "first", 1, state.applied_window)  # type: ignore[misc]
    assert isinstance(first, Admit) and first.admitted.new_epoch  # a slide: an outcome list
    second = dispatch.admit(2, "second", 1, state.applied_window)
    assert second == Admitted(2, 1, (2, 2), new_epoch=False)  # no outcome, no list
    assert dispatch.admit(2, "third", 1, state.applied_window) is second  # the same object
    assert fence.read_units == 3
    assert dispatch.admit(4, "updater", 1, state.applied_window) == []  # held: the updater
    assert dispatch.admit(4, "waiter", 1, state.applied_window) == []  # held behind it
    assert dispatch.waiting == 2
    (refused,) = FenceDispatch(Fence(3)).admit(2, "old", 1, None)  # type: ignore[misc]
    assert isinstance(refused, Refuse) and refused.token == "old"


def test_dispatch_refuses_below_the_window_and_abandons_what_it_holds() -> None:
    state = started()
    fence = Fence(3)
    dispatch: FenceDispatch[str] = FenceDispatch(fence)
    (refused,) = dispatch.offer(2, "old", 1, state.applied_window)  # below the creation epoch
    assert isinstance(refused, Refuse) and refused.error.window_min == 3
    dispatch.offer(3, "a", 1, state.applied_window)
    assert dispatch.offer(6, "updater", 1, state.applied_window) == []
    assert dispatch.offer(7, "waiter", 1, state.applied_window) == []
    assert sorted(dispatch.abandon()) == ["updater", "waiter"]
    assert fence.updater_epoch is None and dispatch.waiting == 0
