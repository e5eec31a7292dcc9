"""The one check every object store applies to a key before touching it.

S3 itself accepts almost any key, but the local store maps keys onto relative file paths, and
all three stores must behave alike (the daemon can switch adapters; the simulation stands in for
S3). So the stricter, path-safe rule holds everywhere: a key that is fine here is fine for every
adapter. Range arguments of `get` are checked here too, for the same reason.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from levelzero.core.errors import InvalidInput
from levelzero.core.names import TEMP_SEGMENT_PREFIX, segment_problem

# S3's own limit on the UTF-8 length of a key.
KEY_BYTES_MAX = 1024
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def check_object_key(key: str) -> str:
    """Return `key` if it is a safe relative object key, else raise InvalidInput naming it."""
    if not isinstance(key, str):
        raise InvalidInput(f"object key must be a string, got {type(key).__name__}: {key!r}")
    if not key:
        raise InvalidInput("object key '' is empty")
    try:
        key_bytes = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInput(f"object key {key!r} is not valid UTF-8 text") from None
    if key_bytes > KEY_BYTES_MAX:
        raise InvalidInput(f"object key {key[:64]!r}... is {key_bytes} bytes; max {KEY_BYTES_MAX}")
    if key.startswith("/"):
        raise InvalidInput(f"object key {key!r} is absolute; keys are relative")
    if key.endswith("/"):
        raise InvalidInput(f"object key {key!r} ends with '/'; that names a directory")
    if "\\" in key:
        raise InvalidInput(f"object key {key!r} contains a backslash")
    if _CONTROL.search(key):
        raise InvalidInput(f"object key {key!r} contains NUL or another control character")
    segments = key.split("/")
    if (
        "" not in segments
        and "." not in segments
        and ".." not in segments
        and (TEMP_SEGMENT_PREFIX not in key)
    ):
        return key  # the common case, decided by C loops (a GC delete checks 1,000 keys)
    for segment in segments:
        problem = segment_problem(segment)  # the one rule the topic names follow too
        if problem is not None:
            raise InvalidInput(f"object key {key!r} has a path segment that {problem}")
    return key


def object_key_problem(key: str) -> str | None:
    """Why no object store can hold `key`, or None: such a key names no object anywhere."""
    try:
        check_object_key(key)
    except InvalidInput as exc:
        return str(exc)
    return None


def check_range(key: str, offset: int, length: int | None) -> None:
    """A byte range must start at >= 0 and have a length >= 0 (None: to the end)."""
    if offset < 0:
        raise InvalidInput(f"get {key!r}: offset {offset} is negative")
    if length is not None and length < 0:
        raise InvalidInput(f"get {key!r}: length {length} is negative")


def check_range_within(key: str, offset: int, size: int) -> None:
    """A range may start anywhere up to the end of the object (then it reads b'')."""
    if offset > size:
        raise InvalidInput(f"get {key!r}: offset {offset} is beyond the end of the object (size {size})")


def slice_range(data: bytes, offset: int, length: int | None) -> bytes:
    """`length` bytes from `offset`, cut short at the end of `data` (like an HTTP Range)."""
    end = len(data) if length is None else min(len(data), offset + length)
    return data[offset:end]


def check_list_limit(limit: int, limit_max: int) -> None:
    if not 1 <= limit <= limit_max:
        raise InvalidInput(f"list limit {limit} is outside 1..{limit_max}")


def check_delete_batch(keys: Sequence[str], keys_max: int) -> list[str]:
    """Validate a delete batch; return its keys without duplicates, in first-seen order."""
    if isinstance(keys, str):
        raise InvalidInput(f"delete_many takes a sequence of keys, not the string {keys!r}")
    if len(keys) > keys_max:
        raise InvalidInput(f"delete_many got {len(keys)} keys; max {keys_max} per request")
    unique = list(dict.fromkeys(keys))
    if _all_plain(unique):
        return unique
    for key in unique:
        check_object_key(key)
    return unique


# A key made of segments that start with a letter, digit, '_' or '-' and go on with those or
# '.', '=', '+': never empty, '.', '..' or the temp prefix, no control character, backslash or
# leading or trailing '/'. Every key levelzero writes is one; `check_object_key` passes it.
_PLAIN_SEGMENT = r"[A-Za-z0-9_\-][A-Za-z0-9_.=+\-]*"
_PLAIN_KEY = rf"{_PLAIN_SEGMENT}(?:/{_PLAIN_SEGMENT})*"
_PLAIN_KEYS = re.compile(rf"{_PLAIN_KEY}(?:\n{_PLAIN_KEY})*")


def _all_plain(keys: list[str]) -> bool:
    """Whether every key is plain ASCII of the shape above and short enough: one regex over
    the joined batch instead of the per-key checks (a GC delete checks 1,000 keys)."""
    if not keys or not all(isinstance(key, str) for key in keys):
        return False
    if max(map(len, keys)) > KEY_BYTES_MAX:
        return False
    joined = "\n".join(keys)
    # A newline inside a key would pass as two plain keys: only the separators may be there.
    return joined.count("\n") == len(keys) - 1 and _PLAIN_KEYS.fullmatch(joined) is not None
