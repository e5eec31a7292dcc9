"""The housekeeper: `levelzero/actors/housekeeper.py` (`tend`, `_advance`) as events.

When a leader's `M(p)` has not moved for `idle_after_s` (or it has none yet), fence the current
cluster epoch with `AdvanceEpoch`, then — if nothing is unreconciled — append a catch-up whose
LRLO is the last log offset. Its messages can be delivered late, like any other.
"""

from __future__ import annotations

from functools import partial

from levelzero.core.entries import AdvanceEpoch, AdvanceReconciledOffset, LogRecord

from .leader import Leader
from .model import Node, WriteMsg


class HousekeeperMixin:
    """Mixed into `World` (world.py): `self` is the world, with its scheduler, rng and stores."""

    def _housekeeper_tick(self, node: Node) -> None:
        self.node_after(
            node, self.cfg.housekeeper_interval_s, "housekeeper", self._housekeeper_tick, node
        )
        for rt in list(node.leaders.values()):
            self._tend(rt)

    def _tend(self, rt: Leader) -> None:
        """Housekeeper.tend/_advance: fence the current epoch, then catch up an idle partition."""
        if rt.tending or rt.deposed is not None:
            return
        idle = rt.state.mp is None or self.sched.now - rt.mp_changed_at >= self.cfg.idle_after_s
        if not idle:
            return
        rt.tending = True
        epoch = self.epoch
        state = rt.state
        if state.max_applied_epoch is None or epoch > state.max_applied_epoch:
            msg = WriteMsg(epoch, AdvanceEpoch(epoch), partial(self._tend_advanced, rt))
            self.node_after(
                rt.node, self.message_delay(), f"advance {rt} to e{epoch}", rt.on_write, msg
            )
        else:
            self._tend_catch_up(rt)

    def _tend_advanced(self, rt: Leader, record: LogRecord | None, error: Exception | None) -> None:
        if error is not None:
            rt.tending = False
            return
        self.stats.housekeeper_advances += 1
        self._tend_catch_up(rt)

    def _tend_catch_up(self, rt: Leader) -> None:
        state = rt.state
        last = state.last_applied_log_offset
        window_offset = state.epoch_window_offset
        if (
            state.has_unreconciled_data
            or window_offset is None
            or not state.lrlo < window_offset <= last
        ):
            rt.tending = False
            return
        entry = AdvanceReconciledOffset(state.high_watermark - 1, last)
        self.node_after(
            rt.node,
            self.message_delay(),
            f"catch-up {rt} lrlo {last} (housekeeper)",
            rt.on_control,
            entry,
            rt.term,
            partial(self._tend_done, rt),
        )

    def _tend_done(self, rt: Leader, record: LogRecord | None, error: Exception | None) -> None:
        rt.tending = False
        if error is None:
            self.stats.housekeeper_catch_ups += 1
