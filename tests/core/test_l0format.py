"""The L0 object format: `EncodedExtents` + `finish_object` (the batcher's path, one copy of the
bytes) lay out exactly what `build_object` does, and what they lay out reads back."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from levelzero.core import l0format
from levelzero.core.errors import CorruptData
from levelzero.core.l0format import (
    _PREAMBLE,
    MAGIC,
    VERSION,
    EncodedExtents,
    ExtentHeader,
    ObjectHeader,
    Record,
    _object_front,
    build_object,
    checksum,
    decode_extent,
    encode_extent,
    encoded_length,
    finish_object,
    read_header,
    records_match_extent,
)

records_strategy = st.lists(
    st.builds(Record, st.none() | st.binary(max_size=20), st.none() | st.binary(max_size=200)),
    min_size=1,
    max_size=20,
)
extents_strategy = st.lists(st.tuples(st.integers(0, 2**62), records_strategy), min_size=1, max_size=40)


def _as_parts(extents: list[tuple[int, list[Record]]]) -> list[tuple[int, list[tuple[Record, ...]]]]:
    """Each extent's records in parts of up to three records (as requests would be)."""
    return [(pid, [tuple(records[i : i + 3]) for i in range(0, len(records), 3)]) for pid, records in extents]


@pytest.mark.parametrize(
    "counts", [[1], [15], [1, 14], [15, 1], [8, 8], [65_535], [65_535, 1], [40_000, 40_000]]
)
def test_an_extent_joined_from_parts_is_the_encoding_of_all_their_records(
    counts: list[int],
) -> None:
    """Requests are kept as they come; an extent of several is one msgpack array of all their
    records, whose header changes form at 16 and 65,536 items."""
    parts = [[Record(None, bytes([n % 251])) for _ in range(count)] for n, count in enumerate(counts)]
    records = [record for part in parts for record in part]
    encoded = EncodedExtents([(7, parts)])
    data, headers = finish_object(3, encoded)
    [extent] = headers
    raw = bytes(data[extent.byte_offset : extent.byte_offset + extent.byte_length])
    assert raw == encode_extent(records)
    assert decode_extent(raw, extent.checksum, len(records), "test") == records


@settings(max_examples=100, deadline=None)
@given(requests=st.lists(records_strategy, min_size=1, max_size=10))
def test_the_encoded_length_measured_in_a_reused_scratch_buffer_is_the_encodings(requests) -> None:
    """The batcher measures each request in one scratch buffer, larger and smaller ones in
    turn: every length is that of the request's own encoding."""
    scratch = bytearray()
    for records in requests:
        assert encoded_length(tuple(records), scratch) == len(encode_extent(records))
    big = (Record(None, b"x" * 100_000),)
    assert encoded_length(big, scratch) == len(encode_extent(big))
    assert encoded_length((Record(None, b""),), scratch) == len(encode_extent([Record(None, b"")]))


def test_records_that_cannot_be_encoded_fail_their_measure_as_their_encoding() -> None:
    bad = (Record(None, object()),)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode_extent(bad)
    with pytest.raises(TypeError):
        encoded_length(bad, bytearray())


@settings(max_examples=150, deadline=None)
@given(epoch=st.integers(1, 2**63 - 1), extents=extents_strategy)
def test_finishing_encoded_extents_lays_out_what_build_object_does(epoch, extents) -> None:
    expected, expected_headers = build_object(
        epoch, [(pid, encode_extent(records), len(records)) for pid, records in extents]
    )
    data, headers = finish_object(epoch, EncodedExtents(_as_parts(extents)))
    assert isinstance(data, bytearray)
    assert bytes(data) == expected
    assert headers == expected_headers


@settings(max_examples=50, deadline=None)
@given(epoch=st.integers(1, 2**63 - 1), extents=extents_strategy)
def test_a_finished_object_reads_back_extent_by_extent(epoch, extents) -> None:
    data, headers = finish_object(epoch, EncodedExtents(_as_parts(extents)))
    header = read_header(bytes(data), "test")
    assert header.epoch == epoch and header.extents == headers
    for (pid, records), extent in zip(extents, headers, strict=True):
        assert extent.pid == pid
        raw = bytes(data[extent.byte_offset : extent.byte_offset + extent.byte_length])
        assert decode_extent(raw, extent.checksum, extent.record_count, "test") == records


def test_the_header_room_holds_a_thousand_extents_of_the_largest_numbers() -> None:
    extents = [(2**63 - 1 - i, [Record(b"k", b"v" * 10)]) for i in range(1024)]
    data, headers = finish_object(2**63 - 1, EncodedExtents(_as_parts(extents)))
    expected, _ = build_object(
        2**63 - 1, [(pid, encode_extent(records), len(records)) for pid, records in extents]
    )
    assert bytes(data) == expected and len(headers) == 1024


def test_encoded_extents_are_used_up_by_finishing() -> None:
    encoded = EncodedExtents(_as_parts([(1, [Record(None, b"x")])]))
    finish_object(1, encoded)
    with pytest.raises(AssertionError):
        finish_object(1, encoded)


def test_a_flipped_byte_in_an_extent_is_corrupt_data() -> None:
    data, (extent,) = finish_object(3, EncodedExtents(_as_parts([(7, [Record(None, b"payload")])])))
    raw = bytearray(data[extent.byte_offset : extent.byte_offset + extent.byte_length])
    raw[-1] ^= 0xFF
    with pytest.raises(CorruptData, match="checksum mismatch"):
        decode_extent(bytes(raw), extent.checksum, extent.record_count, "obj")


def test_format_2_records_carry_timestamps_and_headers_and_format_1_objects_stay_readable() -> None:
    class RecordV1(msgspec.Struct, frozen=True, array_like=True):  # the version-1 record
        key: bytes | None
        value: bytes

    old_extent = msgspec.msgpack.encode([RecordV1(b"k", b"old"), RecordV1(None, b"")])
    old_object, headers = l0format.build_object(3, [(7, old_extent, 2)])
    old_object = bytearray(old_object)
    old_object[4] = 1  # the preamble's version byte: an object written by version 1
    header = l0format.read_header(bytes(old_object), "old")
    assert header.version in (1, 2)
    extent = headers[0]
    data = bytes(old_object[extent.byte_offset : extent.byte_offset + extent.byte_length])
    assert l0format.decode_extent(data, extent.checksum, 2, "old") == [
        l0format.Record(b"k", b"old"),
        l0format.Record(None, b""),
    ]
    assert l0format.Record(b"k", b"old").timestamp_ms == l0format.NO_TIMESTAMP

    new = [
        l0format.Record(b"k", b"v", 1_700_000_000_123, (("h", b"x"), ("n", None))),
        l0format.Record(None, b"plain"),
    ]
    encoded = l0format.encode_extent(new)
    assert l0format.decode_extent(encoded, l0format.checksum(encoded), 2, "new") == new
    # A version-2 record without timestamp or headers costs two bytes more than in version 1.
    assert (
        len(l0format.encode_extent([l0format.Record(None, b"plain")]))
        == len(msgspec.msgpack.encode([RecordV1(None, b"plain")])) + 2
    )


# An object written before null values were kept (format 2, by the previous encoder): records
# (b"k", b""), (None, b"", 1_700_000_000_123, [("h", b""), ("n", None)]), (b"", b"v") in one
# extent of pid 3 at epoch 5. A Kafka tombstone was stored as an empty value then.
FORMAT_2_BEFORE_NULL_VALUES = bytes.fromhex(
    "4c5a4c30020000002483a776657273696f6e02a565706f636805a7657874656e74739195032d2803ce70ff7dc1"
    "9394c4016bc400ff9094c0c400cf0000018bcfe5687b9292a168c40092a16ec094c400c40176ff90"
)


def test_an_object_written_before_null_values_reads_back_with_its_empty_values() -> None:
    header = read_header(FORMAT_2_BEFORE_NULL_VALUES, "old")
    assert (header.version, header.epoch) == (2, 5)
    [extent] = header.extents
    raw = FORMAT_2_BEFORE_NULL_VALUES[extent.byte_offset : extent.byte_offset + extent.byte_length]
    records = decode_extent(raw, extent.checksum, 3, "old")
    assert records == [
        Record(b"k", b""),
        Record(None, b"", 1_700_000_000_123, (("h", b""), ("n", None))),
        Record(b"", b"v"),
    ]
    assert [type(r.value) for r in records] == [bytes, bytes, bytes]  # empty, never None
    # Encoding the decoded records gives the bytes back (L1 verification relies on it).
    assert encode_extent(records) == raw


def test_a_null_value_and_an_empty_value_are_distinct_records() -> None:
    records = [Record(b"k", None), Record(b"k", b""), Record(None, None), Record(b"", b"")]
    assert records[0] != records[1]
    encoded = encode_extent(records)
    decoded = decode_extent(encoded, checksum(encoded), 4, "test")
    assert decoded == records
    assert [r.value for r in decoded] == [None, b"", None, b""]
    assert [r.key for r in decoded] == [b"k", b"k", None, b""]
    assert records_match_extent(decoded, checksum(encoded))
    # A null value read as empty (the old behaviour) would no longer match what was acknowledged.
    assert not records_match_extent([Record(b"k", b"")] + decoded[1:], checksum(encoded))


def test_a_value_that_is_not_bytes_or_none_is_an_invariant_violation() -> None:
    with pytest.raises(AssertionError):
        records_match_extent([Record(b"k", bytearray(b"v"))], 0)  # type: ignore[arg-type]


def _front_by_iteration(epoch: int, shapes: list[tuple[int, int, int]], sums: list[int]) -> bytes:
    """The header laid out the plain way: encode, move the data behind it, encode again, until
    its size stops changing (what `_object_front` computes in two passes)."""

    header = b""
    while True:
        offset = _PREAMBLE.size + len(header)
        headers = []
        for (pid, length, count), crc in zip(shapes, sums, strict=True):
            headers.append(ExtentHeader(pid, offset, length, count, crc))
            offset += length
        new = msgspec.msgpack.encode(ObjectHeader(VERSION, epoch, headers))
        if len(new) == len(header):
            return _PREAMBLE.pack(MAGIC, VERSION, len(new)) + new
        header = new


@pytest.mark.parametrize("extents", [1, 2, 7, 40, 300, 2_000])
@pytest.mark.parametrize("length", [1, 30, 120, 250, 1_000, 40_000, 70_000])
def test_the_header_is_the_fixed_point_of_its_own_size(extents: int, length: int) -> None:
    """Offsets cross msgpack's width thresholds (128, 256, 65,536) as the header grows; the
    counted solution must be the same bytes as iterating encodes to the fixed point."""

    shapes = [(pid, length + pid % 3, 1 + pid % 5) for pid in range(extents)]
    sums = [pid * 7919 % 2**32 for pid in range(extents)]
    front, headers = _object_front(11, shapes, sums)
    assert front == _front_by_iteration(11, shapes, sums)
    assert headers[0].byte_offset == len(front)
