"""One actor per partition: owns its state machine, its fence and the order of its log.

Messages are handled one at a time and a handler never awaits, so every decision of the fence
and every state transition is atomic. From ready on, a message is handled on its sender's task
the moment it is sent (the event loop runs one handler at a time; see `_inline`); before that
(the replay) messages queue in the mailbox and are handled in order once the actor is ready.
Reserved records are written by the node's appender (`appender.Appender`), many partitions per
log-store call, one batch of a partition on its way at a time, so in log order; the appender
then hands them back (`appended`) and they are applied strictly in log order. A write's read
unit is released only after its placeholder is applied, which is what lets an updater's drain
mean "the old window is in the log". The actor's own task handles what queued in its mailbox
and saves its snapshots.

Sync (DESIGN.md fence step 1): the actor replays its whole log and applies its own `TermStart`
before it takes the first message, so the state has applied everything of previous terms.

Every rule the actor applies is sans-IO core code: the fence's decisions (`core.fence.Fence`),
reservation and in-order apply, control-entry checks and the watermark board
(`core.leader`), the state machine (`core.state`). This module waits, moves messages and
performs the appends.
"""

from __future__ import annotations

import logging
import time
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

import anyio
import msgspec

from levelzero.core.activity import ActivityBoard
from levelzero.core.entries import (
    AbandonUnreconciled,
    AdvanceEpoch,
    AdvanceReconciledOffset,
    Entry,
    LogRecord,
    Placeholder,
    SetStartOffset,
)
from levelzero.core.errors import InvariantViolation, LogMovedOn, NotLeader, ShuttingDown
from levelzero.core.fence import Admitted, Fence, FenceMode, FenceStatistics
from levelzero.core.leader import (
    Admit,
    AppendQueue,
    FenceDispatch,
    Outcome,
    Refuse,
    WatermarkBoard,
    control_refusal,
    validate_control,
)
from levelzero.core.state import PartitionSnapshot, PartitionState, ReaderPins
from levelzero.storage.protocols import FenceEventRow, LogStore, PartitionRow, Snapshot

from .appender import Appender
from .mailbox import Flag, Mailbox, Reply, Wakeup, loop_time

log = logging.getLogger("levelzero.partition")

MAILBOX_SIZE = 256
REPLAY_BATCH_RECORDS = 4_096
# A new leader's term start raced by the previous leader's appends this many times gives up
# (the previous leader stops within its lease: a few races at most).
TERM_START_ATTEMPTS_MAX = 32
FENCE_EVENTS_BUFFER_MAX = 10_000  # fence event rows (tallies) held between flushes
FENCE_EVENTS_FLUSH_AT = 1_000  # this many buffered rows are flushed at once (else per interval:
# appender.FENCE_EVENTS_FLUSH_INTERVAL_S)


# ---------------------------------------------------------------- messages


_FenceKey = tuple[int, int, str, tuple[int, int] | None]  # term, epoch, outcome, window


class Answer(Protocol):
    """What a write is answered through: a `Reply`, or a caller's own token (`post_write`).
    Answered once: `set` or `fail`, then `done`."""

    @property
    def done(self) -> bool: ...

    def set(self, value: Any) -> None: ...

    def fail(self, error: BaseException) -> None: ...


class _Write(msgspec.Struct):
    """Fence `entry`'s epoch, then append it. (One per placeholder: a msgspec struct is made
    in C.)"""

    epoch: int
    entry: Placeholder | AdvanceEpoch
    reply: Answer


@dataclass(slots=True)
class _Control:
    """An entry that needs no fence (catch-up, start offset), appended under `term`."""

    entry: Entry
    term: int | None
    reply: Reply[Any]


@dataclass(slots=True)
class _Stop:
    reply: Reply[Any]


@dataclass(frozen=True, slots=True)
class PartitionView:
    """An immutable picture of one partition for status, reads and the GC's explain."""

    name: str
    pid: int
    topic: str
    partition: int
    term: int
    state: PartitionSnapshot
    mp: int | None
    published_mp: int | None
    fence: FenceStatistics
    readers: int
    pinned_mp: int | None
    mp_changed_at: float
    pending_records: int

    @property
    def reconciler_lag(self) -> int:
        """Offsets written but not yet reconciled into L1 (status and metrics)."""
        return max(0, self.state.high_watermark - 1 - self.state.lro)


class PartitionActor:
    # Slots, not a __dict__: a node keeps one actor per partition, idle ones included
    # (10,000 of them: the dict alone was 1.5 KiB each).
    __slots__ = (
        "row",
        "name",
        "state",
        "fence",
        "pins",
        "term",
        "ready",
        "_store",
        "_board",
        "_activity",
        "_mode",
        "_snapshot_every",
        "_log_keep",
        "_record_fence_events",
        "_clock",
        "_wall",
        "_mailbox",
        "_appends",
        "_to_append",
        "_appender",
        "_own_appender",
        "_append_asked",
        "_appending",
        "_closed",
        "_snapshot_due",
        "_truncate_below",
        "_wakeup",
        "_dispatch",
        "_deposed",
        "_stopping",
        "_later_stops",
        "_last_snapshot_offset",
        "_mp_changed_at",
        "_published_mp",
        "_published_bound",
        "_fence_tallies",
        "_noted_admission",
        "_noted_tally",
        "_inline",
        "_crash",
        "_touched_in",
    )

    def __init__(
        self,
        row: PartitionRow,
        log_store: LogStore,
        board: WatermarkBoard,
        *,
        fencing_mode: FenceMode = FenceMode.WINDOWED,
        snapshot_every_records: int = 1_000,
        log_keep_records: int = 10_000,
        record_fence_events: bool = True,
        activity: ActivityBoard | None = None,
        clock: Callable[[], float] = loop_time,
        wall_clock: Callable[[], float] | None = None,
        appender: Appender | None = None,
    ) -> None:
        """`appender`: the node's, shared by its partitions; without one the actor runs its own
        (an actor on its own: tests, benchmarks)."""
        self.row = row
        self.name = f"{row.topic}/{row.partition}"
        self._store = log_store
        self._board = board
        self._activity = activity
        self._mode = FenceMode(fencing_mode)
        self._snapshot_every = snapshot_every_records
        self._log_keep = log_keep_records
        self._record_fence_events = record_fence_events
        self._clock = clock
        self._wall = wall_clock or time.time
        self._mailbox: Mailbox[object] = Mailbox(MAILBOX_SIZE)
        # From ready until it ends, a message that finds the mailbox empty is handled at once
        # on the sender's task (`_deliver`): `_handle` never awaits, so the event loop runs one
        # handler at a time, and a message that finds others queued waits behind them, so they
        # are handled in the order sent either way. A placeholder used to cost two task
        # wake-ups (its write, then its `_Durable`) and, in an idle partition, the start of an
        # appender task; now it wakes no task of the partition (the node's appender appends it).
        self._inline = False
        self._crash: BaseException | None = None
        self.state = PartitionState(row.creation_epoch)
        self.fence = Fence(row.creation_epoch, self._mode)
        self.pins = ReaderPins()
        self.term = 0
        # Reserved log offsets, applied in log order once durable (core.leader.AppendQueue).
        self._appends: AppendQueue[Answer] = AppendQueue(self.state)
        self._to_append: list[LogRecord] = []
        self._own_appender = appender is None
        # (Its own: one call at a time is all one partition can use.)
        self._appender = Appender(log_store, calls_max=1) if appender is None else appender
        self._append_asked = False  # waiting in the appender's queue
        self._appending = False  # a batch on its way: the next waits until it is back
        self._closed = False  # the actor ended: what the appender brings back is dropped
        self._snapshot_due: Snapshot | None = None
        self._truncate_below: int | None = None
        # Raised for the actor's task: messages queued, a snapshot due, a crash, or the end.
        self._wakeup = Wakeup()
        # Writes waiting behind the updater, and the updater (core.leader.FenceDispatch).
        self._dispatch: FenceDispatch[_Write] = FenceDispatch(self.fence)
        self._deposed: NotLeader | None = None
        self._stopping: _Stop | None = None
        self._later_stops: list[Reply[None]] = []
        self._last_snapshot_offset = -1
        self._mp_changed_at = -math.inf
        self._published_mp: int | None = None
        self._published_bound: int | None = None  # the state's lower bound `_publish` last saw
        self._touched_in = -1  # the activity board's round this partition was last noted in
        # Fence decisions since the last flush, one tally per (term, epoch, outcome, window):
        # [when the first was made, how many]. A row per decision was a second SQLite row per
        # placeholder; a row per tally counts them (FenceEventRow.decisions). Past
        # FENCE_EVENTS_BUFFER_MAX tallies, decisions of a new kind go unrecorded until the flush.
        # The appender writes them (`take_fence_events`).
        self._fence_tallies: dict[_FenceKey, list[float | int]] = {}
        # The last admission noted and its tally (see `_carry_out`).
        self._noted_admission: Admitted | None = None
        self._noted_tally: list[float | int] | None = None
        self.ready = Flag()
        board.register(self.name)

    # ------------------------------------------------------------------ public API (any task)

    async def write(self, entry: Placeholder | AdvanceEpoch) -> LogRecord:
        """Fence the entry's epoch and append it; the record once durable. Raises
        StaleClusterEpoch / NotLeader. (`post_write` with a `Reply`, then wait.)"""
        reply: Reply[LogRecord] = Reply()
        if not self.post_write(entry, reply):
            await self.send_write(entry, reply)
        return await reply.wait()

    def post_write(self, entry: Placeholder | AdvanceEpoch, answer: Answer) -> bool:
        """Hand over a write without waiting for it: `answer.set(record)` or `answer.fail(error)`
        is called once the write is durable or refused (maybe at once), so one task can have
        writes to many partitions in flight. No coroutine, no `Reply` of its own (the batcher's
        path: an object may carry a thousand extents). False if the mailbox is full: then
        `send_write`."""
        msg = _Write(entry.epoch, entry, answer)
        if self._inline and not self._mailbox.buffered:
            # `_deliver(self._on_write, msg)`, inline (per write): a write needs no match
            try:
                self._on_write(msg)
            except BaseException as exc:  # noqa: BLE001 - `_crashed` raises
                self._crashed(exc)
            if self._stopping is not None and self._finished():
                self._wakeup.set()  # the actor's task ends
            return True
        return self._post(msg)

    async def send_write(self, entry: Placeholder | AdvanceEpoch, answer: Answer) -> None:
        """`post_write`, waiting for room in the mailbox."""
        await self._send(_Write(entry.epoch, entry, answer))

    async def catch_up(self, lro: int, lrlo: int, term: int | None = None) -> LogRecord:
        """Append `AdvanceReconciledOffset`; `term` is the term the caller expects (None: any)."""
        reply: Reply[LogRecord] = Reply()
        await self._send(_Control(AdvanceReconciledOffset(lro, lrlo), term, reply))
        return await reply.wait()

    async def abandon_unreconciled(self, entry: AbandonUnreconciled, term: int) -> LogRecord:
        """Append an operator's `AbandonUnreconciled` under the term the operator saw."""
        reply: Reply[LogRecord] = Reply()
        await self._send(_Control(entry, term, reply))
        return await reply.wait()

    async def set_start_offset(self, offset: int, term: int | None = None) -> LogRecord:
        reply: Reply[LogRecord] = Reply()
        await self._send(_Control(SetStartOffset(offset), term, reply))
        return await reply.wait()

    async def stop(self) -> None:
        """Stop taking writes, let durable appends finish, then end the actor."""
        reply: Reply[None] = Reply()
        try:
            await self._send(_Stop(reply))
        except ShuttingDown:
            return  # stopped already
        await reply.wait()

    def register_reader(self) -> tuple[int, int | None]:
        """Pin `M(p)` for an L0 reader (event-loop thread only; atomic, no await)."""
        return self.pins.register(self.state.mp)

    def release_reader(self, reader_id: int) -> None:
        self.pins.release(reader_id)
        self._publish(pins_changed=True)

    def view(self) -> PartitionView:
        state_mp = self.state.mp
        return PartitionView(
            name=self.name,
            pid=self.row.pid,
            topic=self.row.topic,
            partition=self.row.partition,
            term=self.term,
            state=self.state.to_snapshot(),
            mp=state_mp,
            published_mp=self._board.get(self.name),
            fence=self.fence.statistics(self.term, self.state.applied_window),
            readers=self.pins.active,
            pinned_mp=self.pins.pinned_below(state_mp),
            mp_changed_at=self._mp_changed_at,
            pending_records=len(self._appends),
        )

    def take_fence_events(self) -> list[FenceEventRow]:
        """The fence decisions noted since the last call, as rows (in order of first decision)."""
        tallies, self._fence_tallies = self._fence_tallies, {}
        self._noted_admission = self._noted_tally = None  # their tally left with the rest
        pid = self.row.pid
        rows = []
        for (term, epoch, outcome, window), (at, decisions) in tallies.items():
            low, high = window if window is not None else (None, None)
            rows.append(FenceEventRow(at, pid, term, epoch, outcome, low, high, int(decisions)))
        return rows

    def _post(self, msg: object) -> bool:
        """Hand `msg` over without waiting: handled at once if nothing is queued before it,
        else queued if the mailbox has room (no coroutine, no turn of the loop); False when it
        is full (then `_send` waits)."""
        if self._inline and not self._mailbox.buffered:
            self._deliver(self._handle, msg)
            return True
        try:
            self._mailbox.send_nowait(msg)
        except anyio.WouldBlock:
            return False
        except anyio.BrokenResourceError:
            raise ShuttingDown(f"partition {self.name} is stopped") from None
        self._wakeup.set()  # queued: the actor's task handles it
        return True

    async def _send(self, msg: object) -> None:
        if self._post(msg):
            return
        try:
            await self._mailbox.send(msg)
        except anyio.BrokenResourceError:
            raise ShuttingDown(f"partition {self.name} is stopped") from None
        self._wakeup.set()

    def _deliver(self, handler: Callable[[Any], None], msg: object) -> None:
        """Handle `msg` on the sender's task (see `_inline`). If that ends the actor (a stop
        with nothing left to append) or raises (an invariant broken, a log store failing), the
        actor's own task is woken to finish, and raises what was raised: the node's task group
        crashes as when the actor's task handled the message itself; the sender is told the
        partition stopped."""
        try:
            handler(msg)
        except BaseException as exc:  # noqa: BLE001 - `_crashed` raises
            self._crashed(exc)
        if self._stopping is not None and self._finished():  # (no call per write)
            self._wakeup.set()  # the actor's task ends

    def _crashed(self, exc: BaseException) -> NoReturn:
        """A handler run on a sender's task raised (see `_deliver`)."""
        self._inline = False  # what is sent after this queues, and is refused at the end
        self._crash = exc
        self._wakeup.set()
        raise ShuttingDown(f"partition {self.name} failed: {exc!r}") from exc

    def _handle_queued(self) -> None:
        """Handle what queued in the mailbox (sent during the replay, or while it was full),
        in order; from then on messages are handled as they are sent."""
        while self._mailbox:
            self._handle(self._mailbox.receive_nowait())
        if self._crash is None:
            self._inline = True

    # ------------------------------------------------------------------ lifecycle

    async def recover(self) -> None:
        """Latest snapshot + replay, then a new term. Separate from `run` for tests."""
        await self._load_snapshot()
        for attempt in range(TERM_START_ATTEMPTS_MAX):
            await self._replay()
            try:
                record = await self._store.begin_term(
                    self.row.pid, self.state.next_log_offset, self.state.high_watermark
                )
                break
            except LogMovedOn as exc:
                # In a cluster: the previous leader's last append landed after the replay read
                # the log (its term was still current). Replay it too, then start the term.
                if attempt + 1 == TERM_START_ATTEMPTS_MAX:
                    raise
                log.info("%s: %s; replaying the rest", self.name, exc)
        else:
            raise AssertionError("unreachable")
        self.state.apply(record)
        self.term = record.term
        self._appends = AppendQueue(self.state)
        self.fence = Fence(self.row.creation_epoch, self._mode)
        self._dispatch = FenceDispatch(self.fence)
        self._publish(pins_changed=True)  # (the first publication: whatever the bound)
        log.debug("partition %s recovered at term %d: %r", self.name, self.term, self.state)

    async def _load_snapshot(self) -> None:
        """The latest snapshot, if it is ahead of the state replayed so far."""
        snap = await self._store.load_snapshot(self.row.pid)
        if snap is not None and snap.log_offset > self.state.last_applied_log_offset:
            self.state = PartitionState.decode_snapshot(snap.data)
            self._last_snapshot_offset = snap.log_offset
            assert self.state.last_applied_log_offset == snap.log_offset

    async def _replay(self) -> None:
        while True:
            records = await self._store.read_log(
                self.row.pid, self.state.next_log_offset, REPLAY_BATCH_RECORDS
            )
            if records and records[0].log_offset > self.state.next_log_offset:
                # In a cluster: the previous leader (its term still current) saved a newer
                # snapshot and truncated the log below it while this replay read (cluster
                # simulation, seed 755). A snapshot is saved before the log is truncated below
                # it, so the latest one covers the gap: go on from there.
                gap = records[0].log_offset
                await self._load_snapshot()
                if self.state.next_log_offset < gap:
                    raise InvariantViolation(
                        f"{self.name}: the log starts at {gap}, the latest snapshot ends at "
                        f"{self.state.last_applied_log_offset}"
                    )
                continue
            for record in records:
                self.state.apply(record)
            if len(records) < REPLAY_BATCH_RECORDS:
                return

    async def run(self, *, task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        if not self._own_appender:
            await self._run(task_status)
            return
        async with anyio.create_task_group() as tg:
            await tg.start(self._appender.run)
            await self._run(task_status)
            tg.cancel_scope.cancel()

    async def _run(self, task_status: anyio.abc.TaskStatus) -> None:
        await self.recover()
        try:
            self.ready.set()
            task_status.started()
            del task_status  # it holds its starter's event: not for the actor's life
            try:
                await self._serve_until_stopped()
            finally:
                # Later sends fail at once; what was sent but never taken is answered.
                self._inline = False
                self._refuse_unreceived(self._mailbox.close())
            if self._stopping is not None:
                events = self.take_fence_events()  # noted since the appender last took them
                if events:
                    await self._store.record_fence_events(events)
        finally:
            # However the actor ends (stopped, cancelled, or crashing on a failed log store),
            # nobody is left waiting for an answer.
            self._closed = True
            self._fail_all(ShuttingDown(f"partition {self.name} stopped"))
            if self._stopping is not None:
                self._stopping.reply.set(None)
            for reply in self._later_stops:
                reply.set(None)

    # ------------------------------------------------------------------ message handling

    def _handle(self, msg: object) -> None:
        match msg:
            case _Write():
                self._on_write(msg)
            case _Control():
                self._on_control(msg)
            case _Stop() if self._stopping is not None:
                self._later_stops.append(msg.reply)  # answered with the first
            case _Stop():
                self._stopping = msg
                self._fail_waiting(ShuttingDown(f"partition {self.name} is stopping"))
            case _:
                raise AssertionError(f"unknown message {msg!r}")

    def _refuse_unreceived(self, messages: list[object]) -> None:
        for msg in messages:
            if isinstance(msg, _Stop):
                self._later_stops.append(msg.reply)  # the actor stops anyway
            elif isinstance(msg, (_Write, _Control)):
                msg.reply.fail(ShuttingDown(f"partition {self.name} stopped"))

    def _refusal(self) -> Exception | None:
        if self._deposed is not None:
            return self._deposed
        if self._stopping is not None:
            return ShuttingDown(f"partition {self.name} is stopping")
        return None

    def _refused(self, reply: Answer) -> bool:
        """A deposed or stopping partition fails `reply` at once: True when it did."""
        if self._deposed is None and self._stopping is None:
            return False
        refusal = self._refusal()
        assert refusal is not None
        reply.fail(refusal)
        return True

    def _on_write(self, msg: _Write) -> None:
        if self._deposed is not None or self._stopping is not None:  # `_refused`, inline
            self._refused(msg.reply)
            return
        decided = self._dispatch.admit(msg.epoch, msg, self.term, self.state.applied_window)
        if type(decided) is Admitted:  # admitted at once: no outcome, no list (per write)
            self._admit(msg, decided)
        else:
            self._carry_out(decided)  # type: ignore[arg-type]  # (the other case: a list)

    def _maybe_slide(self) -> None:
        """Read units were released: the updater slides if the old window is drained."""
        if self._dispatch.sliding:
            self._carry_out(self._dispatch.slide_if_drained(self.term, self.state.applied_window))

    def _carry_out(self, outcomes: list[Outcome[_Write]]) -> None:
        for outcome in outcomes:
            if type(outcome) is not Admit:
                assert type(outcome) is Refuse, outcome
                error = outcome.error
                self._note_fence(outcome.epoch, "rejected", (error.window_min, error.window_max))
                outcome.token.reply.fail(error)
                continue
            self._admit(outcome.token, outcome.admitted)

    def _admit(self, msg: _Write, admitted: Admitted) -> None:
        """`msg` was admitted: tally the decision and reserve its log offset."""
        if admitted is self._noted_admission:
            # The fence hands out the same `Admitted` for the same epoch, term and window:
            # the same tally as the last admission noted (no key to build and look up).
            tally = self._noted_tally
            assert tally is not None  # noted with the admission
            tally[1] += 1
        else:
            if admitted.new_epoch:
                log.debug("partition %s window slid to %s", self.name, admitted.window)
            self._note_fence(
                msg.epoch,
                "admitted_new_epoch" if admitted.new_epoch else "admitted",
                admitted.window,
                admitted,
            )
        # `_reserve`, inline (per write)
        self._to_append.append(self._appends.reserve(self.term, msg.entry, msg.reply, holds_read_unit=True))
        if not self._append_asked and not self._appending:  # `_kick`, inline
            self._append_asked = True
            self._appender.request(self)

    def _on_control(self, msg: _Control) -> None:
        if self._refused(msg.reply):
            return
        error = control_refusal(self.name, msg.term, self.term) or validate_control(
            self.name, msg.entry, self._appends.projected_hwm, self._appends.next_log_offset
        )
        if error is not None:
            msg.reply.fail(error)
            return
        self._reserve(msg.entry, msg.reply, holds_read_unit=False)

    def _reserve(self, entry: Entry, reply: Answer, holds_read_unit: bool) -> None:
        self._to_append.append(
            self._appends.reserve(self.term, entry, reply, holds_read_unit=holds_read_unit)
        )
        if not self._append_asked and not self._appending:  # `_kick`, inline (per write)
            self._append_asked = True
            self._appender.request(self)

    # ------------------------------------------------------------------ the appender's side

    def take_append_batch(self, room: int) -> list[LogRecord]:
        """The appender takes up to `room` of the queued records, in log order; they are on
        their way until `appended`."""
        assert not self._appending, "one batch of a partition on its way at a time"
        self._append_asked = False
        if len(self._to_append) <= room:
            batch, self._to_append = self._to_append, []
        else:
            batch, self._to_append = self._to_append[:room], self._to_append[room:]
        self._appending = bool(batch)
        return batch

    def appended(self, upto: int, refused: NotLeader | None) -> None:
        """The appender's batch is durable up to log offset `upto` (or the store refused it:
        a newer term deposes the partition)."""
        self._appending = False
        if self._closed:
            return  # ended meanwhile (cancelled, crashed): its writers were answered
        if refused is not None:
            self._on_append_failed(refused)
        elif self._deposed is None:
            self._on_durable(upto)
        if self._to_append:
            self._kick()
        if self._finished():
            self._wakeup.set()  # the actor's task ends

    def _on_durable(self, upto: int) -> None:
        for done in self._appends.durable(upto, self.state, self.fence):
            done.token.set(done.record)
        self._publish()
        self._maybe_snapshot()
        self._maybe_slide()

    def _on_append_failed(self, error: Exception) -> None:
        if isinstance(error, NotLeader):
            log.warning("partition %s deposed: %s", self.name, error)
            self._deposed = error
            self._fail_all(error)
            return
        raise error  # a failing log store is not survivable: crash loudly, restart replays

    def _fail_waiting(self, error: Exception) -> None:
        for msg in self._dispatch.abandon():
            msg.reply.fail(error)

    def _fail_all(self, error: Exception) -> None:
        self._fail_waiting(error)
        for reserved in self._appends.drop_all():
            if not reserved.token.done:
                reserved.token.fail(error)
        self._to_append.clear()

    # ------------------------------------------------------------------ effects

    def _publish(self, pins_changed: bool = False) -> None:
        """The state moved: publish `M(p)` if it may have (the state's lower bound moved, or
        the pins changed: the published value is `min(M(p), pins)`), and note the partition
        on the activity board."""
        bound = self.state.min_epoch_lower_bound
        if pins_changed or bound != self._published_bound:
            self._published_bound = bound
            published = self.pins.published(self.state.mp)
            if published != self._published_mp:  # (the board holds what was published before)
                self._published_mp = published
                self._mp_changed_at = self._clock()
                self._board.publish(self.name, published)
        activity = self._activity
        if activity is not None and self._touched_in != activity.round:
            # Periodic tasks look at moved partitions only; once noted, a partition is noted
            # again only after a task took the names (`ActivityBoard.round`).
            self._touched_in = activity.round
            activity.touch(self.name)

    def _note_fence(
        self,
        epoch: int,
        outcome: str,
        window: tuple[int, int] | None,
        admitted: Admitted | None = None,
    ) -> None:
        """Tally a fence decision; `admitted`: the fence's `Admitted`, kept with its tally so
        the next admission with that same object counts at once (`_carry_out`)."""
        if not self._record_fence_events:
            return
        key = (self.term, epoch, outcome, window)
        tally = self._fence_tallies.get(key)
        if tally is not None:
            tally[1] += 1
            if admitted is not None:
                self._noted_admission, self._noted_tally = admitted, tally
            return  # its first decision since the last flush did what follows
        if len(self._fence_tallies) >= FENCE_EVENTS_BUFFER_MAX:
            return
        first = not self._fence_tallies
        tally = self._fence_tallies[key] = [self._wall(), 1]
        if admitted is not None:
            self._noted_admission, self._noted_tally = admitted, tally
        # Events are for export and analysis: the appender writes every partition's at most
        # FENCE_EVENTS_FLUSH_INTERVAL_S late, in one call (a write per batch was a second
        # store job per append), or at once when FENCE_EVENTS_FLUSH_AT rows gathered or a
        # write was rejected (rare, and what an operator looks for).
        now = outcome == "rejected" or len(self._fence_tallies) >= FENCE_EVENTS_FLUSH_AT
        if first or now:
            self._appender.note_events(self, now=now)

    def _maybe_snapshot(self) -> None:
        offset = self.state.last_applied_log_offset
        if offset - self._last_snapshot_offset < self._snapshot_every:
            return
        self._last_snapshot_offset = offset
        self._snapshot_due = Snapshot(self.row.pid, offset, self.state.encode_snapshot())
        # Keep the log a reader may still need: placeholders above LRLO, plus a margin.
        keep_from = min(offset + 1, self.state.lrlo + 1 - self._log_keep)
        if keep_from > 0:
            self._truncate_below = keep_from
        self._wakeup.set()  # the actor's task saves it

    def _finished(self) -> bool:
        """Stopping, with nothing left to append (nothing reserved, nothing on its way): the
        actor's task ends."""
        return self._stopping is not None and not self._appends

    def _kick(self) -> None:
        """There is something to append: ask the appender (once, and not while a batch is on
        its way: `appended` asks again)."""
        if not self._append_asked and not self._appending:
            self._append_asked = True
            self._appender.request(self)

    async def _serve_until_stopped(self) -> None:
        """The actor's task: handles what queued in the mailbox and saves due snapshots (then
        truncates the log below them); ends once stopping with nothing left to append, or
        raises what a handler raised."""
        while True:
            self._handle_queued()
            if self._crash is not None:
                raise self._crash
            if self._finished():
                return
            if not self._wakeup.is_set():
                await self._wakeup.wait()
                continue  # the checks above again, for what woke it
            self._wakeup.clear()
            snapshot, self._snapshot_due = self._snapshot_due, None
            truncate, self._truncate_below = self._truncate_below, None
            if snapshot is not None and self._deposed is None:
                try:
                    await self._store.save_snapshot(snapshot)
                except NotLeader as exc:  # a newer leader's snapshot is there: deposed
                    self._on_append_failed(exc)
                    continue
                if truncate is not None:
                    await self._store.truncate_below(self.row.pid, truncate)
