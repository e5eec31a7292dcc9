"""L1 objects: the metastore lifecycle, the term lineage check, two-phase deletion and reads.

Lifecycle (like Kafka tiered storage): COPY_STARTED → COPY_FINISHED → DELETE_STARTED →
DELETE_FINISHED. An object counts only if COPY_FINISHED and within the partition's term lineage
(`PartitionState.l1_range_valid`). A delete is recorded DELETE_STARTED before the object store
delete and DELETE_FINISHED after, so a crash mid-delete resumes; and a delete is validated
against the *current* lineage first, so a zombie cannot delete data the current leader uses.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Collection, Sequence

from levelzero.core.errors import LevelZeroError, MalformedKey, ObjectNotFound, StorageError
from levelzero.core.keys import l1_partition_prefix, parse_l1_key
from levelzero.core.compaction import l1_object_runs
from levelzero.core.l0format import Record
from levelzero.core.l1_deletes import PendingDeletes
from levelzero.core.leader import l1_collect_reason
from levelzero.storage.protocols import (
    DELETE_BATCH_KEYS_MAX,
    L1Metastore,
    L1Row,
    L1State,
    ObjectStore,
    PartitionLog,
    iter_objects,
)

from .partition import PartitionActor
from .reader import FetchWindow

log = logging.getLogger("levelzero.l1")

# Failed deletes tried again in one reconciler round, at most (the rest wait for the next).
DELETE_RETRIES_PER_ROUND_MAX = 100
# Times one read follows the lineage after its object went (each a compaction committed meanwhile).
LINEAGE_MOVES_MAX = 4
# Moves of a partition's start offset remembered for the reasons of L1 deletes (`note_start_moved`).
START_MOVES_KEPT = 8
# What moves a start offset, as the reason of an L1 object's delete names it.
START_MOVED_BY_RETENTION = "retention"
START_MOVED_BY_DELETE_RECORDS = "DeleteRecords"
# The states `listing` reads (every one but DELETE_FINISHED).
UNFINISHED_STATES = (L1State.COPY_STARTED, L1State.COPY_FINISHED, L1State.DELETE_STARTED)


class L1Catalog:
    def __init__(
        self,
        object_store: ObjectStore,
        log_store: L1Metastore,
        wall_clock: Callable[[], float],
        *,
        delete_retry_first_s: float = 1.0,
        delete_retry_max_s: float = 300.0,
    ) -> None:
        self._objects = object_store
        self._log = log_store
        self._wall = wall_clock
        # pid -> valid objects sorted by base offset (a cache; the metastore is the truth)
        self._valid: dict[int, list[L1Row]] = {}
        # pid -> the partition's LRO when its lineage was last read into `_valid`
        self._valid_at_lro: dict[int, int] = {}
        # pid -> the keys of the objects compaction wrote (valid once COPY_FINISHED: only an
        # accepted compaction result moves them there, `l1_compaction_commit`)
        self._compacted: dict[int, frozenset[str]] = {}
        self.deleted = 0
        self.delete_refusals = 0
        # DELETE_STARTED objects whose store delete failed: retried while running, with backoff.
        self.pending_deletes = PendingDeletes(delete_retry_first_s, delete_retry_max_s)
        self.delete_failures = 0
        self.delete_retries = 0
        self.strays_deleted = 0  # objects of live partitions no row named (`sweep_strays`)
        # pid -> (term, [(from, to, what moved it)]): the start offset's moves this process made
        # in the partition's term, oldest first, consecutive ones of one cause merged.
        self._start_moves: dict[int, tuple[int, list[tuple[int, int, str]]]] = {}

    # ------------------------------------------------------------------ validity

    def is_compacted(self, row: L1Row) -> bool:
        return row.key in self._compacted.get(row.pid, frozenset())

    def is_valid(self, actor: PartitionActor, row: L1Row) -> bool:
        """COPY_FINISHED and within the term lineage: a reconciler's object by the terms'
        reconciled ranges; a compacted one because its result was accepted against the
        lineage (it is COPY_FINISHED only then), of a term the partition has reached, and
        below the reconciled offset."""
        return self._is_valid(actor, row, self._compacted.get(row.pid, frozenset()))

    @staticmethod
    def _is_valid(actor: PartitionActor, row: L1Row, compacted: frozenset[str]) -> bool:
        if row.state != L1State.COPY_FINISHED:
            return False
        state = actor.state
        if row.key in compacted:
            return row.term <= state.term and row.last_offset <= state.lro
        return state.l1_range_valid(row.term, row.base_offset, row.last_offset)

    async def refresh(self, actor: PartitionActor) -> list[L1Row]:
        """The partition's lineage (its valid objects, in offset order), read again."""
        return self._lineage_of(actor, await self._listed(actor, [L1State.COPY_FINISHED]))

    async def listing(self, actor: PartitionActor) -> tuple[list[L1Row], list[L1Row]]:
        """Every L1 row of the partition whose delete is not over, and the lineage read again
        from them (as `refresh` returns it): what retention and `collect` need, in one read.
        (A DELETE_FINISHED row asks nothing of them; a partition keeps one for every object
        retention, DeleteRecords or compaction removed, until history pruning: read every
        second by the housekeeper, they were most of what it read.)"""
        rows = await self._listed(actor, UNFINISHED_STATES)
        return rows, self._lineage_of(actor, rows)

    async def _listed(self, actor: PartitionActor, states: Sequence[str] | None) -> list[L1Row]:
        # The rows first, the compacted keys after: a compaction committed in between shows its
        # superseded objects (still stored until their delete), never its new ones unmarked.
        rows = await self._log.l1_list(actor.row.pid, states)
        await self.refresh_compacted(actor)
        return rows

    def _lineage_of(self, actor: PartitionActor, rows: Sequence[L1Row]) -> list[L1Row]:
        valid = sorted((r for r in rows if self.is_valid(actor, r)), key=lambda r: r.base_offset)
        self._valid[actor.row.pid] = valid
        self._valid_at_lro[actor.row.pid] = actor.state.lro
        return valid

    async def refresh_compacted(self, actor: PartitionActor) -> None:
        state = await self._log.l1_compaction_state(actor.row.pid)
        self._compacted[actor.row.pid] = state.compacted_keys

    def lineage(self, actor: PartitionActor) -> list[dict[str, int | str]]:
        """The cached lineage (none before the partition's first read, catch-up, compaction or
        retention visit since the start)."""
        return _shown(self._valid.get(actor.row.pid, []))

    async def status_lineage(self, actor: PartitionActor) -> list[dict[str, int | str]]:
        """The partition's lineage as status shows it: the cached one, unless none is cached
        (right after a start) or the LRO moved since it was read and it does not reach the
        LRO (the reconciler reads the lineage again only after its catch-up moved the LRO: a
        status in between showed the LRO past the lineage's last object); then the one the
        metastore holds now, read without caching it (`read_lineage`). A lineage that ends
        below the LRO for good (its objects collected, an abandoned tail) is not read again
        once cached at that LRO."""
        pid = actor.row.pid
        rows = self._valid.get(pid)
        lro = actor.state.lro
        if rows is None or (
            self._valid_at_lro.get(pid, -1) < lro and (rows[-1].last_offset if rows else -1) < lro
        ):
            rows = await self.read_lineage(actor)
        return _shown(rows)

    async def read_lineage(self, actor: PartitionActor) -> list[L1Row]:
        """The partition's lineage read from the metastore (its rows, then the compacted keys,
        as `_listed` reads them), leaving the cache alone: a read finishing after a concurrent
        delete dropped an object from the cache, or a refresh cached a newer lineage, must not
        put back the older one for the reads the cache serves."""
        pid = actor.row.pid
        rows = await self._log.l1_list(pid, [L1State.COPY_FINISHED])
        compacted = (await self._log.l1_compaction_state(pid)).compacted_keys
        return sorted((r for r in rows if self._is_valid(actor, r, compacted)), key=lambda r: r.base_offset)

    def holds_below_start(self, actor: PartitionActor) -> bool:
        """Whether the cached lineage begins with an object wholly below the start offset (no
        read): `collect` has work there, without retention (DeleteRecords moved the start
        offset, and its own collection failed or the reconciler copied records below it)."""
        rows = self._valid.get(actor.row.pid)
        return rows is not None and bool(rows) and rows[0].last_offset < actor.state.start_offset

    def forget_gone(self, pids: Collection[int]) -> None:
        """Drop what is cached for partitions no longer led here (`pids`: those that are): what
        the catalog keeps per partition stays bounded by the partitions led, however many
        topics come and go, and a partition led here again starts from the metastore, not
        from a lineage cached in an earlier leadership (another node may have reconciled,
        compacted or collected it meanwhile)."""
        for cache in (self._valid, self._valid_at_lro, self._compacted, self._start_moves):
            for pid in [p for p in cache if p not in pids]:
                del cache[pid]

    # ------------------------------------------------------------------ deletion

    def note_start_moved(self, actor: PartitionActor, before: int, after: int, by: str) -> None:
        """The start offset moved from `before` to `after`, by `by` (retention, DeleteRecords):
        `collect` names it as the reason of deleting the objects it moved past."""
        pid = actor.row.pid
        term, moves = self._start_moves.get(pid, (actor.term, []))
        if term != actor.term:
            moves = []
        if moves and moves[-1][2] == by and moves[-1][1] == before:
            moves[-1] = (moves[-1][0], after, by)
        else:
            moves.append((before, after, by))
            del moves[:-START_MOVES_KEPT]
        self._start_moves[pid] = (actor.term, moves)

    def _start_moved_by(self, actor: PartitionActor, last_offset: int) -> str | None:
        """What moved the start offset past `last_offset` in this term, if this process did."""
        term, moves = self._start_moves.get(actor.row.pid, (None, []))
        if term != actor.term:
            return None
        for before, after, by in moves:
            if before <= last_offset < after:
                return by
        return None

    async def delete(self, actor: PartitionActor, row: L1Row, *, reason: str) -> bool:
        """Two-phase delete. Refuses an object the current lineage still serves."""
        state = actor.state
        if row.term > actor.term:
            # Written under a newer term than the deleter knows: the deleter is a zombie.
            self.delete_refusals += 1
            log.warning(
                "refusing to delete %s: term %d is newer than %s's term %d",
                row.key,
                row.term,
                actor.name,
                actor.term,
            )
            return False
        serving = self.is_valid(actor, row) and row.last_offset >= state.start_offset
        if serving:
            self.delete_refusals += 1
            log.warning("refusing to delete %s (%s): the current lineage serves it", row.key, reason)
            return False
        now = self._wall()
        if row.state != L1State.DELETE_STARTED and not await self._log.l1_transition(
            row.key, row.state, L1State.DELETE_STARTED, now
        ):
            return False  # somebody else moved it first
        self._drop_cached(actor.row.pid, row.key)  # no longer COPY_FINISHED: not served
        await self._finish_delete(row.key, actor.name)
        log.info("deleted L1 object %s (%s)", row.key, reason)
        return True

    async def finish_superseded(self, keys: Sequence[str], partition: str) -> dict[str, LevelZeroError]:
        """The store deletes of the objects an accepted compaction result superseded: their rows
        went DELETE_STARTED in the result's commit, validated against the lineage there.
        Returns the keys whose delete failed, each noted for a retry, with its error."""
        return await self._finish_deletes(keys, partition)

    async def retry_deletes(self, limit: int = DELETE_RETRIES_PER_ROUND_MAX) -> int:
        """Try again the failed deletes that are due (at most `limit`); returns how many went.
        Their rows are DELETE_STARTED: the decision to delete was validated when it was made,
        and finishing it is idempotent, so no lineage check is needed again."""
        done = 0
        for entry in self.pending_deletes.due(self._wall(), limit):
            self.delete_retries += 1
            try:
                await self._finish_delete(entry.key, entry.partition)
            except LevelZeroError as exc:
                # Noted again by `_finish_delete`. Another path (a collection, a compaction's
                # clean-up) may have finished or failed the same key while this delete was on
                # its way (deletes are idempotent): the entry is then a fresh one, or none if
                # the table filled meanwhile.
                again = self.pending_deletes.get(entry.key)
                log.warning(
                    "L1 delete of %s failed again (%s), next try in %s: %s",
                    entry.key,
                    "untracked" if again is None else f"{again.failures} times since {again.since:.0f}",
                    "-" if again is None else f"{again.next_retry_at - self._wall():.1f} s",
                    exc,
                )
            else:
                done += 1
                log.info("deleted L1 object %s on retry %d", entry.key, entry.failures)
        return done

    async def _finish_delete(self, key: str, partition: str) -> None:
        """The store delete, then DELETE_FINISHED; a failure is noted for a retry and raised."""
        failed = await self._finish_deletes([key], partition)
        if key in failed:
            raise failed[key]

    async def _finish_deletes(self, keys: Sequence[str], partition: str) -> dict[str, LevelZeroError]:
        """The store deletes, one request per `DELETE_BATCH_KEYS_MAX` keys (S3's DeleteObjects),
        then DELETE_FINISHED for each that went; each failure is noted for a retry and
        returned. A failure of the control plane is raised (the rows stay DELETE_STARTED: the
        next collection resumes them)."""
        failed: dict[str, LevelZeroError] = {}
        for start in range(0, len(keys), DELETE_BATCH_KEYS_MAX):
            batch = list(keys[start : start + DELETE_BATCH_KEYS_MAX])
            stored = [key for key in batch if _storable(key)]
            try:
                result = await self._objects.delete_many(stored) if stored else None
            except LevelZeroError as exc:
                failed.update(dict.fromkeys(stored, exc))
            else:
                for key, why in (result.errors if result else {}).items():
                    failed[key] = StorageError(f"deleting {key} failed: {why}")
            for key in batch:
                error = failed.get(key)
                if error is not None:
                    self.delete_failures += 1
                    self.pending_deletes.note_failure(key, partition, f"{error.code}: {error}", self._wall())
                    continue
                await self._log.l1_transition(
                    key, L1State.DELETE_STARTED, L1State.DELETE_FINISHED, self._wall()
                )
                self.pending_deletes.note_done(key)
                self.deleted += 1
        return failed

    def _drop_cached(self, pid: int, key: str) -> None:
        rows = self._valid.get(pid)
        if rows:
            self._valid[pid] = [r for r in rows if r.key != key]

    async def collect(
        self, actor: PartitionActor, copy_deadline_s: float, rows: Sequence[L1Row] | None = None
    ) -> int:
        """Resume unfinished deletes, collect stale COPY_STARTED and out-of-lineage objects,
        and objects entirely below the start offset (retention or DeleteRecords moved it: the
        reason logged says which, `note_start_moved`). `rows`: the partition's rows
        as `listing` just read them (else read here). Each delete is a conditional transition
        from the state listed, so a row that moved since is left alone; `delete` drops what it
        deletes from the lineage, and the reconciler and the compactor read it again after
        their commits (no read again here)."""
        now = self._wall()
        deleted = 0
        state = actor.state
        if rows is None:
            rows, _ = await self.listing(actor)
        for row in rows:  # (a DELETE_FINISHED row has no reason: `l1_collect_reason`)
            reason = l1_collect_reason(
                state,
                actor.term,
                row_term=row.term,
                last_offset=row.last_offset,
                lineage_valid=self.is_valid(actor, row),
                copy_finished=row.state == L1State.COPY_FINISHED,
                delete_started=row.state == L1State.DELETE_STARTED,
                stale_copy=self._is_stale_copy(row, now, copy_deadline_s),
                start_moved_by=self._start_moved_by(actor, row.last_offset),
            )
            if reason is None:
                continue
            try:
                if await self.delete(actor, row, reason=reason):
                    deleted += 1
            except LevelZeroError as exc:
                log.warning("L1 delete of %s failed, retried later: %s", row.key, exc)
        return deleted

    @staticmethod
    def _is_stale_copy(row: L1Row, now: float, copy_deadline_s: float) -> bool:
        return row.state == L1State.COPY_STARTED and now - row.updated_at > copy_deadline_s

    async def collect_abandoned(self, actor: PartitionActor, deadline_s: float) -> int:
        """Collect the partition's copies and deletes left unfinished for longer than the
        deadline: COPY_STARTED objects a crash (or a stuck upload) abandoned, and DELETE_STARTED
        ones whose deleter stopped before finishing (a compaction's superseded objects whose
        delete failed just before its node stopped: the retries were in that node's memory).
        `collect` does this too, but it reads every row of the partition; this reads only the
        unfinished ones, cheap enough to run while the daemon runs. A delete retried here
        already (`pending_deletes`) keeps its own schedule."""
        now = self._wall()
        deleted = 0
        rows = await self._log.l1_list(actor.row.pid, [L1State.COPY_STARTED, L1State.DELETE_STARTED])
        for row in rows:
            if now - row.updated_at <= deadline_s:
                continue
            if row.state == L1State.COPY_STARTED:
                reason = "stale COPY_STARTED"
            elif self.pending_deletes.get(row.key) is None:
                reason = "resuming an abandoned delete"
            else:
                continue
            try:
                if await self.delete(actor, row, reason=reason):
                    deleted += 1
            except LevelZeroError as exc:
                log.warning("L1 delete of %s failed, retried later: %s", row.key, exc)
        return deleted

    # ------------------------------------------------------------------ strays of live partitions

    async def sweep_strays(self, actor: PartitionActor, grace_s: float) -> int:
        """Delete the objects under the partition's key prefix that no row of it names (a
        DELETE_FINISHED row names none) and that the store last modified more than `grace_s`
        ago; returns how many went.

        Such an object can never become referenced again: a running writer (the reconciler, the
        compactor) records its row before the upload and no row of a live partition is ever
        removed, so listed first and rows read after, a listed key of a running writer has its
        row by then. What it leaves: a restore's lost history, an interrupted adoption's copies
        (adoption uploads first, but only while no daemon runs), an upload that landed after its
        copy was collected and its writer stopped (its row is DELETE_FINISHED). The grace is a
        margin on top (the store's clock against this node's). Only keys that parse as this
        partition's L1 keys are deleted. A failed delete raises; the caller tries the sweep
        again later."""
        try:
            prefix = l1_partition_prefix(actor.row.topic, actor.row.partition)
        except MalformedKey:
            return 0  # a name no store can hold: no object was ever stored under it
        assert prefix.endswith("/"), prefix  # partition 1's prefix is not partition 10's
        now = self._wall()
        old = [
            obj.key
            async for obj in iter_objects(self._objects, prefix)
            if now - obj.last_modified > grace_s and self._is_own_key(actor, obj.key)
        ]
        if not old:
            return 0
        # A DELETE_FINISHED row names a key whose delete is over: an object there is an upload
        # that landed after its copy was collected (the writer stopped before deleting it), and
        # nothing reads or adopts a key in that state.
        named = {
            row.key for row in await self._log.l1_list(actor.row.pid) if row.state != L1State.DELETE_FINISHED
        }
        strays = [key for key in old if key not in named]
        deleted = 0
        try:
            for start in range(0, len(strays), DELETE_BATCH_KEYS_MAX):
                batch = strays[start : start + DELETE_BATCH_KEYS_MAX]
                result = await self._objects.delete_many(batch)
                gone = len(batch) - len(result.errors)
                deleted += gone
                self.strays_deleted += gone
                if result.errors:
                    key, error = next(iter(result.errors.items()))
                    raise StorageError(f"deleting {key} failed: {error}")
        finally:
            if deleted:
                log.info(
                    "deleted %d L1 objects of %s that no row named (older than %.0f s)",
                    deleted,
                    actor.name,
                    grace_s,
                    extra={"partition": actor.name},
                )
        return deleted

    @staticmethod
    def _is_own_key(actor: PartitionActor, key: str) -> bool:
        try:
            parsed = parse_l1_key(key)
        except MalformedKey:
            return False  # not one levelzero writes: left alone
        return (parsed.topic, parsed.partition) == (actor.row.topic, actor.row.partition)

    # ------------------------------------------------------------------ deleted topics

    async def collect_deleted(self, partitions: PartitionLog) -> int:
        """Collect the L1 objects of deleted topics' partitions; returns how many went.

        Per deleted partition: every row not yet DELETE_FINISHED goes DELETE_STARTED then
        DELETE_FINISHED around the store delete (a crash between resumes here: the deleted
        partition is kept until `forget_deleted_partition` finds every row finished); then its
        key prefix is listed for objects no row names (a writer that crashed between its upload
        and its row's end), and a key is deleted unless a live partition of the same name (the
        topic made again) has a row for it. Listed first, rows read after: a live partition
        records a row before it uploads, so a listed key of its has its row by then. A copy in
        flight when the topic went cannot land unseen either: the store refuses its row after
        the deletion, and a row recorded before is collected here (if the upload lands after
        its delete, the reconciler's own COPY_FINISHED fails and it deletes the object)."""
        deleted = 0
        for row in await partitions.deleted_partitions():
            name = f"{row.topic}/{row.partition}"
            finished = True
            for l1 in await self._log.l1_list(row.pid):
                if l1.state == L1State.DELETE_FINISHED:
                    continue
                if l1.state != L1State.DELETE_STARTED and not await self._log.l1_transition(
                    l1.key, l1.state, L1State.DELETE_STARTED, self._wall()
                ):
                    finished = False  # moved meanwhile (its writer finishing): next round
                    continue
                try:
                    await self._finish_delete(l1.key, name)
                except LevelZeroError as exc:
                    finished = False
                    log.warning("L1 delete of %s (deleted topic) failed, retried later: %s", l1.key, exc)
                else:
                    deleted += 1
            if not finished:
                continue
            try:
                deleted += await self._sweep_deleted(partitions, row.topic, row.partition)
            except LevelZeroError as exc:
                log.warning("listing the L1 objects of deleted %s failed, retried later: %s", name, exc)
                continue
            if await partitions.forget_deleted_partition(row.pid):
                log.info("every L1 object of deleted partition %s is gone", name)
        return deleted

    async def _sweep_deleted(self, partitions: PartitionLog, topic: str, partition: int) -> int:
        """Delete the objects under a deleted partition's key prefix that no live partition of
        the same name has a row for (see `collect_deleted`)."""
        try:
            prefix = l1_partition_prefix(topic, partition)
        except MalformedKey:
            return 0  # a name no store can hold: no object was ever stored under it
        keys = [obj.key async for obj in iter_objects(self._objects, prefix)]
        if not keys:
            return 0
        rows = await partitions.list_partitions()
        live = [r.pid for r in rows if (r.topic, r.partition) == (topic, partition)]
        named = {l1.key for pid in live for l1 in await self._log.l1_list(pid)}
        strays = [key for key in keys if key not in named]
        for start in range(0, len(strays), DELETE_BATCH_KEYS_MAX):
            batch = strays[start : start + DELETE_BATCH_KEYS_MAX]
            result = await self._objects.delete_many(batch)
            if result.errors:
                key, error = next(iter(result.errors.items()))
                raise StorageError(f"deleting {key} failed: {error}")
        if strays:
            log.info("deleted %d L1 objects no row named under %s", len(strays), prefix)
        return len(strays)

    # ------------------------------------------------------------------ reads

    async def fill(self, actor: PartitionActor, window: FetchWindow) -> None:
        """Fill `window` from the valid L1 objects holding its next offset and those after it,
        one object after another, until it stops (its `upto` is at most the LRO). The cached
        lineage is read again once when it does not reach far enough. An object gone after the
        first (retention, or a delete racing this read) ends the fill there: the records taken
        are still the partition's."""
        rows = self._valid.get(actor.row.pid)
        refreshed = not rows
        if refreshed:
            rows = await self.refresh(actor)
        assert rows is not None
        moves = 0
        while True:
            offset = window.next_offset
            i = bisect.bisect_right([r.base_offset for r in rows], offset) - 1
            if i >= 0 and rows[i].last_offset >= offset:
                try:
                    for row in rows[i:]:
                        if not await self._fill_from(row, window):
                            return
                except ObjectNotFound as exc:
                    # Its first object went: a compaction's superseded object deleted after the
                    # lineage was read (cached, or read just before the GET went out). The lineage
                    # read again has its successor; if it still names the object, it is lost.
                    rows, refreshed = await self.refresh(actor), True
                    moves += 1
                    if moves > LINEAGE_MOVES_MAX or any(r.key == exc.key for r in rows):
                        raise
                    continue
            elif window.count and refreshed:
                return  # the lineage goes no further (offsets an operator abandoned)
            elif refreshed:
                raise ObjectNotFound(f"{actor.name}: no valid L1 object holds offset {offset}")
            if refreshed:
                return
            rows, refreshed = await self.refresh(actor), True

    async def _fill_from(self, row: L1Row, window: FetchWindow) -> bool:
        try:
            runs = await self.read_runs(row)
        except ObjectNotFound:
            if not window.count:
                raise
            return False
        compacted = self.is_compacted(row)
        return all(window.add_extent(base, records, gaps=compacted) for base, records in runs)

    async def rows_reaching(self, actor: PartitionActor, offset: int) -> list[L1Row]:
        """The valid objects by base offset, read again from the metastore when the cached
        ones end below `offset` (the LRO: a catch-up this node did not make)."""
        rows = self._valid.get(actor.row.pid)
        if not rows or rows[-1].last_offset < offset:
            rows = await self.refresh(actor)
        return rows

    async def read_runs(self, row: L1Row) -> list[tuple[int, list[Record]]]:
        """The object's runs of records at consecutive offsets, verified (one GET): one run,
        or several where compaction left gaps. Raises ObjectNotFound."""
        data = await self._objects.get(row.key)
        return l1_object_runs(data, row.base_offset, f"L1 object {row.key}")


def _shown(rows: Sequence[L1Row]) -> list[dict[str, int | str]]:
    return [
        {"base_offset": r.base_offset, "last_offset": r.last_offset, "term": r.term, "key": r.key}
        for r in rows
    ]


def _storable(key: str) -> bool:
    """Can a store hold `key`? Not one recorded before its upload was refused (a topic name an
    older levelzero accepted): there is no object to delete, and asking the store would fail
    on every retry."""
    try:
        parse_l1_key(key)
    except MalformedKey:
        log.info("L1 object %s was never stored (no store can hold its key)", key)
        return False
    return True
