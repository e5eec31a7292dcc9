"""CreateTopics: topics made through the node, as HTTP's POST /v1/topics makes them."""

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
