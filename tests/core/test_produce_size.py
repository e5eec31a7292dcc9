"""The one size rule of a produce request (value + key + header names and values + 8 per
record), and the encoded-length shortcut the batcher takes: it never lets through what the rule
refuses."""

from __future__ import annotations

import random

import pytest

from levelzero.core.errors import TooLarge
from levelzero.core.l0format import NO_TIMESTAMP, Record, encode_extent
from levelzero.core.produce_size import (
    ENCODED_SHORTFALL_PER_RECORD_MAX,
    RECORD_OVERHEAD_BYTES,
    check_produce_size,
    produce_size,
    record_size,
)


def test_a_record_counts_its_value_key_header_names_and_values_and_8_bytes():
    assert RECORD_OVERHEAD_BYTES == 8
    assert record_size(Record(None, b"")) == 8
    assert record_size(Record(b"k", None)) == 9  # a null value (a tombstone) counts as empty
    assert record_size(Record(b"", b"abc")) == 11
    assert record_size(Record(b"key", b"value", 1_700_000_000_000)) == 16  # a timestamp is free
    headers = (("trace", b"t1"), ("n", None), ("é", b""))  # "é" is 2 bytes of UTF-8
    assert record_size(Record(b"k", b"v", NO_TIMESTAMP, headers)) == 1 + 1 + 7 + 1 + 2 + 8
    assert produce_size([Record(None, b"x" * 10)] * 3) == 3 * 18


def test_at_the_limit_passes_and_one_byte_over_is_too_large():
    records = [Record(b"k" * 100, b"v" * 900, 1_700_000_000_000, (("h", b"xyz"),))]
    assert produce_size(records) == 1012
    assert check_produce_size(records, 1012) == 1012
    with pytest.raises(TooLarge) as err:
        check_produce_size(records, 1011)
    assert (err.value.code, err.value.size, err.value.limit) == ("too_large", 1012, 1011)
    assert "1012 record bytes exceed batch_bytes_max 1011" in str(err.value)
    # The encoded length (larger here: framing, a 9-byte timestamp) does not change the answer.
    encoded = len(encode_extent(records))
    assert encoded > 1012
    assert check_produce_size(records, 1012, encoded_bytes=encoded) == 1012
    with pytest.raises(TooLarge):
        check_produce_size(records, 1011, encoded_bytes=encoded)


def test_the_encoded_length_with_its_allowance_never_undercounts_the_rule():
    """The batcher's shortcut: `encoded + 3 per record <= limit` implies `size <= limit`.
    Shapes around msgpack's width thresholds, null and empty keys, values and headers."""
    rng = random.Random(31)
    lengths = [0, 1, 15, 31, 32, 255, 256, 65_535, 65_536]
    tightest = None
    for _ in range(400):
        records = []
        for _ in range(rng.choice([1, 2, 5, 16, 17])):
            key = None if rng.random() < 0.4 else rng.randbytes(rng.choice(lengths[:7]))
            value = (
                None
                if rng.random() < 0.2
                else rng.randbytes(rng.choice(lengths if rng.random() < 0.1 else lengths[:7]))
            )
            stamp = rng.choice([NO_TIMESTAMP, 0, 127, 1_700_000_000_000])
            headers = tuple(
                (
                    rng.choice(["", "h", "é" * 20]),
                    None if rng.random() < 0.5 else rng.randbytes(rng.choice(lengths[:4])),
                )
                for _ in range(rng.choice([0, 0, 1, 3]))
            )
            records.append(Record(key, value, stamp, headers))
        encoded = len(encode_extent(records))
        slack = encoded + ENCODED_SHORTFALL_PER_RECORD_MAX * len(records) - produce_size(records)
        assert slack >= 1, records
        tightest = slack if tightest is None else min(tightest, slack)
    # The bound is tight: null keys and null values leave one byte (the array's own header).
    smallest = [Record(None, None)] * 5
    assert len(encode_extent(smallest)) + 3 * 5 - produce_size(smallest) == 1
    empty = [Record(None, b"")] * 5  # an empty value takes one byte more than a null one
    assert len(encode_extent(empty)) == len(encode_extent(smallest)) + 5
    assert tightest is not None and tightest >= 1
