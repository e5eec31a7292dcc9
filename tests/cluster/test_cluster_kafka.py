"""Unmodified Kafka clients against a three-node cluster (real daemons, PostgreSQL, moto): each
node's Metadata names every live node as a broker and each partition's lease holder as its
leader (once its view is current); a consumer group is coordinated by one node, chosen by
rendezvous over the live nodes, whichever node a client asks. confluent-kafka (librdkafka)
bootstrapped at one node produces to partitions led by all three, and a consumer group
bootstrapped at another reads every record back byte for byte and commits; when a leader is
SIGKILLed, the producer follows NOT_LEADER_OR_FOLLOWER / lost connections to the new leaders and
every record it was told is delivered is stored exactly once."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import anyio
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from test_cluster_daemons import start_nodes

from levelzero.client import Client
from levelzero.kafka.metadata import broker_id

from daemon_support import DaemonProcess, free_port

pytestmark = pytest.mark.s3

TOPIC = "c"
PARTITIONS = 6
RECORDS = 600
DEADLINE_S = 90.0


def with_kafka(nodes: dict[str, DaemonProcess]) -> dict[str, int]:
    ports = {}
    for name, process in nodes.items():
        ports[name] = free_port()
        process.env["LEVELZERO_KAFKA_LISTEN"] = f"127.0.0.1:{ports[name]}"
    return ports


def produce(bootstrap: str, tag: str, count: int) -> dict[tuple[int, int], bytes]:
    """Through confluent-kafka, partition i % PARTITIONS; (partition, offset) -> value of every
    record reported delivered (failures would be reported, and are asserted absent)."""

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": int(DEADLINE_S * 1000),
            "retry.backoff.ms": 100,
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    delivered: dict[tuple[int, int], bytes] = {}
    errors: list[str] = []

    def report(error, message) -> None:
        if error is not None:
            errors.append(str(error))
            return
        key = (message.partition(), message.offset())
        assert key not in delivered, f"offset {key} delivered twice"
        delivered[key] = message.value()

    for i in range(count):
        producer.produce(
            TOPIC,
            value=f"{tag}-{i}".encode() * 3,
            key=str(i).encode(),
            partition=i % PARTITIONS,
            on_delivery=report,
        )
        producer.poll(0)
    assert producer.flush(DEADLINE_S) == 0
    assert errors == []
    assert len(delivered) == count
    return delivered


def consume_all(bootstrap: str, group: str, expected: int) -> dict[tuple[int, int], bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 200,
            "fetch.wait.max.ms": 100,
        }
    )
    consumer.subscribe([TOPIC])
    got: dict[tuple[int, int], bytes] = {}
    deadline = time.monotonic() + DEADLINE_S
    try:
        while len(got) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            got[(message.partition(), message.offset())] = message.value()
        consumer.commit(asynchronous=False)
        committed = consumer.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=10)
        assert sum(tp.offset for tp in committed) == expected
    finally:
        consumer.close()
    return got


def groups_seen_by_an_admin(bootstrap: str, group: str) -> tuple[list[tuple[str, str]], str, int, int]:
    """As a lag exporter reads a cluster: ListGroups asks every broker (each lists the groups it
    coordinates), DescribeGroups and OffsetFetch go to the coordinator, ListOffsets to each
    partition's leader. (listed (group, state), described state, sum of committed, sum of ends)"""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient({"bootstrap.servers": bootstrap})
    listed = admin.list_consumer_groups().result(30)
    assert listed.errors == []
    described = admin.describe_consumer_groups([group])[group].result(30)
    committed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30)
    ends = admin.list_offsets({TopicPartition(TOPIC, p): OffsetSpec.latest() for p in range(PARTITIONS)})
    return (
        sorted((g.group_id, g.state.name) for g in listed.valid),
        described.state.name,
        sum(tp.offset for tp in committed.topic_partitions),
        sum(future.result(30).offset for future in ends.values()),
    )


async def test_kafka_clients_use_every_node_of_a_cluster(
    tmp_path: Path,
    postgres_dsn: str,
    s3_endpoint,
    s3_bucket: str,
) -> None:
    nodes = start_nodes(tmp_path, postgres_dsn, s3_endpoint, s3_bucket, ["n1", "n2", "n3"], start=False)
    ports = with_kafka(nodes)
    for process in nodes.values():
        process.start()
    try:
        async with Client(nodes["n1"].url) as client:
            await client.create_topic(TOPIC, PARTITIONS)
            with anyio.fail_after(DEADLINE_S):
                while (await client.cluster()).partitions_without_leader:
                    await anyio.sleep(0.2)
            info = await client.cluster()
        led = {n.node_id: n.partitions_led for n in info.nodes}
        assert sorted(led) == ["n1", "n2", "n3"] and all(led.values()), led

        # Every node names the same brokers and leaders (once each has read the view since the
        # last lease was taken: a node may answer LEADER_NOT_AVAILABLE, retriable, until then).
        async def metadata(name: str) -> tuple[dict[int, int], dict[int, int]]:
            admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{ports[name]}"})
            answer = await anyio.to_thread.run_sync(lambda: admin.list_topics(timeout=20))
            brokers = {b.id: b.port for b in answer.brokers.values()}
            return brokers, {p: m.leader for p, m in answer.topics[TOPIC].partitions.items()}

        with anyio.fail_after(DEADLINE_S):
            while True:
                seen = [await metadata(name) for name in nodes]
                if all(-1 not in leaders.values() for _, leaders in seen):
                    break
                await anyio.sleep(0.2)
        for brokers, leaders in seen:
            assert brokers == {broker_id(n): ports[n] for n in nodes}
            assert leaders == seen[0][1]
        assert {broker_id(n) for n in nodes} == set(seen[0][1].values())  # spread over all three

        first = await anyio.to_thread.run_sync(produce, f"127.0.0.1:{ports['n1']}", "first", RECORDS)
        read = await anyio.to_thread.run_sync(consume_all, f"127.0.0.1:{ports['n2']}", "g1", RECORDS)
        assert read == first
        # The group is listed once (by its coordinator), described empty, and its lag is 0.
        seen_groups = await anyio.to_thread.run_sync(
            groups_seen_by_an_admin, f"127.0.0.1:{ports['n3']}", "g1"
        )
        assert seen_groups == ([("g1", "EMPTY")], "EMPTY", RECORDS, RECORDS)

        # A leader dies: the producer finds the new leaders; nothing is stored twice.
        victim = "n3"
        nodes[victim].signal(signal.SIGKILL)
        nodes[victim].wait_exit()
        survivors = ",".join(f"127.0.0.1:{ports[n]}" for n in nodes if n != victim)
        second = await anyio.to_thread.run_sync(produce, survivors, "second", RECORDS)
        assert not set(first) & set(second)
        everything = {**first, **second}
        read = await anyio.to_thread.run_sync(consume_all, survivors, "g2", len(everything))
        assert read == everything
    finally:
        for process in nodes.values():
            process.cleanup()
