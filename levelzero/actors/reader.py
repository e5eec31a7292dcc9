"""The read path: offsets <= LRO come from L1 objects, offsets above LRO from L0 extents.

An L0 read registers with its partition and pins `M(p)` at the value it captured until it is
done, so the GC cannot delete an object it is about to range-read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple, Protocol

from levelzero.core.entries import LogRecord, Placeholder
from levelzero.core.errors import InvalidInput, ObjectNotFound, OffsetOutOfRange, OffsetsAbandoned
from levelzero.core.l0format import Record, decode_extent
from levelzero.core.time_lookup import NOT_FOUND, first_at_or_after, may_hold
from levelzero.storage.protocols import L1Row, PartitionLog

from .l0_cache import L0ObjectCache
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


class Run(NamedTuple):
    """Records `start` .. `stop - 1` of one extent's decoded `records`, the first of which is
    at `base_offset`: what a fetch took from that extent, without an object per record (the
    Kafka door encodes a run into one batch straight from the stored records)."""

    base_offset: int
    records: list[Record]
    start: int
    stop: int

    @property
    def first_offset(self) -> int:
        return self.base_offset + self.start


def _materialise(runs: list[Run]) -> list[FetchedRecord]:
    return [
        FetchedRecord(base + i, r.key, r.value, r.timestamp_ms, r.headers)
        for base, records, start, stop in runs
        for i, r in enumerate(records[start:stop], start)
    ]


@dataclass(frozen=True, slots=True)
class FetchResult:
    runs: list[Run]  # ascending; contiguous but for the gaps compaction left (offsets removed)
    next_offset: int
    high_watermark: int
    start_offset: int
    tier: str  # "l1" | "l0" | "l1+l0" | "none"

    @property
    def records(self) -> list[FetchedRecord]:
        """The records one by one (built on each call: the HTTP door and tests want them)."""
        return _materialise(self.runs)

    @property
    def count(self) -> int:
        return sum(stop - start for _, _, start, stop in self.runs)


class Framing(NamedTuple):
    """What a fetch's encoding adds to the bytes of the records it returns, counted against its
    `max_bytes` (`FetchWindow`): per record (a Kafka record's lengths, attributes, timestamp
    and offset deltas) and per run (a Kafka record batch's header)."""

    record: int
    run: int


UNFRAMED = Framing(0, 0)  # HTTP's rule: keys, values and headers only
HEADER_FRAMING = 2  # a header's bytes besides its key and value (Kafka: their two lengths)


class FetchWindow:
    """Collects the records of one fetch, extent by extent and object by object, L1 then L0:
    contiguous offsets from `offset` up to `upto`, until `max_bytes` (a record's key, value and
    headers count, plus the `framing` its encoding adds) or FETCH_RECORDS_MAX (always at least
    one record). One rule for L0 and L1.

    `stopped` says why it takes no more: "full", "upto" (past `upto`; `extend_to` goes on),
    or "gap" (an extent does not follow on from the records taken: the offsets between are
    elsewhere, and a fetch never skips over offsets). The one exception: the gaps compaction
    leaves inside a compacted L1 object (`gaps=True`), which a fetch steps over as Kafka's does
    (a fetch at a removed offset returns the next record present)."""

    __slots__ = ("offset", "upto", "max_bytes", "framing", "runs", "count", "size", "stopped", "_next")

    def __init__(self, offset: int, upto: int, max_bytes: int, framing: Framing = UNFRAMED) -> None:
        assert 0 <= offset <= upto and max_bytes >= 1, (offset, upto, max_bytes)
        assert framing.record >= 0 and framing.run >= 0, framing
        self.offset = offset
        self.upto = upto
        self.max_bytes = max_bytes
        self.framing = framing
        self.runs: list[Run] = []
        self.count = 0  # records taken
        self.size = 0
        self.stopped: str | None = None
        self._next = offset

    @property
    def records(self) -> list[FetchedRecord]:
        return _materialise(self.runs)

    @property
    def next_offset(self) -> int:
        """The offset the fetch goes on from."""
        return self._next

    def extend_to(self, upto: int) -> None:
        """Go on past the old `upto` (from L1 into L0), unless stopped for another reason."""
        assert upto >= self.upto, (upto, self.upto)
        self.upto = upto
        if self.stopped == "upto" and self.next_offset <= upto:
            self.stopped = None

    def add_extent(self, base_offset: int, records: list[Record], *, gaps: bool = False) -> bool:
        """Take what fits from an extent whose first record is at `base_offset`; False once
        stopped. Hot (every record a fetch returns): no object per record. `gaps`: the offsets
        between the records taken and `base_offset` were removed by compaction."""
        assert self.stopped is None, self.stopped
        wanted = self._next
        if base_offset > wanted:
            if not gaps:
                self.stopped = "gap"
                return False
            if base_offset > self.upto:
                self._next = self.upto + 1
                self.stopped = "upto"
                return False
            # Over the gap once a record of this run is taken: a run that does not fit leaves
            # the window where its last taken run ends (the next fetch steps over the gap).
            wanted = base_offset
        start = wanted - base_offset
        stop = min(len(records), self.upto - base_offset + 1)
        if stop < len(records):
            self.stopped = "upto"
        count, max_bytes = self.count, self.max_bytes
        per_record, per_run = self.framing
        size = self.size + per_run  # the run's own bytes, if it takes a record
        taken_before = count
        for r in records[start:stop]:
            value, key, headers = r.value, r.key, r.headers
            grown = size + per_record + (0 if value is None else len(value))
            if key is not None:
                grown += len(key)
            if headers:
                grown += sum(HEADER_FRAMING + len(k) + (0 if v is None else len(v)) for k, v in headers)
            if count and (grown > max_bytes or count >= FETCH_RECORDS_MAX):
                self.stopped = "full"
                break
            size = grown
            count += 1
        if count > taken_before:
            self.runs.append(Run(base_offset, records, start, start + count - taken_before))
            self._next = base_offset + start + count - taken_before
            self.size = size
        self.count = count
        if self.stopped is None and self._next > self.upto:
            self.stopped = "upto"
        last = self.runs[-1] if self.runs else None
        assert last is None or last.base_offset + last.stop == self._next, (last, self._next)
        assert not self.runs or self.runs[0].first_offset >= self.offset, (self.runs[0], self.offset)
        return self.stopped is None


class L1Source(Protocol):
    async def fill(self, actor: PartitionActor, window: FetchWindow) -> None: ...

    async def rows_reaching(self, actor: PartitionActor, offset: int) -> list[L1Row]: ...

    async def read_runs(self, row: L1Row) -> list[tuple[int, list[Record]]]: ...


class _Extent(NamedTuple):
    """One L1 object or L0 extent as the lookups by time see it: where it begins, the lowest
    offset a lookup may answer in it (the start offset, or above the LRO for L0), its records'
    kept largest timestamp (None: not kept), how to read its runs (one GET), and its bytes
    (the L1 object's, or the L0 extent's in its shared object)."""

    base_offset: int
    first_offset: int
    max_timestamp_ms: int | None
    read: Callable[[], Awaitable[list[tuple[int, list[Record]]]]]
    size_bytes: int


class Reader:
    def __init__(self, log_store: PartitionLog, l0_cache: L0ObjectCache) -> None:
        self._log = log_store
        self.l0_cache = l0_cache  # L0 extents are read through it: one GET per object, shared
        self.l1: L1Source | None = None  # set by the reconciler issue's wiring
        self.l0_reads = 0
        self.l1_reads = 0

    async def fetch(
        self, actor: PartitionActor, offset: int, max_bytes: int, framing: Framing = UNFRAMED
    ) -> FetchResult:
        """Records from `offset` up to `max_bytes` (`framing`: what the caller's encoding adds,
        counted too), across objects and tiers: the L1 objects up to the LRO, then (budget
        left) the L0 extents above it, as a Kafka fetch fills its budget across segments.
        `tier` says which served it: `l1`, `l0`, or `l1+l0`."""
        if not 1 <= max_bytes <= FETCH_BYTES_MAX:
            raise InvalidInput(f"max_bytes must be in 1..{FETCH_BYTES_MAX}")
        state = actor.state
        # The start as readers are told it: past abandoned ranges at the start offset.
        hwm, start, lro = state.high_watermark, state.first_readable_offset, state.lro
        abandoned = state.abandoned_range(offset) if state.start_offset <= offset < hwm else None
        if abandoned is not None:
            raise OffsetsAbandoned(offset, *abandoned, start, hwm)
        if offset < start or offset > hwm:
            raise OffsetOutOfRange(offset, start, hwm)
        if offset == hwm:
            return FetchResult([], offset, hwm, start, "none")
        tiers = []
        if offset <= lro and self.l1 is not None:
            self.l1_reads += 1
            tiers.append("l1")
            window = FetchWindow(offset, lro, max_bytes, framing)
            try:
                await self.l1.fill(actor, window)
            except ObjectNotFound:
                # Retention (or DeleteRecords) moved the start past `offset` during the read
                # and deleted its object: out of range, as Kafka answers below the start.
                now = actor.state.start_offset
                if offset < now:
                    raise OffsetOutOfRange(offset, now, actor.state.high_watermark) from None
                raise
            window.extend_to(hwm - 1)
        else:
            window = FetchWindow(offset, hwm - 1, max_bytes, framing)
        taken = window.count
        if window.stopped is None:
            await self._fill_l0(actor, window, hwm)
            if window.count > taken or not tiers:
                tiers.append("l0")
        return FetchResult(window.runs, window.next_offset, hwm, start, "+".join(tiers))

    async def _fill_l0(self, actor: PartitionActor, window: FetchWindow, hwm: int) -> None:
        """Go on in L0 from the window's next offset: placeholders page by page, extent by
        extent, until the window stops or the log ends. Not at all after L1 when the reconciler
        moved the LRO past the window meanwhile: those L0 objects may be collected already,
        and the next fetch reads them from L1."""
        reader_id, _ = actor.register_reader()  # pins M(p) before any placeholder is read
        try:
            if window.count and window.next_offset <= actor.state.lro:
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
                    if not window.add_extent(record.base_offset, await self._extent(actor, record)):
                        break
        finally:
            actor.release_reader(reader_id)

    async def _extent(self, actor: PartitionActor, record: LogRecord) -> list[Record]:
        """The records of a placeholder's extent, verified: sliced from the L0 object the cache
        holds or fetches (one GET for the extents of all partitions in it), or one ranged GET.
        The caller holds a reader registration, which keeps the object from the GC."""
        p = record.entry
        assert isinstance(p, Placeholder), record
        data = await self.l0_cache.get(p.object_key, p.byte_offset, p.byte_length)
        where = f"{actor.name} log offset {record.log_offset} ({p.object_key})"
        return decode_extent(data, p.checksum, p.record_count, where)

    async def offset_for_time(self, actor: PartitionActor, timestamp_ms: int) -> tuple[int, int]:
        """Kafka's ListOffsets by time: the first offset at or above the start offset whose
        record's timestamp is >= `timestamp_ms`, and that timestamp; (-1, -1) if none is.

        The extents in offset order (`_extents`): each object's row and each placeholder keeps
        its records' largest timestamp, so only the first that may hold the answer is read
        (`core/time_lookup.py`): one GET, whatever the log's length. A row or placeholder
        written before that was kept says None and is read (a GET each until one holds the
        answer). A target below 0 (a Kafka ListOffsets timestamp that names no special value)
        finds the first record at or above the start offset, as Kafka's log search does."""
        # Registered first: M(p) is pinned before the LRO is read, so the L0 extents above it
        # stay until the lookup is done (as a fetch's).
        reader_id, _ = actor.register_reader()
        try:
            async for extent in self._extents(actor):
                if may_hold(extent.max_timestamp_ms, timestamp_ms):
                    found = await self._first_at_or_after(extent, timestamp_ms)
                    if found is not None:
                        return found
            return NOT_FOUND
        finally:
            actor.release_reader(reader_id)

    async def retained_bytes(self, actor: PartitionActor) -> int:
        """The bytes the partition's readable records take in the object store, as Kafka's log
        size counts its segments: its L1 objects holding offsets at or above the start offset,
        whole, and its L0 extents above the LRO (metastore reads only, no GET)."""
        reader_id, _ = actor.register_reader()
        total = 0
        try:
            async for extent in self._extents(actor):
                total += extent.size_bytes
        finally:
            actor.release_reader(reader_id)
        return total

    async def max_timestamp(self, actor: PartitionActor) -> tuple[int, int]:
        """Kafka's ListOffsets for the largest timestamp (KIP-734): the offset and timestamp of
        the first record at or above the start offset carrying the partition's largest
        timestamp; (-1, -1) when no record has one. The extents' kept largest timestamps are
        compared without reading them; one extent is read at the end, the first holding the
        largest (plus those whose largest is unknown, or that begin below the start offset and
        may hold it there)."""
        reader_id, _ = actor.register_reader()
        try:
            best_offset, best_timestamp = NOT_FOUND
            holder: _Extent | None = None  # the first extent keeping the largest, not read yet
            async for extent in self._extents(actor):
                kept = extent.max_timestamp_ms
                if kept is not None and extent.base_offset >= extent.first_offset:
                    if kept > best_timestamp:
                        holder, best_timestamp = extent, kept
                    continue
                for base, records in await extent.read():
                    for i in range(max(extent.first_offset, base) - base, len(records)):
                        if records[i].timestamp_ms > best_timestamp:
                            holder, best_offset, best_timestamp = None, base + i, records[i].timestamp_ms
            if holder is not None:
                found = await self._first_at_or_after(holder, best_timestamp)
                assert found is not None and found[1] == best_timestamp, (holder, found)
                return found
            return best_offset, best_timestamp
        finally:
            actor.release_reader(reader_id)

    async def _first_at_or_after(self, extent: _Extent, timestamp_ms: int) -> tuple[int, int] | None:
        runs = await extent.read()
        # the extent's largest timestamp is one run's own only when there is one run
        kept = extent.max_timestamp_ms if len(runs) == 1 else None
        for base, records in runs:
            found = first_at_or_after(records, base, max(extent.first_offset, base), timestamp_ms, kept)
            if found is not None:
                return found
        return None

    async def _extents(self, actor: PartitionActor) -> AsyncIterator[_Extent]:
        """The partition's readable extents in offset order, for the lookups by time: the L1
        objects up to the LRO, then the L0 extents above it, read page by page from the log
        store (the unreconciled placeholders only). The caller holds a reader registration."""
        state = actor.state
        start, lro, hwm = state.start_offset, state.lro, state.high_watermark
        from_l0 = start
        if self.l1 is not None and start <= lro:
            l1 = self.l1
            from_l0 = lro + 1
            for row in await l1.rows_reaching(actor, lro):
                if row.base_offset > lro:
                    break
                if row.last_offset >= start:
                    read = partial(l1.read_runs, row)
                    yield _Extent(row.base_offset, start, row.max_timestamp_ms, read, row.size)
        offset = from_l0
        while offset < hwm:
            placeholders = await self._log.read_placeholders(actor.row.pid, offset, PLACEHOLDERS_PER_READ)
            for record in placeholders:
                p = record.entry
                assert isinstance(p, Placeholder), record
                if record.base_offset >= hwm:
                    return  # durable but not applied yet: not readable
                offset = record.base_offset + p.record_count
                read = partial(self._run, actor, record)
                yield _Extent(record.base_offset, from_l0, p.max_timestamp_ms, read, p.byte_length)
            if len(placeholders) < PLACEHOLDERS_PER_READ:
                return

    async def _run(self, actor: PartitionActor, record: LogRecord) -> list[tuple[int, list[Record]]]:
        return [(record.base_offset, await self._extent(actor, record))]
