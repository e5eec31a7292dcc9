"""L0 object format (pure): a versioned header, an extent table, then each partition's extent.

    magic "LZL0" | u8 version | u32 header length | msgpack header | extent bytes ...

The header lists extents (partition id, byte offset, byte length, record count, CRC-32) so an
object can be inspected on its own; the partition log's placeholders carry the same numbers, so
the read path needs only a range read of one extent. Extent bytes are a msgpack array of records.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

import msgspec

from .errors import CorruptData

MAGIC = b"LZL0"
VERSION = 1
_PREAMBLE = struct.Struct(">4sBI")


class Record(msgspec.Struct, frozen=True, array_like=True):
    key: bytes | None
    value: bytes


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


def checksum(data: bytes) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def encode_extent(records: Sequence[Record]) -> bytes:
    assert records, "an extent holds at least one record"
    return _records_encoder.encode(list(records))


def decode_extent(data: bytes, expected_checksum: int, expected_count: int, where: str) -> list[Record]:
    """Verify and decode one extent read back from an L0 or L1 object."""
    actual = checksum(data)
    if actual != expected_checksum:
        raise CorruptData(
            f"{where}: checksum mismatch (expected {expected_checksum:08x}, got {actual:08x})"
        )
    try:
        records = _records_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CorruptData(f"{where}: undecodable extent: {exc}") from exc
    if len(records) != expected_count:
        raise CorruptData(f"{where}: {len(records)} records, expected {expected_count}")
    return records


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
    # The header size depends on the offsets it records; iterate to the fixed point.
    headers: list[ExtentHeader] = []
    header_bytes = b""
    for _ in range(8):
        offset = _PREAMBLE.size + len(header_bytes)
        headers = []
        for (pid, data, count), crc in zip(extents, sums):
            headers.append(ExtentHeader(pid, offset, len(data), count, crc))
            offset += len(data)
        new_header = _records_encoder.encode(ObjectHeader(VERSION, epoch, headers))
        settled = len(new_header) == len(header_bytes)
        header_bytes = new_header
        if settled:
            break
    else:
        raise AssertionError("object header size did not settle")
    assert _PREAMBLE.size + len(header_bytes) == headers[0].byte_offset
    preamble = _PREAMBLE.pack(MAGIC, VERSION, len(header_bytes))
    return b"".join([preamble, header_bytes, *(data for _, data, _ in extents)]), headers


def read_header(data: bytes, where: str) -> ObjectHeader:
    if len(data) < _PREAMBLE.size:
        raise CorruptData(f"{where}: too short for an L0 object")
    magic, version, length = _PREAMBLE.unpack_from(data)
    if magic != MAGIC:
        raise CorruptData(f"{where}: not an L0 object (magic {magic!r})")
    if version != VERSION:
        raise CorruptData(f"{where}: L0 format version {version} is not supported (max {VERSION})")
    try:
        return _header_decoder.decode(data[_PREAMBLE.size : _PREAMBLE.size + length])
    except msgspec.DecodeError as exc:
        raise CorruptData(f"{where}: undecodable header: {exc}") from exc
