"""The partition-placement admin APIs, with kafka-python's KafkaAdminClient (the calls its own
integration suite makes): DescribeTopicPartitions paged by its cursor, ElectLeaders (no
election needed: each partition's leader is its only replica), ListPartitionReassignments
(none) and AlterPartitionReassignments (a no-op to the present replica, else refused), and
ListConfigResources (the topics and this broker)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from daemon_support import daemon_and_client


def placement_admin(port: int) -> dict[str, Any]:
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=20_000)
    seen: dict[str, Any] = {}
    try:
        admin.create_topics([NewTopic("a", 3, 1), NewTopic("b", 2, 1)])
        whole = admin.describe_topic_partitions(["b", "a", "missing", "bad name!"])
        seen["whole"] = [
            (
                t["name"],
                t["error_code"],
                [(p["partition_index"], p["leader_id"], p["replica_nodes"]) for p in t["partitions"]],
            )
            for t in whole["topics"]
        ]
        seen["whole_cursor"] = whole["next_cursor"]
        pages = []
        cursor = None
        for _ in range(10):  # 5 partitions, 2 a page: 3 pages
            page = admin.describe_topic_partitions(["a", "b"], response_partition_limit=2, cursor=cursor)
            pages.append(
                [(t["name"], [p["partition_index"] for p in t["partitions"]]) for t in page["topics"]]
            )
            cursor = page["next_cursor"]
            if cursor is None:
                break
        seen["pages"] = pages
        elected = admin.elect_leaders(0, {"a": [0, 2]})
        seen["elect"] = sorted((r[0], p[0], p[1]) for r in elected.replica_election_results for p in r[1])
        try:
            admin.elect_leaders(0, {"b": [5]})
            seen["elect_unknown"] = None
        except Exception as exc:  # noqa: BLE001 - the error's class is what is checked
            seen["elect_unknown"] = type(exc).__name__
        seen["reassignments"] = admin.list_partition_reassignments()
        seen["to_present"] = admin.alter_partition_reassignments({TopicPartition("a", 0): [0]})
        moved = admin.alter_partition_reassignments(
            {TopicPartition("a", 1): [3], TopicPartition("a", 2): None}
        )
        seen["refused"] = {tp: error.__name__ for tp, error in moved.items()}
        seen["config_resources"] = admin.list_config_resources()
    finally:
        admin.close()
    return seen


async def test_kafka_python_reads_partition_placement_and_config_resources(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _client):
        assert daemon.kafka_port is not None
        seen = await anyio.to_thread.run_sync(placement_admin, daemon.kafka_port)
    assert seen["whole"] == [
        ("a", 0, [(0, 0, [0]), (1, 0, [0]), (2, 0, [0])]),
        ("b", 0, [(0, 0, [0]), (1, 0, [0])]),
        ("bad name!", 17, []),  # INVALID_TOPIC_EXCEPTION: no topic can have the name
        ("missing", 3, []),  # UNKNOWN_TOPIC_OR_PARTITION
    ]
    assert seen["whole_cursor"] is None
    assert seen["pages"] == [[("a", [0, 1])], [("a", [2]), ("b", [0])], [("b", [1])]]
    assert seen["elect"] == [("a", 0, 84), ("a", 2, 84)]  # ELECTION_NOT_NEEDED
    assert seen["elect_unknown"] == "UnknownTopicOrPartitionError"
    assert seen["reassignments"] == {}
    assert seen["to_present"] == {("a", 0): None}
    # another broker: placed by leases, refused; a cancellation: nothing is in progress
    assert seen["refused"] == {
        ("a", 1): "InvalidReplicationAssignmentError",
        ("a", 2): "NoReassignmentInProgressError",
    }
    assert seen["config_resources"] == {"topic": ["a", "b"], "broker": ["0"]}
