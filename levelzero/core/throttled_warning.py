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
        held = self.admit()
        if held is None:
            return False
        if held:
            message += HELD_BACK_SUFFIX
            args = (*args, held)
        # (None rather than False without one: a record says "no exception" as logging does)
        self._logger.log(self._level, message, *args, extra=extra, exc_info=exc_info or None)
        return True

    def admit(self) -> int | None:
        """Whether a line may be logged now: None when it is to be held back (counted), else
        how many were held back since the last one (the caller says so on its line)."""
        now = self._clock()
        if self._last is not None and now - self._last < self._interval_s:
            self.held += 1
            return None
        held, self._last, self.held = self.held, now, 0
        return held


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


class ThrottledBugs:
    """Tracebacks of requests that failed on a bug, which a client sends again at once, for
    ever: each at most once an interval per key and kind of error, with the count held back.
    A violated invariant (AssertionError) at CRITICAL, anything else at ERROR. Called inside
    the `except` that caught `exc` (the traceback is the one being handled)."""

    def __init__(self, logger: logging.Logger, clock: Callable[[], float], keys_max: int = 256) -> None:
        self._invariants = ThrottledWarnings(logger, clock, keys_max=keys_max, level=logging.CRITICAL)
        self._others = ThrottledWarnings(logger, clock, keys_max=keys_max, level=logging.ERROR)

    def failed(self, exc: BaseException, key: Hashable, message: str, *args: object) -> bool:
        lines = self._invariants if isinstance(exc, AssertionError) else self._others
        return lines.warn((key, type(exc).__name__), message, *args, exc_info=True)


class ThrottledRecords(logging.Filter):
    """A library's log records whose message is one of `messages` (its own repeating warning,
    logged by code we do not call), let through at most once every `interval_s`; the next one
    let through says how many were held back. Other records pass untouched."""

    def __init__(
        self,
        messages: frozenset[str],
        clock: Callable[[], float],
        interval_s: float = WARNING_INTERVAL_S,
    ) -> None:
        super().__init__()
        # the counting of a ThrottledWarning; it logs nothing itself (the record is the line)
        self._by_message = {
            message: ThrottledWarning(logging.getLogger(__name__), clock, interval_s) for message in messages
        }

    def filter(self, record: logging.LogRecord) -> bool:
        throttle = self._by_message.get(record.msg) if isinstance(record.msg, str) else None
        if throttle is None:
            return True
        held = throttle.admit()
        if held is None:
            return False
        if held:
            record.msg = record.getMessage() + HELD_BACK_SUFFIX % held
            record.args = ()
        return True
