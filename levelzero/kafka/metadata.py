"""Metadata and the brokers: which nodes serve Kafka clients, which leads each partition, which
coordinates a consumer group (rendezvous over the live Kafka nodes: every node names the same)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from levelzero.actors.node import Node
from levelzero.core.cluster import preferred_leader
from levelzero.core.errors import LevelZeroError
from levelzero.kafka.groups import OFFSETS_RETENTION_CHECK_S_DEFAULT, OFFSETS_RETENTION_S_DEFAULT
from levelzero.core.names import topic_name_problem
from levelzero.kafka.operations import authorized_operations
from levelzero.kafka.protocol import Request, make

log = logging.getLogger("levelzero.kafka")

NODE_ID = 0  # the broker id of a node that is not in a cluster
CLUSTER_ID = "levelzero"
# Metadata in a cluster reads the cluster view again when it is older than this (a client asks
# after NOT_LEADER_OR_FOLLOWER: the answer must name the new leader, not the round-old one).
METADATA_VIEW_AGE_MAX_S = 0.5


def broker_id(node_id: str) -> int:
    """The Kafka broker id (an int32 >= 0) of a cluster node: the same on every node."""
    digest = hashlib.blake2b(node_id.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF


@dataclass(frozen=True, slots=True)
class Broker:
    node_id: int
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    advertised_host: str
    advertised_port: int
    default_partitions: int = 1
    # Metadata and Produce create unknown topics (Kafka's auto.create.topics.enable).
    auto_create_topics: bool = False
    # Kafka's name of what the listener speaks: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.
    security_protocol: str = "PLAINTEXT"
    # DescribeLogDirs' one log directory: where the partitions' objects are (the daemon: the
    # local objects directory, or s3://bucket/prefix).
    log_dir: str = "levelzero"
    # A transactional id with no transaction for this long is forgotten (Kafka's
    # transactional.id.expiration.ms).
    transactional_id_expiration_s: float = 7 * 24 * 3600.0
    # Offsets retention (Kafka's offsets.retention.minutes and its check interval):
    # `GroupCoordinator.expire_offsets`.
    offsets_retention_s: float = OFFSETS_RETENTION_S_DEFAULT
    offsets_retention_check_s: float = OFFSETS_RETENTION_CHECK_S_DEFAULT


class Cluster:
    """The brokers as Kafka clients see them, from the node's last cluster view."""

    def __init__(self, node: Node, settings: KafkaSettings) -> None:
        self.node = node
        self.settings = settings

    def me(self) -> Broker:
        member = self.node.member
        return Broker(
            NODE_ID if member is None else broker_id(member.node_id),
            self.settings.advertised_host,
            self.settings.advertised_port,
        )

    def brokers(self) -> dict[str, Broker]:
        """Node id -> broker: the live nodes of the last cluster view that listen for Kafka
        clients (this one always); alone, this node."""
        member = self.node.member
        if member is None:
            return {"": self.me()}
        brokers = {member.node_id: self.me()}
        view = member.view
        if view is not None:
            for row in view.nodes:
                if row.kafka_url and row.lease_expires_at > view.now and row.node_id not in brokers:
                    host, _, port = row.kafka_url.rpartition(":")
                    if host and port.isdigit():
                        brokers[row.node_id] = Broker(broker_id(row.node_id), host.strip("[]"), int(port))
        return brokers

    def leaders(self, brokers: dict[str, Broker]) -> dict[tuple[str, int], int]:
        """(topic, partition) -> its leader's broker id, for partitions with a live leader."""
        member = self.node.member
        me = self.me().node_id
        if member is None:
            return {(t, p): me for t, n in self.node.topics().items() for p in range(n)}
        leaders: dict[tuple[str, int], int] = {}
        view = member.view
        if view is not None:
            for lease in view.leases:
                broker = brokers.get(lease.node_id or "")
                if broker is not None and lease.lease_expires_at > view.now:
                    leaders[(lease.topic, lease.partition)] = broker.node_id
        for actor in self.node.partitions():  # what this node leads, whatever the view says
            leaders[(actor.row.topic, actor.row.partition)] = me
        return leaders

    def leader_epochs(self) -> dict[tuple[str, int], int]:
        """(topic, partition) -> its term, Kafka's leader epoch: of the actor here for what this
        node leads, else as the last cluster view's lease names it."""
        epochs: dict[tuple[str, int], int] = {}
        member = self.node.member
        view = member.view if member is not None else None
        if view is not None:
            for lease in view.leases:
                epochs[(lease.topic, lease.partition)] = lease.term
        for actor in self.node.partitions():
            epochs[(actor.row.topic, actor.row.partition)] = actor.state.term
        return epochs

    def coordinator(self, group_id: str) -> Broker:
        """The node coordinating a consumer group: rendezvous over the live Kafka nodes, so
        every node names the same one (alone: this node)."""
        brokers = self.brokers()
        chosen = preferred_leader(f"group:{group_id}", sorted(brokers))
        return brokers[chosen] if chosen is not None else self.me()

    def placement(self) -> int | None:
        """A count that moves whenever what `coordinator` picks from (the live nodes) changed
        (alone, None): a group may have been coordinated elsewhere since it moved. A count of
        the cluster member's views, not the set itself: a node that joined and died between two
        requests about a group moved the group there and back, and the set alone, the same
        again, hid that (the group, stored anew there, was served from a stale copy here)."""
        member = self.node.member
        return None if member is None else member.membership_changes

    def coordinates(self, group_id: str) -> bool:
        return self.node.member is None or self.coordinator(group_id) == self.me()


# Creates the unknown topics of a request (kafka.auto_create_topics): name -> the error of one
# that could not be made.
AutoCreate = Callable[[Iterable[str]], Awaitable[dict[str, ErrorCode]]]


class MetadataApi:
    def __init__(self, node: Node, cluster: Cluster, auto_create: AutoCreate | None = None) -> None:
        self.node = node
        self.cluster = cluster
        self.auto_create = auto_create

    async def metadata(self, request: Request) -> Any:
        m = request.response_module
        refused: dict[str, ErrorCode] = {}
        # Metadata v4+ says whether the client wants topics made (earlier versions always do).
        wanted = request.body.topics
        if (
            self.auto_create is not None
            and wanted
            and getattr(request.body, "allow_auto_topic_creation", True)
        ):
            known = self.node.topics()
            unknown = [t.name for t in wanted if t.name is not None and t.name not in known]
            if unknown:
                refused = await self.auto_create(unknown)
        member = self.node.member
        brokers = self.cluster.brokers()
        leaders = self.cluster.leaders(brokers)
        if member is not None:
            # A view older than METADATA_VIEW_AGE_MAX_S is read again, and one that shows a
            # partition without a leader (a move, a topic just made) if it is older than a
            # tenth of that: the client asks again soon after LEADER_NOT_AVAILABLE.
            age = METADATA_VIEW_AGE_MAX_S
            if len(leaders) < sum(self.node.topics().values()):
                age /= 10
            try:
                if member.view is not await member.fresh_view(age):
                    brokers = self.cluster.brokers()
                    leaders = self.cluster.leaders(brokers)
            except LevelZeroError as exc:  # the last view answers
                log.warning("kafka metadata: reading the cluster view failed: %s", exc)
        topics = self.node.topics()
        epochs = self.cluster.leader_epochs()
        if request.body.topics is None:
            names = sorted(topics)
        else:
            names = [t.name for t in request.body.topics if t.name is not None]
        out = []
        for name in names:
            count = topics.get(name)
            partitions = tuple(
                partition_row(m.MetadataResponsePartition, name, p, leaders, epochs)
                for p in range(count or 0)
            )
            error = ErrorCode.none
            if count is None:
                error = refused.get(name, missing_topic_error(name))
            out.append(
                topic_row(
                    m.MetadataResponseTopic,
                    name,
                    error,
                    partitions,
                    getattr(request.body, "include_topic_authorized_operations", False),
                )
            )
        shown = tuple(
            make(m.MetadataResponseBroker, node_id=b.node_id, host=b.host, port=b.port, rack=None)
            for b in sorted(brokers.values(), key=lambda b: b.node_id)
        )
        return make(
            m.MetadataResponse,
            throttle_time=0,
            # v13 (KIP-1102): a top-level error (REBOOTSTRAP_REQUIRED, for a client whose
            # brokers all went); this broker is always one a client can go on with
            error_code=ErrorCode.none,
            brokers=shown,
            cluster_id=CLUSTER_ID,
            controller_id=min(b.node_id for b in brokers.values()),
            topics=tuple(out),
            # (v8-10 only: later versions ask DescribeCluster)
            cluster_authorized_operations=authorized_operations(
                "cluster",
                request.api_version <= 10
                and getattr(request.body, "include_cluster_authorized_operations", False),
            ),
        )

    def describe_cluster(self, request: Request) -> Any:
        """DescribeCluster (KIP-700): the brokers Metadata names; a request for the controllers
        (endpoint type 2) is refused as a broker refuses it."""
        m = request.response_module
        endpoint_type = getattr(request.body, "endpoint_type", 1)
        brokers = sorted(self.cluster.brokers().values(), key=lambda b: b.node_id)
        error, message = ErrorCode.none, None
        if endpoint_type != 1:
            error, message = ErrorCode.unsupported_endpoint_type, "the controllers are not served"
            brokers = []
        return make(
            m.DescribeClusterResponse,
            throttle_time=0,
            error_code=error,
            error_message=message,
            endpoint_type=endpoint_type,
            cluster_id=CLUSTER_ID,
            controller_id=min((b.node_id for b in brokers), default=-1),
            brokers=tuple(
                make(
                    m.DescribeClusterBroker,
                    broker_id=b.node_id,
                    host=b.host,
                    port=b.port,
                    rack=None,
                    is_fenced=False,
                )
                for b in brokers
            ),
            cluster_authorized_operations=authorized_operations(
                "cluster", request.body.include_cluster_authorized_operations
            ),
        )


def partition_row(
    cls: Any,
    topic: str,
    partition: int,
    leaders: Mapping[tuple[str, int], int],
    epochs: Mapping[tuple[str, int], int],
    **extra: Any,
) -> Any:
    """A partition of a Metadata or DescribeTopicPartitions answer: its leader, the only
    replica and in-sync replica (the data is in object storage), or LEADER_NOT_AVAILABLE."""
    leader = leaders.get((topic, partition))
    replicas = () if leader is None else (leader,)
    return make(
        cls,
        error_code=ErrorCode.none if leader is not None else ErrorCode.leader_not_available,
        partition_index=partition,
        leader_id=-1 if leader is None else leader,
        leader_epoch=epochs.get((topic, partition), -1),
        replica_nodes=replicas,
        isr_nodes=replicas,
        offline_replicas=(),
        **extra,
    )


def missing_topic_error(name: str) -> ErrorCode:
    """The error of a topic asked for that does not exist, as Kafka's Metadata and
    DescribeTopicPartitions answer it: INVALID_TOPIC_EXCEPTION for a name no topic can have
    (a client gives up at once), else UNKNOWN_TOPIC_OR_PARTITION (a client asks again)."""
    if topic_name_problem(name) is not None:
        return ErrorCode.invalid_topic_exception
    return ErrorCode.unknown_topic_or_partition


def topic_row(
    cls: Any, name: str, error: ErrorCode, partitions: tuple[Any, ...], operations: bool = True
) -> Any:
    """A topic of a Metadata or DescribeTopicPartitions answer (no topic ids), with its
    authorized operations if `operations` (asked for: DescribeTopicPartitions always is)."""
    return make(
        cls,
        error_code=error,
        name=name,
        topic_id=None,
        is_internal=False,
        partitions=partitions,
        topic_authorized_operations=authorized_operations("topic", operations),
    )
