"""Ground truth and the invariant checks of DESIGN.md, evaluated against the real stores.

The truth is what survives any crash: each partition's durable log (applied record by record to
a `shadow` state as it becomes durable), the object store, the L1 metastore, and what producers
were told (acknowledged records). Checks run when something irreversible happens (a key about
to be deleted, an L1 object entering DELETE_STARTED, a record acknowledged, a record durable),
on a short virtual-time period while the world runs (published `M(p)`, every acknowledged
record readable), and at the end (no leaks).
"""

from __future__ import annotations

import bisect
import contextlib
import traceback
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

import levelzero.actors.partition as partition_module

from levelzero.core.entries import LogRecord, Placeholder, SetStartOffset
from levelzero.core.topic_configs import RetainedObject, retention_start_offset
from levelzero.core.errors import InvariantViolation
from levelzero.core.keys import parse_l0_key
from levelzero.core.l0format import Record, decode_extent, read_header
from levelzero.core.state import PartitionState, ReaderPins
from levelzero.storage.protocols import L1Row, L1State


if TYPE_CHECKING:
    from levelzero.actors.partition import PartitionActor
    from levelzero.storage.memory_store import MemoryObjectStore

    from .faults import SimLogStore

L0_ROOT = "level_zero/"


class ObservedPins(ReaderPins):
    """A simulated partition's reader pins, keeping apart what each registered reader was told
    it pinned (`register`'s answer) from the pin set the published `M(p)` is computed from.
    The check at every delete (`Truth.on_delete`) holds the deleted key against these claims:
    a GC that ignores pins is caught when it deletes, whether or not a reader then misses the
    object (its bytes may still be in the node's L0 cache, or nobody reads them again)."""

    __slots__ = ("claims",)

    def __init__(self) -> None:
        super().__init__()
        self.claims: dict[int, int] = {}  # reader id -> the M(p) it was told it pinned

    def register(self, state_mp: int | None) -> tuple[int, int | None]:
        reader_id, pinned = super().register(state_mp)
        if pinned is not None:
            self.claims[reader_id] = pinned
        return reader_id, pinned

    def release(self, reader_id: int) -> None:
        self.claims.pop(reader_id, None)
        super().release(reader_id)

    def lowest_claim(self) -> int | None:
        return min(self.claims.values()) if self.claims else None


@contextlib.contextmanager
def observed_pins() -> Iterator[None]:
    """Partition actors made meanwhile keep `ObservedPins` (where the actor module looks the
    class up; the pins behave exactly as the shipping ones, or as a mutation makes them)."""
    original = partition_module.__dict__["ReaderPins"]
    setattr(partition_module, "ReaderPins", ObservedPins)  # noqa: B010 - a module global, patched
    try:
        yield
    finally:
        setattr(partition_module, "ReaderPins", original)  # noqa: B010


class World(Protocol):
    """What the checks read of the world (`world.World`, which holds a `Truth`): named here so
    that the checks do not import the world that imports them."""

    log_store: SimLogStore
    objects: MemoryObjectStore
    retention_s: float | None
    retention_bytes: int | None

    def wall(self) -> float: ...

    def note(self, text: str) -> None: ...

    def fail(self, invariant: str, message: str) -> None: ...

    def partition_name(self, pid: int) -> str: ...

    def live_actors(self) -> list[PartitionActor]: ...


class Truth:
    def __init__(self, world: World) -> None:
        self.world = world
        self.shadow: dict[int, PartitionState] = {}
        # pid -> data offset -> (key, value) of every acknowledged record
        self.acked: dict[int, dict[int, tuple[bytes | None, bytes | None]]] = {}
        # pid -> durable placeholders in data-offset order (bases for bisect)
        self.placeholders: dict[int, list[LogRecord]] = {}
        self._bases: dict[int, list[int]] = {}
        # L0 key -> (pid, first data offset, last data offset) of every durable placeholder
        self.refs: dict[str, list[tuple[int, int, int]]] = {}
        self.deleted: set[str] = set()
        self.deletes_under_pins = 0  # L0 deletes while a live reader held a pin (each checked)
        self.dropped = 0  # acknowledged records below the start offset at the last read-back
        self._published: dict[str, int] = {}
        # pid -> the highest offset a DeleteRecords asked to delete below (sent, perhaps not
        # answered): a start offset may move that far whatever retention allows
        self.delete_records_below: dict[int, int] = {}

    def fail(self, invariant: str, message: str) -> None:
        self.world.fail(invariant, message)

    # ------------------------------------------------------------------ durable records

    def on_durable(self, pid: int, records: list[LogRecord]) -> None:
        state = self.shadow.get(pid)
        if state is None:
            row = self.world.log_store.partitions[pid]
            state = self.shadow[pid] = PartitionState(row.creation_epoch)
        name = self.world.partition_name(pid)
        for record in records:
            before = (state.max_applied_epoch, state.mp)
            if isinstance(record.entry, SetStartOffset):
                self._check_retention(pid, state, record.entry.offset)
            self._apply(state, record, f"durable log of {name}")
            self._monotone(name, before, state)
            entry = record.entry
            self.world.note(f"durable {name}@{record.log_offset} t{record.term} {_entry(entry)}")
            if isinstance(entry, Placeholder):
                last = record.base_offset + entry.record_count - 1
                if entry.object_key in self.deleted:
                    self.fail(
                        "1",
                        f"{name}: placeholder at log offset {record.log_offset} (epoch "
                        f"{entry.epoch}) became durable into {entry.object_key}, already deleted",
                    )
                self.refs.setdefault(entry.object_key, []).append((pid, record.base_offset, last))
                self.placeholders.setdefault(pid, []).append(record)
                self._bases.setdefault(pid, []).append(record.base_offset)

    def _check_retention(self, pid: int, state: PartitionState, start: int) -> None:
        """A start offset moves no further than retention allows (the housekeeper's rule,
        `core.topic_configs.retention_start_offset`, over the partition's valid L1 objects now:
        a bound that only grows with time), or a DeleteRecords asked."""
        world = self.world
        valid = sorted(
            (
                r
                for r in world.log_store.l1.values()
                if r.pid == pid
                and r.state == L1State.COPY_FINISHED
                and state.l1_range_valid(r.term, r.base_offset, r.last_offset)
            ),
            key=lambda r: r.base_offset,
        )
        allowed = retention_start_offset(
            [RetainedObject(r.last_offset, r.size, r.created_at) for r in valid],
            state.start_offset,
            world.wall(),
            world.retention_s,
            world.retention_bytes,
        )
        allowed = max(allowed, self.delete_records_below.get(pid, 0))
        if start > allowed:
            self.fail(
                "retention",
                f"{world.partition_name(pid)}: start offset set to {start}, retention "
                f"({world.retention_s}s, {world.retention_bytes} bytes) allows {allowed}",
            )

    def _apply(self, state: PartitionState, record: LogRecord, where: str) -> None:
        """`state.apply`, with the state machine's own assertions reported as invariant 5: its
        `InvariantViolation` (an epoch below the window) and its plain asserts of the chain
        `min_epoch_lower_bound <= previous_applied <= max_applied`."""
        try:
            state.apply(record)
        except InvariantViolation as exc:
            self.fail("5", f"{where}: {exc} (record {record!r})")
        except AssertionError as exc:
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            self.fail(
                "5",
                f"{where}: state machine assertion `{frame.line}` failed at "
                f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} applying {record!r}",
            )

    def _monotone(self, name: str, before: tuple[int | None, int | None], state: PartitionState) -> None:
        for old, new, what in (
            (before[0], state.max_applied_epoch, "max_applied_epoch"),
            (before[1], state.mp, "M(p)"),
        ):
            if old is not None and (new is None or new < old):
                self.fail("2", f"{name}: {what} fell from {old} to {new} in the durable log")

    def check_published(self, board: dict[str, int | None]) -> None:
        """Published `M(p)` never falls, across incarnations too (a new leader publishes what
        its replayed log proves, which is at least what any earlier one published)."""
        for name, value in board.items():
            if value is None:
                continue
            old = self._published.get(name)
            if old is not None and value < old:
                self.fail("2", f"published M(p) of {name} fell from {old} to {value}")
            self._published[name] = value if old is None else max(old, value)

    # ------------------------------------------------------------------ acknowledgements

    def ack(self, pid: int, base_offset: int, records: list[Record], key: str) -> None:
        acked = self.acked.setdefault(pid, {})
        for i, record in enumerate(records):
            offset = base_offset + i
            if offset in acked:
                self.fail("3", f"{self.world.partition_name(pid)}@{offset} acknowledged twice")
            acked[offset] = (record.key, record.value)
        last = base_offset + len(records) - 1
        if key in self.deleted and last > self.shadow[pid].lro:
            # (At or below LRO the records are served from L1: in a cluster, a reply delayed by
            # a pause may come after a new leader reconciled them and the GC took the object.)
            self.fail(
                "3",
                f"{self.world.partition_name(pid)}@{base_offset}.. acknowledged while its "
                f"object {key} is already deleted and LRO is {self.shadow[pid].lro}",
            )

    # ------------------------------------------------------------------ uploads

    def on_stored(self, key: str) -> None:
        """Called by the object store for every object it stored. The write path's rule: an L0
        object's epoch is at least the creation epoch of every partition inside (the GC's cap
        protects partitions created after a round's snapshot only through it)."""
        if not key.startswith(L0_ROOT):
            return
        epoch = parse_l0_key(key).epoch
        header = read_header(self.world.objects._objects[key][0], key)
        for extent in header.extents:
            creation = self.world.log_store.partitions[extent.pid].creation_epoch
            if epoch < creation:
                self.fail(
                    "epoch-rule",
                    f"{key} (epoch {epoch}) holds data of {self.world.partition_name(extent.pid)}, "
                    f"created at epoch {creation}",
                )

    # ------------------------------------------------------------------ deletions

    def on_delete(self, key: str) -> None:
        """Called by the object store for every key a delete is about to remove."""
        self.world.note(f"delete {key}")
        if not key.startswith(L0_ROOT):
            return
        self._check_reader_pins(key)
        for pid, base, last in self.refs.get(key, ()):
            state = self.shadow[pid]
            if last > state.lro:
                self.fail(
                    "1",
                    f"deleted {key}: it holds {self.world.partition_name(pid)} offsets "
                    f"{base}..{last} above LRO {state.lro} (window {state.applied_window}, "
                    f"min_lb {state.min_epoch_lower_bound}, M(p) {state.mp})",
                )
        for actor in self.world.live_actors():
            for pending in actor._appends:
                entry = pending.record.entry
                if isinstance(entry, Placeholder) and entry.object_key == key:
                    self.fail(
                        "1",
                        f"deleted {key}: {actor.name} admitted a placeholder into it (log "
                        f"offset {pending.record.log_offset}, epoch {entry.epoch}), not durable yet",
                    )
        self.deleted.add(key)

    def _check_reader_pins(self, key: str) -> None:
        """Invariant 1's reader half: no L0 object above a pin an active reader holds is
        deleted. A reader of a partition (on a node whose term for it is current) told it pinned
        `M(p) = m` keeps the published `M(p)`, and so the GC's `M`, at or below `m` until it
        releases: published values never exceed the state's `M(p)`, which never falls, so
        even a round that read the board before the reader registered has `M <= m`. Checked
        here, as the delete lands, and not by a later read's failure: the node's L0 cache may
        still serve the deleted object's bytes."""
        epoch = parse_l0_key(key).epoch
        pinned = False
        for actor in self.world.live_actors():
            pins = actor.pins
            if not isinstance(pins, ObservedPins):
                continue  # (an actor made outside a run)
            low = pins.lowest_claim()
            pinned = pinned or low is not None
            if low is not None and epoch > low:
                self.fail(
                    "1",
                    f"deleted {key} (epoch {epoch}) while {len(pins.claims)} reader(s) of "
                    f"{actor.name} held M(p) = {low} (published {self._published.get(actor.name)})",
                )
        self.deletes_under_pins += pinned

    def on_l1_delete_started(self, row: L1Row) -> None:
        """A valid L1 object of the durable lineage must never start being deleted."""
        state = self.shadow[row.pid]
        if (
            row.state == L1State.COPY_FINISHED
            and state.l1_range_valid(row.term, row.base_offset, row.last_offset)
            and row.last_offset >= state.start_offset
        ):
            self.fail(
                "3",
                f"deleting L1 object {row.key} [{row.base_offset}, {row.last_offset}] term "
                f"{row.term}, which the durable lineage {state.reconciled_by_term} still serves",
            )

    # ------------------------------------------------------------------ invariant 3

    def expected(self, pid: int, offset: int) -> tuple[bytes | None, bytes | None] | None:
        return self.acked.get(pid, {}).get(offset)

    def placeholder_at(self, pid: int, offset: int) -> LogRecord | None:
        bases = self._bases.get(pid, [])
        i = bisect.bisect_right(bases, offset) - 1
        if i < 0:
            return None
        record = self.placeholders[pid][i]
        entry = record.entry
        assert isinstance(entry, Placeholder)
        return record if offset < record.base_offset + entry.record_count else None

    def check_readable(self) -> int:
        """Every acknowledged record, byte for byte: L1 up to LRO, L0 above. Returns the count."""
        objects = self.world.objects
        l1_rows = list(self.world.log_store.l1.values())
        checked = dropped = 0
        for pid, acked in self.acked.items():
            name = self.world.partition_name(pid)
            state = self.shadow[pid]
            rows = sorted(
                (
                    r
                    for r in l1_rows
                    if r.pid == pid
                    and r.state == L1State.COPY_FINISHED
                    and state.l1_range_valid(r.term, r.base_offset, r.last_offset)
                ),
                key=lambda r: r.base_offset,
            )
            bases = [r.base_offset for r in rows]
            cache: dict[str, list[Record]] = {}
            for offset, expected in acked.items():
                if offset < state.start_offset:
                    dropped += 1  # retention dropped it
                    continue
                if offset <= state.lro:
                    i = bisect.bisect_right(bases, offset) - 1
                    if i < 0 or rows[i].last_offset < offset:
                        self.fail(
                            "3",
                            f"{name}@{offset} (<= LRO {state.lro}) is in no valid L1 object "
                            f"(lineage {state.reconciled_by_term})",
                        )
                    row = rows[i]
                    records = cache.get(row.key)
                    if records is None:
                        records = cache[row.key] = self._l1_records(objects, row, name)
                    got = records[offset - row.base_offset]
                else:
                    record = self.placeholder_at(pid, offset)
                    if record is None:
                        self.fail("3", f"{name}@{offset} is acknowledged but has no placeholder")
                    assert record is not None
                    p = record.entry
                    assert isinstance(p, Placeholder)
                    handle = f"{p.object_key}@{record.log_offset}"
                    records = cache.get(handle)
                    if records is None:
                        data = self._object(objects, p.object_key, f"{name}@{offset} (> LRO {state.lro})")
                        raw = data[p.byte_offset : p.byte_offset + p.byte_length]
                        records = cache[handle] = decode_extent(raw, p.checksum, p.record_count, name)
                    got = records[offset - record.base_offset]
                if (got.key, got.value) != expected:
                    self.fail("3", f"{name}@{offset} reads {got!r}, acknowledged {expected!r}")
                checked += 1
        self.dropped = dropped
        return checked

    def _object(self, objects: MemoryObjectStore, key: str, what: str) -> bytes:
        stored = objects._objects.get(key)
        if stored is None:
            self.fail("3", f"{what}: its object {key} is gone")
        assert stored is not None  # fail() raised
        return stored[0]

    def _l1_records(self, objects: MemoryObjectStore, row: L1Row, name: str) -> list[Record]:
        data = self._object(objects, row.key, f"{name}: valid L1 object")
        header = read_header(data, row.key)
        (extent,) = header.extents
        raw = data[extent.byte_offset : extent.byte_offset + extent.byte_length]
        return decode_extent(raw, extent.checksum, extent.record_count, row.key)


def _entry(entry: object) -> str:
    if isinstance(entry, Placeholder):
        return f"Placeholder(e{entry.epoch} {entry.object_key[-12:]} n{entry.record_count})"
    return repr(entry)
