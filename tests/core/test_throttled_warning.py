"""Throttled warnings: one line an interval, the count of those held back on the next one, and
one throttle per key."""

from __future__ import annotations

import logging

import pytest

from levelzero.core.throttled_warning import (
    ThrottledBugs,
    ThrottledRecords,
    ThrottledWarning,
    ThrottledWarnings,
)

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


def test_throttled_records_let_a_librarys_repeating_warning_through_once_an_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """uvicorn logs its "Invalid HTTP request received." once per request that is not HTTP;
    the filter lets one through an interval, saying on the next how many it held back, and
    every other record of that logger through untouched."""
    now = [0.0]
    library = logging.getLogger("levelzero.test.library")
    throttle = ThrottledRecords(frozenset({"Invalid HTTP request received."}), lambda: now[0], 10.0)
    library.addFilter(throttle)
    try:
        with caplog.at_level(logging.WARNING, logger="levelzero.test.library"):
            for t in (0.0, 1.0, 2.0, 9.9, 10.5):
                now[0] = t
                library.warning("Invalid HTTP request received.")
                library.warning("something else: %s", t)
    finally:
        library.removeFilter(throttle)
    assert [r.getMessage() for r in caplog.records] == [
        "Invalid HTTP request received.",
        *(f"something else: {t}" for t in (0.0, 1.0, 2.0, 9.9)),
        "Invalid HTTP request received. (and 3 more like it since the last such warning)",
        "something else: 10.5",
    ]


def test_bugs_are_logged_with_their_traceback_once_an_interval_a_violated_invariant_critical(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    bugs = ThrottledBugs(log, lambda: now[0])
    with caplog.at_level(logging.ERROR, logger="levelzero.test"):
        for t, exc in [(0.0, AssertionError("x")), (1.0, AssertionError("x")), (2.0, TypeError("y"))]:
            now[0] = t
            try:
                raise exc
            except Exception as caught:  # noqa: BLE001 - the handler under test
                bugs.failed(caught, "route", "failed serving %s", "route")
        now[0] = 11.0
        try:
            raise AssertionError("x")
        except AssertionError as caught:
            bugs.failed(caught, "route", "failed serving %s", "route")
    assert [(r.levelname, r.getMessage(), r.exc_info[0]) for r in caplog.records] == [
        ("CRITICAL", "failed serving route", AssertionError),
        ("ERROR", "failed serving route", TypeError),  # another kind: not held back by the first
        ("CRITICAL", "failed serving route (and 1 more like it since the last such warning)", AssertionError),
    ]
