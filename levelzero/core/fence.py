"""The windowed epoch fence, as synchronous bookkeeping (sans-IO).

The partition actor owns one `Fence` and does the waiting; this object only decides. A write
with epoch `e` calls `try_fence`:

- `e` inside the effective window → `Admitted`: it holds one read unit until its placeholder is
  durable and applied, then `release()`.
- `e` above the window → `BecomeUpdater`: the caller waits until `drained` (every read unit of
  the old window released), then `complete_slide()` slides the seen window and keeps one unit.
- while an updater is active → `Wait`: re-evaluate after the slide (newer epochs coalesce: only
  one slide runs at a time, later callers see the slid window).
- `e` below the window → `Rejected(StaleClusterEpoch)`: refresh the epoch cache and retry.
  So is an `e` inside the window that could land below the applied window, depending on the
  order in which the window's writes land (see `lands_in_any_order`).

The seen window is in-memory and belongs to one term. For any other term the effective window
is the applied window of the state machine, so a new leader starts from what the log proves.
Draining before a slide is what keeps the log invariant true: every write admitted under the
old window is applied before any write of the new window can be admitted.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .errors import StaleClusterEpoch

Window = tuple[int, int]


class FenceMode(enum.StrEnum):
    WINDOWED = "windowed"
    STRICT = "strict"  # single epoch; the baseline the benchmarks compare against


@dataclass(frozen=True, slots=True)
class Admitted:
    epoch: int
    term: int
    window: Window
    new_epoch: bool


@dataclass(frozen=True, slots=True)
class Rejected:
    error: StaleClusterEpoch


@dataclass(frozen=True, slots=True)
class Wait:
    """An updater is sliding the window; wait for `slide_done` and try again."""

    updater_epoch: int


@dataclass(frozen=True, slots=True)
class BecomeUpdater:
    """The caller must wait until `Fence.drained`, then call `complete_slide()`."""

    epoch: int


Decision = Admitted | Rejected | Wait | BecomeUpdater


@dataclass(frozen=True, slots=True)
class FenceStatistics:
    """The windowed-fencing probe: an immutable snapshot."""

    read_units: int
    updater_epoch: int | None
    window: Window | None
    window_slides: int
    window_size: int
    stale_rejections: int
    last_rejected_gap: int
    new_epoch_fences: int
    same_epoch_fences: int


def lands_in_any_order(epoch: int, window: Window, applied_window: Window | None) -> bool:
    """Can a write at `epoch` (inside the effective `window`) be admitted now, whatever the
    order in which the writes admitted under this window land in the log?

    Applying `e > max_applied` makes `previous_applied = max_applied`. If the writes of one
    window could raise `max_applied` twice, `previous_applied` could pass an epoch still in
    flight, which then lands below the applied window (apply asserts; a catch-up first would
    set `M(p)` >= its epoch). Examples: window [5, 9] admitting 7 — landing 7, 9, 5 gives
    [7, 9], then 5; or a fresh partition whose first applied epoch is 9 ([9, 9]) while 5 is in
    flight. So admit, besides the upper edge, only epochs that raise nothing (inside the applied
    window) and the lower edge while it is above everything applied. Then, as each slide
    drains the previous window first, `max_applied` moves only to `low` and `high`, and
    `previous_applied` never passes an admitted epoch. Everything else gets a retriable
    rejection; the retry comes with a fresh epoch, at `high` or above.
    """
    low, high = window
    if epoch == high:
        return True
    if applied_window is None:
        return False
    applied_low, applied_high = applied_window
    return applied_low <= epoch <= applied_high or epoch == low > applied_high


class Fence:
    # Slots: one fence per partition (idle ones included), its attributes read on every write.
    __slots__ = (
        "mode",
        "creation_epoch",
        "seen_term",
        "_seen_window",
        "_last_admitted",
        "read_units",
        "updater_epoch",
        "window_slides",
        "stale_rejections",
        "last_rejected_gap",
        "new_epoch_fences",
        "same_epoch_fences",
    )

    def __init__(self, creation_epoch: int, mode: FenceMode = FenceMode.WINDOWED) -> None:
        assert creation_epoch >= 1
        self.mode = FenceMode(mode)
        self.creation_epoch = creation_epoch
        self.seen_term: int | None = None
        self._seen_window: Window | None = None  # (previous_seen, max_seen), set at a slide
        # The last same-epoch admission: the next one for the same epoch, term and window is
        # the same immutable value (a frozen dataclass costs more to build than to compare).
        self._last_admitted: Admitted | None = None
        self.read_units = 0
        self.updater_epoch: int | None = None
        self.window_slides = 0
        self.stale_rejections = 0
        self.last_rejected_gap = 0
        self.new_epoch_fences = 0
        self.same_epoch_fences = 0

    # ------------------------------------------------------------------ windows

    @property
    def previous_seen(self) -> int | None:
        return None if self._seen_window is None else self._seen_window[0]

    @property
    def max_seen(self) -> int | None:
        return None if self._seen_window is None else self._seen_window[1]

    def effective_window(self, term: int, applied_window: Window | None) -> Window | None:
        window: Window | None
        if self.seen_term == term and self._seen_window is not None:
            window = self._seen_window
        else:
            window = applied_window
        if window is None:
            return None
        if self.mode is FenceMode.STRICT:
            return (window[1], window[1])
        return window

    # ------------------------------------------------------------------ decisions

    def try_fence(self, epoch: int, term: int, applied_window: Window | None) -> Decision:
        """Decide for one write. Must be called only once the state is synced for `term`."""
        assert epoch >= 1, epoch
        if self.updater_epoch is not None:
            return Wait(self.updater_epoch)
        window = self._seen_window  # `effective_window`'s common case, without the call
        if window is None or self.seen_term != term or self.mode is FenceMode.STRICT:
            window = self.effective_window(term, applied_window)
        if window is None:
            if epoch < self.creation_epoch:
                return self._reject(epoch, (self.creation_epoch, self.creation_epoch))
            return self._become_updater(epoch)
        low, high = window
        if epoch > high:
            return self._become_updater(epoch)
        if epoch < low:
            return self._reject(epoch, window)
        # (`epoch == high` always lands: the common case, without the call)
        if epoch != high and not lands_in_any_order(epoch, window, applied_window):
            return self._reject(epoch, window)
        self.read_units += 1
        self.same_epoch_fences += 1
        admitted = self._last_admitted
        if admitted is None or admitted.epoch != epoch or admitted.term != term or admitted.window != window:
            admitted = self._last_admitted = Admitted(epoch, term, window, new_epoch=False)
        return admitted

    def _become_updater(self, epoch: int) -> BecomeUpdater:
        self.updater_epoch = epoch
        return BecomeUpdater(epoch)

    def _reject(self, epoch: int, window: Window) -> Rejected:
        self.stale_rejections += 1
        self.last_rejected_gap = window[0] - epoch
        return Rejected(StaleClusterEpoch(epoch, window[0], window[1]))

    @property
    def drained(self) -> bool:
        return self.read_units == 0

    def complete_slide(self, term: int, applied_window: Window | None) -> Admitted:
        """Slide the seen window to end at the updater's epoch and keep one read unit."""
        epoch = self.updater_epoch
        assert epoch is not None, "complete_slide without an updater"
        assert self.read_units == 0, f"slide with {self.read_units} read units outstanding"
        window = self.effective_window(term, applied_window)
        assert window is None or epoch > window[1], (epoch, window)
        low = epoch if window is None or self.mode is FenceMode.STRICT else window[1]
        self.seen_term = term
        self._seen_window = (low, epoch)
        self.updater_epoch = None
        self.read_units = 1
        self.window_slides += 1
        self.new_epoch_fences += 1
        return Admitted(epoch, term, (low, epoch), new_epoch=True)

    def abandon_update(self) -> None:
        """The updater gave up (cancelled, shutting down) before sliding."""
        assert self.updater_epoch is not None
        self.updater_epoch = None

    def release(self, units: int = 1) -> None:
        """`units` writes' placeholders are durable and applied (or their appends failed)."""
        assert 0 < units <= self.read_units, (
            f"release without a read unit ({units} released, {self.read_units} held)"
        )
        self.read_units -= units

    # ------------------------------------------------------------------ observability

    def statistics(self, term: int, applied_window: Window | None) -> FenceStatistics:
        window = self.effective_window(term, applied_window)
        return FenceStatistics(
            read_units=self.read_units,
            updater_epoch=self.updater_epoch,
            window=window,
            window_slides=self.window_slides,
            window_size=0 if window is None else window[1] - window[0] + 1,
            stale_rejections=self.stale_rejections,
            last_rejected_gap=self.last_rejected_gap,
            new_epoch_fences=self.new_epoch_fences,
            same_epoch_fences=self.same_epoch_fences,
        )
