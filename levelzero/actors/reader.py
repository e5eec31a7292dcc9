"""The read path: offsets <= LRO come from L1 objects, offsets above LRO from L0 extents.

An L0 read registers with its partition and pins `M(p)` at the value it captured until it is
done, so the GC cannot delete an object it is about to range-read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from levelzero.core.errors import InvalidInput, OffsetOutOfRange
from levelzero.core.l0format import decode_extent
from levelzero.storage.protocols import LogStore, ObjectStore

from .partition import PartitionActor

FETCH_RECORDS_MAX = 10_000
FETCH_BYTES_MAX = 16 * 1024 * 1024
PLACEHOLDERS_PER_READ = 64


@dataclass(frozen=True, slots=True)
class FetchedRecord:
    offset: int
    key: bytes | None
    value: bytes


@dataclass(frozen=True, slots=True)
class FetchResult:
    records: list[FetchedRecord]
    next_offset: int
    high_watermark: int
    start_offset: int
    tier: str  # "l0" | "l1" | "none"


class L1Source(Protocol):
    async def fetch(
        self, actor: PartitionActor, offset: int, max_bytes: int, upto: int
    ) -> list[FetchedRecord]: ...


class Reader:
    def __init__(self, object_store: ObjectStore, log_store: LogStore) -> None:
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
            out: list[FetchedRecord] = []
            size = 0
            for record in placeholders:
                if record.base_offset >= hwm:
                    break  # durable but not applied yet: not readable
                p = record.entry
                data = await self._objects.get(p.object_key, p.byte_offset, p.byte_length)
                where = f"{actor.name} log offset {record.log_offset} ({p.object_key})"
                decoded = decode_extent(data, p.checksum, p.record_count, where)
                for i, r in enumerate(decoded):
                    at = record.base_offset + i
                    if at < offset:
                        continue
                    if out and (size + len(r.value) > max_bytes or len(out) >= FETCH_RECORDS_MAX):
                        return out
                    out.append(FetchedRecord(at, r.key, r.value))
                    size += len(r.value) + len(r.key or b"")
            return out
        finally:
            actor.release_reader(reader_id)
