"""A producer's next transaction begins before the previous one's markers are stored (as Kafka's
coordinator allows once it has sent them): AddPartitionsToTxn is answered once the previous
transaction's markers are queued in the partitions' lanes, and stores the next transaction's
state (ONGOING) with the prepared one beside it; the prepared one completes in one commit that
closes its ranges at its markers and opens the next one's just after them.

Proved with real clients running back-to-back transactions (confluent-kafka, aiokafka; some
aborted): some transactions began beside a prepared one; read_committed consumers read exactly
the committed transactions' records; the last stable offset, sampled while they run, never
moves back and never stops inside a transaction's records. And with a daemon SIGKILLed while a
transaction is prepared (its marker stored, its completion not: held) beside the next one, whose
records follow the marker: the restart finds the stored marker (writing no second one, which
would land after the next transaction's records and take them into the committed range),
completes the first transaction and aborts the second at its timeout; read_committed reads the
first whole and none of the second."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from confluent_kafka import Producer

import kafka_txn_reads
from daemon_support import DaemonProcess, daemon_and_client, free_port

TOPIC = "pipelined"
PARTITIONS = 2
RECORDS = 4  # per partition per transaction
WAIT_S = 60.0
SAMPLES_MAX = 100_000


def value(n: int, partition: int, i: int) -> bytes:
    return b"t%d-p%d-%d" % (n, partition, i)


def aborted(n: int) -> bool:
    return n % 3 == 2


def confluent_transactions(port: int, count: int) -> None:
    producer = Producer(
        {"bootstrap.servers": f"127.0.0.1:{port}", "transactional.id": "pipe-tx", "linger.ms": 5}
    )
    producer.init_transactions(30)
    for n in range(count):
        producer.begin_transaction()
        for p in range(PARTITIONS):
            for i in range(RECORDS):
                producer.produce(TOPIC, value=value(n, p, i), partition=p)
        if aborted(n):
            assert producer.flush(30) == 0
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)


def read(port: int, isolation: str, partition: int) -> list[tuple[int, bytes]]:
    return kafka_txn_reads.read(port, TOPIC, isolation, partition, WAIT_S)


def ends(port: int, isolation: str) -> list[int]:
    return kafka_txn_reads.ends(port, TOPIC, PARTITIONS, isolation)


def settled(port: int) -> None:
    kafka_txn_reads.settled(port, TOPIC, PARTITIONS, WAIT_S)


def check_reads(port: int, count: int, samples: dict[int, list[int]] | None = None) -> None:
    """read_committed reads exactly the committed transactions' records, in order; every
    last stable offset sampled is not below the one before and not inside a transaction's
    records."""
    for p in range(PARTITIONS):
        stored = read(port, "read_uncommitted", p)
        assert [v for _, v in stored] == [value(n, p, i) for n in range(count) for i in range(RECORDS)]
        committed = read(port, "read_committed", p)
        assert [v for _, v in committed] == [
            value(n, p, i) for n in range(count) if not aborted(n) for i in range(RECORDS)
        ]
        if samples is None:
            continue
        spans = [(stored[n * RECORDS][0], stored[n * RECORDS + RECORDS - 1][0]) for n in range(count)]
        assert samples[p] == sorted(samples[p]), "the last stable offset moved back"
        for lso in set(samples[p]):
            inside = [(first, last) for first, last in spans if first < lso <= last]
            assert not inside, f"partition {p}: the last stable offset {lso} inside a transaction {inside}"


def recording_rows(monkeypatch: pytest.MonkeyPatch, store: Any) -> list[str]:
    """The states stored with a prepared transaction beside them."""
    beside: list[str] = []
    put = store.put_transaction

    async def recording(row: Any, opened: Any = (), closed: Any = ()) -> None:
        if row.prepared:
            beside.append(row.state)
        await put(row, opened, closed)

    monkeypatch.setattr(store, "put_transaction", recording)
    return beside


async def test_confluent_back_to_back_transactions_begin_beside_the_prepared_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = 24
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0", batcher__linger_ms=5.0) as (
        daemon,
        client,
    ):
        await client.create_topic(TOPIC, PARTITIONS)
        coordinator = daemon.kafka.handlers.transactions
        beside = recording_rows(monkeypatch, coordinator.store)
        samples: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        done = anyio.Event()

        async def sample() -> None:
            for _ in range(SAMPLES_MAX):
                if done.is_set():
                    return
                for p in range(PARTITIONS):
                    txns = coordinator.index.known(TOPIC, p)
                    if txns is not None:
                        high_watermark = daemon.node.partition(TOPIC, p).state.high_watermark
                        samples[p].append(txns.last_stable_offset(high_watermark))
                await anyio.sleep(0.001)

        async with anyio.create_task_group() as tg:
            tg.start_soon(sample)
            await anyio.to_thread.run_sync(confluent_transactions, daemon.kafka_port, count)
            await anyio.to_thread.run_sync(settled, daemon.kafka_port)
            done.set()
        # The next transaction began (AddPartitionsToTxn stored) beside a prepared one.
        assert "ongoing" in beside, beside
        assert all(len(s) > 10 for s in samples.values()), {p: len(s) for p, s in samples.items()}
        await anyio.to_thread.run_sync(check_reads, daemon.kafka_port, count, samples)
        # Every range closed: the aborted ones listed, none open.
        for p in range(PARTITIONS):
            ranges = await daemon.node.log_store.txn_ranges(TOPIC, p)
            assert len(ranges) == sum(aborted(n) for n in range(count))
            assert all(r.aborted for r in ranges)


async def test_aiokafka_back_to_back_transactions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from aiokafka import AIOKafkaProducer

    count = 15
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0", batcher__linger_ms=5.0) as (
        daemon,
        client,
    ):
        await client.create_topic(TOPIC, PARTITIONS)
        beside = recording_rows(monkeypatch, daemon.kafka.handlers.transactions.store)
        producer = AIOKafkaProducer(
            bootstrap_servers=f"127.0.0.1:{daemon.kafka_port}", transactional_id="aio-pipe"
        )
        await producer.start()
        try:
            for n in range(count):
                await producer.begin_transaction()
                sent = [
                    await producer.send(TOPIC, value(n, p, i), partition=p)
                    for p in range(PARTITIONS)
                    for i in range(RECORDS)
                ]
                for future in sent:
                    await future
                if aborted(n):
                    await producer.abort_transaction()
                else:
                    await producer.commit_transaction()
        finally:
            await producer.stop()
        assert "ongoing" in beside, beside
        await anyio.to_thread.run_sync(settled, daemon.kafka_port)
        await anyio.to_thread.run_sync(check_reads, daemon.kafka_port, count)


def test_sigkill_with_a_prepared_transaction_beside_the_next_one(tmp_path: Path) -> None:
    kafka_port = free_port()
    env = {"LEVELZERO_KAFKA_LISTEN": f"127.0.0.1:{kafka_port}"}
    daemon = DaemonProcess(
        tmp_path / "data", tmp_path, env={**env, "LEVELZERO_TEST_HOLD_TXN_COMPLETION": "1"}
    )
    try:
        daemon.start()
        with daemon.http() as http:
            created = http.post("/v1/topics", json={"name": TOPIC, "partitions": PARTITIONS})
            assert created.status_code == 201, created.text
        txn = Producer(
            {
                "bootstrap.servers": f"127.0.0.1:{kafka_port}",
                "transactional.id": "crash-tx",
                "transaction.timeout.ms": 5000,
            }
        )
        txn.init_transactions(30)
        txn.begin_transaction()
        for p in range(PARTITIONS):
            for i in range(RECORDS):
                txn.produce(TOPIC, value=value(0, p, i), partition=p)
        txn.commit_transaction(30)  # answered once prepared; its completion is held
        txn.begin_transaction()  # begins beside it: its records follow the markers
        for p in range(PARTITIONS):
            for i in range(RECORDS):
                txn.produce(TOPIC, value=value(1, p, i), partition=p)
        assert txn.flush(30) == 0
        # Stored: the first transaction's records (0-3), its marker (4), the second's (5-8);
        # nothing read_committed: the first one's range is open until its completion.
        assert ends(kafka_port, "read_uncommitted") == [9, 9]
        assert ends(kafka_port, "read_committed") == [0, 0]

        daemon.proc.kill()  # the second transaction ongoing, the first prepared beside it
        daemon.proc.wait()
        daemon.env.pop("LEVELZERO_TEST_HOLD_TXN_COMPLETION")
        daemon.start()
        # The restart completes the first (its marker found, none written again) and aborts the
        # second at its timeout (its abort marker at offset 9).
        deadline = time.monotonic() + WAIT_S
        while ends(kafka_port, "read_committed") != [10, 10]:
            assert time.monotonic() < deadline, ends(kafka_port, "read_committed")
            time.sleep(0.2)
        assert ends(kafka_port, "read_uncommitted") == [10, 10]
        for p in range(PARTITIONS):
            committed = read(kafka_port, "read_committed", p)
            assert committed == [(i, value(0, p, i)) for i in range(RECORDS)]
            stored = read(kafka_port, "read_uncommitted", p)
            assert [o for o, _ in stored] == [0, 1, 2, 3, 5, 6, 7, 8]
    finally:
        daemon.cleanup()
