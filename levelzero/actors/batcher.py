"""The write path: gather records of many partitions into one shared L0 object, upload it stamped
with an epoch, then fence and append one placeholder per extent.

An object's epoch is `max(cached cluster epoch, creation epochs of the partitions inside)`, so
an object never holds a partition's data under an epoch older than the partition itself (the
GC's cap relies on it). A rejected extent (`StaleClusterEpoch`) invalidates the epoch cache and
goes again in a new object; the first object becomes an orphan that the GC collects by epoch.
"""

from __future__ import annotations

import asyncio
import logging
import time
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import anyio
import anyio.to_thread
import msgspec

from levelzero.core.entries import LogRecord, Placeholder, ProducerSpan
from levelzero.core.errors import InvalidInput, LevelZeroError, ShuttingDown, StaleClusterEpoch
from levelzero.core.keys import PREFIX_COUNT, format_l0_key, new_uuid
from levelzero.core.leader import object_epoch
from levelzero.core.produce_size import check_produce_size
from levelzero.core.l0format import (
    EncodedExtents,
    ExtentHeader,
    NO_TIMESTAMP,
    Record,
    encoded_length,
    finish_object,
    max_timestamp,
)
from levelzero.storage.protocols import L0Catalog, L0ObjectRow, ObjectStore

from .epochs import EpochCache
from .mailbox import Mailbox, Wakeup
from .partition import PartitionActor

log = logging.getLogger("levelzero.batcher")

# Uploaded objects whose extents are being fenced and appended at once. Fencing does not hold an
# upload slot (`uploads_max`): the next object uploads while this one's placeholders commit.
OBJECTS_FENCING_MAX = 64
# Objects encoded ahead, waiting for an upload slot, beyond the `uploads_max` being uploaded:
# when a PUT finishes the next one starts at once, instead of after its object is encoded
# (milliseconds of a busy event loop per object: uploads at once averaged 6.6 of 8 without).
OBJECTS_ENCODED_AHEAD_MAX = 2
# An object of at least this many bytes of records is encoded (copied into its buffer, its
# extents' CRC-32s) on a worker thread: ~7 ms of a 4 MiB object off the event loop, for a hop
# of ~50-100 us. The simulation's and most tests' objects are far smaller: on the loop.
ENCODE_OFF_LOOP_BYTES_MIN = 256 * 1024
# A request's records are measured by encoding them into one scratch buffer the batcher keeps
# (`l0format.encoded_length`); after a request larger than this the buffer is let go.
SCRATCH_KEPT_BYTES_MAX = 1024 * 1024


@dataclass(frozen=True, slots=True)
class BatcherConfig:
    linger_ms: float = 250.0
    # A record set carrying a Kafka transaction's marker (and its producer's next transaction's
    # records, which waited for it in the lane) cuts the window this long after it arrives, if
    # sooner than `linger_ms`: the transaction's producer waits on it, one transaction at a
    # time. 0: at once (at most one object a transaction; what else the window holds goes too).
    transaction_linger_ms: float = 0.0
    batch_bytes_max: int = 4 * 1024 * 1024
    inflight_bytes_max: int = 64 * 1024 * 1024
    uploads_max: int = 8  # objects being uploaded at once
    stale_retries_max: int = 3
    mailbox_size: int = 1024

    def __post_init__(self) -> None:
        if self.linger_ms < 0 or self.transaction_linger_ms < 0:
            raise InvalidInput("linger_ms and transaction_linger_ms must be >= 0")
        if not 1024 <= self.batch_bytes_max <= self.inflight_bytes_max:
            raise InvalidInput("need 1024 <= batch_bytes_max <= inflight_bytes_max")
        if not 1 <= self.uploads_max <= 1024 or not 0 <= self.stale_retries_max <= 100:
            raise InvalidInput("uploads_max must be in 1..1024, stale_retries_max in 0..100")


class ProduceResult(msgspec.Struct, frozen=True):
    """One per request: a msgspec struct is made in C (a named tuple cost 8 times as much, a
    frozen dataclass more still)."""

    base_offset: int
    last_offset: int
    attempts: int
    object_key: str


class _Request(msgspec.Struct):
    """One per request. Its producer waits on `waiter`, a bare future of the running loop (a
    `Reply` was four more calls per request: make, wait, set, wake), answered once: an answer
    after the producer gave up (cancelled) is dropped."""

    actor: PartitionActor
    # Its records as they came (frozen records in a tuple), encoded once, into the object's
    # buffer (`l0format.EncodedExtents`): its extent or part of one.
    records: tuple[Record, ...]
    size: int  # their encoded length (`l0format.encode_extent`)
    waiter: asyncio.Future[ProduceResult]
    attempts: int = 0
    producers: tuple[ProducerSpan, ...] = ()  # first_record relative to its records
    max_timestamp_ms: int = NO_TIMESTAMP  # its records' largest (the placeholder keeps it)
    linger_s: float | None = None  # the window cut this long after it arrives, if sooner

    def set(self, result: ProduceResult) -> None:
        if not self.waiter.done():
            self.waiter.set_result(result)

    def fail(self, error: BaseException) -> None:
        if not self.waiter.done():
            self.waiter.set_exception(error)


@dataclass(frozen=True, slots=True)
class _Uploaded:
    row: L0ObjectRow
    headers: list[ExtentHeader]
    by_partition: dict[int, list[_Request]]


@dataclass(slots=True)
class BatcherStatistics:
    objects_uploaded: int = 0
    bytes_uploaded: int = 0
    extents_appended: int = 0
    records_appended: int = 0
    stale_rejections: int = 0
    stale_retries: int = 0
    stale_failures: int = 0
    orphan_objects: int = 0
    inflight_bytes: int = 0
    object_sizes: list[int] = field(default_factory=list)  # drained by the metrics exporter


class _ByteBudget:
    """Bounded in-flight bytes: producers wait here, so memory stays bounded."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        # First come, first served; a release grants bytes to waiters directly. (A Condition
        # woke every waiter on every release, and each then queued for the lock: a convoy that
        # held the budget far longer than the writes it bounds.)
        self._waiters: deque[_BudgetWaiter] = deque()

    def try_acquire(self, n: int) -> bool:
        """`acquire` without waiting (and without a coroutine): False if it would wait."""
        n = min(n, self.limit)
        if not self._waiters and self.used + n <= self.limit:
            self.used += n
            return True
        return False

    async def acquire(self, n: int) -> None:
        if self.try_acquire(n):
            return
        n = min(n, self.limit)
        waiter = _BudgetWaiter(n)
        self._waiters.append(waiter)
        try:
            await waiter.granted.wait()
        except BaseException:
            if waiter.granted.is_set():  # granted, then cancelled before it could run
                self.release(n)
            else:
                self._waiters.remove(waiter)
                self._grant()  # the head may have been holding smaller requests back
            raise

    def release(self, n: int) -> None:
        n = min(n, self.limit)
        self.used -= n
        assert self.used >= 0
        if self._waiters:
            self._grant()

    def _grant(self) -> None:
        while self._waiters and self.used + self._waiters[0].n <= self.limit:
            waiter = self._waiters.popleft()
            self.used += waiter.n
            waiter.granted.set()


@dataclass(eq=False, slots=True)
class _BudgetWaiter:
    n: int
    granted: anyio.Event = field(default_factory=anyio.Event)


class Batcher:
    def __init__(
        self,
        object_store: ObjectStore,
        log_store: L0Catalog,
        epoch_cache: EpochCache,
        config: BatcherConfig = BatcherConfig(),
        *,
        rng: random.Random | None = None,
        wall_clock: Callable[[], float] | None = None,
    ) -> None:
        self._objects = object_store
        self._log = log_store
        self._cache = epoch_cache
        self.config = config
        self._rng = rng or random.Random()
        self._wall = wall_clock or time.time
        self._budget = _ByteBudget(config.inflight_bytes_max)
        self._scratch = bytearray()  # the requests' encoding, measured (`produce`)
        self._requests: Mailbox[_Request] = Mailbox(config.mailbox_size)
        self._uploads = anyio.Semaphore(config.uploads_max)  # PUTs at once
        # Objects between "batch cut" and "PUT done": being encoded, waiting, or uploading.
        self._staged = anyio.Semaphore(config.uploads_max + OBJECTS_ENCODED_AHEAD_MAX)
        self._fencing = anyio.Semaphore(OBJECTS_FENCING_MAX)
        # Fenced objects' catalog rows not yet handed to the log store (`_record_objects`).
        self._unrecorded: list[L0ObjectRow] = []
        self._unrecorded_wakeup = Wakeup()
        self._uploads_ended = False
        self.stats = BatcherStatistics()
        self._closed = False
        self.finished = anyio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None  # taken at the first produce

    # ------------------------------------------------------------------ producers

    async def produce(
        self,
        actor: PartitionActor,
        records: Sequence[Record],
        producers: Sequence[ProducerSpan] = (),
        linger_s: float | None = None,
    ) -> ProduceResult:
        """`records` stored contiguously in one extent; `producers` (idempotent Kafka batches
        among them, `first_record` relative to `records`) ride in its placeholder. `linger_s`:
        the object that takes them is cut this long after they arrive, if sooner than the
        window's `linger_ms`."""
        if not records:
            raise InvalidInput("a produce request needs at least one record")
        for span in producers:
            assert span.first_record >= 0 and span.first_record + span.record_count <= len(records), span
        # Kept as they are (a tuple: the caller's list may change after it returns) and encoded
        # once, into the object's buffer, when the object is made; their encoded length now,
        # from an encoding into the batcher's scratch buffer (no fresh memory: see
        # `encoded_length`), for the budget, the size rule and the cut of the batch.
        kept = records if type(records) is tuple else tuple(records)
        try:
            size = encoded_length(kept, self._scratch)
        except (TypeError, msgspec.EncodeError) as exc:
            raise InvalidInput(f"records that cannot be stored: {exc}") from None
        if size > SCRATCH_KEPT_BYTES_MAX:
            self._scratch = bytearray()  # a large request's room is not kept for the next
        # The one size rule (TooLarge: 413 / MESSAGE_TOO_LARGE); the encoded length settles a
        # request well inside the limit without adding up its records (7% of the loop).
        check_produce_size(records, self.config.batch_bytes_max, encoded_bytes=size)
        if self._closed:
            raise ShuttingDown("the batcher is shutting down")
        if not self._budget.try_acquire(size):
            await self._budget.acquire(size)
        self.stats.inflight_bytes = self._budget.used
        try:
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            waiter: asyncio.Future[ProduceResult] = self._loop.create_future()
            request = _Request(actor, kept, size, waiter, 0, tuple(producers), max_timestamp(kept), linger_s)
            try:
                try:  # no checkpoint when there is room: the caller waits for the reply next
                    self._requests.send_nowait(request)
                except anyio.WouldBlock:
                    await self._requests.send(request)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                raise ShuttingDown("the batcher is shutting down") from None
            return await waiter
        finally:
            self._budget.release(size)
            self.stats.inflight_bytes = self._budget.used

    async def close(self) -> None:
        """Stop accepting; the run loop flushes what it holds and waits for its uploads."""
        self._closed = True
        self._requests.end()

    # ------------------------------------------------------------------ the loop

    async def run(self, *, task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._record_objects)
            await self._cut_and_upload(task_status)
            # Every upload and fence ended: the recorder writes what is left, then returns.
            self._uploads_ended = True
            self._unrecorded_wakeup.set()
        self.finished.set()

    async def _cut_and_upload(self, task_status: anyio.abc.TaskStatus) -> None:
        linger_s = self.config.linger_ms / 1000
        async with anyio.create_task_group() as tg:
            task_status.started()
            batch: list[_Request] = []
            batch_bytes_max = self.config.batch_bytes_max
            try:
                while True:
                    try:
                        request = await self._requests.receive()  # nothing lingers: no deadline
                    except anyio.EndOfStream:
                        break
                    batch_bytes = 0
                    deadline = anyio.current_time() + linger_s
                    closed = False
                    # The batch lingers: one deadline for every request it waits for (a cancel
                    # scope and a timer a batch, not one a request). A request with a linger of
                    # its own (a transaction's marker) brings the deadline closer.
                    with anyio.CancelScope() as lingering:  # its deadline set before a wait
                        while True:
                            if request.linger_s is not None:
                                deadline = min(deadline, anyio.current_time() + request.linger_s)
                            batch.append(request)
                            batch_bytes += request.size
                            if batch_bytes >= batch_bytes_max:
                                break
                            # Take what is already queued without yielding (a `receive()` per
                            # request would take one request per event-loop round); wait for
                            # more only when the queue is empty and the deadline ahead.
                            try:
                                request = self._requests.receive_nowait()
                                continue
                            except anyio.WouldBlock:
                                pass
                            except anyio.EndOfStream:
                                closed = True
                                break
                            if anyio.current_time() >= deadline:
                                break
                            if deadline < lingering.deadline:
                                lingering.deadline = deadline  # still ahead: a timer, not a cancel
                            try:
                                request = await self._requests.receive()
                            except anyio.EndOfStream:
                                closed = True
                                break
                    await self._staged.acquire()
                    tg.start_soon(self._upload_and_fence, batch)
                    batch = []
                    if closed:
                        break
            finally:
                # Cancelled (the node's task group failing): what was never cut is refused,
                # and later sends are too.
                _fail([*batch, *self._requests.close()], ShuttingDown("the batcher stopped"))

    async def _upload_and_fence(self, batch: list[_Request]) -> None:
        """The run loop took a staging slot for `batch`. The slot covers encoding and upload
        only; a retry (stale epoch) takes a slot again for its new object."""
        while True:
            try:
                uploaded = await self._upload(batch)
            finally:
                self._staged.release()
            if uploaded is None:
                return
            async with self._fencing:
                retry = await self._fence(uploaded)
            if not retry:
                return
            self.stats.stale_retries += len(retry)
            batch = retry
            await self._staged.acquire()

    async def _upload(self, batch: list[_Request]) -> _Uploaded | None:
        """Upload one object for `batch`; None if it failed (every request was answered)."""
        by_partition: dict[int, list[_Request]] = {}
        batch_bytes = 0
        for request in batch:
            request.attempts += 1
            batch_bytes += request.size
            by_partition.setdefault(request.actor.row.pid, []).append(request)
        # The heavy part first, before an upload slot: encode and checksum every extent, into
        # the buffer that becomes the object. A large object's encoding and CRC-32s run on a
        # worker thread (the producers' records are immutable; the loop meanwhile answers
        # fences and commits), a small one's on the loop (a thread hop costs more than they do).
        # Extents in partition order: a reconciler round copies partitions in blocks of
        # neighbouring ones (`round_reads.py`), whose extents then lie together in every object,
        # one short span to GET instead of a span over the whole object.
        extents = [
            (pid, [req.records for req in reqs]) if len(reqs) > 1 else (pid, [reqs[0].records])
            for pid, reqs in sorted(by_partition.items())
        ]
        if batch_bytes >= ENCODE_OFF_LOOP_BYTES_MIN:
            encoded = await anyio.to_thread.run_sync(EncodedExtents, extents)
        else:
            encoded = EncodedExtents(extents)
        try:
            async with self._uploads:
                # The epoch is read when the upload can start, not when the batch was cut.
                cached = await self._cache.get()
                epoch = object_epoch(
                    cached, [reqs[0].actor.row.creation_epoch for reqs in by_partition.values()]
                )
                data, headers = finish_object(epoch, encoded)
                prefix, uuid = self._rng.randrange(PREFIX_COUNT), new_uuid(self._rng.getrandbits(128))
                key = format_l0_key(prefix, epoch, uuid)
                await self._objects.put(key, data)
        except LevelZeroError as exc:
            _fail(batch, exc)
            return None
        self.stats.objects_uploaded += 1
        self.stats.bytes_uploaded += len(data)
        if len(self.stats.object_sizes) < 10_000:
            self.stats.object_sizes.append(len(data))
        row = L0ObjectRow(key=key, epoch=epoch, size=len(data), created_at=self._wall(), extents=len(headers))
        return _Uploaded(row, headers, by_partition)

    async def _record_objects(self) -> None:
        """Write fenced objects' catalog rows: all that are waiting at once (one group commit),
        one such write on its way at a time, until the uploads ended and none is left.

        An object's row is the GC's catalog (and the export's record of uploads); no producer
        waits for it. Written as each object's own commit, beside its placeholders, the rows
        were two commits in three of an upload run (`levelzero bench --only upload`), and on
        a writer that commits two batches at once they delayed the placeholders that
        producers do wait for. A row written late, or never (a crash first, a failed write),
        leaves a stray, which the GC's sweeps list and delete once its epoch is at or below
        `M`: the same as before, when the row's commit was apart from the placeholders'."""
        while True:
            while not self._unrecorded:
                if self._uploads_ended:
                    return
                await self._unrecorded_wakeup.wait()
                self._unrecorded_wakeup.clear()
            rows, self._unrecorded = self._unrecorded, []
            if len(rows) == 1:  # the common case: no task group and task for one write
                await self._record_object(rows[0])
                continue
            async with anyio.create_task_group() as tg:
                for row in rows:
                    tg.start_soon(self._record_object, row)

    async def _record_object(self, row: L0ObjectRow) -> None:
        """A failure to write the row fails no producer (see `_record_objects`)."""
        try:
            await self._log.record_l0_object(row)
        except LevelZeroError as exc:
            log.warning("could not record L0 object %s: %s", row.key, exc)

    async def _fence(self, uploaded: _Uploaded) -> list[_Request]:
        """Fence and append one placeholder per extent; returns the requests to retry.

        Every extent's write is handed to its partition with an `_Extent` to answer, which
        settles the extent's producers the moment it is answered (on the answering task). The
        batcher waits once, for all of them: one task per object, not one per extent (an object
        may carry a thousand extents), woken once."""
        key, epoch = uploaded.row.key, uploaded.row.epoch
        fencing = _Fencing(self, key)
        for header in uploaded.headers:
            requests = uploaded.by_partition[header.pid]
            placeholder = Placeholder(
                epoch=epoch,
                object_key=key,
                byte_offset=header.byte_offset,
                byte_length=header.byte_length,
                record_count=header.record_count,
                checksum=header.checksum,
                # (one request: its spans are relative to the extent already)
                producers=requests[0].producers if len(requests) == 1 else _spans(requests),
                max_timestamp_ms=max(request.max_timestamp_ms for request in requests),
            )
            extent = _Extent(fencing, header, requests)
            fencing.left += 1
            actor = requests[0].actor
            try:
                if not actor.post_write(placeholder, extent):
                    await actor.send_write(placeholder, extent)
            except LevelZeroError as exc:
                extent.fail(exc)  # unless answered already (a partition failing mid-write)
        await fencing.wait()
        # Its row once its placeholders are answered: it never holds back their commit.
        self._unrecorded.append(uploaded.row)
        self._unrecorded_wakeup.set()
        if fencing.appended == 0:
            self.stats.orphan_objects += 1
            log.info("object %s rejected by every partition: an orphan for the GC", key)
        return fencing.retry


class _Fencing:
    """One object's extents on their way through their partitions: what is left to answer, and
    the requests to retry in a new object (a stale epoch)."""

    __slots__ = ("batcher", "key", "retry", "appended", "left", "_all_answered")

    def __init__(self, batcher: Batcher, key: str) -> None:
        self.batcher = batcher
        self.key = key
        self.retry: list[_Request] = []
        self.appended = 0
        self.left = 0
        self._all_answered = Wakeup()

    def answered(self) -> None:
        self.left -= 1
        if self.left == 0:
            self._all_answered.set()

    async def wait(self) -> None:
        """Until every extent handed over is answered (at once if they are). The count may
        have touched zero between two extents (one answered at once): that raise is stale, so
        it is cleared and the count decides."""
        self._all_answered.clear()
        while self.left:
            await self._all_answered.wait()
            self._all_answered.clear()


class _Extent(msgspec.Struct):
    """The answer to one extent's placeholder write (`PartitionActor.post_write`): settles the
    extent's producers with their offsets, or fails them, or keeps them for a retry. Answered
    once; a second answer (the partition failing after the batcher gave up on it) is ignored.
    (One per extent: a msgspec struct is made in C.)"""

    fencing: _Fencing
    header: ExtentHeader
    requests: list[_Request]
    done: bool = False

    def set(self, record: LogRecord) -> None:
        if self.done:
            return
        self.done = True
        fencing = self.fencing
        try:
            stats = fencing.batcher.stats
            fencing.appended += 1
            stats.extents_appended += 1
            stats.records_appended += self.header.record_count
            offset = record.base_offset
            key = fencing.key
            for request in self.requests:
                last = offset + len(request.records) - 1
                request.set(ProduceResult(offset, last, request.attempts, key))
                offset = last + 1
            assert offset == record.base_offset + self.header.record_count
        finally:
            fencing.answered()

    def fail(self, error: BaseException) -> None:
        if self.done:
            return
        self.done = True
        fencing = self.fencing
        try:
            if isinstance(error, StaleClusterEpoch):
                batcher = fencing.batcher
                batcher.stats.stale_rejections += 1
                batcher._cache.invalidate_below(error.window_max)  # noqa: SLF001 - the batcher's own retry
                for request in self.requests:
                    if request.attempts <= batcher.config.stale_retries_max:
                        fencing.retry.append(request)
                    else:
                        batcher.stats.stale_failures += 1
                        request.fail(error)
            else:
                _fail(self.requests, error)
        finally:
            fencing.answered()


def _spans(requests: list[_Request]) -> tuple[ProducerSpan, ...]:
    """The requests' producer spans, `first_record` made relative to the extent (the requests'
    records follow one another in it)."""
    spans: list[ProducerSpan] = []
    first = 0
    for request in requests:
        for span in request.producers:
            spans.append(msgspec.structs.replace(span, first_record=first + span.first_record))
        first += len(request.records)
    return tuple(spans)


def _fail(requests: list[_Request], error: BaseException) -> None:
    for request in requests:
        request.fail(error)
