"""The one name rule: which topic names levelzero accepts, and which key path segments a store
may hold.

A topic name becomes a path segment of its L1 keys (`level_one/{topic}/...`), and the local
store maps keys onto file paths; so a name is accepted only if every object store can hold it.
The API, the CLI, the key builders (`keys.py`) and the object stores' key check
(`storage/keys_check.py`) all ask this module, so an accepted name can always be stored.

A name accepted by an older levelzero may fail today's rule (`.`, `..`, `.lz-tmp-x`): such a
topic still opens, read-only, and says what to do (see `unstorable_topic_advice`).

Two more rules of Kafka's decide whether a *new* topic may take a storable name (the node's
`check_new_topic` asks them for every front end): Kafka's internal topic names are never
ordinary topics (`INTERNAL_TOPICS`), and a name that differs from an existing topic's only in
'.' against '_' collides with it (`colliding_topic`). Topics an older levelzero made under such
names stay, as Kafka keeps colliding topics made before it checked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

TOPIC_NAME_CHARS_MAX = 200
# The local store writes `<dir>/<TEMP_SEGMENT_PREFIX>...` temp files next to their target and
# skips them in listings; a key segment with this prefix could collide with one.
TEMP_SEGMENT_PREFIX = ".lz-tmp-"
_TOPIC_CHARS = re.compile(r"[A-Za-z0-9._-]{1,%d}" % TOPIC_NAME_CHARS_MAX, re.ASCII)
TOPIC_NAME_RULE = (
    f"1-{TOPIC_NAME_CHARS_MAX} characters of letters, digits, '.', '_' or '-', not made of "
    f"dots only, not starting with {TEMP_SEGMENT_PREFIX!r}"
)


def segment_problem(segment: str) -> str | None:
    """Why `segment` cannot be one `/`-separated segment of an object key, or None if it can."""
    if segment == "":
        return "is empty"
    if segment in (".", ".."):
        return f"is {segment!r}, which a file path resolves"
    if segment.startswith(TEMP_SEGMENT_PREFIX):
        return f"starts with the local store's reserved temp-file prefix {TEMP_SEGMENT_PREFIX!r}"
    return None


def topic_name_problem(name: object) -> str | None:
    """Why `name` is not an acceptable topic name, or None if it is."""
    if not isinstance(name, str):
        return f"must be a string, not {type(name).__name__}"
    if not _TOPIC_CHARS.fullmatch(name):
        return f"must be {TOPIC_NAME_RULE}"
    if name.strip(".") == "":
        return "must not be made of dots only (it would be a '.' or '..' path in a key)"
    return segment_problem(name)


# Kafka's internal topics (its `Topic`): the groups' committed offsets, the transaction
# coordinator's state, the share groups' state, and the controllers' metadata log. levelzero
# keeps offsets and transactions in its control plane, not in topics: a topic of one of these
# names would be an ordinary log that clients and tools read as Kafka's internal one.
INTERNAL_TOPICS = frozenset(
    {"__consumer_offsets", "__transaction_state", "__share_group_state", "__cluster_metadata"}
)


def collision_key(name: str) -> str:
    """The name with '.' and '_' made one character, as they are in Kafka's metric names
    (Kafka's `Topic.unifyCollisionChars`)."""
    return name.replace(".", "_")


def colliding_topic(name: str, existing: Iterable[str]) -> str | None:
    """A topic of `existing`, other than `name` itself, that `name` collides with (the same
    but for '.' against '_'), or None: Kafka refuses to create a topic that collides."""
    key = collision_key(name)
    return min((t for t in existing if t != name and collision_key(t) == key), default=None)


def is_topic_name(name: object) -> bool:
    return topic_name_problem(name) is None


def unstorable_topic_advice(topic: str, problem: str) -> str:
    """What an operator does about a topic an older levelzero accepted and today's rule refuses."""
    return (
        f"topic {topic!r} cannot be stored: its name {problem}. It stays readable but takes no "
        "new records, and its unreconciled data can never move to L1, which holds M (and so "
        "the GC) back for the whole cluster. Read what you need from it, then release each "
        f"partition with `levelzero partition abandon-unreconciled {topic}/P --confirm` "
        "(see docs/operating.md, 'A partition that cannot be reconciled')"
    )
