"""The RecordBatch v2 codec against a real client's own codec (kafka-python's
DefaultRecordBatchBuilder / DefaultRecordBatch), both directions, and its refusals."""

from __future__ import annotations

import contextlib
import random

import cramjam
import pytest
from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from levelzero.core.producers import BATCHES_REMEMBERED, SEQUENCE_MAX, ProducerSequences, following_sequence
from levelzero.kafka import records as kr


def client_batch(
    records: list[tuple[int, bytes | None, bytes | None, list]],
    compression: int = 0,
    producer_id: int = -1,
    base_sequence: int = -1,
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=False,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=base_sequence,
        batch_size=1 << 24,
    )
    for offset, (timestamp, key, value, headers) in enumerate(records):
        builder.append(offset, timestamp=timestamp, key=key, value=value, headers=headers)
    return bytes(builder.build())


def sample(count: int, seed: int) -> list[tuple[int, bytes | None, bytes | None, list]]:
    rng = random.Random(seed)
    return [
        (
            1_700_000_000_000 + rng.randint(0, 10_000),
            None if i % 5 == 0 else rng.randbytes(rng.randint(0, 30)),
            None if i % 11 == 0 else rng.randbytes(rng.randint(0, 300)),
            [(f"h{j}", rng.randbytes(4)) for j in range(i % 3)],
        )
        for i in range(count)
    ]


@pytest.mark.parametrize("compression", [kr.COMPRESSION_NONE, kr.COMPRESSION_GZIP])
def test_decodes_what_a_client_encodes(compression: int) -> None:
    records = sample(500, seed=compression)
    data = client_batch(records, compression, producer_id=42, base_sequence=7)
    data += client_batch(records[:3], compression)  # a record set may hold several batches
    batches = kr.decode_batches(data)
    assert len(batches) == 2
    first = batches[0]
    assert (first.compression, first.producer_id, first.producer_epoch, first.base_sequence) == (
        compression,
        42,
        0,
        7,
    )
    assert first.last_offset_delta == 499
    decoded = [(r.timestamp_ms, r.key, r.value, list(r.headers)) for r in first.records]
    assert decoded == [(t, k, v, h) for t, k, v, h in records]
    assert [r.offset_delta for r in first.records] == list(range(500))
    assert len(batches[1].records) == 3


@pytest.mark.parametrize("compression", [kr.COMPRESSION_NONE, kr.COMPRESSION_GZIP])
def test_a_client_decodes_what_we_encode(compression: int) -> None:
    records = sample(300, seed=9)
    ours = [kr.KafkaRecord(i, t, k, v, tuple(h)) for i, (t, k, v, h) in enumerate(records)]
    data = kr.encode_batch(1_000, ours, compression=compression)
    batch = DefaultRecordBatch(data)
    assert batch.validate_crc()
    assert batch.base_offset == 1_000 and batch.compression_type == compression
    got = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in batch]
    assert got == [(1_000 + i, t, k, v, h) for i, (t, k, v, h) in enumerate(records)]


def test_a_flipped_byte_fails_the_crc() -> None:
    data = bytearray(client_batch(sample(10, seed=1)))
    data[-3] ^= 0x01
    with pytest.raises(kr.CorruptBatch, match="CRC"):
        kr.decode_batches(bytes(data))


def test_truncated_and_foreign_batches_are_refused() -> None:
    data = client_batch(sample(10, seed=2))
    for cut in (1, 30, 60, len(data) - 1):
        with pytest.raises(kr.CorruptBatch):
            kr.decode_batches(data[:cut])
    old_magic = bytearray(data)
    old_magic[16] = 1
    with pytest.raises(kr.CorruptBatch, match="magic"):
        kr.decode_batches(bytes(old_magic))


def test_an_unknown_codec_is_unsupported_compression() -> None:
    data = bytearray(client_batch(sample(3, seed=3)))
    data[22] = (data[22] & ~0x07) | 0x07  # attributes low bits: codec 7 does not exist

    data[17:21] = crc32c(bytes(data[21:])).to_bytes(4, "big")
    with pytest.raises(kr.UnsupportedCompression):
        kr.decode_batches(bytes(data))


def test_a_gzip_bomb_is_refused_within_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kr, "DECOMPRESSED_BYTES_MAX", 10_000)
    data = client_batch([(0, None, b"\0" * 50_000, [])], kr.COMPRESSION_GZIP)
    assert len(data) < 1_000
    with pytest.raises(kr.CorruptBatch, match="inflates beyond"):
        kr.decode_batches(data)


def test_random_bytes_never_escape_as_anything_but_corrupt_batch() -> None:
    rng = random.Random(5)
    valid = client_batch(sample(20, seed=4))
    for _ in range(2_000):
        data = bytearray(valid)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.3:
            data = data[: rng.randrange(len(data))]
        with contextlib.suppress(kr.CorruptBatch, kr.UnsupportedCompression):
            kr.decode_batches(bytes(data))


# ------------------------------------------------------------------------------ idempotence


def test_a_repeated_batch_is_recognised_and_a_new_epoch_is_not() -> None:
    seqs = ProducerSequences()
    seqs.record(7, 0, "t", 1, base_sequence=0, record_count=10, base_offset=100)
    seqs.record(7, 0, "t", 1, base_sequence=10, record_count=5, base_offset=110)
    assert seqs.duplicate_of(7, 0, "t", 1, 0).base_offset == 100
    assert seqs.duplicate_of(7, 0, "t", 1, 10).base_offset == 110
    assert seqs.duplicate_of(7, 0, "t", 1, 15) is None  # the next batch
    assert seqs.duplicate_of(7, 0, "t", 2, 0) is None  # another partition
    assert seqs.duplicate_of(7, 1, "t", 1, 0) is None  # a new producer epoch
    assert seqs.duplicate_of(-1, -1, "t", 1, -1) is None  # not an idempotent producer


def test_producer_state_is_bounded() -> None:
    seqs = ProducerSequences(producers_max=3)
    for pid in range(10):
        for seq in range(0, 10 * BATCHES_REMEMBERED, 10):
            seqs.record(pid, 0, "t", 0, seq, 10, seq)
    assert len(seqs) == 3
    assert seqs.duplicate_of(0, 0, "t", 0, 0) is None  # forgotten: least recently used
    assert seqs.duplicate_of(9, 0, "t", 0, 0).base_offset == 0
    seqs.record(9, 0, "t", 0, 10 * BATCHES_REMEMBERED, 10, 500)
    assert seqs.duplicate_of(9, 0, "t", 0, 0) is None  # only the last five batches are kept


# ------------------------------------------------------------------------------ snappy, lz4, zstd


def recompressed(batch: bytes, codec: int, body: bytes) -> bytes:
    """`batch` (uncompressed, from a client) with its records section replaced by `body`
    under `codec`, and its length and CRC fixed."""

    head = bytearray(batch[: kr.BATCH_HEADER_BYTES])
    head[21:23] = codec.to_bytes(2, "big")
    data = head + body
    data[8:12] = (len(data) - 12).to_bytes(4, "big")
    data[17:21] = crc32c(bytes(data[21:])).to_bytes(4, "big")
    return bytes(data)


@pytest.mark.parametrize("codec", [kr.COMPRESSION_SNAPPY, kr.COMPRESSION_LZ4, kr.COMPRESSION_ZSTD])
def test_snappy_lz4_zstd_round_trip(codec: int) -> None:
    records = sample(200, seed=codec)
    ours = [kr.KafkaRecord(i, t, k, v, tuple(h)) for i, (t, k, v, h) in enumerate(records)]
    (batch,) = kr.decode_batches(kr.encode_batch(0, ours, compression=codec))
    assert batch.compression == codec
    assert [(r.timestamp_ms, r.key, r.value, list(r.headers)) for r in batch.records] == records


def test_xerial_framed_snappy_is_read() -> None:
    plain = client_batch(sample(50, seed=8))
    body = plain[kr.BATCH_HEADER_BYTES :]
    half = len(body) // 2
    blocks = [bytes(cramjam.snappy.compress_raw(part)) for part in (body[:half], body[half:])]
    framed = (
        kr.XERIAL_MAGIC
        + (1).to_bytes(4, "big")
        + (1).to_bytes(4, "big")
        + b"".join(len(b).to_bytes(4, "big") + b for b in blocks)
    )
    (batch,) = kr.decode_batches(recompressed(plain, kr.COMPRESSION_SNAPPY, framed))
    assert [(r.key, r.value) for r in batch.records] == [(k, v) for _, k, v, _ in sample(50, seed=8)]


@pytest.mark.parametrize("codec", [kr.COMPRESSION_SNAPPY, kr.COMPRESSION_LZ4, kr.COMPRESSION_ZSTD])
def test_a_compression_bomb_is_refused_within_the_bound(codec: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kr, "DECOMPRESSED_BYTES_MAX", 100_000)
    plain = client_batch([(0, None, b"\0" * 10, [])])
    body = kr.CODECS[codec][1](b"\0" * 1_000_000)
    with pytest.raises(kr.CorruptBatch):
        kr.decode_batches(recompressed(plain, codec, body))
    with pytest.raises(kr.CorruptBatch):
        kr.decode_batches(recompressed(plain, codec, b"\xff" * 40))  # not that codec's data


def test_a_batch_recorded_twice_is_remembered_once() -> None:
    seqs = ProducerSequences()
    for seq in range(BATCHES_REMEMBERED):
        seqs.record(1, 0, "t", 0, seq, 1, seq)
    seqs.record(1, 0, "t", 0, BATCHES_REMEMBERED - 1, 1, BATCHES_REMEMBERED - 1)  # again
    assert seqs.duplicate_of(1, 0, "t", 0, 0) is not None  # the oldest was not pushed out


def test_the_compiled_codec_is_used_and_agrees_with_the_python_one() -> None:
    """aiokafka's compiled RecordBatch codec decodes produce requests and encodes fetch
    responses; the Python loops (the fallback) give the same records for the same bytes."""

    assert kr._AIOKAFKA, "aiokafka's compiled record codec is not installed"
    rng = random.Random(5)
    records = [
        kr.KafkaRecord(
            i,
            1_700_000_000_000 + rng.randrange(-5, 1000),
            None if i % 7 == 0 else rng.randbytes(rng.randrange(0, 40)),
            None if i % 11 == 0 else rng.randbytes(rng.randrange(0, 300)),
            (("h", rng.randbytes(3)), ("n", None)) if i % 5 == 0 else (),
        )
        for i in range(500)
    ]
    compiled = kr.encode_batch(1234, records)
    (batch,) = kr.decode_batches(compiled)
    assert batch.base_offset == 1234 and batch.records == records
    body = compiled[kr.BATCH_HEADER_BYTES :]
    assert kr._decode_records(body, len(records), batch.base_timestamp_ms) == records
    python = kr.encode_batch(1234, records, compression=kr.COMPRESSION_GZIP)  # the Python path
    assert kr.decode_batches(python)[0].records == records
    # What the node stores, decoded straight from the batch (a null value stays null).
    (stored,) = kr.decode_batches(compiled, stored=True)
    assert [(r.key, r.value, r.timestamp_ms, r.headers) for r in stored.records] == [
        (r.key, r.value, r.timestamp_ms, r.headers) for r in records
    ]
    assert sum(r.value is None for r in stored.records) == 46  # i % 11 == 0
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kr, "_AIOKAFKA", False)
        assert kr.decode_batches(compiled, stored=True)[0].records == stored.records


def test_the_next_sequence_follows_the_last_stored_batch_and_wraps() -> None:
    seqs = ProducerSequences()
    assert seqs.next_sequence(7, 0, "t", 1) is None  # not known here: any sequence will do
    seqs.record(7, 0, "t", 1, base_sequence=0, record_count=10, base_offset=100)
    seqs.record(7, 0, "t", 1, base_sequence=10, record_count=5, base_offset=110)
    assert seqs.next_sequence(7, 0, "t", 1) == 15
    assert seqs.next_sequence(7, 1, "t", 1) is None  # a new epoch starts over
    assert seqs.next_sequence(7, 0, "t", 2) is None  # another partition
    assert following_sequence(SEQUENCE_MAX - 2, 5) == 2  # an int32 sequence wraps to 0
    assert following_sequence(SEQUENCE_MAX - 4, 5) == 0
    assert following_sequence(SEQUENCE_MAX - 5, 5) == SEQUENCE_MAX


def test_a_producers_last_batch_is_the_one_at_the_highest_offset_whatever_order_it_was_learnt_in() -> None:
    """Batches are facts learnt from the log, the sequence table and appends, in any order: an
    older one learnt last neither becomes the last stored nor pushes a newer one out; an older
    epoch's batch below the newest known changes nothing."""
    seqs = ProducerSequences()
    for sequence in (5, 6, 7, 8, 9):
        seqs.record(7, 0, "t", 1, base_sequence=sequence, record_count=1, base_offset=100 + sequence)
    seqs.record(7, 0, "t", 1, base_sequence=4, record_count=1, base_offset=104)  # (the table's, late)
    assert seqs.next_sequence(7, 0, "t", 1) == 10
    assert seqs.duplicate_of(7, 0, "t", 1, 4) is None  # older than the five kept
    assert seqs.duplicate_of(7, 0, "t", 1, 5).base_offset == 105
    seqs.record(7, 1, "t", 1, base_sequence=0, record_count=2, base_offset=200)  # a new epoch
    seqs.record(7, 0, "t", 1, base_sequence=10, record_count=1, base_offset=110)  # the old one's, late
    assert seqs.next_sequence(7, 1, "t", 1) == 2
    assert seqs.duplicate_of(7, 1, "t", 1, 0).base_offset == 200
    assert seqs.next_sequence(7, 0, "t", 1) is None
