"""Which partitions' reconciliation keeps failing: a named condition, not a stream of warnings.

A partition whose unreconciled data cannot move to L1 (an L0 object lost in a storage incident,
a topic name no store can hold) keeps its `M(p)` where it is, and `M = min M(p)` with it: one
poisoned partition stops the GC for the whole cluster. This tracker turns "the reconciler
failed again" into a condition that status, `gc explain` and the metrics name: which
partition, since when, how many passes, the last error. It is pure bookkeeping (sans-IO): the
reconciler feeds it outcomes with the wall clock, readers ask it.
"""

from __future__ import annotations

from collections.abc import Set
from datetime import datetime, timezone
from dataclasses import dataclass

import msgspec

# Consecutive failed passes before a partition is named as failing (one may be a blip).
RECONCILE_FAILURES_BEFORE_FAILING = 3
# A failing partition is retried this often, not on every pass (each try reads L0 objects
# and logs a line).
RECONCILE_FAILING_RETRY_S = 30.0
# What abandon-unreconciled gives up, said wherever it is asked for (API, CLI).
ABANDON_GIVES_UP = (
    "gives up, for good, every record of the partition above its last reconciled offset (LRO) "
    "up to its high watermark now: those offsets are never readable again (reads get "
    "offset_out_of_range naming the next readable offset) and the GC collects their L0 objects; "
    "the partition log and an AUDIT log line record who, why and when. Read what is still "
    "readable first"
)
# The last error as shown in status and metrics, at most this many characters.
RECONCILE_ERROR_CHARS_MAX = 500


@dataclass(frozen=True, slots=True)
class ReconcileFailing:
    partition: str
    since: float  # wall time of the first failure of this run of failures
    failures: int  # consecutive failed passes
    last_error: str
    last_failed_at: float
    failing: bool  # named: `failures` reached the threshold, or the cause is permanent

    def describe(self) -> str:
        since = utc_time(self.since)
        return f"reconciliation failing since {since} ({self.failures} passes): {self.last_error}"


def utc_time(at: float) -> str:
    """A wall time as shown in explanations and logs (the CLI shows it as "N s ago")."""
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ReconcileHealth:
    """Outcomes of each partition's reconciliation passes, by partition name."""

    __slots__ = ("_runs",)

    def __init__(self) -> None:
        self._runs: dict[str, ReconcileFailing] = {}

    def note_failure(self, partition: str, error: str, now: float, *, permanent: bool = False) -> bool:
        """Record a failed pass. Returns True when this failure makes the partition failing
        (the moment to say so loudly); a `permanent` cause (one no retry can fix) names it at
        once."""
        error = error[:RECONCILE_ERROR_CHARS_MAX]
        run = self._runs.get(partition)
        since, failures = (now, 1) if run is None else (run.since, run.failures + 1)
        was_failing = run is not None and run.failing
        failing = permanent or was_failing or failures >= RECONCILE_FAILURES_BEFORE_FAILING
        self._runs[partition] = ReconcileFailing(partition, since, failures, error, now, failing)
        assert failures >= 1 and (failing or failures < RECONCILE_FAILURES_BEFORE_FAILING)
        return failing and not was_failing

    def note_success(self, partition: str) -> ReconcileFailing | None:
        """A pass that did not fail ends the run; returns it if the partition was failing."""
        run = self._runs.pop(partition, None)
        return run if run is not None and run.failing else None

    def forget(self, partition: str) -> None:
        self._runs.pop(partition, None)

    def retain(self, partitions: Set[str]) -> None:
        """Forget every partition not in `partitions` (no longer led here, or deleted)."""
        for name in [n for n in self._runs if n not in partitions]:
            del self._runs[name]

    def get(self, partition: str) -> ReconcileFailing | None:
        """The partition's condition if it is failing (named), else None."""
        run = self._runs.get(partition)
        return run if run is not None and run.failing else None

    def failing(self) -> list[ReconcileFailing]:
        """Every failing partition, the longest failing first."""
        return sorted((r for r in self._runs.values() if r.failing), key=lambda r: (r.since, r.partition))

    def retry_due(self, partition: str, now: float) -> bool:
        """Whether to try the partition this pass: always, unless it is failing and was tried
        less than `RECONCILE_FAILING_RETRY_S` ago."""
        run = self.get(partition)
        return run is None or not 0 <= now - run.last_failed_at < RECONCILE_FAILING_RETRY_S


class Abandoned(msgspec.Struct, frozen=True):
    """What one abandon-unreconciled gave up, and the audit facts recorded with it (the HTTP
    API returns it as is)."""

    partition: str
    first_offset: int  # the data offsets given up: first..last (first > last: a catch-up
    last_offset: int  # landed first, nothing was given up)
    log_offset: int  # the AbandonUnreconciled entry in the partition log
    term: int
    operator: str
    reason: str
    at: float
    failing_since: float
    last_error: str
    mp_before: int | None
    mp_after: int | None
