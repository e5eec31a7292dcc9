"""An extent read column by column (`extent_columns`, the data source's batches) gives exactly
the records `decode_extent` gives, or declines (headers, encodings it does not take) so that
the records are decoded one by one; the checksum is checked either way."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from levelzero.core.errors import CorruptData
from levelzero.core.l0format import NO_TIMESTAMP, Record, checksum, decode_extent, encode_extent
from levelzero.export.extent_columns import ExtentColumns, extent_columns
from levelzero.export.spark_source import ObjectRange, read_batch

# Lengths on both sides of the msgpack bin widths (8, 16 and 32-bit lengths) and timestamps of
# every msgpack int width, negative ones included.
binaries = st.none() | st.binary(max_size=20) | st.sampled_from([255, 256, 65_535, 65_536]).map(b"x".__mul__)
timestamps = (
    st.just(NO_TIMESTAMP)
    | st.integers(-(2**63), 2**63 - 1)
    | st.sampled_from(
        [0, 127, 128, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32, -32, -33, -128, -129, 1_700_000_000_123]
    )
)
records_without_headers = st.lists(st.builds(Record, binaries, binaries, timestamps), min_size=1, max_size=30)
# Timestamps a datetime holds (years 1 to 9999), for the batches' TIMESTAMP column.
datetime_millis = st.just(NO_TIMESTAMP) | st.integers(-62_135_596_800_000, 253_402_300_799_999)
records_in_batches = st.lists(st.builds(Record, binaries, binaries, datetime_millis), min_size=1, max_size=30)


def _field(data: bytes, columns: ExtentColumns, name: str) -> list[bytes | None]:
    field = getattr(columns, name)
    return [
        None if null else data[start : start + length]
        for start, length, null in zip(field.start, field.length, field.null, strict=True)
    ]


def _as_decoded(data: bytes, columns: ExtentColumns) -> list[Record]:
    return [
        Record(key, value, int(ts))
        for key, value, ts in zip(
            _field(data, columns, "key"), _field(data, columns, "value"), columns.timestamp_ms, strict=True
        )
    ]


@settings(max_examples=300, deadline=None)
@given(records_without_headers)
def test_columns_are_the_records_decode_extent_gives(records: list[Record]) -> None:
    data = encode_extent(records)
    columns = extent_columns(data, len(records), "test")
    assert columns is not None
    assert len(columns) == len(records)
    assert _as_decoded(data, columns) == decode_extent(data, checksum(data), len(records), "test") == records


def test_version_1_records_have_no_timestamp() -> None:
    class RecordV1(msgspec.Struct, frozen=True, array_like=True):
        key: bytes | None
        value: bytes

    data = msgspec.msgpack.encode([RecordV1(b"k", b"old"), RecordV1(None, b"")])
    columns = extent_columns(data, 2, "old")
    assert columns is not None
    assert _as_decoded(data, columns) == [Record(b"k", b"old"), Record(None, b"")]
    assert columns.timestamp_ms.tolist() == [NO_TIMESTAMP, NO_TIMESTAMP]


@pytest.mark.parametrize(
    "odd",
    [
        Record(b"k", b"v", 5, (("h", b"1"),)),  # headers: decoded record by record
        Record(b"k", b"v", 2**63),  # past int64 (msgspec reads a Python int)
    ],
)
def test_an_extent_with_a_record_of_another_layout_is_left_to_decode_extent(odd: Record) -> None:
    data = encode_extent([Record(None, b"plain", 1), odd, Record(b"k", None)])
    assert extent_columns(data, 3, "test") is None


def test_a_str_where_a_bin_is_is_declined_not_read_as_bytes() -> None:
    data = msgspec.msgpack.encode([[None, "text", -1, []]])
    assert extent_columns(data, 1, "test") is None


def test_an_extent_of_another_count_or_not_msgpack_is_corrupt() -> None:
    data = encode_extent([Record(None, b"a"), Record(None, b"b")])
    with pytest.raises(CorruptData, match="3 records, expected 2|2 records, expected 3"):
        extent_columns(data, 3, "test")
    with pytest.raises(CorruptData, match="undecodable extent"):
        extent_columns(data[:-1], 2, "test")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=records_in_batches, data=st.data())
def test_a_batch_read_by_columns_holds_the_planned_records(
    tmp_path: Path, records: list[Record], data: st.DataObject
) -> None:
    """read_batch of a part of an extent (`first..last`): the records decode_extent gives,
    at their offsets, with TIMESTAMP from milliseconds (null for none)."""
    extent = encode_extent(records)
    (tmp_path / "objects").mkdir(exist_ok=True)
    (tmp_path / "objects" / "x").write_bytes(b"junk" + extent)
    base = 1_000
    first = base + data.draw(st.integers(0, len(records) - 1))
    last = data.draw(st.integers(first, base + len(records) - 1))
    r = ObjectRange("t", 3, "l0", "x", base, first, last, 4, len(extent), len(records), checksum(extent))
    rows = read_batch(str(tmp_path), r).to_pylist()
    expected = records[first - base : last - base + 1]
    assert [row["offset"] for row in rows] == list(range(first, last + 1))
    assert [(row["topic"], row["partition"], row["headers"]) for row in rows] == [("t", 3, [])] * len(
        expected
    )
    assert [(row["key"], row["value"]) for row in rows] == [(rec.key, rec.value) for rec in expected]
    assert [row["timestamp"] for row in rows] == [
        None if rec.timestamp_ms == NO_TIMESTAMP else utc(rec.timestamp_ms) for rec in expected
    ]


def utc(timestamp_ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=timestamp_ms)


@pytest.mark.parametrize("headers", [(), (("h", b"1"),)])
def test_a_flipped_byte_fails_the_batch_with_a_checksum_mismatch(
    tmp_path: Path, headers: tuple[tuple[str, bytes], ...]
) -> None:
    """Read by columns (no headers) or record by record (headers), the extent is checked
    against its checksum first."""
    extent = bytearray(encode_extent([Record(b"k", b"value", 7, headers)] * 3))
    crc = checksum(bytes(extent))
    extent[-3] ^= 0x01  # inside the last record's value or header: still well-formed msgpack
    (tmp_path / "objects").mkdir()
    (tmp_path / "objects" / "x").write_bytes(bytes(extent))
    r = ObjectRange("t", 0, "l0", "x", 0, 0, 2, 0, len(extent), 3, crc)
    with pytest.raises(CorruptData, match="checksum mismatch"):
        read_batch(str(tmp_path), r)
