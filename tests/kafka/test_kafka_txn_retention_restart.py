"""A prepared transaction left by a SIGKILL, and DeleteRecords past its range's first offset
before the restart completes it.

- DeleteRecords is held at the first offset of a transaction open in the partition (as retention
  is): the restart finds the transaction's records and its marker where they were written, and
  completes it exactly (a commit reads whole; an abort's records, and those of the producer's
  next transaction behind its marker, are never read_committed).
- With the start offset moved past the range anyway (`LEVELZERO_TEST_UNHELD_START_OFFSET`, as a
  store written before the hold may have it), the restart reads the partition from its log
  start offset for a marker that may be stored: reading from the range's first offset is
  refused (outside the readable range), which held the last stable offset and InitProducerId
  of the transactional id for ever.
  - Markers never written (`LEVELZERO_TEST_HOLD_TXN_MARKERS`): none is found, and no record of a
    next transaction can be there, so the marker is written; the last stable offset reaches
    the high watermark and the id's InitProducerId succeeds.
  - Markers written, the completion not stored (`LEVELZERO_TEST_HOLD_TXN_COMPLETION`), the next
    transaction's records behind the abort marker, the start past the marker: a marker written
    now would take the next transaction's records into the aborted range. The range is closed
    below the start offset without one, and the next transaction (which could hold records of
    the aborted one) is fenced and aborted: read_committed returns none of its records."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from daemon_support import DaemonProcess, free_port

TOPIC = "retained"
WAIT_S = 60.0
# The transaction timeout of `aborted_beside_next`'s producer: its next transaction, ongoing
# when the daemon is killed and its producer gone, is aborted by the restarted coordinator
# when it times out (as Kafka's coordinator does after a failover), not before.
NEXT_TIMEOUT_S = 30.0


def ends(port: int) -> tuple[int, int]:
    """(last stable offset, high watermark) of partition 0."""
    found = []
    for isolation in ("read_committed", "read_uncommitted"):
        reader = Consumer(
            {"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "ends", "isolation.level": isolation}
        )
        try:
            found.append(reader.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10)[1])
        finally:
            reader.close()
    return found[0], found[1]


def read_committed(port: int) -> list[bytes]:
    stop, _ = ends(port)
    reader = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": "reader",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    values = []
    try:
        reader.assign([TopicPartition(TOPIC, 0, 0)])  # below the start: reset to it
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            (position,) = reader.position([TopicPartition(TOPIC, 0)])
            if position.offset >= stop:
                break
            message = reader.poll(0.2)
            if message is not None:
                assert message.error() is None, message.error()
                values.append(message.value())
    finally:
        reader.close()
    return values


def delete_below(port: int, offset: int) -> int:
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    (future,) = admin.delete_records([TopicPartition(TOPIC, 0, offset)]).values()
    return int(future.result(30).low_watermark)


def stable(port: int, *, after_s: float = 0.0) -> tuple[int, int]:
    """Waits until the last stable offset reaches the high watermark (for up to WAIT_S once
    `after_s` have passed: a transaction's timeout); both."""
    deadline = time.monotonic() + after_s + WAIT_S
    while (found := ends(port))[0] != found[1]:
        assert time.monotonic() < deadline, f"the last stable offset stays below: {found}"
        time.sleep(0.2)
    return found


UNHELD = "LEVELZERO_TEST_UNHELD_START_OFFSET"


def start(tmp_path: Path, hold: str, *, unheld: bool = False) -> tuple[DaemonProcess, int]:
    port = free_port()
    env = {"LEVELZERO_KAFKA_LISTEN": f"127.0.0.1:{port}", hold: "1"}
    if unheld:
        env[UNHELD] = "1"
    daemon = DaemonProcess(tmp_path / "data", tmp_path, env=env)
    daemon.start()
    with daemon.http() as http:
        created = http.post("/v1/topics", json={"name": TOPIC, "partitions": 1})
        assert created.status_code == 201, created.text
    return daemon, port


def restart_without(daemon: DaemonProcess, hold: str) -> None:
    daemon.proc.kill()  # SIGKILL: the transaction stays prepared in the store
    daemon.proc.wait()
    daemon.env.pop(hold)
    daemon.start()


def init_succeeds(port: int, tid: str) -> None:
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "transactional.id": tid})
    producer.init_transactions(30)  # raises if InitProducerId keeps failing
    producer.begin_transaction()
    producer.produce(TOPIC, value=b"later", partition=0)
    producer.commit_transaction(30)


def prepared_commit(port: int) -> None:
    """b"before" at 0, a transaction of three records at 1-3 committed (its markers held)."""
    plain = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "enable.idempotence": True})
    plain.produce(TOPIC, value=b"before", partition=0)
    assert plain.flush(30) == 0
    txn = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "transactional.id": "kept"})
    txn.init_transactions(30)
    txn.begin_transaction()
    for i in range(3):
        txn.produce(TOPIC, value=b"txn-%d" % i, partition=0)
    txn.commit_transaction(30)  # PREPARE_COMMIT durable; no marker written
    assert ends(port) == (1, 4)  # the range (offset 1 on) holds the last stable offset


def aborted_beside_next(port: int) -> Producer:
    """A transaction of two records at 0-1 aborted (its marker at 2, its completion held), the
    producer's next transaction's two records at 3-4 behind it; the producer."""
    txn = Producer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "transactional.id": "next",
            "transaction.timeout.ms": int(NEXT_TIMEOUT_S * 1000),
        }
    )
    txn.init_transactions(30)
    txn.begin_transaction()
    for i in range(2):
        txn.produce(TOPIC, value=b"aborted-%d" % i, partition=0)
    assert txn.flush(30) == 0
    txn.abort_transaction(30)  # abort marker at 2, the completion never stored
    txn.begin_transaction()
    for i in range(2):
        txn.produce(TOPIC, value=b"next-%d" % i, partition=0)
    assert txn.flush(30) == 0  # at 3 and 4, behind the abort marker
    assert ends(port) == (0, 5)
    return txn


def test_delete_records_is_held_at_a_prepared_commits_first_offset_and_the_restart_commits_it_whole(
    tmp_path: Path,
) -> None:
    hold = "LEVELZERO_TEST_HOLD_TXN_MARKERS"
    daemon, port = start(tmp_path, hold)
    try:
        prepared_commit(port)
        assert delete_below(port, 3) == 1  # held at the open range's first offset
        assert delete_below(port, -1) == 1  # the high watermark too
        assert ends(port) == (1, 4)

        restart_without(daemon, hold)
        # The marker is written at 4: the transaction completes whole.
        assert stable(port) == (5, 5)
        assert read_committed(port) == [b"txn-0", b"txn-1", b"txn-2"]
        assert delete_below(port, 3) == 3  # complete: nothing holds the start offset
        init_succeeds(port, "kept")
        assert read_committed(port) == [b"txn-2", b"later"]
    finally:
        daemon.cleanup()


def test_delete_records_is_held_at_a_prepared_aborts_first_offset_and_the_restart_aborts_it(
    tmp_path: Path,
) -> None:
    hold = "LEVELZERO_TEST_HOLD_TXN_COMPLETION"
    daemon, port = start(tmp_path, hold)
    try:
        aborted_beside_next(port)
        # The aborted range stays open until its completion is stored: its marker is kept.
        assert delete_below(port, 3) == 0

        restart_without(daemon, hold)
        # The restart finds the abort marker at 2 (none written again) and completes the abort;
        # the next transaction, its producer gone, is aborted when it times out (its marker at
        # 5): read_committed reads none of either.
        assert stable(port, after_s=NEXT_TIMEOUT_S) == (6, 6)
        assert read_committed(port) == []
        init_succeeds(port, "next")
        assert read_committed(port) == [b"later"]
    finally:
        daemon.cleanup()


def test_prepared_transaction_whose_first_offset_retention_removed_completes_after_restart(
    tmp_path: Path,
) -> None:
    hold = "LEVELZERO_TEST_HOLD_TXN_MARKERS"
    daemon, port = start(tmp_path, hold, unheld=True)
    try:
        prepared_commit(port)
        assert delete_below(port, 3) == 3  # past the range's first offset

        restart_without(daemon, hold)
        # The marker is written at 4: the transaction completes, nothing holds the LSO.
        assert stable(port) == (5, 5)
        assert read_committed(port) == [b"txn-2"]
        init_succeeds(port, "kept")
        assert read_committed(port) == [b"txn-2", b"later"]
    finally:
        daemon.cleanup()


def test_an_aborted_prepared_transaction_whose_marker_retention_removed_fences_the_next(
    tmp_path: Path,
) -> None:
    hold = "LEVELZERO_TEST_HOLD_TXN_COMPLETION"
    daemon, port = start(tmp_path, hold, unheld=True)
    try:
        txn = aborted_beside_next(port)
        assert delete_below(port, 3) == 3  # the abort marker gone, the next one's records kept

        restart_without(daemon, hold)
        # The aborted range closes at 2 without a marker; the next transaction is fenced and
        # aborted (its abort marker at 5), so its records are never read_committed.
        assert stable(port) == (6, 6)
        assert read_committed(port) == []
        with pytest.raises(KafkaException):  # fenced: the producer must abort or re-init
            txn.commit_transaction(30)
        init_succeeds(port, "next")
        assert read_committed(port) == [b"later"]
    finally:
        daemon.cleanup()
