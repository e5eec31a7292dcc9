"""The compactor: rewrites a compacted topic's reconciled L1 range into a new L1 object keeping
the latest record per key (seed 004; the rules are `core.compaction`'s).

Per partition pass, under the partition's leader like the reconciler: the valid L1 objects from
the partition's start, up to `object_bytes_max` of them, each scanned for its keys while the
next is read (`PassInput`: values are never decoded) → the records a pass may clean
(`clean_limit`: reconciled, older than `min.compaction.lag.ms`, the key map bounded) → the
records kept (`retain`), at their offsets, their stored bytes copied into the new object → the
new object recorded COPY_STARTED (with its newest timestamp), uploaded →
`l1_compaction_commit` with the cleaner-offset map extended by this term's entry. The store
accepts it only if the map lies within the term lineage (a zombie leader's result is refused,
whatever the arrival order), and then, in the same transaction, the new object goes
COPY_FINISHED and the superseded ones DELETE_STARTED: a reader sees one set or the other.
Only then are the superseded objects deleted, in one batched request (DELETE_FINISHED after
each); failed ones are retried by the node (`L1Catalog.retry_deletes`); a crash or a stop
before they go leaves them DELETE_STARTED, resumed by the partition's next term as it begins
(`L1Catalog.collect`) or, past the copy deadline, by its leader's running check
(`L1Catalog.collect_abandoned`); a refused result's own object is collected.

A pass is due when the partition's dirty ratio (bytes above the cleaner offset over all its L1
bytes) reaches `min.cleanable.dirty.ratio`. L0 data is never touched: the L0 rules (M(p), the
E − 1 cap, the GC) are unchanged.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import anyio.lowlevel

from levelzero.core.compaction import (
    KEY_MAP_ENTRIES_MAX,
    PassInput,
    build_compacted_object,
    clean_limit,
    cleaned_to,
    compaction_due,
    dirty_ratio,
    extend_cleaner_map,
    known_old,
    last_index_per_key,
    retain,
)
from levelzero.core.errors import InvalidInput, LevelZeroError, NotLeader
from levelzero.core.keys import format_l1_key, new_uuid
from levelzero.core.l0format import max_timestamp
from levelzero.core.topic_configs import TopicPolicy
from levelzero.storage.protocols import (
    CompactionCommit,
    L1Row,
    LogStore,
    ObjectStore,
    TransactionStore,
)

from .l1 import L1Catalog
from .partition import PartitionActor
from .wake_loop import WakeLoop

log = logging.getLogger("levelzero.compactor")


@dataclass(frozen=True, slots=True)
class CompactorConfig:
    interval_s: float = 15.0
    # The L1 bytes one pass reads, at most (the objects from the partition's start).
    object_bytes_max: int = 64 * 1024 * 1024
    key_map_entries_max: int = KEY_MAP_ENTRIES_MAX
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise InvalidInput("compactor interval_s must be > 0")
        if not 1024 <= self.object_bytes_max <= 1024 * 1024 * 1024:
            raise InvalidInput("compactor object_bytes_max must be in 1 KiB..1 GiB")
        if not 1 <= self.key_map_entries_max <= 10_000_000:
            raise InvalidInput("compactor key_map_entries_max must be in 1..10000000")


@dataclass(slots=True)
class PartitionCompaction:
    """What `status` says of one compacted partition."""

    dirty_ratio: float = 0.0
    last_compaction_at: float | None = None
    bytes_reclaimed: int = 0
    records_removed: int = 0
    tombstones_dropped: int = 0
    cleaner_offsets: dict[int, int] = field(default_factory=dict)
    passes: int = 0
    refused: int = 0
    not_compacted: str | None = None  # why the last visit did not compact

    def describe(self) -> dict[str, object]:
        return {
            "dirty_ratio": round(self.dirty_ratio, 4),
            "last_compaction_at": self.last_compaction_at,
            "bytes_reclaimed": self.bytes_reclaimed,
            "records_removed": self.records_removed,
            "tombstones_dropped": self.tombstones_dropped,
            "cleaner_offsets": {str(t): end for t, end in sorted(self.cleaner_offsets.items())},
            "passes": self.passes,
            "refused": self.refused,
            "not_compacted": self.not_compacted,
        }


@dataclass(slots=True)
class CompactorStatistics:
    rounds: int = 0
    passes: int = 0
    refused: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    errors: int = 0


class Compactor:
    def __init__(
        self,
        config: CompactorConfig,
        object_store: ObjectStore,
        log_store: LogStore,
        catalog: L1Catalog,
        partitions: Callable[[], list[PartitionActor]],
        policy: Callable[[str], TopicPolicy],
        *,
        wall_clock: Callable[[], float],
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self._objects = object_store
        self._log = log_store
        self.catalog = catalog
        self._partitions = partitions
        self._policy = policy
        self._wall = wall_clock
        self._rng = rng or random.Random()
        self.stats = CompactorStatistics()
        self.partitions: dict[str, PartitionCompaction] = {}
        self._loop = WakeLoop()

    def wake(self) -> None:
        self._loop.wake()

    async def run(self, *, task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await self._loop.run(self.config.interval_s, self.run_round)

    async def run_round(self) -> int:
        """One pass over every compacted partition led here; returns the passes that committed."""
        self.stats.rounds += 1
        done = 0
        actors = self._partitions()
        names = {actor.name for actor in actors}
        for name in [n for n in self.partitions if n not in names]:
            del self.partitions[name]
        for actor in actors:
            if not actor.ready.is_set() or not self._policy(actor.row.topic).compacted:
                continue
            try:
                if await self.compact_partition(actor):
                    done += 1
            except (NotLeader, anyio.ClosedResourceError):
                pass  # the partition moved on; its new leader compacts
            except LevelZeroError as exc:
                self.stats.errors += 1
                self._status(actor).not_compacted = f"failed: {exc}"
                log.warning("compacting %s failed, tried again next round: %s", actor.name, exc)
        return done

    def _status(self, actor: PartitionActor) -> PartitionCompaction:
        return self.partitions.setdefault(actor.name, PartitionCompaction())

    async def compact_partition(self, actor: PartitionActor, term: int | None = None) -> bool:
        """One compaction pass over `actor`'s reconciled L1 data; True if a result was accepted.
        `term` defaults to the actor's; a test passes an old one to play a zombie leader."""
        term = actor.term if term is None else term
        status = self._status(actor)
        policy = self._policy(actor.row.topic)
        if not policy.compacted:
            status.not_compacted = "cleanup.policy has no compact"
            return False
        rows = await self.catalog.refresh(actor)
        accepted = (await self._log.l1_compaction_state(actor.row.pid)).cleaner_offsets
        status.cleaner_offsets = dict(accepted)
        cleaned = cleaned_to(accepted)
        clean_bytes = sum(r.size for r in rows if r.last_offset <= cleaned)
        dirty_bytes = sum(r.size for r in rows if r.last_offset > cleaned)
        status.dirty_ratio = dirty_ratio(clean_bytes, dirty_bytes)
        dirty_since = min((r.created_at for r in rows if r.last_offset > cleaned), default=self._wall())
        dirty_age_ms = max(0, round((self._wall() - dirty_since) * 1000))
        due = compaction_due(
            clean_bytes,
            dirty_bytes,
            policy.min_cleanable_dirty_ratio,
            dirty_age_ms,
            policy.max_compaction_lag_ms,
        )
        if not due:
            status.not_compacted = (
                "no reconciled data above the cleaner offset"
                if not dirty_bytes
                else f"dirty ratio {status.dirty_ratio:.3f} below min.cleanable.dirty.ratio "
                f"{policy.min_cleanable_dirty_ratio} and the oldest dirty data ({dirty_age_ms} ms) "
                f"younger than max.compaction.lag.ms"
            )
            return False
        inputs = self._inputs(rows)
        scanned = PassInput()

        def scan(row: L1Row, data: bytes) -> None:
            self.stats.bytes_read += len(data)
            written_ms = round(row.created_at * 1000)
            scanned.add_object(
                data, row.base_offset, written_ms, row.max_timestamp_ms, f"L1 object {row.key}"
            )

        await self._read_each(inputs, scan)
        now_ms = round(self._wall() * 1000)
        lag_ms = policy.min_compaction_lag_ms
        # Kafka transactions (core.compaction): only below the last stable offset; the records of
        # aborted transactions supersede nothing. Read after the objects were listed: a
        # transaction opened since starts above them.
        clean_upto = actor.state.lro
        if isinstance(self._log, TransactionStore):
            ranges = await self._log.txn_ranges(actor.row.topic, actor.row.partition)
            open_from = min((r.first_offset for r in ranges if not r.aborted), default=None)
            if open_from is not None:
                clean_upto = min(clean_upto, open_from - 1)
            scanned.apply_transactions(
                [(r.producer_id, r.first_offset, r.last_offset) for r in ranges if r.aborted]
            )
        # The rows' newest timestamps usually show every record past the lag: no timestamp read.
        # Without a lag none is read at all (`clean_limit` looks at none then).
        known = lag_ms == 0 or known_old(scanned.objects, now_ms - lag_ms)
        timestamps = None if known else scanned.timestamps_ms()
        latest = last_index_per_key(scanned.keys)  # once, for both steps
        limit = clean_limit(
            scanned.offsets,
            scanned.keys,
            timestamps,
            scanned.written_at_ms,
            clean_upto,
            now_ms,
            lag_ms,
            self.config.key_map_entries_max,
            latest,
        )
        if limit <= cleaned:
            status.not_compacted = "nothing cleanable yet (min.compaction.lag.ms, or an open transaction)"
            return False
        kept = retain(
            scanned.offsets,
            scanned.keys,
            scanned.written_at_ms,
            limit,
            now_ms,
            policy.delete_retention_ms,
            scanned.encoded,
            latest,
        )
        base, last = inputs[0].base_offset, inputs[-1].last_offset
        assert kept.offsets[0] >= base and kept.offsets[-1] == last, (kept.offsets[:1], base, last)
        data = build_compacted_object(term, actor.row.pid, kept.offsets, kept.extent, len(kept.records))
        key = format_l1_key(
            actor.row.topic, actor.row.partition, base, last, term, new_uuid(self._rng.getrandbits(128))
        )
        lrlo = inputs[-1].last_log_offset
        row = L1Row.copy_started(
            key, actor.row.pid, base, last, lrlo, term, len(data), self._wall(), max_timestamp(kept.records)
        )
        await self._log.l1_insert(row)
        try:
            await self._objects.put(key, data)
        except LevelZeroError:
            await self._collect_quietly(actor, row, "upload failed")
            raise
        self.stats.bytes_written += len(data)
        claim = extend_cleaner_map(accepted, term, limit)
        commit = CompactionCommit(actor.row.pid, term, claim, (key,), tuple(r.key for r in inputs))
        refusal = await self._log.l1_compaction_commit(commit, self._wall())
        if refusal is not None:
            self.stats.refused += 1
            status.refused += 1
            status.not_compacted = f"result refused: {refusal}"
            log.warning("compaction of %s refused: %s", actor.name, refusal)
            await self._collect_quietly(actor, row, "compaction refused")
            return False
        # Accepted: the superseded objects are DELETE_STARTED; the new one serves their range.
        await self.catalog.refresh(actor)
        try:
            failed = await self.catalog.finish_superseded([old.key for old in inputs], actor.name)
        except LevelZeroError as exc:  # the control plane's DELETE_FINISHED: collected later
            log.warning("finishing the deletes of %s's superseded objects failed: %s", actor.name, exc)
        else:
            for key, why in failed.items():
                log.warning("deleting superseded %s failed, retried: %s", key, why)
        # Merging objects in which nothing was removed can come out a few bytes larger (one
        # object's framing for several): reclaimed is what shrank, never negative (a counter).
        bytes_in = sum(r.size for r in inputs)
        reclaimed = max(0, bytes_in - len(data))
        self.stats.passes += 1
        status.passes += 1
        status.last_compaction_at = self._wall()
        status.bytes_reclaimed += reclaimed
        status.records_removed += kept.removed
        status.tombstones_dropped += kept.tombstones_dropped
        status.cleaner_offsets = claim
        status.dirty_ratio = 0.0 if limit >= rows[-1].last_offset else status.dirty_ratio
        status.not_compacted = None
        log.info(
            "compacted %s [%d, %d] under term %d: %d records removed, %d objects of %d bytes "
            "into one of %d (%d bytes reclaimed)",
            actor.name,
            base,
            last,
            term,
            kept.removed,
            len(inputs),
            bytes_in,
            len(data),
            reclaimed,
        )
        return True

    async def _read_each(self, rows: list[L1Row], take: Callable[[L1Row, bytes], None]) -> None:
        """Each of `rows`' objects to `take`, in order, the next one read while `take` works on
        the one before: a GET waits on the store (a worker thread, or S3) while the scan waits
        on the CPU, so they overlap. One object ahead at most (a stream of size 0); a failure
        of either side is raised here, as itself, once both stopped."""
        send, receive = anyio.create_memory_object_stream[tuple[L1Row, bytes]](0)
        failure: LevelZeroError | None = None

        async def read() -> None:
            nonlocal failure
            async with send:
                for row in rows:
                    try:
                        data = await self._objects.get(row.key)
                    except LevelZeroError as exc:
                        failure = exc
                        return
                    await send.send((row, data))

        async with anyio.create_task_group() as tg, receive:
            tg.start_soon(read)
            async for row, data in receive:
                await anyio.lowlevel.checkpoint()  # the reader starts its next GET first
                try:
                    take(row, data)
                except LevelZeroError as exc:
                    failure = exc
                    tg.cancel_scope.cancel()
                    break
        if failure is not None:
            raise failure

    def _inputs(self, rows: list[L1Row]) -> list[L1Row]:
        """The valid objects from the partition's start, up to `object_bytes_max` (at least one):
        from the start, so a tombstone dropped has no older record of its key left before it."""
        assert rows
        inputs: list[L1Row] = []
        size = 0
        for row in rows:
            too_big = size + row.size > self.config.object_bytes_max
            if inputs and (too_big or row.base_offset != size_end(inputs)):
                break
            inputs.append(row)
            size += row.size
        return inputs

    async def _collect_quietly(self, actor: PartitionActor, row: L1Row, reason: str) -> None:
        try:
            await self.catalog.delete(actor, row, reason=reason)
        except LevelZeroError as exc:
            log.warning("deleting %s failed, collected later: %s", row.key, exc)


def size_end(rows: list[L1Row]) -> int:
    """The offset after the last of `rows` (contiguous objects: the next one starts there)."""
    return rows[-1].last_offset + 1
