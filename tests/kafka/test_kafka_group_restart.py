"""A consumer group outlives a SIGKILL of the daemon, as a Kafka group outlives a coordinator's
restart: the coordinator stores each group's members when a rebalance completes and restores
them at start-up, so an exactly-once application (a consumer and a transactional producer, as
Quix Streams runs them) commits its next transaction with the member id and generation it had,
without rejoining."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from daemon_support import DaemonProcess, free_port

RECORDS = 3


def test_a_transaction_commits_the_offsets_of_a_group_member_after_the_daemon_is_killed(
    tmp_path: Path,
) -> None:
    kafka_port = free_port()
    bootstrap = f"127.0.0.1:{kafka_port}"
    process = DaemonProcess(tmp_path / "data", tmp_path, env={"LEVELZERO_KAFKA_LISTEN": bootstrap})
    process.start()
    consumer = None
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics([NewTopic("in", 1, 1), NewTopic("out", 1, 1)]).values():
            future.result(30)
        plain = Producer({"bootstrap.servers": bootstrap})
        for i in range(RECORDS):
            plain.produce("in", value=b"%d" % i, partition=0)
        assert plain.flush(30) == 0

        assignments: list[list[int]] = []
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "eos",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                "session.timeout.ms": 30_000,
                "reconnect.backoff.max.ms": 500,
            }
        )
        consumer.subscribe(
            ["in"], on_assign=lambda _, parts: assignments.append([p.partition for p in parts])
        )
        got = []
        deadline = time.monotonic() + 60
        while len(got) < RECORDS and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                got.append(message.value())
        assert got == [b"%d" % i for i in range(RECORDS)]
        member = consumer.memberid()
        producer = Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": "eos-tx", "reconnect.backoff.max.ms": 500}
        )
        producer.init_transactions(30)

        process.signal(signal.SIGKILL)
        process.wait_exit()
        process.start()

        producer.begin_transaction()
        producer.produce("out", value=b"processed", partition=0)
        try:
            producer.send_offsets_to_transaction(
                [TopicPartition("in", 0, RECORDS)], consumer.consumer_group_metadata(), 30
            )
        except KafkaException as exc:
            raise AssertionError(f"the restarted coordinator forgot the member: {exc}") from None
        producer.commit_transaction(30)
        for _ in range(10):  # heartbeats go on: the member was never asked to rejoin
            consumer.poll(0.3)
        assert consumer.memberid() == member
        assert assignments == [[0]]
        (committed,) = consumer.committed([TopicPartition("in", 0)], 30)
        assert committed.offset == RECORDS
        consumer.close()
        consumer = None
    finally:
        if consumer is not None:
            consumer.close()
        process.cleanup()
