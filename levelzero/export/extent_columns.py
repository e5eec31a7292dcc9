"""An L0 or L1 extent's records as columns, found in its bytes in one vectorised pass: where
each key and value lies in the extent, whether it is null, each timestamp. No Python object is
made per key or value; the data source gathers the bytes it needs straight from the extent into
Arrow columns (`spark_source.read_batch`).

Why: `l0format.decode_extent` makes a `Record` and two `bytes` per record, which Arrow then
copies again into its columns. For the data source's Python workers that was most of a scan's
decoding (400,000 records of 512 B: 0.18 s in one warm process, more in a worker whose memory
comes and goes with each task).

The layout (l0format): a msgpack array of records, each an array of [key, value] (version 1) or
[key, value, timestamp_ms, headers] (version 2); a key or value is a bin (8, 16 or 32-bit
length) or nil, a timestamp any msgpack int. msgspec finds where each record starts (a `Raw`
per record, no copy); numpy reads each record's fields at once across all records. Records
with headers, and any other encoding (a timestamp past int64, a str where a bin is), are left
to `decode_extent` (`extent_columns` returns None): the records that carry headers need their
pairs, and Kafka transactions' markers are among them. The caller checks the extent's checksum
first, as `decode_extent` does; every record taken here is checked to end exactly where the
next begins.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np
import numpy.typing as npt

from levelzero.core.errors import CorruptData
from levelzero.core.l0format import NO_TIMESTAMP

Positions = npt.NDArray[np.int64]
Flags = npt.NDArray[np.bool_]

_RECORDS = msgspec.msgpack.Decoder(list[msgspec.Raw])
_NIL = 0xC0
_BIN_HEADERS = ((0xC4, 1), (0xC5, 2), (0xC6, 4))  # (tag, bytes of the length after it)
_EMPTY_ARRAY = 0x90
_VERSION_1_RECORD = 0x92  # [key, value]
_VERSION_2_RECORD = 0x94  # [key, value, timestamp_ms, headers]


@dataclass(frozen=True, slots=True)
class Field:
    """A key or value of each record: its bytes `start[i]:start[i] + length[i]` of the extent,
    or null (`null[i]`, length 0)."""

    start: Positions
    length: Positions
    null: Flags


@dataclass(frozen=True, slots=True)
class ExtentColumns:
    """The records of one extent, column by column (see the module's docstring)."""

    key: Field
    value: Field
    timestamp_ms: Positions  # NO_TIMESTAMP: none

    def __len__(self) -> int:
        return len(self.timestamp_ms)


def extent_columns(extent: bytes | memoryview, expected_count: int, where: str) -> ExtentColumns | None:
    """The columns of an extent whose checksum the caller has verified; None when some record
    is not of the layout taken here (headers, or another encoding: `decode_extent` reads it).
    An extent that is not a msgpack array of `expected_count` records is corrupt."""
    try:
        records = _RECORDS.decode(extent)
    except msgspec.DecodeError as exc:
        raise CorruptData(f"{where}: undecodable extent: {exc}") from exc
    count = len(records)
    if count != expected_count:
        raise CorruptData(f"{where}: {count} records, expected {expected_count}")
    data = np.frombuffer(extent, np.uint8)
    lengths = np.fromiter(map(len, records), np.int64, count)
    del records
    ends = np.cumsum(lengths)
    ends += len(data) - (int(ends[-1]) if count else 0)  # after the array's own header
    starts = ends - lengths
    if count == 0:
        empty = np.zeros(0, np.int64)
        none = Field(empty, empty, np.zeros(0, np.bool_))
        return ExtentColumns(none, none, empty)
    tags = data[starts]
    version_2 = tags == _VERSION_2_RECORD
    if not (version_2 | (tags == _VERSION_1_RECORD)).all():
        return None
    key = _bin_field(data, starts + 1)
    if key is None:
        return None
    value = _bin_field(data, key.start + key.length)
    if value is None:
        return None
    after_value = value.start + value.length
    timestamps = np.full(count, NO_TIMESTAMP, np.int64)
    record_ends = after_value
    if version_2.any():
        at = after_value[version_2]
        stamped = _ints(data, at)
        if stamped is None:
            return None
        timestamps[version_2], sizes = stamped
        headers_at = at + sizes
        if not (_byte_at(data, headers_at) == _EMPTY_ARRAY).all():
            return None  # some record has headers (or they are not an array)
        record_ends = after_value.copy()
        record_ends[version_2] = headers_at + 1
    if not np.array_equal(record_ends, ends):
        return None  # fields read otherwise than msgspec reads them: not this layout
    return ExtentColumns(key, value, timestamps)


def _byte_at(data: npt.NDArray[np.uint8], at: Positions) -> npt.NDArray[np.uint8]:
    """`data[at]`, positions past the end read as the last byte (a record that ends early reads
    past it; `extent_columns` then finds its end wrong and declines)."""
    return data[np.minimum(at, len(data) - 1)]


def _big_endian(data: npt.NDArray[np.uint8], at: Positions, width: int, signed: bool) -> Positions:
    """The `width`-byte big-endian integers at `at` (their bytes read past the end as the last
    byte: see `_byte_at`)."""
    columns = np.minimum(at[:, None] + np.arange(width), len(data) - 1)
    raw = np.ascontiguousarray(data[columns]).view(f">{'i' if signed else 'u'}{width}").ravel()
    return raw.astype(np.int64)


def _bin_field(data: npt.NDArray[np.uint8], at: Positions) -> Field | None:
    """The bin or nil of each record at `at`; None if any is something else."""
    tags = _byte_at(data, at)
    null = tags == _NIL
    start = at + 1
    length = np.zeros(len(at), np.int64)
    known = null.copy()
    for tag, width in _BIN_HEADERS:
        is_tag = tags == tag
        if is_tag.any():
            length[is_tag] = _big_endian(data, start[is_tag], width, signed=False)
            start[is_tag] += width
            known |= is_tag
    if not known.all():
        return None
    return Field(start, length, null)


# msgpack ints after their tag: (tag, bytes, signed); fixints (0x00-0x7f, 0xe0-0xff) hold the
# value in the tag itself.
_INT_HEADERS = (
    (0xCC, 1, False),
    (0xCD, 2, False),
    (0xCE, 4, False),
    (0xCF, 8, False),
    (0xD0, 1, True),
    (0xD1, 2, True),
    (0xD2, 4, True),
    (0xD3, 8, True),
)


def _ints(data: npt.NDArray[np.uint8], at: Positions) -> tuple[Positions, Positions] | None:
    """The msgpack ints at `at` and the bytes each takes; None if any is not an int or is past
    int64 (msgspec reads it as a Python int; `decode_extent` then takes the extent)."""
    tags = _byte_at(data, at).astype(np.int64)
    values = np.where(tags >= 0xE0, tags - 0x100, tags)
    sizes = np.ones(len(at), np.int64)
    known = (tags <= 0x7F) | (tags >= 0xE0)
    for tag, width, signed in _INT_HEADERS:
        is_tag = tags == tag
        if is_tag.any():
            if tag == 0xCF:  # uint64: only below 2**63 (an int64)
                if (_byte_at(data, at[is_tag] + 1) >= 0x80).any():
                    return None
                signed = True
            values[is_tag] = _big_endian(data, at[is_tag] + 1, width, signed)
            sizes[is_tag] = 1 + width
            known |= is_tag
    if not known.all():
        return None
    return values, sizes
