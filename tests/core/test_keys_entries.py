"""Object key layout (strict: keys are the GC's only index) and the log entry codec."""

from __future__ import annotations

import random

import msgspec
import pytest

from levelzero.core.entries import (
    ENTRY_KINDS,
    AbandonUnreconciled,
    AdvanceEpoch,
    AdvanceReconciledOffset,
    Entry,
    LogRecord,
    Placeholder,
    SetStartOffset,
    TermStart,
    decode_entry,
    encode_entry,
)
from levelzero.core.errors import LevelZeroError, MalformedKey
from levelzero.core.keys import (
    EPOCH_MAX,
    L0Key,
    L1Key,
    TopicRecord,
    decode_topic_record,
    encode_topic_record,
    format_end_key,
    format_restore_key,
    RestoreMark,
    format_l0_key,
    format_l1_key,
    l0_prefix_root,
    new_uuid,
    l0_key_epoch,
    parse_end_key,
    parse_restore_key,
    topic_incarnation,
    parse_l0_key,
    parse_l1_key,
    topic_ends_prefix,
    topic_restores_prefix,
    topic_record_key,
)

UUID = "0123456789abcdef0123456789abcdef"
GOOD_L0 = f"level_zero/data/042/{7:018d}/{UUID}"
GOOD_L1 = f"level_one/orders/3/{5:020d}-{9:020d}/2-{UUID}"


# ---------------------------------------------------------------- L0 keys


@pytest.mark.parametrize(
    ("prefix", "epoch", "uuid"),
    [(0, 1, UUID), (999, EPOCH_MAX, "f" * 32), (42, 7, UUID), (5, 123456789, new_uuid(1))],
)
def test_l0_key_round_trip(prefix: int, epoch: int, uuid: str) -> None:
    key = format_l0_key(prefix, epoch, uuid)
    assert key == f"level_zero/data/{prefix:03d}/{epoch:018d}/{uuid}"
    assert key.startswith(l0_prefix_root(prefix))
    parsed = parse_l0_key(key)
    assert parsed == L0Key(prefix, epoch, uuid)
    assert str(parsed) == key
    assert l0_key_epoch(key) == epoch


def test_l0_key_example() -> None:
    assert format_l0_key(42, 7, UUID) == GOOD_L0
    assert l0_prefix_root(7) == "level_zero/data/007/"


@pytest.mark.parametrize(
    "key",
    [
        "",
        "level_zero/data/",
        f"level_zero/data/42/{7:018d}/{UUID}",  # 2-digit prefix
        f"level_zero/data/0042/{7:018d}/{UUID}",  # 4-digit prefix
        f"level_zero/data/042/{7:017d}/{UUID}",  # 17-digit epoch
        f"level_zero/data/042/{7:019d}/{UUID}",  # 19-digit epoch
        f"level_zero/data/04x/{7:018d}/{UUID}",
        f"level_zero/data/042/{7:018d}",  # no uuid
        f"level_zero/data/042/{UUID}",  # no epoch
        f"level_zero/data/042/{0:018d}/{UUID}",  # epoch 0
        f"level_zero/data/042/{7:018d}/{UUID.upper()}",  # uppercase uuid
        f"level_zero/data/042/{7:018d}/{UUID[:-1]}",  # 31 hex digits
        f"level_zero/data/042/{7:018d}/{UUID}/extra",  # extra segment
        f"level_zero/data/042/extra/{7:018d}/{UUID}",
        f"/level_zero/data/042/{7:018d}/{UUID}",
        f"level_zero/data/042/{7:018d}/{UUID}\n",  # `$` would have accepted this
        f"level_zero/data/\u0664\u0662\u0660/{7:018d}/{UUID}",  # non-ASCII digits
        "level_zero/data/042/" + "\u0660" * 17 + "\u0667/" + UUID,  # Arabic-Indic epoch
        f"level_zero/other/042/{7:018d}/{UUID}",
        GOOD_L1,
    ],
)
def test_malformed_l0_key_raises_naming_the_key(key: str) -> None:
    with pytest.raises(MalformedKey) as excinfo:
        parse_l0_key(key)
    assert repr(key) in str(excinfo.value)
    with pytest.raises(MalformedKey) as epoch_only:  # the GC's cheaper reading: the same rule
        l0_key_epoch(key)
    assert str(epoch_only.value) == str(excinfo.value)
    assert excinfo.value.code == "malformed_key"
    assert isinstance(excinfo.value, ValueError)
    assert isinstance(excinfo.value, LevelZeroError)


@pytest.mark.parametrize(
    ("prefix", "epoch", "uuid", "message"),
    [
        (-1, 7, UUID, "prefix -1"),
        (1000, 7, UUID, "prefix 1000"),
        (42, 0, UUID, "epoch 0"),
        (42, EPOCH_MAX + 1, UUID, f"epoch {EPOCH_MAX + 1}"),
        (42, 7, UUID.upper(), "uuid"),
        (42, 7, UUID[:-1], "uuid"),
        (42, 7, UUID + "\n", "uuid"),
        (42, 7, UUID + "/x", "uuid"),
    ],
)
def test_format_l0_key_refuses_out_of_range_parts(prefix: int, epoch: int, uuid: str, message: str) -> None:
    with pytest.raises(MalformedKey, match=message):
        format_l0_key(prefix, epoch, uuid)


def test_l0_keys_sort_by_epoch_inside_a_prefix() -> None:
    rng = random.Random(7)
    parts = [(rng.randrange(1, 10**12), new_uuid(rng.getrandbits(128))) for _ in range(300)]
    parts += [(10, new_uuid(1)), (9, new_uuid(2)), (100, new_uuid(3)), (EPOCH_MAX, new_uuid(4))]
    keys = [format_l0_key(17, epoch, uuid) for epoch, uuid in parts]
    in_key_order = [parse_l0_key(k).epoch for k in sorted(keys)]
    assert in_key_order == sorted(epoch for epoch, _ in parts)


def test_new_uuid_is_32_lowercase_hex_and_deterministic_with_bits() -> None:
    assert new_uuid(255) == "0" * 30 + "ff"
    assert new_uuid((1 << 128) + 5) == new_uuid(5)  # masked to 128 bits
    first, second = new_uuid(), new_uuid()
    assert first != second
    for uuid in (first, second, new_uuid(2**128 - 1)):
        assert len(uuid) == 32
        assert set(uuid) <= set("0123456789abcdef")
        assert parse_l0_key(format_l0_key(1, 1, uuid)).uuid == uuid


# ---------------------------------------------------------------- L1 keys


@pytest.mark.parametrize(
    ("topic", "partition", "base", "last", "term"),
    [("orders", 3, 5, 9, 2), ("a.b-c_D9", 0, 0, 0, 1), ("t" * 200, 12345, 10**19, 10**19, 99)],
)
def test_l1_key_round_trip(topic: str, partition: int, base: int, last: int, term: int) -> None:
    key = format_l1_key(topic, partition, base, last, term, UUID)
    assert key == f"level_one/{topic}/{partition}/{base:020d}-{last:020d}/{term}-{UUID}"
    parsed = parse_l1_key(key)
    assert parsed == L1Key(topic, partition, base, last, term, UUID)
    assert str(parsed) == key


def test_l1_key_example() -> None:
    assert format_l1_key("orders", 3, 5, 9, 2, UUID) == GOOD_L1


@pytest.mark.parametrize(
    "key",
    [
        "",
        "level_one/",
        f"level_one/orders/3/{5:020d}-{9:020d}/{UUID}",  # no term
        f"level_one/orders/3/{5:020d}-{9:020d}/2-",  # no uuid
        f"level_one/orders/3/{5:020d}/2-{UUID}",  # no last offset
        f"level_one/orders/{5:020d}-{9:020d}/2-{UUID}",  # no partition
        f"level_one/orders/3/{5:019d}-{9:020d}/2-{UUID}",  # 19 digits
        f"level_one/orders/3/{5:020d}-{9:020d}/2-{UUID.upper()}",
        f"level_one/orders/3/{5:020d}-{9:020d}/2-{UUID}/extra",
        f"level_one/ord/ers/3/{5:020d}-{9:020d}/2-{UUID}",
        f"level_one/orders/3/{5:020d}-{9:020d}/2-{UUID}\n",
        f"level_one/orders/\u0663/{5:020d}-{9:020d}/2-{UUID}",
        GOOD_L0,
    ],
)
def test_malformed_l1_key_raises_naming_the_key(key: str) -> None:
    with pytest.raises(MalformedKey) as excinfo:
        parse_l1_key(key)
    assert repr(key) in str(excinfo.value)


@pytest.mark.parametrize(
    ("topic", "base", "last", "uuid"),
    [
        ("a/b", 0, 1, UUID),
        ("", 0, 1, UUID),
        ("t" * 201, 0, 1, UUID),
        ("orders\n", 0, 1, UUID),
        ("orders", 5, 4, UUID),
        ("orders", -1, 4, UUID),
        ("orders", 0, 4, UUID.upper()),
    ],
)
def test_format_l1_key_refuses_bad_parts(topic: str, base: int, last: int, uuid: str) -> None:
    with pytest.raises(MalformedKey):
        format_l1_key(topic, 0, base, last, 1, uuid)


def test_l1_keys_sort_by_base_offset_inside_a_partition() -> None:
    bases = [0, 7, 100, 99, 10**15, 3]
    keys = [format_l1_key("t", 1, b, b + 5, 1, UUID) for b in bases]
    assert [parse_l1_key(k).base_offset for k in sorted(keys)] == sorted(bases)


# ---------------------------------------------------------------- entries

ALL_ENTRIES: list[Entry] = [
    Placeholder(
        epoch=7,
        object_key=GOOD_L0,
        byte_offset=128,
        byte_length=4096,
        record_count=12,
        checksum=0xDEADBEEF,
    ),
    AdvanceEpoch(epoch=9),
    AdvanceReconciledOffset(lro=41, lrlo=17),
    SetStartOffset(offset=30),
    TermStart(term=4),
    AbandonUnreconciled(upto=41, lrlo=17, operator="ops@example", reason="objects lost", at=1.5),
]


@pytest.mark.parametrize("entry", ALL_ENTRIES, ids=lambda e: type(e).__name__)
def test_entry_round_trip(entry: Entry) -> None:
    data = encode_entry(entry)
    assert isinstance(data, bytes)
    decoded = decode_entry(data)
    assert decoded == entry
    assert type(decoded) is type(entry)
    # the tag on the wire is the stable kind name
    assert msgspec.msgpack.decode(data)["type"] == ENTRY_KINDS[type(entry)]


def test_every_entry_kind_has_a_distinct_name() -> None:
    assert set(ENTRY_KINDS) == {type(e) for e in ALL_ENTRIES}
    assert sorted(ENTRY_KINDS.values()) == [
        "abandon_unreconciled",
        "advance_epoch",
        "advance_reconciled_offset",
        "placeholder",
        "set_start_offset",
        "term_start",
    ]


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"", msgspec.DecodeError),
        (b"\xc1", msgspec.DecodeError),
        (b"\x92\x01", msgspec.DecodeError),  # truncated array
        (b"garbage bytes", msgspec.DecodeError),
        (msgspec.msgpack.encode({"type": "nope", "epoch": 1}), msgspec.ValidationError),
        (msgspec.msgpack.encode({"epoch": 1}), msgspec.ValidationError),  # no tag
        (msgspec.msgpack.encode({"type": "advance_epoch", "epoch": "1"}), msgspec.ValidationError),
        (msgspec.msgpack.encode({"type": "placeholder", "epoch": 1}), msgspec.ValidationError),
        (msgspec.msgpack.encode([1, 2, 3]), msgspec.ValidationError),
    ],
)
def test_garbage_bytes_raise_msgspec_errors(data: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        decode_entry(data)


def test_entries_are_frozen() -> None:
    entry = AdvanceEpoch(3)
    with pytest.raises(AttributeError):
        entry.epoch = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    ("entry", "kind", "epoch"),
    [
        (ALL_ENTRIES[0], "placeholder", 7),
        (ALL_ENTRIES[1], "advance_epoch", 9),
        (ALL_ENTRIES[2], "advance_reconciled_offset", None),
        (ALL_ENTRIES[3], "set_start_offset", None),
        (ALL_ENTRIES[4], "term_start", None),
    ],
)
def test_log_record_kind_and_epoch(entry: Entry, kind: str, epoch: int | None) -> None:
    record = LogRecord(log_offset=5, term=4, base_offset=30, entry=entry)
    assert record.kind == kind
    assert record.epoch == epoch


def test_log_record_round_trips_through_msgpack() -> None:
    records = [LogRecord(i, 1, 0, e) for i, e in enumerate(ALL_ENTRIES)]
    data = msgspec.msgpack.encode(records)
    assert msgspec.msgpack.decode(data, type=list[LogRecord]) == records


def test_topic_records_round_trip_and_refuse_what_is_not_one() -> None:
    key = topic_record_key("orders")
    assert key == "levelzero/topics/orders"
    record = TopicRecord("orders", 3, 1.5)
    assert decode_topic_record(key, encode_topic_record(record)) == record
    for bad_key, body in [
        (key, b"not json"),
        (key, b'{"topic": "other", "partitions": 3, "created_at": 1.0}'),  # another topic's
        (key, b'{"topic": "orders", "partitions": 0, "created_at": 1.0}'),
        ("levelzero/topics/..", b'{"topic": "..", "partitions": 1, "created_at": 1.0}'),
    ]:
        with pytest.raises(MalformedKey):
            decode_topic_record(bad_key, body)
    with pytest.raises(MalformedKey):
        topic_record_key("..")


def test_restore_mark_keys_sort_by_term_and_refuse_what_is_not_one() -> None:
    key = format_restore_key("a.b", 7, 12, 340)
    assert key == "levelzero/restores/a.b/7/00000000000000000012-00000000000000000340"
    assert parse_restore_key(key) == ("a.b", 7, 12, 340, None)  # an earlier release's
    created = topic_incarnation(1_764_000_000.123456)
    assert created == 1_764_000_000_123_456
    stamped = format_restore_key("a.b", 7, 12, 340, created)
    assert stamped == key + "-00001764000000123456"
    assert parse_restore_key(stamped) == RestoreMark("a.b", 7, 12, 340, created)
    assert format_restore_key("a", 7, 9, 99) < format_restore_key("a", 7, 10, 1)
    assert not format_restore_key("a.b", 0, 1, 0).startswith(topic_restores_prefix("a"))
    for bad in [
        "levelzero/restores/../0/" + "0" * 19 + "1-" + "0" * 20,
        "levelzero/restores/a/0/" + "0" * 20 + "-" + "0" * 20,  # term 0
        "levelzero/restores/a/0/" + "0" * 19 + "1",
        "levelzero/restores/a/0/" + "0" * 19 + "1-" + "0" * 20 + "-12",  # a short creation
        "levelzero/ends/a/0/" + "0" * 19 + "1-" + "0" * 20,
    ]:
        with pytest.raises(MalformedKey):
            parse_restore_key(bad)
    with pytest.raises(MalformedKey):
        format_restore_key("..", 0, 1, 0)


def test_partition_end_keys_sort_by_end_and_refuse_what_is_not_one() -> None:
    key = format_end_key("a.b", 7, 12)
    assert key == "levelzero/ends/a.b/7/00000000000000000012"
    assert parse_end_key(key) == ("a.b", 7, 12)
    assert format_end_key("a", 7, 9) < format_end_key("a", 7, 10) < format_end_key("a", 8, 1)
    assert not format_end_key("a.b", 0, 1).startswith(topic_ends_prefix("a"))
    for bad in [
        "levelzero/ends/../0/00000000000000000001",
        "levelzero/ends/a/0/12",
        "levelzero/ends/a/x/" + "0" * 20,
    ]:
        with pytest.raises(MalformedKey):
            parse_end_key(bad)
    with pytest.raises(MalformedKey):
        format_end_key("..", 0, 1)
