"""The authorized operations of Kafka's describe answers (KIP-430) through confluent-kafka's
AdminClient: levelzero has no ACLs, so, as a Kafka broker without an authorizer, every operation
Kafka supports on the cluster, a topic and a group when asked; none when not asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from daemon_support import daemon_and_client

TOPIC_OPS = {"READ", "WRITE", "CREATE", "DESCRIBE", "DELETE", "ALTER", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"}
GROUP_OPS = {"READ", "DESCRIBE", "DELETE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"}
CLUSTER_OPS = {
    "CREATE",
    "CLUSTER_ACTION",
    "DESCRIBE_CONFIGS",
    "ALTER_CONFIGS",
    "IDEMPOTENT_WRITE",
    "ALTER",
    "DESCRIBE",
}


def described(port: int) -> dict[str, Any]:
    from confluent_kafka import Consumer, TopicCollection
    from confluent_kafka.admin import AdminClient

    bootstrap = f"127.0.0.1:{port}"
    member = Consumer({"bootstrap.servers": bootstrap, "group.id": "g", "session.timeout.ms": 6000})
    member.subscribe(["t"])
    for _ in range(100):
        member.poll(0.1)
        if member.assignment():
            break
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def names(ops: Any) -> set[str] | None:
        return None if ops is None else {op.name for op in ops}

    try:
        out: dict[str, Any] = {}
        for asked in (True, False):
            cluster = admin.describe_cluster(include_authorized_operations=asked, request_timeout=20).result()
            (topic,) = admin.describe_topics(
                TopicCollection(["t"]), include_authorized_operations=asked, request_timeout=20
            ).values()
            (group,) = admin.describe_consumer_groups(
                ["g"], include_authorized_operations=asked, request_timeout=20
            ).values()
            out[f"cluster {asked}"] = names(cluster.authorized_operations)
            out[f"topic {asked}"] = names(topic.result().authorized_operations)
            out[f"group {asked}"] = names(group.result().authorized_operations)
        return out
    finally:
        member.close()


async def test_every_supported_operation_is_authorized_when_asked(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("t", 1)
        out = await anyio.to_thread.run_sync(described, daemon.kafka_port)
    assert out["cluster True"] == CLUSTER_OPS
    assert out["topic True"] == TOPIC_OPS
    assert out["group True"] == GROUP_OPS
    assert out["cluster False"] is None and out["group False"] is None
