"""The fetch window takes runs of each extent's stored records (no object per record): from
the fetch offset, even in the middle of an extent, up to `upto`, the byte budget or the record
cap; the Kafka door encodes each run as one batch starting at the run's first offset."""

from __future__ import annotations

import pytest

from levelzero.actors.reader import FETCH_RECORDS_MAX, FetchedRecord, FetchWindow, Run
from levelzero.core.l0format import Record
from levelzero.kafka import records as kr


def extent(first: int, count: int) -> list[Record]:
    """`count` records whose values name their offsets (4 bytes each, keys of 1 byte)."""
    return [Record(b"k", b"v%03d" % (first + i), 1_700_000_000_000 + first + i) for i in range(count)]


def test_a_window_takes_runs_from_the_middle_of_an_extent_on_across_extents() -> None:
    window = FetchWindow(13, 99, 1_000)
    assert window.add_extent(10, extent(10, 5))  # offsets 10..14: takes 13, 14
    assert window.add_extent(15, extent(15, 3))
    assert [(r.base_offset, r.start, r.stop) for r in window.runs] == [(10, 3, 5), (15, 0, 3)]
    assert (window.count, window.next_offset, window.size) == (5, 18, 25)
    assert window.records == [
        FetchedRecord(o, b"k", b"v%03d" % o, 1_700_000_000_000 + o) for o in range(13, 18)
    ]


def test_a_window_stops_at_its_budget_upto_and_a_gap() -> None:
    full = FetchWindow(0, 99, 12)  # 5 bytes a record: two fit, the first always
    assert not full.add_extent(0, extent(0, 10))
    assert (full.stopped, full.count, full.next_offset) == ("full", 2, 2)
    one = FetchWindow(0, 99, 1)
    assert not one.add_extent(0, extent(0, 10))
    assert (one.stopped, one.count) == ("full", 1)  # at least one record
    upto = FetchWindow(3, 6, 1_000)
    assert not upto.add_extent(0, extent(0, 10))
    assert (upto.stopped, [(r.start, r.stop) for r in upto.runs]) == ("upto", [(3, 7)])
    upto.extend_to(20)
    assert upto.stopped is None and upto.add_extent(0, extent(0, 10))
    assert [(r.start, r.stop) for r in upto.runs] == [(3, 7), (7, 10)]
    gap = FetchWindow(0, 99, 1_000)
    assert gap.add_extent(0, extent(0, 2))
    assert not gap.add_extent(5, extent(5, 2))
    assert (gap.stopped, gap.next_offset) == ("gap", 2)


def test_a_window_steps_over_compactions_gaps_only_with_a_record_past_them() -> None:
    """A compacted object's runs (gaps=True) are stepped over; when the budget ends at a gap,
    the window ends where its last run does (the run past the gap was not taken). Before, it
    had stepped over the gap first: an assertion failed (a 500 over HTTP, a closed connection
    over Kafka) whenever a fetch's budget ended at a gap."""
    window = FetchWindow(0, 99, 12)  # 5 bytes a record: two fit
    assert window.add_extent(0, extent(0, 1), gaps=True)
    assert window.add_extent(2, extent(2, 1), gaps=True)  # 1 removed
    assert not window.add_extent(5, extent(5, 2), gaps=True)  # 3, 4 removed; full before 5
    assert (window.stopped, window.count, window.next_offset) == ("full", 2, 3)
    assert [r.offset for r in window.records] == [0, 2]
    again = FetchWindow(window.next_offset, 99, 12)  # the next fetch, at a removed offset
    assert again.add_extent(5, extent(5, 2), gaps=True)
    assert [r.offset for r in again.records] == [5, 6] and again.next_offset == 7
    beyond = FetchWindow(3, 4, 1_000)  # a gap past `upto`: on from upto + 1
    assert not beyond.add_extent(5, extent(5, 2), gaps=True)
    assert (beyond.stopped, beyond.count, beyond.next_offset) == ("upto", 0, 5)


def test_a_window_takes_at_most_the_record_cap() -> None:
    window = FetchWindow(0, 10 * FETCH_RECORDS_MAX, 10**9)
    assert not window.add_extent(0, extent(0, FETCH_RECORDS_MAX + 5))
    assert (window.stopped, window.count) == ("full", FETCH_RECORDS_MAX)


def test_null_values_count_as_empty_and_stay_null() -> None:
    window = FetchWindow(0, 99, 1_000)
    window.add_extent(0, [Record(b"k", None), Record(None, b"")])
    assert window.size == 1
    assert [(r.key, r.value) for r in window.records] == [(b"k", None), (None, b"")]


def test_each_run_is_one_kafka_batch_at_its_first_offset() -> None:
    window = FetchWindow(13, 99, 1_000)
    window.add_extent(10, extent(10, 5))
    window.add_extent(15, extent(15, 3) + [Record(None, None, -1, (("h", b"x"),))])
    batches = kr.decode_batches(kr.encode_runs(window.runs))
    assert [(b.base_offset, b.last_offset_delta, len(b.records)) for b in batches] == [(13, 1, 2), (15, 3, 4)]
    got = [
        (b.base_offset + r.offset_delta, r.key, r.value, r.timestamp_ms, r.headers)
        for b in batches
        for r in b.records
    ]
    assert got == [(r.offset, r.key, r.value, r.timestamp_ms, r.headers) for r in window.records]
    # The Python encoder (the fallback) encodes the same records.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kr, "_AIOKAFKA", False)
        python = kr.encode_runs(window.runs)
    assert [b.records for b in kr.decode_batches(python)] == [b.records for b in batches]
    assert Run(10, extent(10, 5), 3, 5).first_offset == 13
