"""An in-memory `LogStore` with the same rules as the SQLite one (conditional, contiguous
appends; compare-and-set L1 transitions; a cluster epoch that never falls). For fast actor
tests and the simulation; nothing here survives the process.

`fail_appends` injects a failure into the next appends, as a disk error would.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence

import anyio
import msgspec

from levelzero.core.entries import LogRecord, Placeholder, TermStart
from levelzero.core.errors import (
    InvalidInput,
    InvariantViolation,
    LogMovedOn,
    NotLeader,
    PartitionDeleted,
    SnapshotSuperseded,
    StorageError,
    TopicExists,
    UnknownTopic,
)
from levelzero.storage.log_rules import compaction_commit_refusal
from levelzero.storage.protocols import (
    Append,
    OnDurable,
    tell_each,
    CompactionCommit,
    CompactionState,
    L1State,
    FenceEventRow,
    GcRoundRow,
    L0ObjectRow,
    L1Row,
    OffsetRow,
    PartitionRow,
    Snapshot,
    StateSampleRow,
)


class MemoryLogStore:
    def __init__(self) -> None:
        self.partitions: dict[int, PartitionRow] = {}
        self.logs: dict[int, list[LogRecord]] = {}
        self.first_offset: dict[int, int] = {}
        self.snapshots: dict[int, Snapshot] = {}
        self.cluster_epoch = 1
        self.l1: dict[str, L1Row] = {}
        self.cleaner_offsets: dict[int, dict[int, int]] = {}
        self.l1_compacted: dict[str, int] = {}  # key -> pid
        self.l0_objects: dict[str, L0ObjectRow] = {}
        self.gc_rounds: list[GcRoundRow] = []
        self.fence_events: list[FenceEventRow] = []
        self.state_samples: list[StateSampleRow] = []
        self.consumer_offsets: dict[tuple[str, str, int], OffsetRow] = {}
        self.group_metadata_rows: dict[str, bytes] = {}
        self.configs: dict[str, dict[str, str]] = {}
        # Deleted partitions whose L1 objects are not all collected yet; and every pid ever given
        # (a deleted partition's id is never given again).
        self.deleted: dict[int, PartitionRow] = {}
        self.collected: set[int] = set()  # deleted partitions whose L1 objects are all gone
        self.last_pid = 0
        self.fail_appends = 0
        self.appends = 0

    # -- partitions
    async def create_topic(
        self,
        topic: str,
        partitions: int,
        creation_epoch: int,
        now: float,
        configs: Mapping[str, str] | None = None,
    ) -> list[PartitionRow]:
        if any(row.topic == topic for row in self.partitions.values()):
            raise TopicExists(f"topic {topic!r} exists")
        self.configs.pop(topic, None)
        if configs:
            self.configs[topic] = dict(configs)
        # At least the stored cluster epoch (as PostgreSQL does, for nodes with stale caches).
        creation_epoch = max(creation_epoch, self.cluster_epoch)
        rows = self._add(topic, range(partitions), creation_epoch, now)
        await anyio.lowlevel.checkpoint()
        return rows

    def _add(self, topic: str, indexes: range, creation_epoch: int, now: float) -> list[PartitionRow]:
        rows = []
        for p in indexes:
            self.last_pid += 1
            pid = self.last_pid
            row = PartitionRow(pid, topic, p, creation_epoch, 0, now)
            self.partitions[pid] = row
            self.logs[pid] = []
            self.first_offset[pid] = 0
            rows.append(row)
        return rows

    async def list_partitions(self) -> list[PartitionRow]:
        return [self.partitions[pid] for pid in sorted(self.partitions)]

    async def add_partitions(
        self, topic: str, count: int, creation_epoch: int, now: float
    ) -> list[PartitionRow]:
        await anyio.lowlevel.checkpoint()
        current = sum(1 for row in self.partitions.values() if row.topic == topic)
        if current == 0:
            raise UnknownTopic(topic)
        if count <= current:
            raise InvalidInput(f"topic {topic!r} has {current} partitions; {count} would not add any")
        return self._add(topic, range(current, count), max(creation_epoch, self.cluster_epoch), now)

    async def delete_topic(self, topic: str, now: float) -> list[PartitionRow]:  # noqa: ARG002 - no time kept
        await anyio.lowlevel.checkpoint()
        rows = sorted((r for r in self.partitions.values() if r.topic == topic), key=lambda r: r.pid)
        if not rows:
            raise UnknownTopic(topic)
        for row in rows:
            del self.partitions[row.pid]
            del self.logs[row.pid], self.first_offset[row.pid]
            self.snapshots.pop(row.pid, None)
            self.deleted[row.pid] = row
        for key in [key for key in self.consumer_offsets if key[1] == topic]:
            del self.consumer_offsets[key]
        self.configs.pop(topic, None)
        return rows

    async def deleted_partitions(self) -> list[PartitionRow]:
        await anyio.lowlevel.checkpoint()
        return [self.deleted[pid] for pid in sorted(self.deleted) if pid not in self.collected]

    async def forget_deleted_partition(self, pid: int) -> bool:
        await anyio.lowlevel.checkpoint()
        rows = [key for key, row in self.l1.items() if row.pid == pid]
        if pid not in self.deleted or any(self.l1[key].state != L1State.DELETE_FINISHED for key in rows):
            return False
        for key in rows:
            del self.l1[key]
            self.l1_compacted.pop(key, None)
        self.cleaner_offsets.pop(pid, None)
        self.collected.add(pid)
        return True

    def _row(self, pid: int, what: str) -> PartitionRow:
        """The partition's row; PartitionDeleted for a deleted one (its leader has not heard)."""
        row = self.partitions.get(pid)
        if row is not None:
            return row
        gone = self.deleted.get(pid)
        if gone is not None:
            raise PartitionDeleted(f"{gone.topic}/{gone.partition}", what)
        raise InvariantViolation(f"unknown partition id {pid}")

    async def begin_term(self, pid: int, log_offset: int, base_offset: int, at_least: int = 0) -> LogRecord:
        row = self._row(pid, "TermStart")
        term = max(row.term + 1, at_least)
        record = LogRecord(log_offset, term, base_offset, TermStart(term))
        if log_offset < self._next_offset(pid):
            raise LogMovedOn(f"{row.topic}/{row.partition}", log_offset, self._next_offset(pid))
        self._check_contiguous(pid, [record])
        self.partitions[pid] = PartitionRow(
            pid, row.topic, row.partition, row.creation_epoch, term, row.created_at
        )
        self.logs[pid].append(record)
        await anyio.lowlevel.checkpoint()
        return record

    @staticmethod
    def _check_term(row: PartitionRow, expected_term: int) -> None:
        """The fence of a previous leader: an append must carry the partition's current term."""
        if row.term != expected_term:
            raise NotLeader(f"{row.topic}/{row.partition}", expected_term, row.term)

    # -- log
    def _next_offset(self, pid: int) -> int:
        log = self.logs[pid]
        return log[-1].log_offset + 1 if log else self.first_offset[pid]

    def _check_contiguous(self, pid: int, records: Sequence[LogRecord]) -> None:
        expected = self._next_offset(pid)
        for record in records:
            if record.log_offset != expected:
                raise InvariantViolation(
                    f"pid {pid}: append at log offset {record.log_offset}, expected {expected}"
                )
            expected += 1

    async def append(self, pid: int, expected_term: int, records: Sequence[LogRecord]) -> None:
        [refused] = await self.append_many([Append(pid, expected_term, records)])
        if refused is not None:
            raise refused

    async def append_many(
        self, appends: Sequence[Append], on_durable: OnDurable | None = None
    ) -> list[NotLeader | None]:
        """All at once (one checkpoint), as one transaction would: a broken log raises before
        any partition's records are added."""
        await anyio.lowlevel.checkpoint()
        if self.fail_appends > 0:
            self.fail_appends -= 1
            raise StorageError("injected append failure")
        assert len({append.pid for append in appends}) == len(appends), "a partition twice"
        refused: list[NotLeader | None] = []
        for append in appends:
            pid, expected_term, records = append.pid, append.expected_term, append.records
            try:
                self._check_term(self._row(pid, "append"), expected_term)
            except NotLeader as error:
                refused.append(error)
                continue
            refused.append(None)
            assert all(r.term == expected_term for r in records)
            self._check_contiguous(pid, records)
        for append, refusal in zip(appends, refused, strict=True):
            if refusal is None:
                self.logs[append.pid].extend(append.records)
                self.appends += 1
        tell_each(refused, on_durable)
        return refused

    async def read_log(self, pid: int, from_log_offset: int, limit: int | None = None) -> list[LogRecord]:
        await anyio.lowlevel.checkpoint()
        log = self.logs[pid]
        start = max(0, from_log_offset - self.first_offset[pid])
        end = None if limit is None else start + limit
        return log[start:end]

    async def read_placeholders(self, pid: int, from_data_offset: int, limit: int) -> list[LogRecord]:
        await anyio.lowlevel.checkpoint()
        found = []
        holders = [r for r in self.logs[pid] if isinstance(r.entry, Placeholder)]
        i = bisect_right([r.base_offset for r in holders], from_data_offset) - 1
        for record in holders[max(i, 0) :]:
            entry = record.entry
            assert isinstance(entry, Placeholder), record
            if record.base_offset + entry.record_count > from_data_offset:
                found.append(record)
                if len(found) >= limit:
                    break
        return found

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        """As the SQLite and PostgreSQL stores: within the log, never going back."""
        await anyio.lowlevel.checkpoint()
        row = self._row(snapshot.pid, "snapshot")
        name = f"{row.topic}/{row.partition}"
        if not -1 <= snapshot.log_offset < self._next_offset(snapshot.pid):
            raise InvariantViolation(
                f"partition {name}: snapshot at log offset {snapshot.log_offset}, the log ends "
                f"before {self._next_offset(snapshot.pid)}"
            )
        saved = self.snapshots.get(snapshot.pid)
        if saved is not None and snapshot.log_offset < saved.log_offset:
            raise SnapshotSuperseded(name, snapshot.log_offset, saved.log_offset)
        self.snapshots[snapshot.pid] = snapshot

    async def load_snapshot(self, pid: int) -> Snapshot | None:
        await anyio.lowlevel.checkpoint()
        return self.snapshots.get(pid)

    async def truncate_below(self, pid: int, log_offset: int) -> int:
        self._row(pid, "truncation")
        snap = self.snapshots.get(pid)
        if snap is None or log_offset > snap.log_offset + 1:
            raise InvariantViolation(f"pid {pid}: truncate below {log_offset} past the snapshot")
        log = self.logs[pid]
        keep = [r for r in log if r.log_offset >= log_offset]
        removed = len(log) - len(keep)
        self.logs[pid] = keep
        self.first_offset[pid] = max(self.first_offset[pid], log_offset)
        await anyio.lowlevel.checkpoint()
        return removed

    # -- cluster epoch
    async def get_cluster_epoch(self) -> int:
        return self.cluster_epoch

    async def set_cluster_epoch(self, epoch: int) -> None:
        if epoch < self.cluster_epoch:
            raise InvariantViolation(f"cluster epoch {epoch} below {self.cluster_epoch}")
        self.cluster_epoch = epoch
        await anyio.lowlevel.checkpoint()

    async def probe_write(self) -> None:
        await anyio.lowlevel.checkpoint()

    # -- L1 metastore
    async def l1_insert(self, row: L1Row) -> None:
        gone = self.deleted.get(row.pid)
        if gone is not None:
            raise PartitionDeleted(f"{gone.topic}/{gone.partition}", "L1 insert")
        assert row.key not in self.l1, row.key
        self.l1[row.key] = row
        await anyio.lowlevel.checkpoint()

    async def l1_transition(self, key: str, from_state: str, to_state: str, now: float) -> bool:
        await anyio.lowlevel.checkpoint()
        row = self.l1.get(key)
        if row is None or row.state != from_state:
            return False
        self.l1[key] = msgspec.structs.replace(row, state=to_state, updated_at=now)
        return True

    async def l1_list(self, pid: int | None = None, states: Sequence[str] | None = None) -> list[L1Row]:
        await anyio.lowlevel.checkpoint()
        rows = [
            r
            for r in self.l1.values()
            if (pid is None or r.pid == pid) and (states is None or r.state in states)
        ]
        return sorted(rows, key=lambda r: (r.pid, r.base_offset, r.key))

    # -- events
    async def l1_compaction_commit(self, commit: CompactionCommit, now: float) -> str | None:
        await anyio.lowlevel.checkpoint()
        live = self.partitions.get(commit.pid) if commit.pid not in self.deleted else None
        accepted = self.cleaner_offsets.get(commit.pid, {})
        rows = {
            key: (self.l1[key].pid, self.l1[key].state)
            for key in (*commit.new_keys, *commit.superseded_keys)
            if key in self.l1
        }
        refusal = compaction_commit_refusal(commit, None if live is None else live.term, accepted, rows)
        if refusal is not None:
            return refusal
        self.cleaner_offsets[commit.pid] = dict(commit.cleaner_offsets)
        for key in commit.new_keys:
            self.l1[key] = msgspec.structs.replace(self.l1[key], state=L1State.COPY_FINISHED, updated_at=now)
            self.l1_compacted[key] = commit.pid
        for key in commit.superseded_keys:
            self.l1[key] = msgspec.structs.replace(self.l1[key], state=L1State.DELETE_STARTED, updated_at=now)
        return None

    async def l1_compaction_state(self, pid: int) -> CompactionState:
        # No checkpoint: every L1 lineage read asks this after l1_list, and a scheduling point
        # more would change every seeded simulation's schedule for topics that never compact.
        keys = frozenset(k for k, p in self.l1_compacted.items() if p == pid)
        return CompactionState(dict(self.cleaner_offsets.get(pid, {})), keys)

    async def record_l0_object(self, row: L0ObjectRow) -> None:
        self.l0_objects[row.key] = row

    async def mark_l0_deleted(self, keys: Sequence[str], at: float, m: int) -> None:
        for key in keys:
            row = self.l0_objects.get(key)
            if row is not None and row.deleted_at is None:
                self.l0_objects[key] = msgspec.structs.replace(row, deleted_at=at, deleted_at_m=m)

    async def l0_live_objects(
        self, max_epoch: int, after: tuple[int, str] | None = None, limit: int = 1000
    ) -> list[L0ObjectRow]:
        assert limit >= 1, limit
        await anyio.lowlevel.checkpoint()
        rows = sorted(
            (r for r in self.l0_objects.values() if r.deleted_at is None and r.epoch <= max_epoch),
            key=lambda r: (r.epoch, r.key),
        )
        if after is not None:
            rows = [r for r in rows if (r.epoch, r.key) > after]
        return rows[:limit]

    async def record_gc_round(self, row: GcRoundRow) -> None:
        self.gc_rounds.append(row)

    async def record_fence_events(self, rows: Sequence[FenceEventRow]) -> None:
        self.fence_events.extend(rows)

    async def record_state_samples(self, rows: Sequence[StateSampleRow]) -> None:
        self.state_samples.extend(rows)

    async def prune_history(self, before: float, limit: int) -> int:
        """As the SQL stores do (`storage/history.py`): the oldest rows first, the newest kept."""
        gone = 0
        for rows, at in (
            (self.fence_events, lambda r: r.at),
            (self.state_samples, lambda r: r.at),
            (self.gc_rounds, lambda r: r.finished_at),
        ):
            doomed = [i for i, row in enumerate(rows[:-1]) if at(row) < before][:limit]
            for i in reversed(doomed):
                del rows[i]
            gone += len(doomed)
        keys = list(self.l0_objects)
        doomed_keys = [
            k
            for k in keys[:-1]
            if (deleted := self.l0_objects[k].deleted_at) is not None and deleted < before
        ][:limit]
        for key in doomed_keys:
            del self.l0_objects[key]
        gone += len(doomed_keys)
        l1_keys = list(self.l1)
        finished = [
            k
            for k in l1_keys[:-1]
            if self.l1[k].state == L1State.DELETE_FINISHED and self.l1[k].updated_at < before
        ][:limit]
        for key in finished:
            del self.l1[key]
        marks = [k for k in sorted(self.l1_compacted)[:-1] if k not in self.l1][:limit]
        for key in marks:
            del self.l1_compacted[key]
        return gone + len(finished) + len(marks)

    # -- consumer offsets
    async def commit_offsets(self, rows: Sequence[OffsetRow]) -> None:
        await anyio.lowlevel.checkpoint()
        for row in rows:
            self.consumer_offsets[(row.group_id, row.topic, row.partition)] = row

    async def committed_offsets(self, group_id: str) -> list[OffsetRow]:
        return sorted(
            (row for (group, _, _), row in self.consumer_offsets.items() if group == group_id),
            key=lambda r: (r.topic, r.partition),
        )

    async def offset_groups(self) -> list[str]:
        return sorted({group for group, _, _ in self.consumer_offsets})

    async def delete_offsets(self, group_id: str, partitions: Sequence[tuple[str, int]] | None) -> None:
        await anyio.lowlevel.checkpoint()
        for key in list(self.consumer_offsets):
            if key[0] == group_id and (partitions is None or key[1:] in partitions):
                del self.consumer_offsets[key]

    async def expire_offsets(self, group_id: str, committed_before: float) -> None:
        await anyio.lowlevel.checkpoint()
        gone = [
            key
            for key, row in self.consumer_offsets.items()
            if key[0] == group_id and row.committed_at < committed_before
        ]
        for key in gone:
            del self.consumer_offsets[key]

    async def store_group_metadata(self, group_id: str, metadata: bytes | None, now: float) -> None:  # noqa: ARG002 - no times kept here
        await anyio.lowlevel.checkpoint()
        if metadata is None:
            self.group_metadata_rows.pop(group_id, None)
        else:
            self.group_metadata_rows[group_id] = metadata

    async def group_metadata(self, group_id: str) -> bytes | None:
        await anyio.lowlevel.checkpoint()
        return self.group_metadata_rows.get(group_id)

    async def metadata_groups(self) -> list[str]:
        await anyio.lowlevel.checkpoint()
        return sorted(self.group_metadata_rows)

    # -- topic configs
    async def topic_configs(self, topic: str | None = None) -> dict[str, dict[str, str]]:
        await anyio.lowlevel.checkpoint()
        return {t: dict(sorted(c.items())) for t, c in sorted(self.configs.items()) if topic in (None, t)}

    async def set_topic_configs(self, topic: str, configs: Mapping[str, str], now: float) -> None:  # noqa: ARG002 - no times kept here
        await anyio.lowlevel.checkpoint()
        if not any(row.topic == topic for row in self.partitions.values()):
            raise UnknownTopic(topic)
        if configs:
            self.configs[topic] = dict(configs)
        else:
            self.configs.pop(topic, None)

    async def aclose(self) -> None:
        pass
