"""Object key layout. Keys are the only index the GC has, so parsing is strict.

L0: `level_zero/data/{prefix:03}/{epoch:018}/{uuid}` — a random 3-digit prefix spreads load;
inside a prefix keys sort by epoch, which lets the GC stop a prefix at the first epoch above M.
L1: `level_one/{topic}/{partition}/{base:020}-{last:020}/{term}-{uuid}`.
Topic records: `levelzero/topics/{topic}` — a topic's partition count, written when it is
created, so a control plane lost entirely can be rebuilt from the bucket (`daemon/recover.py`);
outside `level_zero/` and `level_one/`, never the GC's.
Partition ends: `levelzero/ends/{topic}/{partition}/{end:020}` — empty objects, where a partition
that retention or DeleteRecords emptied ended (its L1 objects, which said so, are gone). Only
ever added by the partition's leader, the lower ones deleted after: no read-modify-write, so
no two writers (partitions of one topic emptied at once, a deposed leader) lose an end; a
recovery takes the highest.
Restore marks: `levelzero/restores/{topic}/{partition}/{term:020}-{high_watermark:020}[-{created:020}]`
— empty objects a restore of an older backup writes for a partition whose bucket holds L1 objects
of the discarded history reaching its restored high watermark: from that term on, the partition's
history is the restored one (`core/adoption.py`, `restored_history`). Only ever added (several
restores, several marks, each applying); removed with the topic. `created`: the topic record's
`created_at` (microseconds) when the mark was written, which names the topic's incarnation: a
mark its topic's deletion failed to remove applies neither to a topic made again with the name
nor where the record is gone (marks without it, an earlier release's or of a topic that had no
record, apply to whatever topic has the name).
"""

from __future__ import annotations

import re
import uuid as uuid_mod
from dataclasses import dataclass
from typing import NamedTuple

import msgspec

from .errors import MalformedKey
from .names import TOPIC_NAME_CHARS_MAX, topic_name_problem

L0_ROOT = "level_zero/data/"
L1_ROOT = "level_one/"
TOPICS_ROOT = "levelzero/topics/"
ENDS_ROOT = "levelzero/ends/"
RESTORES_ROOT = "levelzero/restores/"
PREFIX_COUNT = 1000
EPOCH_DIGITS = 18
EPOCH_MAX = 10**EPOCH_DIGITS - 1

# `\Z`, not `$` (which also matches before a trailing newline); ASCII, so `\d` is only 0-9.
_L0_RE = re.compile(r"^level_zero/data/(\d{3})/(\d{18})/([0-9a-f]{32})\Z", re.ASCII)
_END_RE = re.compile(
    r"^levelzero/ends/([A-Za-z0-9._-]{1,%d})/(\d+)/(\d{20})\Z" % TOPIC_NAME_CHARS_MAX, re.ASCII
)
_RESTORE_RE = re.compile(
    r"^levelzero/restores/([A-Za-z0-9._-]{1,%d})/(\d+)/(\d{20})-(\d{20})(?:-(\d{20}))?\Z"
    % TOPIC_NAME_CHARS_MAX,
    re.ASCII,
)
_L1_RE = re.compile(
    r"^level_one/([A-Za-z0-9._-]{1,%d})/(\d+)/(\d{20})-(\d{20})/(\d+)-([0-9a-f]{32})\Z"
    % TOPIC_NAME_CHARS_MAX,
    re.ASCII,
)


@dataclass(frozen=True, slots=True)
class L0Key:
    prefix: int
    epoch: int
    uuid: str

    def __str__(self) -> str:
        return f"{L0_ROOT}{self.prefix:03d}/{self.epoch:018d}/{self.uuid}"


@dataclass(frozen=True, slots=True)
class L1Key:
    topic: str
    partition: int
    base_offset: int
    last_offset: int
    term: int
    uuid: str

    def __str__(self) -> str:
        return (
            f"{L1_ROOT}{self.topic}/{self.partition}/"
            f"{self.base_offset:020d}-{self.last_offset:020d}/{self.term}-{self.uuid}"
        )


def new_uuid(rand_bits: int | None = None) -> str:
    """A 32-hex-digit id; pass `rand_bits` (a 128-bit int) for deterministic simulation."""
    if rand_bits is None:
        return uuid_mod.uuid4().hex
    return f"{rand_bits & ((1 << 128) - 1):032x}"


def l0_prefix_root(prefix: int) -> str:
    assert 0 <= prefix < PREFIX_COUNT, prefix
    return f"{L0_ROOT}{prefix:03d}/"


def format_l0_key(prefix: int, epoch: int, uuid: str) -> str:
    if not 0 <= prefix < PREFIX_COUNT:
        raise MalformedKey(f"L0 prefix {prefix} is outside 000-999")
    if not 1 <= epoch <= EPOCH_MAX:
        raise MalformedKey(f"L0 epoch {epoch} is outside 1..{EPOCH_MAX}")
    key = str(L0Key(prefix, epoch, uuid))
    if not _L0_RE.match(key):
        raise MalformedKey(f"L0 uuid {uuid!r} must be 32 lowercase hex digits")
    return key


def parse_l0_key(key: str) -> L0Key:
    m = _L0_RE.match(key)
    if m is None:
        raise MalformedKey(f"not an L0 key: {key!r} (expected level_zero/data/PPP/EEEEEEEEEEEEEEEEEE/UUID32)")
    epoch = int(m.group(2))
    if epoch < 1:
        raise MalformedKey(f"L0 key {key!r} has epoch 0; epochs start at 1")
    return L0Key(int(m.group(1)), epoch, m.group(3))


def l0_key_epoch(key: str) -> int:
    """`parse_l0_key(key).epoch`, the same checks, without building the key (the GC reads the
    epoch of every catalog row it deletes)."""
    m = _L0_RE.match(key)
    epoch = 0 if m is None else int(m.group(2))
    if epoch < 1:
        parse_l0_key(key)  # raises, with its message
    return epoch


def format_l1_key(
    topic: str, partition: int, base_offset: int, last_offset: int, term: int, uuid: str
) -> str:
    problem = topic_name_problem(topic)
    if problem is not None:
        raise MalformedKey(f"topic name {topic!r} cannot be part of a key: it {problem}")
    if not 0 <= base_offset <= last_offset:
        raise MalformedKey(f"L1 range {base_offset}-{last_offset} is empty or negative")
    key = str(L1Key(topic, partition, base_offset, last_offset, term, uuid))
    if not _L1_RE.match(key):
        raise MalformedKey(f"bad L1 key {key!r}")
    return key


def l1_partition_prefix(topic: str, partition: int) -> str:
    """The key prefix of every L1 object of one partition (and of no other partition's)."""
    problem = topic_name_problem(topic)
    if problem is not None:
        raise MalformedKey(f"topic name {topic!r} cannot be part of a key: it {problem}")
    return f"{L1_ROOT}{topic}/{partition}/"


def parse_l1_key(key: str) -> L1Key:
    m = _L1_RE.match(key)
    if m is None or topic_name_problem(m.group(1)) is not None:
        raise MalformedKey(f"not an L1 key: {key!r}")
    return L1Key(m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)), m.group(6))


def topic_ends_prefix(topic: str) -> str:
    """The key prefix of every partition end of `topic` (and of no other topic's)."""
    problem = topic_name_problem(topic)
    if problem is not None:
        raise MalformedKey(f"topic name {topic!r} cannot be part of a key: it {problem}")
    return f"{ENDS_ROOT}{topic}/"


def partition_ends_prefix(topic: str, partition: int) -> str:
    assert partition >= 0, partition
    return f"{topic_ends_prefix(topic)}{partition}/"


def format_end_key(topic: str, partition: int, end: int) -> str:
    """The key saying partition `topic`/`partition` was emptied at `end` (its keys sort by end)."""
    assert 0 < end < 10**20, end
    return f"{partition_ends_prefix(topic, partition)}{end:020d}"


def parse_end_key(key: str) -> tuple[str, int, int]:
    """(topic, partition, end) of a partition end's key; MalformedKey if it is not one."""
    m = _END_RE.match(key)
    if m is None or topic_name_problem(m.group(1)) is not None:
        raise MalformedKey(f"not a partition end's key: {key!r}")
    return m.group(1), int(m.group(2)), int(m.group(3))


def topic_restores_prefix(topic: str) -> str:
    """The key prefix of every restore mark of `topic` (and of no other topic's)."""
    problem = topic_name_problem(topic)
    if problem is not None:
        raise MalformedKey(f"topic name {topic!r} cannot be part of a key: it {problem}")
    return f"{RESTORES_ROOT}{topic}/"


class RestoreMark(NamedTuple):
    """What a restore mark's key says (`format_restore_key`)."""

    topic: str
    partition: int
    term: int
    high_watermark: int
    # The topic record's `created_at` in microseconds (`topic_incarnation`) when the mark was
    # written; None: no record then (or an earlier release's mark).
    topic_created: int | None


def topic_incarnation(created_at: float) -> int:
    """A topic record's `created_at` as a restore mark names it (microseconds)."""
    stamp = round(created_at * 1_000_000)
    assert 0 <= stamp < 10**20, created_at
    return stamp


def format_restore_key(
    topic: str, partition: int, term: int, high_watermark: int, topic_created: int | None = None
) -> str:
    """The key saying partition `topic`/`partition` was restored to `high_watermark`, its
    restored history writing from `term` on (its keys sort by term), for the topic whose
    record was created at `topic_created` (`topic_incarnation`; None: any)."""
    assert partition >= 0 and 0 < term < 10**20 and 0 <= high_watermark < 10**20, (term, high_watermark)
    assert topic_created is None or 0 <= topic_created < 10**20, topic_created
    created = "" if topic_created is None else f"-{topic_created:020d}"
    return f"{topic_restores_prefix(topic)}{partition}/{term:020d}-{high_watermark:020d}{created}"


def parse_restore_key(key: str) -> RestoreMark:
    """What a restore mark's key says; MalformedKey if it is not one."""
    m = _RESTORE_RE.match(key)
    if m is None or topic_name_problem(m.group(1)) is not None or int(m.group(3)) < 1:
        raise MalformedKey(f"not a restore mark's key: {key!r}")
    created = None if m.group(5) is None else int(m.group(5))
    return RestoreMark(m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)), created)


class TopicRecord(msgspec.Struct, frozen=True):
    """What the bucket keeps of a topic (JSON at `topic_record_key`): its partition count and
    its topic configs as set (rewritten when they change; none in a record of an earlier
    release)."""

    topic: str
    partitions: int
    created_at: float
    configs: dict[str, str] = msgspec.field(default_factory=dict)
    # partition -> the offset its next record takes, when retention or DeleteRecords left it
    # without records: written by one release only (two partitions emptied at once could lose
    # one's end); read still, kept when the record is written again. Now `format_end_key`.
    ends: dict[int, int] = msgspec.field(default_factory=dict)


_topic_record_decoder = msgspec.json.Decoder(TopicRecord)


def topic_record_key(topic: str) -> str:
    problem = topic_name_problem(topic)
    if problem is not None:
        raise MalformedKey(f"topic name {topic!r} cannot be part of a key: it {problem}")
    return f"{TOPICS_ROOT}{topic}"


def encode_topic_record(record: TopicRecord) -> bytes:
    assert record.partitions >= 1 and topic_name_problem(record.topic) is None, record
    return msgspec.json.encode(record)


def decode_topic_record(key: str, data: bytes) -> TopicRecord:
    """The record at `key`; MalformedKey if it is not one (a key or body another tool wrote)."""
    try:
        record = _topic_record_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise MalformedKey(f"{key}: not a topic record ({exc})") from None
    if (
        key != f"{TOPICS_ROOT}{record.topic}"
        or record.partitions < 1
        or topic_name_problem(record.topic)
        or any(not 0 <= p < record.partitions or end < 0 for p, end in record.ends.items())
    ):
        raise MalformedKey(
            f"{key}: not a topic record (topic {record.topic!r}, {record.partitions} partitions)"
        )
    return record
