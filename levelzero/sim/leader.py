"""A partition's leader for one term on one node: `levelzero/actors/partition.py` as events."""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

from levelzero.core.entries import AdvanceReconciledOffset, Entry, LogRecord, Placeholder
from levelzero.core.errors import InvalidInput, InvariantViolation, NotLeader
from levelzero.core.fence import Admitted, BecomeUpdater, Fence, Rejected, Wait
from levelzero.core.state import PartitionState, ReaderPins

from .checks import apply_checked
from .model import Change, L0Read, Node, Partition, ReconcileJob, Reply, WriteMsg
from .violation import SimulationViolation

if TYPE_CHECKING:
    from .world import World


class Leader:
    """A partition's leader for one term on one node: `levelzero/actors/partition.py` as events.

    Mirrors the actor: a write is fenced, then reserved (log offset assigned at once, in admission
    order), appended durably by a later flush with the term it expects, applied in log order, and
    only then releases its read unit and is answered. An append whose term is stale deposes it.
    """

    def __init__(self, world: World, part: Partition, node: Node, state: PartitionState) -> None:
        self.world = world
        self.part = part
        self.node = node
        self.incarnation = node.incarnation
        self.state = state
        self.term = state.term
        self.fence = Fence(part.creation_epoch, world.mode)
        if world.mutation == "admit_below_window":
            self.fence.mutate_admit_below_window = True
        self.pins = ReaderPins()
        self.next_log_offset = state.next_log_offset
        self.projected_hwm = state.high_watermark
        self.pending: deque[tuple[LogRecord, Reply, bool]] = deque()
        self.to_append: list[LogRecord] = []
        self.flush_armed = False
        self.waiting: deque[WriteMsg] = deque()
        self.updater: WriteMsg | None = None
        self.deposed: Exception | None = None
        self.published: int | None = None
        self.mp_changed_at = -math.inf
        self.last_snapshot_offset = state.last_applied_log_offset
        self.readers: dict[int, L0Read] = {}
        self.job: ReconcileJob | None = None
        self.tending = False
        self.change: Change | None = None

    def __repr__(self) -> str:
        return f"{self.part.name}@n{self.node.id}t{self.term}"

    @property
    def current(self) -> bool:
        """Still the partition's leader: node up, same life, not deposed, log at our term."""
        return (
            self.deposed is None
            and self.node.alive
            and self.node.incarnation == self.incarnation
            and self.part.log.term == self.term
        )

    # ------------------------------------------------------------------ writes (fenced)

    def on_write(self, msg: WriteMsg) -> None:
        if self.deposed is not None:
            msg.reply(None, self.deposed)
            return
        decision = self.fence.try_fence(msg.epoch, self.term, self.state.applied_window)
        match decision:
            case Admitted():
                self._admit(msg, decision)
            case Rejected(error=error):
                self.world.note(
                    f"{self} rejects e{msg.epoch}: window [{error.window_min}, {error.window_max}]"
                )
                msg.reply(None, error)
            case Wait():
                self.waiting.append(msg)
            case BecomeUpdater():
                assert self.updater is None
                self.updater = msg
                self._maybe_slide()

    def _maybe_slide(self) -> None:
        if self.updater is None or not self.fence.drained:
            return
        updater, self.updater = self.updater, None
        admitted = self.fence.complete_slide(self.term, self.state.applied_window)
        self.world.note(f"{self} window slid to {admitted.window}")
        self._admit(updater, admitted)
        waiting, self.waiting = self.waiting, deque()
        for msg in waiting:
            self.on_write(msg)

    def _admit(self, msg: WriteMsg, admitted: Admitted) -> None:
        self._reserve(msg.entry, msg.reply, holds_read_unit=True)

    # ------------------------------------------------------------------ control entries

    def on_control(self, entry: Entry, term: int | None, reply: Reply) -> None:
        if self.deposed is not None:
            reply(None, self.deposed)
            return
        if term is not None and term != self.term:
            reply(None, NotLeader(self.part.name, term, self.term))
            return
        match entry:
            case AdvanceReconciledOffset(lro=lro, lrlo=lrlo):
                if not -1 <= lro < self.projected_hwm or not -1 <= lrlo < self.next_log_offset:
                    reply(None, InvalidInput(f"{self}: catch-up ({lro}, {lrlo}) out of range"))
                    return
            case _:
                raise AssertionError(f"not a control entry: {entry!r}")
        self._reserve(entry, reply, holds_read_unit=False)

    # ------------------------------------------------------------------ the log

    def _reserve(self, entry: Entry, reply: Reply, holds_read_unit: bool) -> None:
        record = LogRecord(self.next_log_offset, self.term, self.projected_hwm, entry)
        self.next_log_offset += 1
        if isinstance(entry, Placeholder):
            self.projected_hwm += entry.record_count
        self.pending.append((record, reply, holds_read_unit))
        self.to_append.append(record)
        if not self.flush_armed:
            self.flush_armed = True
            w = self.world
            delay = w.delay(w.cfg.append_s, w.cfg.slow_append_p, w.cfg.slow_append_s)
            w.node_after(self.node, delay, f"append {self}", self._flush)

    def _flush(self) -> None:
        """The appender: one conditional append of everything reserved so far."""
        self.flush_armed = False
        batch, self.to_append = self.to_append, []
        if not batch:
            return
        try:
            self.part.log.append(self.term, batch)
        except NotLeader as exc:
            self.world.note(f"{self} append of {len(batch)} records: {exc}")
            self.depose(exc)
            return
        self.world.on_durable(self.part, batch)
        self._on_durable(batch[-1].log_offset)
        if self.to_append and not self.flush_armed:
            self.flush_armed = True
            w = self.world
            w.node_after(self.node, w.delay(w.cfg.append_s), f"append {self}", self._flush)

    def _on_durable(self, upto: int) -> None:
        while self.pending and self.pending[0][0].log_offset <= upto:
            record, reply, holds_read_unit = self.pending.popleft()
            applied = apply_checked(self.state, record, f"leader {self}")
            assert applied, record
            if holds_read_unit:
                self.fence.release()
            reply(record, None)
        self.publish()
        self._maybe_snapshot()
        self._maybe_slide()

    def _maybe_snapshot(self) -> None:
        offset = self.state.last_applied_log_offset
        if offset - self.last_snapshot_offset >= self.world.cfg.snapshot_every_records:
            self.last_snapshot_offset = offset
            self.part.log.save_snapshot(offset, self.state.encode_snapshot())

    def depose(self, error: Exception) -> None:
        """Lost the partition (append rejected, or told so): fail everything waiting."""
        if self.deposed is not None:
            return
        self.deposed = error
        waiting = list(self.waiting)
        if self.updater is not None:
            waiting.append(self.updater)
            self.updater = None
            self.fence.abandon_update()
        self.waiting.clear()
        pending, self.pending = self.pending, deque()
        self.to_append.clear()
        for msg in waiting:
            msg.reply(None, error)
        for _, reply, _ in pending:
            reply(None, error)
        if self.node.leaders.get(self.part.pid) is self:
            del self.node.leaders[self.part.pid]

    def notice_deposed(self) -> None:
        self.depose(NotLeader(self.part.name, self.term, self.part.log.term))

    # ------------------------------------------------------------------ M(p)

    def publish(self) -> None:
        state_mp = self.state.mp
        try:
            published = self.pins.published(state_mp)
        except InvariantViolation as exc:
            raise SimulationViolation("2", f"{self}: {exc}") from exc
        if published != self.published:
            self.published = published
            self.mp_changed_at = self.world.sched.now
        self.world.board.publish(self.part.name, published)
