"""The read path: offsets <= LRO come from L1 objects, offsets above LRO from L0 extents.

An L0 read registers with its partition and pins `M(p)` at the value it captured until it is
done, so the GC cannot delete an object it is about to range-read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from levelzero.core.entries import Placeholder
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
    value: bytes | None  # None: a null value (a Kafka tombstone), not an empty one
    timestamp_ms: int = -1  # -1: none (written over HTTP without one, or before format 2)
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(frozen=True, slots=True)
class FetchResult:
    records: list[FetchedRecord]
    next_offset: int
    high_watermark: int
    start_offset: int
    tier: str  # "l1" | "l0" | "l1+l0" | "none"


class FetchWindow:
    """Collects the records of one fetch, extent by extent and object by object, L1 then L0:
    contiguous offsets from `offset` up to `upto`, until `max_bytes` (a record's key and value
    count) or FETCH_RECORDS_MAX (always at least one record). One rule for L0 and L1.

    `stopped` says why it takes no more: "full", "upto" (past `upto`; `extend_to` goes on),
    or "gap" (an extent does not follow on from the records taken: the offsets between are
    elsewhere, and a fetch never skips over offsets)."""

    __slots__ = ("offset", "upto", "max_bytes", "records", "size", "stopped")

    def __init__(self, offset: int, upto: int, max_bytes: int) -> None:
        assert 0 <= offset <= upto and max_bytes >= 1, (offset, upto, max_bytes)
        self.offset = offset
        self.upto = upto
        self.max_bytes = max_bytes
        self.records: list[FetchedRecord] = []
        self.size = 0
        self.stopped: str | None = None

    @property
    def next_offset(self) -> int:
        """The offset the fetch goes on from."""
        return self.records[-1].offset + 1 if self.records else self.offset

    def extend_to(self, upto: int) -> None:
        """Go on past the old `upto` (from L1 into L0), unless stopped for another reason."""
        assert upto >= self.upto, (upto, self.upto)
        self.upto = upto
        if self.stopped == "upto" and self.next_offset <= upto:
            self.stopped = None

    def add_extent(self, base_offset: int, records: list[Record]) -> bool:
        """Take what fits from an extent whose first record is at `base_offset`; False once
        stopped."""
        assert self.stopped is None, self.stopped
        wanted = self.next_offset
        if base_offset > wanted:
            self.stopped = "gap"
            return False
        for i in range(wanted - base_offset, len(records)):
            at = base_offset + i
            if at > self.upto:
                self.stopped = "upto"
                break
            r = records[i]
            size = len(r.value or b"") + len(r.key or b"")
            if self.records and (self.size + size > self.max_bytes or len(self.records) >= FETCH_RECORDS_MAX):
                self.stopped = "full"
                break
            self.records.append(FetchedRecord(at, r.key, r.value, r.timestamp_ms, r.headers))
            self.size += size
        if self.stopped is None and self.next_offset > self.upto:
            self.stopped = "upto"
        first = self.records[0].offset if self.records else self.offset
        assert first == self.offset and self.next_offset - first == len(self.records)
        return self.stopped is None


class L1Source(Protocol):
    async def fill(self, actor: PartitionActor, window: FetchWindow) -> None: ...


class Reader:
    def __init__(self, object_store: ObjectStore, log_store: PartitionLog) -> None:
        self._objects = object_store
        self._log = log_store
        self.l1: L1Source | None = None  # set by the reconciler issue's wiring
        self.l0_reads = 0
        self.l1_reads = 0

    async def fetch(self, actor: PartitionActor, offset: int, max_bytes: int) -> FetchResult:
        """Records from `offset` up to `max_bytes`, across objects and tiers: the L1 objects
        up to the LRO, then (budget left) the L0 extents above it, as a Kafka fetch fills its
        budget across segments. `tier` says which served it: `l1`, `l0`, or `l1+l0`."""
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
        tiers = []
        if offset <= lro and self.l1 is not None:
            self.l1_reads += 1
            tiers.append("l1")
            window = FetchWindow(offset, lro, max_bytes)
            await self.l1.fill(actor, window)
            window.extend_to(hwm - 1)
        else:
            window = FetchWindow(offset, hwm - 1, max_bytes)
        taken = len(window.records)
        if window.stopped is None:
            await self._fill_l0(actor, window, hwm)
            if len(window.records) > taken or not tiers:
                tiers.append("l0")
        return FetchResult(window.records, window.next_offset, hwm, start, "+".join(tiers))

    async def _fill_l0(self, actor: PartitionActor, window: FetchWindow, hwm: int) -> None:
        """Go on in L0 from the window's next offset: placeholders page by page, extent by
        extent, until the window stops or the log ends. Not at all after L1 when the reconciler
        moved the LRO past the window meanwhile: those L0 objects may be collected already,
        and the next fetch reads them from L1."""
        reader_id, _ = actor.register_reader()  # pins M(p) before any placeholder is read
        try:
            if window.records and window.next_offset <= actor.state.lro:
                return
            self.l0_reads += 1
            more = True
            while more and window.stopped is None:
                placeholders = await self._log.read_placeholders(
                    actor.row.pid, window.next_offset, PLACEHOLDERS_PER_READ
                )
                more = len(placeholders) == PLACEHOLDERS_PER_READ
                for record in placeholders:
                    if record.base_offset >= hwm:
                        more = False  # durable but not applied yet: not readable
                        break
                    p = record.entry
                    assert isinstance(p, Placeholder), record
                    data = await self._objects.get(p.object_key, p.byte_offset, p.byte_length)
                    where = f"{actor.name} log offset {record.log_offset} ({p.object_key})"
                    decoded = decode_extent(data, p.checksum, p.record_count, where)
                    if not window.add_extent(record.base_offset, decoded):
                        break
        finally:
            actor.release_reader(reader_id)
