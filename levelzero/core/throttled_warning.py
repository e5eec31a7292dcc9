"""Warnings that repeat with traffic, logged at most once an interval with a count of the rest.

A failure that every request meets (a store outage under produce traffic, a misconfigured
client reconnecting every few milliseconds) would log a line per request: the log grows with
the traffic and buries everything else. `ThrottledWarning` logs the first, holds back the ones
that follow within `interval_s`, and says on its next line how many it held back;
`ThrottledWarnings` keeps one per key (an error code, an operation: a small fixed set), so that
one kind of failure never hides another.

The logger and the clock are the caller's (no I/O and no clock here).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable

WARNING_INTERVAL_S = 10.0
HELD_BACK_SUFFIX = " (and %d more like it since the last such warning)"


class ThrottledWarning:
    """A warning logged to `logger` at most once every `interval_s`; the next one says how
    many were held back in between."""

    def __init__(
        self,
        logger: logging.Logger,
        clock: Callable[[], float],
        interval_s: float = WARNING_INTERVAL_S,
        level: int = logging.WARNING,
    ) -> None:
        assert interval_s > 0, interval_s
        self._logger = logger
        self._clock = clock
        self._interval_s = interval_s
        self._level = level
        self._last: float | None = None
        self.held = 0

    def warn(
        self,
        message: str,
        *args: object,
        extra: dict[str, object] | None = None,
        exc_info: bool = False,
    ) -> bool:
        """Log `message % args` now (`exc_info`: with the exception being handled), or hold
        it back; True when it was logged."""
        now = self._clock()
        if self._last is not None and now - self._last < self._interval_s:
            self.held += 1
            return False
        if self.held:
            message += HELD_BACK_SUFFIX
            args = (*args, self.held)
        self._logger.log(self._level, message, *args, extra=extra, exc_info=exc_info)
        self._last, self.held = now, 0
        return True


class ThrottledWarnings:
    """One `ThrottledWarning` per key. Keys are few and fixed (error codes, operations): the
    map holds at most `keys_max` of them, an assertion says so."""

    def __init__(
        self,
        logger: logging.Logger,
        clock: Callable[[], float],
        interval_s: float = WARNING_INTERVAL_S,
        keys_max: int = 256,
        level: int = logging.WARNING,
    ) -> None:
        self._logger = logger
        self._clock = clock
        self._interval_s = interval_s
        self._keys_max = keys_max
        self._level = level
        self._by_key: dict[Hashable, ThrottledWarning] = {}

    def warn(
        self,
        key: Hashable,
        message: str,
        *args: object,
        extra: dict[str, object] | None = None,
        exc_info: bool = False,
    ) -> bool:
        warning = self._by_key.get(key)
        if warning is None:
            assert len(self._by_key) < self._keys_max, (key, len(self._by_key))
            warning = ThrottledWarning(self._logger, self._clock, self._interval_s, self._level)
            self._by_key[key] = warning
        return warning.warn(message, *args, extra=extra, exc_info=exc_info)
