"""The one produce intake both front ends call (HTTP's produce route, Kafka's Produce API).

A door decodes its own wire format into `Record`s and maps errors back to its own answers; the
rules of taking records in live here and below: validation (the partition is led here, a request
holds records), the one size rule (`core.produce_size`, which the batcher applies again to every
request it is given), idempotence bookkeeping (an idempotent producer's batch already stored is
answered with its offset, one being stored shares that attempt, a batch that does not follow its
producer's last stored one is refused, stored batches are kept durably where the log store can),
and the hand-off to the node (which encodes the records, in the batcher, once).

A partition's producers as its log says are part of its state (`PartitionState.producers`, as
Kafka's ProducerStateManager): applied from every durable placeholder's producer spans, kept in
its snapshots, so rebuilt from the snapshot and the log each time a term of the partition
begins on a node, and holding exactly what is durable. Within a term only this node appends,
and only the partition's lane appends idempotent batches, one produce at a time: the lane
checks a batch against that state (already stored: its offset; not following its producer's
last stored batch: refused) and appends it under the same term (`Node.produce`'s `term`). A
batch stored by another node or by this one before a crash is never missed, so the one after
it is never refused as out of order and a retry is never stored twice. What the intake keeps
itself (`sequences`, and the log store's sequence table) only answers retries sooner, and
recognises those of producers the partition's state no longer remembers.

Idempotent record sets (Kafka's) go through a lane per partition: queued without an await, in the
order a connection submitted them, and stored by the lane's drain task, as many at once as one
produce may hold. The order is the point: an idempotent producer's batch N+1 must not be stored
before batch N. HTTP requests go to the node directly.

Fetchers waiting for new records (`wait_appended`) are woken by every produce through here.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import anyio
import anyio.abc

from levelzero.core.entries import ProducerSpan
from levelzero.core.errors import (
    IdempotencyKeyReused,
    InvalidInput,
    KeylessRecord,
    LevelZeroError,
    OutOfOrderSequence,
    ShuttingDown,
    TooLarge,
)
from levelzero.core.l0format import Record
from levelzero.core.produce_size import check_produce_size
from levelzero.core.producers import (
    BATCHES_REMEMBERED,
    KEY_EPOCH_UNCHECKED,
    PRODUCERS_MAX_DEFAULT,
    PartitionProducers,
    ProducerSequences,
    StoredBatch,
    epoch_refusal,
    following_sequence,
    key_repeat_differs,
    key_reused,
    request_epoch,
)
from levelzero.storage.protocols import ProducerBatchExpiry, ProducerBatchRow, ProducerBatchStore

from .batcher import ProduceResult
from .node import Node

log = logging.getLogger("levelzero.intake")

# (producer id, producer epoch, topic, partition, base sequence) of an idempotent record set.
Identity = tuple[int, int, str, int, int]

# Told each produce a front end served: its seconds, from the decoded request to the answer, and
# whether it was acknowledged (every partition stored); the daemon's produce latency histogram.
ProduceObserver = Callable[[float, bool], None]


def unobserved(seconds: float, acknowledged: bool) -> None:
    """The observer of a front end run without metrics (tests, benchmarks)."""


# Producer ids of HTTP idempotency keys: 62 bits of the key's SHA-256 above 2**62, where ids
# handed to Kafka producers (milliseconds << 16, counted up) do not reach.
IDEMPOTENCY_ID_BASE = 1 << 62


# How long an idempotency key's stored batch is kept at least (a repeat within it is answered
# the first produce's offsets; later, its records may be stored again), and how its expiry runs:
# a pass this often, forgetting at most this many keys' batches (the oldest first).
IDEMPOTENCY_KEY_RETENTION_S_DEFAULT = 7 * 86_400.0  # as Kafka's transactional.id.expiration.ms
KEY_EXPIRY_INTERVAL_S = 60.0
KEY_EXPIRY_ROWS_MAX = 10_000
# Kafka producers' stored batches (one producer id per producer instance: a restarted client,
# a cron job, each gets a new one) are forgotten this long after they were stored, as Kafka's
# broker forgets a producer's state (producer.id.expiration.ms: 1 day), by the same pass.
PRODUCER_ID_EXPIRATION_S_DEFAULT = 86_400.0


def idempotency_producer_id(key: str) -> int:
    digest = hashlib.sha256(key.encode()).digest()
    return IDEMPOTENCY_ID_BASE | int.from_bytes(digest[:8], "big") & (IDEMPOTENCY_ID_BASE - 1)


def _reuse_refusal(
    stored_epoch: int | None, epoch: int, first_batch: Callable[[int], StoredBatch | None]
) -> IdempotencyKeyReused | None:
    """The refusal of an idempotency key's batch at `epoch` whose producer is stored at
    `stored_epoch` with other records (`key_reused`), naming the offsets of the key's first
    batch (`first_batch` of the stored epoch) while they are known; None if it is no reuse."""
    if not key_reused(stored_epoch, epoch):
        return None
    assert stored_epoch is not None
    first = first_batch(stored_epoch)
    return IdempotencyKeyReused(None if first is None else (first.base_offset, first.record_count))


@dataclass(eq=False, slots=True)
class Pending:
    """One partition's record set of one produce request, queued on the partition's lane."""

    topic: str
    partition: int
    records: list[Record]
    size: int
    identity: Identity | None
    done: anyio.Event = field(default_factory=anyio.Event)
    base_offset: int = -1
    error: LevelZeroError | None = None
    stored: StoredBatch | None = None  # answered as a repeat of this batch, stored before
    # A record set earlier in the same lane this one must not be stored without (a Kafka
    # transaction's records behind the previous transaction's marker): refused if it failed.
    after: Pending | None = None
    # How long it may wait in the lane, alone, for other record sets to share its round (a
    # transaction's marker: the producer's next transaction's records), from `queued_at`.
    gather_s: float = 0.0
    queued_at: float = 0.0
    # The batch window that takes it is cut this long after, if sooner (a transaction's marker:
    # its producer's next transaction waits on its round).
    linger_s: float | None = None


class ProduceIntake:
    def __init__(
        self,
        node: Node,
        *,
        key_retention_s: float | None = IDEMPOTENCY_KEY_RETENTION_S_DEFAULT,
        producer_id_expiration_s: float = PRODUCER_ID_EXPIRATION_S_DEFAULT,
    ) -> None:
        assert key_retention_s is None or key_retention_s > 0, key_retention_s
        assert producer_id_expiration_s > 0, producer_id_expiration_s
        self.node = node
        self.key_retention_s = key_retention_s  # None: idempotency keys are kept forever
        self.producer_id_expiration_s = producer_id_expiration_s
        # Set (and replaced) whenever a produce through here is acknowledged, so long polls
        # wake at once.
        self._appended = anyio.Event()
        # Producer ids: milliseconds since the epoch at start-up, shifted, then counted up, so a
        # restarted daemon hands out ids above those of its previous runs (unless one run gave
        # out more than 65,536 ids a millisecond).
        self._next_producer_id = int(time.time() * 1000) << 16
        self.sequences = ProducerSequences()
        # The partition (its pid) each (topic, partition) remembered in `sequences` is of.
        self._pids: dict[tuple[str, int], int] = {}
        node.topic_deleted.append(self.forget_topic)
        # Where producers' last batches are kept durably (the SQLite store; elsewhere: memory
        # only), and the producers whose stored batches are already in `sequences`.
        store = node.log_store
        self._producer_store = store if isinstance(store, ProducerBatchStore) else None
        self._key_expiry = store if isinstance(store, ProducerBatchExpiry) else None
        self._loaded_producers: dict[int, None] = {}
        # identity -> its record set being stored, for a retry that arrives while the first
        # attempt is still under way.
        self._producing: dict[Identity, Pending] = {}
        # (topic, partition) -> record sets waiting to be stored, while a drain task runs.
        self._lanes: dict[tuple[str, int], deque[Pending]] = {}
        # Set when a record set joins the lane, while its drain task waits (`gather_s`).
        self._lane_grew: dict[tuple[str, int], anyio.Event] = {}
        self._tg: anyio.abc.TaskGroup | None = None

    @property
    def running(self) -> bool:
        return self._tg is not None

    async def run(self, *, task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        """The task group of the lanes' drain tasks; runs until cancelled (once at a time)."""
        assert self._tg is None, "ProduceIntake.run runs once at a time"
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                if self._key_expiry is not None:
                    await tg.start(self._expire_keys_periodically)
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._tg = None

    async def expire_keys(self, now: float) -> None:
        """Forget idempotency keys' batches stored more than `key_retention_s` before `now`,
        and Kafka producers' stored more than `producer_id_expiration_s` before it (at most
        KEY_EXPIRY_ROWS_MAX of each, the oldest first)."""
        if self._key_expiry is None:
            return
        if self.key_retention_s is not None:
            await self._key_expiry.expire_producer_batches(
                IDEMPOTENCY_ID_BASE, now - self.key_retention_s, KEY_EXPIRY_ROWS_MAX
            )
        await self._key_expiry.expire_producer_batches(
            0, now - self.producer_id_expiration_s, KEY_EXPIRY_ROWS_MAX, IDEMPOTENCY_ID_BASE
        )

    async def _expire_keys_periodically(
        self, *, task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """A pass every KEY_EXPIRY_INTERVAL_S, the first before the intake is started."""
        while True:
            try:
                await self.expire_keys(time.time())
            except LevelZeroError as exc:  # the store is down: the next pass tries again
                log.warning("intake: cannot expire producers' and idempotency keys' batches: %s", exc)
            task_status.started()
            task_status = anyio.TASK_STATUS_IGNORED
            await anyio.sleep(KEY_EXPIRY_INTERVAL_S)

    # ------------------------------------------------------------------ what a door asks

    def check_led(self, topic: str, partition: int) -> None:
        """Raise LevelZeroError (unknown topic or partition, led elsewhere) unless led here."""
        pid = self.node.partition(topic, partition).row.pid
        if self._pids.get((topic, partition)) != pid:
            self._new_partition(topic, partition, pid)

    def _new_partition(self, topic: str, partition: int, pid: int) -> None:
        """The partition is another log than the one this intake remembered producers of: its
        topic was deleted and made again with its name (here, or on another node of a cluster).
        Its producers and idempotency keys start unknown, as the new log's own state has them:
        a key used on the old partition, remembered here, was answered as a repeat of a record
        the new partition never stored."""
        if (topic, partition) in self._pids:
            self.sequences.forget_partition(topic, partition)
        self._pids[(topic, partition)] = pid

    def forget_topic(self, topic: str) -> None:
        """The topic was deleted here: its partitions' producers go (a topic deleted elsewhere in
        a cluster is found out by `check_led`, at its name's next use)."""
        for key in [k for k in self._pids if k[0] == topic]:
            del self._pids[key]
        self.sequences.forget_topic(topic)

    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """(start offset, high watermark) of a partition led here (LevelZeroError otherwise)."""
        state = self.node.partition(topic, partition).state
        return state.start_offset, state.high_watermark

    async def wait_appended(self, timeout_s: float) -> None:
        """Return when a produce through the intake is acknowledged, or after `timeout_s`."""
        with anyio.move_on_after(timeout_s):
            await self._appended.wait()

    def _wake_fetchers(self) -> None:
        self._appended.set()
        self._appended = anyio.Event()

    # ------------------------------------------------------------------ plain produce

    def check_size(self, topic: str, records: Sequence[Record], wire_bytes: int | None = None) -> int | None:
        """A compacted topic's records have keys (KeylessRecord, Kafka's INVALID_RECORD).
        The one size rule for one request's records: at most the topic's
        `max.message.bytes`, which is at most the batcher's `batch_bytes_max` (TooLarge). Their
        size by the rule, or None when the batcher's own check is all there is to do.
        `wire_bytes`: a Kafka producer's record batch as sent (compressed), which Kafka's
        broker holds to a topic's `max.message.bytes` instead (a gzip batch of 10 KiB of text
        passes a limit of 2,000 bytes there); the batcher's limit, the node's (and a topic's
        that is not below it), is still the rule's: what is stored, uncompressed."""
        policy = self.node.topic_configs.policy(topic)
        if policy.compacted and any(r.key is None for r in records):
            raise KeylessRecord(topic)
        limit = policy.max_message_bytes
        batch_bytes_max = self.node.batcher.config.batch_bytes_max
        if wire_bytes is not None and limit < batch_bytes_max:  # (else the batcher's is the limit)
            if wire_bytes > limit:
                raise TooLarge(
                    wire_bytes, limit, f"topic {topic}'s max.message.bytes", len(records), as_sent=True
                )
            return None
        if limit >= batch_bytes_max:
            return None
        return check_produce_size(records, limit, limit_name=f"topic {topic}'s max.message.bytes")

    async def produce(self, topic: str, partition: int, records: Sequence[Record]) -> ProduceResult:
        """Store `records` contiguously (HTTP's produce): the node's batcher checks the size
        rule and encodes them (a topic's smaller `max.message.bytes` is checked here)."""
        if not records:
            raise InvalidInput("a produce request needs at least one record")
        self.check_size(topic, records)
        result = await self.node.produce(topic, partition, records)
        self._wake_fetchers()
        return result

    # ------------------------------------------------------------------ idempotent record sets

    def new_producer_id(self) -> int:
        producer_id = self._next_producer_id
        self._next_producer_id += 1
        self._mark_loaded(producer_id)  # new: nothing stored for it
        return producer_id

    async def prepare_producer(self, producer_id: int, targets: Sequence[tuple[str, int]]) -> None:
        """Before an idempotent producer's record sets are submitted: what this process knows of
        its stored batches after a restart (the store's sequence table; the partitions' own
        state is what the lanes check against)."""
        del targets  # (the lanes look at the partitions)
        await self._load_producer(producer_id)

    def submit(
        self,
        topic: str,
        partition: int,
        records: list[Record],
        identity: Identity | None,
        after: Pending | None = None,
        gather_s: float = 0.0,
        linger_s: float | None = None,
        wire_bytes: int | None = None,
    ) -> Pending | int:
        """Queue one record set on the partition's lane (no await: record sets are stored in
        the order they are submitted). An idempotent batch already stored answers its base
        offset; one being stored answers that attempt. `after`: a record set of this lane
        submitted before; if it fails, this one fails with its error instead of being stored
        after it. `gather_s`: how long this record set may wait for others while it is all the
        lane holds (then it is stored in their round, not in one before it). `linger_s`: the
        batch window that takes its round is cut this long after, if sooner. `wire_bytes`: the
        Kafka record batch's size as sent (`check_size`). Raises
        LevelZeroError (InvalidInput, TooLarge, the partition's) for a record set that is not
        taken."""
        self.check_led(topic, partition)
        if not records:
            raise InvalidInput("the produce request holds no records")
        # The one size rule (the topic's max.message.bytes, else the batcher's limit): sets are
        # packed into one request by the lane.
        size = self.check_size(topic, records, wire_bytes)
        if size is None:
            size = check_produce_size(records, self.node.batcher.config.batch_bytes_max)
        assert size is not None
        if identity is not None:
            assert identity[2:4] == (topic, partition), identity
            stored = self.sequences.duplicate_of(*identity)
            if stored is not None:
                return stored.base_offset
            pending = self._producing.get(identity)
            if pending is not None:
                return pending  # a retry (on another connection) of a batch being stored
        assert after is None or (after.topic, after.partition) == (topic, partition), after
        now = anyio.current_time()
        pending = Pending(
            topic,
            partition,
            records,
            size,
            identity,
            after=after,
            gather_s=gather_s,
            queued_at=now,
            linger_s=linger_s,
        )
        if identity is not None:
            self._producing[identity] = pending
        lane = self._lanes.get((topic, partition))
        if lane is None:
            lane = self._lanes[(topic, partition)] = deque()
            assert self._tg is not None, "ProduceIntake.run is not running"
            self._tg.start_soon(self._drain, topic, partition, lane)
        lane.append(pending)
        grew = self._lane_grew.pop((topic, partition), None)
        if grew is not None:
            grew.set()
        return pending

    async def produce_once(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        key: str,
        *,
        as_sent: Sequence[Record] | None = None,
    ) -> tuple[int, int, bool]:
        """HTTP's produce with an idempotency key: stored once. The key names an idempotent
        producer of its own (`idempotency_producer_id`) whose one batch is sequence 0, so a
        repeat is recognised as Kafka's retried batches are (in memory, in the store's sequence
        table across restarts, in the partition's recent placeholders after a crash) while the
        (producer, partition) pair is among the PRODUCERS_MAX_DEFAULT remembered and for at
        least `key_retention_s` in the store (then `expire_keys` forgets it there). Returns
        (base offset, record count, duplicate): a repeat answers the first produce's offsets
        and count and stores nothing. The batch's producer epoch is a digest of its records
        (`request_epoch`): the key repeated with other records is refused
        (IdempotencyKeyReused), here or in the lane, and nothing is stored; so is a "repeat"
        whose first produce held another number of records (`key_repeat_differs`: a digest
        shared by chance, or a key stored before the digest was kept). `as_sent`: the records
        as the client sent them, for the digest, where `records` differ by what the daemon
        added (a timestamp where the client gave none: each attempt stamps its own)."""
        base_offset, record_count, duplicate = await self._store_once(
            topic, partition, records, key, as_sent if as_sent is not None else records
        )
        if duplicate and key_repeat_differs(record_count, len(records)):
            raise IdempotencyKeyReused((base_offset, record_count))
        return base_offset, record_count, duplicate

    async def _store_once(
        self, topic: str, partition: int, records: Sequence[Record], key: str, as_sent: Sequence[Record]
    ) -> tuple[int, int, bool]:
        """`produce_once` but for comparing a repeat's record count with the first produce's."""
        assert len(as_sent) == len(records), (len(as_sent), len(records))
        producer_id = idempotency_producer_id(key)
        epoch = request_epoch(as_sent)
        self.check_led(topic, partition)
        await self.prepare_producer(producer_id, [(topic, partition)])
        stored_epoch = self.sequences.epoch_of(producer_id, topic, partition)
        refusal = _reuse_refusal(
            stored_epoch, epoch, lambda e: self.sequences.duplicate_of(producer_id, e, topic, partition, 0)
        )
        if refusal is not None:
            raise refusal
        if stored_epoch == KEY_EPOCH_UNCHECKED:
            epoch = stored_epoch  # stored before its records' digest was kept: compared by count
        identity = (producer_id, epoch, topic, partition, 0)
        mine = list(records)
        outcome = self.submit(topic, partition, mine, identity)
        if isinstance(outcome, int):
            stored = self.sequences.duplicate_of(*identity)
            assert stored is not None, identity
            return outcome, stored.record_count, True
        await outcome.done.wait()
        if outcome.error is not None:
            raise outcome.error
        if outcome.stored is not None:  # the lane found it stored (another node, a crash)
            return outcome.base_offset, outcome.stored.record_count, True
        # Another request's attempt of the same identity joined (being stored): a repeat.
        return outcome.base_offset, len(outcome.records), outcome.records is not mine

    async def _load_producer(self, producer_id: int) -> None:
        """A producer this process has not seen (a retry after a restart): its stored batches."""
        if self._producer_store is None or producer_id in self._loaded_producers:
            return
        try:
            rows = await self._producer_store.producer_batches(producer_id)
        except LevelZeroError as exc:
            log.warning("intake: cannot read producer %d's batches: %s", producer_id, exc)
            return
        if producer_id in self._loaded_producers:
            return  # another request loaded it meanwhile (and may have recorded newer batches)
        for row in rows:
            self.sequences.record(
                row.producer_id,
                row.producer_epoch,
                row.topic,
                row.partition,
                row.base_sequence,
                row.record_count,
                row.base_offset,
            )
        self._mark_loaded(producer_id)

    def _mark_loaded(self, producer_id: int) -> None:
        self._loaded_producers[producer_id] = None
        while len(self._loaded_producers) > PRODUCERS_MAX_DEFAULT:
            del self._loaded_producers[next(iter(self._loaded_producers))]

    async def _drain(self, topic: str, partition: int, lane: deque[Pending]) -> None:
        """Store a partition's queued record sets, as many at once as one produce may hold
        (contiguous offsets, in queue order), until the lane is empty."""
        batch_bytes_max = self.node.batcher.config.batch_bytes_max
        taken: list[Pending] = []
        try:
            while lane:
                await self._gather(topic, partition, lane)
                size = 0
                while lane and (not taken or size + lane[0].size <= batch_bytes_max):
                    size += lane[0].size
                    taken.append(lane.popleft())
                taken = self._after_stored(taken)
                if not taken:
                    continue
                term = None
                if any(p.identity is not None for p in taken):
                    # Checked against what is durable, then appended under the same term.
                    try:
                        actor = await self.node.led_partition(topic, partition)
                    except LevelZeroError as exc:
                        for p in taken:
                            self._finish(p, error=exc)
                        taken = []
                        continue
                    term = actor.term
                    producers = actor.state.producers
                    taken = self._in_sequence(self._without_repeats(taken, producers), producers)
                    taken = self._after_stored(taken)  # behind one refused just now
                    if not taken:
                        continue
                spans, first = [], 0
                linger_s = min((p.linger_s for p in taken if p.linger_s is not None), default=None)
                for p in taken:
                    if p.identity is not None:
                        spans.append(
                            ProducerSpan(p.identity[0], p.identity[1], p.identity[4], len(p.records), first)
                        )
                    first += len(p.records)
                try:
                    result = await self.node.produce(
                        topic, partition, [r for p in taken for r in p.records], spans, term, linger_s
                    )
                except LevelZeroError as exc:
                    for p in taken:
                        self._finish(p, error=exc)
                else:
                    offset = result.base_offset
                    offsets = []
                    for p in taken:
                        offsets.append(offset)
                        offset += len(p.records)
                    if any(p.identity is not None and p.identity[0] >= IDEMPOTENCY_ID_BASE for p in taken):
                        # an idempotency key's row is its record for the retention: first
                        error = await self._keep_sequences(taken, offsets)
                        for p, base_offset in zip(taken, offsets, strict=True):
                            self._finish(p, base_offset=base_offset, error=error)
                    else:
                        for p, base_offset in zip(taken, offsets, strict=True):
                            self._finish(p, base_offset=base_offset)
                        # After the acknowledgement, before the lane's next round (in order).
                        await self._keep_sequences(taken, offsets)
                    self._wake_fetchers()
                taken = []
        finally:
            del self._lanes[(topic, partition)]
            self._lane_grew.pop((topic, partition), None)
            for p in [*taken, *lane]:  # cancelled (shutting down): nothing more is stored
                if not p.done.is_set():
                    self._finish(p, error=ShuttingDown("the produce intake is stopping"))

    async def _gather(self, topic: str, partition: int, lane: deque[Pending]) -> None:
        """While every record set queued may wait for others (`gather_s`), until another joins
        or the first one's time is up."""
        while lane and all(p.gather_s > 0 for p in lane):
            left = min(p.queued_at + p.gather_s for p in lane) - anyio.current_time()
            if left <= 0:
                return
            grew = self._lane_grew[(topic, partition)] = anyio.Event()
            with anyio.move_on_after(left):
                await grew.wait()

    def _after_stored(self, taken: list[Pending]) -> list[Pending]:
        """The record sets to store, less those whose `after` failed (failed with its error).
        An `after` is ahead in the lane: stored in an earlier round (done), or taken in this
        one (checked again once this round's refusals are done)."""
        kept = []
        for p in taken:
            before = p.after
            if before is not None and before.done.is_set() and before.error is not None:
                self._finish(p, error=before.error)
            else:
                kept.append(p)
        return kept

    def _without_repeats(self, taken: list[Pending], producers: PartitionProducers) -> list[Pending]:
        """The record sets to store, less the idempotent batches stored already (a retry whose
        first attempt's answer was lost, stored by this node before a crash or by another):
        answered with the offset they were stored at. The partition's state knows every recent
        producer's last batches; the intake's memory, older producers' too."""
        kept = []
        keys: dict[int, int] = {}  # idempotency keys' producers taken in this round: epoch
        for p in taken:
            stored = None
            if p.identity is not None:
                producer_id, epoch, _, _, base_sequence = p.identity
                reused = None
                if producer_id >= IDEMPOTENCY_ID_BASE:
                    reused = self._key_reused(p.identity, producers, keys)
                if reused is not None:
                    self._finish(p, error=reused)
                    continue
                stored = self._stored(p.identity, producers)
                if (
                    stored is None
                    and producer_id >= IDEMPOTENCY_ID_BASE  # a key stored before its digest was kept
                    and producers.epoch_of(producer_id) == KEY_EPOCH_UNCHECKED
                ):
                    stored = producers.duplicate_of(producer_id, KEY_EPOCH_UNCHECKED, base_sequence)
            if stored is None:
                kept.append(p)
            else:
                self._finish(p, base_offset=stored.base_offset, stored=stored)
        return kept

    def _stored(self, identity: Identity, producers: PartitionProducers) -> StoredBatch | None:
        """The batch stored with `identity` (a repeat), as the partition's state knows it, else
        as this intake remembers it (a producer the state forgot)."""
        producer_id, epoch, _, _, base_sequence = identity
        stored = producers.duplicate_of(producer_id, epoch, base_sequence)
        return stored if stored is not None else self.sequences.duplicate_of(*identity)

    def _known_epoch(self, identity: Identity, producers: PartitionProducers) -> int | None:
        """The producer's epoch in the partition, known the same way as `_stored`."""
        producer_id, _, topic, partition, _ = identity
        known = producers.epoch_of(producer_id)
        return known if known is not None else self.sequences.epoch_of(producer_id, topic, partition)

    def _key_reused(
        self, identity: Identity, producers: PartitionProducers, keys: dict[int, int]
    ) -> IdempotencyKeyReused | None:
        """The refusal of an idempotency key's batch that repeats the key with other records
        than those it was stored with (the partition's state, this process's memory) or than
        another batch of the key taken in this round (`keys`, which this one joins); None if
        it does not."""
        producer_id, epoch, topic, partition, _ = identity
        if epoch == KEY_EPOCH_UNCHECKED:
            return None  # a repeat of a key stored before the digest was kept (produce_once)
        refusal = _reuse_refusal(
            producers.epoch_of(producer_id), epoch, lambda e: producers.duplicate_of(producer_id, e, 0)
        )
        if refusal is None:
            refusal = _reuse_refusal(
                self.sequences.epoch_of(producer_id, topic, partition),
                epoch,
                lambda e: self.sequences.duplicate_of(producer_id, e, topic, partition, 0),
            )
        if refusal is not None:
            return refusal
        if key_reused(keys.get(producer_id), epoch):
            return IdempotencyKeyReused()  # the first of the two is not stored yet
        keys[producer_id] = epoch
        return None

    def _in_sequence(self, taken: list[Pending], producers: PartitionProducers) -> list[Pending]:
        """The record sets to store, less the idempotent batches that do not follow their
        producer's last stored one in the partition's state (Kafka's rule; answered
        OutOfOrderSequence, which a client retries once the earlier batch is stored). Stored in
        sequence order, a producer's five batches remembered cover its window of five
        unacknowledged ones. A producer the state does not know may start anywhere. A batch of
        an epoch older than the producer's known one is a zombie's (StaleProducerEpoch); a newer
        epoch starts at sequence 0 (`core.producers.epoch_refusal`)."""
        kept = []
        expected: dict[tuple[int, int], int | None] = {}
        epochs: dict[int, int] = {}  # producers' epochs taken in this round
        for p in taken:
            if p.identity is not None:
                producer_id, epoch, _, _, base_sequence = p.identity
                if producer_id < IDEMPOTENCY_ID_BASE:  # a key's epoch is a digest, not an order
                    known = epochs.get(producer_id)
                    if known is None:
                        known = self._known_epoch(p.identity, producers)
                    refusal = epoch_refusal(producer_id, known, epoch, base_sequence)
                    if refusal is not None:
                        self._finish(p, error=refusal)
                        continue
                    epochs[producer_id] = epoch
                key = (producer_id, epoch)
                want = expected[key] if key in expected else producers.next_sequence(producer_id, epoch)
                if want is not None and base_sequence != want:
                    self._finish(p, error=OutOfOrderSequence(producer_id, base_sequence, want))
                    continue
                expected[key] = following_sequence(base_sequence, len(p.records))
            kept.append(p)
        return kept

    async def _keep_sequences(self, taken: list[Pending], offsets: list[int]) -> LevelZeroError | None:
        """Idempotent batches' sequences kept in the store's table (where it has one). A Kafka
        producer's are written after its batches are acknowledged (as Kafka keeps producer state
        in the log alone): what recognises its retry after a restart is durable already, in the
        commit that stored the records (each placeholder carries its producer spans, which
        rebuild the partition's producers; its snapshots keep the last
        PARTITION_PRODUCERS_MAX), and a retry comes within the client's delivery timeout; the
        table serves a producer the partition has forgotten since. An idempotency key's
        (HTTP), which may be repeated for `key_retention_s` after thousands of other keys, is
        durable before the produce is acknowledged: a failure here fails the acknowledgement
        (the client retries; the batch, stored, is recognised in memory). The failure, if any
        (logged)."""
        rows = [
            ProducerBatchRow(
                p.identity[0],
                p.identity[1],
                p.topic,
                p.partition,
                p.identity[4],
                len(p.records),
                base_offset,
                time.time(),
            )
            for p, base_offset in zip(taken, offsets, strict=True)
            if p.identity is not None
        ]
        if not rows or self._producer_store is None:
            return None
        for p, base_offset in zip(taken, offsets, strict=True):
            if p.identity is not None:
                self.sequences.record(*p.identity, len(p.records), base_offset)
        try:
            await self._producer_store.record_producer_batches(rows, keep=BATCHES_REMEMBERED)
        except LevelZeroError as exc:
            log.warning("intake: cannot keep idempotent producers' sequences: %s", exc)
            return exc
        return None

    def _finish(
        self,
        pending: Pending,
        *,
        base_offset: int = -1,
        error: LevelZeroError | None = None,
        stored: StoredBatch | None = None,
    ) -> None:
        pending.base_offset = base_offset
        pending.error = error
        pending.stored = stored
        if pending.identity is not None:
            self._producing.pop(pending.identity, None)
            if error is None and stored is None:
                self.sequences.record(*pending.identity, len(pending.records), base_offset)
        pending.done.set()
