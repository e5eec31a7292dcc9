"""L1 deletes whose object store delete failed: retried while the node runs, with backoff.

A delete is recorded DELETE_STARTED before the object store delete, so a crash mid-delete
resumes at start-up. A delete that *fails* (the store refused or timed out) would otherwise wait
for that restart too, its object in the bucket: an abandoned copy, a zombie's rejected object.
This tracker keeps each such key with its failures and when to try it next; the reconciler asks
which are due every round, and status and the metrics show them. The backoff doubles from
`first_s` up to `max_s` and then stays there: a key is retried until its delete succeeds.

Pure bookkeeping (sans-IO): the L1 catalog feeds it outcomes with the wall clock.
"""

from __future__ import annotations

from dataclasses import dataclass

# Keys tracked at once; beyond it a failed delete is left to the start-up recovery (counted).
PENDING_DELETES_MAX = 10_000
# The last error as shown in status and metrics, at most this many characters.
DELETE_ERROR_CHARS_MAX = 500


def retry_delay_s(failures: int, first_s: float, max_s: float) -> float:
    """Seconds from a key's `failures`-th failed delete to its next try: doubling, capped."""
    assert failures >= 1, failures
    assert 0 < first_s <= max_s, (first_s, max_s)
    return min(max_s, first_s * 2.0 ** min(failures - 1, 62))


@dataclass(frozen=True, slots=True)
class PendingDelete:
    key: str
    partition: str  # topic/partition
    since: float  # wall time of the first failure
    failures: int
    last_error: str
    next_retry_at: float


class PendingDeletes:
    """The failed L1 deletes waiting for their next try, by object key."""

    __slots__ = ("first_s", "max_s", "_pending", "untracked")

    def __init__(self, first_s: float, max_s: float) -> None:
        assert 0 < first_s <= max_s, (first_s, max_s)
        self.first_s = first_s
        self.max_s = max_s
        self._pending: dict[str, PendingDelete] = {}
        self.untracked = 0  # failures not tracked: the table was full

    def __len__(self) -> int:
        return len(self._pending)

    def note_failure(self, key: str, partition: str, error: str, now: float) -> PendingDelete | None:
        """A delete of `key` failed at `now`; its entry (None if the table is full)."""
        before = self._pending.get(key)
        if before is None and len(self._pending) >= PENDING_DELETES_MAX:
            self.untracked += 1
            return None
        failures = 1 if before is None else before.failures + 1
        entry = PendingDelete(
            key=key,
            partition=partition,
            since=now if before is None else before.since,
            failures=failures,
            last_error=error[:DELETE_ERROR_CHARS_MAX],
            next_retry_at=now + retry_delay_s(failures, self.first_s, self.max_s),
        )
        assert entry.next_retry_at > now and entry.since <= now
        self._pending[key] = entry
        return entry

    def get(self, key: str) -> PendingDelete | None:
        return self._pending.get(key)

    def note_done(self, key: str) -> PendingDelete | None:
        """`key`'s delete finished (by a retry or any other path); its entry if it had one."""
        return self._pending.pop(key, None)

    def due(self, now: float, limit: int) -> list[PendingDelete]:
        """At most `limit` entries whose next try is due, the longest waiting first."""
        assert limit >= 1, limit
        ready = [e for e in self._pending.values() if e.next_retry_at <= now]
        ready.sort(key=lambda e: (e.next_retry_at, e.key))
        return ready[:limit]

    def pending(self) -> list[PendingDelete]:
        """Every entry, the oldest failure first."""
        return sorted(self._pending.values(), key=lambda e: (e.since, e.key))

    def oldest_since(self) -> float | None:
        return min((e.since for e in self._pending.values()), default=None)
