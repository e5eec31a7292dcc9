"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs: topic configs (stored in the control
plane, enforced by the node: `core.topic_configs`, `actors.topic_configs`) and the broker's own
configs, which are read-only (levelzero takes them from its configuration file).

Per resource, as Kafka answers: a topic that does not exist is UNKNOWN_TOPIC_OR_PARTITION, a
config that is unknown, malformed or not enforced INVALID_CONFIG, a change to a broker config
INVALID_REQUEST; DescribeConfigs reports each config's source, read-only flag and (when asked)
synonyms as Kafka's broker lists them: the topic's own value first, then the broker configs it
falls back to, set ones before Kafka's defaults (`core.topic_configs.synonyms`; none for a
topic-level-only config).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from kio.schema.errors import ErrorCode

from levelzero.actors.node import Node
from levelzero.core.errors import LevelZeroError
from levelzero.core.names import topic_name_problem
from levelzero.core.topic_configs import (
    AlterOp,
    BrokerConfigs,
    ConfigEntry,
    describe_broker,
    describe_topic,
)
from levelzero.kafka.errors import error_code_for
from levelzero.kafka.metadata import Cluster, KafkaSettings
from levelzero.kafka.protocol import Request, make

TOPIC = 2  # Kafka's ConfigResource.Type
BROKER = 4


class ResourceError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def broker_configs(node: Node, cluster: Cluster, settings: KafkaSettings) -> BrokerConfigs:
    """The node's broker configs as this listener's clients see them."""
    return dataclasses.replace(
        node.topic_configs.broker,
        broker_id=cluster.me().node_id,
        num_partitions=settings.default_partitions,
        auto_create_topics=settings.auto_create_topics,
        advertised_listeners=f"{settings.security_protocol}://{cluster.me().host}:{cluster.me().port}",
    )


def config_results(m: Any, entries: list[ConfigEntry], include_synonyms: bool) -> tuple[Any, ...]:
    """DescribeConfigs' (and CreateTopics') entries for `entries`, in the response's classes."""
    out = []
    synonym_cls = getattr(m, "DescribeConfigsSynonym", None)
    result_cls = getattr(m, "DescribeConfigsResourceResult", None) or m.CreatableTopicConfigs
    for e in entries:
        synonyms = ()
        if include_synonyms and synonym_cls is not None:
            synonyms = tuple(
                make(synonym_cls, name=s.name, value=s.value, source=int(s.source)) for s in e.synonyms
            )
        out.append(
            make(
                result_cls,
                name=e.name,
                value=e.value,
                read_only=e.read_only,
                is_default=e.is_default,
                config_source=int(e.source),
                is_sensitive=False,
                synonyms=synonyms,
                config_type=int(e.type),
                documentation=None,
            )
        )
    return tuple(out)


class ConfigsApi:
    def __init__(self, node: Node, cluster: Cluster, settings: KafkaSettings) -> None:
        self.node = node
        self.cluster = cluster
        self.settings = settings

    def _broker(self) -> BrokerConfigs:
        return broker_configs(self.node, self.cluster, self.settings)

    def _check_broker_name(self, name: str) -> None:
        broker_id = str(self._broker().broker_id)
        if name not in ("", broker_id):
            raise ResourceError(
                ErrorCode.invalid_request,
                f"Unexpected broker id, expected {broker_id} or empty string, but received {name}",
            )

    def _check_topic_name(self, name: str) -> None:
        problem = topic_name_problem(name)
        if problem is not None:
            raise ResourceError(ErrorCode.invalid_topic_exception, f"topic name {name[:64]!r} {problem}")
        if name not in self.node.topics():
            raise ResourceError(ErrorCode.unknown_topic_or_partition, f"unknown topic {name!r}")

    async def describe_configs(self, request: Request) -> Any:
        m = request.response_module
        body = request.body
        include_synonyms = bool(getattr(body, "include_synonyms", False))
        results = []
        for resource in body.resources:
            keys = resource.configuration_keys
            names = None if keys is None else list(keys)
            code, message, configs = ErrorCode.none, None, ()
            try:
                if resource.resource_type == TOPIC:
                    self._check_topic_name(resource.resource_name)
                    stored = await self.node.topic_configs.stored(resource.resource_name)
                    entries = describe_topic(stored, self._broker(), names)
                elif resource.resource_type == BROKER:
                    self._check_broker_name(resource.resource_name)
                    entries = describe_broker(self._broker(), names)
                else:
                    raise ResourceError(
                        ErrorCode.invalid_request, f"Unsupported resource type {resource.resource_type}"
                    )
                configs = config_results(m, entries, include_synonyms)
            except ResourceError as exc:
                code, message = exc.code, str(exc)
            except LevelZeroError as exc:
                code, message = error_code_for(exc), str(exc)
            results.append(
                make(
                    m.DescribeConfigsResult,
                    error_code=code,
                    error_message=message,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                    configs=configs,
                )
            )
        return make(m.DescribeConfigsResponse, throttle_time=0, results=tuple(results))

    async def alter_configs(self, request: Request) -> Any:
        """AlterConfigs: each topic's whole set replaced (configs not named go back to their
        defaults)."""

        async def alter(resource: Any, validate_only: bool) -> None:
            pairs = [(c.name, c.value) for c in resource.configs]
            await self.node.topic_configs.replace(resource.resource_name, pairs, validate_only=validate_only)

        return await self._alter(request, alter)

    async def incremental_alter_configs(self, request: Request) -> Any:
        async def alter(resource: Any, validate_only: bool) -> None:
            ops = []
            for c in resource.configs:
                try:
                    op = AlterOp(c.config_operation)
                except ValueError:
                    raise ResourceError(
                        ErrorCode.invalid_request, f"unknown config operation {c.config_operation}"
                    ) from None
                ops.append((op, c.name, c.value))
            await self.node.topic_configs.alter(resource.resource_name, ops, validate_only=validate_only)

        return await self._alter(request, alter)

    async def _alter(self, request: Request, alter: Any) -> Any:
        m = request.response_module
        body = request.body
        named = Counter((r.resource_type, r.resource_name) for r in body.resources)
        results = []
        for resource in body.resources:
            code, message = ErrorCode.none, None
            try:
                if named[(resource.resource_type, resource.resource_name)] > 1:
                    raise ResourceError(
                        ErrorCode.invalid_request, f"Duplicate resource {resource.resource_name!r}"
                    )
                _check_shape(resource)
                if resource.resource_type == TOPIC:
                    self._check_topic_name(resource.resource_name)
                    await alter(resource, body.validate_only)
                elif resource.resource_type == BROKER:
                    self._check_broker_name(resource.resource_name)
                    raise ResourceError(
                        ErrorCode.invalid_request,
                        "broker configs are read-only: levelzero takes them from its configuration file",
                    )
                else:
                    raise ResourceError(
                        ErrorCode.invalid_request, f"Unsupported resource type {resource.resource_type}"
                    )
            except ResourceError as exc:
                code, message = exc.code, str(exc)
            except LevelZeroError as exc:
                code, message = error_code_for(exc), str(exc)
            results.append(
                make(
                    m.AlterConfigsResourceResponse,
                    error_code=code,
                    error_message=message,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                )
            )
        response_cls = getattr(m, "AlterConfigsResponse", None) or m.IncrementalAlterConfigsResponse
        return make(response_cls, throttle_time=0, responses=tuple(results))


def _check_shape(resource: Any) -> None:
    """What Kafka refuses in any resource of AlterConfigs or IncrementalAlterConfigs before it
    looks at the resource or the configs (`ConfigAdminManager.preprocess`): a config named twice,
    and a null value but for a DELETE (AlterConfigs has no operations: any null) are
    INVALID_REQUEST."""
    names = [c.name for c in resource.configs]
    if len(set(names)) < len(names):
        raise ResourceError(ErrorCode.invalid_request, "Error due to duplicate config keys")
    nulls = [
        c.name
        for c in resource.configs
        if c.value is None and getattr(c, "config_operation", None) != AlterOp.DELETE.value
    ]
    if nulls:
        raise ResourceError(ErrorCode.invalid_request, f"Null value not supported for : {', '.join(nulls)}")
