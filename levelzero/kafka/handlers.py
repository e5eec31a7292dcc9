"""The Kafka APIs, each a translation between a kio request and the same `Node` operations the
HTTP API calls (`create_topic`, `produce`, `fetch`, the partition's state for offsets).

Operating errors (`LevelZeroError`) become Kafka error codes per partition or per topic
(`error_code_for`); a stale cluster epoch never reaches a client (the batcher retries it inside).
Records keep their keys, values, timestamps and headers (L0/L1 format 2); a null value is
stored as an empty one.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
from kio.schema.errors import ErrorCode

from levelzero.actors.node import Node
from levelzero.actors.reader import FETCH_BYTES_MAX
from levelzero.kafka import records as kr
from levelzero.core.entries import Placeholder, ProducerSpan
from levelzero.core.cluster import preferred_leader
from levelzero.core.errors import LevelZeroError, ShuttingDown, TooLarge
from levelzero.core.l0format import Record
from levelzero.core.produce_size import check_produce_size
from levelzero.core.producers import BATCHES_REMEMBERED, PRODUCERS_MAX_DEFAULT, ProducerSequences
from levelzero.storage.protocols import ProducerBatchRow, ProducerBatchStore

from levelzero.kafka.groups import METADATA_CHARS_MAX, GroupCoordinator
from levelzero.kafka.protocol import Request, api_versions_response, make

log = logging.getLogger("levelzero.kafka")

NODE_ID = 0  # the broker id of a node that is not in a cluster
CLUSTER_ID = "levelzero"
# Metadata in a cluster reads the cluster view again when it is older than this (a client asks
# after NOT_LEADER_OR_FOLLOWER: the answer must name the new leader, not the round-old one).
METADATA_VIEW_AGE_MAX_S = 0.5
FETCH_WAIT_MAX_MS = 30_000  # a client asking to wait longer waits this long
FETCH_RESPONSE_BYTES_MAX = 64 * 1024 * 1024  # whatever max_bytes a fetch asks for
FETCH_POLL_S = 0.1  # long polls re-check partitions this often when nothing wakes them
LIST_OFFSETS_LATEST = -1
LIST_OFFSETS_EARLIEST = -2
LIST_OFFSETS_SCAN_RECORDS_MAX = 1_000_000  # ListOffsets by time reads at most this many records
# A producer's first idempotent batch to a partition after a start reads the partition's recent
# placeholders (the batches a crash may have left out of the sequence table) this far back.
RECOVER_RECORDS_MAX = 100_000
RECOVER_PLACEHOLDERS_MAX = 1_000

ERROR_BY_CODE: dict[str, ErrorCode] = {
    "unknown_topic": ErrorCode.unknown_topic_or_partition,
    "unknown_partition": ErrorCode.unknown_topic_or_partition,
    "offset_out_of_range": ErrorCode.offset_out_of_range,
    "corrupt_message": ErrorCode.corrupt_message,
    "unsupported_compression": ErrorCode.unsupported_compression_type,
    "not_leader": ErrorCode.not_leader_or_follower,
    "stale_cluster_epoch": ErrorCode.not_leader_or_follower,  # retriable; the batcher retried
    "shutting_down": ErrorCode.not_leader_or_follower,
    "storage_error": ErrorCode.kafka_storage_error,
    "store_refused": ErrorCode.kafka_storage_error,
    "topic_exists": ErrorCode.topic_already_exists,
    "invalid_input": ErrorCode.invalid_request,
    "too_large": ErrorCode.message_too_large,
    "corrupt_data": ErrorCode.kafka_storage_error,
    "object_not_found": ErrorCode.kafka_storage_error,
}


def broker_id(node_id: str) -> int:
    """The Kafka broker id (an int32 >= 0) of a cluster node: the same on every node."""
    digest = hashlib.blake2b(node_id.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF


@dataclass(frozen=True, slots=True)
class Broker:
    node_id: int
    host: str
    port: int


def error_code_for(exc: BaseException) -> ErrorCode:
    if isinstance(exc, LevelZeroError):
        return ERROR_BY_CODE.get(exc.code, ErrorCode.unknown_server_error)
    return ErrorCode.unknown_server_error


@dataclass(eq=False, slots=True)
class _Pending:
    """One partition's record set of one produce request, queued on the partition's lane."""

    topic: str
    partition: int
    records: list[Record]
    size: int
    identity: tuple[int, int, str, int, int] | None
    done: anyio.Event = field(default_factory=anyio.Event)
    base_offset: int = -1
    error: LevelZeroError | None = None


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    advertised_host: str
    advertised_port: int
    default_partitions: int = 1


class Handlers:
    def __init__(self, node: Node, settings: KafkaSettings) -> None:
        self.node = node
        self.settings = settings
        # Set (and replaced) whenever a produce through this listener is acknowledged, so long
        # polls wake at once; produces through the HTTP API are seen within FETCH_POLL_S.
        self._appended = anyio.Event()
        # Producer ids: milliseconds since the epoch at start-up, shifted, then counted up, so a
        # restarted daemon hands out ids above those of its previous runs (unless one run gave
        # out more than 65,536 ids a millisecond).
        self._next_producer_id = int(time.time() * 1000) << 16
        self.sequences = ProducerSequences()
        # Where producers' last batches are kept durably (the SQLite store; elsewhere: memory
        # only), and the producers whose stored batches are already in `sequences`.
        store = node.log_store
        self._producer_store = store if isinstance(store, ProducerBatchStore) else None
        self._loaded_producers: dict[int, None] = {}
        self._recovered: dict[tuple[int, str, int], None] = {}  # (producer, topic, partition) scanned
        self.groups = GroupCoordinator(node.log_store)
        # (producer id, epoch, topic, partition, base sequence) -> its record set being stored,
        # for a retry that arrives while the first attempt is still under way.
        self._producing: dict[tuple[int, int, str, int, int], _Pending] = {}
        # (topic, partition) -> record sets waiting to be stored, while a drain task runs.
        self._lanes: dict[tuple[str, int], deque[_Pending]] = {}
        self._tg: anyio.abc.TaskGroup | None = None

    async def run(self, *, task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        """The task group of the partitions' drain tasks; runs until cancelled."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            await anyio.sleep_forever()

    async def handle(
        self, request: Request, after: anyio.Event | None = None, submitted: anyio.Event | None = None
    ) -> Any | None:
        """The response for `request` (None: the client expects none, acks=0). `after` and
        `submitted` order a connection's produce requests (see `produce`)."""
        match request.api_key:
            case 18:
                return api_versions_response(request.api_version)
            case 3:
                return await self.metadata(request)
            case 19:
                return await self.create_topics(request)
            case 0:
                return await self.produce(request, after, submitted)
            case 1:
                return await self.fetch(request)
            case 2:
                return await self.list_offsets(request)
            case 22:
                return self.init_producer_id(request)
            case 10:
                return self.find_coordinator(request)
            case 11:
                return await self.join_group(request)
            case 14:
                return await self.sync_group(request)
            case 12:
                return self.heartbeat(request)
            case 13:
                return self.leave_group(request)
            case 8:
                return await self.offset_commit(request)
            case 9:
                return await self.offset_fetch(request)
        raise AssertionError(f"no handler for api key {request.api_key}")  # protocol checked it

    # ------------------------------------------------------------------ metadata

    # ------------------------------------------------------------------ the cluster

    def _me(self) -> Broker:
        member = self.node.member
        return Broker(NODE_ID if member is None else broker_id(member.node_id),
                      self.settings.advertised_host, self.settings.advertised_port)

    def _brokers(self) -> dict[str, Broker]:
        """Node id -> broker: the live nodes of the last cluster view that listen for Kafka
        clients (this one always); alone, this node."""
        member = self.node.member
        if member is None:
            return {"": self._me()}
        brokers = {member.node_id: self._me()}
        view = member.view
        for row in view.nodes if view is not None else ():
            if row.kafka_url and row.lease_expires_at > view.now and row.node_id not in brokers:
                host, _, port = row.kafka_url.rpartition(":")
                if host and port.isdigit():
                    brokers[row.node_id] = Broker(broker_id(row.node_id), host.strip("[]"), int(port))
        return brokers

    def _leaders(self, brokers: dict[str, Broker]) -> dict[tuple[str, int], int]:
        """(topic, partition) -> its leader's broker id, for partitions with a live leader."""
        member = self.node.member
        me = self._me().node_id
        if member is None:
            return {(t, p): me for t, n in self.node.topics().items() for p in range(n)}
        leaders: dict[tuple[str, int], int] = {}
        view = member.view
        for lease in view.leases if view is not None else ():
            broker = brokers.get(lease.node_id or "")
            if broker is not None and lease.lease_expires_at > view.now:
                leaders[(lease.topic, lease.partition)] = broker.node_id
        for actor in self.node.partitions():  # what this node leads, whatever the view says
            leaders[(actor.row.topic, actor.row.partition)] = me
        return leaders

    def _coordinator(self, group_id: str) -> Broker:
        """The node coordinating a consumer group: rendezvous over the live Kafka nodes, so
        every node names the same one (alone: this node)."""
        brokers = self._brokers()
        chosen = preferred_leader(f"group:{group_id}", sorted(brokers))
        return brokers[chosen] if chosen is not None else self._me()

    def _coordinates(self, group_id: str) -> bool:
        return self.node.member is None or self._coordinator(group_id) == self._me()

    # ------------------------------------------------------------------ metadata

    async def metadata(self, request: Request) -> Any:
        m = request.response_module
        member = self.node.member
        brokers = self._brokers()
        leaders = self._leaders(brokers)
        if member is not None:
            # A view older than METADATA_VIEW_AGE_MAX_S is read again, and one that shows a
            # partition without a leader (a move, a topic just made) if it is older than a
            # tenth of that: the client asks again soon after LEADER_NOT_AVAILABLE.
            age = METADATA_VIEW_AGE_MAX_S
            if len(leaders) < sum(self.node.topics().values()):
                age /= 10
            try:
                if member.view is not await member.fresh_view(age):
                    brokers = self._brokers()
                    leaders = self._leaders(brokers)
            except LevelZeroError as exc:  # the last view answers
                log.warning("kafka metadata: reading the cluster view failed: %s", exc)
        topics = self.node.topics()
        if request.body.topics is None:
            names = sorted(topics)
        else:
            names = [t.name for t in request.body.topics if t.name is not None]
        out = []
        for name in names:
            count = topics.get(name)
            partitions = []
            for p in range(count or 0):
                leader = leaders.get((name, p))
                partitions.append(make(
                    m.MetadataResponsePartition,
                    error_code=ErrorCode.none if leader is not None else ErrorCode.leader_not_available,
                    partition_index=p, leader_id=-1 if leader is None else leader,
                    leader_epoch=0, replica_nodes=() if leader is None else (leader,),
                    isr_nodes=() if leader is None else (leader,), offline_replicas=(),
                ))
            error = ErrorCode.none if count is not None else ErrorCode.unknown_topic_or_partition
            out.append(
                make(
                    m.MetadataResponseTopic, error_code=error, name=name, topic_id=None,
                    is_internal=False, partitions=tuple(partitions),
                    topic_authorized_operations=-2147483648,
                )
            )
        shown = tuple(
            make(m.MetadataResponseBroker, node_id=b.node_id, host=b.host, port=b.port, rack=None)
            for b in sorted(brokers.values(), key=lambda b: b.node_id)
        )
        return make(
            m.MetadataResponse, throttle_time=0, brokers=shown, cluster_id=CLUSTER_ID,
            controller_id=min(b.node_id for b in brokers.values()), topics=tuple(out),
            cluster_authorized_operations=-2147483648,
        )

    # ------------------------------------------------------------------ topics

    async def create_topics(self, request: Request) -> Any:
        m = request.response_module
        results = []
        for topic in request.body.topics:
            partitions = topic.num_partitions
            if partitions == -1:
                partitions = self.settings.default_partitions
            error, message = ErrorCode.none, None
            if topic.assignments:
                error, message = ErrorCode.invalid_request, "manual replica assignment is not supported"
            elif topic.name in self.node.topics():
                error, message = ErrorCode.topic_already_exists, f"topic {topic.name!r} exists"
            elif not request.body.validate_only:
                try:
                    await self.node.create_topic(topic.name, partitions)
                except LevelZeroError as exc:
                    error, message = error_code_for(exc), str(exc)
                    if exc.code == "invalid_input":
                        error = (ErrorCode.invalid_partitions if "partitions" in message
                                 else ErrorCode.invalid_topic_exception)
            results.append(
                make(
                    m.CreatableTopicResult, name=topic.name, topic_id=None, error_code=error,
                    error_message=message, num_partitions=partitions,
                    replication_factor=1, configs=None,
                )
            )
        return make(m.CreateTopicsResponse, throttle_time=0, topics=tuple(results))

    # ------------------------------------------------------------------ produce

    async def produce(
        self, request: Request, after: anyio.Event | None = None, submitted: anyio.Event | None = None
    ) -> Any | None:
        """Records reach each partition's lane in the order the connection sent them: this
        request submits once the connection's previous produce has (`after`), then lets the next
        one submit (`submitted`); it does not wait for the previous one to be stored."""
        m = request.response_module
        body = request.body
        jobs = [(t.name, p.index, p.records) for t in body.topic_data for p in t.partition_data]
        for producer_id in {kr.producer_id_of(data or b"") for _, _, data in jobs}:
            if producer_id >= 0:
                await self._load_producer(producer_id)
        for topic, partition, data in jobs:
            producer_id = kr.producer_id_of(data or b"")
            if producer_id >= 0:
                await self._recover_spans(producer_id, topic, partition)
        if after is not None:
            await after.wait()
        outcomes = [self._submit(topic, partition, data) for topic, partition, data in jobs]
        if submitted is not None:
            submitted.set()
        results: list[tuple[ErrorCode, int, str | None]] = []
        for outcome in outcomes:
            if isinstance(outcome, _Pending):
                await outcome.done.wait()
                if outcome.error is not None:
                    results.append(self._produce_failed(outcome.topic, outcome.partition, outcome.error))
                else:
                    results.append((ErrorCode.none, outcome.base_offset, None))
            else:
                results.append(outcome)
        if body.acks == 0:
            return None
        by_topic: dict[str, list[Any]] = {}
        for (topic, partition, _), (code, base_offset, message) in zip(jobs, results, strict=True):
            by_topic.setdefault(topic, []).append(
                make(
                    m.PartitionProduceResponse, index=partition, error_code=code,
                    base_offset=base_offset, log_append_time=None, log_start_offset=-1,
                    record_errors=(), error_message=message,
                )
            )
        responses = tuple(
            make(m.TopicProduceResponse, name=name, partition_responses=tuple(parts))
            for name, parts in by_topic.items()
        )
        return make(m.ProduceResponse, responses=responses, throttle_time=0)

    async def _load_producer(self, producer_id: int) -> None:
        """A producer this process has not seen (a retry after a restart): its stored batches."""
        if self._producer_store is None or producer_id in self._loaded_producers:
            return
        try:
            rows = await self._producer_store.producer_batches(producer_id)
        except LevelZeroError as exc:
            log.warning("kafka: cannot read producer %d's batches: %s", producer_id, exc)
            return
        if producer_id in self._loaded_producers:
            return  # another request loaded it meanwhile (and may have recorded newer batches)
        for row in rows:
            self.sequences.record(row.producer_id, row.producer_epoch, row.topic, row.partition,
                                  row.base_sequence, row.record_count, row.base_offset)
        self._mark_loaded(producer_id)

    async def _recover_spans(self, producer_id: int, topic: str, partition: int) -> None:
        """The producer's batches in the partition's recent placeholders, once per process:
        a batch committed with its data just before a crash, whose row in the sequence table
        was not committed yet, is recognised from the placeholder (they commit together).
        After `_load_producer`, so these (the newest) are remembered last."""
        key = (producer_id, topic, partition)
        if key in self._recovered:
            return
        try:
            actor = self.node.partition(topic, partition)
            recent = await self.node.log_store.read_placeholders(
                actor.row.pid, max(0, actor.state.high_watermark - RECOVER_RECORDS_MAX),
                RECOVER_PLACEHOLDERS_MAX,
            )
        except LevelZeroError as exc:
            log.warning("kafka: cannot read %s/%d's recent placeholders: %s", topic, partition, exc)
            return
        for record in recent:
            entry = record.entry
            assert isinstance(entry, Placeholder), entry
            for span in entry.producers:
                if span.producer_id == producer_id:
                    self.sequences.record(producer_id, span.producer_epoch, topic, partition,
                                          span.base_sequence, span.record_count,
                                          record.base_offset + span.first_record)
        self._recovered[key] = None
        while len(self._recovered) > PRODUCERS_MAX_DEFAULT:
            del self._recovered[next(iter(self._recovered))]

    def _mark_loaded(self, producer_id: int) -> None:
        self._loaded_producers[producer_id] = None
        while len(self._loaded_producers) > PRODUCERS_MAX_DEFAULT:
            del self._loaded_producers[next(iter(self._loaded_producers))]

    def _submit(
        self, topic: str, partition: int, data: bytes | None
    ) -> _Pending | tuple[ErrorCode, int, str | None]:
        """Decode one partition's record set and queue it on the partition's lane (no await:
        requests submit in the order they call this). An idempotent producer's batch that is
        already stored is answered with its offset; one being stored shares that attempt."""
        try:
            self.node.partition(topic, partition)
            batches = kr.decode_batches(data or b"", stored=True)
        except LevelZeroError as exc:
            return self._produce_failed(topic, partition, exc)
        records: list[Record] = [
            r for batch in batches if not batch.is_control for r in batch.records  # type: ignore[misc]
        ]
        if not records:
            return ErrorCode.corrupt_message, -1, "the produce request holds no records"
        # The one size rule, the batcher's: sets are packed into one request by it below.
        try:
            size = check_produce_size(records, self.node.batcher.config.batch_bytes_max)
        except TooLarge as exc:
            return self._produce_failed(topic, partition, exc)
        assert size is not None
        first = batches[0]
        identity = None
        if first.producer_id >= 0 and first.base_sequence >= 0:
            identity = (first.producer_id, first.producer_epoch, topic, partition, first.base_sequence)
            stored = self.sequences.duplicate_of(*identity)
            if stored is not None:
                return ErrorCode.none, stored.base_offset, None
            pending = self._producing.get(identity)
            if pending is not None:
                return pending  # a retry (on another connection) of a batch being stored
        pending = _Pending(topic, partition, records, size, identity)
        if identity is not None:
            self._producing[identity] = pending
        lane = self._lanes.get((topic, partition))
        if lane is None:
            lane = self._lanes[(topic, partition)] = deque()
            assert self._tg is not None, "Handlers.run is not running"
            self._tg.start_soon(self._drain, topic, partition, lane)
        lane.append(pending)
        return pending

    async def _drain(self, topic: str, partition: int, lane: deque[_Pending]) -> None:
        """Store a partition's queued record sets, as many at once as one produce may hold
        (contiguous offsets, in queue order), until the lane is empty."""
        batch_bytes_max = self.node.batcher.config.batch_bytes_max
        taken: list[_Pending] = []
        try:
            while lane:
                size = 0
                while lane and (not taken or size + lane[0].size <= batch_bytes_max):
                    size += lane[0].size
                    taken.append(lane.popleft())
                spans, first = [], 0
                for p in taken:
                    if p.identity is not None:
                        spans.append(ProducerSpan(p.identity[0], p.identity[1], p.identity[4],
                                                  len(p.records), first))
                    first += len(p.records)
                try:
                    result = await self.node.produce(
                        topic, partition, [r for p in taken for r in p.records], spans
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
                    error = await self._keep_sequences(taken, offsets)
                    for p, base_offset in zip(taken, offsets, strict=True):
                        self._finish(p, base_offset=base_offset, error=error)
                    self._wake_fetchers()
                taken = []
        finally:
            del self._lanes[(topic, partition)]
            for p in [*taken, *lane]:  # cancelled (shutting down): nothing more is stored
                if not p.done.is_set():
                    self._finish(p, error=ShuttingDown("the Kafka listener is stopping"))

    async def _keep_sequences(self, taken: list[_Pending], offsets: list[int]) -> LevelZeroError | None:
        """Idempotent batches' sequences, durable before they are acknowledged (where the store
        keeps them), so a retry after a restart is recognised. A failure here fails the
        acknowledgement: the client retries and the batch (stored) is recognised in memory."""
        rows = [
            ProducerBatchRow(p.identity[0], p.identity[1], p.topic, p.partition, p.identity[4],
                             len(p.records), base_offset, time.time())
            for p, base_offset in zip(taken, offsets, strict=True) if p.identity is not None
        ]
        if not rows or self._producer_store is None:
            return None
        for p, base_offset in zip(taken, offsets, strict=True):
            if p.identity is not None:
                self.sequences.record(*p.identity, len(p.records), base_offset)
        try:
            await self._producer_store.record_producer_batches(rows, keep=BATCHES_REMEMBERED)
        except LevelZeroError as exc:
            log.warning("kafka: cannot keep idempotent producers' sequences: %s", exc)
            return exc
        return None

    def _finish(self, pending: _Pending, *, base_offset: int = -1, error: LevelZeroError | None = None) -> None:
        pending.base_offset = base_offset
        pending.error = error
        if pending.identity is not None:
            self._producing.pop(pending.identity, None)
            if error is None:
                self.sequences.record(*pending.identity, len(pending.records), base_offset)
        pending.done.set()

    def _produce_failed(self, topic: str, partition: int, exc: LevelZeroError) -> tuple[ErrorCode, int, str | None]:
        if exc.retriable or exc.code in ("storage_error", "store_refused"):
            log.warning("kafka produce to %s/%d failed: %s: %s", topic, partition, exc.code, exc)
        return error_code_for(exc), -1, str(exc)

    def init_producer_id(self, request: Request) -> Any:
        m = request.response_module
        if request.body.transactional_id is not None:
            return make(m.InitProducerIdResponse, throttle_time=0,
                        error_code=ErrorCode.transactional_id_authorization_failed,
                        producer_id=-1, producer_epoch=-1)
        producer_id = self._next_producer_id
        self._next_producer_id += 1
        self._mark_loaded(producer_id)  # new: nothing stored for it
        return make(m.InitProducerIdResponse, throttle_time=0, error_code=ErrorCode.none,
                    producer_id=producer_id, producer_epoch=0)

    def _wake_fetchers(self) -> None:
        self._appended.set()
        self._appended = anyio.Event()

    # ------------------------------------------------------------------ fetch

    async def fetch(self, request: Request) -> Any:
        body = request.body
        wanted = [
            (t.topic, p.partition, p.fetch_offset, min(max(p.partition_max_bytes, 1), FETCH_BYTES_MAX))
            for t in body.topics for p in t.partitions
        ]
        wait_ms = min(max(int(body.max_wait.total_seconds() * 1000), 0), FETCH_WAIT_MAX_MS)
        deadline = time.monotonic() + wait_ms / 1000
        min_bytes = max(body.min_bytes, 1)
        seen_hwms: list[int] | None = None
        while True:
            hwms = [self._high_watermark(t, p) for t, p, _, _ in wanted]
            if hwms != seen_hwms:
                seen_hwms = hwms
                results = await self._fetch_all(wanted, body.max_bytes)
                size = sum(len(data) for _, _, _, data in results)
                if size >= min_bytes or any(code != ErrorCode.none for code, _, _, _ in results):
                    break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            with anyio.move_on_after(min(remaining, FETCH_POLL_S)):
                await self._appended.wait()
        m = request.response_module
        by_topic: dict[str, list[Any]] = {}
        for (topic, partition, _, _), (code, hwm, start, data) in zip(wanted, results, strict=True):
            by_topic.setdefault(topic, []).append(
                make(
                    m.PartitionData, partition_index=partition, error_code=code,
                    high_watermark=hwm, last_stable_offset=hwm, log_start_offset=start,
                    aborted_transactions=None, preferred_read_replica=-1, records=data,
                )
            )
        responses = tuple(
            make(m.FetchableTopicResponse, topic=topic, partitions=tuple(parts))
            for topic, parts in by_topic.items()
        )
        return make(m.FetchResponse, throttle_time=0, error_code=ErrorCode.none, session_id=0,
                    responses=responses)

    def _high_watermark(self, topic: str, partition: int) -> int:
        try:
            return self.node.partition(topic, partition).state.high_watermark
        except LevelZeroError:
            return -1

    async def _fetch_all(
        self, wanted: list[tuple[str, int, int, int]], max_bytes: int
    ) -> list[tuple[ErrorCode, int, int, bytes]]:
        """As Kafka's fetch: partitions in request order, each up to its own maximum, while the
        response's budget lasts; the budget counts only the bytes a partition returned, so a
        partition with nothing to read uses none of it. Partitions with data are read
        concurrently, in waves: a wave takes partitions while their maxima fit what is left
        (the first always), and what they did not use goes to the next wave."""
        results = [self._empty(topic, partition) for topic, partition, _, _ in wanted]
        budget = min(max(max_bytes, 1), FETCH_RESPONSE_BYTES_MAX)
        todo = [i for i, (topic, partition, offset, _) in enumerate(wanted)
                if self._has_data(topic, partition, offset)]

        async def read(i: int, limit: int) -> None:
            topic, partition, offset, _ = wanted[i]
            results[i] = await self._fetch_partition(topic, partition, offset, limit)

        while todo and budget > 0:
            wave: list[tuple[int, int]] = []
            reserved = 0
            while todo and reserved < budget:
                i = todo.pop(0)
                limit = min(wanted[i][3], budget - reserved)
                wave.append((i, limit))
                reserved += limit
            async with anyio.create_task_group() as tg:
                for i, limit in wave:
                    tg.start_soon(read, i, limit)
            budget -= sum(len(results[i][3]) for i, _ in wave)
        return results

    def _has_data(self, topic: str, partition: int, offset: int) -> bool:
        """Whether reading `offset` answers anything but an empty record set: records, or an error."""
        try:
            state = self.node.partition(topic, partition).state
        except LevelZeroError:
            return True  # read it to answer its error
        return offset != state.high_watermark

    def _empty(self, topic: str, partition: int) -> tuple[ErrorCode, int, int, bytes]:
        try:
            state = self.node.partition(topic, partition).state
        except LevelZeroError as exc:
            return error_code_for(exc), -1, -1, b""
        return ErrorCode.none, state.high_watermark, state.start_offset, b""

    async def _fetch_partition(
        self, topic: str, partition: int, offset: int, max_bytes: int
    ) -> tuple[ErrorCode, int, int, bytes]:
        """One partition's answer. An error carries empty records, as Kafka's does (a null record
        set is a parse failure for librdkafka, which then retries forever)."""
        try:
            state = self.node.partition(topic, partition).state
            if offset == state.high_watermark:
                return ErrorCode.none, state.high_watermark, state.start_offset, b""
            if not state.start_offset <= offset < state.high_watermark:
                return ErrorCode.offset_out_of_range, state.high_watermark, state.start_offset, b""
            result = await self.node.fetch(topic, partition, offset, max_bytes)
        except LevelZeroError as exc:
            code = error_code_for(exc)
            if code not in (ErrorCode.unknown_topic_or_partition, ErrorCode.offset_out_of_range):
                log.warning("kafka fetch %s/%d@%d failed: %s: %s", topic, partition, offset, exc.code, exc)
            return code, -1, -1, b""
        data = kr.encode_stored(result.records) if result.records else b""
        return ErrorCode.none, result.high_watermark, result.start_offset, data

    # ------------------------------------------------------------------ offsets

    async def list_offsets(self, request: Request) -> Any:
        m = request.response_module
        topics = []
        for topic in request.body.topics:
            parts = []
            for p in topic.partitions:
                error, offset, timestamp = ErrorCode.none, -1, -1
                try:
                    state = self.node.partition(topic.name, p.partition_index).state
                    if p.timestamp == LIST_OFFSETS_EARLIEST:
                        offset = state.start_offset
                    elif p.timestamp == LIST_OFFSETS_LATEST:
                        offset = state.high_watermark
                    elif p.timestamp >= 0:
                        offset, timestamp = await self._offset_for_time(topic.name, p.partition_index, p.timestamp)
                    else:
                        error = ErrorCode.invalid_request  # -3 (max timestamp) and others
                except LevelZeroError as exc:
                    error = error_code_for(exc)
                parts.append(
                    make(m.ListOffsetsPartitionResponse, partition_index=p.partition_index,
                         error_code=error, timestamp=timestamp, offset=offset, leader_epoch=0)
                )
            topics.append(make(m.ListOffsetsTopicResponse, name=topic.name, partitions=tuple(parts)))
        return make(m.ListOffsetsResponse, throttle_time=0, topics=tuple(topics))

    # ------------------------------------------------------------------ consumer groups

    def find_coordinator(self, request: Request) -> Any:
        m = request.response_module
        body = request.body
        def where(key: str) -> dict[str, Any]:
            broker = self._coordinator(key)
            return dict(node_id=broker.node_id, host=broker.host, port=broker.port)

        if request.api_version >= 4:
            coordinators = tuple(
                make(m.Coordinator, key=key, error_code=ErrorCode.none, error_message=None,
                     **where(key))
                for key in body.coordinator_keys
            )
            return make(m.FindCoordinatorResponse, throttle_time=0, coordinators=coordinators)
        if getattr(body, "key_type", 0) != 0:  # 1: a transaction coordinator
            return make(m.FindCoordinatorResponse, throttle_time=0,
                        error_code=ErrorCode.coordinator_not_available, error_message="transactions are not supported",
                        node_id=-1, host="", port=-1)
        return make(m.FindCoordinatorResponse, throttle_time=0, error_code=ErrorCode.none,
                    error_message=None, **where(body.key))

    async def join_group(self, request: Request) -> Any:
        m = request.response_module
        body = request.body
        session_ms = int(body.session_timeout.total_seconds() * 1000)
        rebalance = getattr(body, "rebalance_timeout", None)
        rebalance_ms = session_ms if rebalance is None else int(rebalance.total_seconds() * 1000)
        if not self._coordinates(body.group_id):  # the client asks FindCoordinator again
            return make(
                m.JoinGroupResponse, throttle_time=0, error_code=ErrorCode.not_coordinator,
                generation_id=-1, protocol_type=None,
                protocol_name=None if request.api_version >= 7 else "", leader="",
                skip_assignment=False, member_id=body.member_id, members=(),
            )
        result = await self.groups.join(
            body.group_id, body.member_id, request.client_id or "", session_ms, rebalance_ms,
            body.protocol_type, [(p.name, bytes(p.metadata)) for p in body.protocols],
        )
        members = tuple(
            make(m.JoinGroupResponseMember, member_id=mid, group_instance_id=None, metadata=meta)
            for mid, meta in result.members
        )
        return make(
            m.JoinGroupResponse, throttle_time=0, error_code=result.error,
            generation_id=result.generation, protocol_type=result.protocol_type,
            protocol_name=result.protocol_name if request.api_version >= 7 else (result.protocol_name or ""),
            leader=result.leader, skip_assignment=False, member_id=result.member_id, members=members,
        )

    async def sync_group(self, request: Request) -> Any:
        m = request.response_module
        body = request.body
        if not self._coordinates(body.group_id):
            return make(m.SyncGroupResponse, throttle_time=0, error_code=ErrorCode.not_coordinator,
                        protocol_type=None, protocol_name=None, assignment=b"")
        error, assignment, protocol_type, protocol_name = await self.groups.sync(
            body.group_id, body.member_id, body.generation_id,
            [(a.member_id, bytes(a.assignment)) for a in body.assignments],
        )
        return make(m.SyncGroupResponse, throttle_time=0, error_code=error,
                    protocol_type=protocol_type, protocol_name=protocol_name, assignment=assignment)

    def heartbeat(self, request: Request) -> Any:
        body = request.body
        if not self._coordinates(body.group_id):
            error = ErrorCode.not_coordinator
        else:
            error = self.groups.heartbeat(body.group_id, body.member_id, body.generation_id)
        return make(request.response_module.HeartbeatResponse, throttle_time=0, error_code=error)

    def leave_group(self, request: Request) -> Any:
        m = request.response_module
        body = request.body
        if request.api_version >= 3:
            ids = [member.member_id for member in body.members]
        else:
            ids = [body.member_id]
        results = self.groups.leave(body.group_id, ids)
        top = ErrorCode.none
        if request.api_version < 3:
            top = results[body.member_id]
        members = tuple(
            make(m.MemberResponse, member_id=mid, group_instance_id=None, error_code=code)
            for mid, code in results.items()
        ) if request.api_version >= 3 else ()
        return make(m.LeaveGroupResponse, throttle_time=0, error_code=top, members=members)

    async def offset_commit(self, request: Request) -> Any:
        m = request.response_module
        body = request.body
        generation = getattr(body, "generation_id_or_member_epoch", None)
        if generation is None:
            generation = body.generation_id
        allowed = self.groups.check_commit(body.group_id, body.member_id, generation)
        if not self._coordinates(body.group_id):
            allowed = ErrorCode.not_coordinator
        known = self.node.topics()
        codes: dict[tuple[str, int], ErrorCode] = {}
        to_store: list[tuple[str, int, int, str]] = []
        for topic in body.topics:
            for p in topic.partitions:
                code = allowed
                if code == ErrorCode.none:
                    if not 0 <= p.partition_index < known.get(topic.name, 0):
                        code = ErrorCode.unknown_topic_or_partition
                    elif len(p.committed_metadata or "") > METADATA_CHARS_MAX:
                        code = ErrorCode.offset_metadata_too_large
                    else:
                        to_store.append((topic.name, p.partition_index, p.committed_offset,
                                         p.committed_metadata or ""))
                codes[(topic.name, p.partition_index)] = code
        if to_store:
            try:
                await self.groups.commit(body.group_id, to_store)
            except LevelZeroError as exc:
                log.warning("kafka offset commit for group %s failed: %s: %s", body.group_id, exc.code, exc)
                for topic_name, partition, _, _ in to_store:
                    codes[(topic_name, partition)] = ErrorCode.coordinator_not_available
        topics = tuple(
            make(m.OffsetCommitResponseTopic, name=topic.name, partitions=tuple(
                make(m.OffsetCommitResponsePartition, partition_index=p.partition_index,
                     error_code=codes[(topic.name, p.partition_index)])
                for p in topic.partitions
            ))
            for topic in body.topics
        )
        return make(m.OffsetCommitResponse, throttle_time=0, topics=topics)

    async def offset_fetch(self, request: Request) -> Any:
        m = request.response_module
        body = request.body
        committed = await self.groups.committed(body.group_id)
        if body.topics is None:
            wanted: dict[str, list[int]] = {}
            for topic, partition in sorted(committed):
                wanted.setdefault(topic, []).append(partition)
        else:
            wanted = {t.name: list(t.partition_indexes) for t in body.topics}
        topics = []
        for name, partitions in wanted.items():
            parts = []
            for partition in partitions:
                row = committed.get((name, partition))
                parts.append(make(
                    m.OffsetFetchResponsePartition, partition_index=partition,
                    committed_offset=-1 if row is None else row.committed_offset,
                    committed_leader_epoch=-1, metadata="" if row is None else row.metadata,
                    error_code=ErrorCode.none,
                ))
            topics.append(make(m.OffsetFetchResponseTopic, name=name, partitions=tuple(parts)))
        return make(m.OffsetFetchResponse, throttle_time=0, topics=tuple(topics), error_code=ErrorCode.none)

    async def _offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> tuple[int, int]:
        """The first offset whose record timestamp is >= `timestamp_ms` and that timestamp, or
        (-1, -1) if none. There is no time index: the records are read from the start offset
        (at most LIST_OFFSETS_SCAN_RECORDS_MAX of them; beyond that the latest offset answers)."""
        state = self.node.partition(topic, partition).state
        offset, scanned = state.start_offset, 0
        while offset < state.high_watermark and scanned < LIST_OFFSETS_SCAN_RECORDS_MAX:
            result = await self.node.fetch(topic, partition, offset, FETCH_BYTES_MAX)
            if not result.records:
                break
            for record in result.records:
                if record.timestamp_ms >= timestamp_ms:
                    return record.offset, record.timestamp_ms
            scanned += len(result.records)
            offset = result.next_offset
        if scanned >= LIST_OFFSETS_SCAN_RECORDS_MAX:
            return state.high_watermark, -1
        return -1, -1
