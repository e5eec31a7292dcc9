"""Ground truth and the invariant checks of DESIGN.md, evaluated against the durable state.

The truth is what survives any crash: each partition's durable log (and its `shadow` state, the
log applied record by record), the object store, the L1 metastore, and the model of what was
acknowledged to producers. Checks run at the moment something irreversible happens (an object
deleted, an L1 object marked for deletion, a record acknowledged), after every step (the
monotone values), periodically (every acknowledged record readable) and at the end (no leaks).
"""

from __future__ import annotations

import bisect
import traceback
from typing import TYPE_CHECKING

from levelzero.core.entries import LogRecord, Placeholder
from levelzero.core.errors import InvariantViolation
from levelzero.core.l0format import Record, decode_extent, read_header
from levelzero.core.state import PartitionState

from .stores import L1Row, L1State
from .violation import SimulationViolation

if TYPE_CHECKING:
    from .world import Partition, World


def apply_checked(state: PartitionState, record: LogRecord, where: str) -> bool:
    """`state.apply`, with the state machine's own assertions reported as invariant 5: its
    `InvariantViolation` (an epoch below the window) and its plain asserts of the same chain
    (`min_epoch_lower_bound <= previous_applied <= max_applied`)."""
    try:
        return state.apply(record)
    except InvariantViolation as exc:
        raise SimulationViolation("5", f"{where}: {exc} (record {record!r})") from exc
    except AssertionError as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        raise SimulationViolation(
            "5",
            f"{where}: state machine assertion `{frame.line}` failed at "
            f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} applying {record!r}",
        ) from exc


class Truth:
    def __init__(self, world: World) -> None:
        self.world = world
        # pid -> data offset -> (key, value) of every acknowledged record
        self.acked: dict[int, dict[int, tuple[bytes | None, bytes]]] = {}
        # L0 key -> (pid, first data offset, last data offset) of every durable placeholder
        self.refs: dict[str, list[tuple[int, int, int]]] = {}
        # last seen monotone values (invariant 2)
        self._max_applied: dict[int, int | None] = {}
        self._mp: dict[int, int | None] = {}
        self._published: dict[str, int | None] = {}

    # ------------------------------------------------------------------ feeding

    def on_durable(self, part: Partition, batch: list[LogRecord]) -> None:
        for record in batch:
            apply_checked(part.shadow, record, f"durable log of {part.name}")
            entry = record.entry
            if isinstance(entry, Placeholder):
                last = record.base_offset + entry.record_count - 1
                self.refs.setdefault(entry.object_key, []).append(
                    (part.pid, record.base_offset, last)
                )

    def ack(self, pid: int, offset: int, record: Record, key: str) -> None:
        acked = self.acked.setdefault(pid, {})
        assert offset not in acked, (pid, offset)
        acked[offset] = (record.key, record.value)
        if not self.world.store.exists(key):
            raise SimulationViolation(
                "3", f"record {pid}@{offset} acknowledged while its object {key} is already deleted"
            )

    # ------------------------------------------------------------------ invariant 1 (and pins)

    def on_l0_delete(self, key: str, by: str) -> None:
        """Called just before the GC deletes `key`: nothing live may point into it."""
        world = self.world
        for pid, base, last in self.refs.get(key, ()):
            part = world.parts[pid]
            if last > part.shadow.lro:
                raise SimulationViolation(
                    "1",
                    f"{by} deleted {key}: it holds {part.name} offsets {base}..{last} above "
                    f"LRO {part.shadow.lro} (M(p) published {world.board.get(part.name)}, "
                    f"window {part.shadow.applied_window}, min_lb {part.shadow.min_epoch_lower_bound})",
                )
        for part in world.parts.values():
            rt = world.current_leader(part)
            if rt is None:
                continue
            for record, _, _ in rt.pending:
                entry = record.entry
                if isinstance(entry, Placeholder) and entry.object_key == key:
                    raise SimulationViolation(
                        "1",
                        f"{by} deleted {key}: {rt} has admitted a placeholder into it "
                        f"(log offset {record.log_offset}, epoch {entry.epoch}) not yet durable",
                    )
            for read in rt.readers.values():
                if key in read.keys:
                    raise SimulationViolation(
                        "1", f"{by} deleted {key} while an L0 reader of {rt} pinned M(p) to read it"
                    )
            job = rt.job
            if job is not None and job.pin is not None and key in job.keys:
                raise SimulationViolation(
                    "1", f"{by} deleted {key} while the reconciler of {rt} pinned M(p) to copy it"
                )

    # ------------------------------------------------------------------ L1

    def on_l1_delete_started(self, row: L1Row) -> None:
        """A valid L1 object of the durable lineage must never start being deleted."""
        part = self.world.parts[row.pid]
        s = part.shadow
        if (
            row.state == L1State.COPY_FINISHED
            and s.l1_range_valid(row.term, row.base_offset, row.last_offset)
            and row.last_offset >= s.start_offset
        ):
            raise SimulationViolation(
                "3",
                f"deleting L1 object {row.key} [{row.base_offset}, {row.last_offset}] term "
                f"{row.term}, which the durable lineage {s.reconciled_by_term} still serves",
            )

    def l1_records(self, row: L1Row) -> list[Record]:
        data = self.world.store.get(row.key)
        header = read_header(data, row.key)
        (extent,) = header.extents
        raw = data[extent.byte_offset : extent.byte_offset + extent.byte_length]
        return decode_extent(raw, extent.checksum, extent.record_count, row.key)

    # ------------------------------------------------------------------ invariant 3

    def compare(self, part: Partition, offset: int, record: Record, where: str) -> None:
        expected = self.acked.get(part.pid, {}).get(offset)
        if expected is not None and expected != (record.key, record.value):
            raise SimulationViolation(
                "3", f"{where}: {part.name}@{offset} reads {record!r}, acknowledged {expected!r}"
            )

    def check_readable(self) -> int:
        """Every acknowledged record, byte for byte: L1 up to LRO, L0 above. Returns the count."""
        world = self.world
        checked = 0
        for pid, acked in self.acked.items():
            part = world.parts[pid]
            s = part.shadow
            rows = sorted(
                (
                    r
                    for r in world.l1.of_partition(pid)
                    if r.state == L1State.COPY_FINISHED
                    and s.l1_range_valid(r.term, r.base_offset, r.last_offset)
                ),
                key=lambda r: r.base_offset,
            )
            bases = [r.base_offset for r in rows]
            l1_cache: dict[str, list[Record]] = {}
            l0_cache: dict[int, list[Record]] = {}
            for offset, expected in acked.items():
                if offset <= s.lro:
                    i = bisect.bisect_right(bases, offset) - 1
                    if i < 0 or rows[i].last_offset < offset:
                        raise SimulationViolation(
                            "3",
                            f"{part.name}@{offset} (<= LRO {s.lro}) is in no valid L1 object "
                            f"(lineage {s.reconciled_by_term})",
                        )
                    row = rows[i]
                    if not world.store.exists(row.key):
                        raise SimulationViolation(
                            "3", f"{part.name}@{offset}: valid L1 object {row.key} is gone"
                        )
                    records = l1_cache.get(row.key)
                    if records is None:
                        records = l1_cache[row.key] = self.l1_records(row)
                    got = records[offset - row.base_offset]
                else:
                    record = part.log.placeholder_at(offset)
                    if record is None:
                        raise SimulationViolation(
                            "3", f"{part.name}@{offset} is acknowledged but has no placeholder"
                        )
                    p = record.entry
                    assert isinstance(p, Placeholder)
                    if not world.store.exists(p.object_key):
                        raise SimulationViolation(
                            "3",
                            f"{part.name}@{offset} (> LRO {s.lro}): its L0 object {p.object_key} is gone",
                        )
                    records = l0_cache.get(record.log_offset)
                    if records is None:
                        data = world.store.get(p.object_key)[
                            p.byte_offset : p.byte_offset + p.byte_length
                        ]
                        records = decode_extent(data, p.checksum, p.record_count, part.name)
                        l0_cache[record.log_offset] = records
                    got = records[offset - record.base_offset]
                if (got.key, got.value) != expected:
                    raise SimulationViolation(
                        "3", f"{part.name}@{offset} reads {got!r}, acknowledged {expected!r}"
                    )
                checked += 1
        return checked

    # ------------------------------------------------------------------ invariant 2

    def check_monotone(self) -> None:
        world = self.world
        for pid, part in world.parts.items():
            s = part.shadow
            for seen, value, what in (
                (self._max_applied, s.max_applied_epoch, "max_applied_epoch"),
                (self._mp, s.mp, "M(p)"),
            ):
                old = seen.get(pid)
                if old is not None and (value is None or value < old):
                    raise SimulationViolation(
                        "2", f"{part.name}: {what} fell from {old} to {value}"
                    )
                seen[pid] = value
        for name in world.board.names():
            value = world.board.get(name)
            old = self._published.get(name)
            if old is not None and (value is None or value < old):
                raise SimulationViolation(
                    "2", f"published M(p) of {name} fell from {old} to {value}"
                )
            self._published[name] = value
