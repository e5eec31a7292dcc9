"""EndTxn is answered once the transaction's PREPARE_COMMIT is durable, before its markers are
written (as Kafka's coordinator answers). A daemon that never writes markers
(`LEVELZERO_TEST_HOLD_TXN_MARKERS=1`) answers confluent-kafka's commit, and while the markers are
pending a read_committed consumer sees none of the transaction in either partition (the last
stable offset stays at its open range; records produced after it wait too), though the records
are stored (read_uncommitted sees them). The daemon is SIGKILLed after the answer, before any
marker; restarted (without the hold), it completes the prepared transaction: the markers are
written and the transaction becomes visible whole."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from daemon_support import DaemonProcess, free_port

TOPIC = "pending"
PARTITIONS = 2
WAIT_S = 60.0


def consumer(port: int, isolation: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": f"pending-reader-{isolation}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )


def ends(port: int, isolation: str) -> list[int]:
    """Each partition's end as a consumer of `isolation` sees it: the last stable offset
    (read_committed) or the high watermark."""
    reader = consumer(port, isolation)
    try:
        return [
            reader.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1] for p in range(PARTITIONS)
        ]
    finally:
        reader.close()


def read_all(port: int, isolation: str) -> dict[int, list[bytes]]:
    """Every partition's values up to its end for `isolation`, as a consumer of it reads them."""
    stop = ends(port, isolation)
    reader = consumer(port, isolation)
    values: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    try:
        reader.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            positions = reader.position([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
            if all(tp.offset >= end for tp, end in zip(positions, stop, strict=True)):
                break
            message = reader.poll(0.2)
            if message is not None:
                assert message.error() is None, message.error()
                values[message.partition()].append(message.value())
    finally:
        reader.close()
    return values


def test_endtxn_answered_before_markers_then_sigkill_restart_makes_it_visible_whole(tmp_path: Path) -> None:
    kafka_port = free_port()
    env = {"LEVELZERO_KAFKA_LISTEN": f"127.0.0.1:{kafka_port}"}
    daemon = DaemonProcess(tmp_path / "data", tmp_path, env={**env, "LEVELZERO_TEST_HOLD_TXN_MARKERS": "1"})
    try:
        daemon.start()
        with daemon.http() as http:
            created = http.post("/v1/topics", json={"name": TOPIC, "partitions": PARTITIONS})
            assert created.status_code == 201, created.text
        plain = Producer({"bootstrap.servers": f"127.0.0.1:{kafka_port}", "enable.idempotence": True})
        for p in range(PARTITIONS):
            plain.produce(TOPIC, value=b"before-%d" % p, partition=p)
        assert plain.flush(30) == 0

        txn = Producer({"bootstrap.servers": f"127.0.0.1:{kafka_port}", "transactional.id": "pending-tx"})
        txn.init_transactions(30)
        txn.begin_transaction()
        for p in range(PARTITIONS):
            for i in range(3):
                txn.produce(TOPIC, value=b"txn-%d-%d" % (p, i), partition=p)
        txn.commit_transaction(20)  # answered: PREPARE_COMMIT is durable, no marker written
        for p in range(PARTITIONS):
            plain.produce(TOPIC, value=b"after-%d" % p, partition=p)
        assert plain.flush(30) == 0

        # Markers pending: the last stable offset stays at the transaction's range (offset 1,
        # after "before"), so neither its records nor those after it are read_committed.
        assert ends(kafka_port, "read_uncommitted") == [5, 5]
        assert ends(kafka_port, "read_committed") == [1, 1]
        assert read_all(kafka_port, "read_committed") == {p: [b"before-%d" % p] for p in range(PARTITIONS)}
        stored = read_all(kafka_port, "read_uncommitted")
        assert stored == {
            p: [b"before-%d" % p, *(b"txn-%d-%d" % (p, i) for i in range(3)), b"after-%d" % p]
            for p in range(PARTITIONS)
        }

        daemon.proc.kill()  # SIGKILL after EndTxn's answer, before any marker
        daemon.proc.wait()
        daemon.env.pop("LEVELZERO_TEST_HOLD_TXN_MARKERS")
        daemon.start()
        # The restart completes the prepared transaction: a commit marker in each partition
        # (offset 5), then every record is read_committed, the transaction whole.
        deadline = time.monotonic() + WAIT_S
        while ends(kafka_port, "read_committed") != [6, 6]:
            assert time.monotonic() < deadline, f"not completed: {ends(kafka_port, 'read_committed')}"
            time.sleep(0.2)
        assert ends(kafka_port, "read_uncommitted") == [6, 6]
        assert read_all(kafka_port, "read_committed") == stored
    finally:
        daemon.cleanup()
