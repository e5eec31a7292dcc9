"""AddPartitionsToTxn is answered before its commit (the state with the new partitions, their
ranges opened) is durable; the transaction's records in those partitions wait for that commit
before they are submitted, so no record of a transaction is stored before the transaction knows
its partition and the partition's range holds the last stable offset.

Proved with confluent-kafka: while the commit is held, the producer's records reach the daemon
(so AddPartitionsToTxn was answered) and nothing is stored; once it is durable they are, and the
transaction commits whole. A commit that fails fences the producer and stores none of its
records. A daemon SIGKILLed between the answer and the commit stores none of the records, and
the next incarnation's transaction is read whole.

A partition the producer's previous transaction still holds (prepared, its marker queued ahead)
is the exception: the next transaction's records there are stored before the commit. If that
commit fails they are aborted; SIGKILLed before it, the restart finds them after the marker and
aborts them; either way read_committed never returns them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from confluent_kafka import KafkaException, Producer

import kafka_txn_reads
from daemon_support import DaemonProcess, daemon_and_client, free_port
from levelzero.core.errors import StorageError

TOPIC = "registration"
RECORDS = 4
WAIT_S = 30.0


def value(n: int, i: int) -> bytes:
    return b"t%d-%d" % (n, i)


def transactional(port: int, tid: str, n: int, timeout_s: float = WAIT_S) -> Producer:
    """A new incarnation of `tid` with transaction `n` begun: RECORDS records in partition 0
    produced (not yet flushed)."""
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "transactional.id": tid, "linger.ms": 5})
    producer.init_transactions(timeout_s)
    producer.begin_transaction()
    for i in range(RECORDS):
        producer.produce(TOPIC, value=value(n, i), partition=0)
    return producer


def transaction(port: int, tid: str, n: int, timeout_s: float = WAIT_S) -> None:
    """One committed transaction of RECORDS records in partition 0 (a new incarnation of `tid`)."""
    transactional(port, tid, n, timeout_s).commit_transaction(timeout_s)


def started(tmp_path: Path, held: dict[str, str]) -> tuple[DaemonProcess, int]:
    """A daemon process with a Kafka listener and TOPIC (one partition), the `held` switches
    in its environment; and its Kafka port."""
    kafka_port = free_port()
    env = {"LEVELZERO_KAFKA_LISTEN": f"127.0.0.1:{kafka_port}", **held}
    daemon = DaemonProcess(tmp_path / "data", tmp_path, env=env)
    try:
        daemon.start()
        with daemon.http() as http:
            created = http.post("/v1/topics", json={"name": TOPIC, "partitions": 1})
            assert created.status_code == 201, created.text
    except BaseException:
        daemon.cleanup()
        raise
    return daemon, kafka_port


def restarted(daemon: DaemonProcess, held: dict[str, str], **env: str) -> None:
    """The daemon SIGKILLed and started again without the `held` switches, with `env`."""
    daemon.proc.kill()
    daemon.proc.wait()
    for name in held:
        daemon.env.pop(name)
    daemon.env.update(env)
    daemon.start()


def read(port: int, isolation: str) -> list[tuple[int, bytes]]:
    return kafka_txn_reads.read(port, TOPIC, isolation, 0, WAIT_S)


def end(port: int, isolation: str) -> int:
    return kafka_txn_reads.ends(port, TOPIC, 1, isolation)[0]


def settled(port: int) -> None:
    kafka_txn_reads.settled(port, TOPIC, 1, WAIT_S)


@contextlib.asynccontextmanager
async def in_process(tmp_path: Path) -> AsyncIterator[Any]:
    """A daemon in this process with a Kafka listener and TOPIC (one partition)."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0", batcher__linger_ms=5.0) as (
        daemon,
        client,
    ):
        await client.create_topic(TOPIC, 1)
        yield daemon


def holding_registrations(
    monkeypatch: pytest.MonkeyPatch, coordinator: Any
) -> tuple[anyio.Event, anyio.Event]:
    """Commits that open ranges (AddPartitionsToTxn's) wait for the first event; the second is
    set once a transactional produce waits for one."""
    release, waiting = anyio.Event(), anyio.Event()
    put, registered = coordinator.store.put_transaction, coordinator.registered

    async def held(row: Any, opened: Any = (), closed: Any = ()) -> None:
        if opened:
            await release.wait()
        await put(row, opened, closed)

    async def noting(producer_id: int, topic: str, partition: int) -> None:
        waiting.set()
        await registered(producer_id, topic, partition)

    monkeypatch.setattr(coordinator.store, "put_transaction", held)
    monkeypatch.setattr(coordinator, "registered", noting)
    return release, waiting


async def test_records_wait_for_the_answered_add_partitions_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with in_process(tmp_path) as daemon:
        port = daemon.kafka_port
        release, waiting = holding_registrations(monkeypatch, daemon.kafka.handlers.transactions)
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, transaction, port, "held-tx", 0)
            with anyio.fail_after(WAIT_S):
                await waiting.wait()  # its records arrived: AddPartitionsToTxn was answered
            await anyio.sleep(0.2)  # (a record set submitted now would be stored by then)
            assert daemon.node.partition(TOPIC, 0).state.high_watermark == 0
            assert await daemon.node.log_store.txn_ranges(TOPIC, 0) == []  # not durable yet
            release.set()
        await anyio.to_thread.run_sync(settled, port)
        assert await anyio.to_thread.run_sync(read, port, "read_committed") == [
            (i, value(0, i)) for i in range(RECORDS)
        ]
        assert await anyio.to_thread.run_sync(end, port, "read_uncommitted") == RECORDS + 1  # the marker


async def test_a_failed_add_partitions_commit_fences_the_producer_and_stores_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with in_process(tmp_path) as daemon:
        port = daemon.kafka_port
        coordinator = daemon.kafka.handlers.transactions
        put = coordinator.store.put_transaction
        failures = []

        async def failing(row: Any, opened: Any = (), closed: Any = ()) -> None:
            if opened and not failures:
                failures.append(row.transactional_id)
                raise StorageError("simulated: AddPartitionsToTxn's commit failed")
            await put(row, opened, closed)

        monkeypatch.setattr(coordinator.store, "put_transaction", failing)
        with pytest.raises(KafkaException):
            await anyio.to_thread.run_sync(transaction, port, "failing-tx", 0, 10.0)
        assert failures == ["failing-tx"]
        assert daemon.node.partition(TOPIC, 0).state.high_watermark == 0  # none of its records
        await anyio.to_thread.run_sync(transaction, port, "failing-tx", 1)  # the next incarnation
        await anyio.to_thread.run_sync(settled, port)
        stored = await anyio.to_thread.run_sync(read, port, "read_uncommitted")
        assert [v for _, v in stored] == [value(1, i) for i in range(RECORDS)]
        assert await anyio.to_thread.run_sync(read, port, "read_committed") == stored


def test_sigkill_between_add_partitions_answer_and_its_commit(tmp_path: Path) -> None:
    held = {"LEVELZERO_TEST_HOLD_TXN_REGISTRATION": "1"}
    daemon, kafka_port = started(tmp_path, held)
    try:
        producer = transactional(kafka_port, "kill-tx", 0)
        assert producer.flush(3) == RECORDS  # answered AddPartitionsToTxn; records held
        assert end(kafka_port, "read_uncommitted") == 0

        restarted(daemon, held)
        transaction(kafka_port, "kill-tx", 1)  # fences the first incarnation
        settled(kafka_port)
        stored = read(kafka_port, "read_uncommitted")
        assert [v for _, v in stored] == [value(1, i) for i in range(RECORDS)]
        assert read(kafka_port, "read_committed") == stored
        assert end(kafka_port, "read_committed") == end(kafka_port, "read_uncommitted") == RECORDS + 1
    finally:
        daemon.cleanup()


def begin_next(producer: Producer, n: int) -> None:
    """The producer's next transaction: begun, RECORDS records produced and acknowledged."""
    producer.begin_transaction()
    for i in range(RECORDS):
        producer.produce(TOPIC, value=value(n, i), partition=0)
    assert producer.flush(WAIT_S) == 0


async def test_a_failed_commit_of_a_held_partition_aborts_the_records_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The previous transaction still prepared (its completion held), the next one's records
    in its partition are stored before AddPartitionsToTxn's commit; that commit fails: the
    producer is fenced and the records stored are aborted, never read committed."""
    async with in_process(tmp_path) as daemon:
        port = daemon.kafka_port
        coordinator = daemon.kafka.handlers.transactions
        monkeypatch.setattr(coordinator, "hold_completion", True)
        put = coordinator.store.put_transaction
        failures = []

        async def failing(row: Any, opened: Any = (), closed: Any = ()) -> None:
            if row.state == "ongoing" and row.prepared and not failures:
                failures.append(row.transactional_id)
                with anyio.fail_after(WAIT_S):  # fails once the records it held are stored
                    while daemon.node.partition(TOPIC, 0).state.high_watermark < 2 * RECORDS + 1:
                        await anyio.sleep(0.01)
                raise StorageError("simulated: AddPartitionsToTxn's commit failed")
            await put(row, opened, closed)

        monkeypatch.setattr(coordinator.store, "put_transaction", failing)

        def first_two() -> None:
            producer = transactional(port, "held-tx", 0)
            producer.commit_transaction(WAIT_S)
            begin_next(producer, 1)  # stored, although their registration failed
            with pytest.raises(KafkaException):
                producer.commit_transaction(10.0)

        await anyio.to_thread.run_sync(first_two)
        assert failures == ["held-tx"]
        assert daemon.node.partition(TOPIC, 0).state.high_watermark == 2 * RECORDS + 1
        monkeypatch.setattr(coordinator, "hold_completion", False)
        await anyio.to_thread.run_sync(transaction, port, "held-tx", 2)  # the next incarnation
        await anyio.to_thread.run_sync(settled, port)
        stored = [v for _, v in await anyio.to_thread.run_sync(read, port, "read_uncommitted")]
        assert stored == [value(n, i) for n in range(3) for i in range(RECORDS)]
        committed = [v for _, v in await anyio.to_thread.run_sync(read, port, "read_committed")]
        assert committed == [value(n, i) for n in (0, 2) for i in range(RECORDS)]


# The previous transaction's completion held, and the next one's registration where its records
# do not wait for it
HELD_NEXT = {"LEVELZERO_TEST_HOLD_TXN_HELD_REGISTRATION": "1", "LEVELZERO_TEST_HOLD_TXN_COMPLETION": "1"}


def next_transaction_held(tmp_path: Path, tid: str) -> tuple[DaemonProcess, int, Producer]:
    """A daemon started with HELD_NEXT, its Kafka port, and `tid`'s producer: transaction 0
    committed (its completion held), transaction 1's records acknowledged (stored, their
    registration held)."""
    daemon, kafka_port = started(tmp_path, HELD_NEXT)
    try:
        producer = transactional(kafka_port, tid, 0)
        producer.commit_transaction(WAIT_S)
        begin_next(producer, 1)
    except BaseException:
        daemon.cleanup()
        raise
    return daemon, kafka_port, producer


def test_sigkill_after_held_records_before_their_registration(tmp_path: Path) -> None:
    """The next transaction's records in a partition the previous one holds are stored (and
    acknowledged) before AddPartitionsToTxn's commit, which never happens: SIGKILLed then, the
    restart finds them after the previous transaction's marker, takes their transaction up
    from the data and aborts it; the previous transaction is committed whole."""
    daemon, kafka_port, _ = next_transaction_held(tmp_path, "kill-tx")
    try:
        assert end(kafka_port, "read_uncommitted") == 2 * RECORDS + 1
        assert end(kafka_port, "read_committed") == 0  # the first one's completion is held

        restarted(daemon, HELD_NEXT)
        transaction(kafka_port, "kill-tx", 2)  # fences the first incarnation
        settled(kafka_port)
        stored = [v for _, v in read(kafka_port, "read_uncommitted")]
        assert stored == [value(n, i) for n in range(3) for i in range(RECORDS)]
        committed = [v for _, v in read(kafka_port, "read_committed")]
        assert committed == [value(n, i) for n in (0, 2) for i in range(RECORDS)]
    finally:
        daemon.cleanup()


def test_the_next_transactions_end_after_a_restart_is_fenced_not_taken_for_the_previous_ones(
    tmp_path: Path,
) -> None:
    """As above, and the same producer, still running, then commits its next transaction: the
    restarted coordinator still holds the previous one prepared (no pass has completed it
    yet, `LEVELZERO_TEST_HOLD_TXN_EXPIRY`), and EndTxn is not a retry of that one's ending:
    completing it finds the next one's records after its marker, never registered, and the
    commit is refused (the producer fenced), never answered as done while its records are then
    aborted (single-node simulation seed 33361)."""
    daemon, kafka_port, producer = next_transaction_held(tmp_path, "retry-tx")
    try:
        restarted(daemon, HELD_NEXT, LEVELZERO_TEST_HOLD_TXN_EXPIRY="1")
        with pytest.raises(KafkaException) as refused:
            producer.commit_transaction(WAIT_S)
        assert "fenced" in str(refused.value).lower(), refused.value
        transaction(kafka_port, "retry-tx", 2)  # the next incarnation aborts the fenced one
        settled(kafka_port)
        committed = [v for _, v in read(kafka_port, "read_committed")]
        assert committed == [value(n, i) for n in (0, 2) for i in range(RECORDS)]
    finally:
        daemon.cleanup()
