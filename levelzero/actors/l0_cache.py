"""A bounded cache of whole L0 objects, shared by every read of the node: one GET per L0 object
for the readers of all its partitions.

An L0 object holds one extent per partition written in its batch window, so a reader that
range-reads its own extent makes one GET per partition per object: a Kafka fetch of 64
partitions tailing the same objects, 64 GETs per object (BENCHMARKS.md, item 13). Here the first
read of an extent of an object GETs the object (its first `object_bytes_max` bytes: an object
is at most about two batches) and keeps it; reads of its other extents slice it. Reads of an
object being fetched wait for that GET instead of making their own, so the partitions of one
Kafka fetch, read concurrently, share it; so do consumers of different partitions close in
time, while the object stays among the most recently used.

Bounds: the objects held plus the GETs in flight stay within `bytes_max`; the least recently
used objects go first. A GET in flight is counted at the largest of the objects loaded lately
until it answers (`object_bytes_max` before any), then at its size; an object that does not fit
then is handed to the reads waiting for it and not kept.
A read that finds no room, an extent past the bytes loaded, or a GET that failed for another
read: the extent is read alone with its own ranged GET, as without the cache. So are most
misses while the cache thrashes.

Thrashing: readers spread over more objects than fit (a catch-up scan of many partitions,
each read through every object in turn), so that objects are evicted before most of their
extents are read: whole-object GETs then save few GETs and read many times the bytes. It is
judged by bytes: each EVICTIONS_WATCHED evictions, whether the objects evicted served reads of
at least 1/BYTES_SERVED_MIN_INVERSE of their bytes. If not, misses load their objects half as
often as before (one in `_every`: 1, 2, 4 … up to EVERY_MAX; the others are read alone); if
so, twice as often. Fewer loads evict less, so the objects held live longer and serve more of
their extents: the rate settles where loads pay for their bytes, and a scan wider than the
cache keeps most of what it holds instead of evicting each object before the next partition
reads it (a plain LRU misses every time on a cyclic scan one object wider than it). An on/off
guard that sampled one miss in eight swung between the two: its sampled objects, evicted
rarely, served plenty; loading every miss again thrashed (a catch-up of 1,024 partitions read
160 times the bytes asked for, BENCHMARKS.md).

Why serving cached bytes is safe: L0 objects are written once and never rewritten, so a slice
is the bytes a ranged GET would return. The cache decides nothing about which objects may be
read: a reader asks for an extent only through a placeholder it read while registered with its
partition (`Reader`), whose pin keeps the object from the GC as long as it reads, exactly as
for its own GET; an object the GC deleted is named by no placeholder a reader can still read
(it is below the LRO), so its bytes, if still held, are never asked for.

Releasing collected objects (`release_through`): once a GC round of the node has taken the
cluster's watermark `M`, every object of epoch <= `M` is dropped at once, not left to age out
(an idle daemon held its last `bytes_max` of deleted objects, 128 MiB, for good). Those are the
objects the GC deletes, this node's or any other's (every node's GC takes the same `M` from the
control plane), and no reader asks for them again: a reader registered with its partition holds
`M(p)`, so `M`, below the epoch of every object it can still read (the GC's own safety
argument, DESIGN.md); a read at offsets the reconciler has passed goes to L1. Objects are
indexed by epoch, so a release costs the objects it drops (and one step per epoch passed),
never a scan of what is held; a GET in flight for such an object hands its bytes to its reads
and keeps nothing."""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import anyio

from levelzero.core.errors import MalformedKey
from levelzero.core.keys import l0_key_epoch
from levelzero.storage.protocols import ObjectStore


SIZES_KEPT = 16  # a load is counted at the largest of the last this many objects loaded
# Each EVICTIONS_WATCHED evictions: if the objects evicted served reads of less than
# 1/BYTES_SERVED_MIN_INVERSE of their bytes in all (their loads read more than that many times
# the bytes asked for), misses load half as often (at most one in EVERY_MAX loads), else twice.
EVICTIONS_WATCHED = 32
BYTES_SERVED_MIN_INVERSE = 8
EVERY_MAX = 64


def l0_object_bytes_bound(batch_bytes_max: int) -> int:
    """The most of an L0 object a load asks for: the batcher cuts a batch once it reaches
    `batch_bytes_max`, and the request that reached it is at most that big (an object's header
    adds a few bytes per extent; an extent past what was loaded is read alone)."""
    return 2 * batch_bytes_max


@dataclass(frozen=True, slots=True)
class L0CacheStatistics:
    """A snapshot: what the cache served and what it cost."""

    bytes_max: int
    held_bytes: int  # objects held
    inflight_bytes: int  # GETs in flight, each at the largest object loaded lately
    objects: int
    hits: int  # extents sliced from a held object
    shared: int  # extents sliced from a GET another read had in flight
    loads: int  # GETs of an object
    uncached_gets: int  # extents read alone (off, no room, thrashing, past the bytes loaded, failed)
    evictions: int  # objects dropped for room
    released: int  # objects dropped because the GC's watermark passed their epoch
    load_every: int  # one miss in this many loads its object (1; more while the cache thrashes)

    @property
    def hit_ratio(self) -> float:
        """Extents served without a GET of their own, out of all extents read."""
        served = self.hits + self.shared
        total = served + self.loads + self.uncached_gets
        return served / total if total else 0.0


@dataclass(slots=True)
class _Load:
    done: anyio.Event = field(default_factory=anyio.Event)
    data: bytes | None = None  # None once done: the GET failed or was cancelled


class L0ObjectCache:
    def __init__(self, objects: ObjectStore, bytes_max: int, object_bytes_max: int) -> None:
        assert bytes_max >= 0 and object_bytes_max >= 1, (bytes_max, object_bytes_max)
        self._objects = objects
        self.bytes_max = bytes_max
        # A GET asks for this much of an object (all of it, for objects the batcher writes).
        self._load_bytes = min(bytes_max, object_bytes_max)
        self._held: OrderedDict[str, bytes] = OrderedDict()  # least recently used first
        self._held_bytes = 0
        self._loading: dict[str, _Load] = {}
        self._inflight_bytes = 0
        self._sizes_lately: deque[int] = deque(maxlen=SIZES_KEPT)  # of the objects loaded
        # Bytes of extents each object (held or loading) served, the loading read's included.
        self._served: dict[str, int] = {}
        # The evictions since the rate was last judged (`_evicted`), the bytes those objects
        # served and the bytes they held.
        self._watched_evictions = self._watched_served = self._watched_bytes = 0
        self._every = 1  # one miss in this many loads its object
        self._misses = 0  # misses that could load (room or not)
        self._hits = self._shared = self._loads = self._uncached = self._evictions = 0
        # The keys held by epoch, for `release_through`; an epoch stays (its set maybe empty,
        # its objects evicted) until released, so each epoch is once in `_epochs`, a min-heap.
        self._by_epoch: dict[int, set[str]] = {}
        self._epochs: list[int] = []
        self._released_through = 0  # the highest `M` released: no object at or below it is kept
        self._released = 0

    async def get(self, key: str, offset: int, length: int) -> bytes:
        """`length` bytes of the L0 object `key` from `offset` (an extent), unverified (the
        caller checks its checksum). Raises what the store's GET raises."""
        assert offset >= 0 and length >= 0, (key, offset, length)
        end = offset + length
        data = self._held.get(key)
        if data is not None:
            self._held.move_to_end(key)
            if end <= len(data):
                self._hits += 1
                self._count_served(key, length)
                return data[offset:end]
        elif (load := self._loading.get(key)) is not None:
            await load.done.wait()
            if load.data is not None and end <= len(load.data):
                self._shared += 1
                self._count_served(key, length)
                return load.data[offset:end]
        elif self._load_bytes and self._admits() and self._make_room(reserve := self._reservation(end)):
            data = await self._load(key, reserve)
            if end <= len(data):
                self._count_served(key, length)
                return data[offset:end]
        self._uncached += 1
        return await self._objects.get(key, offset, length)

    def _count_served(self, key: str, length: int) -> None:
        """An extent of `length` bytes served from the object `key` (held, or just loaded and
        kept: one that was not kept is no longer watched)."""
        if key in self._served:
            self._served[key] += length

    def _admits(self) -> bool:
        """Whether a miss loads its whole object: one miss in `_every` (1 unless the cache
        thrashes: `_evicted`)."""
        self._misses += 1
        return self._misses % self._every == 0

    def _evicted(self, served: int, size: int) -> None:
        """An object evicted, having served reads of `served` of its `size` bytes; each
        EVICTIONS_WATCHED evictions, the rate of loads judged by what those served: half as
        many loads if they were read for less than 1/BYTES_SERVED_MIN_INVERSE of their bytes
        (thrashing), else twice as many (up to every miss)."""
        self._watched_evictions += 1
        self._watched_served += served
        self._watched_bytes += size
        if self._watched_evictions < EVICTIONS_WATCHED:
            return
        if self._watched_served * BYTES_SERVED_MIN_INVERSE < self._watched_bytes:
            self._every = min(EVERY_MAX, 2 * self._every)
        else:
            self._every = max(1, self._every // 2)
        self._watched_evictions = self._watched_served = self._watched_bytes = 0

    def _reservation(self, end: int) -> int:
        """What a load is counted at until it answers: the largest of the objects loaded
        lately (the batcher's objects are alike), and at least the extent's end; at most what
        a load asks for. An object larger than its reservation makes room when it lands."""
        lately = max(self._sizes_lately, default=self._load_bytes)
        return min(self._load_bytes, max(lately, end))

    async def _load(self, key: str, reserve: int) -> bytes:
        """GET the object (its first `_load_bytes`), counted at `reserve` until it answers,
        and keep it if there is room for it then. The room for `reserve` was made by the
        caller, with no await since."""
        assert key not in self._held and key not in self._loading, key
        load = _Load()
        self._loading[key] = load
        self._inflight_bytes += reserve
        self._check_bound()
        try:
            data = load.data = await self._objects.get(key, 0, self._load_bytes)
            self._loads += 1
        finally:
            del self._loading[key]
            self._inflight_bytes -= reserve
            if load.data is not None:
                size = len(load.data)
                assert size <= self._load_bytes, (key, size)
                self._sizes_lately.append(size)
                epoch = _epoch(key)
                if not 0 < epoch <= self._released_through and self._make_room(size):
                    self._held[key] = load.data
                    self._held_bytes += size
                    self._served[key] = 0
                    self._index(key, epoch)
            load.done.set()
            self._check_bound()
        return data

    def _make_room(self, size: int) -> bool:
        """Drop the least recently used objects until `size` more bytes fit; False if they
        cannot (the GETs in flight hold the rest)."""
        while self._held and self._held_bytes + self._inflight_bytes + size > self.bytes_max:
            dropped_key, dropped = self._held.popitem(last=False)
            self._held_bytes -= len(dropped)
            self._evictions += 1
            self._evicted(self._served.pop(dropped_key), len(dropped))
            self._unindex(dropped_key)
        return self._held_bytes + self._inflight_bytes + size <= self.bytes_max

    def release_through(self, m: int) -> int:
        """Drop every object held whose epoch is <= `m`, the cluster's watermark a GC round
        took (the objects the GC deletes: no reader asks for them again, see the module's
        docstring); no later load of such an object is kept. Returns the objects dropped.
        Costs the objects dropped plus one step per epoch passed (the index by epoch)."""
        if m <= self._released_through:
            return 0
        self._released_through = m
        dropped = 0
        while self._epochs and self._epochs[0] <= m:
            for key in self._by_epoch.pop(heapq.heappop(self._epochs)):
                data = self._held.pop(key)
                self._held_bytes -= len(data)
                del self._served[key]
                dropped += 1
        self._released += dropped
        assert len(self._epochs) == len(self._by_epoch), (len(self._epochs), len(self._by_epoch))
        self._check_bound()
        return dropped

    def _index(self, key: str, epoch: int) -> None:
        if epoch < 1:
            return  # not an L0 key (a test's): held until evicted
        keys = self._by_epoch.get(epoch)
        if keys is None:
            keys = self._by_epoch[epoch] = set()
            heapq.heappush(self._epochs, epoch)
        keys.add(key)

    def _unindex(self, key: str) -> None:
        keys = self._by_epoch.get(_epoch(key))
        if keys is not None:
            keys.discard(key)

    def _check_bound(self) -> None:
        assert self._held_bytes >= 0 and self._inflight_bytes >= 0, (self._held_bytes, self._inflight_bytes)
        assert self._held_bytes + self._inflight_bytes <= self.bytes_max, (
            self._held_bytes,
            self._inflight_bytes,
            self.bytes_max,
        )

    def statistics(self) -> L0CacheStatistics:
        return L0CacheStatistics(
            bytes_max=self.bytes_max,
            held_bytes=self._held_bytes,
            inflight_bytes=self._inflight_bytes,
            objects=len(self._held),
            hits=self._hits,
            shared=self._shared,
            loads=self._loads,
            uncached_gets=self._uncached,
            evictions=self._evictions,
            released=self._released,
            load_every=self._every,
        )


def _epoch(key: str) -> int:
    """The epoch in an L0 key; 0 for a key that is not one (never released by epoch)."""
    try:
        return l0_key_epoch(key)
    except MalformedKey:
        return 0
