"""One reconciler round's reads of L0 objects: one GET per object for every partition due.

An L0 object holds one extent for each partition written in its batch window, and each
partition's L1 object is built from its own extents, so a reconciler reading extent by extent
makes one ranged GET per partition per L0 object: 64 GETs for an object of 64 partitions, five
times the PUTs' price on S3 at 1 MiB/s (BENCHMARKS.md, item 13). A round first plans: the batch
of placeholders each due partition will copy first (read from the log store once, kept here and
handed on to that partition's copy: the plan belongs to the round, so a copy made outside it
reads its own). Then the first copy needing an extent of an object planned for two or more
fetches the span holding every planned extent of it, one GET; the others slice it. A span is
dropped once its last planned extent is taken. L0 objects are immutable, so a slice is the bytes
a ranged GET would return; the partitions reading them have unreconciled data in the object, so
`M(p)` keeps the object from the GC while they do (as for their own reads).

The memory bound: the spans a round plans add up to at most `budget_bytes` (each object's from
its first planned extent to its last), so every span fits when its GET comes. A partition
whose batch would take the spans past it is not planned: `plan_batch` says so, and the
reconciler copies it in the round's next wave, with a plan of its own (copied now, its extents
would be read one GET each: at 1,024 partitions and 10 MiB/s that was ~900 GETs per L0 object,
nine dollars in ten of the request bill). The batcher writes an object's extents in partition
order, so a wave planning neighbouring partitions plans short spans: all of its extents in an
object lie together. (An extent that was not planned, a span whose GET failed for another copy,
or a span that does not fit after all — the `partitions_min` batches a wave plans whatever
their size may pass the budget — is read with its own ranged GET, as before.)"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import anyio

from levelzero.core.entries import LogRecord, Placeholder
from levelzero.storage.protocols import ObjectStore

_Extent = tuple[int, int]  # byte offset, byte length


@dataclass(slots=True)
class _Span:
    first: int  # the byte offset of the span's first byte in its object
    size: int
    pending: set[_Extent]  # planned extents not taken yet
    loaded: anyio.Event = field(default_factory=anyio.Event)
    data: bytes | None = None  # None once loaded: the GET failed


@dataclass(slots=True)
class RoundReadStatistics:
    span_gets: int = 0  # GETs of spans shared by several extents
    extent_gets: int = 0  # GETs of one extent
    extents_from_spans: int = 0  # extents sliced from a span


class RoundReads:
    def __init__(self, objects: ObjectStore, budget_bytes: int, partitions_min: int = 1) -> None:
        assert budget_bytes >= 0 and partitions_min >= 1, (budget_bytes, partitions_min)
        self._objects = objects
        self._budget = budget_bytes
        # Batches planned whatever their spans (a span that then does not fit is read alone):
        # a wave copies at least this many partitions, as many as copy at once.
        self._partitions_min = partitions_min
        self._planned: dict[str, set[_Extent]] = {}
        # Each planned object's span: (its first planned byte, the end of its last extent);
        # `_span_bytes` their sizes added up, what the spans would hold at once.
        self._bounds: dict[str, _Extent] = {}
        self._span_bytes = 0
        self._spans: dict[str, _Span] = {}
        self._held = 0  # bytes of the spans in `_spans`
        # The batch each partition planned copies first: pid -> (its first data offset, the
        # batch's placeholders). One batch per partition: bounded with the plan (`full`).
        self._batches: dict[int, tuple[int, list[LogRecord]]] = {}
        self.stats = RoundReadStatistics()

    @property
    def sharing(self) -> bool:
        """Whether the round shares reads at all (a budget of 0: a GET per extent)."""
        return self._budget > 0

    def plan(self, placeholders: Iterable[Placeholder]) -> None:
        """Extents a partition of this round will read."""
        placeholders = list(placeholders)
        for p in placeholders:
            self._planned.setdefault(p.object_key, set()).add((p.byte_offset, p.byte_length))
        grown = self._grown_spans(placeholders)
        self._span_bytes += _added(grown)
        self._bounds.update((key, after) for key, (_, after) in grown.items())

    def _grown_spans(self, placeholders: list[Placeholder]) -> dict[str, tuple[_Extent | None, _Extent]]:
        """Each object's span (first planned byte, end of the last extent) before and after
        planning `placeholders` too: the one rule `plan` applies and `plan_batch` weighs."""
        grown: dict[str, tuple[_Extent | None, _Extent]] = {}
        for p in placeholders:
            key, first, end = p.object_key, p.byte_offset, p.byte_offset + p.byte_length
            before = self._bounds.get(key)
            _, now = grown.get(key) or (before, before or (first, end))
            grown[key] = (before, (min(first, now[0]), max(end, now[1])))
        return grown

    def plan_batch(self, pid: int, start: int, batch: list[LogRecord]) -> bool:
        """The placeholders partition `pid` will copy first, from data offset `start`: their
        extents planned, the batch kept for the copy (`take_batch`). False, and nothing
        planned, when they would take the round's spans past the budget and `partitions_min`
        partitions are planned already (those are planned whatever their size: a wave makes
        progress, as many partitions as copy at once)."""
        placeholders = [record.entry for record in batch if isinstance(record.entry, Placeholder)]
        if (
            len(self._batches) >= self._partitions_min
            and self._span_bytes + _added(self._grown_spans(placeholders)) > self._budget
        ):
            return False
        self.plan(placeholders)
        self._batches[pid] = (start, batch)
        return True

    def take_batch(self, pid: int, start: int) -> list[LogRecord] | None:
        """The batch planned for `pid` if it starts at `start` (the log below the HWM is fixed,
        so it is what a read would return), once; None otherwise: the copy reads its own."""
        planned = self._batches.pop(pid, None)
        return planned[1] if planned is not None and planned[0] == start else None

    @property
    def full(self) -> bool:
        """The planned spans add up to the budget and `partitions_min` partitions are planned:
        no other partition's batch fits. (Checked before a partition's placeholders are read;
        `plan_batch` decides for a batch.)"""
        return self._span_bytes >= self._budget and len(self._batches) >= self._partitions_min

    @property
    def held_bytes(self) -> int:
        return self._held

    async def get(self, p: Placeholder) -> bytes:
        """The bytes of `p`'s extent, unverified (the caller checks its checksum)."""
        extent = (p.byte_offset, p.byte_length)
        span = self._spans.get(p.object_key)
        if span is None:
            span = await self._load(p.object_key, extent)
        else:
            await span.loaded.wait()
        if span is None or span.data is None or extent not in span.pending:
            self.stats.extent_gets += 1
            return await self._objects.get(p.object_key, p.byte_offset, p.byte_length)
        span.pending.discard(extent)
        if not span.pending:
            self._drop(p.object_key, span)
        self.stats.extents_from_spans += 1
        start = p.byte_offset - span.first
        return span.data[start : start + p.byte_length]

    async def _load(self, key: str, extent: _Extent) -> _Span | None:
        """The span of `key`'s planned extents, fetched now; None when the extent is to be read
        alone (not planned, the only one planned in its object, or no room for the span)."""
        planned = self._planned.pop(key, None)
        if planned is None or extent not in planned or len(planned) < 2:
            return None
        first = min(offset for offset, _ in planned)
        size = max(offset + length for offset, length in planned) - first
        if self._held + size > self._budget:
            return None
        span = _Span(first, size, planned)
        self._spans[key] = span
        self._held += size
        try:
            span.data = await self._objects.get(key, first, size)
            self.stats.span_gets += 1
        finally:
            span.loaded.set()
            if span.data is None:  # failed or cancelled: each copy reads its own extent
                self._drop(key, span)
        return span

    def _drop(self, key: str, span: _Span) -> None:
        if self._spans.get(key) is span:
            del self._spans[key]
            self._held -= span.size
            assert self._held >= 0, self._held


def _added(grown: dict[str, tuple[_Extent | None, _Extent]]) -> int:
    """The bytes spans grow by, from `_grown_spans`' before and after."""
    return sum(
        after[1] - after[0] - (before[1] - before[0] if before else 0) for before, after in grown.values()
    )
