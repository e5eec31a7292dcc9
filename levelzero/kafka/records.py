"""Kafka's RecordBatch v2 (magic 2) format: decode what producers send, encode what consumers read.

Hand-written on purpose: the message-level library we use (kio) reads record batches, but it
truncates record timestamps to whole seconds, builds a `datetime` per record, and reads no
compressed batch. Compression uses gzip from the standard library and cramjam for snappy, LZ4
and zstd. This codec is pure (no I/O), checks the CRC-32C of every batch, bounds every
length it reads by the bytes actually present, and bounds decompressed sizes
(`DECOMPRESSED_BYTES_MAX`), so a hostile batch costs at most that much memory.

Layout (https://kafka.apache.org/documentation/#recordbatch):

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 (=2)
    | crc uint32 (CRC-32C of everything after it) | attributes int16 | lastOffsetDelta int32
    | baseTimestamp int64 | maxTimestamp int64 | producerId int64 | producerEpoch int16
    | baseSequence int32 | recordCount int32 | records (compressed as one block if the codec
    in attributes bits 0-2 is not none)

    record: length varint | attributes int8 | timestampDelta varlong | offsetDelta varint
            | keyLength varint | key | valueLength varint | value | headerCount varint
            | (headerKeyLength varint | headerKey | headerValueLength varint | headerValue)*
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import cramjam
from crc32c import crc32c

from levelzero.core.txn_marks import TXN_HEADER
from levelzero.core.errors import LevelZeroError
from levelzero.core.l0format import Record

MAGIC = 2
BATCH_HEADER_BYTES = 61  # baseOffset .. recordCount
_BATCH_HEAD = struct.Struct(">qiibI")  # baseOffset, batchLength, leaderEpoch, magic, crc
_BATCH_REST = struct.Struct(">hiqqqhii")  # attributes .. recordCount
_RECORD_COUNT = struct.Struct(">i")  # a batch header's last field
CRC_START = 21  # the CRC covers the bytes from attributes on
RECORDS_PER_BATCH_MAX = 1_000_000
DECOMPRESSED_BYTES_MAX = 64 * 1024 * 1024
HEADERS_PER_RECORD_MAX = 10_000

COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1
COMPRESSION_SNAPPY = 2
COMPRESSION_LZ4 = 3
COMPRESSION_ZSTD = 4
COMPRESSION_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
ATTR_COMPRESSION_MASK = 0x07
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
NO_TIMESTAMP = -1
# The header a stored record of a Kafka transaction carries last (core.txn_marks): its
# producer id, epoch and kind (-1 data, 0 abort marker, 1 commit marker). NUL: no client sends it.
_TXN_VALUE = struct.Struct(">qhb")


class CorruptBatch(LevelZeroError):
    """A record batch that does not parse or fails its CRC: Kafka's CORRUPT_MESSAGE."""

    code = "corrupt_message"


class UnsupportedCompression(LevelZeroError):
    """A batch compressed with a codec this build cannot read: UNSUPPORTED_COMPRESSION_TYPE."""

    code = "unsupported_compression"


class KafkaRecord(NamedTuple):  # a tuple: built per record, it must be cheap
    offset_delta: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(frozen=True, slots=True)
class KafkaBatch:
    base_offset: int
    attributes: int
    last_offset_delta: int
    base_timestamp_ms: int
    max_timestamp_ms: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: list[KafkaRecord] | list[Record]  # Records with decode_batches(stored=True)

    @property
    def compression(self) -> int:
        return self.attributes & ATTR_COMPRESSION_MASK

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)


# ------------------------------------------------------------------------------ decompression


def _gunzip(data: bytes, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits=47)  # gzip or zlib header, auto-detected
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise CorruptBatch(f"gzip data does not inflate: {exc}") from None
    if len(out) > limit:
        raise CorruptBatch(f"a batch inflates beyond {limit} bytes")
    return out


def _gzip(data: bytes) -> bytes:
    deflater = zlib.compressobj(6, zlib.DEFLATED, 31)
    return deflater.compress(data) + deflater.flush()


FIRST_GUESS_BYTES = 256 * 1024


def _bounded(decompress_into: Callable[[bytes, bytearray], int], name: str) -> Callable[[bytes, int], bytes]:
    """A cramjam `decompress_into` run into buffers of growing size, never above `limit`:
    the frame formats (LZ4, zstd) may not say their decompressed size up front."""

    def decompress(data: bytes, limit: int) -> bytes:
        size = min(limit, max(FIRST_GUESS_BYTES, 8 * len(data)))
        while True:
            out = bytearray(size)
            try:
                return bytes(out[: decompress_into(data, out)])
            except cramjam.DecompressionError as exc:
                if size >= limit:
                    raise CorruptBatch(
                        f"{name} data does not decompress within {limit} bytes: {exc}"
                    ) from None
                size = min(limit, size * 4)

    return decompress


XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER_BYTES = 16


def _raw_snappy(data: bytes, limit: int) -> bytes:
    size, _ = _uvarint(data, 0, len(data))  # a raw snappy block starts with its length
    if size > limit:
        raise CorruptBatch(f"a snappy block of {size} bytes exceeds {limit}")
    out = bytearray(size)
    try:
        written = cramjam.snappy.decompress_raw_into(data, out)
    except cramjam.DecompressionError as exc:
        raise CorruptBatch(f"snappy data does not decompress: {exc}") from None
    return bytes(out[:written])


def _snappy(data: bytes, limit: int) -> bytes:
    """Raw snappy, or the xerial framing Java producers use (magic, version, then blocks each
    prefixed with its length)."""
    if not data.startswith(XERIAL_MAGIC):
        return _raw_snappy(data, limit)
    parts: list[bytes] = []
    total = 0
    pos = XERIAL_HEADER_BYTES
    while pos < len(data):
        if pos + 4 > len(data):
            raise CorruptBatch("a snappy block length runs past the data")
        length = int.from_bytes(data[pos : pos + 4], "big")
        pos += 4
        if length > len(data) - pos:
            raise CorruptBatch("a snappy block runs past the data")
        part = _raw_snappy(data[pos : pos + length], limit - total)
        total += len(part)
        parts.append(part)
        pos += length
    return b"".join(parts)


# codec -> (decompress(data, limit), compress(data))
Decompress = Callable[[bytes, int], bytes]
Compress = Callable[[bytes], bytes]
CODECS: dict[int, tuple[Decompress, Compress]] = {
    COMPRESSION_GZIP: (_gunzip, _gzip),
    COMPRESSION_SNAPPY: (_snappy, lambda data: bytes(cramjam.snappy.compress_raw(data))),
    COMPRESSION_LZ4: (
        _bounded(cramjam.lz4.decompress_into, "lz4"),
        lambda data: bytes(cramjam.lz4.compress(data)),
    ),
    COMPRESSION_ZSTD: (
        _bounded(cramjam.zstd.decompress_into, "zstd"),
        lambda data: bytes(cramjam.zstd.compress(data)),
    ),
}


# ------------------------------------------------------------------------------ varints


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """A zig-zag varint (up to 64 bits) at `pos`; returns (value, next position)."""
    shift = 0
    raw = 0
    while True:
        if pos >= end:
            raise CorruptBatch("a record ends inside a varint")
        byte = buf[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
        if shift > 63:
            raise CorruptBatch("a varint is longer than 10 bytes")
    return (raw >> 1) ^ -(raw & 1), pos


def _uvarint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """An unsigned varint (up to 32 bits: a snappy length) at `pos`."""
    value = 0
    for shift in range(0, 35, 7):
        if pos >= end:
            raise CorruptBatch("data ends inside a length")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
    raise CorruptBatch("a length is longer than 5 bytes")


def _put_varint(out: bytearray, value: int) -> None:
    raw = (value << 1) ^ (value >> 63)
    raw &= 0xFFFFFFFFFFFFFFFF
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)


def _bytes(buf: bytes, pos: int, end: int) -> tuple[bytes | None, int]:
    length, pos = _varint(buf, pos, end)
    if length == -1:
        return None, pos
    if length < -1 or pos + length > end:
        raise CorruptBatch(f"a record field of {length} bytes runs past its record")
    return buf[pos : pos + length], pos + length


# ------------------------------------------------------------------------------ decoding

_PRODUCER_ID = struct.Struct(">q")
# baseOffset, batchLength, leaderEpoch, magic, crc, attributes, lastOffsetDelta, timestamps
PRODUCER_ID_AT = 43


def producer_id_of(data: bytes) -> int:
    """The producer id in the first batch's header (-1 if there is none): read before the
    record set is decoded, to load that producer's state."""
    if len(data) < BATCH_HEADER_BYTES:
        return -1
    producer_id: int = _PRODUCER_ID.unpack_from(data, PRODUCER_ID_AT)[0]
    return producer_id


def records_claimed(data: bytes) -> int:
    """The record count the first batch's header claims (0 if there is none): read before the
    record set is decoded, to decode a large one off the event loop."""
    if len(data) < BATCH_HEADER_BYTES:
        return 0
    count: int = _RECORD_COUNT.unpack_from(data, BATCH_HEADER_BYTES - 4)[0]
    return count


def transactional_head(data: bytes) -> tuple[int, int] | None:
    """(producer id, epoch) of a record set whose first batch is transactional, else None."""
    if len(data) < BATCH_HEADER_BYTES:
        return None
    attributes = int.from_bytes(data[_ATTRIBUTES_AT : _ATTRIBUTES_AT + 2], "big")
    if not attributes & ATTR_TRANSACTIONAL or attributes & ATTR_CONTROL:
        return None
    producer_id: int = _PRODUCER_ID.unpack_from(data, PRODUCER_ID_AT)[0]
    epoch = int.from_bytes(data[PRODUCER_ID_AT + 8 : PRODUCER_ID_AT + 10], "big", signed=True)
    return producer_id, epoch


def _decode_records(buf: bytes, count: int, base_timestamp: int) -> list[KafkaRecord]:
    """The records of one batch. Hot: varints of one or two bytes (nearly all of them) are
    read inline, longer ones by `_varint`; a header-less record takes no list."""
    records: list[KafkaRecord] = []
    append = records.append
    varint = _varint
    pos = 0
    end_all = len(buf)
    for _ in range(count):
        # record length
        if pos + 1 < end_all and buf[pos] < 0x80:
            raw = buf[pos]
            pos += 1
            length = (raw >> 1) ^ -(raw & 1)
        elif pos + 2 < end_all and buf[pos + 1] < 0x80:
            raw = (buf[pos] & 0x7F) | (buf[pos + 1] << 7)
            pos += 2
            length = (raw >> 1) ^ -(raw & 1)
        else:
            length, pos = varint(buf, pos, end_all)
        end = pos + length
        if length < 1 or end > end_all:
            raise CorruptBatch(f"a record of {length} bytes runs past its batch")
        pos += 1  # record attributes: unused by magic 2
        # timestamp and offset deltas
        if pos < end and buf[pos] < 0x80:
            raw = buf[pos]
            pos += 1
            timestamp_delta = (raw >> 1) ^ -(raw & 1)
        elif pos + 1 < end and buf[pos + 1] < 0x80:
            raw = (buf[pos] & 0x7F) | (buf[pos + 1] << 7)
            pos += 2
            timestamp_delta = (raw >> 1) ^ -(raw & 1)
        else:
            timestamp_delta, pos = varint(buf, pos, end)
        if pos < end and buf[pos] < 0x80:
            raw = buf[pos]
            pos += 1
            offset_delta = (raw >> 1) ^ -(raw & 1)
        elif pos + 1 < end and buf[pos + 1] < 0x80:
            raw = (buf[pos] & 0x7F) | (buf[pos + 1] << 7)
            pos += 2
            offset_delta = (raw >> 1) ^ -(raw & 1)
        else:
            offset_delta, pos = varint(buf, pos, end)
        # key
        if pos < end and buf[pos] == 1:  # -1: null
            key = None
            pos += 1
        elif pos < end and buf[pos] < 0x80 and not buf[pos] & 1:
            size = buf[pos] >> 1
            if pos + 1 + size > end:
                raise CorruptBatch("a record key runs past its record")
            key = buf[pos + 1 : pos + 1 + size]
            pos += 1 + size
        else:
            key, pos = _bytes(buf, pos, end)
        # value
        if pos < end and buf[pos] < 0x80 and buf[pos] != 1:
            size = buf[pos] >> 1
            if buf[pos] & 1 or pos + 1 + size > end:
                raise CorruptBatch("a record value runs past its record")
            value: bytes | None = buf[pos + 1 : pos + 1 + size]
            pos += 1 + size
        elif pos + 1 < end and buf[pos + 1] < 0x80 and buf[pos] & 0x80:
            raw = (buf[pos] & 0x7F) | (buf[pos + 1] << 7)
            size = raw >> 1
            if raw & 1 or pos + 2 + size > end:
                raise CorruptBatch("a record value runs past its record")
            value = buf[pos + 2 : pos + 2 + size]
            pos += 2 + size
        else:
            value, pos = _bytes(buf, pos, end)
        # headers
        if pos < end and buf[pos] == 0:
            pos += 1
            headers: tuple[tuple[str, bytes | None], ...] = ()
        else:
            headers, pos = _headers(buf, pos, end)
        if pos != end:
            raise CorruptBatch("a record's fields do not add up to its length")
        append(KafkaRecord(offset_delta, base_timestamp + timestamp_delta, key, value, headers))
    if pos != end_all:
        raise CorruptBatch("a batch holds bytes after its last record")
    return records


def _headers(buf: bytes, pos: int, end: int) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    header_count, pos = _varint(buf, pos, end)
    if not 0 <= header_count <= HEADERS_PER_RECORD_MAX:
        raise CorruptBatch(f"a record claims {header_count} headers")
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(header_count):
        name, pos = _bytes(buf, pos, end)
        if name is None:
            raise CorruptBatch("a record header has a null key")
        header_value, pos = _bytes(buf, pos, end)
        try:
            headers.append((name.decode(), header_value))
        except UnicodeDecodeError:
            raise CorruptBatch("a record header key is not UTF-8") from None
    return tuple(headers), pos


try:  # aiokafka's RecordBatch v2 codec, compiled (Cython): ~4x faster than the loop above
    from aiokafka.errors import CorruptRecordException as _AiokafkaCorrupt
    from aiokafka.record.default_records import (
        DefaultRecordBatch as _AiokafkaBatch,
        DefaultRecordBatchBuilder as _AiokafkaBuilder,
    )

    _AIOKAFKA = _AiokafkaBatch.__module__.endswith("_crecords.default_records")
except ImportError:  # pragma: no cover - a build without it decodes in Python
    _AIOKAFKA = False

_ATTR_TIMESTAMP_TYPE = 0x08
_BATCH_LENGTH_AT = 8  # bytes: base offset
_ATTRIBUTES_AT = CRC_START


def _decode_records_compiled(
    head: bytes, body: bytes, base_offset: int, count: int, stored: bool = False
) -> list[KafkaRecord] | list[Record]:
    """`_decode_records` by aiokafka's compiled reader: the batch header again with no codec
    and create-time timestamps (the body is already inflated, the CRC already checked),
    then the body. Its own checks (lengths, counts, bytes left over) raise CorruptBatch."""
    synthetic = bytearray(head)
    attributes = int.from_bytes(synthetic[_ATTRIBUTES_AT : _ATTRIBUTES_AT + 2], "big")
    attributes &= ~(ATTR_COMPRESSION_MASK | _ATTR_TIMESTAMP_TYPE)
    synthetic[_ATTRIBUTES_AT : _ATTRIBUTES_AT + 2] = attributes.to_bytes(2, "big")
    synthetic[_BATCH_LENGTH_AT : _BATCH_LENGTH_AT + 4] = (BATCH_HEADER_BYTES - 12 + len(body)).to_bytes(
        4, "big"
    )
    synthetic += body
    records: list[KafkaRecord] | list[Record]
    try:
        if stored:  # what the node stores: no KafkaRecord in between (a null value stays null)
            records = [
                Record(r.key, r.value, r.timestamp, tuple(r.headers) if r.headers else ())
                for r in _AiokafkaBatch(bytes(synthetic))
            ]
        else:
            records = [
                KafkaRecord(
                    r.offset - base_offset, r.timestamp, r.key, r.value, tuple(r.headers) if r.headers else ()
                )
                for r in _AiokafkaBatch(bytes(synthetic))
            ]
    except (_AiokafkaCorrupt, UnicodeDecodeError, ValueError, IndexError) as exc:
        raise CorruptBatch(f"a record does not parse: {exc}") from None
    if len(records) != count:
        raise CorruptBatch(f"a batch claims {count} records and holds {len(records)}")
    for record in records:
        if len(record.headers) > HEADERS_PER_RECORD_MAX:
            raise CorruptBatch(f"a record claims {len(record.headers)} headers")
    return records


def decode_batches(data: bytes, *, stored: bool = False) -> list[KafkaBatch]:
    """Every batch in a produce request's record set. Raises CorruptBatch/UnsupportedCompression.
    With `stored`, each batch's records are the `Record`s the node stores (key, value, each
    null or bytes as sent, timestamp, headers) instead of `KafkaRecord`s."""
    batches: list[KafkaBatch] = []
    pos = 0
    total = len(data)
    while pos < total:
        if total - pos < BATCH_HEADER_BYTES:
            raise CorruptBatch("the record set ends inside a batch header")
        base_offset, batch_length, _leader_epoch, magic, crc = _BATCH_HEAD.unpack_from(data, pos)
        if magic != MAGIC:
            raise CorruptBatch(f"record batch magic {magic} is not 2 (only RecordBatch v2 is read)")
        end = pos + 12 + batch_length
        if batch_length < BATCH_HEADER_BYTES - 12 or end > total:
            raise CorruptBatch(f"batch length {batch_length} does not fit the record set")
        if crc32c(data[pos + CRC_START : end]) != crc:
            raise CorruptBatch("record batch CRC mismatch")
        (attributes, last_delta, base_ts, max_ts, producer_id, producer_epoch, base_sequence, count) = (
            _BATCH_REST.unpack_from(data, pos + CRC_START)
        )
        if not 0 <= count <= RECORDS_PER_BATCH_MAX:
            raise CorruptBatch(f"a batch claims {count} records")
        body = data[pos + BATCH_HEADER_BYTES : end]
        codec = attributes & ATTR_COMPRESSION_MASK
        if codec != COMPRESSION_NONE:
            entry = CODECS.get(codec)
            if entry is None:
                name = COMPRESSION_NAMES.get(codec, str(codec))
                raise UnsupportedCompression(f"compression {name} is not supported by this build")
            body = entry[0](body, DECOMPRESSED_BYTES_MAX)
        if _AIOKAFKA:
            head = data[pos : pos + BATCH_HEADER_BYTES]
            records = _decode_records_compiled(head, body, base_offset, count, stored)
        else:
            records = _decode_records(body, count, base_ts)
            if stored:
                records = [Record(r.key, r.value, r.timestamp_ms, r.headers) for r in records]
        batches.append(
            KafkaBatch(
                base_offset,
                attributes,
                last_delta,
                base_ts,
                max_ts,
                producer_id,
                producer_epoch,
                base_sequence,
                records,
            )
        )
        pos = end
    return batches


def client_record_set_problem(batches: Sequence[KafkaBatch]) -> str | None:
    """Why one partition's record set in a produce request is not one a client may send, as
    Kafka's broker checks it (ProduceRequest.validateRecords, then LogValidator.validateBatch
    for a client's append): answered INVALID_RECORD, nothing stored. None if it may be."""
    if not batches:
        return "a produce request must hold one record batch per partition; this one holds none"
    if len(batches) > 1:
        return f"a produce request may hold exactly one record batch per partition, not {len(batches)}"
    batch = batches[0]
    if batch.base_offset != 0:
        return f"a produced record batch's base offset must be 0, not {batch.base_offset}"
    count = len(batch.records)  # the header's count: `decode_batches` holds them to it
    if batch.last_offset_delta < 0:
        return f"the record batch has an invalid offset range: [0, {batch.last_offset_delta}]"
    if count == 0:
        return "the record batch holds no records"
    if batch.last_offset_delta + 1 != count:
        return (
            f"the record batch's offset range [0, {batch.last_offset_delta}] does not match its "
            f"{count} records"
        )
    if batch.is_control:
        return "clients may not write control records"
    if batch.producer_id >= 0 and batch.base_sequence < 0:
        return f"invalid sequence number {batch.base_sequence} in a batch of producer id {batch.producer_id}"
    return None


# ------------------------------------------------------------------------------ encoding


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    _put_varint(out, value)
    return bytes(out)


# Zig-zag varints of -1 .. 16382 (null lengths, small lengths and deltas), looked up per record.
_VARINTS = [_varint_bytes(v) for v in range(-1, 16383)]


def _varint_of(value: int) -> bytes:
    return _VARINTS[value + 1] if -1 <= value < 16383 else _varint_bytes(value)


def encode_batch(
    base_offset: int,
    records: list[KafkaRecord],
    *,
    compression: int = COMPRESSION_NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
) -> bytes:
    """One batch holding `records` (offset_delta relative to base_offset, in order);
    `attributes`: the transactional and control bits."""
    assert records, "a batch holds at least one record"
    if _AIOKAFKA and compression == COMPRESSION_NONE and attributes == 0:
        return _encode_compiled(base_offset, records, producer_id, producer_epoch, base_sequence)
    base_ts = records[0].timestamp_ms
    max_ts = max(r.timestamp_ms for r in records)
    varint_of = _varint_of
    no_headers = _VARINTS[1]
    null = _VARINTS[0]
    parts: list[bytes] = []
    append = parts.append
    for r in records:
        key = r.key
        value = r.value
        record = b"".join(
            (
                b"\0",
                varint_of(r.timestamp_ms - base_ts),
                varint_of(r.offset_delta),
                null if key is None else varint_of(len(key)),
                key or b"",
                null if value is None else varint_of(len(value)),
                value or b"",
                no_headers if not r.headers else _encode_headers(r.headers),
            )
        )
        append(varint_of(len(record)))
        append(record)
    payload = b"".join(parts)
    if compression != COMPRESSION_NONE:
        payload = CODECS[compression][1](payload)
    rest = (
        _BATCH_REST.pack(
            compression | attributes,
            records[-1].offset_delta,
            base_ts,
            max_ts,
            producer_id,
            producer_epoch,
            base_sequence,
            len(records),
        )
        + payload
    )
    head = _BATCH_HEAD.pack(base_offset, len(rest) + 9, 0, MAGIC, crc32c(rest))
    return head + rest


def _encode_compiled(
    base_offset: int,
    records: list[KafkaRecord],
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
) -> bytes:
    """`encode_batch` by aiokafka's compiled builder (no codec): ~10x faster than in Python."""
    builder = _AiokafkaBuilder(
        magic=MAGIC,
        compression_type=COMPRESSION_NONE,
        is_transactional=0,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=2**31 - 1,
    )
    append = builder.append
    for r in records:
        assert (
            append(
                r.offset_delta,
                timestamp=r.timestamp_ms,
                key=r.key,
                value=r.value,
                headers=list(r.headers) if r.headers else [],
            )
            is not None
        ), "the batch size is unbounded"
    out = builder.build()
    out[0:8] = base_offset.to_bytes(8, "big", signed=True)  # outside the CRC
    return bytes(out)


class StoredRun(Protocol):
    """Stored records as a fetch took them from one extent (actors.reader.Run): `records[start:
    stop]`, the first of them (index 0) at `base_offset`."""

    @property
    def base_offset(self) -> int: ...
    @property
    def records(self) -> Sequence[Record]: ...
    @property
    def start(self) -> int: ...
    @property
    def stop(self) -> int: ...


def encode_runs(runs: Sequence[StoredRun]) -> bytes:
    """Uncompressed batches of stored records, one per run (a run is what a fetch took from
    one extent), straight from the stored records: no object per record on the compiled path
    (a fetch's hot loop)."""
    assert runs, "a fetch took at least one run"
    return b"".join(encode_run(run.base_offset, run.records, run.start, run.stop) for run in runs)


def encode_run(base_offset: int, records: Sequence[Record], start: int, stop: int) -> bytes:
    """One uncompressed batch of `records[start:stop]`, the first at `base_offset + start`."""
    assert 0 <= start < stop <= len(records), (start, stop, len(records))
    if any(r.headers and r.headers[-1][0] == TXN_HEADER for r in records[start:stop]):
        return _encode_transactional_run(base_offset, records, start, stop)
    first = base_offset + start
    if not _AIOKAFKA:
        return encode_batch(
            first,
            [
                KafkaRecord(i - start, r.timestamp_ms, r.key, r.value, r.headers)
                for i, r in enumerate(records[start:stop], start)
            ],
        )
    builder = _AiokafkaBuilder(
        magic=MAGIC,
        compression_type=COMPRESSION_NONE,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=2**31 - 1,
    )
    append = builder.append
    for delta, r in enumerate(records[start:stop]):
        headers = r.headers
        assert append(delta, r.timestamp_ms, r.key, r.value, list(headers) if headers else []) is not None, (
            "the batch size is unbounded"
        )
    out = builder.build()
    out[0:8] = first.to_bytes(8, "big", signed=True)  # outside the CRC
    return bytes(out)


def _encode_transactional_run(base_offset: int, records: Sequence[Record], start: int, stop: int) -> bytes:
    """A run holding records of transactions: a batch per stretch of one producer's records
    (transactional, its producer id and epoch, the reserved header dropped), a control batch
    per marker, plain batches for the records between."""
    out: list[bytes] = []
    i = start
    while i < stop:
        txn = (
            records[i].headers[-1][1]
            if records[i].headers and records[i].headers[-1][0] == TXN_HEADER
            else None
        )
        j = i + 1
        while j < stop:
            headers = records[j].headers
            other = headers[-1][1] if headers and headers[-1][0] == TXN_HEADER else None
            if other != txn:
                break
            j += 1
        if txn is None:
            out.append(encode_run(base_offset, records, i, j))
        else:
            producer_id, epoch, kind = _TXN_VALUE.unpack(txn)
            attributes = ATTR_TRANSACTIONAL | (ATTR_CONTROL if kind >= 0 else 0)
            stretch = [
                KafkaRecord(n - i, r.timestamp_ms, r.key, r.value, r.headers[:-1])
                for n, r in enumerate(records[i:j], i)
            ]
            if kind >= 0:  # markers: one control batch each
                for n, record in enumerate(stretch):
                    out.append(
                        encode_batch(
                            base_offset + i + n,
                            [record._replace(offset_delta=0)],
                            producer_id=producer_id,
                            producer_epoch=epoch,
                            attributes=attributes,
                        )
                    )
            else:
                out.append(
                    encode_batch(
                        base_offset + i,
                        stretch,
                        producer_id=producer_id,
                        producer_epoch=epoch,
                        attributes=attributes,
                    )
                )
        i = j
    return b"".join(out)


def set_leader_epoch(data: bytearray, epoch: int) -> None:
    """Every batch's partitionLeaderEpoch in `data` (outside the CRC)."""
    pos = 0
    while pos + 12 <= len(data):
        data[pos + 12 : pos + 16] = epoch.to_bytes(4, "big", signed=True)
        pos += 12 + int.from_bytes(data[pos + 8 : pos + 12], "big")


def _encode_headers(headers: tuple[tuple[str, bytes | None], ...]) -> bytes:
    out = bytearray()
    _put_varint(out, len(headers))
    for name, header_value in headers:
        encoded = name.encode()
        _put_varint(out, len(encoded))
        out += encoded
        if header_value is None:
            _put_varint(out, -1)
        else:
            _put_varint(out, len(header_value))
            out += header_value
    return bytes(out)
