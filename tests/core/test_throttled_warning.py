"""Throttled warnings: one line an interval, the count of those held back on the next one, and
one throttle per key."""

from __future__ import annotations

import logging

import pytest

from levelzero.core.throttled_warning import ThrottledWarning, ThrottledWarnings

log = logging.getLogger("levelzero.test")


def test_a_throttled_warning_says_how_many_it_held_back(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    warning = ThrottledWarning(log, lambda: now[0], 10.0)
    with caplog.at_level(logging.WARNING, logger="levelzero.test"):
        for t in (0.0, 1.0, 2.0, 9.9, 10.5, 30.0):
            now[0] = t
            warning.warn("failed (%s)", "why")
    assert [r.getMessage() for r in caplog.records] == [
        "failed (why)",
        "failed (why) (and 3 more like it since the last such warning)",
        "failed (why)",
    ]


def test_throttled_warnings_hold_back_each_key_apart(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    warnings = ThrottledWarnings(log, lambda: now[0], 10.0)
    with caplog.at_level(logging.WARNING, logger="levelzero.test"):
        for t in (0.0, 1.0, 2.0):
            now[0] = t
            warnings.warn("storage_error", "failed: %s", "storage_error")
            warnings.warn("internal_error", "failed: %s", "internal_error")
        now[0] = 11.0
        warnings.warn("storage_error", "failed: %s", "storage_error", extra={"code": "storage_error"})
    assert [r.getMessage() for r in caplog.records] == [
        "failed: storage_error",
        "failed: internal_error",
        "failed: storage_error (and 2 more like it since the last such warning)",
    ]
    assert caplog.records[-1].code == "storage_error"
