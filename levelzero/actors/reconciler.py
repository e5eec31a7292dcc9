"""The reconciler: copies each partition's L0 extents into per-partition L1 objects and tells the
partition how far it has caught up. This is what makes L0 data collectable at all: a partition's
`min_epoch_lower_bound` only moves once its LRLO reaches the entry that opened its window.

Per partition batch: read placeholders `(LRO, HWM)` up to a byte budget → fetch and verify their
extents (pinning `M(p)` while reading) → record the L1 object COPY_STARTED → upload → record
COPY_FINISHED → append `AdvanceReconciledOffset` with the term the placeholders were read under.
A catch-up whose term is no longer current is rejected by the conditional append; the object it
would have covered is then outside the lineage and is deleted through the two-phase states.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field

import anyio
import msgspec

from levelzero.core.activity import ActivityBoard
from levelzero.core.entries import LogRecord, Placeholder
from levelzero.core.errors import InvalidInput, LevelZeroError, MalformedKey, NotLeader
from levelzero.core.keys import format_l1_key, new_uuid
from levelzero.core.names import topic_name_problem, unstorable_topic_advice
from levelzero.core.reconcile_health import ReconcileHealth, utc_time
from levelzero.core.l0format import Record, build_object, decode_extent, encode_extent, max_timestamp
from levelzero.storage.protocols import L1Row, L1State, LogStore, ObjectStore

from .fan_out import for_each
from .l1 import L1Catalog
from .partition import PartitionActor
from .round_reads import RoundReads
from .wake_loop import WakeLoop

log = logging.getLogger("levelzero.reconciler")

# While running, each partition's unfinished copies and deletes are checked this many times per
# `copy_deadline_s`, so one abandoned by a crash goes at most a quarter deadline late.
STALE_COPY_CHECKS_PER_DEADLINE = 4
# Partitions whose key prefix one round sweeps for stray L1 objects, at most (a LIST each, and
# their deletes): the others stay due and are swept in the rounds after.
STRAY_SWEEPS_PER_ROUND_MAX = 16
# A sweep that failed is tried again after this (or the interval, if shorter).
STRAY_SWEEP_RETRY_S = 300.0
STRAY_GRACE_S_MIN = 60.0
STRAY_TIMES_S_MAX = 30 * 86_400.0


@dataclass(frozen=True, slots=True)
class ReconcilerConfig:
    interval_s: float = 1.0
    object_bytes_max: int = 8 * 1024 * 1024
    # A partition's L1 object is written once its unreconciled data reaches `object_bytes_min`
    # or has waited `object_age_max_s` (from the pass that first saw it), not on every pass:
    # each L1 object is a PUT now and a GET per reader later. 0 and 0: every pass, whatever it
    # holds. The price: M(p), and with it the GC of L0 objects, rises that much later.
    object_bytes_min: int = 4 * 1024 * 1024
    object_age_max_s: float = 30.0
    placeholders_per_object_max: int = 4096
    partitions_in_flight_max: int = 4
    # A round reads each L0 object once for all the partitions it copies (`round_reads.py`),
    # holding at most this many bytes of such spans at once; 0: one GET per extent.
    read_buffer_bytes_max: int = 64 * 1024 * 1024
    # COPY_STARTED older than this is collected; DELETE_STARTED older than this and not being
    # retried here is finished (its deleter stopped before finishing it)
    copy_deadline_s: float = 600.0
    # A failed L1 delete is tried again after this, doubling up to delete_retry_max_s.
    delete_retry_first_s: float = 1.0
    delete_retry_max_s: float = 300.0
    # An L1 object of a partition led here that no row of it names is deleted once older than
    # l1_stray_grace_s (`L1Catalog.sweep_strays`): each partition's prefix is swept soon after
    # this node starts leading it, then every l1_stray_sweep_interval_s (a LIST each; 0: never).
    l1_stray_grace_s: float = 3600.0
    l1_stray_sweep_interval_s: float = 86_400.0
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.copy_deadline_s <= 0:
            raise InvalidInput("reconciler interval_s and copy_deadline_s must be > 0")
        if not STRAY_GRACE_S_MIN <= self.l1_stray_grace_s <= STRAY_TIMES_S_MAX:
            raise InvalidInput(
                f"reconciler l1_stray_grace_s must be in {STRAY_GRACE_S_MIN:.0f}..{STRAY_TIMES_S_MAX:.0f}"
            )
        interval = self.l1_stray_sweep_interval_s
        if interval != 0 and not STRAY_GRACE_S_MIN <= interval <= STRAY_TIMES_S_MAX:
            raise InvalidInput(
                "reconciler l1_stray_sweep_interval_s must be 0 (never) or in "
                f"{STRAY_GRACE_S_MIN:.0f}..{STRAY_TIMES_S_MAX:.0f}"
            )
        if not 0 < self.delete_retry_first_s <= self.delete_retry_max_s <= 86_400:
            raise InvalidInput("reconciler needs 0 < delete_retry_first_s <= delete_retry_max_s <= 86400")
        if not 1024 <= self.object_bytes_max <= 256 * 1024 * 1024:
            raise InvalidInput("reconciler object_bytes_max must be in 1 KiB..256 MiB")
        if not 1 <= self.partitions_in_flight_max <= 256:
            raise InvalidInput("reconciler partitions_in_flight_max must be in 1..256")
        if not 1 <= self.placeholders_per_object_max <= 100_000:
            raise InvalidInput("reconciler placeholders_per_object_max must be in 1..100000")
        if not 0 <= self.object_bytes_min <= self.object_bytes_max:
            raise InvalidInput("reconciler object_bytes_min must be in 0..object_bytes_max")
        if not 0 <= self.object_age_max_s <= 3600:
            raise InvalidInput("reconciler object_age_max_s must be in 0..3600")
        if not 0 <= self.read_buffer_bytes_max <= 4 * 1024 * 1024 * 1024:
            raise InvalidInput("reconciler read_buffer_bytes_max must be in 0..4 GiB")


@dataclass(slots=True)
class ReconcilerStatistics:
    rounds: int = 0
    partitions_visited: int = 0  # grows with active partitions, not with all of them
    objects_written: int = 0
    bytes_written: int = 0
    records_reconciled: int = 0
    catch_ups_rejected: int = 0
    errors: int = 0
    l0_span_gets: int = 0  # GETs of an L0 object's span shared by several partitions' extents
    l0_extent_gets: int = 0  # GETs of one extent
    l0_extents_from_spans: int = 0  # extents sliced from a shared span
    partitions_deferred: int = 0  # copied in a later wave of their round: the read buffer was full
    stray_sweeps: int = 0  # partitions' key prefixes swept for L1 objects no row names
    stray_sweep_errors: int = 0
    lag_offsets: dict[str, int] = field(default_factory=dict)
    lag_bytes: dict[str, int] = field(default_factory=dict)


class Reconciler:
    def __init__(
        self,
        config: ReconcilerConfig,
        object_store: ObjectStore,
        log_store: LogStore,
        catalog: L1Catalog,
        partitions: Callable[[], list[PartitionActor]],
        *,
        wall_clock: Callable[[], float],
        rng: random.Random | None = None,
        activity: ActivityBoard | None = None,
        index: Callable[[], Mapping[str, PartitionActor]] | None = None,
        strays_held: Callable[[], bool] | None = None,
    ) -> None:
        assert (activity is None) == (index is None), "activity needs the index to find names"
        self.config = config
        # Whether stray L1 objects are to stay for now (the node's GC is paused: an operator
        # looking at a restore before anything is deleted); the sweeps wait until it resumes.
        self._strays_held = strays_held or (lambda: False)
        self._objects = object_store
        self._log = log_store
        self.catalog = catalog
        self._partitions = partitions
        self._wall = wall_clock
        self._rng = rng or random.Random()  # injected: a simulation's L1 keys replay exactly
        self.stats = ReconcilerStatistics()
        self.health = ReconcileHealth()  # which partitions keep failing (status, explain, metrics)
        self._loop = WakeLoop()
        # pid -> the term whose start-up collection ran here: each term of leadership here
        # resumes the deletes left unfinished before it (a previous leader's, or this node's
        # own from an earlier term: its in-memory retries do not outlive a stop)
        self._recovered: dict[int, int] = {}
        self._stale_copies_checked_at: float | None = None
        # pid -> (the term it was last swept under here, when it is due again): swept at each
        # term's start here, then every `l1_stray_sweep_interval_s`
        self._strays_due: dict[int, tuple[int, float]] = {}
        # Partitions seen due for a sweep and not swept yet: a round sweeps the first
        # STRAY_SWEEPS_PER_ROUND_MAX of them (in partition order), later rounds the rest
        # (without visiting them again).
        self._sweeps_waiting: set[str] = set()
        # Proportional to active partitions (core.activity): a round visits the partitions that
        # moved since the last round and those a round left with work (unreconciled data, a
        # failure, not ready); all of them in the first round (start-up collection) and when the
        # check of unfinished copies and deletes is due.
        self._activity = activity
        self._index = index
        self._unfinished: set[str] = set()
        # Partitions holding unreconciled data not yet due for an L1 object: name -> (when a
        # pass first saw it, the partition's `size_bytes` then). Memory only: after a restart
        # the wait starts again, the L0 data staying until it is reconciled.
        self._waiting: dict[str, tuple[float, int]] = {}

    def wake(self) -> None:
        self._loop.wake()

    async def run(self, *, task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await self._loop.run(self.config.interval_s, self.run_round)

    async def run_round(self) -> int:
        """One pass over every partition; returns the number of L1 objects written."""
        self.stats.rounds += 1
        written = 0
        now = self._wall()
        check_every_s = self.config.copy_deadline_s / STALE_COPY_CHECKS_PER_DEADLINE
        check_stale_copies = (
            self._stale_copies_checked_at is None or now - self._stale_copies_checked_at >= check_every_s
        )
        if check_stale_copies:
            self._stale_copies_checked_at = now

        # Deletes that failed (an abandoned copy's clean-up, a rejected catch-up's object):
        # their objects would stay in the bucket until a restart otherwise.
        await self.catalog.retry_deletes()

        async def one(reads: RoundReads, actor: PartitionActor) -> None:
            self.stats.partitions_visited += 1
            try:
                await visit(actor, reads)
            finally:
                if actor.state.has_unreconciled_data or self.health.get(actor.name) is not None:
                    self._unfinished.add(actor.name)
                else:
                    self._unfinished.discard(actor.name)

        async def visit(actor: PartitionActor, reads: RoundReads) -> None:
            nonlocal written
            try:
                term = actor.term
                if self._recovered.get(actor.row.pid) != term:
                    # A term's start here: resume unfinished deletes, collect stale copies.
                    await self.catalog.collect(actor, self.config.copy_deadline_s)
                    self._recovered[actor.row.pid] = term
                elif check_stale_copies:
                    # A copy a crash left COPY_STARTED, a delete a stopped deleter left
                    # DELETE_STARTED; neither needs a restart or a new term to go.
                    await self.catalog.collect_abandoned(actor, self.config.copy_deadline_s)
                if self._sweep_due(actor):
                    self._sweeps_waiting.add(actor.name)  # swept after the copies
                if not self.health.retry_due(actor.name, self._wall()):
                    self._note_lag(actor)
                    return  # failing: tried again every RECONCILE_FAILING_RETRY_S
                if not self._due_for_object(actor):
                    self._note_lag(actor)
                    return  # growing: its L0 data stays until it is reconciled
                # What was due when the round began (several objects if it is more than one
                # holds); records that arrived since wait for their own object, counted from
                # the next pass that sees them. (Copying them too made a second, small object
                # whenever a copy waited: for a partition of a later wave, nearly always.)
                due_end = due_ends.get(actor.name, actor.state.high_watermark)
                while actor.state.has_unreconciled_data and actor.state.lro + 1 < due_end:
                    if not await self.reconcile_partition(actor, reads=reads):
                        break
                    written += 1
                self._waiting.pop(actor.name, None)
            except (NotLeader, anyio.ClosedResourceError):
                pass  # the partition moved on; its new leader reconciles
            except LevelZeroError as exc:
                self._note_failure(actor, exc)
            else:
                recovered = self.health.note_success(actor.name)
                if recovered is not None:  # a recovery is news, not a problem: INFO
                    log.info(
                        "reconciliation of %s works again: it had failed since %s (for %.0f s, %d passes)",
                        actor.name,
                        utc_time(recovered.since),
                        max(self._wall() - recovered.since, 0.0),
                        recovered.failures,
                    )
            self._note_lag(actor)

        ready = []
        for actor in self._due(check_stale_copies):
            if actor.ready.is_set():
                ready.append(actor)
            else:
                self._unfinished.add(actor.name)
        # The round's plan and shared reads, in waves: each copies the partitions due whose
        # extents fit the read buffer (and at least as many as copy at once, whatever their
        # size: a round copies every partition due, however small the buffer), the next plans
        # those left over.
        due_ends = {actor.name: actor.state.high_watermark for actor in ready}
        wave = ready
        while wave:
            reads = RoundReads(
                self._objects, self.config.read_buffer_bytes_max, self.config.partitions_in_flight_max
            )
            later = await self._plan(reads, wave)
            await self._for_each([a for a in wave if a.name not in later], functools.partial(one, reads))
            self.stats.partitions_deferred += len(later)
            self._add_read_stats(reads)
            wave = [a for a in wave if a.name in later]
        await self._sweep_waiting()
        return written

    def _add_read_stats(self, reads: RoundReads) -> None:
        self.stats.l0_span_gets += reads.stats.span_gets
        self.stats.l0_extent_gets += reads.stats.extent_gets
        self.stats.l0_extents_from_spans += reads.stats.extents_from_spans

    async def _for_each(
        self, actors: list[PartitionActor], work: Callable[[PartitionActor], Awaitable[None]]
    ) -> None:
        """`work` on each of `actors`: `partitions_in_flight_max` workers take them in turn (a
        task per partition waiting for its turn was 1.2 KiB each, 10,000 in a start-up round);
        a round of one partition runs it on the round's task."""
        await for_each(actors, work, self.config.partitions_in_flight_max)

    async def _plan(self, reads: RoundReads, ready: list[PartitionActor]) -> set[str]:
        """The placeholders each partition due in this wave will copy first: read now, so the
        wave knows which extents each L0 object gives (`RoundReads`), and handed to the copy.
        Planned in `ready`'s order while their spans fit the read buffer (a few partitions'
        placeholders read at once, then planned in turn); the partitions due from the first
        that does not fit on are returned, for the round's next wave: copied in this one, each
        of their extents would be a GET of its own."""
        if not reads.sharing:
            return set()
        due = [
            actor
            for actor in ready
            if actor.state.has_unreconciled_data
            and self.health.retry_due(actor.name, self._wall())
            and self._due_for_object(actor)
            and topic_name_problem(actor.row.topic) is None
        ]
        step = self.config.partitions_in_flight_max
        for first in range(0, len(due), step):
            if reads.full:
                return {actor.name for actor in due[first:]}
            chunk = due[first : first + step]
            batches: dict[str, tuple[int, list[LogRecord]]] = {}
            await self._for_each(chunk, functools.partial(self._first_batch, batches))
            for i, actor in enumerate(chunk):
                planned = batches.get(actor.name)
                if planned is not None and not reads.plan_batch(actor.row.pid, *planned):
                    return {actor.name for actor in due[first + i :]}
        return set()

    async def _first_batch(
        self, batches: dict[str, tuple[int, list[LogRecord]]], actor: PartitionActor
    ) -> None:
        """The placeholders `actor` would copy first (from its LRO + 1, below its HWM) into
        `batches`; nothing when the read fails (the copy reads them again, and says what fails)."""
        state = actor.state
        start, hwm = state.lro + 1, state.high_watermark
        try:
            placeholders = await self._log.read_placeholders(
                actor.row.pid, start, self.config.placeholders_per_object_max
            )
        except LevelZeroError:
            return
        batches[actor.name] = (start, self._batch_of(placeholders, hwm))

    def _due_for_object(self, actor: PartitionActor) -> bool:
        """Whether `actor`'s unreconciled data is to be written now: it reached
        `object_bytes_min` (at least the bytes appended since a pass first saw it waiting) or
        has waited `object_age_max_s` since then."""
        state = actor.state
        if not state.has_unreconciled_data:
            return True  # nothing to write (a catch-up elsewhere may have taken it)
        if topic_name_problem(actor.row.topic) is not None:
            return True  # no L1 key can hold it: named failing at once, not after the wait
        now = self._wall()
        since, size_then = self._waiting.setdefault(actor.name, (now, state.size_bytes))
        config = self.config
        return (
            now - since >= config.object_age_max_s or state.size_bytes - size_then >= config.object_bytes_min
        )

    def _forget_gone(self, actors: Collection[PartitionActor]) -> None:
        """A partition gone is neither failing nor waiting, nor due for a sweep (what is kept
        per partition stays bounded by the partitions led, however many come and go)."""
        names = {actor.name for actor in actors}
        pids = {actor.row.pid for actor in actors}
        self.health.retain(names)
        for name in [n for n in self._waiting if n not in names]:
            del self._waiting[name]
        self._sweeps_waiting &= names
        for pid in [p for p in self._strays_due if p not in pids]:
            del self._strays_due[pid]
        # A partition led here again starts a new term, whose start-up collection runs anyway.
        for pid in [p for p in self._recovered if p not in pids]:
            del self._recovered[pid]
        self.catalog.forget_gone(pids)

    def _due(self, everyone: bool) -> list[PartitionActor]:
        """The partitions this round visits (in partition order)."""
        if self._activity is None or self._index is None:
            actors = self._partitions()
            self._forget_gone(actors)
            return actors
        index = self._index()
        self._forget_gone(index.values())
        moved = self._activity.take("reconciler")
        if everyone:
            return self._partitions()
        names = moved | self._unfinished
        actors = [actor for name in names if (actor := index.get(name)) is not None]
        actors.sort(key=lambda actor: actor.row.pid)  # a set's order is not reproducible
        self._unfinished.intersection_update(index.keys())
        return actors

    def _sweep_due(self, actor: PartitionActor) -> bool:
        """Whether `actor`'s key prefix is to be swept for stray L1 objects: not yet in this
        term of its leadership here, or its interval passed; never while strays are held."""
        if self.config.l1_stray_sweep_interval_s == 0 or self._strays_held():
            return False
        due = self._strays_due.get(actor.row.pid)
        return due is None or due[0] != actor.term or self._wall() >= due[1]

    async def _sweep_waiting(self) -> None:
        """Sweep the first STRAY_SWEEPS_PER_ROUND_MAX partitions waiting (still led here and
        still due); the others wait for the next rounds."""
        if not self._sweeps_waiting:
            return
        index = self._index() if self._index is not None else {a.name: a for a in self._partitions()}
        waiting = [actor for name in self._sweeps_waiting if (actor := index.get(name)) is not None]
        waiting = sorted((a for a in waiting if self._sweep_due(a)), key=lambda actor: actor.row.pid)
        this_round, later = waiting[:STRAY_SWEEPS_PER_ROUND_MAX], waiting[STRAY_SWEEPS_PER_ROUND_MAX:]
        self._sweeps_waiting = {actor.name for actor in later}
        await self._for_each(this_round, self._sweep_strays)

    async def _sweep_strays(self, actor: PartitionActor) -> None:
        """Sweep `actor`'s key prefix. A failure is a warning and the sweep is tried again
        later, never a failing reconciliation."""
        term = actor.term
        self.stats.stray_sweeps += 1
        try:
            await self.catalog.sweep_strays(actor, self.config.l1_stray_grace_s)
        except LevelZeroError as exc:
            self.stats.stray_sweep_errors += 1
            retry_s = min(STRAY_SWEEP_RETRY_S, self.config.l1_stray_sweep_interval_s)
            self._strays_due[actor.row.pid] = (term, self._wall() + retry_s)
            log.warning("sweeping %s for stray L1 objects failed, tried again later: %s", actor.name, exc)
        else:
            self._strays_due[actor.row.pid] = (term, self._wall() + self.config.l1_stray_sweep_interval_s)

    def _note_failure(self, actor: PartitionActor, exc: LevelZeroError) -> None:
        self.stats.errors += 1
        permanent = topic_name_problem(actor.row.topic) is not None
        if self.health.note_failure(actor.name, str(exc), self._wall(), permanent=permanent):
            log.error(
                "reconciliation of %s keeps failing: %s. Its M(p) stays at %s and holds M (and the "
                "GC) back for the whole cluster; `levelzero status` names it. If its L0 data is "
                "gone for good, see docs/operating.md, 'A partition that cannot be reconciled'",
                actor.name,
                exc,
                actor.state.mp,
                extra={"partition": actor.name},
            )
        elif (failing := self.health.get(actor.name)) is not None:
            log.warning("reconciling %s still fails (%s)", actor.name, failing.describe())
        else:
            log.warning("reconciling %s failed, retried next round: %s", actor.name, exc)

    def _note_lag(self, actor: PartitionActor) -> None:
        state = actor.state
        self.stats.lag_offsets[actor.name] = max(0, state.high_watermark - 1 - state.lro)

    async def reconcile_partition(
        self, actor: PartitionActor, term: int | None = None, reads: RoundReads | None = None
    ) -> bool:
        """Reconcile one batch of `actor`'s unreconciled placeholders into one L1 object.

        `term` defaults to the actor's current term; a test passes an old one to play a zombie.
        `reads`: the round's plan and shared reads of L0 objects (none: the placeholders read
        here, a GET per extent).
        Returns False when there was nothing to do or the catch-up was rejected."""
        term = actor.term if term is None else term
        state = actor.state
        lro, hwm = state.lro, state.high_watermark
        if lro + 1 >= hwm:
            return False
        problem = topic_name_problem(actor.row.topic)
        if problem is not None:  # no L1 key can hold it: do not read its L0 data for nothing
            raise MalformedKey(unstorable_topic_advice(actor.row.topic, problem))
        reader_id, _ = actor.register_reader()
        try:
            batch, records = await self._read_batch(actor, lro + 1, hwm, reads)
        finally:
            actor.release_reader(reader_id)
        if not batch:
            return False
        base = batch[0].base_offset
        last_entry = batch[-1].entry
        assert isinstance(last_entry, Placeholder), batch[-1]
        last = batch[-1].base_offset + last_entry.record_count - 1
        lrlo = batch[-1].log_offset
        if base != lro + 1:
            # Another reconciler caught the partition up while this one read, and the log below
            # the new LRLO was truncated: nothing left to do. A late one of an earlier term
            # (simulation seed 639: this was an assert that crashed the node), or, in a cluster,
            # the new leader's while this node still ran its old actor (cluster seed 5: the
            # actor had not seen that catch-up, so only the log's side can be asserted).
            assert base > lro + 1, (actor.name, base, lro)
            return False
        key = format_l1_key(
            actor.row.topic, actor.row.partition, base, last, term, new_uuid(self._rng.getrandbits(128))
        )
        data, _ = build_object(term, [(actor.row.pid, encode_extent(records), len(records))])
        row = L1Row.copy_started(
            key, actor.row.pid, base, last, lrlo, term, len(data), self._wall(), max_timestamp(records)
        )
        await self._log.l1_insert(row)
        try:
            await self._objects.put(key, data)
        except LevelZeroError:
            await self._collect_quietly(actor, row)  # it may exist: a lost response
            raise
        if not await self._log.l1_transition(key, L1State.COPY_STARTED, L1State.COPY_FINISHED, self._wall()):
            # Collected as a stale copy while the upload was slow: abandon it, and remove the
            # object the late upload may have left behind (deletes are idempotent).
            self.stats.errors += 1
            log.warning("copy %s was collected before it finished; abandoned", key)
            await self._objects.delete_many([key])
            return False
        row = msgspec.structs.replace(row, state=L1State.COPY_FINISHED, updated_at=self._wall())
        try:
            await actor.catch_up(last, lrlo, term)
        except NotLeader:
            self.stats.catch_ups_rejected += 1
            log.info("catch-up of %s for term %d rejected; %s is outside the lineage", actor.name, term, key)
            await self._collect_quietly(actor, row)
            return False
        except InvalidInput as exc:
            self.stats.catch_ups_rejected += 1
            log.warning("catch-up of %s rejected: %s", actor.name, exc)
            await self._collect_quietly(actor, row)
            return False
        self.stats.objects_written += 1
        self.stats.bytes_written += len(data)
        self.stats.records_reconciled += len(records)
        await self.catalog.refresh(actor)
        if last < actor.state.start_offset:
            # Records DeleteRecords removed while they waited in L0: the object serves nothing.
            await self.catalog.collect(actor, self.config.copy_deadline_s)
        return True

    async def _collect_quietly(self, actor: PartitionActor, row: L1Row) -> None:
        try:
            await self.catalog.delete(actor, row, reason="catch-up rejected")
        except LevelZeroError as exc:
            log.warning("deleting rejected L1 object %s failed, collected later: %s", row.key, exc)

    async def _read_batch(
        self, actor: PartitionActor, start: int, hwm: int, reads: RoundReads | None
    ) -> tuple[list[LogRecord], list[Record]]:
        """Placeholders from data offset `start` (below `hwm`) up to the byte budget, and their
        records."""
        planned = None if reads is None else reads.take_batch(actor.row.pid, start)
        if planned is not None:
            placeholders = planned  # read by this round's plan (the log below HWM is fixed)
        else:
            placeholders = await self._log.read_placeholders(
                actor.row.pid, start, self.config.placeholders_per_object_max
            )
        batch = self._batch_of(placeholders, hwm)
        records: list[Record] = []
        for record in batch:
            p = record.entry
            assert isinstance(p, Placeholder)
            if reads is None:
                data = await self._objects.get(p.object_key, p.byte_offset, p.byte_length)
            else:
                data = await reads.get(p)
            where = f"{actor.name} log offset {record.log_offset} ({p.object_key})"
            records.extend(decode_extent(data, p.checksum, p.record_count, where))
        return batch, records

    def _batch_of(self, placeholders: list[LogRecord], hwm: int) -> list[LogRecord]:
        """The placeholders below `hwm` one L1 object takes: up to `object_bytes_max`."""
        batch: list[LogRecord] = []
        size = 0
        for record in placeholders:
            p = record.entry
            assert isinstance(p, Placeholder)
            if record.base_offset >= hwm:
                break
            if batch and size + p.byte_length > self.config.object_bytes_max:
                break
            batch.append(record)
            size += p.byte_length
        return batch
