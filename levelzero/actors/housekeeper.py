"""The housekeeper keeps every partition's `M(p)` moving and applies retention.

An idle partition would hold `M` back forever: nothing new is written, so its window never
slides and its lower bound never moves. When a partition's published `M(p)` has not moved for
`idle_after_s` (or it has no epoch yet), the housekeeper fences the current cluster epoch and
appends `AdvanceEpoch`; if nothing is left unreconciled it appends a catch-up whose LRLO is the
last log offset, so `min_epoch_lower_bound` moves to the window's lower edge.

Retention (by age and bytes of reconciled data, per topic: its `retention.ms` and
`retention.bytes`, else the node's `retention_s` and `retention_bytes`): the start offset moves
over whole L1 objects as Kafka's log start offset moves over whole segments
(`core.topic_configs.retention_start_offset`), `SetStartOffset`, then two-phase deletion of the
L1 objects entirely below the new start offset. Never past the first offset of a Kafka
transaction still open in the partition (`open_transactions`; DeleteRecords is held there
too, `start_offset_held`): its records, and the marker a restart looks for before writing one,
stay until it completes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

import anyio

from levelzero.core.activity import ActivityBoard
from levelzero.core.entries import AdvanceEpoch
from levelzero.core.leader import advance_epoch_needed, catch_up_needed
from levelzero.core.errors import InvalidInput, LevelZeroError, NotLeader, ShuttingDown
from levelzero.core.topic_configs import RetainedObject, retention_start_offset
from levelzero.storage.protocols import EventLog, StateSampleRow

from .epochs import EpochService
from .fan_out import for_each
from .l1 import START_MOVED_BY_RETENTION, L1Catalog
from .partition import PartitionActor

log = logging.getLogger("levelzero.housekeeper")

STATE_SAMPLES_PER_CALL_MAX = 1_024  # rows of one record_state_samples call (a store bounds a call)
# Partitions a round tends at once: their `AdvanceEpoch` and catch-up appends meet in the node's
# appender and share group commits. One after another, a round over 1,024 new (or, after an
# epoch bump, idle) partitions was 2,048 appends in ~1,000 commits, 2.5 s of the log store's
# writer that every producer's placeholder commit queued behind.
TEND_PARTITIONS_IN_FLIGHT_MAX = 64


@dataclass(frozen=True, slots=True)
class HousekeeperConfig:
    interval_s: float = 1.0
    idle_after_s: float = 5.0
    retention_s: float | None = None
    retention_bytes: int | None = None
    copy_deadline_s: float = 600.0
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.idle_after_s < 0:
            raise InvalidInput("housekeeper interval_s must be > 0 and idle_after_s >= 0")
        if self.retention_s is not None and self.retention_s <= 0:
            raise InvalidInput("housekeeper retention_s must be > 0 when set")
        if self.retention_bytes is not None and self.retention_bytes <= 0:
            raise InvalidInput("housekeeper retention_bytes must be > 0 when set")


class RetentionRules(Protocol):
    """Each topic's retention (the node's topic configs, `actors.topic_configs`)."""

    def retention(self, topic: str) -> tuple[float | None, int | None]:
        """(seconds, bytes) of `topic`; None: no limit."""
        ...

    def any_retention(self) -> bool: ...


class NodeRetention:
    """The same retention for every topic: the housekeeper's own config."""

    def __init__(self, config: HousekeeperConfig) -> None:
        self._limits = (config.retention_s, config.retention_bytes)

    def retention(self, topic: str) -> tuple[float | None, int | None]:  # noqa: ARG002 - the same for all
        return self._limits

    def any_retention(self) -> bool:
        return self._limits != (None, None)


@dataclass(slots=True)
class HousekeeperStatistics:
    rounds: int = 0
    partitions_tended: int = 0  # visits: grows with active partitions, not with all of them
    epochs_advanced: int = 0
    catch_ups: int = 0
    start_offsets_set: int = 0
    l1_deleted: int = 0
    errors: int = 0


class Housekeeper:
    def __init__(
        self,
        config: HousekeeperConfig,
        epochs: EpochService,
        catalog: L1Catalog,
        partitions: Callable[[], list[PartitionActor]],
        log_store: EventLog,
        *,
        clock: Callable[[], float] = anyio.current_time,
        wall_clock: Callable[[], float],
        activity: ActivityBoard | None = None,
        index: Callable[[], Mapping[str, PartitionActor]] | None = None,
        retention: RetentionRules | None = None,
    ) -> None:
        assert (activity is None) == (index is None), "activity needs the index to find names"
        self.config = config
        # The first offset of the oldest Kafka transaction open in a partition, or None (set by
        # the Kafka front end): retention keeps the start offset at or below it.
        self.open_transactions: Callable[[str, int], Awaitable[int | None]] | None = None
        # Told when retention moved a partition's start offset (`Node.partition_emptied`).
        self.start_moved: Callable[[PartitionActor], Awaitable[None]] | None = None
        self._retention = NodeRetention(config) if retention is None else retention
        self._epochs = epochs
        self._catalog = catalog
        self._partitions = partitions
        self._clock = clock
        self._wall = wall_clock
        self._log = log_store
        self._last_sampled: dict[int, tuple[int | None, ...]] = {}
        self.stats = HousekeeperStatistics()
        self._round_lock = anyio.Lock()  # the loop's rounds and on-demand ones never overlap
        # Proportional to active partitions (core.activity): a round tends the partitions that
        # moved since the last round and those a round left unsettled; all of them only when
        # the cluster epoch changed since the last full round (every partition then needs an
        # AdvanceEpoch), on `force`, or with retention (it ages without the state moving).
        self._activity = activity
        self._index = index
        self._unsettled: set[str] = set()
        self._full_round_epoch: int | None = None

    async def run(self, *, task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await anyio.sleep(self.config.interval_s)
            await self.run_round()

    async def run_round(self, *, force: bool = False) -> None:
        """One pass over every partition. `force` treats every partition as idle."""
        async with self._round_lock:
            self.stats.rounds += 1
            # The cluster epoch as the store has it now. In a cluster other nodes raise it, and
            # this node's copy moves only when its epoch cache is refreshed (on a write): an
            # idle node advanced its partitions to an epoch seconds old, M lagging, and one a
            # node created at a newer epoch refused every round (stale_cluster_epoch) until a
            # write came. (One node: no read.)
            try:
                await self._epochs.get()
            except LevelZeroError as exc:  # the store's: this round goes on with the copy
                log.warning("housekeeping: reading the cluster epoch failed: %s", exc)
            await for_each(
                self._due(force), lambda actor: self._tend_one(actor, force), TEND_PARTITIONS_IN_FLIGHT_MAX
            )
            await self.sample_states()

    async def _tend_one(self, actor: PartitionActor, force: bool) -> None:
        """Tend `actor` and note whether it is settled; a failure is retried next round."""
        if not actor.ready.is_set():
            self._unsettled.add(actor.name)
            return
        self.stats.partitions_tended += 1
        try:
            await self.tend(actor, force=force)
        except (NotLeader, ShuttingDown, anyio.ClosedResourceError):
            self._unsettled.discard(actor.name)  # led elsewhere now, or stopped
            return
        except LevelZeroError as exc:
            self.stats.errors += 1
            self._unsettled.add(actor.name)
            log.warning(
                "housekeeping failed, retried next round",
                extra={"partition": actor.name, "error": exc.code, "detail": str(exc)},
            )
            return
        if self._settled(actor):
            self._unsettled.discard(actor.name)
        else:
            self._unsettled.add(actor.name)

    def _due(self, force: bool) -> list[PartitionActor]:
        """The partitions this round tends (in partition order)."""
        if self._activity is None or self._index is None:
            return self._forget_gone(self._partitions())
        epoch = self._epochs.current
        if force or self._retention.any_retention() or epoch != self._full_round_epoch:
            self._activity.take("housekeeper")  # every partition is visited anyway
            self._full_round_epoch = epoch
            return self._forget_gone(self._partitions())
        names = self._activity.take("housekeeper")
        names |= self._unsettled
        return _in_order(self._index(), names)

    def _forget_gone(self, actors: list[PartitionActor]) -> list[PartitionActor]:
        """`actors`, every partition led here, after forgetting what was kept of the others
        (deleted, led elsewhere): their unsettled names and last samples stayed for ever, one
        sample per partition ever created (a topic made and deleted in a loop grew them)."""
        self._unsettled &= {actor.name for actor in actors}
        live = {actor.row.pid for actor in actors}
        for pid in [pid for pid in self._last_sampled if pid not in live]:
            del self._last_sampled[pid]
        return actors

    def _settled(self, actor: PartitionActor) -> bool:
        """Nothing to do for `actor` until its state moves or the cluster epoch changes (both
        bring it back: a move is noted on the activity board, a new epoch makes a full round)."""
        state = actor.state
        return advance_epoch_needed(state, self._epochs.current) is None and catch_up_needed(state) is None

    async def sample_states(self) -> int:
        """Record each partition's watermarks when they changed (for export and analysis)."""
        now = self._wall()
        rows = []
        if self._activity is None or self._index is None:
            actors = self._partitions()
        else:  # a partition that did not move has the key it was last sampled with
            actors = _in_order(self._index(), self._activity.take("samples"))
        for actor in actors:
            view = actor.view()
            s = view.state
            row = StateSampleRow(
                at=now,
                pid=view.pid,
                term=view.term,
                previous_applied_epoch=s.previous_applied_epoch,
                max_applied_epoch=s.max_applied_epoch,
                min_epoch_lower_bound=s.min_epoch_lower_bound,
                mp=view.published_mp,
                lro=s.lro,
                high_watermark=s.high_watermark,
                start_offset=s.start_offset,
            )
            key = (
                row.term,
                row.max_applied_epoch,
                row.min_epoch_lower_bound,
                row.mp,
                row.lro,
                row.high_watermark,
                row.start_offset,
            )
            if self._last_sampled.get(view.pid) != key:
                self._last_sampled[view.pid] = key
                rows.append(row)
        for start in range(0, len(rows), STATE_SAMPLES_PER_CALL_MAX):
            await self._log.record_state_samples(rows[start : start + STATE_SAMPLES_PER_CALL_MAX])
        return len(rows)

    async def tend(self, actor: PartitionActor, *, force: bool = False) -> None:
        view = actor.view()
        idle = view.mp is None or self._clock() - view.mp_changed_at >= self.config.idle_after_s
        if force or idle:
            await self._advance(actor)
        retention_s, retention_bytes = self._retention.retention(actor.row.topic)
        if retention_s is not None or retention_bytes is not None:
            await self._retain(actor, retention_s, retention_bytes)
        elif self._catalog.holds_below_start(actor):  # DeleteRecords, without retention
            self.stats.l1_deleted += await self._catalog.collect(actor, self.config.copy_deadline_s)

    async def _advance(self, actor: PartitionActor) -> None:
        epoch = advance_epoch_needed(actor.state, self._epochs.current)
        if epoch is not None:
            await actor.write(AdvanceEpoch(epoch))
            self.stats.epochs_advanced += 1
        catch_up = catch_up_needed(actor.state)  # the state after the advance
        if catch_up is not None:
            lro, lrlo = catch_up
            await actor.catch_up(lro, lrlo, actor.term)
            self.stats.catch_ups += 1

    async def start_offset_held(self, actor: PartitionActor, offset: int) -> int:
        """`offset`, or the first offset of the oldest Kafka transaction open in the partition
        if lower (and above the start offset): where retention and DeleteRecords may move the
        start offset to."""
        if offset <= actor.state.start_offset or self.open_transactions is None:
            return offset
        oldest = await self.open_transactions(actor.row.topic, actor.row.partition)
        return offset if oldest is None else min(offset, oldest)

    async def _retain(
        self, actor: PartitionActor, retention_s: float | None, retention_bytes: int | None
    ) -> None:
        # One read of the partition's rows serves the start offset and the collection (six
        # control-plane reads a partition a round before: a refresh, a listing, a refresh again).
        # With no object in the lineage there may still be ones to collect: three-node seed
        # 8852's only valid object went below the start offset, and an earlier term's copy of
        # the same range, outside the lineage, stayed until a restart.
        rows, valid = await self._catalog.listing(actor)
        if not rows:
            return
        new_start = retention_start_offset(
            [RetainedObject(row.last_offset, row.size, row.created_at) for row in valid],
            actor.state.start_offset,
            self._wall(),
            retention_s,
            retention_bytes,
        )
        new_start = await self.start_offset_held(actor, new_start)
        before = actor.state.start_offset
        if new_start > before:
            await actor.set_start_offset(new_start, actor.term)
            self._catalog.note_start_moved(actor, before, new_start, START_MOVED_BY_RETENTION)
            self.stats.start_offsets_set += 1
            log.info("retention moved %s start offset to %d", actor.name, new_start)
            if self.start_moved is not None:
                await self.start_moved(actor)
        self.stats.l1_deleted += await self._catalog.collect(actor, self.config.copy_deadline_s, rows)


def _in_order(index: Mapping[str, PartitionActor], names: Iterable[str]) -> list[PartitionActor]:
    """The actors of `names` still led here, in partition id order (a set's order is not
    reproducible; a simulation replays a seed exactly)."""
    actors = [actor for name in names if (actor := index.get(name)) is not None]
    actors.sort(key=lambda actor: actor.row.pid)
    return actors
