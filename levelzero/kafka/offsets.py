"""ListOffsets (earliest, latest, by time), OffsetForLeaderEpoch (KIP-320: the partition's
term is its leader epoch, `epochs.py`) and the consumer groups' committed offsets (OffsetCommit,
OffsetFetch: kept by the group coordinator, `groups.py`)."""

from __future__ import annotations

import collections
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from kio.schema.errors import ErrorCode

from levelzero.actors.intake import ProduceIntake
from levelzero.actors.node import Node
from levelzero.core.errors import LevelZeroError
from levelzero.kafka.transactions import PartitionIndex
from levelzero.kafka.epochs import NO_EPOCH, epoch_error
from levelzero.kafka.errors import coordinator_unavailable, error_code_for
from levelzero.kafka.groups import METADATA_CHARS_MAX, GroupCoordinator
from levelzero.kafka.metadata import Cluster
from levelzero.kafka.protocol import Request, make

log = logging.getLogger("levelzero.kafka")

LIST_OFFSETS_LATEST = -1
LIST_OFFSETS_EARLIEST = -2


class OffsetsApi:
    def __init__(
        self,
        node: Node,
        intake: ProduceIntake,
        groups: GroupCoordinator,
        cluster: Cluster,
        txns: PartitionIndex | None = None,
        offsets_stable: Callable[[str], Awaitable[None]] | None = None,
        pending_offsets: Callable[[str], Awaitable[set[tuple[str, int]]]] | None = None,
    ) -> None:
        self.txns = txns  # ListOffsets latest with read_committed: the last stable offset
        # OffsetFetch without require_stable: a group's offsets committed by a transaction whose
        # markers are on their way are stored first (`TransactionCoordinator.wait_offsets_stable`)
        self.offsets_stable = offsets_stable
        # OffsetFetch with require_stable (v7+, KIP-447): the partitions whose offsets an
        # unfinished transaction holds (`TransactionCoordinator.pending_offsets`)
        self.pending_offsets = pending_offsets
        self.node = node
        self.intake = intake
        self.groups = groups
        self.cluster = cluster

    async def list_offsets(self, request: Request) -> Any:
        m = request.response_module
        named = collections.Counter(
            (topic.name, p.partition_index) for topic in request.body.topics for p in topic.partitions
        )
        topics = []
        for topic in request.body.topics:
            parts = []
            for p in topic.partitions:
                if named[(topic.name, p.partition_index)] > 1:
                    # A partition named twice (which lookup is the client's answer?): every entry
                    # of it INVALID_REQUEST, as Kafka (`ListOffsetsRequest.duplicatePartitions`).
                    error, offset, timestamp, epoch = ErrorCode.invalid_request, -1, -1, -1
                else:
                    error, offset, timestamp, epoch = await self._list_offset(request, topic.name, p)
                parts.append(
                    make(
                        m.ListOffsetsPartitionResponse,
                        partition_index=p.partition_index,
                        error_code=error,
                        timestamp=timestamp,
                        offset=offset,
                        leader_epoch=epoch,
                    )
                )
            topics.append(make(m.ListOffsetsTopicResponse, name=topic.name, partitions=tuple(parts)))
        return make(m.ListOffsetsResponse, throttle_time=0, topics=tuple(topics))

    async def _list_offset(
        self, request: Request, topic_name: str, p: Any
    ) -> tuple[ErrorCode, int, int, int]:
        """One partition's ListOffsets answer: (error, offset, timestamp, leader epoch)."""
        error, offset, timestamp, epoch = ErrorCode.none, -1, -1, -1
        try:
            state = self.node.partition(topic_name, p.partition_index).state
            error = epoch_error(state.term, getattr(p, "current_leader_epoch", NO_EPOCH))
            start, high_watermark = state.first_readable_offset, state.high_watermark
            if error != ErrorCode.none:
                pass
            elif p.timestamp == LIST_OFFSETS_EARLIEST:
                offset, epoch = start, state.term_at(start)
            elif p.timestamp == LIST_OFFSETS_LATEST:
                offset, epoch = high_watermark, state.term
                if getattr(request.body, "isolation_level", 0) == 1 and self.txns is not None:
                    txns = await self.txns.get(topic_name, p.partition_index)
                    offset = txns.last_stable_offset(high_watermark)
            elif p.timestamp in SPECIAL_TIMESTAMP_VERSIONS:
                error, offset, timestamp, epoch = await self._special_offset(
                    request.api_version, topic_name, p.partition_index, p.timestamp
                )
            else:
                # A lookup by time; a negative timestamp no special value names too, as Kafka
                # (`UnifiedLog.fetchOffsetByTimestamp` searches the log for any other target):
                # every record is at or after it, so the first from the start offset answers.
                offset, timestamp = await self.node.offset_for_time(
                    topic_name, p.partition_index, p.timestamp
                )
                epoch = state.term_at(offset) if offset >= 0 else -1
            if (
                offset >= 0
                and p.timestamp
                not in (LIST_OFFSETS_EARLIEST, LIST_OFFSETS_LATEST, LIST_OFFSETS_EARLIEST_LOCAL)
                and getattr(request.body, "isolation_level", 0) == 1
                and self.txns is not None
            ):
                # A lookup by time (or the largest timestamp) finds no record a
                # read_committed consumer cannot fetch yet: none at or past the last
                # stable offset (Kafka's ReplicaManager: -1, -1).
                txns = await self.txns.get(topic_name, p.partition_index)
                if offset >= txns.last_stable_offset(high_watermark):
                    offset, timestamp, epoch = -1, -1, -1
        except LevelZeroError as exc:
            error = error_code_for(exc)
        return error, offset, timestamp, epoch

    def offset_for_leader_epoch(self, request: Request) -> Any:
        """OffsetForLeaderEpoch (KIP-320), as Kafka's leader answers a consumer: for the term it
        asks about, the largest term at or below it that wrote records and the offset after
        them (`PartitionState.term_end_offset`)."""
        m = request.response_module
        topics = []
        for topic in request.body.topics:
            parts = []
            for p in topic.partitions:
                error, term, end = ErrorCode.none, -1, -1
                try:
                    state = self.node.partition(topic.topic, p.partition).state
                    error = epoch_error(state.term, p.current_leader_epoch)
                    if error == ErrorCode.none:
                        term, end = state.term_end_offset(p.leader_epoch)
                except LevelZeroError as exc:
                    error = error_code_for(exc)
                parts.append(
                    make(
                        m.EpochEndOffset,
                        error_code=error,
                        partition=p.partition,
                        leader_epoch=term,
                        end_offset=end,
                    )
                )
            topics.append(make(m.OffsetForLeaderTopicResult, topic=topic.topic, partitions=tuple(parts)))
        return make(m.OffsetForLeaderEpochResponse, throttle_time=0, topics=tuple(topics))

    async def offset_commit(self, request: Request) -> Any:
        m = request.response_module
        body = request.body
        generation = getattr(body, "generation_id_or_member_epoch", None)
        if generation is None:
            generation = body.generation_id
        if not self.cluster.coordinates(body.group_id):
            allowed = ErrorCode.not_coordinator
        elif (allowed := await self.groups.load(body.group_id)) == ErrorCode.none:
            allowed = self.groups.check_commit(
                body.group_id,
                body.member_id,
                generation,
                getattr(body, "group_instance_id", None),  # v7+
            )
        known = self.node.topics()
        codes: dict[tuple[str, int], ErrorCode] = {}
        to_store: list[tuple[str, int, int, str, int]] = []
        for topic in body.topics:
            for p in topic.partitions:
                code = allowed
                if code == ErrorCode.none:
                    if not 0 <= p.partition_index < known.get(topic.name, 0):
                        code = ErrorCode.unknown_topic_or_partition
                    elif len(p.committed_metadata or "") > METADATA_CHARS_MAX:
                        code = ErrorCode.offset_metadata_too_large
                    else:
                        to_store.append(
                            (
                                topic.name,
                                p.partition_index,
                                p.committed_offset,
                                p.committed_metadata or "",
                                getattr(p, "committed_leader_epoch", NO_EPOCH),  # v6+
                            )
                        )
                codes[(topic.name, p.partition_index)] = code
        if to_store:
            try:
                await self.groups.commit(body.group_id, to_store)
            except LevelZeroError as exc:
                log.warning("kafka offset commit for group %s failed: %s: %s", body.group_id, exc.code, exc)
                for topic_name, partition, *_ in to_store:
                    codes[(topic_name, partition)] = ErrorCode.coordinator_not_available
        topics = tuple(
            make(
                m.OffsetCommitResponseTopic,
                name=topic.name,
                partitions=tuple(
                    make(
                        m.OffsetCommitResponsePartition,
                        partition_index=p.partition_index,
                        error_code=codes[(topic.name, p.partition_index)],
                    )
                    for p in topic.partitions
                ),
            )
            for topic in body.topics
        )
        return make(m.OffsetCommitResponse, throttle_time=0, topics=topics)

    async def offset_fetch(self, request: Request) -> Any:
        """A group's committed offsets. With require_stable (v7+, KIP-447), a partition whose
        offset an unfinished transaction holds is answered UNSTABLE_OFFSET_COMMIT (retriable)
        at once, as Kafka's group coordinator answers it, so a read_committed consumer never
        starts from the offset before a transaction that may commit a newer one. Without it,
        a committed transaction's offsets are stored before the answer (`offsets_stable`)."""
        m = request.response_module
        body = request.body
        pending: set[tuple[str, int]] = set()
        failed = ErrorCode.none
        try:
            if getattr(body, "require_stable", False):
                if self.pending_offsets is not None:
                    pending = await self.pending_offsets(body.group_id)
            elif self.offsets_stable is not None:
                await self.offsets_stable(body.group_id)
            committed = await self.groups.committed(body.group_id)
        except LevelZeroError as exc:
            failed = coordinator_unavailable(f"OffsetFetch for group {body.group_id}", exc)
            if request.api_version >= 2:  # the top-level error code (KIP-88)
                return make(m.OffsetFetchResponse, throttle_time=0, topics=(), error_code=failed)
            # v0-1 have none: each partition asked carries it, as Kafka's error response does (an
            # answer without them reads as "nothing committed": the consumer would reset)
            committed = {}
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
                code = failed
                if (name, partition) in pending:
                    row, code = None, ErrorCode.unstable_offset_commit
                parts.append(
                    make(
                        m.OffsetFetchResponsePartition,
                        partition_index=partition,
                        committed_offset=-1 if row is None else row.committed_offset,
                        committed_leader_epoch=-1 if row is None else row.leader_epoch,
                        metadata="" if row is None else row.metadata,
                        error_code=code,
                    )
                )
            topics.append(make(m.OffsetFetchResponseTopic, name=name, partitions=tuple(parts)))
        return make(m.OffsetFetchResponse, throttle_time=0, topics=tuple(topics), error_code=ErrorCode.none)

    async def _special_offset(
        self, api_version: int, topic: str, partition: int, timestamp_ms: int
    ) -> tuple[ErrorCode, int, int, int]:
        """(error, offset, timestamp, leader epoch) for Kafka's special timestamps below -2, as
        a Kafka broker answers them for a topic without tiered storage (levelzero has no split
        between local and remote logs: every record is served the same way). Below the version
        that introduced one, Kafka refuses it for the partition: UNSUPPORTED_VERSION."""
        if api_version < SPECIAL_TIMESTAMP_VERSIONS[timestamp_ms]:
            return ErrorCode.unsupported_version, -1, -1, -1
        state = self.node.partition(topic, partition).state
        if timestamp_ms == LIST_OFFSETS_EARLIEST_LOCAL:  # the local log starts where EARLIEST does
            start = state.first_readable_offset
            return ErrorCode.none, start, -1, state.term_at(start)
        if timestamp_ms == LIST_OFFSETS_MAX_TIMESTAMP:
            offset, timestamp = await self.node.max_timestamp(topic, partition)
            return ErrorCode.none, offset, timestamp, state.term_at(offset) if offset >= 0 else -1
        return ErrorCode.none, -1, -1, -1  # latest tiered, earliest pending upload: nothing tiered


# Kafka's special ListOffsets timestamps beyond latest (-1) and earliest (-2), each with the
# request version that introduced it.
LIST_OFFSETS_MAX_TIMESTAMP = -3  # v7 (KIP-734): the record with the largest timestamp
LIST_OFFSETS_EARLIEST_LOCAL = -4  # v8 (KIP-405): the local log's start offset
LIST_OFFSETS_LATEST_TIERED = -5  # v9 (KIP-1005): the last offset in remote storage
LIST_OFFSETS_EARLIEST_PENDING_UPLOAD = -6  # v11 (KIP-1023): the first offset not yet tiered
SPECIAL_TIMESTAMP_VERSIONS = {
    LIST_OFFSETS_MAX_TIMESTAMP: 7,
    LIST_OFFSETS_EARLIEST_LOCAL: 8,
    LIST_OFFSETS_LATEST_TIERED: 9,
    LIST_OFFSETS_EARLIEST_PENDING_UPLOAD: 11,
}
