"""L0 object format (pure): a versioned header, an extent table, then each partition's extent.

    magic "LZL0" | u8 version | u32 header length | msgpack header | extent bytes ...

The header lists extents (partition id, byte offset, byte length, record count, CRC-32) so an
object can be inspected on its own; the partition log's placeholders carry the same numbers, so
the read path needs only a range read of one extent. Extent bytes are a msgpack array of records.
"""

from __future__ import annotations

import bisect
import itertools
import struct
import zlib
from collections.abc import Sequence

import msgspec

from .errors import CorruptData

MAGIC = b"LZL0"
# Version 2: a record carries a timestamp (ms, -1: none) and headers after its key and value
# (Kafka's record model): [key, value, timestamp_ms, headers], two bytes more than version 1
# for a record without them. Objects of version 1 ([key, value] records) stay readable: the
# missing trailing fields decode as their defaults.
# A value may be nil: Kafka's null value (a tombstone), distinct from an empty value (a
# zero-length bin). Objects written before null values were kept hold no nil value (a null
# was stored empty) and read back as they were written; the version stays 2 (msgpack says
# which a value is), so an older reader still reads every object without a null value.
VERSION = 2
READABLE_VERSIONS = (1, 2)
NO_TIMESTAMP = -1
_PREAMBLE = struct.Struct(">4sBI")


class Record(msgspec.Struct, frozen=True, array_like=True):
    """One stored record. `None` and `b""` are different values of `key` and of `value`: a
    null value is Kafka's tombstone (log compaction keys on it), an empty one is data."""

    key: bytes | None
    value: bytes | None
    timestamp_ms: int = NO_TIMESTAMP
    headers: tuple[tuple[str, bytes | None], ...] = ()


class ExtentHeader(msgspec.Struct, frozen=True, array_like=True):
    pid: int
    byte_offset: int  # from the start of the object
    byte_length: int
    record_count: int
    checksum: int


class ObjectHeader(msgspec.Struct, frozen=True):
    version: int
    epoch: int
    extents: list[ExtentHeader]


_records_encoder = msgspec.msgpack.Encoder()
_records_decoder = msgspec.msgpack.Decoder(list[Record])
_header_decoder = msgspec.msgpack.Decoder(ObjectHeader)


def max_timestamp(records: Sequence[Record]) -> int:
    """The largest timestamp among `records` (NO_TIMESTAMP when none has one): what a
    placeholder and an L1 row keep, so a lookup by time skips the extents below its time
    (`core/time_lookup.py`). Timestamps are the producers' and need not rise with offsets.
    On every produce: a list comprehension, ~35 ns a record (map with attrgetter took ~60)."""
    return max([r.timestamp_ms for r in records], default=NO_TIMESTAMP)


def is_stored_value(data: object) -> bool:
    """A key or value as a record holds it: bytes, or None (null). Never a bytearray,
    memoryview or str (those encode to other msgpack types, or decode as something else)."""
    return data is None or type(data) is bytes


def checksum(data: bytes | memoryview) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def encode_extent(records: Sequence[Record]) -> bytes:
    """`records` as one msgpack array (a list or a tuple: the same bytes, without a copy)."""
    assert records, "an extent holds at least one record"
    if not isinstance(records, (list, tuple)):
        records = list(records)
    return _records_encoder.encode(records)


def decode_extent(
    data: bytes | memoryview, expected_checksum: int, expected_count: int, where: str
) -> list[Record]:
    """Verify and decode one extent read back from an L0 or L1 object."""
    verify_extent(data, expected_checksum, where)
    return decode_verified_extent(data, expected_count, where)


def verify_extent(data: bytes | memoryview, expected_checksum: int, where: str) -> None:
    """An extent's bytes against the checksum its object header or placeholder holds."""
    actual = checksum(data)
    if actual != expected_checksum:
        raise CorruptData(f"{where}: checksum mismatch (expected {expected_checksum:08x}, got {actual:08x})")


def decode_verified_extent(data: bytes | memoryview, expected_count: int, where: str) -> list[Record]:
    """The records of an extent `verify_extent` passed."""
    try:
        records = _records_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CorruptData(f"{where}: undecodable extent: {exc}") from exc
    if len(records) != expected_count:
        raise CorruptData(f"{where}: {len(records)} records, expected {expected_count}")
    return records


def records_match_extent(records: Sequence[Record], expected_checksum: int) -> bool:
    """Do `records` encode to the extent whose checksum is `expected_checksum`? (Records read
    back from an L1 object, checked against the placeholder that acknowledged them: decoding
    and encoding give the same bytes.) An extent of version 1 held `[key, value]` records:
    records without a timestamp or headers are tried in that form too."""
    assert records, "an extent holds at least one record"
    assert all(is_stored_value(r.value) and is_stored_value(r.key) for r in records), records
    if checksum(encode_extent(records)) == expected_checksum:
        return True
    if all(r.timestamp_ms == NO_TIMESTAMP and not r.headers for r in records):
        version_1 = _records_encoder.encode([(r.key, r.value) for r in records])
        return checksum(version_1) == expected_checksum
    return False


def decode_single_extent(data: bytes, where: str) -> list[Record]:
    """The records of an object holding one extent (an L1 object), verified."""
    header = read_header(data, where)
    if len(header.extents) != 1:
        raise CorruptData(f"{where}: {len(header.extents)} extents, an L1 object holds one")
    (extent,) = header.extents
    raw = data[extent.byte_offset : extent.byte_offset + extent.byte_length]
    return decode_extent(raw, extent.checksum, extent.record_count, where)


def extent_checksums(extents: Sequence[tuple[int, bytes, int]]) -> list[int]:
    """The checksum of each `(pid, extent bytes, record count)`, for `build_object`."""
    return [checksum(data) for _, data, _ in extents]


def build_object(
    epoch: int, extents: Sequence[tuple[int, bytes, int]], sums: Sequence[int] | None = None
) -> tuple[bytes, list[ExtentHeader]]:
    """Lay out one object from `(pid, extent bytes, record count)`; returns bytes and headers.
    `sums`: the extents' checksums if already computed (`extent_checksums`)."""
    assert extents
    if sums is None:
        sums = extent_checksums(extents)  # once: the body is megabytes
    assert len(sums) == len(extents), (len(sums), len(extents))
    shapes = [(pid, len(data), count) for pid, data, count in extents]
    front, headers = _object_front(epoch, shapes, sums)
    return b"".join([front, *(data for _, data, _ in extents)]), headers


class EncodedExtents:
    """Extents encoded straight into the buffer that becomes the object, behind room kept for
    the preamble and header (`finish_object` writes them once the epoch is known).

    An extent is given as `(pid, parts)`: its records, in one or more parts (each producer's
    request, kept as it came in: a tuple of frozen records). They are encoded here, once: the
    same bytes as `encode_extent` of all of the extent's records.

    Why: an object is megabytes. Encoding each request into bytes of its own when it came in,
    then copying those into the object, wrote every byte twice, the first time on the event
    loop and into fresh memory (a page fault every 4 KiB); this writes each byte once, into the
    buffer that then *is* the object. (The requests' encoded lengths are known before: the
    batcher encodes each into one scratch buffer it reuses, `encoded_length`.)"""

    __slots__ = ("buffer", "room", "shapes", "sums")

    def __init__(self, extents: Sequence[tuple[int, Sequence[Sequence[Record]]]]) -> None:
        assert extents, "an object holds at least one extent"
        # Preamble plus a header of at most ~70 bytes per extent (five msgpack ints of at most
        # 9 bytes, an array marker) and the version, epoch and map keys.
        self.room = _PREAMBLE.size + 64 + 72 * len(extents)  # the bytes before the extents
        self.buffer = buffer = bytearray(self.room)
        self.shapes: list[tuple[int, int, int]] = []  # (pid, byte length, record count)
        self.sums: list[int] = []
        # An encoder of its own: this may run on a worker thread beside the loop's encoding.
        encoder = msgspec.msgpack.Encoder()
        ends: list[int] = []
        counts: list[int] = []
        for _, parts in extents:
            records = parts[0] if len(parts) == 1 else list(itertools.chain.from_iterable(parts))
            assert records, "an extent holds at least one record"
            if not isinstance(records, (list, tuple)):
                records = list(records)
            encoder.encode_into(records, buffer, -1)  # appended: one msgpack array
            ends.append(len(buffer))
            counts.append(len(records))
        # Checksums once the buffer stopped growing: one view for all extents (a view per
        # extent was a third of the encoding's cost at a thousand small extents).
        start = self.room
        with memoryview(buffer) as view:
            for (pid, _), end, count in zip(extents, ends, counts, strict=True):
                self.sums.append(zlib.crc32(view[start:end]) & 0xFFFFFFFF)
                self.shapes.append((pid, end - start, count))
                start = end


def encoded_length(records: Sequence[Record], scratch: bytearray) -> int:
    """The length of `encode_extent(records)`, found by encoding them into `scratch`, a buffer
    its caller reuses from call to call (one thread's: the event loop's). Memory the process
    touched a moment ago, where `encode_extent` writes fresh bytes each call: at 64 KiB a
    request that cost ~30 us of page faults and cache misses, this ~2 us. Raises as
    `encode_extent` does for records that cannot be encoded."""
    _records_encoder.encode_into(records, scratch)
    return len(scratch)


def extent_of_encoded(records: Sequence[bytes | msgspec.Raw]) -> bytes:
    """One extent of records each already encoded on its own (slices of other extents, as a
    compaction keeps them): the msgpack array they make together, one copy of their bytes.
    The same bytes as `encode_extent` of the records they encode."""
    assert records, "an extent holds at least one record"
    return b"".join([_array_header(len(records)), *records])


def _array_header(count: int) -> bytes:
    """The msgpack array header msgspec writes for `count` items (the shortest form)."""
    if count <= 15:
        return bytes((0x90 | count,))
    if count <= 0xFFFF:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def finish_object(epoch: int, encoded: EncodedExtents) -> tuple[bytearray, list[ExtentHeader]]:
    """The object for `epoch`: the preamble and header written in front of the extents, and
    the room left over dropped (CPython moves a bytearray's start instead of copying, unless
    the object is small next to its room).
    The bytes are the same as `build_object`'s for the same extents. Call once per
    `EncodedExtents`: the buffer becomes the object."""
    assert encoded.buffer, "these extents were made into an object already"
    front, headers = _object_front(epoch, encoded.shapes, encoded.sums)
    room = encoded.room
    assert len(front) <= room, f"object header of {len(front)} bytes exceeds its room {room}"
    buffer = encoded.buffer
    buffer[room - len(front) : room] = front
    del buffer[: room - len(front)]
    encoded.buffer = bytearray()  # used up
    return buffer, headers


def _object_front(
    epoch: int, shapes: Sequence[tuple[int, int, int]], sums: Sequence[int]
) -> tuple[bytes, list[ExtentHeader]]:
    """Preamble plus header for extents of `(pid, byte length, record count)` and checksums."""
    assert shapes and len(sums) == len(shapes), (len(shapes), len(sums))
    # The header's size depends on the offsets it records, which start after it. Only the
    # offsets' msgpack widths depend on where the data starts, so: encode once with every
    # offset at 0 (one byte each), find the start where the widths settle by counting the
    # offsets past each width's threshold, then encode for that start (two passes, not three).
    relative = [0] * len(shapes)  # each extent's offset from the first extent's start
    end = 0
    for i, (_, length, _) in enumerate(shapes):
        relative[i] = end
        end += length
    zero_offsets = len(
        _records_encoder.encode(
            ObjectHeader(
                VERSION,
                epoch,
                [
                    ExtentHeader(pid, 0, length, count, crc)
                    for (pid, length, count), crc in zip(shapes, sums, strict=True)
                ],
            )
        )
    )
    start = _PREAMBLE.size + zero_offsets
    for _ in range(16):  # the start only grows, and settles within a few steps
        settled = _PREAMBLE.size + zero_offsets + _offset_widths_above_one(relative, start)
        if settled == start:
            break
        start = settled
    else:
        raise AssertionError("object header size did not settle")
    headers = [
        ExtentHeader(pid, start + offset, length, count, crc)
        for ((pid, length, count), crc), offset in zip(zip(shapes, sums, strict=True), relative, strict=True)
    ]
    header_bytes = _records_encoder.encode(ObjectHeader(VERSION, epoch, headers))
    assert _PREAMBLE.size + len(header_bytes) == start, (len(header_bytes), start)
    return _PREAMBLE.pack(MAGIC, VERSION, len(header_bytes)) + header_bytes, headers


# A non-negative msgpack int takes 1 byte below 128, 2 below 2**8, 3 below 2**16, 5 below 2**32,
# else 9: the bytes each threshold adds.
_WIDTH_STEPS = ((128, 1), (1 << 8, 1), (1 << 16, 2), (1 << 32, 4))


def _offset_widths_above_one(relative: list[int], start: int) -> int:
    """The bytes the offsets `start + r` (r in `relative`, ascending) take beyond one each."""
    extra = 0
    for threshold, step in _WIDTH_STEPS:
        extra += step * (len(relative) - bisect.bisect_left(relative, threshold - start))
    return extra


def read_header(data: bytes, where: str) -> ObjectHeader:
    if len(data) < _PREAMBLE.size:
        raise CorruptData(f"{where}: too short for an L0 object")
    magic, version, length = _PREAMBLE.unpack_from(data)
    if magic != MAGIC:
        raise CorruptData(f"{where}: not an L0 object (magic {magic!r})")
    if version not in READABLE_VERSIONS:
        raise CorruptData(f"{where}: L0 format version {version} is not supported (max {VERSION})")
    try:
        return _header_decoder.decode(data[_PREAMBLE.size : _PREAMBLE.size + length])
    except msgspec.DecodeError as exc:
        raise CorruptData(f"{where}: undecodable header: {exc}") from exc
