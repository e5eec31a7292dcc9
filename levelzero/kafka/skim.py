"""A request's bytes checked before kio's native reader parses them.

kio's reader (Rust) reserves memory for an array's announced length before it reads a single
element: one request announcing a compact array of 2**32 elements (14 bytes on the wire) made
it ask for tens of GiB, and a failed allocation aborts the process, which no `except` can catch.
Kafka's broker reads element by element and fails on the bytes that are not there. So every
length a request announces (arrays, strings, bytes, records) is checked here against the bytes
left in the frame first, walking the request's schema the way kio's writer does
(`kio.serial._serialize`): an array of n elements takes at least n bytes (n × the smallest
encoding of an element), so a longer announcement is a malformed request (BadRequest: the
connection is closed, as Kafka closes it), never an allocation.

The walk also drops tagged fields the schema does not know (KIP-482: a receiver skips tags it
does not know, and newer clients may send tags an older schema lacks): kio's reader refused
them, and the connection was closed. `skim` returns the frame with them left out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from functools import cache
from typing import Any

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

from levelzero.kafka.records import CorruptBatch
from levelzero.kafka.records import _uvarint  # a 32-bit unsigned varint, at most 5 bytes


class BadRequest(ValueError):
    """A length the frame cannot hold (`protocol.parse_request` closes the connection on it)."""


# An element whose encoding can be empty (a struct of nothing but tags it does not send, in a
# version without tags: none in today's schemas) bounds its array by this count instead.
EMPTY_ELEMENTS_MAX = 65_536

_FIXED = {
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}

# A skimmer reads one value at `pos` of `buf`, within `end`, and returns where it ends; the
# edits it makes (start, end, replacement) go to `edits`, in order.
Edits = list[tuple[int, int, bytes]]
Skimmer = Callable[[bytes, int, int, Edits], int]


def _short(what: str, need: int, pos: int, end: int) -> BadRequest:
    return BadRequest(f"malformed request: {what} of {need} bytes at byte {pos}, {max(0, end - pos)} left")


def _int(buf: bytes, pos: int, end: int, size: int) -> tuple[int, int]:
    if pos + size > end:
        raise _short("an integer", size, pos, end)
    return int.from_bytes(buf[pos : pos + size], "big", signed=True), pos + size


def _fixed(size: int) -> Skimmer:
    def skim(buf: bytes, pos: int, end: int, edits: Edits) -> int:  # noqa: ARG001 - one signature
        if pos + size > end:
            raise _short("a field", size, pos, end)
        return pos + size

    return skim


def _sized(flexible: bool, legacy_length_bytes: int) -> Skimmer:
    """A string, bytes or records: compact (a varint of length + 1, 0 for null) or legacy (an
    int16 or int32 length, -1 for null)."""

    def skim(buf: bytes, pos: int, end: int, edits: Edits) -> int:  # noqa: ARG001 - one signature
        if flexible:
            length, pos = _uvarint(buf, pos, end)
            length -= 1
        else:
            length, pos = _int(buf, pos, end, legacy_length_bytes)
        if length < -1:
            raise BadRequest(f"malformed request: a length of {length} at byte {pos}")
        if length > 0 and pos + length > end:
            raise _short("a string or bytes", length, pos, end)
        return pos + max(length, 0)

    return skim


def _array(flexible: bool, element: Skimmer, element_bytes_min: int) -> Skimmer:
    def skim(buf: bytes, pos: int, end: int, edits: Edits) -> int:
        start = pos
        if flexible:
            count, pos = _uvarint(buf, pos, end)
            count -= 1
        else:
            count, pos = _int(buf, pos, end, 4)
        if count < -1:
            raise BadRequest(f"malformed request: an array of {count} elements at byte {start}")
        bound = (end - pos) // element_bytes_min if element_bytes_min else EMPTY_ELEMENTS_MAX
        if count > bound:
            raise BadRequest(
                f"malformed request: an array of {count} elements at byte {start} ({end - pos} bytes left)"
            )
        for _ in range(count):
            pos = element(buf, pos, end, edits)
        return pos

    return skim


def _nullable_entity(inner: Skimmer) -> Skimmer:
    def skim(buf: bytes, pos: int, end: int, edits: Edits) -> int:
        marker, pos = _int(buf, pos, end, 1)
        return pos if marker < 0 else inner(buf, pos, end, edits)

    return skim


def _primitive(kafka_type: str, flexible: bool) -> tuple[Skimmer, int]:
    """The skimmer of a primitive, and the fewest bytes it takes."""
    if kafka_type in _FIXED:
        return _fixed(_FIXED[kafka_type]), _FIXED[kafka_type]
    if kafka_type == "string":
        return _sized(flexible, 2), 1 if flexible else 2
    if kafka_type in ("bytes", "records"):
        return _sized(flexible, 4), 1 if flexible else 4
    raise BadRequest(f"a request field of type {kafka_type!r} this listener cannot check")


def _field(field: Any, flexible: bool, is_request_header: bool, is_tag: bool) -> tuple[Skimmer, int]:
    """As kio's `get_field_writer` picks a field's encoding: its skimmer, and its fewest bytes."""
    if is_request_header and field.name == "client_id":  # always a legacy nullable string
        return _sized(False, 2), 2
    optional = False if is_tag else is_optional(field)
    kind = classify_field(field)
    if isinstance(kind, (PrimitiveField, PrimitiveTupleField)):
        inner, inner_min = _primitive(get_schema_field_type(field), flexible)
    elif isinstance(kind, EntityField):
        inner, inner_min = _entity(kind.type_)
        if optional:
            inner, inner_min = _nullable_entity(inner), 1
    elif isinstance(kind, EntityTupleField):
        inner, inner_min = _entity(kind.type_)
    else:  # pragma: no cover - kio's four kinds
        raise AssertionError(kind)
    if kind.is_array:
        return _array(flexible, inner, inner_min), 1 if flexible else 4
    return inner, inner_min


@cache
def _entity(cls: Any) -> tuple[Skimmer, int]:
    """An entity's skimmer (its fields in order, then its tagged fields if flexible), and the
    fewest bytes it takes."""
    flexible = bool(cls.__flexible__)
    is_request_header = cls.__name__ == "RequestHeader"
    plain: list[Skimmer] = []
    tagged: dict[int, Skimmer] = {}
    smallest = 1 if flexible else 0  # the tagged fields' count
    for f in fields(cls):
        tag = get_field_tag(f)
        skimmer, least = _field(f, flexible, is_request_header, tag is not None)
        if tag is None:
            plain.append(skimmer)
            smallest += least
        else:
            tagged[int(tag)] = skimmer

    def skim(buf: bytes, pos: int, end: int, edits: Edits) -> int:
        for skimmer in plain:
            pos = skimmer(buf, pos, end, edits)
        if flexible:
            pos = _tagged(buf, pos, end, edits, tagged)
        return pos

    return skim, smallest


def _tagged(buf: bytes, pos: int, end: int, edits: Edits, known: dict[int, Skimmer]) -> int:
    """A tagged-field section: a count, then each tag, its size and its value. Unknown tags are
    left out (the section rewritten as one edit), known ones checked within their size."""
    start = pos
    count, pos = _uvarint(buf, pos, end)
    if count > end - pos:
        raise BadRequest(f"malformed request: {count} tagged fields at byte {start} ({end - pos} bytes left)")
    kept: list[bytes] = []
    changed = False
    for _ in range(count):
        field_start = pos
        tag, pos = _uvarint(buf, pos, end)
        size, pos = _uvarint(buf, pos, end)
        if pos + size > end:
            raise _short("a tagged field", size, pos, end)
        value_end = pos + size
        skimmer = known.get(tag)
        if skimmer is None:
            changed = True  # left out
        else:
            inner: Edits = []
            if skimmer(buf, pos, value_end, inner) != value_end:
                raise BadRequest(
                    f"malformed request: tagged field {tag} at byte {field_start} is not {size} bytes"
                )
            if inner:
                value = _apply(buf[pos:value_end], [(s - pos, e - pos, r) for s, e, r in inner])
                kept.append(_encode_uvarint(tag) + _encode_uvarint(len(value)) + value)
                changed = True
            else:
                kept.append(buf[field_start:value_end])
        pos = value_end
    if changed:
        edits.append((start, pos, _encode_uvarint(len(kept)) + b"".join(kept)))
    return pos


def _encode_uvarint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _apply(buf: bytes, edits: Edits) -> bytes:
    parts: list[bytes] = []
    at = 0
    for start, end, replacement in edits:
        assert at <= start <= end, (at, start, end)
        parts.append(buf[at:start])
        parts.append(replacement)
        at = end
    parts.append(buf[at:])
    return b"".join(parts)


def skim(frame: bytes, request_cls: Any) -> bytes:
    """`frame` (a whole request, without its size prefix) checked against `request_cls`'s
    header and body: the frame to parse, without the tagged fields the schema does not know.
    Raises BadRequest for a length the frame cannot hold."""
    edits: Edits = []
    header, _ = _entity(request_cls.__header_schema__)
    body, _ = _entity(request_cls)
    try:
        pos = header(frame, 0, len(frame), edits)
        body(frame, pos, len(frame), edits)
    except CorruptBatch as exc:  # a varint that runs out or runs on (`records._uvarint`)
        raise BadRequest(f"malformed request: {exc}") from None
    return _apply(frame, edits) if edits else frame
