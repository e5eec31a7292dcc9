"""A zombie producer: a transactional producer (a child process) SIGSTOPped in the middle of a
transaction, past its transaction timeout. The coordinator aborts the transaction (the last
stable offset passes its records), a new instance with the same transactional.id takes over and
commits, and the zombie, resumed, is fenced: its commit fails and none of its records ever
becomes visible to a read_committed consumer."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from daemon_support import DaemonProcess, clean_environ, free_port

TOPIC = "zombie"
TID = "zombie-tx"
WAIT_S = 60.0
ZOMBIE = Path(__file__).with_name("txn_zombie.py")


def consumer(port: int, isolation: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": f"zombie-reader-{isolation}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )


def read_all(port: int, isolation: str, end: int) -> list[bytes]:
    """Partition 0's values up to offset `end` as a consumer of `isolation` reads them."""
    reader = consumer(port, isolation)
    values: list[bytes] = []
    try:
        reader.assign([TopicPartition(TOPIC, 0, 0)])
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            message = reader.poll(0.2)
            if message is None:
                (position,) = reader.position([TopicPartition(TOPIC, 0)])
                if position.offset >= end:
                    break
                continue
            assert message.error() is None, message.error()
            values.append(message.value())
    finally:
        reader.close()
    return values


def stable_end(port: int) -> tuple[int, int]:
    """(last stable offset, high watermark) of partition 0."""
    committed = consumer(port, "read_committed")
    uncommitted = consumer(port, "read_uncommitted")
    try:
        tp = TopicPartition(TOPIC, 0)
        return committed.get_watermark_offsets(tp, timeout=10)[1], uncommitted.get_watermark_offsets(
            tp, timeout=10
        )[1]
    finally:
        committed.close()
        uncommitted.close()


def test_a_zombie_producer_stopped_past_its_timeout_is_fenced_and_never_visible(tmp_path: Path) -> None:
    kafka_port = free_port()
    daemon = DaemonProcess(
        tmp_path / "data", tmp_path, env={"LEVELZERO_KAFKA_LISTEN": f"127.0.0.1:{kafka_port}"}
    )
    zombie: subprocess.Popen[bytes] | None = None
    try:
        daemon.start()
        with daemon.http() as http:
            assert http.post("/v1/topics", json={"name": TOPIC, "partitions": 1}).status_code == 201
        zombie = subprocess.Popen(
            [sys.executable, str(ZOMBIE), str(kafka_port), TOPIC, TID],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=clean_environ(),
        )
        assert zombie.stdin is not None and zombie.stdout is not None
        assert zombie.stdout.readline() == b"produced\n"
        zombie.send_signal(signal.SIGSTOP)
        # While the transaction is open its records hold the last stable offset at 0.
        lso, hwm = stable_end(kafka_port)
        assert (lso, hwm) == (0, 5)
        # Past the timeout the coordinator aborts it: an abort marker, the LSO at the end.
        deadline = time.monotonic() + WAIT_S
        while stable_end(kafka_port) != (6, 6):
            assert time.monotonic() < deadline, f"not aborted: {stable_end(kafka_port)}"
            time.sleep(0.2)
        successor = Producer({"bootstrap.servers": f"127.0.0.1:{kafka_port}", "transactional.id": TID})
        successor.init_transactions(30)
        successor.begin_transaction()
        successor.produce(TOPIC, value=b"successor", partition=0)
        successor.commit_transaction(30)
        zombie.send_signal(signal.SIGCONT)
        zombie.stdin.write(b"go\n")
        zombie.stdin.flush()
        outcome = zombie.stdout.readline().decode().split()
        assert zombie.wait(timeout=WAIT_S) == 0
        assert outcome[0] == "error", outcome  # never "committed"
        assert outcome[1] in ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "_FENCED"), outcome
        # The successor may have committed after the zombie's late record (had it been taken):
        # every record to the end, read_committed, is the successor's. Its commit was answered
        # before its marker was written (as Kafka answers): the LSO reaches the end once it is.
        deadline = time.monotonic() + WAIT_S
        lso, hwm = stable_end(kafka_port)
        while lso != hwm:
            assert time.monotonic() < deadline, f"the successor's marker not written: {(lso, hwm)}"
            time.sleep(0.1)
            lso, hwm = stable_end(kafka_port)
        assert read_all(kafka_port, "read_committed", hwm) == [b"successor"]
        everything = read_all(kafka_port, "read_uncommitted", hwm)
        assert everything[:5] == [b"zombie-%d" % i for i in range(5)]  # stored, then aborted
        assert b"zombie-late" not in everything  # refused: its epoch was fenced
    finally:
        if zombie is not None and zombie.poll() is None:
            zombie.send_signal(signal.SIGCONT)
            zombie.kill()
            zombie.wait()
        daemon.cleanup()
