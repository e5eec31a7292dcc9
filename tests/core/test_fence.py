"""The windowed epoch fence, driven synchronously through `Fence` + `PartitionState`.

Covers the five unit tests of the windowed-fencing seed (000_*, "Testing Strategy"), the
updater protocol (one slide at a time, coalescing), term changes and the strict baseline.
The actor layer does the waiting; here "waiting" is just not calling `complete_slide` yet.
"""

from __future__ import annotations

import dataclasses

import pytest

from levelzero.testing.entries import placeholder
from levelzero.core.entries import (
    AdvanceReconciledOffset,
    Entry,
    LogRecord,
    TermStart,
)
from levelzero.core.errors import InvariantViolation, StaleClusterEpoch
from levelzero.core.fence import (
    Admitted,
    BecomeUpdater,
    Decision,
    Fence,
    FenceMode,
    Rejected,
    Wait,
    lands_in_any_order,
)
from levelzero.core.state import PartitionState

N = 10
KEY = "level_zero/data/001/000000000000000010/" + "cd" * 16


class Leader:
    """One partition leader: its state machine, its fence and its log as a list."""

    def __init__(
        self,
        creation_epoch: int = 1,
        term: int = 1,
        mode: FenceMode = FenceMode.WINDOWED,
        state: PartitionState | None = None,
    ) -> None:
        self.state = PartitionState(creation_epoch) if state is None else state
        self.fence = Fence(self.state.creation_epoch, mode)
        self.log: list[LogRecord] = []
        self.term = self.state.term
        self.start_term(term)

    def append(self, entry: Entry) -> LogRecord:
        record = LogRecord(self.state.next_log_offset, self.term, self.state.high_watermark, entry)
        assert self.state.apply(record) is True
        self.log.append(record)
        return record

    def start_term(self, term: int) -> None:
        self.term = term
        self.append(TermStart(term))

    @property
    def window(self) -> tuple[int, int] | None:
        return self.fence.effective_window(self.term, self.state.applied_window)

    def try_fence(self, epoch: int) -> Decision:
        return self.fence.try_fence(epoch, self.term, self.state.applied_window)

    def complete_slide(self) -> Admitted:
        return self.fence.complete_slide(self.term, self.state.applied_window)

    def admit(self, epoch: int) -> Admitted:
        """Fence one write; slides the window if it must (requires nothing in flight)."""
        decision = self.try_fence(epoch)
        if isinstance(decision, BecomeUpdater):
            assert self.fence.drained
            decision = self.complete_slide()
        assert isinstance(decision, Admitted), decision
        return decision

    def land(self, admitted: Admitted) -> LogRecord:
        """The admitted write's placeholder is durable and applied: release its read unit."""
        assert admitted.term == self.term
        record = self.append(placeholder(admitted.epoch))
        self.fence.release()
        return record

    def write(self, epoch: int) -> LogRecord:
        return self.land(self.admit(epoch))


# ---------------------------------------------------------------- seed test 1: sliding


def test_window_slides_n_then_n_plus_1_then_n_plus_2() -> None:
    leader = Leader()
    assert leader.window is None

    first = leader.try_fence(N)
    assert first == BecomeUpdater(N)
    admitted = leader.complete_slide()
    assert admitted == Admitted(N, 1, (N, N), new_epoch=True)
    assert leader.window == (N, N)
    leader.land(admitted)

    assert leader.try_fence(N + 1) == BecomeUpdater(N + 1)
    admitted = leader.complete_slide()
    assert admitted.window == (N, N + 1)
    assert leader.window == (N, N + 1)
    leader.land(admitted)
    assert leader.state.applied_window == (N, N + 1)

    assert leader.try_fence(N + 2) == BecomeUpdater(N + 2)
    admitted = leader.complete_slide()
    assert admitted.window == (N + 1, N + 2)  # N is pushed out
    leader.land(admitted)
    assert leader.window == (N + 1, N + 2)
    assert leader.state.applied_window == (N + 1, N + 2)

    stats = leader.fence.statistics(leader.term, leader.state.applied_window)
    assert stats.window == (N + 1, N + 2)
    assert stats.window_size == 2
    assert stats.window_slides == 3
    assert stats.new_epoch_fences == 3
    assert stats.read_units == 0
    assert stats.updater_epoch is None


# ---------------------------------------------------------------- seed test 2: concurrency


def test_many_writes_hold_read_units_and_updater_waits_for_drain() -> None:
    leader = Leader()
    leader.write(N)
    held = [leader.try_fence(N) for _ in range(5)]
    assert all(d == Admitted(N, 1, (N, N), new_epoch=False) for d in held)
    assert leader.fence.read_units == 5

    assert leader.try_fence(N + 1) == BecomeUpdater(N + 1)
    assert leader.fence.updater_epoch == N + 1
    # nobody else gets in while the updater waits, not even an in-window epoch
    assert leader.try_fence(N) == Wait(N + 1)
    with pytest.raises(AssertionError, match="5 read units outstanding"):
        leader.complete_slide()

    for i, admitted in enumerate(held):
        assert not leader.fence.drained
        leader.land(admitted)
        assert leader.fence.read_units == 4 - i
    assert leader.fence.drained

    slid = leader.complete_slide()
    assert slid == Admitted(N + 1, 1, (N, N + 1), new_epoch=True)
    assert leader.fence.read_units == 1  # the updater keeps one unit for its own write
    assert leader.fence.updater_epoch is None
    assert leader.window == (N, N + 1)
    # both epochs of the window are admitted concurrently now
    assert leader.try_fence(N) == Admitted(N, 1, (N, N + 1), new_epoch=False)
    assert leader.try_fence(N + 1) == Admitted(N + 1, 1, (N, N + 1), new_epoch=False)
    assert leader.fence.read_units == 3


# ---------------------------------------------------------------- seed test 3: rejection


def test_epoch_below_window_is_rejected_with_the_window() -> None:
    leader = Leader()
    leader.write(N)
    leader.write(N + 1)
    assert leader.window == (N, N + 1)

    decision = leader.try_fence(N - 1)
    assert isinstance(decision, Rejected)
    error = decision.error
    assert isinstance(error, StaleClusterEpoch)
    assert (error.epoch, error.window_min, error.window_max) == (N - 1, N, N + 1)
    assert error.retriable is True
    assert error.code == "stale_cluster_epoch"
    assert f"[{N}, {N + 1}]" in str(error)
    assert leader.fence.read_units == 0  # a rejection takes no read unit

    far = leader.try_fence(N - 4)
    assert isinstance(far, Rejected)
    stats = leader.fence.statistics(leader.term, leader.state.applied_window)
    assert stats.stale_rejections == 2
    assert stats.last_rejected_gap == 4
    assert stats.read_units == 0


def test_epoch_below_creation_epoch_is_rejected_before_any_window() -> None:
    leader = Leader(creation_epoch=7)
    assert leader.window is None
    decision = leader.try_fence(6)
    assert isinstance(decision, Rejected)
    assert (decision.error.window_min, decision.error.window_max) == (7, 7)
    assert leader.try_fence(7) == BecomeUpdater(7)
    assert leader.complete_slide().window == (7, 7)


# ---------------------------------------------------------------- seed test 4: gaps


def test_non_contiguous_window_admits_every_epoch_inside() -> None:
    """Seed test 4: [N] then [N, N+5]; N+1..N+4 are admitted (once the N+5 write has landed,
    see the next test for why not before)."""
    leader = Leader()
    leader.write(N)
    assert leader.window == (N, N)
    leader.write(N + 5)  # the updater's write lands
    assert leader.window == (N, N + 5)
    assert leader.state.applied_window == (N, N + 5)

    inside = [leader.try_fence(e) for e in range(N, N + 6)]
    assert [d.epoch for d in inside if isinstance(d, Admitted)] == list(range(N, N + 6))
    assert all(isinstance(d, Admitted) and d.window == (N, N + 5) for d in inside)
    assert leader.fence.read_units == 6
    for admitted in reversed(inside):  # any order lands: none moves the applied window
        assert isinstance(admitted, Admitted)
        leader.land(admitted)
    assert leader.state.applied_window == (N, N + 5)
    assert leader.fence.window_slides == 2
    assert isinstance(leader.try_fence(N - 1), Rejected)


def test_epoch_strictly_inside_is_refused_until_the_upper_edge_is_applied() -> None:
    """Non-contiguous window [N, N+5] whose N+5 write is still in flight: admitting N+2 would let
    the log apply N+2 then N+5, sliding the applied window to [N+2, N+5] over an in-flight N."""
    leader = Leader()
    leader.write(N)
    upper = leader.admit(N + 5)
    assert upper.window == (N, N + 5)
    assert leader.state.applied_window == (N, N)
    lower = leader.try_fence(N)
    assert isinstance(lower, Admitted)  # both edges are fine

    middle = leader.try_fence(N + 2)
    assert isinstance(middle, Rejected)
    assert (middle.error.window_min, middle.error.window_max) == (N, N + 5)
    assert leader.fence.read_units == 2

    leader.land(upper)
    assert leader.state.applied_window == (N, N + 5)
    middle = leader.try_fence(N + 2)
    assert isinstance(middle, Admitted)
    leader.land(middle)
    leader.land(lower)  # the lower edge still lands inside the applied window
    assert leader.state.applied_window == (N, N + 5)
    assert leader.state.max_applied_epoch == N + 5


def test_why_inside_epochs_are_refused_until_the_upper_edge_lands() -> None:
    """What the refusal above prevents: three epochs of one window applying in log order."""
    state = PartitionState(1)
    for offset, entry in enumerate([TermStart(1), placeholder(N), placeholder(N + 2)]):
        state.apply(LogRecord(offset, 1, state.high_watermark, entry))
    state.apply(LogRecord(3, 1, state.high_watermark, placeholder(N + 5)))
    assert state.applied_window == (N + 2, N + 5)
    state.apply(LogRecord(4, 1, state.high_watermark, AdvanceReconciledOffset(2, 3)))
    assert state.mp == N + 1  # an in-flight write at N would lose its object
    with pytest.raises(InvariantViolation, match="below the window"):
        state.apply(LogRecord(5, 1, state.high_watermark, placeholder(N)))


def test_lower_edge_whose_write_never_landed_is_refused_on_a_fresh_partition() -> None:
    """Nothing applied yet, seen window [N, N+3] (the N write was a probe or failed): the first
    epoch applied sets previous_applied = max_applied, so landing N+3 first would strand N."""
    leader = Leader()
    probe = leader.admit(N)
    leader.fence.release()  # a fence probe: nothing appended
    assert probe.window == (N, N)
    upper = leader.admit(N + 3)
    assert upper.window == (N, N + 3)
    assert leader.state.applied_window is None
    refused = leader.try_fence(N)
    assert isinstance(refused, Rejected)
    assert (refused.error.window_min, refused.error.window_max) == (N, N + 3)
    assert isinstance(leader.try_fence(N + 1), Rejected)
    assert isinstance(leader.try_fence(N + 3), Admitted)  # the upper edge always lands fine


def test_epochs_below_the_applied_window_are_refused_inside_the_seen_window() -> None:
    """Seen window [N, N+3], but the first epoch ever applied is N+3: the applied window is
    [N+3, N+3] and every epoch below it would land below the window."""
    leader = Leader()
    leader.admit(N)
    leader.fence.release()  # probe
    leader.write(N + 3)
    assert leader.window == (N, N + 3)
    assert leader.state.applied_window == (N + 3, N + 3)
    for epoch in (N, N + 1, N + 2):
        decision = leader.try_fence(epoch)
        assert isinstance(decision, Rejected), epoch
    assert isinstance(leader.try_fence(N + 3), Admitted)


@pytest.mark.parametrize("upper_first", [True, False])
def test_lower_edge_above_everything_applied_lands_in_any_order(upper_first: bool) -> None:
    leader = Leader()
    leader.write(N - 2)
    leader.write(N - 1)
    leader.admit(N)
    leader.fence.release()  # the N write failed: applied stays [N-2, N-1]
    upper = leader.admit(N + 4)
    assert leader.window == (N, N + 4)
    lower = leader.try_fence(N)
    assert isinstance(lower, Admitted)  # N > max_applied: only N and N+4 can move the window
    assert isinstance(leader.try_fence(N + 2), Rejected)
    for admitted in [upper, lower] if upper_first else [lower, upper]:
        leader.land(admitted)
    assert leader.state.applied_window == ((N - 1, N + 4) if upper_first else (N, N + 4))
    assert leader.state.previous_applied_epoch <= N


@pytest.mark.parametrize(
    ("epoch", "window", "applied", "admissible"),
    [
        (9, (5, 9), None, True),  # the upper edge
        (9, (5, 9), (1, 2), True),
        (5, (5, 9), None, False),  # nothing applied: the upper edge may land first
        (7, (5, 9), None, False),
        (5, (5, 9), (3, 4), True),  # the lower edge above everything applied
        (5, (5, 9), (4, 5), True),  # inside the applied window: a no-op apply
        (7, (5, 9), (4, 5), False),  # could raise max_applied, then 9 raises it again
        (7, (5, 9), (5, 9), True),
        (5, (5, 9), (9, 9), False),  # below the applied window
        (8, (5, 9), (9, 9), False),
        (4, (4, 4), (4, 4), True),
        (6, (5, 9), (5, 9), True),
    ],
)
def test_lands_in_any_order(
    epoch: int, window: tuple[int, int], applied: tuple[int, int] | None, admissible: bool
) -> None:
    assert lands_in_any_order(epoch, window, applied) is admissible


# ---------------------------------------------------------------- seed test 5: recovery


def test_snapshot_recovery_collapses_to_the_applied_window() -> None:
    leader = Leader()
    leader.write(N)
    leader.write(N + 1)
    # the window slides again in memory, but that write never lands
    unlanded = leader.admit(N + 2)
    assert leader.window == (N + 1, N + 2)
    assert unlanded.epoch == N + 2
    assert leader.state.applied_window == (N, N + 1)

    data = leader.state.encode_snapshot()
    restored = PartitionState.decode_snapshot(data)
    assert restored == leader.state

    successor = Leader(state=restored, term=2)
    assert successor.state.term == 2
    assert successor.fence.read_units == 0
    # the effective window is [previous_applied, max_applied]: what the log proves
    assert successor.window == (N, N + 1) == restored.applied_window
    assert successor.admit(N).window == (N, N + 1)
    assert isinstance(successor.try_fence(N - 1), Rejected)
    # the first new epoch re-establishes a seen window from the applied one
    successor.fence.release()
    assert successor.try_fence(N + 2) == BecomeUpdater(N + 2)
    assert successor.complete_slide().window == (N + 1, N + 2)


def test_seen_window_of_an_older_term_is_ignored_after_term_change() -> None:
    leader = Leader()
    leader.write(N)
    leader.write(N + 1)
    lost = leader.admit(N + 3)  # seen window [N+1, N+3] in term 1; its write never lands
    assert leader.window == (N + 1, N + 3)
    assert isinstance(leader.try_fence(N), Rejected)
    leader.fence.release()  # the term-1 append failed (NotLeader)
    assert lost.term == 1

    leader.start_term(2)  # same process, same Fence object, new term
    assert leader.fence.seen_term == 1
    assert leader.window == (N, N + 1)
    admitted = leader.try_fence(N)
    assert admitted == Admitted(N, 2, (N, N + 1), new_epoch=False)
    # N+3 is new again for term 2: it slides from the applied window, not from [N+1, N+3]
    assert leader.try_fence(N + 3) == BecomeUpdater(N + 3)
    assert not leader.fence.drained
    leader.land(admitted)
    slid = leader.complete_slide()
    assert slid == Admitted(N + 3, 2, (N + 1, N + 3), new_epoch=True)
    assert leader.fence.seen_term == 2


def test_applying_on_a_follower_advances_the_applied_window() -> None:
    leader = Leader()
    for epoch in (N, N, N + 2, N + 2, N + 4):
        leader.write(epoch)
    follower = PartitionState(creation_epoch=1)
    windows = []
    for record in leader.log:  # a follower only applies; no fence involved
        assert follower.apply(record) is True
        windows.append(follower.applied_window)
    assert windows == [None, (N, N), (N, N), (N, N + 2), (N, N + 2), (N + 2, N + 4)]
    assert follower == leader.state

    # the follower becomes leader: its window is what it applied
    promoted = Leader(state=follower, term=2)
    assert promoted.window == (N + 2, N + 4)
    assert isinstance(promoted.try_fence(N + 1), Rejected)
    assert isinstance(promoted.try_fence(N + 3), Admitted)  # inside, and not above max_applied


# ---------------------------------------------------------------- one slide at a time


def test_ten_concurrent_fences_of_the_same_new_epoch_cause_exactly_one_slide() -> None:
    leader = Leader()
    leader.write(N)
    in_flight = [leader.admit(N) for _ in range(3)]
    slides_before = leader.fence.window_slides

    decisions = [leader.try_fence(N + 1) for _ in range(10)]
    assert decisions[0] == BecomeUpdater(N + 1)
    assert decisions[1:] == [Wait(N + 1)] * 9

    for admitted in in_flight:
        assert not leader.fence.drained
        leader.land(admitted)
    updater = leader.complete_slide()
    assert updater == Admitted(N + 1, 1, (N, N + 1), new_epoch=True)

    # the nine waiters re-evaluate against the slid window
    retried = [leader.try_fence(N + 1) for _ in range(9)]
    assert retried == [Admitted(N + 1, 1, (N, N + 1), new_epoch=False)] * 9
    assert leader.fence.window_slides == slides_before + 1
    assert leader.fence.read_units == 10
    for admitted in [updater, *retried]:
        leader.land(admitted)
    stats = leader.fence.statistics(leader.term, leader.state.applied_window)
    assert stats.window_slides == 2  # N, then N+1
    assert stats.new_epoch_fences == 2
    assert stats.same_epoch_fences == 3 + 9
    assert leader.state.applied_window == (N, N + 1)


def test_waiters_above_the_new_window_become_the_next_updater_one_at_a_time() -> None:
    leader = Leader()
    leader.write(N)
    assert leader.try_fence(N + 1) == BecomeUpdater(N + 1)
    waiting = [N + 2, N + 1, N, N + 2, N + 3]
    assert [leader.try_fence(e) for e in waiting] == [Wait(N + 1)] * 5
    first = leader.complete_slide()
    assert first.window == (N, N + 1)

    retried = [leader.try_fence(e) for e in waiting]
    assert retried[0] == BecomeUpdater(N + 2)
    assert retried[1:] == [Wait(N + 2)] * 4  # while an updater is active, everybody waits
    assert leader.fence.window_slides == 2
    assert not leader.fence.drained
    leader.land(first)
    second = leader.complete_slide()
    assert second.window == (N + 1, N + 2)

    again = [leader.try_fence(e) for e in waiting[1:]]
    assert isinstance(again[0], Admitted) and again[0].epoch == N + 1
    assert isinstance(again[1], Rejected)  # N fell out of the window
    assert isinstance(again[2], Admitted) and again[2].epoch == N + 2
    assert again[3] == BecomeUpdater(N + 3)
    assert leader.fence.window_slides == 3


def test_abandoned_update_leaves_the_window_alone() -> None:
    leader = Leader()
    leader.write(N)
    assert leader.try_fence(N + 4) == BecomeUpdater(N + 4)
    leader.fence.abandon_update()
    assert leader.fence.updater_epoch is None
    assert leader.window == (N, N)
    assert leader.fence.window_slides == 1
    assert leader.try_fence(N + 4) == BecomeUpdater(N + 4)
    with pytest.raises(AssertionError):
        Fence(1).abandon_update()


def test_release_and_slide_without_a_unit_or_updater_are_bugs() -> None:
    fence = Fence(1)
    with pytest.raises(AssertionError, match="release without a read unit"):
        fence.release()
    fence.read_units = 2  # two writes admitted
    with pytest.raises(AssertionError, match=r"release without a read unit \(3 released, 2 held\)"):
        fence.release(3)  # a batch of durable records releases what its writes hold, no more
    fence.release(2)
    assert fence.drained
    with pytest.raises(AssertionError, match="complete_slide without an updater"):
        fence.complete_slide(1, None)


def test_statistics_is_an_immutable_snapshot() -> None:
    leader = Leader()
    leader.write(N)
    stats = leader.fence.statistics(leader.term, leader.state.applied_window)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.read_units = 3  # type: ignore[misc]
    leader.admit(N)
    assert stats.read_units == 0
    assert leader.fence.statistics(leader.term, leader.state.applied_window).read_units == 1


# ---------------------------------------------------------------- strict baseline


@pytest.mark.parametrize("mode", [FenceMode.STRICT, FenceMode.WINDOWED])
def test_producer_a_with_epoch_n_after_b_slid_to_n_plus_1(mode: FenceMode) -> None:
    """The seed's failure scenario: A uploaded under N, B under N+1; B fences first."""
    leader = Leader(mode=mode)
    leader.write(N)
    assert leader.window == (N, N)
    b = leader.admit(N + 1)
    assert b.new_epoch
    a = leader.try_fence(N)
    if mode is FenceMode.STRICT:
        assert leader.window == (N + 1, N + 1)
        assert isinstance(a, Rejected)
        assert (a.error.window_min, a.error.window_max) == (N + 1, N + 1)
    else:
        assert leader.window == (N, N + 1)
        assert a == Admitted(N, 1, (N, N + 1), new_epoch=False)
        leader.land(a)
    leader.land(b)
    assert leader.state.max_applied_epoch == N + 1


def test_strict_mode_admits_only_the_newest_epoch_even_after_recovery() -> None:
    leader = Leader(mode=FenceMode.STRICT)
    leader.write(N)
    leader.write(N + 3)
    assert leader.state.applied_window == (N, N + 3)
    assert leader.window == (N + 3, N + 3)
    for epoch in (N, N + 1, N + 2):
        assert isinstance(leader.try_fence(epoch), Rejected)
    assert isinstance(leader.try_fence(N + 3), Admitted)
    successor = Leader(state=leader.state, term=2, mode=FenceMode.STRICT)
    assert successor.window == (N + 3, N + 3)
    assert isinstance(successor.try_fence(N), Rejected)
