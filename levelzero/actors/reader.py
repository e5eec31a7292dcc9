"""The read path: offsets <= LRO come from L1 objects, offsets above LRO from L0 extents.

An L0 read registers with its partition and pins `M(p)` at the value it captured until it is
done, so the GC cannot delete an object it is about to range-read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from levelzero.core.errors import InvalidInput, OffsetOutOfRange, OffsetsAbandoned
from levelzero.core.l0format import Record, decode_extent
from levelzero.storage.protocols import ObjectStore, PartitionLog

from .partition import PartitionActor

FETCH_RECORDS_MAX = 10_000
FETCH_BYTES_MAX = 16 * 1024 * 1024
PLACEHOLDERS_PER_READ = 64


@dataclass(frozen=True, slots=True)
class FetchedRecord:
    offset: int
    key: bytes | None
    value: bytes
    timestamp_ms: int = -1  # -1: none (written over HTTP without one, or before format 2)
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(frozen=True, slots=True)
class FetchResult:
    records: list[FetchedRecord]
    next_offset: int
    high_watermark: int
    start_offset: int
    tier: str  # "l0" | "l1" | "none"


class FetchWindow:
    """Collects the records of one fetch, extent by extent: from `offset` to `upto`, until
    `max_bytes` or FETCH_RECORDS_MAX (always at least one record). One rule for L0 and L1."""

    __slots__ = ("offset", "upto", "max_bytes", "records", "size", "full")

    def __init__(self, offset: int, upto: int, max_bytes: int) -> None:
        self.offset = offset
        self.upto = upto
        self.max_bytes = max_bytes
        self.records: list[FetchedRecord] = []
        self.size = 0
        self.full = False

    def add_extent(self, base_offset: int, records: list[Record]) -> bool:
        """Take what fits from an extent whose first record is at `base_offset`; False once full."""
        for i, r in enumerate(records):
            at = base_offset + i
            if at < self.offset:
                continue
            if at > self.upto:
                self.full = True
                break
            if self.records and (
                self.size + len(r.value) > self.max_bytes or len(self.records) >= FETCH_RECORDS_MAX
            ):
                self.full = True
                break
            self.records.append(FetchedRecord(at, r.key, r.value, r.timestamp_ms, r.headers))
            self.size += len(r.value) + len(r.key or b"")
        return not self.full


class L1Source(Protocol):
    async def fetch(
        self, actor: PartitionActor, offset: int, max_bytes: int, upto: int
    ) -> list[FetchedRecord]: ...


class Reader:
    def __init__(self, object_store: ObjectStore, log_store: PartitionLog) -> None:
        self._objects = object_store
        self._log = log_store
        self.l1: L1Source | None = None  # set by the reconciler issue's wiring
        self.l0_reads = 0
        self.l1_reads = 0

    async def fetch(self, actor: PartitionActor, offset: int, max_bytes: int) -> FetchResult:
        if not 1 <= max_bytes <= FETCH_BYTES_MAX:
            raise InvalidInput(f"max_bytes must be in 1..{FETCH_BYTES_MAX}")
        state = actor.state
        hwm, start, lro = state.high_watermark, state.start_offset, state.lro
        if offset < start or offset > hwm:
            raise OffsetOutOfRange(offset, start, hwm)
        if offset == hwm:
            return FetchResult([], offset, hwm, start, "none")
        abandoned = state.abandoned_range(offset)
        if abandoned is not None:
            raise OffsetsAbandoned(offset, *abandoned, start, hwm)
        if offset <= lro and self.l1 is not None:
            self.l1_reads += 1
            records = await self.l1.fetch(actor, offset, max_bytes, lro)
            tier = "l1"
        else:
            records = await self._fetch_l0(actor, offset, max_bytes, hwm)
            tier = "l0"
        next_offset = records[-1].offset + 1 if records else offset
        return FetchResult(records, next_offset, hwm, start, tier)

    async def _fetch_l0(
        self, actor: PartitionActor, offset: int, max_bytes: int, hwm: int
    ) -> list[FetchedRecord]:
        self.l0_reads += 1
        reader_id, _ = actor.register_reader()
        try:
            placeholders = await self._log.read_placeholders(
                actor.row.pid, offset, PLACEHOLDERS_PER_READ
            )
            window = FetchWindow(offset, hwm - 1, max_bytes)
            for record in placeholders:
                if record.base_offset >= hwm:
                    break  # durable but not applied yet: not readable
                p = record.entry
                data = await self._objects.get(p.object_key, p.byte_offset, p.byte_length)
                where = f"{actor.name} log offset {record.log_offset} ({p.object_key})"
                decoded = decode_extent(data, p.checksum, p.record_count, where)
                if not window.add_extent(record.base_offset, decoded):
                    break
            return window.records
        finally:
            actor.release_reader(reader_id)
