"""The one size rule of a produce request, for every door (HTTP, Kafka) and the batcher.

A request's size is what its records carry: for each record its value, its key, every header's
name (UTF-8) and value, plus `RECORD_OVERHEAD_BYTES`. One request may hold at most
`batcher.batch_bytes_max` bytes by this rule. The batcher applies it to every request it is
given, so both doors answer alike (413 `too_large`, Kafka `MESSAGE_TOO_LARGE`); the Kafka door
also sizes each record set by it to pack several into one request. A topic's
`max.message.bytes` (`core.topic_configs`) bounds one request's records by the same rule, in
the produce intake. A client can work the rule
out from its own records, which it could not do for the encoded size (msgpack framing varies
with each field's length and a timestamp's magnitude).

Sizes add up: the size of records joined into one request is the sum of their sizes.
"""

from __future__ import annotations

from collections.abc import Sequence

from .errors import TooLarge
from .l0format import Record, is_stored_value

RECORD_OVERHEAD_BYTES = 8
# An extent's encoded length (`l0format.encode_extent`) plus this many bytes per record is at
# least the records' size by the rule: a record's msgpack encoding is at most this much shorter
# than its size (a null key and a null value: 5 bytes of framing against the rule's 8; an empty
# value 6; with a key one more; each header adds at least its name and value). So a request
# whose encoded length passes with this allowance passes the rule without adding its records up
# one by one.
ENCODED_SHORTFALL_PER_RECORD_MAX = 3


def record_size(record: Record) -> int:
    """One record's size by the rule (a null value counts as empty)."""
    value = record.value
    assert is_stored_value(value) and is_stored_value(record.key), record
    size = RECORD_OVERHEAD_BYTES if value is None else len(value) + RECORD_OVERHEAD_BYTES
    if record.key is not None:
        size += len(record.key)
    for name, value in record.headers:
        size += len(name.encode()) + (0 if value is None else len(value))
    return size


def produce_size(records: Sequence[Record]) -> int:
    """The size of a produce request's records by the rule."""
    return sum(map(record_size, records))


def check_produce_size(
    records: Sequence[Record],
    limit: int,
    *,
    encoded_bytes: int | None = None,
    limit_name: str = "batch_bytes_max",
) -> int | None:
    """Raise `TooLarge` when `records` are over `limit` by the rule. With `encoded_bytes` (the
    length of their encoded extent) a request well inside the limit passes without its records
    being added up, and None is returned; else their size by the rule."""
    assert limit >= 0, limit
    assert records, "a produce request holds at least one record"
    if encoded_bytes is not None:
        assert encoded_bytes >= len(records), (encoded_bytes, len(records))
        if encoded_bytes + ENCODED_SHORTFALL_PER_RECORD_MAX * len(records) <= limit:
            return None
    size = produce_size(records)
    if size > limit:
        raise TooLarge(size, limit, limit_name, len(records))
    return size
