"""The pure rules that tell an HTTP idempotency key's repeat from its reuse with other records
(core.producers): the records' digest (the key producer's epoch) and the record count."""

from __future__ import annotations

from levelzero.core.l0format import Record
from levelzero.core.producers import (
    KEY_EPOCH_MAX,
    KEY_EPOCH_UNCHECKED,
    key_repeat_differs,
    key_reused,
    request_epoch,
)

RECORDS = [Record(None, b"a"), Record(b"k", b"b", 5, (("h", b"1"), ("n", None)))]


def test_the_digest_of_given_records_never_changes() -> None:
    """Keys are stored under this epoch and kept for days: another digest for the same records
    (a field added to Record, another encoding) would refuse their identical repeats after an
    upgrade."""
    assert request_epoch(RECORDS) == 20737
    assert request_epoch([Record(None, b"a"), Record(None, b"b"), Record(None, b"c")]) == 27143


def test_the_digest_covers_every_part_of_every_record_and_their_order() -> None:
    epoch = request_epoch(RECORDS)
    assert 1 <= epoch <= KEY_EPOCH_MAX and epoch != KEY_EPOCH_UNCHECKED
    assert request_epoch(list(RECORDS)) == epoch
    changed = [
        [RECORDS[0], Record(b"K", b"b", 5, (("h", b"1"), ("n", None)))],  # a key
        [RECORDS[0], Record(b"k", b"B", 5, (("h", b"1"), ("n", None)))],  # a value
        [RECORDS[0], Record(b"k", b"b", 6, (("h", b"1"), ("n", None)))],  # a timestamp
        [RECORDS[0], Record(b"k", b"b", 5, (("h", b"1"), ("n", b"")))],  # a header's value
        [RECORDS[0], Record(b"k", b"b", 5, (("h", b"1"),))],  # a header left out
        [Record(None, None), RECORDS[1]],  # a null value
        [Record(b"", b"a"), RECORDS[1]],  # an empty key is not a null one
        [RECORDS[1], RECORDS[0]],  # the order
        RECORDS[:1],  # the count
    ]
    assert all(request_epoch(other) != epoch for other in changed)


def test_a_key_is_reused_when_stored_at_another_epoch_than_the_requests() -> None:
    assert not key_reused(None, 7)  # not stored: new
    assert not key_reused(7, 7)  # the same records: a repeat
    assert key_reused(8, 7)  # other records
    assert not key_reused(KEY_EPOCH_UNCHECKED, 7)  # no digest kept: compared by count


def test_a_repeat_with_another_record_count_differs() -> None:
    assert not key_repeat_differs(3, 3)
    assert key_repeat_differs(3, 2) and key_repeat_differs(1, 4)
