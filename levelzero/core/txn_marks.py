"""How a stored record carries a Kafka transaction (see kafka.transactions): one reserved
header, last, holding the producer id, epoch and kind (-1 data, 0 abort marker, 1 commit
marker). The name starts with NUL, so no client header collides with it; both front ends refuse
a produced record that holds it.

Readers other than Kafka's Fetch (HTTP GET records, the Spark data source, `export --records`)
read as Kafka's consumers do: control records (the markers) are never delivered, their offsets
are gaps, and a transaction's data records come without the reserved header. Like a Kafka
consumer's default (read_uncommitted), they see records of open and aborted transactions.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, TypeVar

TXN_HEADER = "\x00levelzero.txn"
KIND_DATA = -1
KIND_ABORT = 0
_TXN_VALUE = struct.Struct(">qhb")  # producer id, producer epoch, kind


class HasHeaders(Protocol):
    @property
    def headers(self) -> tuple[tuple[str, bytes | None], ...]: ...


# Why a produced record holding the reserved header is refused (Kafka and HTTP alike): only that
# one name is; any other header name, with or without NUL characters, is a client's to use.
RESERVED_HEADER_REFUSAL = f"the header name {TXN_HEADER!r} is reserved for levelzero's transactions"


def has_reserved_header(headers: Iterable[tuple[str, Any]] | None) -> bool:
    return bool(headers) and any(name == TXN_HEADER for name, _ in headers or ())


def is_marker(headers: tuple[tuple[str, bytes | None], ...]) -> bool:
    """A commit or abort marker (a control record): its reserved header's kind is not data."""
    if not headers or headers[-1][0] != TXN_HEADER:
        return False
    value = headers[-1][1]
    assert value is not None and len(value) == 11, "stored by kafka.transactions"
    return value[-1] != KIND_DATA & 0xFF


def txn_kind(headers: tuple[tuple[str, bytes | None], ...]) -> tuple[int, int] | None:
    """(producer id, kind) of a record stored by a transaction, else None."""
    if not headers or headers[-1][0] != TXN_HEADER:
        return None
    value = headers[-1][1]
    assert value is not None and len(value) == _TXN_VALUE.size, "stored by kafka.transactions"
    producer_id, _, kind = _TXN_VALUE.unpack(value)
    return producer_id, kind


def client_headers(headers: tuple[tuple[str, bytes | None], ...]) -> tuple[tuple[str, bytes | None], ...]:
    """The headers a client wrote: without the reserved one."""
    if headers and headers[-1][0] == TXN_HEADER:
        return headers[:-1]
    return headers


R = TypeVar("R", bound=HasHeaders)


def delivered(offsets_and_records: Iterable[tuple[int, R]]) -> Iterator[tuple[int, R]]:
    """(offset, record) pairs without the markers (what a consumer is given)."""
    for offset, record in offsets_and_records:
        if not is_marker(record.headers):
            yield offset, record
