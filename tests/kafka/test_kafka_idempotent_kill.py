"""An idempotent producer (librdkafka) keeps producing while the daemon is SIGKILLed and
restarted on the same data directory and port: every record is stored exactly once, in order.
The retried batches are recognised by producer id and sequence, which the daemon keeps in the
log store before acknowledging (so they survive the kill)."""

from __future__ import annotations

import base64
import datetime
import signal
import threading
import time
from pathlib import Path

from confluent_kafka import Producer
from kio.schema.errors import ErrorCode

from levelzero.core.errors import StorageError
from levelzero.storage.sqlite.store import SqliteLogStore

from daemon_support import DaemonProcess, daemon_and_client, free_port, postgres_control
from test_kafka_listener import Wire, list_offsets, produce
from test_kafka_records import client_batch

MS = datetime.timedelta(milliseconds=1)
RECORDS = 3_000
TOPIC = "exactly-once"
PARTITIONS = 2


def produce_through_a_kill(process: DaemonProcess, kafka_port: int) -> list[str]:
    errors: list[str] = []
    producer = Producer(
        {
            "bootstrap.servers": f"127.0.0.1:{kafka_port}",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 120_000,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
        }
    )

    def on_delivery(err, message) -> None:
        if err is not None:
            errors.append(str(err))

    killed = threading.Event()
    for i in range(RECORDS):
        producer.produce(TOPIC, value=b"%06d" % i, partition=i % PARTITIONS, on_delivery=on_delivery)
        producer.poll(0)
        if i == RECORDS // 2:
            producer.flush(0.02)  # some batches are on their way, some acknowledged
            process.signal(signal.SIGKILL)
            process.wait_exit()
            killed.set()
            process.start()
        if i % 200 == 0:
            time.sleep(0.01)  # spread the records over many requests
    assert producer.flush(120) == 0
    assert killed.is_set()
    return errors


def test_an_idempotent_producer_through_a_sigkill_stores_each_record_once(tmp_path: Path) -> None:
    kafka_port = free_port()
    process = DaemonProcess(
        tmp_path / "data", tmp_path, env={"LEVELZERO_KAFKA_LISTEN": f"127.0.0.1:{kafka_port}"}
    )
    try:
        process.start()
        with process.http() as http:
            assert http.post("/v1/topics", json={"name": TOPIC, "partitions": PARTITIONS}).status_code == 201
        errors = produce_through_a_kill(process, kafka_port)
        assert errors == []
        with process.http() as http:
            for partition in range(PARTITIONS):
                values: list[bytes] = []
                offset = 0
                for _ in range(1_000):
                    body = http.get(
                        f"/v1/topics/{TOPIC}/partitions/{partition}/records", params={"offset": offset}
                    ).json()
                    values += [r["value"] for r in body["records"]]
                    offset = body["next_offset"]
                    if offset >= body["high_watermark"]:
                        break

                got = [base64.b64decode(v) for v in values]
                assert got == [b"%06d" % i for i in range(partition, RECORDS, PARTITIONS)]
    finally:
        process.cleanup()


async def test_a_batch_stored_before_a_sigkill_is_recognised_after_it(tmp_path: Path) -> None:
    await stored_before_a_sigkill_then_retried(tmp_path, {})


async def test_with_postgresql_a_batch_stored_before_a_sigkill_is_recognised_after_it(
    tmp_path: Path, postgres_dsn: str
) -> None:
    await stored_before_a_sigkill_then_retried(tmp_path, postgres_control(postgres_dsn))


async def stored_before_a_sigkill_then_retried(tmp_path: Path, control_env: dict[str, str]) -> None:
    """The window the client cannot see: a batch stored, then the daemon killed before the
    producer read its answer. Retried against the restarted daemon (same producer id and
    sequence), it gets the offset it was stored at and is not stored again — with either
    control plane keeping the sequences."""

    kafka_port = free_port()
    env = {"LEVELZERO_KAFKA_LISTEN": f"127.0.0.1:{kafka_port}", **control_env}
    process = DaemonProcess(tmp_path / "data", tmp_path, env=env)
    try:
        process.start()
        with process.http() as http:
            assert http.post("/v1/topics", json={"name": TOPIC, "partitions": 1}).status_code == 201
        wire = await Wire.connect(kafka_port)
        try:
            init = await wire.request(
                22,
                4,
                transactional_id=None,
                transaction_timeout=60_000 * MS,
                producer_id=-1,
                producer_epoch=-1,
            )
            pid = init.producer_id
            first = client_batch([(0, b"k", b"a", []), (0, b"k", b"b", [])], producer_id=pid, base_sequence=0)
            second = client_batch([(0, b"k", b"c", [])], producer_id=pid, base_sequence=2)
            offsets = [
                (await produce(wire, TOPIC, 0, b)).responses[0].partition_responses[0].base_offset
                for b in (first, second)
            ]
            assert offsets == [0, 2]
        finally:
            await wire.aclose()
        process.signal(signal.SIGKILL)
        process.wait_exit()
        process.start()
        wire = await Wire.connect(kafka_port)
        try:
            answers = [
                (await produce(wire, TOPIC, 0, b)).responses[0].partition_responses[0]
                for b in (first, second)
            ]
            assert [(a.error_code, a.base_offset) for a in answers] == [
                (ErrorCode.none, 0),
                (ErrorCode.none, 2),
            ]
            assert (await list_offsets(wire, TOPIC, 0, -1)).offset == 3  # nothing stored twice
            third = client_batch([(0, b"k", b"d", [])], producer_id=pid, base_sequence=3)
            assert (await produce(wire, TOPIC, 0, third)).responses[0].partition_responses[0].base_offset == 3
        finally:
            await wire.aclose()
    finally:
        process.cleanup()


async def test_a_batch_whose_sequence_row_was_lost_is_recognised_from_its_placeholder(
    tmp_path: Path, monkeypatch
) -> None:
    """The window between the data commit and the sequence table's: the batch is stored (its
    placeholder durable, with its producer span) and acknowledged, but its row never written,
    as a SIGKILL after the acknowledgement and before the table's write would leave it. The
    producer's retry against a new daemon is recognised from the producer span the placeholder
    carries, and not stored again."""

    async def lost(self, rows, keep):
        raise StorageError("simulated crash before the sequence commit")

    pid = 4242
    first = client_batch([(0, b"k", b"a", []), (0, b"k", b"b", [])], producer_id=pid, base_sequence=0)
    second = client_batch([(0, b"k", b"c", [])], producer_id=pid, base_sequence=2)
    with monkeypatch.context() as patch:
        patch.setattr(SqliteLogStore, "record_producer_batches", lost)
        async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
            await client.create_topic(TOPIC, 1)
            await client.produce(TOPIC, 0, [b"before"])  # offset 0: not a producer's
            wire = await Wire.connect(daemon.kafka_port)
            try:
                answers = [
                    (await produce(wire, TOPIC, 0, b)).responses[0].partition_responses[0]
                    for b in (first, second)
                ]
                # Acknowledged once the records (and their spans) are durable: the table's
                # row is written after, and its loss fails nothing.
                assert [(a.error_code, a.base_offset) for a in answers] == [
                    (ErrorCode.none, 1),
                    (ErrorCode.none, 3),
                ]
            finally:
                await wire.aclose()
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        wire = await Wire.connect(daemon.kafka_port)
        try:
            answers = [
                (await produce(wire, TOPIC, 0, b)).responses[0].partition_responses[0]
                for b in (first, second)
            ]
            assert [(a.error_code, a.base_offset) for a in answers] == [
                (ErrorCode.none, 1),
                (ErrorCode.none, 3),
            ]
            assert (await list_offsets(wire, TOPIC, 0, -1)).offset == 4  # nothing stored twice
        finally:
            await wire.aclose()
        fetched = await client.fetch(TOPIC, 0, 0)
        assert [r.value for r in fetched.records] == [b"before", b"a", b"b", b"c"]
