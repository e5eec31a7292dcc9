"""DescribeLogDirs and AlterReplicaLogDirs: a broker with one log directory, the object store
its partitions live in, listing the partitions it leads with their sizes (Kafka UIs show topic
sizes from it; kafka-python's integration suite asks for it), and answering a move into that
directory as Kafka answers a move to where a replica already is."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from levelzero.core.errors import LedElsewhere, StorageError
from levelzero.daemon.service import Daemon
from levelzero.kafka.protocol import make

from daemon_support import daemon_and_client
from test_kafka_listener import Wire, module_of


def admin_calls(port: int) -> dict[str, Any]:
    from kafka import KafkaAdminClient, TopicPartitionReplica

    admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}")
    try:
        everything = admin.describe_log_dirs()
        only_a = admin.describe_log_dirs(topic_partitions={"a": [1]})
        here = everything[0]["log_dirs"][0]["log_dir"]
        moves = admin.alter_replica_log_dirs(
            {
                TopicPartitionReplica("a", 0, everything[0]["broker"]): here,
                TopicPartitionReplica("a", 9, everything[0]["broker"]): here,
            }
        )
        elsewhere = admin.alter_replica_log_dirs(
            {TopicPartitionReplica("b", 0, everything[0]["broker"]): "/x"}
        )
    finally:
        admin.close()
    return {
        "everything": everything,
        "only_a": only_a,
        "moves": {(r.topic, r.partition): e.__name__ for r, e in moves.items()},
        "elsewhere": {(r.topic, r.partition): e.__name__ for r, e in elsewhere.items()},
    }


async def l0_bytes(daemon: Daemon, topic: str, partition: int, offset: int) -> int:
    """The bytes of the partition's L0 extents from data offset `offset`, read from its log."""
    assert daemon.node is not None
    pid = daemon.node.partition(topic, partition).row.pid
    placeholders = await daemon.node.log_store.read_placeholders(pid, offset, 1000)
    return sum(record.entry.byte_length for record in placeholders)


def sizes(result: dict[str, Any]) -> dict[tuple[str, int], int]:
    (log_dir,) = result["log_dirs"]
    return {
        (t["name"], p["partition_index"]): p["partition_size"]
        for t in log_dir["topics"]
        for p in t["partitions"]
    }


async def test_the_object_store_is_the_one_log_dir_and_partitions_have_their_sizes(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("a", 2)
        await client.create_topic("b", 1)
        await client.produce("a", 0, [b"x" * 100, b"y" * 200])
        await client.produce("a", 1, [b"z" * 50])
        seen = await anyio.to_thread.run_sync(admin_calls, daemon.kafka_port)
        objects_dir = os.path.abspath(daemon.config.storage.objects_dir)
        # The sizes are the bytes the records take in the object store (their L0 extents, not
        # reconciled yet, as the log's placeholders say): each partition's own, an empty one 0.
        assert daemon.node is not None
        expected = {(t, p): await l0_bytes(daemon, t, p, 0) for t, p in (("a", 0), ("a", 1), ("b", 0))}
    assert (
        expected[("a", 0)] > 300 and 50 < expected[("a", 1)] < expected[("a", 0)] and expected[("b", 0)] == 0
    )
    (result,) = seen["everything"]
    assert result["broker"] == 0
    (log_dir,) = result["log_dirs"]
    assert (log_dir["log_dir"], log_dir["error_code"]) == (objects_dir, 0)
    assert sizes(result) == expected
    (only_a,) = seen["only_a"]
    assert sizes(only_a) == {("a", 1): expected[("a", 1)]}
    assert seen["moves"] == {("a", 0): "NoError", ("a", 9): "UnknownTopicOrPartitionError"}
    assert seen["elsewhere"] == {("b", 0): "LogDirNotFoundError"}


async def test_versions_sizes_after_reconciliation_and_offset_lag_on_the_wire(tmp_path: Path) -> None:
    async with daemon_and_client(
        tmp_path, kafka__listen="127.0.0.1:0", reconciler__interval_s=0.05, reconciler__object_age_max_s=0.05
    ) as (daemon, client):
        await client.create_topic("t", 1)
        for i in range(3):
            await client.produce("t", 0, [b"v%d" % i * 40])
        with anyio.fail_after(20):  # reconciled: the size is the L1 objects' now
            while (await client.status()).partitions[0].lro != 2:
                await anyio.sleep(0.05)
        (status,) = (await client.status()).partitions
        assert status.l1_lineage is not None
        stored = 0
        assert daemon.node is not None
        for o in status.l1_lineage:
            info = await daemon.node.object_store.head(o.key)
            assert info is not None
            stored += info.size
        wire = await Wire.connect(daemon.kafka_port)
        try:
            for version in (1, 2, 3, 4):
                m = module_of(35, version)
                response = await wire.request(35, version, topics=None)
                (result,) = response.results
                assert result.log_dir == os.path.abspath(daemon.config.storage.objects_dir)
                ((topic, partitions),) = [(t.name, t.partitions) for t in result.topics]
                assert topic == "t"
                assert [
                    (p.partition_index, p.partition_size, p.offset_lag, p.is_future_key) for p in partitions
                ] == [(0, stored, 0, False)]
                if version >= 4:
                    assert (result.total_bytes, result.usable_bytes) == (-1, -1)
                named = await wire.request(
                    35, version, topics=(make(m.DescribableLogDirTopic, topic="nope", partitions=(0,)),)
                )
                assert [r.topics for r in named.results] == [()]
            moved = await move_into(wire, os.path.abspath(daemon.config.storage.objects_dir), "t", (0, 1))
            ((name, parts),) = [(r.topic_name, r.partitions) for r in moved.results]
            assert name == "t"
            assert [(p.partition_index, p.error_code) for p in parts] == [
                (0, ErrorCode.none),
                (1, ErrorCode.unknown_topic_or_partition),
            ]
        finally:
            await wire.aclose()


async def move_into(wire: Wire, path: str, topic: str, partitions: tuple[int, ...]) -> Any:
    """AlterReplicaLogDirs v2: `topic`'s `partitions` into the directory `path`."""
    m = module_of(34, 2)
    topics = (make(m.AlterReplicaLogDirTopic, name=topic, partitions=partitions),)
    return await wire.request(34, 2, dirs=(make(m.AlterReplicaLogDir, path=path, topics=topics),))


async def describe(wire: Wire) -> Any:
    (result,) = (await wire.request(35, 4, topics=None)).results
    return result


async def test_part_reconciled_a_start_offset_moved_and_partitions_not_led_here(tmp_path: Path) -> None:
    """A partition part in L1, part in L0 counts each byte once; an L1 object wholly below the
    start offset no more; a partition led by another node (here: left out of what this node
    leads) is left out, and a move of it is REPLICA_NOT_AVAILABLE; a size that cannot be read
    (the metastore away) fails the directory (KAFKA_STORAGE_ERROR, no topics), where an empty
    directory would tell a UI the topics are gone."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0", reconciler__enabled=False) as (
        daemon,
        client,
    ):
        node = daemon.node
        assert node is not None
        await client.create_topic("t", 2)
        await client.produce("t", 0, [b"a" * 300])
        await client.produce("t", 0, [b"b" * 300])
        actor = node.partition("t", 0)
        assert await node.reconciler.reconcile_partition(actor)  # offsets 0-1: one L1 object
        await client.produce("t", 0, [b"c" * 300])  # offset 2: in L0
        (row,) = await node.l1.refresh(actor)
        assert (row.base_offset, row.last_offset, actor.state.lro) == (0, 1, 1)
        in_l0 = await l0_bytes(daemon, "t", 0, 2)
        assert in_l0 > 300
        wire = await Wire.connect(daemon.kafka_port)
        try:
            sized = {
                (t.name, p.partition_index): p.partition_size
                for t in (await describe(wire)).topics
                for p in t.partitions
            }
            assert sized == {("t", 0): row.size + in_l0, ("t", 1): 0}
            assert await node.delete_records("t", 0, 1) == 1  # inside the object: counted whole
            assert [p.partition_size for t in (await describe(wire)).topics for p in t.partitions][
                0
            ] == row.size + in_l0
            assert await node.delete_records("t", 0, 2) == 2  # past it
            assert [p.partition_size for t in (await describe(wire)).topics for p in t.partitions][0] == in_l0

            led = node.partitions
            node.partitions = lambda: [a for a in led() if a.row.partition != 1]  # type: ignore[method-assign]
            assert [
                (t.name, [p.partition_index for p in t.partitions]) for t in (await describe(wire)).topics
            ] == [("t", [0])]
            moved = await move_into(wire, os.path.abspath(daemon.config.storage.objects_dir), "t", (0, 1))
            assert [(p.partition_index, p.error_code) for r in moved.results for p in r.partitions] == [
                (0, ErrorCode.none),
                (1, ErrorCode.replica_not_available),
            ]
            node.partitions = led  # type: ignore[method-assign]

            sizing = node.retained_bytes

            async def moving(topic: str, partition: int) -> int:
                if partition == 1:
                    raise LedElsewhere(topic, partition, None)  # its lease moved meanwhile
                return await sizing(topic, partition)

            node.retained_bytes = moving  # type: ignore[method-assign]
            assert [
                (t.name, [p.partition_index for p in t.partitions]) for t in (await describe(wire)).topics
            ] == [("t", [0])]

            async def away(topic: str, partition: int) -> int:
                raise StorageError("the metastore is away")

            node.retained_bytes = away  # type: ignore[method-assign]
            failed = await describe(wire)
            assert (failed.error_code, failed.topics) == (ErrorCode.kafka_storage_error, ())
        finally:
            await wire.aclose()
