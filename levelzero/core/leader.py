"""The partition leader's protocol, sans-IO: what the partition actor (and the batcher and the
housekeeper around it) decide, as pure functions and plain objects.

The actors wait, move messages and do I/O; every rule they apply is here, where a unit test
drives it without an event loop and the simulation breaks it from outside
(levelzero/sim/mutations.py) to show its checks catch each one:

- `FenceDispatch`: fence dispatch around `core.fence.Fence` — admitted, refused, waiting
  behind the updater, the updater sliding once the old window is drained;
- `object_epoch`: the epoch an L0 object is stamped with (the GC's cap relies on it);
- `AppendQueue`: reservation of log offsets at admission, then in-order apply once durable
  (a write's read unit is released only when its placeholder is applied);
- `control_refusal`: a control entry (catch-up, start offset) names the term it expects;
- `validate_control`: a catch-up or start offset must lie inside what the log holds;
- `WatermarkBoard`: published `M(p)` of every partition, only ever rising;
- `advance_epoch_needed`, `catch_up_needed`: the housekeeper's condition for an idle partition;
- `l1_collect_reason`: why the leader collects an L1 object (or keeps it).

A single write's fence decision is `levelzero.core.fence.Fence`; the state machine is
`levelzero.core.state.PartitionState`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Generic, Protocol, TypeVar

import msgspec

from .entries import (
    AbandonUnreconciled,
    AdvanceReconciledOffset,
    Entry,
    LogRecord,
    Placeholder,
    SetStartOffset,
)
from .errors import InvalidInput, NotLeader, StaleClusterEpoch
from .fence import Admitted, BecomeUpdater, Fence, Rejected, Wait, Window
from .state import PartitionState

T = TypeVar("T")

PENDING_RECORDS_MAX = 65_536  # reserved records not yet applied, per partition


def object_epoch(cached_epoch: int, creation_epochs: Iterable[int]) -> int:
    """The epoch an L0 object is stamped with: the node's cached cluster epoch, raised to the
    creation epoch of every partition with data inside. The GC's cap (`M <= E - 1`) protects a
    partition created after a round's snapshot only because its objects' epochs are >= its
    creation epoch >= that round's `E`."""
    assert cached_epoch >= 1, cached_epoch
    return max([cached_epoch, *creation_epochs])


# ---------------------------------------------------------------- reservation, in-order apply


class Reserved(msgspec.Struct, Generic[T]):
    """One per write: a msgspec struct is made in C (a slots dataclass's `__init__` cost
    four times as much)."""

    record: LogRecord
    token: T  # whatever the caller answers when the record is applied (a reply)
    holds_read_unit: bool


class AppendQueue(Generic[T]):
    """Log offsets are reserved at admission, in admission order; records are applied to the
    state strictly in log order once the log store says they are durable.

    Because the order is fixed at admission, every write admitted under a window is before, in
    the log, every write admitted after the next slide; the drain before a slide is what makes
    "applied" mean "the old window is in the log" for the updater.
    """

    __slots__ = ("next_log_offset", "projected_hwm", "_pending")

    def __init__(self, state: PartitionState) -> None:
        self.next_log_offset = state.next_log_offset
        self.projected_hwm = state.high_watermark
        # A deque only while something is pending (an idle partition's queue costs nothing).
        self._pending: deque[Reserved[T]] | tuple[()] = ()

    def __len__(self) -> int:
        return len(self._pending)

    def __iter__(self) -> Iterator[Reserved[T]]:
        return iter(self._pending)

    def reserve(self, term: int, entry: Entry, token: T, *, holds_read_unit: bool) -> LogRecord:
        """Give `entry` the next log offset (and a placeholder the next data offsets)."""
        assert len(self._pending) < PENDING_RECORDS_MAX, "pending appends exceed their bound"
        record = LogRecord(self.next_log_offset, term, self.projected_hwm, entry)
        self.next_log_offset += 1
        if isinstance(entry, Placeholder):
            self.projected_hwm += entry.record_count
        if not self._pending:
            self._pending = deque()
        self._pending.append(Reserved(record, token, holds_read_unit))
        return record

    def durable(self, upto: int, state: PartitionState, fence: Fence) -> list[Reserved[T]]:
        """Everything reserved up to log offset `upto` is durable: apply it in log order,
        release its read units, and return it (to be answered) in that order."""
        done: list[Reserved[T]] = []
        pending = self._pending
        units = 0  # read units to release: once for the batch, not a call per record
        try:
            while pending and pending[0].record.log_offset <= upto:
                reserved = pending.popleft()
                applied = state.apply(reserved.record)
                assert applied, reserved.record
                units += reserved.holds_read_unit
                done.append(reserved)
        finally:
            if units:
                fence.release(units)
        if not pending:
            self._pending = ()
        return done

    def drop_all(self) -> list[Reserved[T]]:
        """The appends will never be durable (deposed, stopped): forget them, oldest first."""
        dropped = list(self._pending)
        self._pending = ()
        return dropped


# ---------------------------------------------------------------- control entries


def control_refusal(name: str, expected_term: int | None, term: int) -> NotLeader | None:
    """A control entry sent for another term than the leader's current one is refused: a
    catch-up from a reconciler of an earlier term (a zombie) must not move LRO under this
    term's lineage. `None` means the sender does not care (operator tools)."""
    if expected_term is not None and expected_term != term:
        return NotLeader(name, expected_term, term)
    return None


def validate_control(
    name: str, entry: Entry, projected_hwm: int, next_log_offset: int
) -> InvalidInput | None:
    """A catch-up (or an operator's abandon) or a start offset must lie inside what the log
    holds, reserved records included."""
    match entry:
        case AdvanceReconciledOffset(lro=lro, lrlo=lrlo) | AbandonUnreconciled(upto=lro, lrlo=lrlo):
            if not -1 <= lro < projected_hwm:
                return InvalidInput(f"{name}: lro {lro} outside [-1, {projected_hwm - 1}]")
            if not -1 <= lrlo < next_log_offset:
                return InvalidInput(f"{name}: lrlo {lrlo} outside [-1, {next_log_offset - 1}]")
        case SetStartOffset(offset=offset):
            if not 0 <= offset <= projected_hwm:
                return InvalidInput(f"{name}: start offset {offset} outside [0, {projected_hwm}]")
        case _:
            raise AssertionError(f"not a control entry: {entry!r}")
    return None


# ---------------------------------------------------------------- the watermark board


class WatermarkBoard:
    """Published `M(p)` of every partition. A value only ever rises; a stale read is safe.

    A partition is registered (with no value) before its creation epoch is chosen, so a GC round
    that snapshots the board from then on sees it and deletes nothing until it has a value."""

    def __init__(self) -> None:
        self._values: dict[str, int | None] = {}

    def register(self, name: str) -> None:
        self._values.setdefault(name, None)

    def forget(self, name: str) -> None:
        """The partition is led elsewhere now (a cluster): its successor publishes its M(p)."""
        self._values.pop(name, None)

    def publish(self, name: str, value: int | None) -> bool:
        old = self._values.get(name)
        if value is None or (old is not None and value <= old):
            return False
        self._values[name] = value
        return True

    def get(self, name: str) -> int | None:
        return self._values.get(name)

    def snapshot(self) -> dict[str, int | None]:
        return dict(self._values)


# ---------------------------------------------------------------- the housekeeper


class RetainedObject(Protocol):
    """What retention reads of a valid L1 object (`L1Row`)."""

    @property
    def last_offset(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def created_at(self) -> float: ...


def advance_epoch_needed(state: PartitionState, cluster_epoch: int) -> int | None:
    """An idle partition takes the current cluster epoch when it is above everything applied
    (a partition without any epoch yet gets its first one)."""
    if state.max_applied_epoch is None or cluster_epoch > state.max_applied_epoch:
        return cluster_epoch
    return None


def catch_up_needed(state: PartitionState) -> tuple[int, int] | None:
    """With nothing left unreconciled, a catch-up to the last log offset moves the lower bound,
    if the entry that opened the window is not reconciled yet (else nothing would move)."""
    if state.has_unreconciled_data:
        return None  # the reconciler's catch-up will move the lower bound
    last = state.last_applied_log_offset
    window_offset = state.epoch_window_offset
    if window_offset is not None and state.lrlo < window_offset <= last:
        return state.high_watermark - 1, last
    return None


# ---------------------------------------------------------------- L1 objects


def l1_collect_reason(
    state: PartitionState,
    term: int,
    *,
    row_term: int,
    last_offset: int,
    lineage_valid: bool,
    copy_finished: bool,
    delete_started: bool,
    stale_copy: bool,
    start_moved_by: str | None = None,
) -> str | None:
    """Why the leader of `term` collects an L1 object of its partition, or None to keep it.

    `lineage_valid`: COPY_FINISHED and within the term lineage (`state.l1_range_valid`);
    `stale_copy`: COPY_STARTED for longer than the copy deadline (a crash or a stuck upload
    abandoned it). An out-of-lineage object is collected only when an earlier term wrote it:
    never by age in the current term, whose catch-up may still be on the way (deleting first
    would let LRO advance over a deleted object). `start_moved_by`: what moved the start offset
    past the object (retention, DeleteRecords), None where the leader does not know (it moved
    before this node took the lead in this term: a restart, a move)."""
    if delete_started:
        return "resuming an unfinished delete"
    if stale_copy:
        return "stale COPY_STARTED"
    if copy_finished:
        if last_offset < state.start_offset:
            if start_moved_by is None:
                return (
                    "below the start offset (moved by retention or DeleteRecords before this node "
                    "took the lead)"
                )
            return f"below the start offset (moved by {start_moved_by})"
        if not lineage_valid and row_term < term:
            return f"outside the term lineage (term {row_term})"
    return None


# ---------------------------------------------------------------- fence dispatch


# One of these per write: msgspec structs, made in C (a named tuple's `__new__` is a Python
# function: eight times the cost; a frozen dataclass's `__init__` more still).
class Admit(msgspec.Struct, Generic[T], frozen=True):
    token: T
    epoch: int
    admitted: Admitted


class Refuse(msgspec.Struct, Generic[T], frozen=True):
    token: T
    epoch: int
    error: StaleClusterEpoch


Outcome = Admit[T] | Refuse[T]


class FenceDispatch(Generic[T]):
    """Who is admitted, refused, waits, or becomes the updater, and when the slide happens.

    Around one `Fence` (which decides a single write): writes that must wait while an updater
    slides the window are queued here, one updater at a time; the slide happens only once the
    fence is drained (every read unit of the old window released: its writes applied), then
    every waiting write is offered again against the new window (newer epochs coalesce: one of
    them may become the next updater). Outcomes come back in admission order, which is the
    order their log offsets must be reserved in.
    """

    __slots__ = ("fence", "_waiting", "_updater")

    def __init__(self, fence: Fence) -> None:
        self.fence = fence
        self._waiting: list[tuple[int, T]] = []  # appended and taken whole: no deque needed
        self._updater: tuple[int, T] | None = None

    @property
    def sliding(self) -> bool:
        """An updater waits for the old window to drain (`slide_if_drained` may admit)."""
        return self._updater is not None

    @property
    def waiting(self) -> int:
        """Writes held here: queued behind an updater, and the updater itself."""
        return len(self._waiting) + (self._updater is not None)

    def offer(self, epoch: int, token: T, term: int, applied_window: Window | None) -> list[Outcome[T]]:
        decided = self.admit(epoch, token, term, applied_window)
        if type(decided) is Admitted:
            return [Admit(token, epoch, decided)]
        assert type(decided) is list, decided
        return decided

    def admit(
        self, epoch: int, token: T, term: int, applied_window: Window | None
    ) -> Admitted | list[Outcome[T]]:
        """`offer`, with the common case (`token` admitted at once, nothing else moving) as
        the fence's `Admitted` itself: no outcome and no list to build for each write."""
        decision = self.fence.try_fence(epoch, term, applied_window)
        if type(decision) is Admitted:  # the common case, before the match's checks
            return decision
        match decision:
            case Admitted():
                return [Admit(token, epoch, decision)]
            case Rejected(error=error):
                return [Refuse(token, epoch, error)]
            case Wait():
                self._waiting.append((epoch, token))
                return []
            case BecomeUpdater():
                assert self._updater is None, "two updaters at once"
                self._updater = (epoch, token)
                return self.slide_if_drained(term, applied_window)
        raise AssertionError(f"unknown fence decision {decision!r}")

    def slide_if_drained(self, term: int, applied_window: Window | None) -> list[Outcome[T]]:
        """Call whenever read units were released: the updater slides once none is left."""
        if self._updater is None or not self.fence.drained:
            return []
        (epoch, token), self._updater = self._updater, None
        outcomes: list[Outcome[T]] = [Admit(token, epoch, self.fence.complete_slide(term, applied_window))]
        waiting, self._waiting = self._waiting, []
        for waiting_epoch, waiting_token in waiting:
            outcomes.extend(self.offer(waiting_epoch, waiting_token, term, applied_window))
        return outcomes

    def abandon(self) -> list[T]:
        """Give up every held write (stopping, deposed): the updater abandons its slide."""
        tokens = [token for _, token in self._waiting]
        self._waiting.clear()
        if self._updater is not None:
            tokens.append(self._updater[1])
            self._updater = None
            self.fence.abandon_update()
        return tokens
