"""The partition state machine: everything that changes a partition's replicated state lives here.

It is fed log records in log order and knows nothing about sockets, files or tasks (sans-IO, like
h11's `_state.py`). Replaying the same log from any snapshot gives the same state; applying a
record at or below `last_applied_log_offset` is a no-op, so replay is idempotent per log offset.

The GC safety argument rests on one inequality, asserted here and attacked by the tests:
every admitted epoch `e` satisfies `e >= previous_applied >= min_epoch_lower_bound > M(p)`.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from .entries import (
    AbandonUnreconciled,
    AdvanceEpoch,
    AdvanceReconciledOffset,
    LogRecord,
    Placeholder,
    SetStartOffset,
    TermStart,
)
from .errors import InvariantViolation
from .producers import PartitionProducers, ProducerRow


class PartitionSnapshot(msgspec.Struct, frozen=True):
    """Everything the state machine persists. The fence's seen window is deliberately absent:
    after recovery the window collapses to the applied one (windowed-fencing seed)."""

    creation_epoch: int
    last_applied_log_offset: int = -1
    term: int = 0
    max_applied_epoch: int | None = None
    previous_applied_epoch: int | None = None
    min_epoch_lower_bound: int | None = None
    epoch_window_offset: int | None = None
    lro: int = -1
    lrlo: int = -1
    start_offset: int = 0
    high_watermark: int = 0
    size_bytes: int = 0
    # Term lineage of reconciliation (leader-epoch seed): the highest LRO each term recorded.
    # An L1 object of term t counts only if its last offset is <= reconciled_by_term[t].
    reconciled_by_term: dict[int, int] = msgspec.field(default_factory=dict)
    # Data offset ranges [first, last] an operator gave up (AbandonUnreconciled): never
    # readable again. Empty in snapshots written before the entry existed.
    abandoned: tuple[tuple[int, int], ...] = ()
    # (term, first data offset) of each term that may hold records, oldest first: Kafka's
    # leader-epoch cache, the partition's term being its leader epoch (KIP-320). Empty in
    # snapshots written before it existed (records before its first entry have no epoch).
    term_starts: tuple[tuple[int, int], ...] = ()
    # Idempotent producers' last batches, from the placeholders' producer spans
    # (`core.producers.PartitionProducers.rows`). Empty in snapshots written before it existed.
    producers: tuple[ProducerRow, ...] = ()

    @property
    def first_readable_offset(self) -> int:
        return first_readable_offset(self.start_offset, self.abandoned)


def first_readable_offset(start_offset: int, abandoned: tuple[tuple[int, int], ...]) -> int:
    """The first offset a fetch can serve (or the high watermark when none): the start offset,
    past the ranges an operator abandoned that begin there. It is the partition's start as
    readers are told it (Kafka's ListOffsets EARLIEST, the HTTP fetch without an offset, status),
    so a consumer starting from the earliest offset does not land in a range it can never read."""
    offset = start_offset
    for first, last in sorted(abandoned):
        if first <= offset <= last:
            offset = last + 1
    return offset


# The oldest term starts beyond this many are forgotten (their records read with no epoch).
TERM_STARTS_MAX = 1_000

_snapshot_encoder = msgspec.msgpack.Encoder()
_snapshot_decoder = msgspec.msgpack.Decoder(PartitionSnapshot)


def lower_bound_after_catch_up(previous_applied: int, max_applied: int) -> int:
    """Where `min_epoch_lower_bound` moves once the reconciled log reaches the entry that opened
    the applied window: to the window's lower edge, never to its top. A write admitted at the
    lower edge may still be in flight, and its object must keep an epoch above `M(p)`."""
    assert previous_applied <= max_applied, (previous_applied, max_applied)
    return previous_applied


class PartitionState:
    """Deterministic state of one partition, built only by `apply`."""

    __slots__ = (
        "creation_epoch",
        "last_applied_log_offset",
        "term",
        "max_applied_epoch",
        "previous_applied_epoch",
        "min_epoch_lower_bound",
        "epoch_window_offset",
        "lro",
        "lrlo",
        "start_offset",
        "high_watermark",
        "size_bytes",
        "reconciled_by_term",
        "abandoned",
        "term_starts",
        "producers",
    )
    # Set by _restore from a PartitionSnapshot, whose fields these are.
    creation_epoch: int
    last_applied_log_offset: int
    term: int
    max_applied_epoch: int | None
    previous_applied_epoch: int | None
    min_epoch_lower_bound: int | None
    epoch_window_offset: int | None
    lro: int
    lrlo: int
    start_offset: int
    high_watermark: int
    size_bytes: int
    reconciled_by_term: dict[int, int]
    abandoned: tuple[tuple[int, int], ...]
    term_starts: tuple[tuple[int, int], ...]
    producers: PartitionProducers

    def __init__(self, creation_epoch: int) -> None:
        assert creation_epoch >= 1, creation_epoch
        self._restore(PartitionSnapshot(creation_epoch=creation_epoch))

    # ------------------------------------------------------------------ derived values

    @property
    def next_log_offset(self) -> int:
        return self.last_applied_log_offset + 1

    @property
    def mp(self) -> int | None:
        """`M(p)`: the partition's safe-to-GC epoch, None until the partition has an epoch."""
        if self.min_epoch_lower_bound is None:
            return None
        return self.min_epoch_lower_bound - 1

    @property
    def applied_window(self) -> tuple[int, int] | None:
        if self.max_applied_epoch is None:
            return None
        assert self.previous_applied_epoch is not None
        return (self.previous_applied_epoch, self.max_applied_epoch)

    def l1_range_valid(self, term: int, base_offset: int, last_offset: int) -> bool:
        """Is an L1 object of `term` covering [base, last] part of the term lineage?

        It must lie within what its term recorded, and above what every earlier term recorded
        (a zombie's late object claiming more than its term's recorded end is rejected,
        whatever the arrival order)."""
        end = self.reconciled_by_term.get(term)
        if end is None or last_offset > end:
            return False
        earlier = [e for t, e in self.reconciled_by_term.items() if t < term]
        return base_offset > max(earlier, default=-1)

    @property
    def first_readable_offset(self) -> int:
        return first_readable_offset(self.start_offset, self.abandoned)

    def abandoned_range(self, offset: int) -> tuple[int, int] | None:
        """The range an operator gave up that holds `offset`, if any."""
        for first, last in self.abandoned:
            if first <= offset <= last:
                return (first, last)
        return None

    @property
    def has_unreconciled_data(self) -> bool:
        return self.lro + 1 < self.high_watermark

    # ------------------------------------------------------------------ apply

    def apply(self, record: LogRecord) -> bool:
        """Apply one record. Returns False if it was already applied (idempotent replay)."""
        if record.log_offset <= self.last_applied_log_offset:
            return False
        if record.log_offset != self.last_applied_log_offset + 1:
            raise InvariantViolation(
                f"log gap: record at {record.log_offset}, last applied {self.last_applied_log_offset}"
            )
        if record.base_offset != self.high_watermark:
            raise InvariantViolation(
                f"record at log offset {record.log_offset} claims base offset "
                f"{record.base_offset}, high watermark is {self.high_watermark}"
            )
        if record.term < self.term:
            raise InvariantViolation(
                f"record at log offset {record.log_offset} has term {record.term} "
                f"below the current term {self.term}"
            )
        offset = record.log_offset
        match record.entry:
            case Placeholder() as p:
                assert p.record_count >= 1, p
                assert p.byte_length >= 0 and p.byte_offset >= 0, p
                if p.epoch != self.max_applied_epoch:  # (at the window's top: nothing moves)
                    self._advance_applied_epoch(p.epoch, offset)
                for span in p.producers:
                    self.producers.append(
                        span.producer_id,
                        span.producer_epoch,
                        span.base_sequence,
                        span.record_count,
                        self.high_watermark + span.first_record,
                    )
                self.high_watermark += p.record_count
                self.size_bytes += p.byte_length
            case AdvanceEpoch(epoch=epoch):
                self._advance_applied_epoch(epoch, offset)
            case AdvanceReconciledOffset(lro=lro, lrlo=lrlo):
                self._advance_reconciled(lro, lrlo, offset)
                if lro > self.reconciled_by_term.get(record.term, -1) and lro > _end_before(
                    self.reconciled_by_term, record.term
                ):
                    # (An end at or below an earlier term's validates no object of this term,
                    # whose objects must start above it, and bounds no later term: a term that
                    # reconciled nothing new, each restart's or move's, grew the map for ever.)
                    self.reconciled_by_term = {**self.reconciled_by_term, record.term: lro}
            case SetStartOffset(offset=start):
                assert start <= self.high_watermark, (start, self.high_watermark)
                self.start_offset = max(self.start_offset, start)
                self.term_starts = _truncated_from_start(self.term_starts, self.start_offset)
                # Lineage below the start offset can no longer validate anything readable,
                # but the newest entry stays: it bounds the next term's range from below.
                newest = max(self.reconciled_by_term, default=None)
                self.reconciled_by_term = {
                    t: end
                    for t, end in self.reconciled_by_term.items()
                    if end >= self.start_offset or t == newest
                }
            case AbandonUnreconciled(upto=upto, lrlo=lrlo):
                # What is still unreconciled up to `upto` when it applies (a catch-up may have
                # landed since it was asked) is given up. LRO/LRLO move exactly as a catch-up's
                # would, so the lower bound still moves only to `previous_applied` once LRLO
                # reaches the window's entry: a write in flight at the window's lower edge keeps
                # its object (the GC inequality is untouched). No term claims these offsets in
                # the L1 lineage: no L1 object holds them.
                if upto > self.lro:
                    self.abandoned = (*self.abandoned, (self.lro + 1, upto))
                self._advance_reconciled(upto, lrlo, offset)
            case TermStart(term=term):
                if term <= self.term:
                    raise InvariantViolation(f"TermStart({term}) does not raise term {self.term}")
                assert term == record.term, (term, record.term)
                # As Kafka's epoch cache assigns an epoch: a term that wrote nothing is dropped.
                kept = tuple(e for e in self.term_starts if e[1] < record.base_offset)
                self.term_starts = (*kept[-(TERM_STARTS_MAX - 1) :], (term, record.base_offset))
            case _:
                raise InvariantViolation(f"unknown entry {record.entry!r}")
        if record.term > self.term:
            self.term = record.term
        self.last_applied_log_offset = offset
        return True

    def _advance_applied_epoch(self, epoch: int, log_offset: int) -> None:
        if epoch < self.creation_epoch:
            raise InvariantViolation(
                f"epoch {epoch} at log offset {log_offset} is below the creation epoch {self.creation_epoch}"
            )
        if self.max_applied_epoch is None:
            self.max_applied_epoch = epoch
            self.previous_applied_epoch = epoch
            self.min_epoch_lower_bound = epoch
            self.epoch_window_offset = log_offset
            return
        assert self.previous_applied_epoch is not None
        if epoch > self.max_applied_epoch:
            self.previous_applied_epoch = self.max_applied_epoch
            self.max_applied_epoch = epoch
            self.epoch_window_offset = log_offset
        elif epoch < self.previous_applied_epoch:
            # The log invariant: the fence never admits an epoch below the window.
            raise InvariantViolation(
                f"epoch {epoch} applied at log offset {log_offset} is below the window "
                f"[{self.previous_applied_epoch}, {self.max_applied_epoch}]"
            )
        assert self.min_epoch_lower_bound is not None
        assert self.min_epoch_lower_bound <= self.previous_applied_epoch <= self.max_applied_epoch

    def _advance_reconciled(self, lro: int, lrlo: int, log_offset: int) -> None:
        if lro >= self.high_watermark:
            raise InvariantViolation(
                f"catch-up at log offset {log_offset} claims lro {lro} "
                f"beyond the high watermark {self.high_watermark}"
            )
        if lrlo >= log_offset:
            raise InvariantViolation(
                f"catch-up at log offset {log_offset} claims lrlo {lrlo} at or beyond itself"
            )
        self.lro = max(self.lro, lro)
        self.lrlo = max(self.lrlo, lrlo)
        if self.epoch_window_offset is None or self.lrlo < self.epoch_window_offset:
            return
        assert self.previous_applied_epoch is not None and self.min_epoch_lower_bound is not None
        # Reconciled through the entry that opened the window: everything older is in L1, and
        # any write still in flight has an epoch >= previous_applied (the window's lower edge).
        assert self.max_applied_epoch is not None
        target = lower_bound_after_catch_up(self.previous_applied_epoch, self.max_applied_epoch)
        before = self.min_epoch_lower_bound
        self.min_epoch_lower_bound = max(before, target)
        assert self.min_epoch_lower_bound >= before

    # ------------------------------------------------------------------ leader epochs

    def term_at(self, offset: int) -> int:
        """The term (leader epoch) that wrote the record at `offset`; -1 if unknown."""
        term = -1
        for t, start in self.term_starts:
            if start > offset:
                break
            term = t
        return term

    def term_end_offset(self, term: int) -> tuple[int, int]:
        """Kafka's OffsetForLeaderEpoch on the leader (LeaderEpochFileCache.endOffsetFor, the
        high watermark as log end offset): (the largest term <= `term` that wrote records, the
        first offset after them), (`term`, the high watermark) for the current term, (-1, -1)
        for -1 or a term above the current one."""
        if term == self.term:
            return term, self.high_watermark
        higher = next(((t, start) for t, start in self.term_starts if t > term), None)
        if term < 0 or higher is None:
            return -1, -1
        floor = [t for t, _ in self.term_starts if t <= term]
        return (floor[-1] if floor else term), higher[1]

    # ------------------------------------------------------------------ snapshots

    def to_snapshot(self) -> PartitionSnapshot:
        return PartitionSnapshot(
            creation_epoch=self.creation_epoch,
            last_applied_log_offset=self.last_applied_log_offset,
            term=self.term,
            max_applied_epoch=self.max_applied_epoch,
            previous_applied_epoch=self.previous_applied_epoch,
            min_epoch_lower_bound=self.min_epoch_lower_bound,
            epoch_window_offset=self.epoch_window_offset,
            lro=self.lro,
            lrlo=self.lrlo,
            start_offset=self.start_offset,
            high_watermark=self.high_watermark,
            size_bytes=self.size_bytes,
            reconciled_by_term=dict(self.reconciled_by_term),
            abandoned=self.abandoned,
            term_starts=self.term_starts,
            producers=self.producers.rows(),
        )

    @classmethod
    def from_snapshot(cls, snapshot: PartitionSnapshot) -> PartitionState:
        state = cls(snapshot.creation_epoch)
        state._restore(snapshot)
        return state

    def _restore(self, s: PartitionSnapshot) -> None:
        for name in PartitionSnapshot.__struct_fields__:
            setattr(self, name, getattr(s, name))
        self.reconciled_by_term = dict(s.reconciled_by_term)
        self.producers = PartitionProducers.from_rows(s.producers)

    def encode_snapshot(self) -> bytes:
        return _snapshot_encoder.encode(self.to_snapshot())

    @classmethod
    def decode_snapshot(cls, data: bytes) -> PartitionState:
        return cls.from_snapshot(_snapshot_decoder.decode(data))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PartitionState):
            return NotImplemented
        return self.to_snapshot() == other.to_snapshot()

    def __repr__(self) -> str:
        return f"PartitionState({self.to_snapshot()!r})"


class ReaderPins:
    """Active L0 readers of one partition. Each reader pins `M(p)` at the value it captured, so
    the *published* watermark is `min(M(p), pins)`. It never decreases: a new pin captures the
    state's `M(p)`, which is >= the published value at that moment."""

    __slots__ = ("_pins", "_next_id", "_published")

    def __init__(self) -> None:
        self._pins: dict[int, int] = {}
        self._next_id = 0
        self._published: int | None = None

    def register(self, state_mp: int | None) -> tuple[int, int | None]:
        """Pin the current `M(p)`. Returns (reader id, pinned value); None pins nothing."""
        reader_id = self._next_id
        self._next_id += 1
        if state_mp is not None:
            self._pins[reader_id] = state_mp
        return reader_id, state_mp

    def release(self, reader_id: int) -> None:
        self._pins.pop(reader_id, None)

    @property
    def active(self) -> int:
        return len(self._pins)

    def pinned_below(self, state_mp: int | None) -> int | None:
        """The lowest pin, if it holds the published value below the state's `M(p)`."""
        if not self._pins or state_mp is None:
            return None
        low = min(self._pins.values())
        return low if low < state_mp else None

    def published(self, state_mp: int | None) -> int | None:
        """`M(p)` as the GC may see it. Asserts monotonicity across calls."""
        if state_mp is None:
            assert self._published is None, "M(p) cannot go back to unknown"
            return None
        value = min(state_mp, *self._pins.values()) if self._pins else state_mp
        if self._published is not None and value < self._published:
            raise InvariantViolation(f"published M(p) fell from {self._published} to {value}")
        self._published = value
        return value


def _truncated_from_start(
    term_starts: tuple[tuple[int, int], ...], start_offset: int
) -> tuple[tuple[int, int], ...]:
    """Kafka's truncateFromStart: terms wholly below the log start are dropped; the one holding
    it starts there."""
    below = [i for i, (_, start) in enumerate(term_starts) if start <= start_offset]
    if not below:
        return term_starts
    i = below[-1]
    return ((term_starts[i][0], start_offset), *term_starts[i + 1 :])


def _end_before(reconciled_by_term: Mapping[int, int], term: int) -> int:
    """The largest end an earlier term than `term` reconciled to (-1: none)."""
    return max((end for t, end in reconciled_by_term.items() if t < term), default=-1)
