"""The admin APIs: CreateTopics (topics made through the node, as HTTP's POST /v1/topics makes
them), DeleteTopics, CreatePartitions and DeleteRecords."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from levelzero.actors.node import Node
from levelzero.core.errors import LevelZeroError
from levelzero.kafka.errors import error_code_for
from levelzero.kafka.metadata import KafkaSettings
from levelzero.kafka.protocol import Request, make


class AdminApi:
    def __init__(self, node: Node, settings: KafkaSettings) -> None:
        self.node = node
        self.settings = settings

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
                    num_partitions=partitions,
                    replication_factor=1,
                    configs=None,
                )
            )
        return make(m.CreateTopicsResponse, throttle_time=0, topics=tuple(results))


class TopicLifecycleApi:
    """DeleteTopics, CreatePartitions and DeleteRecords, through the node as HTTP's
    DELETE /v1/topics/{topic} does: each topic (or partition) answered on its own, with the
    error code Kafka's broker gives."""

    def __init__(self, node: Node) -> None:
        self.node = node

    async def delete_topics(self, request: Request) -> Any:
        m = request.response_module
        body = request.body
        if hasattr(body, "topic_names"):  # v1-v5 name the topics; v6 has states
            wanted: list[tuple[str | None, Any]] = [(name, None) for name in body.topic_names]
        else:
            wanted = [(t.name, t.topic_id) for t in body.topics]
        names = [name for name, _ in wanted]
        results = []
        for name, topic_id in wanted:
            error, message = ErrorCode.none, None
            if name is None:  # by id: levelzero topics have none (Metadata says so)
                error, message = ErrorCode.unknown_topic_id, "topics have no ids here: name the topic"
            elif names.count(name) > 1:
                error, message = ErrorCode.invalid_request, f"topic {name!r} is named more than once"
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
        results = []
        for topic in body.topics:
            error, message = ErrorCode.none, None
            if names.count(topic.name) > 1:
                error, message = ErrorCode.invalid_request, f"topic {topic.name!r} is named more than once"
            elif topic.assignments:
                error = ErrorCode.invalid_replica_assignment
                message = "manual replica assignment is not supported"
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
