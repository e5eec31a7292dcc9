"""CreateTopics: topics made through the node, as HTTP's POST /v1/topics makes them, with their
topic configs (a config that is unknown, malformed or not enforced is refused with
INVALID_CONFIG and the topic is not made: never created with the config dropped)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from kio.schema.errors import ErrorCode

from levelzero.actors.node import Node
from levelzero.core.errors import LevelZeroError, TopicExists
from levelzero.core.names import topic_name_problem
from levelzero.core.topic_configs import describe_topic
from levelzero.kafka.configs import broker_configs, config_results
from levelzero.kafka.errors import error_code_for
from levelzero.kafka.metadata import Cluster, KafkaSettings
from levelzero.kafka.protocol import Request, make


log = logging.getLogger("levelzero.kafka")


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
            except LevelZeroError as exc:
                log.warning("kafka: auto-creating topic %r failed: %s: %s", name, exc.code, exc)
                errors[name] = error_code_for(exc)
            else:
                log.info("kafka: auto-created topic %r", name)
        return errors

    async def create_topics(self, request: Request) -> Any:
        m = request.response_module
        results = []
        for topic in request.body.topics:
            partitions = topic.num_partitions
            if partitions == -1:
                partitions = self.settings.default_partitions
            error, message, configs = ErrorCode.none, None, None
            if topic.assignments:
                error, message = ErrorCode.invalid_request, "manual replica assignment is not supported"
            elif topic.name in self.node.topics():
                error, message = ErrorCode.topic_already_exists, f"topic {topic.name!r} exists"
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
