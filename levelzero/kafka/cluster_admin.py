"""The partition-placement admin APIs Kafka 4 tools call, answered from what levelzero is:
every partition has one replica, its leader (a node alone leads all of them; in a cluster the
holder of its lease), so there is never a reassignment in progress nor a preferred leader to
elect.

- DescribeTopicPartitions (KIP-966): Metadata's partitions, paged by a cursor.
- ElectLeaders: ELECTION_NOT_NEEDED for a partition with a live leader (it is its only
  replica), ELIGIBLE_LEADERS_NOT_AVAILABLE while its lease moves, UNKNOWN_TOPIC_OR_PARTITION.
- ListPartitionReassignments: none. AlterPartitionReassignments: a target that is the
  partition's present replica (its leader) is a no-op, as Kafka answers one; a cancellation
  NO_REASSIGNMENT_IN_PROGRESS; any other target INVALID_REPLICA_ASSIGNMENT (leases place
  partitions).
- ListConfigResources (KIP-1142): the topics and this broker.
- DescribeLogDirs: one directory, the object store this node's partitions live in
  (`KafkaSettings.log_dir`), with the partitions it leads and their sizes.
  AlterReplicaLogDirs: a move into that directory is a no-op, as Kafka answers one; another
  directory LOG_DIR_NOT_FOUND; a partition led elsewhere REPLICA_NOT_AVAILABLE, an unknown one
  UNKNOWN_TOPIC_OR_PARTITION.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from levelzero.actors.node import Node
from levelzero.core.errors import (
    LedElsewhere,
    LevelZeroError,
    NotLeader,
    ShuttingDown,
    UnknownPartition,
    UnknownTopic,
)
from levelzero.kafka.metadata import Cluster, missing_topic_error, partition_row, topic_row
from levelzero.kafka.protocol import Request, make

log = logging.getLogger(__name__)

TOPIC = 2  # Kafka's ConfigResource.Type
BROKER = 4
# Partitions' sizes read at once for DescribeLogDirs (each a metastore read or two).
LOG_DIR_SIZE_READS_MAX = 16
# What a partition's size read raises when this node does not (or no longer) lead it.
NOT_HOSTED_HERE = (NotLeader, LedElsewhere, UnknownTopic, UnknownPartition, ShuttingDown)


class ClusterAdminApi:
    def __init__(self, node: Node, cluster: Cluster) -> None:
        self.node = node
        self.cluster = cluster

    def describe_topic_partitions(self, request: Request) -> Any:
        """The named topics (none named: every topic), in name order, from the cursor's topic
        and partition on, at most `response_partition_limit` partitions; `next_cursor` names
        the first partition left out."""
        m = request.response_module
        body = request.body
        topics = self.node.topics()
        names = sorted({t.name for t in body.topics}) if body.topics else sorted(topics)
        cursor = body.cursor
        if cursor is not None:
            names = [n for n in names if n >= cursor.topic_name]
        limit = max(1, body.response_partition_limit)
        leaders = self.cluster.leaders(self.cluster.brokers())
        epochs = self.cluster.leader_epochs()
        out: list[Any] = []
        topic_cls = m.DescribeTopicPartitionsResponseTopic
        next_cursor = None
        shown = 0
        for name in names:
            count = topics.get(name)
            if count is None:
                out.append(topic_row(topic_cls, name, missing_topic_error(name), ()))
                continue
            first = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
            partitions = []
            for p in range(max(0, first), count):
                if shown == limit:
                    next_cursor = make(m.Cursor, topic_name=name, partition_index=p)
                    break
                partitions.append(
                    partition_row(
                        m.DescribeTopicPartitionsResponsePartition,
                        name,
                        p,
                        leaders,
                        epochs,
                        eligible_leader_replicas=None,
                        last_known_elr=None,
                    )
                )
                shown += 1
            out.append(topic_row(topic_cls, name, ErrorCode.none, tuple(partitions)))
            if next_cursor is not None:
                break
        return make(
            m.DescribeTopicPartitionsResponse, throttle_time=0, topics=tuple(out), next_cursor=next_cursor
        )

    def elect_leaders(self, request: Request) -> Any:
        m = request.response_module
        body = request.body
        topics = self.node.topics()
        if body.topic_partitions is None:  # every partition
            wanted = [(t, tuple(range(n))) for t, n in sorted(topics.items())]
        else:
            wanted = [(t.topic, tuple(t.partitions)) for t in body.topic_partitions]
        leaders = self.cluster.leaders(self.cluster.brokers())
        results = []
        for topic, partitions in wanted:
            out = []
            for p in partitions:
                if not 0 <= p < topics.get(topic, 0):
                    error, message = ErrorCode.unknown_topic_or_partition, f"unknown partition {topic}/{p}"
                elif (topic, p) in leaders:
                    error, message = ErrorCode.election_not_needed, "its leader is its only replica"
                else:
                    error, message = ErrorCode.eligible_leaders_not_available, "its lease is moving"
                out.append(make(m.PartitionResult, partition_id=p, error_code=error, error_message=message))
            results.append(make(m.ReplicaElectionResult, topic=topic, partition_result=tuple(out)))
        return make(
            m.ElectLeadersResponse,
            throttle_time=0,
            error_code=ErrorCode.none,
            replica_election_results=tuple(results),
        )

    def alter_partition_reassignments(self, request: Request) -> Any:
        m = request.response_module
        topics = self.node.topics()
        leaders = self.cluster.leaders(self.cluster.brokers())
        responses = []
        for topic in request.body.topics:
            out = []
            for p in topic.partitions:
                index = p.partition_index
                leader = leaders.get((topic.name, index))
                error, message = ErrorCode.none, None
                if not 0 <= index < topics.get(topic.name, 0):
                    error, message = (
                        ErrorCode.unknown_topic_or_partition,
                        f"unknown partition {topic.name}/{index}",
                    )
                elif p.replicas is None:
                    error, message = ErrorCode.no_reassignment_in_progress, "no reassignment is in progress"
                elif leader is None or list(p.replicas) != [leader]:
                    error = ErrorCode.invalid_replica_assignment
                    message = (
                        f"replicas {list(p.replicas)}: the one replica is its leader, placed by its lease"
                    )
                out.append(
                    make(
                        m.ReassignablePartitionResponse,
                        partition_index=index,
                        error_code=error,
                        error_message=message,
                    )
                )
            responses.append(make(m.ReassignableTopicResponse, name=topic.name, partitions=tuple(out)))
        return make(
            m.AlterPartitionReassignmentsResponse,
            throttle_time=0,
            error_code=ErrorCode.none,
            error_message=None,
            responses=tuple(responses),
        )

    @staticmethod
    def list_partition_reassignments(request: Request) -> Any:
        m = request.response_module
        return make(
            m.ListPartitionReassignmentsResponse,
            throttle_time=0,
            error_code=ErrorCode.none,
            error_message=None,
            topics=(),
        )

    def list_config_resources(self, request: Request) -> Any:
        """v0 (ListClientMetricsResources) lists client-metrics resources: there are none. v1
        lists the asked types (none asked: every type); topics and this broker are the ones
        levelzero has."""
        m = request.response_module
        types = tuple(getattr(request.body, "resource_types", ()) or ())
        resources = []
        if request.api_version >= 1:
            if not types or TOPIC in types:
                resources += [(name, TOPIC) for name in sorted(self.node.topics())]
            if not types or BROKER in types:
                resources.append((str(self.cluster.me().node_id), BROKER))
        return make(
            m.ListConfigResourcesResponse,
            throttle_time=0,
            error_code=ErrorCode.none,
            config_resources=tuple(
                make(m.ConfigResource, resource_name=name, resource_type=kind) for name, kind in resources
            ),
        )

    async def describe_log_dirs(self, request: Request) -> Any:
        """This broker's one log directory with the partitions it leads (the named ones; null:
        all), as a Kafka broker lists the replicas it hosts: each one's size in the object
        store (`Node.retained_bytes`: its L1 objects from the start offset on and its L0
        extents, as Kafka counts its segments whole) and offset lag 0 (an acknowledged record
        is durable: the log end is the high watermark). A partition this node stopped leading
        meanwhile (its lease moved, the topic deleted, a drain) is left out, as a replica the
        broker does not host; unknown topics and partitions too, as Kafka leaves them out. A
        size that cannot be read (the metastore away, corrupt data) fails the directory:
        KAFKA_STORAGE_ERROR and no topics, as Kafka answers for a directory offline (an empty
        directory would tell a UI the topics are gone). Its total and usable bytes are -1
        (unknown: the object store is no volume). `LOG_DIR_SIZE_READS_MAX` workers read the
        sizes."""
        m = request.response_module
        led = sorted((a.row.topic, a.row.partition) for a in self.node.partitions())
        if request.body.topics is not None:
            wanted = {(t.topic, p) for t in request.body.topics for p in t.partitions}
            led = [tp for tp in led if tp in wanted]
        sizes: dict[tuple[str, int], int] = {}
        failures: list[str] = []
        pending = iter(led)

        async def worker() -> None:
            for topic, partition in pending:
                if failures:
                    return
                try:
                    sizes[(topic, partition)] = await self.node.retained_bytes(topic, partition)
                except NOT_HOSTED_HERE as exc:
                    log.info("DescribeLogDirs leaves %s/%d out: %s", topic, partition, exc)
                except LevelZeroError as exc:
                    failures.append(f"{topic}/{partition}: {exc}")

        async with anyio.create_task_group() as tg:
            for _ in range(min(LOG_DIR_SIZE_READS_MAX, len(led))):
                tg.start_soon(worker)
        by_topic: dict[str, list[Any]] = {}
        for (topic, partition), size_bytes in sorted(sizes.items()):
            by_topic.setdefault(topic, []).append(
                make(
                    m.DescribeLogDirsPartition,
                    partition_index=partition,
                    partition_size=size_bytes,
                    offset_lag=0,
                    is_future_key=False,
                )
            )
        topics = tuple(
            make(m.DescribeLogDirsTopic, name=name, partitions=tuple(parts))
            for name, parts in by_topic.items()
        )
        error = ErrorCode.none
        if failures:
            log.warning(
                "DescribeLogDirs answers KAFKA_STORAGE_ERROR: a size could not be read (%s)", failures[0]
            )
            error, topics = ErrorCode.kafka_storage_error, ()
        result = make(
            m.DescribeLogDirsResult,
            error_code=error,
            log_dir=self.cluster.settings.log_dir,
            topics=topics,
            total_bytes=-1,
            usable_bytes=-1,
        )
        return make(m.DescribeLogDirsResponse, throttle_time=0, error_code=ErrorCode.none, results=(result,))

    def alter_replica_log_dirs(self, request: Request) -> Any:
        """Kafka's answers (`ReplicaManager.alterReplicaLogDirs`) for a broker with one log
        directory: into it, a partition led here is where it is asked to be (NONE: a no-op);
        one led by another node (or by none, its lease moving) REPLICA_NOT_AVAILABLE; an
        unknown topic or partition UNKNOWN_TOPIC_OR_PARTITION; into any other directory
        LOG_DIR_NOT_FOUND (checked first, as Kafka does)."""
        m = request.response_module
        led = {(a.row.topic, a.row.partition) for a in self.node.partitions()}
        topics = self.node.topics()
        results: dict[str, dict[int, ErrorCode]] = {}
        for directory in request.body.dirs:
            for topic in directory.topics:
                for partition in topic.partitions:
                    if directory.path != self.cluster.settings.log_dir:
                        error = ErrorCode.log_dir_not_found
                    elif not 0 <= partition < topics.get(topic.name, 0):
                        error = ErrorCode.unknown_topic_or_partition
                    elif (topic.name, partition) not in led:
                        error = ErrorCode.replica_not_available
                    else:
                        error = ErrorCode.none
                    results.setdefault(topic.name, {})[partition] = error
        return make(
            m.AlterReplicaLogDirsResponse,
            throttle_time=0,
            results=tuple(
                make(
                    m.AlterReplicaLogDirTopicResult,
                    topic_name=name,
                    partitions=tuple(
                        make(m.AlterReplicaLogDirPartitionResult, partition_index=p, error_code=e)
                        for p, e in sorted(parts.items())
                    ),
                )
                for name, parts in results.items()
            ),
        )
