"""The failed-L1-delete tracker: backoff doubling up to its cap, due keys in order, bounded."""

from __future__ import annotations

import pytest

from levelzero.core import l1_deletes
from levelzero.core.l1_deletes import PendingDeletes, retry_delay_s


def test_the_backoff_doubles_from_first_s_and_stays_at_max_s():
    assert [retry_delay_s(n, 1.0, 300.0) for n in (1, 2, 3, 4, 9, 10, 1000)] == [
        1.0,
        2.0,
        4.0,
        8.0,
        256.0,
        300.0,
        300.0,
    ]
    with pytest.raises(AssertionError):
        retry_delay_s(0, 1.0, 300.0)


def test_a_key_is_due_after_its_backoff_and_forgotten_once_done():
    pending = PendingDeletes(first_s=1.0, max_s=4.0)
    first = pending.note_failure("k1", "t/0", "storage_error: timeout", now=100.0)
    assert first is not None and (first.failures, first.since, first.next_retry_at) == (1, 100.0, 101.0)
    assert pending.due(100.5, 10) == []
    assert [e.key for e in pending.due(101.0, 10)] == ["k1"]
    again = pending.note_failure("k1", "t/0", "storage_error: again", now=101.0)
    assert again is not None and (again.failures, again.since, again.next_retry_at) == (2, 100.0, 103.0)
    assert again.last_error == "storage_error: again"
    for now in (103.0, 107.0, 111.0):  # capped at 4 s
        entry = pending.note_failure("k1", "t/0", "x", now)
        assert entry is not None and entry.next_retry_at == now + 4.0
    pending.note_failure("k0", "t/1", "y", now=90.0)
    assert [e.key for e in pending.pending()] == ["k0", "k1"]  # oldest failure first
    assert pending.oldest_since() == 90.0 and len(pending) == 2
    assert [e.key for e in pending.due(200.0, 1)] == ["k0"]  # the longest waiting first, bounded
    assert pending.note_done("k1") is not None and pending.note_done("k1") is None
    assert len(pending) == 1


def test_the_table_is_bounded_and_counts_what_it_could_not_track(monkeypatch):
    monkeypatch.setattr(l1_deletes, "PENDING_DELETES_MAX", 2)
    pending = PendingDeletes(first_s=1.0, max_s=1.0)
    assert pending.note_failure("a", "t/0", "e", 1.0) is not None
    assert pending.note_failure("b", "t/0", "e", 1.0) is not None
    assert pending.note_failure("c", "t/0", "e", 1.0) is None
    assert pending.note_failure("a", "t/0", "e", 2.0) is not None  # a tracked key still counts
    assert (len(pending), pending.untracked) == (2, 1)
    assert pending.note_failure("d", "t/0", "e" * 10_000, 1.0) is None
    pending.note_done("b")
    entry = pending.note_failure("d", "t/0", "e" * 10_000, 1.0)
    assert entry is not None and len(entry.last_error) == l1_deletes.DELETE_ERROR_CHARS_MAX
