"""Reading a transactional topic back with confluent-kafka, as the transaction tests do: a
partition's records up to its end under an isolation level, the partitions' ends, and waiting
until every transaction is complete (EndTxn is answered before its markers are stored)."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, TopicPartition


def read(port: int, topic: str, isolation: str, partition: int, wait_s: float) -> list[tuple[int, bytes]]:
    """(offset, value) of the partition's records up to its end as `isolation` sees it."""
    reader = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": f"{topic}-{isolation}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    got: list[tuple[int, bytes]] = []
    try:
        end = reader.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]
        reader.assign([TopicPartition(topic, partition, 0)])
        deadline = time.monotonic() + wait_s
        while reader.position([TopicPartition(topic, partition)])[0].offset < end:
            assert time.monotonic() < deadline, (isolation, partition, end, got)
            message = reader.poll(0.2)
            if message is not None:
                assert message.error() is None, message.error()
                got.append((message.offset(), message.value()))
    finally:
        reader.close()
    return got


def ends(port: int, topic: str, partitions: int, isolation: str) -> list[int]:
    """Each partition's end as `isolation` sees it (read_committed: its last stable offset)."""
    reader = Consumer(
        {"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "e", "isolation.level": isolation}
    )
    try:
        return [
            reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)
        ]
    finally:
        reader.close()


def settled(port: int, topic: str, partitions: int, wait_s: float) -> None:
    """Until every transaction is complete: the last stable offsets reach the high watermarks."""
    deadline = time.monotonic() + wait_s
    while (committed := ends(port, topic, partitions, "read_committed")) != (
        uncommitted := ends(port, topic, partitions, "read_uncommitted")
    ):
        assert time.monotonic() < deadline, (committed, uncommitted)
        time.sleep(0.1)
