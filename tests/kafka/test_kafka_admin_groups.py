"""The groups' admin surface as lag exporters and admin tools read it (ListGroups ->
DescribeGroups -> OffsetFetch -> ListOffsets), with kafka-python's KafkaAdminClient and
confluent-kafka's AdminClient: lag = end offset - committed offset, exact; DeleteGroups and
OffsetDelete by Kafka's rules (a group with members is not deleted, a subscribed topic's offsets
are kept); DescribeCluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from daemon_support import daemon_and_client

TOPIC = "lagged"
OTHER = "unsubscribed"
PARTITIONS = 3
PRODUCED = {0: 10, 1: 20, 2: 30}
COMMITTED = {0: 4, 1: 20, 2: 0}  # lag 6, 0, 30
POLL_ROUNDS_MAX = 300


def produce_and_join(bootstrap: str) -> Any:
    """Topics made and filled; a member of group "lagging" subscribed to TOPIC that commits
    COMMITTED, and one commit of OTHER's partition 0 (a topic no member subscribes to)."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1), NewTopic(OTHER, 1, 1)]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition, count in PRODUCED.items():
        for i in range(count):
            producer.produce(TOPIC, value=b"%d" % i, partition=partition)
    producer.produce(OTHER, value=b"x", partition=0)
    assert producer.flush(30) == 0
    member = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "lagging",
            "client.id": "lag-member",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 200,
        }
    )
    member.subscribe([TOPIC])
    for _ in range(POLL_ROUNDS_MAX):
        member.poll(0.1)
        if len(member.assignment()) == PARTITIONS:
            break
    assert len(member.assignment()) == PARTITIONS
    member.commit(
        offsets=[TopicPartition(TOPIC, p, o) for p, o in COMMITTED.items()] + [TopicPartition(OTHER, 0, 1)],
        asynchronous=False,
    )
    return member


def lag_with_kafka_python(bootstrap: str) -> dict[str, Any]:
    from kafka import KafkaAdminClient, TopicPartition
    from kafka.admin import OffsetSpec

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        groups = admin.list_groups()
        described = admin.describe_groups(["lagging"])
        committed = admin.list_group_offsets({"lagging": None})
        tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        ends = admin.list_partition_offsets({tp: OffsetSpec.LATEST for tp in tps})
        cluster = admin.describe_cluster()
    finally:
        admin.close()
    return {
        "groups": groups,
        "described": described,
        "committed": committed,
        "ends": ends,
        "cluster": cluster,
    }


def lag_with_confluent(bootstrap: str) -> dict[str, Any]:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient({"bootstrap.servers": bootstrap})
    listed = admin.list_consumer_groups().result(30)
    described = admin.describe_consumer_groups(["lagging"])["lagging"].result(30)
    committed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("lagging")])[
        "lagging"
    ].result(30)
    ends = {
        tp.partition: info.offset
        for tp, future in admin.list_offsets(
            {TopicPartition(TOPIC, p): OffsetSpec.latest() for p in range(PARTITIONS)}
        ).items()
        for info in [future.result(30)]
    }
    cluster = admin.describe_cluster().result(30)
    return {
        "listed": listed,
        "described": described,
        "committed": committed,
        "ends": ends,
        "cluster": cluster,
    }


def delete_with_confluent(bootstrap: str, groups: list[str]) -> dict[str, str]:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    outcome = {}
    for group, future in admin.delete_consumer_groups(groups).items():
        try:
            future.result(30)
            outcome[group] = "deleted"
        except Exception as exc:  # noqa: BLE001 - a KafkaException carrying Kafka's error
            outcome[group] = exc.args[0].name()
    return outcome


def listed_after_delete(bootstrap: str) -> list[str]:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    return sorted(g.group_id for g in admin.list_consumer_groups().result(30).valid)


async def test_consumer_lag_reads_exactly_through_kafka_python_and_confluent_admin_clients(
    tmp_path: Path,
) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        bootstrap = f"127.0.0.1:{daemon.kafka_port}"
        member = await anyio.to_thread.run_sync(produce_and_join, bootstrap)
        try:
            kp = await anyio.to_thread.run_sync(lag_with_kafka_python, bootstrap)
            cf = await anyio.to_thread.run_sync(lag_with_confluent, bootstrap)
            # A group with members is not deleted; an unknown one is not found.
            refused = await anyio.to_thread.run_sync(delete_with_confluent, bootstrap, ["lagging", "nobody"])
        finally:
            await anyio.to_thread.run_sync(member.close)  # LeaveGroup: the group is empty
        deleted = await anyio.to_thread.run_sync(delete_with_confluent, bootstrap, ["lagging"])
        remaining = await anyio.to_thread.run_sync(listed_after_delete, bootstrap)

    expected_lag = {p: PRODUCED[p] - COMMITTED[p] for p in range(PARTITIONS)}

    # kafka-python: ListGroups -> DescribeGroups -> OffsetFetch -> ListOffsets.
    assert kp["groups"] == [
        {"group_id": "lagging", "protocol_type": "consumer", "group_state": "Stable", "group_type": "classic"}
    ]
    group = kp["described"]["lagging"]
    assert (group["group_state"], group["protocol_type"], group["protocol_data"], group["error"]) == (
        "Stable",
        "consumer",
        "range",
        None,
    )
    (one,) = group["members"]
    assert (one["client_id"], one["client_host"]) == ("lag-member", "/127.0.0.1")
    assert one["member_metadata"]["topics"] == [TOPIC]
    assert one["member_assignment"]["assigned_partitions"] == [{"topic": TOPIC, "partitions": [0, 1, 2]}]
    committed = {(tp.topic, tp.partition): meta.offset for tp, meta in kp["committed"]["lagging"].items()}
    assert committed == {**{(TOPIC, p): o for p, o in COMMITTED.items()}, (OTHER, 0): 1}
    ends = {tp.partition: info.offset for tp, info in kp["ends"].items()}
    assert {p: ends[p] - committed[(TOPIC, p)] for p in range(PARTITIONS)} == expected_lag
    assert kp["cluster"]["cluster_id"] == "levelzero"
    assert [(b["broker_id"], b["host"]) for b in kp["cluster"]["brokers"]] == [(0, "127.0.0.1")]

    # confluent-kafka (librdkafka): the same four steps.
    assert [(g.group_id, g.is_simple_consumer_group, g.state.name) for g in cf["listed"].valid] == [
        ("lagging", False, "STABLE")
    ]
    assert cf["listed"].errors == []
    described = cf["described"]
    assert (described.group_id, described.state.name, described.partition_assignor) == (
        "lagging",
        "STABLE",
        "range",
    )
    (one,) = described.members
    assert one.client_id == "lag-member" and one.host == "/127.0.0.1"
    assert sorted(tp.partition for tp in one.assignment.topic_partitions) == list(range(PARTITIONS))
    committed = {(tp.topic, tp.partition): tp.offset for tp in cf["committed"].topic_partitions}
    assert committed == {**{(TOPIC, p): o for p, o in COMMITTED.items()}, (OTHER, 0): 1}
    assert {p: cf["ends"][p] - committed[(TOPIC, p)] for p in range(PARTITIONS)} == expected_lag
    assert cf["cluster"].cluster_id == "levelzero" and [n.port for n in cf["cluster"].nodes] == [
        int(bootstrap.rpartition(":")[2])
    ]

    # DeleteGroups: NON_EMPTY_GROUP while a member is in it, GROUP_ID_NOT_FOUND for none.
    assert refused == {"lagging": "NON_EMPTY_GROUP", "nobody": "GROUP_ID_NOT_FOUND"}
    assert deleted == {"lagging": "deleted"}
    assert remaining == []


def offset_delete(bootstrap: str) -> dict[str, Any]:
    from kafka import KafkaAdminClient, TopicPartition

    member = produce_and_join(bootstrap)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    out: dict[str, Any] = {}
    try:
        # A member subscribes to TOPIC: its offsets stay; OTHER's go.
        out["while_subscribed"] = admin.delete_group_offsets(
            "lagging", [TopicPartition(TOPIC, 0), TopicPartition(OTHER, 0)]
        )
        out["after_first"] = admin.list_group_offsets({"lagging": None})["lagging"]
        member.close()
        out["empty"] = admin.delete_group_offsets("lagging", [TopicPartition(TOPIC, 0)])
        out["after_second"] = admin.list_group_offsets({"lagging": None})["lagging"]
        out["described"] = admin.describe_groups(["lagging"])
    finally:
        admin.close()
    return out


async def test_offset_delete_keeps_a_subscribed_topics_offsets_as_kafka_does(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        out = await anyio.to_thread.run_sync(offset_delete, f"127.0.0.1:{daemon.kafka_port}")

    def errors(result: Any) -> dict[tuple[str, int], str]:
        return {(tp.topic, tp.partition): error.__name__ for tp, error in result.items()}

    assert errors(out["while_subscribed"]) == {
        (TOPIC, 0): "GroupSubscribedToTopicError",
        (OTHER, 0): "NoError",
    }
    assert sorted((tp.topic, tp.partition) for tp in out["after_first"]) == [
        (TOPIC, p) for p in range(PARTITIONS)
    ]
    assert errors(out["empty"]) == {(TOPIC, 0): "NoError"}
    assert sorted((tp.topic, tp.partition) for tp in out["after_second"]) == [(TOPIC, 1), (TOPIC, 2)]
    group = out["described"]["lagging"]
    assert (group["group_state"], group["protocol_type"], group["members"]) == ("Empty", "consumer", [])


def alter_offsets(bootstrap: str, group: str, offsets: dict[int, int]) -> dict[int, str | None]:
    """confluent-kafka's AdminClient.alter_consumer_group_offsets (an OffsetCommit with
    generation -1 and no member id) of TOPIC's partitions: partition -> error name, or None."""
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    asked = ConsumerGroupTopicPartitions(group, [TopicPartition(TOPIC, p, o) for p, o in offsets.items()])
    try:
        result = admin.alter_consumer_group_offsets([asked])[group].result(30)
    except KafkaException as exc:  # the whole group refused: its error for each partition
        return dict.fromkeys(offsets, exc.args[0].name())
    return {tp.partition: None if tp.error is None else tp.error.name() for tp in result.topic_partitions}


def committed_offsets(bootstrap: str, group: str) -> dict[int, int]:
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30)
    return {tp.partition: tp.offset for tp in result.topic_partitions if tp.topic == TOPIC}


async def test_altering_a_groups_offsets_is_refused_while_it_has_members(tmp_path: Path) -> None:
    """As Kafka's group coordinator: an OffsetCommit with generation -1 and no member id (what
    an admin client sends to reset a group's offsets) to a group with members is
    UNKNOWN_MEMBER_ID (only its members commit there) and changes nothing; once the group is
    empty, or for a group that does not exist, it is taken."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        bootstrap = f"127.0.0.1:{daemon.kafka_port}"
        member = await anyio.to_thread.run_sync(produce_and_join, bootstrap)
        try:
            refused = await anyio.to_thread.run_sync(alter_offsets, bootstrap, "lagging", {0: 9, 1: 9})
            kept = await anyio.to_thread.run_sync(committed_offsets, bootstrap, "lagging")
            fresh = await anyio.to_thread.run_sync(alter_offsets, bootstrap, "fresh", {0: 3})
        finally:
            await anyio.to_thread.run_sync(member.close)  # LeaveGroup: the group is empty
        emptied = await anyio.to_thread.run_sync(alter_offsets, bootstrap, "lagging", {0: 9, 1: 9})
        altered = await anyio.to_thread.run_sync(committed_offsets, bootstrap, "lagging")
        fresh_offsets = await anyio.to_thread.run_sync(committed_offsets, bootstrap, "fresh")
    assert refused == {0: "UNKNOWN_MEMBER_ID", 1: "UNKNOWN_MEMBER_ID"}
    assert kept == COMMITTED
    assert fresh == {0: None} and fresh_offsets == {0: 3}
    assert emptied == {0: None, 1: None}
    assert altered == {0: 9, 1: 9, 2: COMMITTED[2]}


def consume_as(bootstrap: str, group: str, topic: str, wanted: int, reset: str = "earliest") -> Any:
    """A member of `group` subscribed to `topic` that reads until it has `wanted` records and
    commits them: (the consumer, still open, and the (offset, value) pairs it read)."""
    from confluent_kafka import Consumer

    member = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": reset,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 200,
        }
    )
    member.subscribe([topic])
    read: list[tuple[int, bytes]] = []
    for _ in range(POLL_ROUNDS_MAX):
        message = member.poll(0.1)
        if message is not None and message.error() is None:
            read.append((message.offset(), message.value()))
        if len(read) >= wanted:
            break
    member.commit(asynchronous=False)
    return member, read


def recreate_under_a_group(bootstrap: str) -> dict[str, Any]:
    """Group "billing" reads and commits all 3 records of "orders"; the topic is deleted and made
    again with 5 records; then the group's offsets are listed and it reads again."""
    from confluent_kafka import ConsumerGroupTopicPartitions, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    seen: dict[str, Any] = {}
    for round_, count in enumerate((3, 5)):
        if round_:
            admin.delete_topics(["orders"])["orders"].result(30)
        admin.create_topics([NewTopic("orders", 1, 1)])["orders"].result(30)
        producer = Producer({"bootstrap.servers": bootstrap})
        for i in range(count):
            producer.produce("orders", value=b"r%d-%d" % (round_, i), partition=0)
        assert producer.flush(30) == 0
        if not round_:
            member, seen["first"] = consume_as(bootstrap, "billing", "orders", count)
            member.close()
            listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("billing")])
            seen["committed"] = [
                (tp.topic, tp.partition, tp.offset) for tp in listed["billing"].result(30).topic_partitions
            ]
    groups = admin.list_consumer_groups(request_timeout=30).result()
    seen["listed"] = sorted(g.group_id for g in groups.valid)
    listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("billing")])
    seen["after"] = [
        (tp.topic, tp.partition, tp.offset) for tp in listed["billing"].result(30).topic_partitions
    ]
    member, seen["again"] = consume_as(bootstrap, "billing", "orders", 5)
    member.close()
    return seen


async def test_a_deleted_topics_offsets_are_gone_for_a_topic_made_again_with_its_name(tmp_path: Path) -> None:
    """As Kafka's coordinator removes a deleted partition's offsets: the group's offsets of the
    deleted topic are not listed nor served (the group, empty and without offsets, is dead),
    and its consumers read the new topic from the start. (They were served from the
    coordinator's memory until a restart, the store having deleted them: the group skipped the
    new topic's first three records.)"""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        seen = await anyio.to_thread.run_sync(recreate_under_a_group, f"127.0.0.1:{daemon.kafka_port}")
    assert seen["first"] == [(0, b"r0-0"), (1, b"r0-1"), (2, b"r0-2")]
    assert seen["committed"] == [("orders", 0, 3)]
    assert seen["after"] == []
    assert "billing" not in seen["listed"]  # empty, without offsets: dead, as Kafka makes it
    assert seen["again"] == [(i, b"r1-%d" % i) for i in range(5)]
