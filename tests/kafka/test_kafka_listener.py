"""The Kafka listener at the wire: requests encoded with kio (Kafka's own schemas, not our
handlers' code) over a raw loopback socket — error codes, idempotent de-duplication, long polls,
and bad frames (oversized, truncated, unknown API keys and versions, random bytes), which close
their connection and never hurt the daemon."""

from __future__ import annotations

import datetime
import io
import logging
import random
import struct
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from confluent_kafka.admin import AdminClient
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from levelzero.config import ConfigError
from levelzero.kafka import records as kr
from levelzero.kafka.protocol import API_VERSIONS, make
from levelzero.kafka.server import FRAME_CHUNK_BYTES, Close

from daemon_support import daemon_and_client, daemon_config
from test_kafka_records import client_batch

MS = datetime.timedelta(milliseconds=1)


class Wire:
    """One connection: send kio requests, read kio responses (bounded reads)."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream
        self.buffer = b""
        self.correlation = 0

    @classmethod
    async def connect(cls, port: int) -> Wire:
        return cls(await anyio.connect_tcp("127.0.0.1", port))

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send(data)

    async def request(self, api_key: int, version: int, **fields: Any) -> Any:
        await self.send(api_key, version, **fields)
        return await self.response(api_key, version)

    async def send(self, api_key: int, version: int, **fields: Any) -> None:
        """The request, without waiting for an answer (a produce with acks=0 gets none)."""
        cls = load_request_schema(api_key, version)
        self.correlation += 1
        out = io.BytesIO()
        header_cls = cls.__header_schema__
        entity_writer(header_cls)(
            out,
            make(
                header_cls,
                request_api_key=api_key,
                request_api_version=version,
                correlation_id=self.correlation,
                client_id="wire-test",
            ),
        )
        entity_writer(cls)(out, make(cls, **fields))
        payload = out.getvalue()
        await self.stream.send(struct.pack(">i", len(payload)) + payload)

    async def response(self, api_key: int, version: int) -> Any:
        frame = await self.frame()
        assert frame is not None, "the listener closed the connection"
        cls = load_response_schema(api_key, version)
        header, used = entity_reader(cls.__header_schema__)(frame, 0)
        assert header.correlation_id == self.correlation
        body, _ = entity_reader(cls)(frame, used)
        return body

    async def frame(self) -> bytes | None:
        """The next response frame, or None once the listener has closed the connection."""
        with anyio.fail_after(30):
            while True:
                if len(self.buffer) >= 4:
                    (size,) = struct.unpack_from(">i", self.buffer)
                    if len(self.buffer) >= 4 + size:
                        frame, self.buffer = self.buffer[4 : 4 + size], self.buffer[4 + size :]
                        return frame
                try:
                    self.buffer += await self.stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
                    return None

    async def aclose(self) -> None:
        await self.stream.aclose()


def module_of(api_key: int, version: int, kind: str = "request") -> Any:
    load = load_request_schema if kind == "request" else load_response_schema
    return sys.modules[load(api_key, version).__module__]


async def create_topic(wire: Wire, name: str, partitions: int) -> None:
    m = module_of(19, 7)
    topic = make(
        m.CreatableTopic,
        name=name,
        num_partitions=partitions,
        replication_factor=1,
        assignments=(),
        configs=(),
    )
    response = await wire.request(19, 7, topics=(topic,), timeout=1000 * MS, validate_only=False)
    assert response.topics[0].error_code == ErrorCode.none, response


async def produce(wire: Wire, topic: str, partition: int, records: bytes, acks: int = -1) -> Any:
    m = module_of(0, 9)
    data = make(
        m.TopicProduceData,
        name=topic,
        partition_data=(make(m.PartitionProduceData, index=partition, records=records),),
    )
    return await wire.request(0, 9, transactional_id=None, acks=acks, timeout=5000 * MS, topic_data=(data,))


async def fetch(
    wire: Wire,
    topic: str,
    partition: int,
    offset: int,
    *,
    max_wait_ms: int = 0,
    min_bytes: int = 1,
    partition_max_bytes: int = 1 << 20,
) -> Any:
    await send_fetch(
        wire,
        topic,
        partition,
        offset,
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        partition_max_bytes=partition_max_bytes,
    )
    return await wire.response(1, 12)


async def send_fetch(
    wire: Wire,
    topic: str,
    partition: int = 0,
    offset: int = 0,
    *,
    max_wait_ms: int = 0,
    min_bytes: int = 1,
    partition_max_bytes: int = 1 << 20,
    max_bytes: int = 1 << 24,
) -> None:
    """A Fetch v12 of one partition, sent without waiting for its answer."""
    m = module_of(1, 12)
    part = make(
        m.FetchPartition,
        partition=partition,
        current_leader_epoch=-1,
        fetch_offset=offset,
        last_fetched_epoch=-1,
        log_start_offset=-1,
        partition_max_bytes=partition_max_bytes,
    )
    await wire.send(
        1,
        12,
        replica_id=-1,
        max_wait=max_wait_ms * MS,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(make(m.FetchTopic, topic=topic, partitions=(part,)),),
        forgotten_topics_data=(),
        rack_id="",
    )


async def list_offsets(wire: Wire, topic: str, partition: int, timestamp: int) -> Any:
    m = module_of(2, 7)
    part = make(
        m.ListOffsetsPartition, partition_index=partition, current_leader_epoch=-1, timestamp=timestamp
    )
    response = await wire.request(
        2,
        7,
        replica_id=-1,
        isolation_level=0,
        topics=(make(m.ListOffsetsTopic, name=topic, partitions=(part,)),),
    )
    return response.topics[0].partitions[0]


def records_of(fetch_response: Any) -> list[tuple[int, bytes | None, bytes | None]]:
    data = fetch_response.responses[0].partitions[0].records or b""
    return [
        (b.base_offset + r.offset_delta, r.key, r.value)
        for b in kr.decode_batches(bytes(data))
        for r in b.records
    ]


# ------------------------------------------------------------------------------ tests


async def test_errors_map_to_kafka_codes(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        wire = await Wire.connect(daemon.kafka_port)
        try:
            await create_topic(wire, "errs", 2)
            m = module_of(19, 7)
            again = await wire.request(
                19,
                7,
                topics=(
                    make(
                        m.CreatableTopic,
                        name="errs",
                        num_partitions=1,
                        replication_factor=1,
                        assignments=(),
                        configs=(),
                    ),
                ),
                timeout=1000 * MS,
                validate_only=False,
            )
            assert again.topics[0].error_code == ErrorCode.topic_already_exists
            bad_name = await wire.request(
                19,
                7,
                topics=(
                    make(
                        m.CreatableTopic,
                        name="a/b",
                        num_partitions=1,
                        replication_factor=1,
                        assignments=(),
                        configs=(),
                    ),
                ),
                timeout=1000 * MS,
                validate_only=False,
            )
            assert bad_name.topics[0].error_code == ErrorCode.invalid_topic_exception

            batch = client_batch([(0, b"k", b"v", [])])
            unknown = await produce(wire, "nope", 0, batch)
            assert (
                unknown.responses[0].partition_responses[0].error_code == ErrorCode.unknown_topic_or_partition
            )
            unknown_partition = await produce(wire, "errs", 5, batch)
            assert (
                unknown_partition.responses[0].partition_responses[0].error_code
                == ErrorCode.unknown_topic_or_partition
            )
            corrupt = bytearray(batch)
            corrupt[-1] ^= 0xFF
            refused = await produce(wire, "errs", 0, bytes(corrupt))
            assert refused.responses[0].partition_responses[0].error_code == ErrorCode.corrupt_message
            assert (await list_offsets(wire, "errs", 0, -1)).offset == 0  # nothing was stored

            stored = await produce(wire, "errs", 0, batch)
            assert stored.responses[0].partition_responses[0].error_code == ErrorCode.none
            past = await fetch(wire, "errs", 0, 5)
            assert past.responses[0].partitions[0].error_code == ErrorCode.offset_out_of_range
            metadata = await wire.request(
                3,
                12,
                topics=(make(module_of(3, 12).MetadataRequestTopic, topic_id=None, name="nope"),),
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
            assert metadata.topics[0].error_code == ErrorCode.unknown_topic_or_partition
            assert (metadata.brokers[0].host, metadata.brokers[0].port) == ("127.0.0.1", daemon.kafka_port)
        finally:
            await wire.aclose()


async def test_a_retried_idempotent_batch_is_stored_once(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        first = await Wire.connect(daemon.kafka_port)
        retry = await Wire.connect(daemon.kafka_port)
        try:
            await create_topic(first, "idem", 1)
            init = await first.request(
                22,
                4,
                transactional_id=None,
                transaction_timeout=60_000 * MS,
                producer_id=-1,
                producer_epoch=-1,
            )
            assert init.error_code == ErrorCode.none and init.producer_id >= 0
            pid = init.producer_id
            batch0 = client_batch(
                [(0, b"a", b"1", []), (0, b"b", b"2", [])], producer_id=pid, base_sequence=0
            )
            batch1 = client_batch([(0, b"c", b"3", [])], producer_id=pid, base_sequence=2)
            answers = [
                await produce(first, "idem", 0, batch0),
                await produce(retry, "idem", 0, batch0),
                await produce(retry, "idem", 0, batch1),
                await produce(first, "idem", 0, batch1),
            ]
            offsets = [a.responses[0].partition_responses[0].base_offset for a in answers]
            assert offsets == [0, 0, 2, 2]
            assert (await list_offsets(first, "idem", 0, -1)).offset == 3
            fetched = await client.fetch("idem", 0, offset=0)
            assert [(r.key, r.value) for r in fetched.records] == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]
            # A producer that is not idempotent (-1) is not de-duplicated.
            plain = client_batch([(0, b"d", b"4", [])])
            assert [
                (await produce(first, "idem", 0, plain)).responses[0].partition_responses[0].base_offset
                for _ in range(2)
            ] == [3, 4]
        finally:
            await first.aclose()
            await retry.aclose()


async def test_an_idempotent_producers_zombie_epoch_is_fenced_and_a_new_epoch_starts_at_0(
    tmp_path: Path,
) -> None:
    """As Kafka's broker: once a producer id's epoch 1 is stored in a partition, its epoch 0 is
    INVALID_PRODUCER_EPOCH and epoch 2 must begin at sequence 0 (OUT_OF_ORDER_SEQUENCE_NUMBER
    otherwise); nothing refused is stored, and a restart (the producers rebuilt from the log)
    keeps the rule."""

    def batch(epoch: int, sequence: int, value: bytes) -> bytes:
        record = kr.KafkaRecord(0, 1_700_000_000_000, None, value)
        return kr.encode_batch(0, [record], producer_id=pid, producer_epoch=epoch, base_sequence=sequence)

    async def answer(wire: Wire, epoch: int, sequence: int, value: bytes) -> tuple[ErrorCode, int]:
        response = await produce(wire, "epochs", 0, batch(epoch, sequence, value))
        part = response.responses[0].partition_responses[0]
        return part.error_code, part.base_offset

    pid = 4242
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        wire = await Wire.connect(daemon.kafka_port)
        try:
            await create_topic(wire, "epochs", 1)
            assert await answer(wire, 1, 0, b"a") == (ErrorCode.none, 0)
            assert (await answer(wire, 0, 1, b"zombie"))[0] == ErrorCode.invalid_producer_epoch
            assert (await answer(wire, 2, 3, b"skips"))[0] == ErrorCode.out_of_order_sequence_number
            assert await answer(wire, 2, 0, b"b") == (ErrorCode.none, 1)
        finally:
            await wire.aclose()
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        wire = await Wire.connect(daemon.kafka_port)
        try:
            assert (await answer(wire, 1, 2, b"late zombie"))[0] == ErrorCode.invalid_producer_epoch
            assert await answer(wire, 2, 1, b"c") == (ErrorCode.none, 2)
            fetched = await client.fetch("epochs", 0, offset=0)
            assert [r.value for r in fetched.records] == [b"a", b"b", b"c"]
        finally:
            await wire.aclose()


def _patched(batch: bytes, offset: int, fmt: str, value: int) -> bytes:
    """`batch` with one header field changed (at byte `offset`, struct format `fmt`) and its CRC
    made right again, so only the field is wrong."""
    data = bytearray(batch)
    struct.pack_into(fmt, data, offset, value)
    struct.pack_into(">I", data, 17, kr.crc32c(bytes(data[kr.CRC_START :])))
    return bytes(data)


async def test_record_sets_kafka_refuses_from_a_client_are_invalid_records(tmp_path: Path) -> None:
    """As Kafka's broker (ProduceRequest.validateRecords, LogValidator.validateBatch): a
    partition's record set of no batch, of two batches, with a base offset other than 0, whose
    last offset delta disagrees with its record count, of a control batch, or of a producer id
    without a sequence is INVALID_RECORD, and nothing of it is stored (two batches were stored
    as one record set; a control batch from a client was dropped and the rest stored)."""
    one = kr.encode_batch(0, [kr.KafkaRecord(0, 1_700_000_000_000, b"k", b"v")])
    two = kr.encode_batch(0, [kr.KafkaRecord(i, 1_700_000_000_000, b"k", b"v") for i in range(2)])
    control = kr.encode_batch(
        0, [kr.KafkaRecord(0, 1_700_000_000_000, b"\x00\x00\x00\x01", b"")], attributes=kr.ATTR_CONTROL
    )
    refused = {
        "none": b"",
        "two batches": one + one,
        "base offset 5": _patched(one, 0, ">q", 5),
        "delta 0 for 2 records": _patched(two, 23, ">i", 0),
        "delta 3 for 2 records": _patched(two, 23, ">i", 3),
        "control": control,
        "control then data": control + one,
        "producer id, no sequence": kr.encode_batch(
            0, [kr.KafkaRecord(0, 1_700_000_000_000, b"k", b"v")], producer_id=7, producer_epoch=0
        ),
    }
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        wire = await Wire.connect(daemon.kafka_port)
        try:
            await create_topic(wire, "strict", 1)
            codes = {}
            for name, data in refused.items():
                response = await produce(wire, "strict", 0, data)
                codes[name] = response.responses[0].partition_responses[0].error_code
            assert codes == dict.fromkeys(refused, ErrorCode.invalid_record)
            assert (await list_offsets(wire, "strict", 0, -1)).offset == 0  # nothing stored
            stored = await produce(wire, "strict", 0, two)
            assert stored.responses[0].partition_responses[0].error_code == ErrorCode.none
            assert (await list_offsets(wire, "strict", 0, -1)).offset == 2
        finally:
            await wire.aclose()


async def test_a_fetch_of_small_records_stays_within_the_partitions_max_bytes(tmp_path: Path) -> None:
    """Kafka counts the batches a fetch returns against max_bytes (only the first may exceed
    it). Records of 10-byte values came back at about twice max_bytes, records of one byte
    with 60 bytes of headers at seven times (a record's key and value alone were counted); now
    the encoding's bytes count, so the answer holds within max_bytes and still fills most of it."""
    plain = [kr.KafkaRecord(i, 1_700_000_000_000 + i, None, b"%010d" % i) for i in range(400)]
    headers = (("trace-id", b"t" * 24), ("span-id", b"s" * 12), ("origin", b"o" * 4))
    headed = [kr.KafkaRecord(i, 1_700_000_000_000 + i, None, b"x", headers) for i in range(200)]
    max_bytes = 2_000
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        wire = await Wire.connect(daemon.kafka_port)
        try:
            await create_topic(wire, "small", 1)
            for records in (plain, headed):
                response = await produce(wire, "small", 0, kr.encode_batch(0, records))
                assert response.responses[0].partition_responses[0].error_code == ErrorCode.none
            sizes = {}
            for offset in (0, 150, 400, 500):
                answer = await fetch(wire, "small", 0, offset, partition_max_bytes=max_bytes)
                data = answer.responses[0].partitions[0].records
                batches = kr.decode_batches(data)
                assert batches[0].base_offset == offset
                sizes[offset] = (len(data), sum(len(b.records) for b in batches))
            assert all(max_bytes // 2 < size <= max_bytes for size, _ in sizes.values()), sizes
            assert all(count >= 10 for _, count in sizes.values()), sizes
        finally:
            await wire.aclose()


async def test_a_long_poll_returns_records_produced_while_it_waits(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        consumer = await Wire.connect(daemon.kafka_port)
        producer = await Wire.connect(daemon.kafka_port)
        try:
            await create_topic(producer, "poll", 1)
            empty = await fetch(consumer, "poll", 0, 0, max_wait_ms=0)
            assert records_of(empty) == [] and empty.responses[0].partitions[0].high_watermark == 0
            result: list[Any] = []
            async with anyio.create_task_group() as tg:

                async def long_poll() -> None:
                    result.append(await fetch(consumer, "poll", 0, 0, max_wait_ms=20_000))

                tg.start_soon(long_poll)
                await produce(producer, "poll", 0, client_batch([(0, b"k", b"woke", [])]))
            # Waiting 20 s would have failed the Wire's 30 s bound only after the produce; the
            # fetch answered with the record the produce stored, not with an empty set.
            assert records_of(result[0]) == [(0, b"k", b"woke")]
            assert result[0].responses[0].partitions[0].high_watermark == 1
        finally:
            await consumer.aclose()
            await producer.aclose()


async def test_api_versions_above_ours_get_unsupported_version_and_our_list(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        wire = await Wire.connect(daemon.kafka_port)
        try:
            # ApiVersions v9 (does not exist): the answer is v0-shaped with error 35.
            await wire.send_raw(struct.pack(">ihhi", 10, 18, 9, 77) + b"\xff\xff")
            frame = await wire.frame()
            assert frame is not None
            response, _ = entity_reader(load_response_schema(18, 0))(frame, 4)
            assert struct.unpack_from(">i", frame)[0] == 77
            assert response.error_code == ErrorCode.unsupported_version
            assert {k.api_key: (k.min_version, k.max_version) for k in response.api_keys} == {
                key: (low, high) for key, (_, low, high) in API_VERSIONS.items()
            }
        finally:
            await wire.aclose()


BAD_FRAMES = {
    "oversized": struct.pack(">i", 200 * 1024 * 1024),
    "negative size": struct.pack(">i", -5),
    "unknown api key": struct.pack(">ihhi", 8, 999, 0, 1),
    "unsupported version": struct.pack(">ihhi", 8, 0, 99, 1),
    "truncated metadata": struct.pack(">ihhih", 10, 3, 12, 1, 5) + b"\0",
    # A topics array longer than the frame (bytes after a whole request are ignored, as
    # Kafka does: tests/kafka/test_kafka_metadata_clients.py).
    "array longer than the frame": struct.pack(">ihhi", 14, 3, 1, 1) + b"\x00\x00" + b"\x7f\xff\xff\xff",
}


@pytest.mark.parametrize("name", sorted(BAD_FRAMES))
async def test_a_bad_frame_closes_its_connection_and_nothing_else(tmp_path: Path, name: str) -> None:
    async with daemon_and_client(
        tmp_path, kafka__listen="127.0.0.1:0", kafka__frame_bytes_max=1024 * 1024
    ) as (daemon, _):
        healthy = await Wire.connect(daemon.kafka_port)
        bad = await Wire.connect(daemon.kafka_port)
        try:
            await create_topic(healthy, "still", 1)
            await bad.send_raw(BAD_FRAMES[name])
            assert await bad.frame() is None  # closed, with no response
            assert (await list_offsets(healthy, "still", 0, -2)).error_code == ErrorCode.none
            assert daemon.kafka.stats.closed_bad_frames == 1
            assert daemon.kafka.stats.errors == 0
        finally:
            await healthy.aclose()
            await bad.aclose()


async def test_fuzzed_frames_never_crash_the_listener(tmp_path: Path) -> None:
    """Valid requests with random bytes changed or cut, sent on fresh connections: each gets
    a response or a closed connection; the listener never fails in an unexpected way."""
    rng = random.Random(21)
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        setup = await Wire.connect(daemon.kafka_port)
        await create_topic(setup, "fuzz", 2)
        await setup.aclose()
        seeds = [
            _encode_request(0, 9, _produce_fields("fuzz", client_batch([(0, b"k", b"v" * 40, [])]))),
            _encode_request(
                3,
                12,
                dict(topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False),
            ),
            _encode_request(18, 3, dict(client_software_name="x", client_software_version="1")),
        ]
        for _ in range(150):
            payload = bytearray(rng.choice(seeds))
            for _ in range(rng.randint(1, 6)):
                payload[rng.randrange(len(payload))] = rng.randrange(256)
            if rng.random() < 0.3:
                payload = payload[: rng.randrange(1, len(payload))]
            wire = await Wire.connect(daemon.kafka_port)
            try:
                await wire.send_raw(struct.pack(">i", len(payload)) + bytes(payload))
                await wire.send_raw(struct.pack(">i", 1) + b"\0")  # a frame too short: closes
                while await wire.frame() is not None:
                    pass
            finally:
                await wire.aclose()
        assert daemon.kafka.stats.errors == 0
        assert daemon.kafka.budget.used == 0  # every closed connection gave its bytes back
        check = await Wire.connect(daemon.kafka_port)
        try:
            assert (await list_offsets(check, "fuzz", 1, -1)).error_code == ErrorCode.none
        finally:
            await check.aclose()


def _produce_fields(topic: str, records: bytes) -> dict[str, Any]:
    m = module_of(0, 9)
    data = make(
        m.TopicProduceData,
        name=topic,
        partition_data=(make(m.PartitionProduceData, index=0, records=records),),
    )
    return dict(transactional_id=None, acks=-1, timeout=1000 * MS, topic_data=(data,))


def _encode_request(api_key: int, version: int, fields: dict[str, Any]) -> bytes:
    cls = load_request_schema(api_key, version)
    out = io.BytesIO()
    header_cls = cls.__header_schema__
    entity_writer(header_cls)(
        out,
        make(
            header_cls,
            request_api_key=api_key,
            request_api_version=version,
            correlation_id=1,
            client_id="fuzz",
        ),
    )
    entity_writer(cls)(out, make(cls, **fields))
    return out.getvalue()


async def test_announced_frames_hold_no_budget_and_block_nobody(tmp_path: Path) -> None:
    """Three connections that send only a length prefix announcing 99 MiB hold none of the
    request budget: before, each reserved its announced size, and with the default 256 MiB
    budget the third blocked every later request of every client (none could bootstrap)."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("open", partitions=1)
        stalled = [await Wire.connect(daemon.kafka_port) for _ in range(3)]
        try:
            for wire in stalled:
                await wire.send_raw(struct.pack(">i", 99 * 1024 * 1024))
            await anyio.sleep(0.2)  # let the listener read the prefixes (it must not wait on them)
            assert daemon.kafka.budget.used == 0
            topics = await anyio.to_thread.run_sync(librdkafka_topics, daemon.kafka_port)
            assert "open" in topics
        finally:
            for wire in stalled:
                await wire.aclose()


def librdkafka_topics(port: int) -> set[str]:
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    return set(admin.list_topics(timeout=20).topics)


async def test_request_bytes_are_bounded_as_they_arrive(tmp_path: Path) -> None:
    """Bytes of frames still arriving are held from the budget as they come; beyond
    inflight_bytes_max a reader waits instead of reading, a frame whose body stops coming is
    closed after frame_timeout_s, and every closed connection gives its bytes back."""
    mib = 1024 * 1024
    async with daemon_and_client(
        tmp_path,
        kafka__listen="127.0.0.1:0",
        kafka__frame_bytes_max=mib,
        kafka__inflight_bytes_max=2 * mib,
        kafka__frame_timeout_s=2.0,
    ) as (daemon, _):
        budget = daemon.kafka.budget
        stalled = [await Wire.connect(daemon.kafka_port) for _ in range(3)]
        for wire in stalled:  # 1 MiB announced, all but a byte sent: the body never completes
            await wire.send_raw(struct.pack(">i", mib) + b"\0" * (mib - 1))
        healthy = await Wire.connect(daemon.kafka_port)
        try:
            with anyio.fail_after(10):
                while not budget._waiters:  # two readers hold what came; the third waits
                    await anyio.sleep(0.01)
            assert 2 * mib - 2 * FRAME_CHUNK_BYTES < budget.used <= 2 * mib
            # The frame deadline closes them; the third then reads, and is closed in turn.
            for wire in stalled:
                assert await wire.frame() is None
            assert daemon.kafka.stats.closed_slow_frames == 3
        finally:
            for wire in stalled:
                await wire.aclose()
        assert budget.used == 0
        try:  # a small request passes once the budget is free again
            assert (
                await healthy.request(18, 3, client_software_name="t", client_software_version="1")
            ).error_code == ErrorCode.none
        finally:
            await healthy.aclose()


async def test_a_connection_that_never_speaks_is_closed(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0", kafka__header_timeout_s=0.5) as (
        daemon,
        _,
    ):
        silent = await Wire.connect(daemon.kafka_port)
        try:
            assert await silent.frame() is None
        finally:
            await silent.aclose()
        assert daemon.kafka.stats.closed_idle == 1


async def test_the_listener_is_off_unless_configured(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path) as (daemon, _):
        assert daemon.kafka_port is None and daemon.kafka is None
    with pytest.raises(ConfigError, match="server.token is required when kafka.listen"):
        daemon_config(tmp_path, kafka__listen="0.0.0.0:9092")
    with pytest.raises(ConfigError, match="frame_bytes_max"):
        daemon_config(tmp_path, kafka__listen="127.0.0.1:0", kafka__frame_bytes_max=10)


def lines_with(caplog: pytest.LogCaptureFixture, fragment: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if fragment in r.getMessage()]


def local_peer(wire: Wire) -> str:
    """The connection's address as the listener's log lines name its peer."""
    return f"127.0.0.1:{wire.stream.extra(anyio.abc.SocketAttribute.local_port)}"  # noqa: S610 - anyio's


async def test_closes_a_client_can_cause_are_logged_once_an_interval_each_naming_the_peer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """50 connections announcing a 2 GiB frame wrote 50 warning lines that named no one: now
    the first names its peer and the rest are held back (counted), and a close for another
    reason (silence, a malformed request) still gets its own line."""
    caplog.set_level(logging.INFO, "levelzero.kafka")
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0", kafka__header_timeout_s=0.5) as (
        daemon,
        _,
    ):
        peers = []
        for _ in range(50):
            wire = await Wire.connect(daemon.kafka_port)
            try:
                peers.append(local_peer(wire))
                await wire.send_raw(b"\x7f\xff\xff\xff")
                assert await wire.frame() is None
            finally:
                await wire.aclose()
        assert daemon.kafka.stats.closed_bad_frames == 50
        oversized = lines_with(caplog, "that sent a frame of 2147483647 bytes")
        assert 1 <= len(oversized) <= 2, oversized
        assert oversized[0] == (
            f"kafka: closing a connection from {peers[0]} that sent a frame of 2147483647 bytes"
            " (at most 104857600)"
        )
        silent = [await Wire.connect(daemon.kafka_port) for _ in range(3)]
        silent_peers = [local_peer(wire) for wire in silent]
        try:
            for wire in silent:
                assert await wire.frame() is None
        finally:
            for wire in silent:
                await wire.aclose()
        assert daemon.kafka.stats.closed_idle == 3
        idle = lines_with(caplog, "silent for")
        assert len(idle) == 1, idle
        assert idle[0] in [f"kafka: closing a connection from {peer} silent for 0 s" for peer in silent_peers]
        malformed = await Wire.connect(daemon.kafka_port)
        malformed_peer = local_peer(malformed)
        try:
            await malformed.send_raw(BAD_FRAMES["unknown api key"])
            assert await malformed.frame() is None
        finally:
            await malformed.aclose()
        assert lines_with(caplog, "kafka: closing a connection from ") == [
            *oversized,
            *idle,
            f"kafka: closing a connection from {malformed_peer}: api key 999 version 0 is not supported",
        ]


async def test_a_request_with_a_null_array_its_schema_does_not_allow_is_malformed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A Produce v3 whose body is 0xff bytes reads its topic array as null (length -1): the
    handler iterated it and the listener logged a server error with a traceback. Now it is a
    malformed request: a warning, and the connection closed."""
    caplog.set_level(logging.INFO, "levelzero.kafka")
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        wire = await Wire.connect(daemon.kafka_port)
        peer = local_peer(wire)
        try:
            header = struct.pack(">hhih", 0, 3, 1, 4) + b"test"  # Produce v3, client "test"
            await wire.send_raw(struct.pack(">i", len(header) + 50) + header + b"\xff" * 50)
            assert await wire.frame() is None  # closed, with no response
        finally:
            await wire.aclose()
        assert daemon.kafka.stats.closed_bad_frames == 1
        assert daemon.kafka.stats.errors == 0
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors == []
        assert [
            r.getMessage()
            for r in caplog.records
            if r.levelno == logging.WARNING and r.name == "levelzero.kafka"
        ] == [f"kafka: closing a connection from {peer}: api key 0 v3: malformed request: topic_data is null"]
        healthy = await Wire.connect(daemon.kafka_port)
        try:
            await create_topic(healthy, "still", 1)
            assert (await list_offsets(healthy, "still", 0, -2)).error_code == ErrorCode.none
        finally:
            await healthy.aclose()


PIPELINED = 600


async def test_requests_a_client_pipelines_are_read_while_earlier_ones_wait_for_their_window(
    tmp_path: Path,
) -> None:
    """A produce is answered a batch window and an upload after it is read: a connection read at
    most 128 requests ahead of its answers, so a client pipelining more (librdkafka without
    idempotence, a small linger.ms) was served 128 a window, the rest waiting in the socket
    while its latency grew without end (and its retries stored records twice). The requests
    sent during a window are read within it, and stored in the order sent."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0", batcher__linger_ms=3000.0) as (
        daemon,
        client,
    ):
        await client.create_topic("piped", 1)
        wire = await Wire.connect(daemon.kafka_port)
        try:
            stats = daemon.node.batcher.stats
            before = stats.objects_uploaded
            m = module_of(0, 9)
            for n in range(PIPELINED):
                records = client_batch([(0, None, b"%d" % n, [])])
                data = make(
                    m.TopicProduceData,
                    name="piped",
                    partition_data=(make(m.PartitionProduceData, index=0, records=records),),
                )
                await wire.send(0, 9, transactional_id=None, acks=-1, timeout=30_000 * MS, topic_data=(data,))
            offsets = []
            cls = load_response_schema(0, 9)
            for n in range(PIPELINED):
                frame = await wire.frame()
                assert frame is not None, "the listener closed the connection"
                header, used = entity_reader(cls.__header_schema__)(frame, 0)
                assert header.correlation_id == n + 1  # answered in the order sent
                response, _ = entity_reader(cls)(frame, used)
                (part,) = response.responses[0].partition_responses
                assert part.error_code == ErrorCode.none
                offsets.append(part.base_offset)
            assert offsets == list(range(PIPELINED))
            # A partition's lane stores its record sets in order, one upload at a time: the first
            # request's window, then one holding every request read meanwhile (128 at a time:
            # 600 took ten).
            assert stats.objects_uploaded - before <= 2
        finally:
            await wire.aclose()


def _metadata_v12(header_tags: bytes = b"\x00", topics: bytes = b"\x00", body_tags: bytes = b"\x00") -> bytes:
    """Metadata v12 by hand: the header (client id "x"), then topics, two booleans, tags."""
    return struct.pack(">hhih", 3, 12, 1, 1) + b"x" + header_tags + topics + b"\x00\x00" + body_tags


async def _answered(port: int, payload: bytes) -> bytes | None:
    """The answer to one request sent as `payload` on a new connection, None if closed."""
    wire = await Wire.connect(port)
    try:
        await wire.send_raw(struct.pack(">i", len(payload)) + payload)
        return await wire.frame()
    finally:
        await wire.aclose()


@pytest.mark.parametrize(
    "payload",
    [
        _metadata_v12(topics=b"\xff\xff\xff\xff\x0f"),  # 2**32 - 2 topics, in 14 bytes
        _metadata_v12(topics=b"\x80\x80\x80\x80\x10"),  # 2**32 - 1 topics
        struct.pack(">hhih", 3, 1, 1, 1) + b"x" + struct.pack(">i", 2**31 - 1),  # legacy, v1
        _metadata_v12(body_tags=b"\xff\xff\xff\xff\x0f"),  # as many tagged fields
        _metadata_v12(topics=b"\x02" + b"\x00" * 16 + b"\xff\xff\xff\xff\x0f"),  # a name that long
    ],
    ids=["compact-array", "compact-array-max", "legacy-array", "tag-count", "string"],
)
async def test_a_request_announcing_more_than_its_frame_holds_closes_only_its_connection(
    tmp_path: Path, payload: bytes
) -> None:
    """kio's native reader reserves an array's announced length before reading it: one request
    announcing 2**32 topics (14 bytes) made it ask for 32 GiB, and the failed allocation aborted
    the whole daemon (no exception to catch). Each announced length is checked against the bytes
    left first: the request is malformed, its connection closed, the daemon serves on."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        assert await _answered(daemon.kafka_port, payload) is None
        assert await _answered(daemon.kafka_port, _metadata_v12()) is not None
        assert daemon.kafka.stats.closed_bad_frames == 1


@pytest.mark.parametrize(
    "payload",
    [
        _metadata_v12(body_tags=b"\x01\x07\x01\x00"),
        _metadata_v12(header_tags=b"\x01\x07\x02\xab\xcd"),
        _metadata_v12(header_tags=b"\x02\x05\x00\x09\x01\x00", body_tags=b"\x01\x63\x00"),
    ],
    ids=["body", "header", "both"],
)
async def test_tagged_fields_a_request_schema_does_not_know_are_skipped(
    tmp_path: Path, payload: bytes
) -> None:
    """KIP-482: a receiver skips the tagged fields it does not know (a newer client may send
    tags an older schema lacks). kio's reader refused them and the connection was closed."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        answer = await _answered(daemon.kafka_port, payload)
        assert answer is not None
        cls = load_response_schema(3, 12)
        header, used = entity_reader(cls.__header_schema__)(answer, 0)
        response, _ = entity_reader(cls)(answer, used)
        assert header.correlation_id == 1 and len(response.brokers) == 1


async def test_a_client_that_pipelines_fetches_and_never_reads_holds_one_answer_then_is_closed(
    tmp_path: Path,
) -> None:
    """The answers of a connection's requests were all built and held until the writer could
    send them: a client pipelining fetches of a large partition without reading held every
    answer (3 connections of 128 fetches: 6 GB), and no timeout closed it (the idle timeout
    watched the reader only). Requests other than produce are served one at a time, as Kafka's
    broker serves them; an answer not taken within the idle timeout closes the connection."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0", kafka__idle_timeout_s=2.0) as (
        daemon,
        client,
    ):
        await client.create_topic("big", 1)
        for _ in range(8):  # 8 MiB: an answer larger than the socket's buffers
            await client.produce("big", 0, [(None, b"v" * 1024 * 1024)])
        started = 0
        fetching = daemon.kafka.handlers.fetching
        inner = fetching.fetch

        async def counted(request: Any) -> Any:
            nonlocal started
            started += 1
            return await inner(request)

        fetching.fetch = counted
        wire = await Wire.connect(daemon.kafka_port)
        try:
            for _ in range(20):
                await send_fetch(wire, "big", partition_max_bytes=1 << 24)
            with anyio.move_on_after(3):  # bounded: never more than two, however long
                while started < 3:
                    await anyio.sleep(0.05)
            assert started <= 2  # the one being sent, and the next one's, at most
            with anyio.fail_after(30):
                while daemon.kafka.stats.closed_idle < 1:  # the client takes nothing: closed
                    await anyio.sleep(0.1)
        finally:
            await wire.aclose()


async def test_each_request_under_way_weighs_at_least_4_kib_of_the_listeners_budget(tmp_path: Path) -> None:
    """With thousands of requests a connection may have under way, the listener-wide byte
    budget bounds them on every connection together: each counts at least REQUEST_BYTES_MIN
    however small its frame. A budget of 8 KiB holds two small produces: the third is read
    only once an answer gave its bytes back."""
    async with daemon_and_client(
        tmp_path,
        kafka__listen="127.0.0.1:0",
        kafka__frame_bytes_max=8192,
        kafka__inflight_bytes_max=8192,
        batcher__linger_ms=1500.0,
    ) as (daemon, client):
        await client.create_topic("weighed", 1)
        wire = await Wire.connect(daemon.kafka_port)
        try:
            before = daemon.kafka.stats.requests
            m = module_of(0, 9)
            for n in range(5):
                data = make(
                    m.TopicProduceData,
                    name="weighed",
                    partition_data=(
                        make(
                            m.PartitionProduceData, index=0, records=client_batch([(0, None, b"%d" % n, [])])
                        ),
                    ),
                )
                await wire.send(0, 9, transactional_id=None, acks=-1, timeout=30_000 * MS, topic_data=(data,))
            with anyio.move_on_after(1):  # within the 1.5 s window: bounded however long
                while daemon.kafka.stats.requests - before < 3:
                    await anyio.sleep(0.05)
            assert daemon.kafka.stats.requests - before == 2
            for _ in range(5):  # all answered in the end, in order
                assert await wire.frame() is not None
        finally:
            await wire.aclose()


def _zstd_batch(count: int) -> bytes:
    """A zstd record batch of `count` records with key b"k" and no value (tiny on the wire)."""
    import cramjam
    from crc32c import crc32c

    def varint(n: int) -> bytes:
        n = (n << 1) ^ (n >> 63)
        out = b""
        while True:
            low, n = n & 0x7F, n >> 7
            if not n:
                return out + bytes([low])
            out += bytes([low | 0x80])

    record = b"\x00" + varint(0) + varint(0) + varint(1) + b"k" + varint(-1) + varint(0)
    body = bytes(cramjam.zstd.compress((varint(len(record)) + record) * count))
    rest = struct.pack(">hiqqqhii", 4, count - 1, 0, 0, -1, -1, -1, count) + body
    return struct.pack(">qi", 0, len(rest) + 9) + struct.pack(">ibI", 0, 2, crc32c(rest)) + rest


async def test_a_record_set_of_very_many_records_is_decoded_off_the_event_loop(tmp_path: Path) -> None:
    """A batch of a million empty records is 821 bytes of zstd; decoding it took 0.36 s of the
    event loop, and four clients sending 30 such requests each stalled every request of the
    daemon for 46 s. A record set claiming many records is decoded in a worker thread; a small
    one still on the loop (a thread hop per produce would cost more than it saves)."""
    import threading

    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("many", 1)
        decoding_threads: list[bool] = []
        inner = kr.decode_batches

        def watched(data: bytes, *, stored: bool = False) -> Any:
            decoding_threads.append(threading.current_thread() is threading.main_thread())
            return inner(data, stored=stored)

        kr.decode_batches = watched  # type: ignore[assignment]
        wire = await Wire.connect(daemon.kafka_port)
        try:
            big = await produce(wire, "many", 0, _zstd_batch(200_000))
            small = await produce(wire, "many", 0, client_batch([(0, b"k", b"v", [])]))
        finally:
            kr.decode_batches = inner  # type: ignore[assignment]
            await wire.aclose()
        assert big.responses[0].partition_responses[0].error_code == ErrorCode.none
        assert small.responses[0].partition_responses[0].base_offset == 200_000
        assert decoding_threads == [False, True]  # the big one in a worker thread


async def _api_versions(wire: Wire) -> Any:
    return await wire.request(18, 3, client_software_name="t", client_software_version="1")


async def test_at_connections_max_an_idle_connection_makes_room_a_busy_one_does_not(tmp_path: Path) -> None:
    """One client holding every connection idle (a request each, then silence, for the 10-minute
    idle timeout) shut every other client out of the Kafka listener: new connections were closed
    unanswered. At connections_max an idle connection (waiting for its next request, none under
    way) is closed for the newcomer, the longest idle first; a connection with a request under
    way is never, and with none idle the newcomer is refused as before."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0", kafka__connections_max=3) as (
        daemon,
        client,
    ):
        await client.create_topic("quiet", 1)
        port, stats = daemon.kafka_port, daemon.kafka.stats
        wires = [await Wire.connect(port) for _ in range(3)]
        try:
            for wire in wires:
                assert (await _api_versions(wire)).error_code == ErrorCode.none
                await anyio.sleep(0.01)  # idle since, in order
            newcomer = await Wire.connect(port)
            assert (await _api_versions(newcomer)).error_code == ErrorCode.none
            assert stats.closed[Close.EVICTED] == 1
            assert await wires[0].frame() is None  # the longest idle went
            # Every connection busy: each long-polls an empty partition.
            busy = [wires[1], wires[2], newcomer]
            for wire in busy:
                await send_fetch(wire, "quiet", max_wait_ms=5000, max_bytes=1 << 20)
            with anyio.fail_after(30):  # each fetch read, waiting for records
                while sum(1 for o in daemon.kafka._open if o.in_flight) < 3:
                    await anyio.sleep(0.01)
            refused = await Wire.connect(port)
            assert await refused.frame() is None  # closed unanswered: nothing idle to close
            await refused.aclose()
            assert stats.closed[Close.CONNECTIONS_MAX] == 1 and stats.closed[Close.EVICTED] == 1
        finally:
            for wire in [*wires, newcomer]:
                await wire.aclose()
