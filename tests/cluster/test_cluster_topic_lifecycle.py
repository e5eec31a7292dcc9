"""Deleting a topic and adding partitions in a three-node cluster (real daemons, PostgreSQL,
moto): a topic whose partitions are led by all three nodes, deleted through one of them, is
gone on every node; once the cluster is quiet, no object of it is left in the bucket (L1 under
its prefix, L0 at all), nothing of it is left in the control plane, and a topic made again with
its name starts empty. Partitions added through Kafka's CreatePartitions get leaders and take
records."""

from __future__ import annotations

from pathlib import Path

import anyio
import asyncpg
import pytest

from daemon_support import DaemonProcess
from levelzero.client import ApiError, Client
from test_cluster_daemons import QUIESCE_S, WAIT_S, no_l0_left, produce_until_acknowledged, start_nodes
from test_cluster_kafka import with_kafka

pytestmark = pytest.mark.s3

TOPIC = "c"  # the name test_cluster_daemons' produce helper writes to
PARTITIONS = 6


def s3_keys(s3_endpoint, bucket: str, prefix: str) -> list[str]:
    listed = s3_endpoint.boto3_client().list_objects_v2(Bucket=bucket, Prefix=prefix)
    return [item["Key"] for item in listed.get("Contents", [])]


async def leaders_known(nodes: dict[str, DaemonProcess], partitions: int) -> None:
    with anyio.fail_after(WAIT_S):
        while True:
            async with Client(nodes["n1"].url) as client:
                info = await client.cluster()
            if (
                info.partitions_without_leader == 0
                and sum(n.partitions_led for n in info.nodes) == partitions
            ):
                return
            await anyio.sleep(0.2)


def grow_through_kafka(port: int, count: int) -> dict[str, str | None]:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewPartitions

    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    out: dict[str, str | None] = {}
    for topic, future in admin.create_partitions([NewPartitions(TOPIC, count)]).items():
        try:
            future.result(timeout=WAIT_S)
            out[topic] = None
        except KafkaException as exc:
            out[topic] = exc.args[0].name()
    return out


async def test_a_topic_deleted_in_a_cluster_leaves_nothing_behind_and_comes_back_empty(
    tmp_path: Path,
    postgres_dsn: str,
    s3_endpoint,
    s3_bucket: str,
) -> None:
    nodes = start_nodes(tmp_path, postgres_dsn, s3_endpoint, s3_bucket, ["n1", "n2", "n3"], start=False)
    ports = with_kafka(nodes)
    for process in nodes.values():
        process.start()
    urls = [process.url for process in nodes.values()]
    try:
        async with Client(nodes["n1"].url) as client:
            await client.create_topic(TOPIC, PARTITIONS)
            await client.create_topic("kept", 1)
            with anyio.fail_after(WAIT_S):  # its leader may still be starting
                while True:
                    try:
                        await client.produce("kept", 0, [b"kept-0", b"kept-1"])
                        break
                    except ApiError as exc:
                        if exc.code != "not_leader":
                            raise
                        await anyio.sleep(0.1)
        for i in range(4 * PARTITIONS):
            await produce_until_acknowledged(urls, i % PARTITIONS, b"old-%d" % i)
        with anyio.fail_after(QUIESCE_S):  # reconciled into L1 by their leaders
            while (
                len({key.split("/")[2] for key in s3_keys(s3_endpoint, s3_bucket, f"level_one/{TOPIC}/")}) < 6
            ):
                await anyio.sleep(0.2)

        # Grown through Kafka: the new partitions get leaders and take records.
        assert await anyio.to_thread.run_sync(grow_through_kafka, ports["n3"], PARTITIONS + 2) == {
            TOPIC: None
        }
        await leaders_known(nodes, PARTITIONS + 2 + 1)
        offset, _ = await produce_until_acknowledged(urls, PARTITIONS + 1, b"new-partition")
        assert offset == 0
        assert await anyio.to_thread.run_sync(grow_through_kafka, ports["n1"], 3) == {
            TOPIC: "INVALID_PARTITIONS"
        }

        async with Client(nodes["n2"].url) as client:
            info = await client.delete_topic(TOPIC)
        assert info.partitions == PARTITIONS + 2
        for process in nodes.values():  # gone on every node within a cluster round
            async with Client(process.url) as client:
                with anyio.fail_after(WAIT_S):
                    while True:
                        with pytest.raises(ApiError) as caught:
                            await client.produce(TOPIC, 0, [b"late"])
                        if caught.value.code == "unknown_topic":
                            break
                        # a leader that has not heard yet: the store refuses its append
                        # (not_leader); one that has heard and is stopping the partition
                        # answers shutting_down (503, retriable) until it is gone (a busy
                        # machine makes that stop long enough to be met)
                        assert caught.value.code in ("not_leader", "shutting_down"), caught.value
                        await anyio.sleep(0.1)
        await leaders_known(nodes, 1)

        # Quiet now: the GC rounds of the nodes collect every object of the topic.
        await no_l0_left(s3_endpoint, s3_bucket)
        with anyio.fail_after(QUIESCE_S):
            while s3_keys(s3_endpoint, s3_bucket, f"level_one/{TOPIC}/"):
                await anyio.sleep(0.5)
        connection = await asyncpg.connect(postgres_dsn)
        try:
            with anyio.fail_after(QUIESCE_S):
                while await connection.fetchval(
                    "SELECT count(*) FROM deleted_partitions WHERE collected_at IS NULL"
                ):
                    await anyio.sleep(0.5)
            for table in ("partitions", "partition_leases", "partition_watermarks"):
                left = await connection.fetchval(
                    f"SELECT count(*) FROM {table} t WHERE t.pid IN (SELECT pid FROM deleted_partitions)"  # noqa: S608 - table names are the test's own constants
                )
                assert left == 0, table
            assert (
                await connection.fetchval(
                    "SELECT count(*) FROM l1_objects WHERE pid IN (SELECT pid FROM deleted_partitions)"
                )
                == 0
            )
        finally:
            await connection.close()
        assert s3_keys(s3_endpoint, s3_bucket, "level_one/kept/")  # the other topic's data stays
        async with Client(nodes["n2"].url) as client:
            assert [r.value for r in (await client.fetch("kept", 0, 0)).records] == [b"kept-0", b"kept-1"]

        # Made again with the same name: empty, and writable at offset 0.
        async with Client(nodes["n3"].url) as client:
            await client.create_topic(TOPIC, 2)
        offset, _ = await produce_until_acknowledged(urls, 1, b"reborn")
        assert offset == 0
    finally:
        for process in nodes.values():
            process.cleanup()
