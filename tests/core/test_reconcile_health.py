"""A partition whose reconciliation keeps failing is a named condition (pure bookkeeping)."""

from __future__ import annotations

from levelzero.core.reconcile_health import (
    RECONCILE_ERROR_CHARS_MAX,
    RECONCILE_FAILING_RETRY_S,
    RECONCILE_FAILURES_BEFORE_FAILING,
    ReconcileHealth,
)


def test_a_partition_is_named_failing_after_the_threshold_with_since_and_last_error() -> None:
    health = ReconcileHealth()
    became = [health.note_failure("t/0", f"error {i}", 100.0 + i) for i in range(5)]
    assert became == [i == RECONCILE_FAILURES_BEFORE_FAILING - 1 for i in range(5)]
    failing = health.get("t/0")
    assert failing is not None
    assert (failing.since, failing.failures, failing.last_error, failing.last_failed_at) == (
        100.0,
        5,
        "error 4",
        104.0,
    )
    assert failing.describe() == "reconciliation failing since 1970-01-01T00:01:40Z (5 passes): error 4"
    assert [f.partition for f in health.failing()] == ["t/0"]


def test_fewer_failures_than_the_threshold_are_not_named() -> None:
    health = ReconcileHealth()
    for i in range(RECONCILE_FAILURES_BEFORE_FAILING - 1):
        assert health.note_failure("t/0", "blip", float(i)) is False
    assert health.get("t/0") is None and health.failing() == []
    assert health.note_success("t/0") is None  # a success ends the run, nothing was named
    assert health.note_failure("t/0", "blip", 10.0) is False  # a new run starts from one


def test_a_permanent_cause_is_named_at_once_and_a_success_clears_it() -> None:
    health = ReconcileHealth()
    assert health.note_failure("t/1", "name cannot be stored", 5.0, permanent=True) is True
    assert health.get("t/1") is not None
    cleared = health.note_success("t/1")
    assert cleared is not None and cleared.since == 5.0
    assert health.get("t/1") is None and health.failing() == []


def test_failing_partitions_are_listed_longest_failing_first() -> None:
    health = ReconcileHealth()
    for name, start in (("b/0", 20.0), ("a/0", 10.0), ("c/0", 30.0)):
        health.note_failure(name, "x", start, permanent=True)
    assert [f.partition for f in health.failing()] == ["a/0", "b/0", "c/0"]
    health.forget("a/0")
    assert [f.partition for f in health.failing()] == ["b/0", "c/0"]
    health.retain({"c/0", "d/0"})  # b/0 is no longer led here
    assert [f.partition for f in health.failing()] == ["c/0"]


def test_a_failing_partition_is_retried_only_every_retry_interval() -> None:
    health = ReconcileHealth()
    assert health.retry_due("t/0", 0.0)
    for _ in range(RECONCILE_FAILURES_BEFORE_FAILING):
        health.note_failure("t/0", "lost", 100.0)
    assert not health.retry_due("t/0", 100.0 + RECONCILE_FAILING_RETRY_S - 0.5)
    assert health.retry_due("t/0", 100.0 + RECONCILE_FAILING_RETRY_S)
    assert health.retry_due("t/0", 50.0), "a wall clock stepped back retries rather than waits"
    assert health.retry_due("other", 100.0)


def test_the_last_error_is_bounded() -> None:
    health = ReconcileHealth()
    health.note_failure("t/0", "e" * 10_000, 1.0, permanent=True)
    failing = health.get("t/0")
    assert failing is not None and len(failing.last_error) == RECONCILE_ERROR_CHARS_MAX
