"""Each topic's Kafka topic configs."""

from __future__ import annotations

from collections.abc import Mapping

import asyncpg

from levelzero.core.errors import UnknownTopic
from .base import PostgresBase
from .partition_log import INSERT_TOPIC_CONFIGS


class TopicConfigRole(PostgresBase):
    # ------------------------------------------------------------------ topic configs

    async def topic_configs(self, topic: str | None = None) -> dict[str, dict[str, str]]:
        if topic is None:
            rows = await self._read(
                "reading topic configs", "SELECT topic, name, value FROM topic_configs ORDER BY topic, name"
            )
        else:
            rows = await self._read(
                "reading topic configs",
                "SELECT topic, name, value FROM topic_configs WHERE topic = $1 ORDER BY name",
                topic,
            )
        out: dict[str, dict[str, str]] = {}
        for name, key, value in rows:
            out.setdefault(name, {})[key] = value
        return out

    async def set_topic_configs(self, topic: str, configs: Mapping[str, str], now: float) -> None:
        items = sorted(configs.items())

        async def work(connection: asyncpg.Connection) -> None:
            # The topic's partition rows, locked: a topic deleted meanwhile is not given configs.
            found = await connection.fetchval(
                "SELECT count(*) FROM (SELECT 1 FROM partitions WHERE topic = $1 FOR SHARE) AS p", topic
            )
            if not found:
                raise UnknownTopic(topic)
            await connection.execute("DELETE FROM topic_configs WHERE topic = $1", topic)
            await connection.execute(
                INSERT_TOPIC_CONFIGS, topic, [n for n, _ in items], [v for _, v in items], now
            )

        await self._transact(f"setting topic {topic!r}'s configs", work)
