"""The housekeeper keeps every partition's `M(p)` moving and applies retention.

An idle partition would hold `M` back forever: nothing new is written, so its window never
slides and its lower bound never moves. When a partition's published `M(p)` has not moved for
`idle_after_s` (or it has no epoch yet), the housekeeper fences the current cluster epoch and
appends `AdvanceEpoch`; if nothing is left unreconciled it appends a catch-up whose LRLO is the
last log offset, so `min_epoch_lower_bound` moves to the window's lower edge.

Retention (by age and bytes of reconciled data): `SetStartOffset`, then two-phase deletion of the
L1 objects entirely below the new start offset.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from levelzero.core.entries import AdvanceEpoch
from levelzero.core.leader import advance_epoch_needed, catch_up_needed
from levelzero.core.errors import InvalidInput, LevelZeroError, NotLeader
from levelzero.storage.protocols import EventLog, StateSampleRow

from .epochs import EpochService
from .l1 import L1Catalog
from .partition import PartitionActor

log = logging.getLogger("levelzero.housekeeper")


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


@dataclass(slots=True)
class HousekeeperStatistics:
    rounds: int = 0
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
    ) -> None:
        self.config = config
        self._epochs = epochs
        self._catalog = catalog
        self._partitions = partitions
        self._clock = clock
        self._wall = wall_clock
        self._log = log_store
        self._last_sampled: dict[int, tuple] = {}
        self.stats = HousekeeperStatistics()
        self._round_lock = anyio.Lock()  # the loop's rounds and on-demand ones never overlap

    async def run(self, *, task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await anyio.sleep(self.config.interval_s)
            await self.run_round()

    async def run_round(self, *, force: bool = False) -> None:
        """One pass over every partition. `force` treats every partition as idle."""
        async with self._round_lock:
            self.stats.rounds += 1
            for actor in self._partitions():
                if not actor.ready.is_set():
                    continue
                try:
                    await self.tend(actor, force=force)
                except (NotLeader, anyio.ClosedResourceError):
                    pass
                except LevelZeroError as exc:
                    self.stats.errors += 1
                    log.warning("housekeeping failed, retried next round",
                                extra={"partition": actor.name, "error": exc.code, "detail": str(exc)})
            await self.sample_states()

    async def sample_states(self) -> int:
        """Record each partition's watermarks when they changed (for export and analysis)."""
        now = self._wall()
        rows = []
        for actor in self._partitions():
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
            key = (row.term, row.max_applied_epoch, row.min_epoch_lower_bound, row.mp, row.lro,
                   row.high_watermark, row.start_offset)
            if self._last_sampled.get(view.pid) != key:
                self._last_sampled[view.pid] = key
                rows.append(row)
        if rows:
            await self._log.record_state_samples(rows)
        return len(rows)

    async def tend(self, actor: PartitionActor, *, force: bool = False) -> None:
        view = actor.view()
        idle = view.mp is None or self._clock() - view.mp_changed_at >= self.config.idle_after_s
        if force or idle:
            await self._advance(actor)
        if self.config.retention_s is not None or self.config.retention_bytes is not None:
            await self._retain(actor)

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

    async def _retain(self, actor: PartitionActor) -> None:
        valid = await self._catalog.refresh(actor)
        if not valid:
            return
        now = self._wall()
        new_start = actor.state.start_offset
        if self.config.retention_s is not None:
            for row in valid:
                if now - row.created_at > self.config.retention_s:
                    new_start = max(new_start, row.last_offset + 1)
        if self.config.retention_bytes is not None:
            kept = 0
            for row in reversed(valid):
                kept += row.size
                if kept > self.config.retention_bytes:
                    new_start = max(new_start, row.last_offset + 1)
                    break
        if new_start > actor.state.start_offset:
            await actor.set_start_offset(new_start, actor.term)
            self.stats.start_offsets_set += 1
            log.info("retention moved %s start offset to %d", actor.name, new_start)
        self.stats.l1_deleted += await self._catalog.collect(actor, self.config.copy_deadline_s)
