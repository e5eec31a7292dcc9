"""The node's topic configs: the control plane's rows (`TopicConfigStore`) kept in memory, so
the produce intake and the housekeeper read a topic's policy without a query, and the changes
made through this node, checked by `core.topic_configs`, written through.

In a cluster a change made on another node reaches this one with its next cluster view (read
every third of the lease TTL: `ClusterView.topic_configs`); reads for DescribeConfigs and the
HTTP API go to the control plane, so every node reports the same.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

import anyio

from levelzero.core.errors import UnknownTopic
from levelzero.core.topic_configs import (
    AlterOp,
    BrokerConfigs,
    TopicPolicy,
    altered,
    check_configs,
    topic_policy,
)
from levelzero.storage.protocols import ClusterView, TopicConfigStore


class TopicConfigs:
    def __init__(
        self,
        store: TopicConfigStore,
        broker: BrokerConfigs,
        topics: Callable[[], Mapping[str, int]],
        wall_clock: Callable[[], float],
    ) -> None:
        self._store = store
        self.broker = broker
        self._topics = topics
        self._wall = wall_clock
        self._stored: dict[str, dict[str, str]] = {}
        self._policies: dict[str, TopicPolicy] = {}
        self._default = topic_policy({}, broker)
        self._view: Callable[[], ClusterView | None] | None = None
        self._view_seen: ClusterView | None = None
        self._write_lock = anyio.Lock()  # one read-modify-write of a topic's set at a time
        # Told each set written through this node (the node keeps it in the bucket's topic
        # record too, for `levelzero recover --from-bucket`).
        self.on_change: Callable[[str], Awaitable[None]] | None = None

    # ------------------------------------------------------------------ what the node enforces

    def follow_views(self, view: Callable[[], ClusterView | None]) -> None:
        """In a cluster: take each new cluster view's topic configs (other nodes' changes)."""
        self._view = view

    def _sync(self) -> None:
        if self._view is None:
            return
        view = self._view()
        if view is not None and view is not self._view_seen:
            self._view_seen = view
            self._set_all({topic: dict(c) for topic, c in view.topic_configs.items()})

    def policy(self, topic: str) -> TopicPolicy:
        self._sync()
        return self._policies.get(topic, self._default)

    def retention(self, topic: str) -> tuple[float | None, int | None]:
        """(retention in seconds, in bytes) of `topic`; None: no limit."""
        policy = self.policy(topic)
        seconds = None if policy.retention_ms is None else policy.retention_ms / 1000
        return seconds, policy.retention_bytes

    def any_retention(self) -> bool:
        """Whether any partition may have something to retain (the housekeeper then visits all)."""
        self._sync()
        if self._default.retention_ms is not None or self._default.retention_bytes is not None:
            return True
        return any(
            p.retention_ms is not None or p.retention_bytes is not None for p in self._policies.values()
        )

    # ------------------------------------------------------------------ the control plane's rows

    async def load(self) -> None:
        """Every topic's set from the control plane (start-up)."""
        self._set_all(await self._store.topic_configs())

    def _set_all(self, stored: dict[str, dict[str, str]]) -> None:
        self._stored = stored
        self._policies = {topic: topic_policy(c, self.broker) for topic, c in stored.items()}

    def _set(self, topic: str, configs: Mapping[str, str]) -> None:
        if configs:
            self._stored[topic] = dict(configs)
            self._policies[topic] = topic_policy(configs, self.broker)
        else:
            self._stored.pop(topic, None)
            self._policies.pop(topic, None)

    def configs_of(self, topic: str) -> dict[str, str]:
        """The topic's set as this node enforces it (its own changes, the last cluster view's)."""
        self._sync()
        return dict(self._stored.get(topic, {}))

    def check_new(self, configs: Iterable[tuple[str, str | None]]) -> dict[str, str]:
        """A new topic's configs, checked (InvalidConfig)."""
        return check_configs(configs, self.broker)

    def created(self, topic: str, configs: Mapping[str, str]) -> None:
        """A topic made here with `configs` (stored with it)."""
        self._set(topic, configs)

    def deleted(self, topic: str) -> None:
        """A topic deleted here: its configs went with it (the store deleted them)."""
        self._set(topic, {})

    async def stored(self, topic: str) -> dict[str, str]:
        """The topic's set as the control plane has it now (UnknownTopic if no such topic)."""
        self._check_known(topic)
        return (await self._store.topic_configs(topic)).get(topic, {})

    async def replace(
        self, topic: str, configs: Iterable[tuple[str, str | None]], *, validate_only: bool = False
    ) -> dict[str, str]:
        """AlterConfigs: the topic's whole set becomes `configs` (unnamed ones: defaults)."""
        self._check_known(topic)
        checked = check_configs(configs, self.broker)
        if not validate_only:
            async with self._write_lock:
                await self._store.set_topic_configs(topic, checked, self._wall())
                self._set(topic, checked)
            await self._changed(topic)
        return checked

    async def alter(
        self,
        topic: str,
        ops: Sequence[tuple[AlterOp, str, str | None]],
        *,
        validate_only: bool = False,
    ) -> dict[str, str]:
        """IncrementalAlterConfigs: SET / DELETE / APPEND / SUBTRACT on the topic's set."""
        async with self._write_lock:
            new = altered(await self.stored(topic), ops, self.broker)
            if not validate_only:
                await self._store.set_topic_configs(topic, new, self._wall())
                self._set(topic, new)
        if not validate_only:
            await self._changed(topic)
        return new

    async def _changed(self, topic: str) -> None:
        if self.on_change is not None:
            await self.on_change(topic)

    def _check_known(self, topic: str) -> None:
        if topic not in self._topics():
            raise UnknownTopic(topic)
