"""The admin APIs: CreateTopics (topics made through the node, as HTTP's POST /v1/topics makes
them, with their topic configs: a config that is unknown, malformed or not enforced is refused
with INVALID_CONFIG and the topic is not made, never created with the config dropped),
DeleteTopics, CreatePartitions and DeleteRecords."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from kio.schema.errors import ErrorCode

from levelzero.actors.node import Node
from levelzero.core.errors import InternalTopicName, LevelZeroError, TopicExists
from levelzero.core.names import topic_name_problem
from levelzero.core.topic_configs import describe_topic
from levelzero.kafka.configs import broker_configs, config_results
from levelzero.kafka.errors import error_code_for
from levelzero.kafka.metadata import Cluster, KafkaSettings
from levelzero.kafka.protocol import Request, make


log = logging.getLogger("levelzero.kafka")

# Replicas are the object store's business: a topic's replication factor is not kept, but one
# Kafka would refuse is refused (its controller's message).
REPLICATION_FACTOR_REFUSAL = "Replication factor must be larger than 0, or -1 to use the default value."


def assignment_problem(cluster: Cluster, replicas: list[list[int]]) -> str | None:
    """Why a manual replica assignment (CreateTopics, CreatePartitions; one list of broker ids a
    partition) cannot be followed, in the words of Kafka's controller (None: it can). Each list
    is checked as Kafka checks it: not empty, brokers that exist, none twice, one replica count
    for all. A node alone leads every partition, so an assignment naming only it is what it
    does anyway (tools and admin suites send one); in a cluster, leases place partitions, so an
    assignment is refused rather than ignored."""
    brokers = {broker.node_id for broker in cluster.brokers().values()}
    count: int | None = None
    for ids in replicas:
        if not ids:
            return "The manual partition assignment includes an empty replica list."
        for broker in sorted(ids):
            if broker not in brokers:
                return (
                    f"The manual partition assignment includes broker {broker}, but no such broker "
                    "is registered."
                )
        if len(set(ids)) != len(ids):
            return f"The manual partition assignment includes a broker more than once: {ids}."
        if count is not None and len(ids) != count:
            return (
                f"The manual partition assignment includes a partition with {len(ids)} replica(s), "
                f"but this is not consistent with previous partitions, which have {count} replica(s)."
            )
        count = len(ids)
    if replicas and len(brokers) != 1:
        return "manual replica assignment is not supported in a cluster (leases place partitions)"
    return None


class AdminApi:
    def __init__(self, node: Node, settings: KafkaSettings, cluster: Cluster) -> None:
        self.node = node
        self.settings = settings
        self.cluster = cluster

    async def auto_create(self, names: Iterable[str]) -> dict[str, ErrorCode]:
        """Create each topic of `names` that does not exist, with `default_partitions` and no
        configs (`kafka.auto_create_topics`: Metadata and Produce call this). The error of each
        that could not be made."""
        errors: dict[str, ErrorCode] = {}
        for name in dict.fromkeys(names):
            if name in self.node.topics():
                continue
            if topic_name_problem(name) is not None:
                errors[name] = ErrorCode.invalid_topic_exception
                continue
            try:
                await self.node.create_topic(name, self.settings.default_partitions)
            except TopicExists:
                continue  # made meanwhile (another request, another node)
            except InternalTopicName:
                continue  # never a topic here: answered as unknown (tools ask for Kafka's)
            except LevelZeroError as exc:
                log.warning("kafka: auto-creating topic %r failed: %s: %s", name, exc.code, exc)
                errors[name] = error_code_for(exc)
            else:
                log.info("kafka: auto-created topic %r", name)
        return errors

    async def create_topics(self, request: Request) -> Any:
        """Each topic made (or refused) on its own. A name given more than once is made under
        none of its entries and answered once, INVALID_REQUEST (as Kafka's controller does: a
        client such as librdkafka fails the whole response that names a topic twice)."""
        m = request.response_module
        results = []
        names = [topic.name for topic in request.body.topics]
        answered: set[str] = set()
        for topic in request.body.topics:
            partitions = topic.num_partitions
            if partitions == -1:
                partitions = len(topic.assignments) or self.settings.default_partitions
            error, message, configs = ErrorCode.none, None, None
            if names.count(topic.name) > 1:
                if topic.name in answered:
                    continue
                answered.add(topic.name)
                error, message = ErrorCode.invalid_request, "Duplicate topic name."
            elif topic.assignments and (refusal := self._assignment_refusal(topic)):
                error, message = refusal
            elif topic.name in self.node.topics():
                error, message = ErrorCode.topic_already_exists, f"topic {topic.name!r} exists"
            elif topic.replication_factor == 0 or topic.replication_factor < -1:
                # Kafka's controller's refusal; any positive factor is accepted, and ignored
                error, message = ErrorCode.invalid_replication_factor, REPLICATION_FACTOR_REFUSAL
            else:
                try:
                    pairs = [(c.name, c.value) for c in topic.configs]
                    checked = self.node.check_new_topic(topic.name, partitions, pairs)
                    if not request.body.validate_only:
                        await self.node.create_topic(topic.name, partitions, checked)
                    if hasattr(m, "CreatableTopicConfigs"):  # v5+: the topic's configs
                        broker = broker_configs(self.node, self.cluster, self.settings)
                        configs = config_results(m, describe_topic(checked, broker), False)
                except LevelZeroError as exc:
                    error, message = error_code_for(exc), str(exc)
                    if exc.code == "invalid_input":
                        error = (
                            ErrorCode.invalid_partitions
                            if "partitions" in message
                            else ErrorCode.invalid_topic_exception
                        )
            results.append(
                make(
                    m.CreatableTopicResult,
                    name=topic.name,
                    topic_id=None,
                    error_code=error,
                    error_message=message,
                    topic_config_error_code=0,
                    num_partitions=partitions if error == ErrorCode.none else -1,
                    replication_factor=1 if error == ErrorCode.none else -1,
                    configs=configs,
                )
            )
        return make(m.CreateTopicsResponse, throttle_time=0, topics=tuple(results))

    def _assignment_refusal(self, topic: Any) -> tuple[ErrorCode, str] | None:
        """CreateTopics with a manual assignment, as Kafka's controller checks it: the partition
        count and replication factor then -1, the partitions 0..n-1, once each."""
        if topic.replication_factor != -1:
            return ErrorCode.invalid_request, (
                "A manual partition assignment was specified, but replication factor was not set to -1."
            )
        if topic.num_partitions != -1:
            return ErrorCode.invalid_request, (
                "A manual partition assignment was specified, but numPartitions was not set to -1."
            )
        indexes = [a.partition_index for a in topic.assignments]
        if len(set(indexes)) != len(indexes):
            return ErrorCode.invalid_replica_assignment, (
                "Found multiple manual partition assignments for a partition."
            )
        if sorted(indexes) != list(range(len(indexes))):
            return (
                ErrorCode.invalid_replica_assignment,
                "partitions should be a consecutive 0-based integer sequence",
            )
        problem = assignment_problem(self.cluster, [list(a.broker_ids) for a in topic.assignments])
        return None if problem is None else (ErrorCode.invalid_replica_assignment, problem)


class TopicLifecycleApi:
    """DeleteTopics, CreatePartitions and DeleteRecords, through the node as HTTP's
    DELETE /v1/topics/{topic} does: each topic (or partition) answered on its own, with the
    error code Kafka's broker gives; a topic named twice is acted on under neither entry and
    answered once (a client such as librdkafka fails a response naming a topic twice)."""

    def __init__(self, node: Node, cluster: Cluster) -> None:
        self.node = node
        self.cluster = cluster

    def _assignment_problem(self, assignments: Any, count: int, name: str) -> str | None:
        """Why CreatePartitions' manual assignment cannot be followed (None: it can): one
        assignment per new partition, each as `assignment_problem` checks it."""
        current = self.node.topics().get(name)
        if current is not None and len(assignments) != count - current:
            return f"{len(assignments)} assignments for {count - current} new partitions"
        return assignment_problem(self.cluster, [list(a.broker_ids) for a in assignments])

    async def delete_topics(self, request: Request) -> Any:
        m = request.response_module
        body = request.body
        if hasattr(body, "topic_names"):  # v1-v5 name the topics; v6 has states
            wanted: list[tuple[str | None, Any]] = [(name, None) for name in body.topic_names]
        else:
            wanted = [(t.name, t.topic_id) for t in body.topics]
        names = [name for name, _ in wanted]
        answered: set[str] = set()
        results = []
        for name, topic_id in wanted:
            error, message = ErrorCode.none, None
            if name is None:  # by id: levelzero topics have none (Metadata says so)
                error, message = ErrorCode.unknown_topic_id, "topics have no ids here: name the topic"
            elif names.count(name) > 1:  # deleted under no entry, answered once (as Kafka)
                if name in answered:
                    continue
                answered.add(name)
                error, message = ErrorCode.invalid_request, "Duplicate topic name."
            else:
                try:
                    await self.node.delete_topic(name)
                except LevelZeroError as exc:
                    error, message = error_code_for(exc), str(exc)
            results.append(
                make(
                    m.DeletableTopicResult,
                    name=name,
                    topic_id=topic_id,
                    error_code=error,
                    error_message=message,
                )
            )
        return make(m.DeleteTopicsResponse, throttle_time=0, responses=tuple(results))

    async def create_partitions(self, request: Request) -> Any:
        m = request.response_module
        body = request.body
        names = [t.name for t in body.topics]
        answered: set[str] = set()
        results = []
        for topic in body.topics:
            error, message = ErrorCode.none, None
            if names.count(topic.name) > 1:  # grown under no entry, answered once (as Kafka)
                if topic.name in answered:
                    continue
                answered.add(topic.name)
                error, message = ErrorCode.invalid_request, "Duplicate topic in request."
            elif topic.assignments and (
                problem := self._assignment_problem(topic.assignments, topic.count, topic.name)
            ):
                error, message = ErrorCode.invalid_replica_assignment, problem
            else:
                try:
                    await self.node.create_partitions(
                        topic.name, topic.count, validate_only=body.validate_only
                    )
                except LevelZeroError as exc:
                    error, message = error_code_for(exc), str(exc)
                    if exc.code == "invalid_input":
                        error = ErrorCode.invalid_partitions  # fewer, as many, or too many
            results.append(
                make(m.CreatePartitionsTopicResult, name=topic.name, error_code=error, error_message=message)
            )
        return make(m.CreatePartitionsResponse, throttle_time=0, results=tuple(results))

    async def delete_records(self, request: Request) -> Any:
        m = request.response_module
        topics = []
        for topic in request.body.topics:
            parts = []
            for p in topic.partitions:
                error, low_watermark = ErrorCode.none, -1
                try:
                    low_watermark = await self.node.delete_records(topic.name, p.partition_index, p.offset)
                except LevelZeroError as exc:
                    error = error_code_for(exc)
                parts.append(
                    make(
                        m.DeleteRecordsPartitionResult,
                        partition_index=p.partition_index,
                        low_watermark=low_watermark,
                        error_code=error,
                    )
                )
            topics.append(make(m.DeleteRecordsTopicResult, name=topic.name, partitions=tuple(parts)))
        return make(m.DeleteRecordsResponse, throttle_time=0, topics=tuple(topics))
