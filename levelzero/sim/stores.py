"""Synchronous in-memory storage for the simulation: object store, partition logs, L1 metastore
and the watermark board. Faults and delays are not in here: the world decides them and then
calls these plain operations, so the stores stay obviously correct.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from levelzero.core.entries import LogRecord, Placeholder, TermStart
from levelzero.core.errors import NotLeader, ObjectNotFound
from levelzero.core.keys import L0_ROOT, parse_l0_key


@dataclass(frozen=True, slots=True)
class Listed:
    """One listed object (what `levelzero.core.gc.scan_prefix` feeds on)."""

    key: str
    size: int
    last_modified: float


class SimObjectStore:
    """Keys sort inside a prefix like S3 listings; L0 keys are indexed per prefix."""

    def __init__(self) -> None:
        self._data: dict[str, tuple[bytes, float]] = {}
        self._l0_by_prefix: dict[int, list[str]] = {}
        self.l0_count = 0

    def put(self, key: str, data: bytes, now: float) -> None:
        if key.startswith(L0_ROOT) and key not in self._data:
            keys = self._l0_by_prefix.setdefault(parse_l0_key(key).prefix, [])
            bisect.insort(keys, key)
            self.l0_count += 1
        self._data[key] = (data, now)

    def get(self, key: str) -> bytes:
        found = self._data.get(key)
        if found is None:
            raise ObjectNotFound(key, "the simulated store")
        return found[0]

    def exists(self, key: str) -> bool:
        return key in self._data

    def delete(self, key: str) -> bool:
        """Idempotent; True if the key existed."""
        if self._data.pop(key, None) is None:
            return False
        if key.startswith(L0_ROOT):
            keys = self._l0_by_prefix[parse_l0_key(key).prefix]
            del keys[bisect.bisect_left(keys, key)]
            self.l0_count -= 1
        return True

    def l0_prefixes(self) -> list[int]:
        return sorted(p for p, keys in self._l0_by_prefix.items() if keys)

    def list_l0_prefix(self, prefix: int) -> list[Listed]:
        return [
            Listed(key, len(self._data[key][0]), self._data[key][1])
            for key in self._l0_by_prefix.get(prefix, [])
        ]

    def l0_keys(self) -> list[str]:
        return [k for p in self.l0_prefixes() for k in self._l0_by_prefix[p]]


class PartitionLog:
    """One partition's durable log with conditional (term-checked) appends and one snapshot."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.records: list[LogRecord] = []
        self.term = 0
        self.snapshot: tuple[int, bytes] | None = None  # (log offset, encoded PartitionState)
        # Placeholders by data offset, for reads: base offsets ascend with the log.
        self.placeholder_bases: list[int] = []
        self.placeholders: list[LogRecord] = []

    def begin_term(self, high_watermark: int) -> LogRecord:
        """A new leader's fencing step: raise the term and append its `TermStart`."""
        self.term += 1
        record = LogRecord(len(self.records), self.term, high_watermark, TermStart(self.term))
        self.records.append(record)
        return record

    def append(self, term: int, batch: list[LogRecord]) -> None:
        if term != self.term:
            raise NotLeader(self.name, term, self.term)
        for record in batch:
            assert record.log_offset == len(self.records), (record.log_offset, len(self.records))
            assert record.term == term, (record.term, term)
            self.records.append(record)
            if isinstance(record.entry, Placeholder):
                self.placeholder_bases.append(record.base_offset)
                self.placeholders.append(record)

    def save_snapshot(self, log_offset: int, data: bytes) -> None:
        if self.snapshot is None or log_offset > self.snapshot[0]:
            self.snapshot = (log_offset, data)

    def placeholders_from(self, data_offset: int, limit: int) -> list[LogRecord]:
        """Placeholders whose records end at or after `data_offset`, in log order."""
        i = bisect.bisect_right(self.placeholder_bases, data_offset) - 1
        i = max(i, 0)
        out = []
        for record in self.placeholders[i:]:
            entry = record.entry
            assert isinstance(entry, Placeholder)
            if record.base_offset + entry.record_count <= data_offset:
                continue
            out.append(record)
            if len(out) >= limit:
                break
        return out

    def placeholder_at(self, data_offset: int) -> LogRecord | None:
        i = bisect.bisect_right(self.placeholder_bases, data_offset) - 1
        if i < 0:
            return None
        record = self.placeholders[i]
        entry = record.entry
        assert isinstance(entry, Placeholder)
        if data_offset < record.base_offset + entry.record_count:
            return record
        return None


class L1State:
    COPY_STARTED = "COPY_STARTED"
    COPY_FINISHED = "COPY_FINISHED"
    DELETE_STARTED = "DELETE_STARTED"
    DELETE_FINISHED = "DELETE_FINISHED"


@dataclass(slots=True)
class L1Row:
    key: str
    pid: int
    base_offset: int
    last_offset: int
    lrlo: int
    term: int
    state: str
    created_at: float
    updated_at: float


class L1Metastore:
    """Lifecycle rows of L1 objects with compare-and-set transitions."""

    def __init__(self) -> None:
        self.rows: dict[str, L1Row] = {}
        self._by_pid: dict[int, list[str]] = {}

    def insert(self, row: L1Row) -> None:
        assert row.key not in self.rows, row.key
        self.rows[row.key] = row
        self._by_pid.setdefault(row.pid, []).append(row.key)

    def transition(self, key: str, from_state: str, to_state: str, now: float) -> bool:
        row = self.rows[key]
        if row.state != from_state:
            return False
        row.state = to_state
        row.updated_at = now
        return True

    def of_partition(self, pid: int) -> list[L1Row]:
        return [self.rows[k] for k in self._by_pid.get(pid, [])]


class WatermarkBoard:
    """Published `M(p)` per partition name; a value only rises (mirrors the actors' board)."""

    def __init__(self) -> None:
        self._values: dict[str, int | None] = {}

    def register(self, name: str) -> None:
        self._values.setdefault(name, None)

    def publish(self, name: str, value: int | None) -> None:
        old = self._values.get(name)
        if value is not None and (old is None or value > old):
            self._values[name] = value

    def get(self, name: str) -> int | None:
        return self._values.get(name)

    def names(self) -> list[str]:
        return list(self._values)
