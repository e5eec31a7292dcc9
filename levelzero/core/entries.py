"""Partition log entries: one frozen msgspec Struct per kind, one tagged union, one codec.

A log record is `(log_offset, term, base_offset, entry)`. `base_offset` is the partition's high
watermark just before the record applies: for a placeholder it is the data offset of its first
record, so stores can index placeholders by data offset without replaying the state machine.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec


class ProducerSpan(msgspec.Struct, frozen=True, array_like=True):
    """An idempotent Kafka producer's batch inside a placeholder's extent: committed with the
    data, so a retry after a crash is recognised even if the sequence table missed it."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    first_record: int  # index of its first record in the extent


class Placeholder(msgspec.Struct, frozen=True, tag="placeholder", omit_defaults=True):
    """Points at one partition's extent inside a shared L0 object; assigns offsets on apply."""

    epoch: int
    object_key: str
    byte_offset: int
    byte_length: int
    record_count: int
    checksum: int
    # Idempotent producers' batches in the extent (entries written before this field have none).
    producers: tuple[ProducerSpan, ...] = ()
    # The largest record timestamp in the extent (-1: no record has one), so ListOffsets by
    # time reads only the extent that holds its answer. None: written before the field
    # existed; a lookup then reads the extent to find out (`core/time_lookup.py`).
    max_timestamp_ms: int | None = None


class AdvanceEpoch(msgspec.Struct, frozen=True, tag="advance_epoch"):
    """Advances the applied epoch without data (housekeeper; first epoch of a new partition)."""

    epoch: int


class AdvanceReconciledOffset(msgspec.Struct, frozen=True, tag="advance_reconciled_offset"):
    """Reconciler catch-up: data up to `lro` (log up to `lrlo`) now lives in L1."""

    lro: int
    lrlo: int


class SetStartOffset(msgspec.Struct, frozen=True, tag="set_start_offset"):
    """Retention: data below `offset` is no longer readable."""

    offset: int


class AbandonUnreconciled(msgspec.Struct, frozen=True, tag="abandon_unreconciled"):
    """An operator's escape hatch for a partition whose L0 data is gone for good: the data
    offsets above LRO up to `upto` are given up (unreadable from now on) and LRO/LRLO move as
    a catch-up would, so `M(p)` can rise again. The entry is the audit record: who, why, when."""

    upto: int  # the last data offset given up (the high watermark - 1 when it was asked)
    lrlo: int  # the log offset of the last entry applied when it was asked
    operator: str
    reason: str
    at: float  # wall time it was asked


class TermStart(msgspec.Struct, frozen=True, tag="term_start"):
    """Leadership marker: the first entry a new leader writes."""

    term: int


Entry = (
    Placeholder | AdvanceEpoch | AdvanceReconciledOffset | SetStartOffset | TermStart | AbandonUnreconciled
)

ENTRY_KINDS: dict[type, str] = {
    Placeholder: "placeholder",
    AdvanceEpoch: "advance_epoch",
    AdvanceReconciledOffset: "advance_reconciled_offset",
    SetStartOffset: "set_start_offset",
    TermStart: "term_start",
    AbandonUnreconciled: "abandon_unreconciled",
}


class LogRecord(msgspec.Struct, frozen=True):
    """One durable entry of a partition log."""

    log_offset: int
    term: int
    base_offset: int
    entry: Entry

    @property
    def kind(self) -> str:
        return ENTRY_KINDS[type(self.entry)]

    @property
    def epoch(self) -> int | None:
        match self.entry:
            case Placeholder(epoch=e) | AdvanceEpoch(epoch=e):
                return e
        return None


_entry_encoder = msgspec.msgpack.Encoder()
_entry_decoder: msgspec.msgpack.Decoder[Entry] = msgspec.msgpack.Decoder(Entry)


# The encoder's own method: one call per appended record, no Python frame around it.
encode_entry: Callable[[Entry], bytes] = _entry_encoder.encode


def decode_entry(data: bytes) -> Entry:
    """Decode an entry; raises `msgspec.DecodeError`/`ValidationError` on corrupt bytes."""
    return _entry_decoder.decode(data)
