"""PartitionActor: the windowed fence under real interleavings, leadership, M(p), snapshots.

The integration scenarios of the windowed-fencing seed (000) are driven through `actor.write`.
A write is held "in flight" between its fence and its durability by `GatedLogStore`, whose
appends wait at a gate the test opens. Orchestration is by events and by stepping the event loop
until a named condition holds (`wait_until`), never by sleeping.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import msgspec
import pytest

from levelzero.actors.partition import PartitionActor, WatermarkBoard
from levelzero.core.entries import AdvanceEpoch, LogRecord
from levelzero.core.errors import (
    LevelZeroError,
    NotLeader,
    ShuttingDown,
    StaleClusterEpoch,
    StorageError,
)
from levelzero.core.fence import FenceMode
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.protocols import PartitionRow
from levelzero.testing.entries import placeholder
from levelzero.testing.nodes import submit, wait_until
from levelzero.testing.virtual_time import in_virtual_time

N = 5  # the "current" cluster epoch of the scenarios


class GatedLogStore(MemoryLogStore):
    """A MemoryLogStore whose appends wait at a gate while it is closed."""

    def __init__(self) -> None:
        super().__init__()
        self._gate: anyio.Event | None = None
        self.held = anyio.Event()  # set once an append waits at the closed gate

    def close_gate(self) -> None:
        assert self._gate is None
        self._gate = anyio.Event()
        self.held = anyio.Event()

    def open_gate(self) -> None:
        assert self._gate is not None
        gate, self._gate = self._gate, None
        gate.set()

    async def append(self, pid: int, expected_term: int, records: Sequence[LogRecord]) -> None:
        gate = self._gate
        if gate is not None:
            self.held.set()
            await gate.wait()
        await super().append(pid, expected_term, records)


class RecordingBoard(WatermarkBoard):
    """Keeps every value the board accepted, per partition."""

    def __init__(self) -> None:
        super().__init__()
        self.history: dict[str, list[int]] = {}

    def publish(self, name: str, value: int | None) -> bool:
        accepted = super().publish(name, value)
        if accepted:
            assert value is not None
            self.history.setdefault(name, []).append(value)
        return accepted


@dataclass
class Outcome:
    """The result of a write running in its own task."""

    done: anyio.Event = field(default_factory=anyio.Event)
    record: LogRecord | None = None
    error: LevelZeroError | None = None


def spawn_write(tg: anyio.abc.TaskGroup, actor: PartitionActor, entry) -> Outcome:
    outcome = Outcome()

    async def run() -> None:
        try:
            outcome.record = await actor.write(entry)
        except LevelZeroError as exc:
            outcome.error = exc
        finally:
            outcome.done.set()

    tg.start_soon(run)
    return outcome


async def new_partition(store: MemoryLogStore, creation_epoch: int = 1) -> PartitionRow:
    (row,) = await store.create_topic("t", 1, creation_epoch, 0.0)
    return row


@asynccontextmanager
async def running(
    store: MemoryLogStore, row: PartitionRow, board: WatermarkBoard | None = None, **kwargs
) -> AsyncIterator[tuple[PartitionActor, anyio.abc.TaskGroup]]:
    """An actor running in its own task group; stopped when the block ends normally."""
    actor = PartitionActor(row, store, board or WatermarkBoard(), **kwargs)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(actor.run)
            yield actor, tg
            await actor.stop()


def window(actor: PartitionActor) -> tuple[int, int] | None:
    return actor.view().fence.window


# ----------------------------------------------------------------- seed scenario (a): slow writer


@in_virtual_time
async def test_newer_epoch_waits_for_in_flight_write_then_both_succeed() -> None:
    store = GatedLogStore()
    row = await new_partition(store)
    async with running(store, row) as (actor, tg):
        await actor.write(placeholder(N))
        assert window(actor) == (N, N)

        store.close_gate()
        a = spawn_write(tg, actor, placeholder(N))
        await store.held.wait()  # A is admitted; its placeholder is not durable yet
        b = spawn_write(tg, actor, placeholder(N + 1))
        await wait_until(lambda: actor.fence.updater_epoch == N + 1, "B becomes the updater")

        assert not b.done.is_set(), "B must wait until A's placeholder is durable and applied"
        assert actor.fence.read_units == 1  # A's read unit
        assert window(actor) == (N, N)
        assert actor.state.max_applied_epoch == N

        store.open_gate()
        await a.done.wait()
        await b.done.wait()

    assert a.error is None and b.error is None
    assert a.record is not None and b.record is not None
    assert a.record.log_offset < b.record.log_offset  # the old window drained first
    assert (a.record.epoch, b.record.epoch) == (N, N + 1)
    assert window(actor) == (N, N + 1)
    assert actor.state.applied_window == (N, N + 1)
    assert actor.fence.read_units == 0
    assert actor.view().fence.window_slides == 2


@pytest.mark.parametrize(
    ("mode", "late_write_admitted"),
    [(FenceMode.WINDOWED, True), (FenceMode.STRICT, False)],
)
@in_virtual_time
async def test_previous_epoch_arriving_after_newer_one_completed(
    mode: FenceMode, late_write_admitted: bool
) -> None:
    """The seed's failure scenario: B (N+1) completes first, then A (N) fences. Windowed keeps
    A; the strict baseline rejects it although A was valid when it started."""
    store = MemoryLogStore()
    row = await new_partition(store)
    async with running(store, row, fencing_mode=mode) as (actor, _):
        await actor.write(placeholder(N))
        b_record = await actor.write(placeholder(N + 1))
        assert b_record.epoch == N + 1
        if late_write_admitted:
            a_record = await actor.write(placeholder(N))
            assert a_record.log_offset == b_record.log_offset + 1
            assert window(actor) == (N, N + 1)
        else:
            with pytest.raises(StaleClusterEpoch) as rejected:
                await actor.write(placeholder(N))
            assert (rejected.value.window_min, rejected.value.window_max) == (N + 1, N + 1)
            assert window(actor) == (N + 1, N + 1)
    assert actor.state.applied_window == (N, N + 1)


@in_virtual_time
async def test_strict_mode_rejects_previous_epoch_once_slow_write_let_the_window_slide() -> None:
    """Scenario (a) in strict mode: the slow writer A and its successor B both succeed, but a
    second write of A's epoch fencing after B slid the window is rejected."""
    store = GatedLogStore()
    row = await new_partition(store)
    async with running(store, row, fencing_mode=FenceMode.STRICT) as (actor, tg):
        await actor.write(placeholder(N))
        store.close_gate()
        a = spawn_write(tg, actor, placeholder(N))
        await store.held.wait()
        b = spawn_write(tg, actor, placeholder(N + 1))
        await wait_until(lambda: actor.fence.updater_epoch == N + 1, "B becomes the updater")
        assert not b.done.is_set()
        store.open_gate()
        await b.done.wait()
        late = spawn_write(tg, actor, placeholder(N))
        await late.done.wait()
    assert a.error is None and b.error is None
    assert isinstance(late.error, StaleClusterEpoch)
    assert (late.error.window_min, late.error.window_max) == (N + 1, N + 1)


# ----------------------------------------------------------------- seed scenario (b): rapid epochs


@in_virtual_time
async def test_rapid_epochs_leave_a_window_of_the_last_two() -> None:
    store = MemoryLogStore()
    row = await new_partition(store)
    async with running(store, row) as (actor, _):
        for epoch in range(N, N + 4):
            await actor.write(placeholder(epoch))
        assert window(actor) == (N + 2, N + 3)

        assert (await actor.write(placeholder(N + 2))).epoch == N + 2
        assert (await actor.write(placeholder(N + 3))).epoch == N + 3
        for stale in (N + 1, N, N - 1):
            with pytest.raises(StaleClusterEpoch) as rejected:
                await actor.write(placeholder(stale))
            error = rejected.value
            assert (error.epoch, error.window_min, error.window_max) == (stale, N + 2, N + 3)
        stats = actor.view().fence
    assert stats.window_slides == 4
    assert stats.stale_rejections == 3
    assert stats.last_rejected_gap == (N + 2) - (N - 1)
    assert actor.state.applied_window == (N + 2, N + 3)
    assert actor.state.high_watermark == 6
    rejected_events = [e for e in store.fence_events if e.outcome == "rejected"]
    assert [e.epoch for e in rejected_events] == [N + 1, N, N - 1]


@in_virtual_time
async def test_epoch_below_creation_epoch_is_rejected_on_a_new_partition() -> None:
    store = MemoryLogStore()
    row = await new_partition(store, creation_epoch=N)
    async with running(store, row) as (actor, _):
        with pytest.raises(StaleClusterEpoch) as rejected:
            await actor.write(placeholder(N - 1))
        assert (rejected.value.window_min, rejected.value.window_max) == (N, N)
        assert (await actor.write(placeholder(N))).epoch == N


# ----------------------------------------------------------------- seed scenario (c): restart


@in_virtual_time
async def test_actor_stopped_during_epoch_transition_recovers_applied_window() -> None:
    store = GatedLogStore()
    row = await new_partition(store)
    async with running(store, row) as (first, tg):
        await first.write(placeholder(N))
        store.close_gate()
        a = spawn_write(tg, first, placeholder(N + 1))  # slides to [N, N+1], not durable yet
        await store.held.wait()
        b = spawn_write(tg, first, placeholder(N + 2))
        await wait_until(lambda: first.fence.updater_epoch == N + 2, "B becomes the updater")
        stopped = anyio.Event()

        async def stop() -> None:
            await first.stop()
            stopped.set()

        tg.start_soon(stop)
        await b.done.wait()  # the waiting updater is refused at once
        assert isinstance(b.error, ShuttingDown)
        assert not stopped.is_set(), "stop waits for the write in flight"
        store.open_gate()
        await stopped.wait()
    assert a.error is None and a.record is not None
    assert first.term == 1

    async with running(store, row) as (second, _):
        assert second.term == 2
        assert second.state.applied_window == (N, N + 1)
        assert window(second) == second.state.applied_window
        assert (await second.write(placeholder(N))).epoch == N  # the lower edge still counts
        with pytest.raises(StaleClusterEpoch) as rejected:
            await second.write(placeholder(N - 1))
        assert (rejected.value.window_min, rejected.value.window_max) == (N, N + 1)
        assert (await second.write(placeholder(N + 2))).epoch == N + 2
        assert window(second) == (N + 1, N + 2)


@in_virtual_time
async def test_actor_crashed_after_unlogged_slide_recovers_window_from_the_log() -> None:
    """The dead leader slid its in-memory window to [N+1, N+2] but the write that opened it
    never reached the log; the new leader judges by the log's window [N, N+1]."""
    store = GatedLogStore()
    row = await new_partition(store)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as doomed:
            first = PartitionActor(row, store, WatermarkBoard())
            await doomed.start(first.run)
            await first.write(placeholder(N))
            await first.write(placeholder(N + 1))
            store.close_gate()
            spawn_write(doomed, first, placeholder(N + 2))
            await store.held.wait()
            assert window(first) == (N + 1, N + 2)
            with pytest.raises(StaleClusterEpoch):
                await first.write(placeholder(N))  # the dead leader's seen window
            doomed.cancel_scope.cancel()  # crash: the held append never lands
        store.open_gate()
    assert [r.epoch for r in store.logs[row.pid] if r.epoch is not None] == [N, N + 1]

    async with running(store, row) as (second, _):
        assert second.term == first.term + 1
        assert window(second) == second.state.applied_window == (N, N + 1)
        assert (await second.write(placeholder(N))).epoch == N


# ----------------------------------------------------------------- coalescing, leadership


@in_virtual_time
async def test_ten_concurrent_writes_with_the_same_newer_epoch_slide_once() -> None:
    store = GatedLogStore()
    row = await new_partition(store)
    async with running(store, row) as (actor, tg):
        await actor.write(placeholder(N))
        slides_before = actor.view().fence.window_slides
        store.close_gate()
        holder = spawn_write(tg, actor, placeholder(N))
        await store.held.wait()
        writes = [spawn_write(tg, actor, placeholder(N + 1)) for _ in range(10)]
        await wait_until(
            lambda: actor.fence.updater_epoch == N + 1 and actor._dispatch.waiting == 10,
            "one updater and nine waiters (ten held)",
        )
        assert not any(w.done.is_set() for w in writes)
        store.open_gate()
        for outcome in [holder, *writes]:
            await outcome.done.wait()
        stats = actor.view().fence
    assert all(w.error is None for w in writes)
    assert stats.window_slides - slides_before == 1
    assert stats.new_epoch_fences == slides_before + 1
    assert stats.window == (N, N + 1)
    offsets = sorted(w.record.log_offset for w in writes if w.record is not None)
    assert offsets == list(range(offsets[0], offsets[0] + 10))


@in_virtual_time
async def test_new_leader_deposes_the_old_one() -> None:
    store = MemoryLogStore()
    row = await new_partition(store)
    async with running(store, row) as (old, _):
        await old.write(placeholder(N))
        async with running(store, row) as (new, _):
            assert (old.term, new.term) == (1, 2)
            with pytest.raises(NotLeader) as deposed:
                await old.write(placeholder(N))
            assert (deposed.value.expected_term, deposed.value.current_term) == (1, 2)
            with pytest.raises(NotLeader):  # and it stays deposed
                await old.catch_up(-1, -1)

            with pytest.raises(NotLeader) as wrong_term:
                await new.catch_up(0, 1, term=old.term)
            assert wrong_term.value.expected_term == 1
            record = await new.write(placeholder(N))
            caught_up = await new.catch_up(record.base_offset, record.log_offset, term=new.term)
            assert caught_up.term == 2
    terms = [r.term for r in store.logs[row.pid]]
    assert terms == sorted(terms)


@in_virtual_time
async def test_a_new_leader_whose_term_start_races_the_old_leaders_append_replays_it() -> None:
    """In a cluster the old leader's last append may land between the new leader's replay and
    its `TermStart` (found by the cluster simulation, seed 18): the store refuses the term start
    as `LogMovedOn`; the new leader replays that append too and starts its term after it."""
    store = MemoryLogStore()
    row = await new_partition(store)
    async with running(store, row) as (old, _):
        await old.write(placeholder(N))
        landed: list[int] = []

        begin_term = store.begin_term

        async def racing_begin_term(pid: int, log_offset: int, base_offset: int) -> LogRecord:
            if not landed:  # the old leader's append lands first
                landed.append((await old.write(placeholder(N, records=3))).log_offset)
            return await begin_term(pid, log_offset, base_offset)

        store.begin_term = racing_begin_term  # type: ignore[method-assign]
        async with running(store, row) as (new, _):
            assert new.term == 2
            assert new.state.high_watermark == 4  # the raced append's records are its own
            assert new.state.last_applied_log_offset == landed[0] + 1  # its TermStart, after
    terms = [r.term for r in store.logs[row.pid]]
    assert terms == [1, 1, 1, 2]


# ----------------------------------------------------------------- M(p), reader pins


@in_virtual_time
async def test_published_mp_rises_with_catch_up_and_is_held_by_a_reader_pin() -> None:
    store = MemoryLogStore()
    row = await new_partition(store)
    board = RecordingBoard()
    async with running(store, row, board) as (actor, _):
        assert board.get(actor.name) is None  # no epoch yet
        await actor.write(placeholder(N))
        assert board.get(actor.name) == N - 1
        await actor.write(placeholder(N + 1))
        last = await actor.write(placeholder(N + 2))
        assert actor.state.applied_window == (N + 1, N + 2)

        reader_id, pinned = actor.register_reader()
        assert pinned == N - 1
        await actor.catch_up(actor.state.high_watermark - 1, last.log_offset, term=actor.term)
        assert actor.state.mp == N  # min_epoch_lower_bound moved to previous_applied = N+1
        assert board.get(actor.name) == N - 1, "the reader pin holds the published value"
        assert actor.view().pinned_mp == N - 1

        assert not board.publish(actor.name, N - 2), "the board never goes back"
        actor.release_reader(reader_id)
        assert board.get(actor.name) == N
        assert actor.view().readers == 0

        last = await actor.write(placeholder(N + 3))
        await actor.catch_up(actor.state.high_watermark - 1, last.log_offset, term=actor.term)
        assert board.get(actor.name) == N + 1
    history = board.history[actor.name]
    assert history == [N - 1, N, N + 1]
    assert history == sorted(history)


@in_virtual_time
async def test_published_mp_never_decreases_across_leaders() -> None:
    store = MemoryLogStore()
    row = await new_partition(store)
    board = RecordingBoard()
    async with running(store, row, board) as (actor, _):
        for epoch in (N, N + 1, N + 2):
            last = await actor.write(placeholder(epoch))
        await actor.catch_up(actor.state.high_watermark - 1, last.log_offset)
    async with running(store, row, board) as (again, _):
        assert again.state.mp == N
        assert board.get(again.name) == N
        await again.write(placeholder(N + 3))
    assert board.history[actor.name] == [N - 1, N]


# ----------------------------------------------------------------- snapshots and replay


@in_virtual_time
async def test_new_actor_recovers_identical_state_from_snapshot_and_log() -> None:
    store = MemoryLogStore()
    row = await new_partition(store)
    async with running(store, row, snapshot_every_records=4, log_keep_records=3) as (first, _):
        epoch = N
        for i in range(60):
            if i % 9 == 0:
                epoch += 1
            if i % 13 == 12:
                await first.write(AdvanceEpoch(epoch))
            last = await first.write(placeholder(epoch, records=1 + i % 3))
            if i % 7 == 6:
                await first.catch_up(first.state.high_watermark - 1, last.log_offset, first.term)
            if i == 40:
                await first.set_start_offset(10, first.term)
        await first.write(placeholder(epoch))  # one more append: the latest snapshot is saved
    before = first.state.to_snapshot()
    snapshot = store.snapshots[row.pid]
    assert snapshot.log_offset > 0
    assert store.first_offset[row.pid] > 0, "the log was truncated: replay needs the snapshot"

    async with running(store, row) as (second, _):
        after = second.state.to_snapshot()
    assert after == msgspec.structs.replace(
        before,
        term=before.term + 1,
        last_applied_log_offset=before.last_applied_log_offset + 1,
        term_starts=(*before.term_starts, (before.term + 1, before.high_watermark)),  # its leader epoch
    )
    assert after.lro >= 0 and after.start_offset == 10 and after.min_epoch_lower_bound > N


class _FailingAppends(MemoryLogStore):
    """A log store that fails every append after `ok` of them, as a dead disk would."""

    def __init__(self, ok: int) -> None:
        super().__init__()
        self.ok = ok

    async def append(self, pid: int, expected_term: int, records: Sequence[LogRecord]) -> None:
        if self.ok <= 0:
            raise StorageError("injected: the log store's disk is gone")
        self.ok -= 1
        await super().append(pid, expected_term, records)


class _BrokenOnDurable(MemoryLogStore):
    """Appends are stored, then raise an AssertionError, as an invariant broken on the way back
    would: it reaches the actor's own task (its appender), not a sender's."""

    async def append(self, pid: int, expected_term: int, records: Sequence[LogRecord]) -> None:
        await super().append(pid, expected_term, records)
        raise AssertionError("injected: an invariant broken after the append")


@pytest.mark.parametrize(
    ("store_type", "error", "match"),
    [
        (lambda: _FailingAppends(ok=0), StorageError, "disk is gone"),
        (_BrokenOnDurable, AssertionError, "invariant broken"),
    ],
    ids=["failing-log-store", "invariant-broken-in-the-actors-task"],
)
@in_virtual_time
async def test_an_actor_crashing_in_its_own_task_leaves_nobody_waiting(
    store_type: Callable[[], MemoryLogStore], error: type[BaseException], match: str
) -> None:
    """A failing log store, or an invariant broken in the actor's own task (its appender),
    crashes the actor and its task group (restart replays); every caller still gets an answer,
    the writes in flight and the ones still queued, and later senders are refused at once."""
    store = store_type()
    (row,) = await store.create_topic("t", 1, creation_epoch=1, now=0.0)
    actor = PartitionActor(row, store, WatermarkBoard())
    answers: list[str] = []

    async def writer(n: int) -> None:
        try:
            await actor.write(placeholder(1))
            answers.append("written")
        except ShuttingDown:
            answers.append("refused")

    with anyio.fail_after(10):
        async with anyio.create_task_group() as callers:
            with pytest.raises(BaseExceptionGroup) as crashed:  # noqa: PT012 (a task group's)
                async with anyio.create_task_group() as tg:
                    await tg.start(actor.run)
                    for n in range(20):
                        callers.start_soon(writer, n)
            assert crashed.group_contains(error, match=match)
    assert answers == ["refused"] * 20
    with pytest.raises(ShuttingDown):
        await actor.write(placeholder(1))


# ----------------------------------------------------------------- delivery (handled on the sender)


@in_virtual_time
async def test_writes_sent_during_the_replay_are_handled_in_order_before_later_ones() -> None:
    """Before ready, writes queue in the mailbox; once ready they are handled first, in the
    order sent, and a write sent after ready is handled behind them (log order = send order)."""
    store = MemoryLogStore()
    (row,) = await store.create_topic("t", 1, creation_epoch=1, now=0.0)
    actor = PartitionActor(row, store, WatermarkBoard())
    early = [await submit(actor, placeholder(N, records=n + 1)) for n in range(5)]
    assert not any(reply.done for reply in early)  # nobody handles them before the replay
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(actor.run)
            late = await submit(actor, placeholder(N, records=9))
            records = [await reply.wait() for reply in early] + [await late.wait()]
            await actor.stop()
    offsets = [r.log_offset for r in records]
    assert offsets == sorted(offsets) and len(set(offsets)) == 6
    assert [r.entry.record_count for r in records] == [1, 2, 3, 4, 5, 9]
    bases = [r.base_offset for r in records]
    assert bases == [0, 1, 3, 6, 10, 15]  # each continues where the one sent before it ended


@in_virtual_time
async def test_a_write_after_ready_is_handled_at_once_on_the_senders_task() -> None:
    """From ready on, a write is fenced and reserved when it is sent, before the sender's
    next await: the window is there without a turn of the event loop."""
    store = GatedLogStore()
    row = await new_partition(store)
    async with running(store, row) as (actor, _):
        store.close_gate()
        reply = await submit(actor, placeholder(N))
        assert window(actor) == (N, N)  # no checkpoint between the submit and this line
        assert actor.view().pending_records == 1
        await wait_until(lambda: store.held.is_set(), "the append waits at the gate")
        store.open_gate()
        record = await reply.wait()
        assert record.entry.epoch == N


@in_virtual_time
async def test_a_handler_raising_on_a_senders_task_crashes_the_actor_and_answers_the_sender(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A handler that raises while it runs on a sender's task never leaves the actor half
    alive: the sender is told the partition failed, the actor's own task ends with the error
    (its task group, the node's, crashes), and what is sent after that is refused."""
    store = MemoryLogStore()
    (row,) = await store.create_topic("t", 1, creation_epoch=1, now=0.0)
    actor = PartitionActor(row, store, WatermarkBoard())
    real = PartitionActor._on_write

    def broken(self: PartitionActor, msg: object) -> None:
        if msg.epoch == 3:  # type: ignore[attr-defined]
            raise AssertionError("injected: an invariant broken in a handler")
        real(self, msg)

    monkeypatch.setattr(PartitionActor, "_on_write", broken)
    with anyio.fail_after(10):
        with pytest.raises(BaseExceptionGroup) as crashed:  # noqa: PT012 (a task group's)
            async with anyio.create_task_group() as tg:
                await tg.start(actor.run)
                await actor.write(placeholder(1))  # handled inline, fine
                with pytest.raises(ShuttingDown, match="failed"):
                    await actor.write(placeholder(3))
                with pytest.raises(ShuttingDown):
                    await actor.write(placeholder(1))  # queued behind the crash, then refused
        assert crashed.group_contains(AssertionError, match="broken in a handler")
