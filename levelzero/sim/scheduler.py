"""A single-threaded discrete-event scheduler over virtual time (no clock, no event loop).

Events sit in a heap ordered by `(time, seq)`: `seq` breaks ties in scheduling order, so two
runs that schedule the same events in the same order run them in the same order. Every event
and every note lands in a bounded ring buffer (the trace printed with a violation) and in a
running digest of the whole run (what the determinism test compares).
"""

from __future__ import annotations

import heapq
import zlib
from collections import deque
from collections.abc import Callable
from typing import Any

TRACE_EVENTS_MAX = 50


class Scheduler:
    __slots__ = ("now", "steps", "trace", "digest", "_heap", "_seq")

    def __init__(self, trace_events_max: int = TRACE_EVENTS_MAX) -> None:
        self.now = 0.0
        self.steps = 0
        self.trace: deque[str] = deque(maxlen=trace_events_max)
        self.digest = 0
        self._heap: list[tuple[float, int, str, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0

    def after(self, delay_s: float, label: str, fn: Callable[..., Any], *args: Any) -> None:
        """Run `fn(*args)` `delay_s` of virtual time from now."""
        assert delay_s >= 0, delay_s
        self._seq += 1
        heapq.heappush(self._heap, (self.now + delay_s, self._seq, label, fn, args))

    def step(self) -> bool:
        """Run the next event; False when none is left."""
        if not self._heap:
            return False
        at, _, label, fn, args = heapq.heappop(self._heap)
        assert at >= self.now, (at, self.now)
        self.now = at
        self.steps += 1
        self._record(f"{at:9.4f} #{self.steps} {label}")
        fn(*args)
        return True

    def note(self, text: str) -> None:
        """Record something that happened inside the current event."""
        self._record(f"{self.now:9.4f}     {text}")

    def _record(self, line: str) -> None:
        self.trace.append(line)
        self.digest = zlib.crc32(line.encode(), self.digest)

    @property
    def pending(self) -> int:
        return len(self._heap)
