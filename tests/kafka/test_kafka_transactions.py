"""Kafka transactions against the listener with real clients: confluent-kafka (librdkafka)
commits and aborts transactions, commits a consumer group's offsets inside one
(`send_offsets_to_transaction`), and a read_committed consumer sees the committed records only,
never the aborted ones (a read_uncommitted one sees both); a zombie producer (an older
incarnation of the same transactional.id) is fenced and cannot commit; aiokafka's transactions
commit and abort alike. The state survives a restart of the daemon (SQLite)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from levelzero.storage.protocols import TransactionStore

from daemon_support import daemon_and_client

TOPIC = "txn"
KAFKA = {"kafka__listen": "127.0.0.1:0"}
POLLS_MAX = 40


def producer(port: int, tid: str):
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "transactional.id": tid,
            "transaction.timeout.ms": 60_000,
            "linger.ms": 5,
        }
    )


def consume(port: int, isolation: str, count_max: int, start: int = 0) -> list[bytes]:
    """Values of partition 0 from offset `start`, as a consumer of `isolation` reads them (until
    `count_max` records or a few empty polls)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": f"reader-{isolation}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    got: list[bytes] = []
    empty = 0
    try:
        consumer.assign([TopicPartition(TOPIC, 0, start)])
        for _ in range(POLLS_MAX):
            message = consumer.poll(0.5)
            if message is None:
                empty += 1
                if empty >= 4 and got:
                    break
                continue
            assert message.error() is None, message.error()
            got.append(message.value())
            if len(got) >= count_max:
                break
    finally:
        consumer.close()
    return got


def transactional_session(port: int) -> None:
    from confluent_kafka import TopicPartition

    p = producer(port, "tx-1")
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(3):
        p.produce(TOPIC, value=b"committed-%d" % i, partition=0)
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(2):
        p.produce(TOPIC, value=b"aborted-%d" % i, partition=0)
    p.flush(30)
    p.abort_transaction(30)
    p.begin_transaction()
    p.produce(TOPIC, value=b"committed-3", partition=0)
    metadata = _group_metadata(port, "eos-group")
    p.send_offsets_to_transaction([TopicPartition(TOPIC, 0, 42)], metadata, 30)
    p.commit_transaction(30)


async def wait_markers_written(store: TransactionStore, topic: str, partition: int) -> None:
    """EndTxn is answered before the markers are stored: until the partition has no open range."""
    for _ in range(POLLS_MAX * 5):
        if all(r.last_offset >= 0 for r in await store.txn_ranges(topic, partition)):
            return
        await anyio.sleep(0.1)
    raise AssertionError(f"a marker of {topic}/{partition} is still not written")


def _group_metadata(port: int, group: str):
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": group})
    try:
        return consumer.consumer_group_metadata()
    finally:
        consumer.close()


def committed_offset(port: int, group: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": group})
    try:
        (tp,) = consumer.committed([TopicPartition(TOPIC, 0)], timeout=30)
        return int(tp.offset)
    finally:
        consumer.close()


def zombie_is_fenced(port: int) -> str:
    """An older incarnation cannot commit once a newer one initialised: its error's name."""
    from confluent_kafka import KafkaException

    zombie = producer(port, "tx-z")
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(TOPIC, value=b"zombie", partition=0)
    zombie.flush(30)
    successor = producer(port, "tx-z")
    successor.init_transactions(30)  # bumps the epoch: the zombie's transaction is aborted
    try:
        zombie.produce(TOPIC, value=b"zombie-2", partition=0)
        zombie.commit_transaction(30)
    except KafkaException as exc:
        error = exc.args[0]
        assert error.fatal() or error.txn_requires_abort(), error
        name = error.name()
    else:
        raise AssertionError("the zombie committed")
    successor.begin_transaction()
    successor.produce(TOPIC, value=b"successor", partition=0)
    successor.commit_transaction(30)
    return name


async def test_confluent_kafka_transactions_read_committed_and_fencing(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, **KAFKA) as (daemon, client):
        await client.create_topic(TOPIC, 1)
        port = daemon.kafka_port
        await anyio.to_thread.run_sync(transactional_session, port)
        committed = await anyio.to_thread.run_sync(consume, port, "read_committed", 10)
        assert committed == [b"committed-0", b"committed-1", b"committed-2", b"committed-3"]
        everything = await anyio.to_thread.run_sync(consume, port, "read_uncommitted", 10)
        assert everything == [
            b"committed-0",
            b"committed-1",
            b"committed-2",
            b"aborted-0",
            b"aborted-1",
            b"committed-3",
        ]
        assert await anyio.to_thread.run_sync(committed_offset, port, "eos-group") == 42
        fenced = await anyio.to_thread.run_sync(zombie_is_fenced, port)
        assert fenced in ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "_FENCED"), fenced
        after = await anyio.to_thread.run_sync(consume, port, "read_committed", 10)
        assert after == [*committed, b"successor"]  # no zombie record is ever visible
    async with daemon_and_client(tmp_path, **KAFKA) as (daemon, client):  # from the store
        again = await anyio.to_thread.run_sync(consume, daemon.kafka_port, "read_committed", 10)
        assert again == [*committed, b"successor"]


async def test_aiokafka_transactions(tmp_path: Path) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    async with daemon_and_client(tmp_path, **KAFKA) as (daemon, client):
        await client.create_topic(TOPIC, 1)
        bootstrap = f"127.0.0.1:{daemon.kafka_port}"
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="aio-tx")
        await producer.start()
        try:
            async with producer.transaction():
                await producer.send_and_wait(TOPIC, b"kept", partition=0)
            await producer.begin_transaction()
            await producer.send_and_wait(TOPIC, b"dropped", partition=0)
            await producer.abort_transaction()
            async with producer.transaction():
                await producer.send_and_wait(TOPIC, b"kept-too", partition=0)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False
        )
        await consumer.start()
        try:
            tp = TopicPartition(TOPIC, 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            got: list[bytes] = []
            with anyio.fail_after(30):
                while len(got) < 2:
                    batch = await consumer.getmany(tp, timeout_ms=500)
                    got.extend(m.value for m in batch.get(tp, []))
            assert got == [b"kept", b"kept-too"]
        finally:
            await consumer.stop()


def transactions_with_headers(port: int) -> None:
    p = producer(port, "tx-h")
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(TOPIC, value=b"kept", partition=0, headers=[("h", b"1")])
    p.commit_transaction(30)
    p.begin_transaction()
    p.produce(TOPIC, value=b"dropped", partition=0)
    p.flush(30)
    p.abort_transaction(30)


async def test_http_and_export_readers_never_see_markers_or_the_reserved_header(tmp_path: Path) -> None:
    """As Kafka delivers no control record to a consumer: HTTP GET records, the Spark data
    source's reads and `export --records` leave the commit and abort markers out (their offsets
    are gaps) and give a transaction's records with the headers the client wrote. Like a Kafka
    consumer's default (read_uncommitted) they include the aborted record. A client cannot
    produce the reserved header over HTTP."""
    import pyarrow.parquet as pq

    from levelzero.core.txn_marks import TXN_HEADER
    from levelzero.export.records import export_records
    from levelzero.export.spark_source import plan, read_range

    from daemon_support import assert_error, raw

    path = f"/v1/topics/{TOPIC}/partitions/0/records"
    async with daemon_and_client(tmp_path, **KAFKA) as (daemon, client):
        await client.create_topic(TOPIC, 1)
        await client.produce(TOPIC, 0, [b"plain"])  # offset 0
        await anyio.to_thread.run_sync(transactions_with_headers, daemon.kafka_port)
        await wait_markers_written(daemon.node.log_store, TOPIC, 0)  # "after" goes behind them
        await client.produce(TOPIC, 0, [b"after"])
        body = (await raw(client, "GET", path, params={"offset": 0})).json()
        got = [(r["offset"], r["value"], r.get("headers")) for r in body["records"]]
        # 0 plain, 1 kept, 2 its commit marker, 3 dropped, 4 its abort marker, 5 after
        assert got == [
            (0, "cGxhaW4=", None),
            (1, "a2VwdA==", [["h", "MQ=="]]),
            (3, "ZHJvcHBlZA==", None),
            (5, "YWZ0ZXI=", None),
        ]
        assert body["next_offset"] == body["high_watermark"] == 6
        refused = await raw(
            client, "POST", path, json={"records": [{"value": "eA==", "headers": [[TXN_HEADER, "eA=="]]}]}
        )
        assert_error(refused, 400, "malformed_request", "reserved")
    expected = [(0, b"plain", []), (1, b"kept", [("h", b"1")]), (3, b"dropped", []), (5, b"after", [])]
    rows = [row for r in plan(str(tmp_path), TOPIC) for row in read_range(str(tmp_path), r)]
    assert [(offset, value, headers) for _, _, offset, _, _, value, headers in rows] == expected
    report = export_records(str(tmp_path), str(tmp_path / "out"), TOPIC)
    table = pq.read_table(report.path).to_pylist()
    assert [
        (r["offset"], r["value"], [(h["key"], h["value"]) for h in r["headers"]]) for r in table
    ] == expected


def aborts_then_commit(port: int) -> None:
    p = producer(port, "tx-prune")
    p.init_transactions(30)
    for name in (b"a", b"b"):
        p.begin_transaction()
        p.produce(TOPIC, value=name + b"-0", partition=0)
        p.produce(TOPIC, value=name + b"-1", partition=0)
        p.flush(30)
        p.abort_transaction(30)
    p.begin_transaction()
    p.produce(TOPIC, value=b"c", partition=0)
    p.commit_transaction(30)


async def test_aborted_ranges_below_the_log_start_offset_are_forgotten(tmp_path: Path) -> None:
    """Aborted ranges are kept while a fetch can reach them: once DeleteRecords moves the log
    start offset past a range's abort marker, the range leaves the store (and the index); the
    range above it stays, and read_committed still skips its records."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    async with daemon_and_client(tmp_path, **KAFKA) as (daemon, client):
        await client.create_topic(TOPIC, 1)
        port = daemon.kafka_port
        store = daemon.node.log_store
        await anyio.to_thread.run_sync(aborts_then_commit, port)
        # a-0 a-1 abort(2) b-0 b-1 abort(5) c commit(7); EndTxn answers before the commit
        # marker is written: its range (6) is open until then
        for _ in range(POLLS_MAX * 5):
            ranges = [(r.first_offset, r.last_offset) for r in await store.txn_ranges(TOPIC, 0)]
            if ranges != [(0, 2), (3, 5), (6, -1)]:
                break
            await anyio.sleep(0.1)
        assert ranges == [(0, 2), (3, 5)]

        def delete_below(offset: int) -> int:
            admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
            (future,) = admin.delete_records([TopicPartition(TOPIC, 0, offset)]).values()
            return future.result(30).low_watermark

        assert await anyio.to_thread.run_sync(delete_below, 3) == 3
        for _ in range(POLLS_MAX * 5):  # the coordinator's pass, each second
            ranges = [(r.first_offset, r.last_offset) for r in await store.txn_ranges(TOPIC, 0)]
            if ranges == [(3, 5)]:
                break
            await anyio.sleep(0.1)
        assert ranges == [(3, 5)]
        committed = await anyio.to_thread.run_sync(consume, port, "read_committed", 10, 3)
        assert committed == [b"c"]
    async with daemon_and_client(tmp_path, **KAFKA) as (daemon, client):
        assert [
            (r.first_offset, r.last_offset) for r in await daemon.node.log_store.txn_ranges(TOPIC, 0)
        ] == [(3, 5)]
        again = await anyio.to_thread.run_sync(consume, daemon.kafka_port, "read_committed", 10, 3)
        assert again == [b"c"]


def last_stable_and_high(port: int) -> tuple[int, int]:
    """(last stable offset, high watermark) of partition 0."""
    from confluent_kafka import Consumer, TopicPartition

    ends = []
    for isolation in ("read_committed", "read_uncommitted"):
        consumer = Consumer(
            {"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "ends", "isolation.level": isolation}
        )
        try:
            ends.append(consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10, cached=False)[1])
        finally:
            consumer.close()
    return ends[0], ends[1]


def open_transaction(port: int, tid: str) -> tuple[int, int]:
    """An incarnation of `tid` leaves a transaction open (three records); (LSO, high watermark)."""
    stranded = producer(port, tid)
    stranded.init_transactions(30)
    stranded.begin_transaction()
    for i in range(3):
        stranded.produce(TOPIC, value=b"stranded-%d" % i, partition=0)
    assert stranded.flush(30) == 0
    return last_stable_and_high(port)


def successor_commits(port: int, tid: str) -> None:
    successor = producer(port, tid)
    successor.init_transactions(30)  # the open transaction is aborted
    successor.begin_transaction()
    successor.produce(TOPIC, value=b"successor", partition=0)
    successor.commit_transaction(30)


async def test_an_open_transaction_is_aborted_when_a_new_incarnation_exhausts_the_epoch(
    tmp_path: Path,
) -> None:
    """InitProducerId at the last epoch gives the transactional id a new producer id (KIP-360).
    The open transaction of the old incarnation is aborted under the producer id its records and
    open ranges carry (fenced at the last epoch), before the id changes: the LSO passes it."""
    from levelzero.kafka.transactions import EMPTY, EPOCH_MAX, TxnState

    async with daemon_and_client(tmp_path, **KAFKA) as (daemon, client):
        await client.create_topic(TOPIC, 1)
        port = daemon.kafka_port
        coordinator = daemon.kafka.handlers.transactions
        await coordinator._load()
        # The id has been initialised EPOCH_MAX - 2 times: the next incarnation gets the last
        # epoch a producer uses, the one after it a new producer id.
        old_id = coordinator.intake.new_producer_id()
        # (as the coordinator's load of a stored transaction registers it)
        coordinator._txns["tx-old"] = TxnState("tx-old", old_id, EPOCH_MAX - 2, EMPTY, 60_000)
        coordinator._producers[old_id] = coordinator._txns["tx-old"]
        coordinator._epochs[old_id] = EPOCH_MAX - 2
        lso, high = await anyio.to_thread.run_sync(open_transaction, port, "tx-old")
        assert (lso, high) == (0, 3)
        assert coordinator._txns["tx-old"].producer_epoch == EPOCH_MAX - 1
        await anyio.to_thread.run_sync(successor_commits, port, "tx-old")
        txn = coordinator._txns["tx-old"]
        assert txn.producer_id != old_id and txn.producer_epoch == 0  # a new producer id
        # abort marker (3), the successor's record (4), its commit marker (5): nothing open once
        # the successor's completion (written after its commit's answer, as Kafka does) is done
        for _ in range(200):
            if await anyio.to_thread.run_sync(last_stable_and_high, port) == (6, 6):
                break
            await anyio.sleep(0.05)
        assert await anyio.to_thread.run_sync(last_stable_and_high, port) == (6, 6)
        assert await store_ranges(daemon) == [(old_id, 0, 3, True)]  # aborted; the committed one is gone
        assert await anyio.to_thread.run_sync(consume, port, "read_committed", 10) == [b"successor"]


async def store_ranges(daemon: Any) -> list[tuple[int, int, int, bool]]:
    rows = await daemon.node.log_store.txn_ranges(TOPIC, 0)
    return [(r.producer_id, r.first_offset, r.last_offset, r.aborted) for r in rows]


async def test_one_transaction_failing_does_not_stop_the_expiry_pass_for_the_others(tmp_path: Path) -> None:
    """Two timed-out transactions: aborting the first fails (a partition not writable, here
    injected); the pass goes on, aborts the second, and does not raise."""
    from confluent_kafka import Producer

    from levelzero.core.errors import LevelZeroError

    async with daemon_and_client(tmp_path, **KAFKA) as (daemon, client):
        await client.create_topic(TOPIC, 1)
        port = daemon.kafka_port
        coordinator = daemon.kafka.handlers.transactions

        def begin(tid: str) -> Any:
            p = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "transactional.id": tid})
            p.init_transactions(30)
            p.begin_transaction()
            p.produce(TOPIC, value=tid.encode(), partition=0)
            assert p.flush(30) == 0
            return p

        producers = [await anyio.to_thread.run_sync(begin, tid) for tid in ("first", "second")]
        assert list(coordinator._txns) == ["first", "second"]
        end = coordinator._end

        async def failing_end(txn: Any, commit: bool, *, wait: bool = True) -> bool:
            if txn.transactional_id == "first":
                raise LevelZeroError("partition not writable")
            return await end(txn, commit, wait=wait)

        coordinator._end = failing_end
        for txn in coordinator._txns.values():
            txn.started_at = 0.0  # timed out
        await coordinator.expire()  # raised out at "first" before
        assert coordinator._txns["first"].state == "ongoing"
        assert coordinator._txns["second"].state in ("prepare_abort", "complete_abort")
        del producers
