"""The GC actor's decisions, pinned without an event loop: the range scan, pacing, throttling
detection and explain (levelzero.core.gc)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from levelzero.core.gc import (
    CAP_HOLDER,
    NO_LIVE_LEADER,
    YOUNG_WAKE_MIN_S,
    Eligible,
    ExplainVerdict,
    GcPacer,
    PaceReason,
    PartitionFacts,
    RangeScan,
    compute_cluster_watermark,
    explain,
    hold_reason,
    is_throttling,
    split_prefixes,
)
from levelzero.core.keys import format_l0_key, new_uuid

NOW = 50_000.0
GRACE_S = 30.0


@dataclass(frozen=True)
class Listed:
    key: str
    size: int = 3
    last_modified: float = NOW - 3600


def l0(prefix: int, epoch: int, n: int, age_s: float = 3600.0) -> Listed:
    return Listed(format_l0_key(prefix, epoch, new_uuid(n)), last_modified=NOW - age_s)


class Store:
    """A sorted key list answering list requests like an object store, `limit` keys a page."""

    def __init__(self, objects: list[Listed], limit: int) -> None:
        self.objects = sorted(objects, key=lambda o: o.key)
        self.limit = limit
        self.requests: list[tuple[str, str]] = []

    def page(self, prefix: str, start_after: str) -> tuple[list[Listed], bool]:
        self.requests.append((prefix, start_after))
        after = [o for o in self.objects if o.key.startswith(prefix) and o.key > start_after]
        return after[: self.limit], len(after) <= self.limit


def scan_all(scan: RangeScan, store: Store) -> list[Eligible]:
    out: list[Eligible] = []
    while not scan.done:
        objects, complete = store.page(*scan.request())
        out.extend(scan.feed(objects, complete))
    return out


# ---------------------------------------------------------------- split_prefixes


@pytest.mark.parametrize(
    ("prefixes", "parts"), [(range(1000), 8), (range(500, 1000), 3), (range(7, 9), 8), (range(3, 4), 1)]
)
def test_split_prefixes_is_contiguous_disjoint_and_complete(prefixes: range, parts: int) -> None:
    ranges = split_prefixes(prefixes, parts)
    assert len(ranges) == min(parts, len(prefixes))
    assert [p for r in ranges for p in r] == list(prefixes)
    assert all(len(r) >= 1 for r in ranges)


# ---------------------------------------------------------------- the range scan


@pytest.mark.parametrize("limit", [1, 2, 3, 7, 1000])
def test_range_scan_deletes_at_or_below_m_in_its_range_only(limit: int) -> None:
    objects = [l0(p, e, p * 100 + e) for p in (0, 1, 2, 499, 500, 501, 999) for e in (1, 2, 3, 4, 6, 7)]
    store = Store(objects, limit)
    scan = RangeScan(range(1, 500), m=4, now=NOW, grace_s=GRACE_S)
    eligible = scan_all(scan, store)
    assert sorted(e.key for e in eligible) == sorted(
        o.key
        for o in objects
        if o.key.split("/")[2] in {"001", "002", "499"} and int(o.key.split("/")[3]) <= 4
    )
    assert all(e.epoch <= 4 and e.size == 3 for e in eligible)
    assert scan.above_m == 3  # each prefix stops at epoch 6; epoch 7 is never looked at
    assert scan.listed == 3 * 5


def test_range_scan_skips_a_prefix_past_m_instead_of_paging_through_it() -> None:
    objects = [l0(5, 10 + i, i) for i in range(50)] + [l0(6, 1, 999)]
    store = Store(objects, limit=10)
    scan = RangeScan(range(0, 10), m=3, now=NOW, grace_s=GRACE_S)
    eligible = scan_all(scan, store)
    assert [e.key for e in eligible] == [objects[-1].key]
    assert len(store.requests) == 2  # one page of prefix 5, then straight to prefix 6
    assert store.requests[1] == ("level_zero/data/0", "level_zero/data/0050")


def test_range_scan_keeps_young_objects_and_remembers_the_oldest() -> None:
    objects = [l0(1, 1, 1, age_s=10), l0(1, 2, 2, age_s=20), l0(1, 3, 3, age_s=GRACE_S)]
    scan = RangeScan(range(0, 1000), m=5, now=NOW, grace_s=GRACE_S)
    eligible = scan_all(scan, Store(objects, limit=1000))
    assert [e.epoch for e in eligible] == [3]
    assert (scan.too_young, scan.oldest_young_at) == (2, NOW - 20)


def test_range_scan_never_yields_malformed_keys_and_samples_them() -> None:
    good = l0(1, 1, 1)
    bad = [Listed("level_zero/data/001/1/x"), Listed("level_zero/data/001/000000000000000001/" + "A" * 32)]
    scan = RangeScan(range(0, 1000), m=5, now=NOW, grace_s=GRACE_S)
    eligible = scan_all(scan, Store([*bad, good], limit=2))
    assert [e.key for e in eligible] == [good.key]
    assert scan.malformed == 2 and sorted(scan.malformed_sample) == sorted(b.key for b in bad)


def test_range_scan_of_an_empty_store_is_one_request_per_first_digit() -> None:
    store = Store([], limit=1000)
    scan = RangeScan(range(0, 1000), m=5, now=NOW, grace_s=GRACE_S)
    assert scan_all(scan, store) == []
    assert store.requests == [(f"level_zero/data/{d}", f"level_zero/data/{d}00") for d in range(10)]
    store = Store([], limit=1000)
    assert scan_all(RangeScan(range(250, 500), m=5, now=NOW, grace_s=GRACE_S), store) == []
    assert store.requests == [
        ("level_zero/data/2", "level_zero/data/250"),
        ("level_zero/data/3", "level_zero/data/300"),
        ("level_zero/data/4", "level_zero/data/400"),
    ]


def test_a_stopped_last_prefix_of_a_digit_moves_to_the_next_digit() -> None:
    objects = [l0(199, 9, i) for i in range(5)] + [l0(200, 1, 99)]
    store = Store(objects, limit=2)
    eligible = scan_all(RangeScan(range(150, 250), m=3, now=NOW, grace_s=GRACE_S), store)
    assert [e.key for e in eligible] == [objects[-1].key]
    assert [r[0] for r in store.requests] == ["level_zero/data/1", "level_zero/data/2"]


def test_range_scan_rejects_a_listing_out_of_order() -> None:
    scan = RangeScan(range(0, 1000), m=5, now=NOW, grace_s=GRACE_S)
    scan.feed([l0(3, 1, 1)], complete=False)
    with pytest.raises(AssertionError):
        scan.feed([l0(2, 1, 1)], complete=True)


# ---------------------------------------------------------------- pacing


def pacer() -> GcPacer:
    return GcPacer(interval_s=5.0, idle_backoff_max_s=60.0, grace_s=GRACE_S, jitter_fraction=0.1)


def after(p: GcPacer, *, deleted=0, backlog=0, failed=False, young=None, jitter=0.0):
    return p.after_round(
        deleted=deleted, backlog=backlog, failed=failed, oldest_young_at=young, now=NOW, jitter_unit=jitter
    )


def test_pacing_backs_off_while_idle_and_resets_after_progress() -> None:
    p = pacer()
    assert [after(p).delay_s for _ in range(6)] == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]
    progress = after(p, deleted=3)
    assert progress == type(progress)(5.0, PaceReason.PROGRESS)
    assert after(p).delay_s == 5.0


def test_pacing_keeps_the_interval_while_a_backlog_is_left() -> None:
    p = pacer()
    after(p)
    after(p)
    assert after(p, backlog=7).reason == PaceReason.BACKLOG
    assert after(p, backlog=7).delay_s == 5.0


def test_a_failed_round_backs_off_like_an_idle_one() -> None:
    p = pacer()
    assert [after(p, failed=True, deleted=4).delay_s for _ in range(3)] == [5.0, 10.0, 20.0]


def test_pacing_wakes_when_the_oldest_young_object_ages_out() -> None:
    p = pacer()
    for _ in range(5):
        after(p)  # backed off to 60 s
    young = after(p, young=NOW - 25)
    assert young.reason == PaceReason.YOUNG and young.delay_s == pytest.approx(5.0)
    assert after(p, young=NOW - 10).delay_s == pytest.approx(20.0)
    assert after(p, young=NOW - 31).delay_s == YOUNG_WAKE_MIN_S  # never a zero wait


def test_jitter_stays_within_its_fraction() -> None:
    assert after(pacer(), jitter=1.0).delay_s == pytest.approx(5.5)
    assert after(pacer(), jitter=-1.0).delay_s == pytest.approx(4.5)
    assert pacer().first(0.5).delay_s == pytest.approx(5.25)


# ---------------------------------------------------------------- throttling


@pytest.mark.parametrize(
    ("message", "throttled"),
    [
        ("S3 delete_objects of bucket b at x failed: SlowDown (HTTP 503) Please reduce", True),
        ("SlowDown: Please reduce your request rate.", True),
        ("S3 list_objects_v2 of bucket b failed: HTTP 503", True),
        ("Throttling: rate exceeded", True),
        ("InternalError: We encountered an internal error", False),
        ("S3 endpoint http://x is unreachable (delete_objects)", False),
        ("AccessDenied (HTTP 403)", False),
    ],
)
def test_is_throttling(message: str, throttled: bool) -> None:
    assert is_throttling(message) is throttled


# ---------------------------------------------------------------- explain


def facts(name: str, *, state_mp=3, pinned=None, lro=9, hwm=10) -> PartitionFacts:
    return PartitionFacts(name, state_mp, pinned, lro, hwm, 5)


def test_hold_reasons() -> None:
    assert hold_reason(None, None) == "no epoch yet"
    assert hold_reason(None, facts("a", state_mp=None)) == "no epoch yet"
    assert hold_reason(3, None) == "no local view of the partition"
    assert hold_reason(2, facts("a", pinned=2)) == "pinned by an L0 reader (at 2; unpinned M(p) is 3)"
    assert hold_reason(3, facts("a", lro=4)) == "unreconciled data (LRO 4, high watermark 10)"
    assert hold_reason(3, facts("a")) == "idle: waiting for the housekeeper to advance its epoch"


def test_hold_reasons_name_the_node_leading_a_partition_in_a_cluster() -> None:
    assert hold_reason(3, None, "b") == "led by node b (its explain says why)"
    assert hold_reason(None, None, "b") == "no epoch yet; led by node b (its explain says why)"
    assert hold_reason(3, None, NO_LIVE_LEADER).startswith("no live leader (moving)")
    assert hold_reason(3, facts("a"), "b") == hold_reason(3, facts("a"))  # led here: its facts
    mps = {"a": 3, "b": 5}
    why = explain(
        compute_cluster_watermark(20, mps), mps, {"a": facts("a")}, epoch=19, leaders={"a": "n1", "b": "n2"}
    )
    assert [(h.partition, h.reason) for h in why.holders] == [
        ("a", "idle: waiting for the housekeeper to advance its epoch"),
        ("b", "led by node n2 (its explain says why)"),
    ]


def test_explain_an_epoch_lists_what_holds_it_back_by_how_much() -> None:
    mps = {"a": 3, "b": 5, "c": 9}
    decision = compute_cluster_watermark(20, mps)
    why = explain(decision, mps, {"a": facts("a", lro=1), "b": facts("b", state_mp=5)}, epoch=6)
    assert why.verdict == ExplainVerdict.ABOVE_M and why.m == 3
    assert [(h.partition, h.mp, h.behind, h.mp_minus_m) for h in why.holders] == [
        ("a", 3, 3, 0),
        ("b", 5, 1, 2),
    ]
    assert why.holders[0].reason == "unreconciled data (LRO 1, high watermark 10)"
    assert explain(decision, mps, {}, epoch=3).verdict == ExplainVerdict.DELETABLE


def test_explain_without_a_question_names_the_holders_of_m() -> None:
    mps = {"a": 3, "b": 3, "c": 9}
    why = explain(compute_cluster_watermark(20, mps), mps, {})
    assert why.verdict is None and [h.partition for h in why.holders] == ["a", "b"]
    assert why.detail == "M = 3 (cluster epoch 20), held by a, b"


def test_explain_a_key() -> None:
    mps = {"a": 4}
    decision = compute_cluster_watermark(20, mps)
    key = format_l0_key(7, 4, new_uuid(1))
    old, young = Listed(key), Listed(key, last_modified=NOW - 10)
    assert (
        explain(decision, mps, {}, key=key, obj=old, now=NOW, grace_s=GRACE_S).verdict
        == ExplainVerdict.DELETABLE
    )
    too_young = explain(
        decision, mps, {}, key=key, obj=young, now=NOW, grace_s=GRACE_S, prefixes=range(500, 1000)
    )
    assert (
        too_young.verdict == ExplainVerdict.TOO_YOUNG and too_young.age_s == 10 and too_young.owned is False
    )
    assert explain(decision, mps, {}, key=key, obj=None).verdict == ExplainVerdict.NOT_FOUND
    assert explain(decision, mps, {}, key="nope").verdict == ExplainVerdict.MALFORMED


def test_explain_when_blocked_and_when_capped() -> None:
    mps = {"a": None, "b": 50}
    blocked = explain(compute_cluster_watermark(10, mps), mps, {}, epoch=2)
    assert blocked.verdict == ExplainVerdict.BLOCKED and blocked.blocked_by == ["a"]
    assert [(h.partition, h.reason) for h in blocked.holders] == [("a", "no epoch yet")]
    capped = explain(compute_cluster_watermark(10, {"b": 50}), {"b": 50}, {}, epoch=11)
    assert [(h.partition, h.mp, h.behind) for h in capped.holders] == [(CAP_HOLDER, 9, 2)]
    # an epoch above the cluster epoch: said to have no object yet (the partitions and the cap
    # are listed by how far they are from it, as for any epoch above M)
    mps = {"a": 3, "b": 4}
    future = explain(compute_cluster_watermark(11, mps), mps, {}, epoch=999)
    assert future.verdict == ExplainVerdict.ABOVE_M
    assert future.detail == "epoch 999 is above the cluster epoch 11: no object has it yet (M = 3)"
    assert [h.partition for h in future.holders] == ["a", "b", CAP_HOLDER]
    # an epoch at or below M, asked by epoch: its objects are not listed, so the answer does
    # not claim any is left ("the next round deletes it" for an epoch whose objects were gone)
    done = explain(compute_cluster_watermark(11, mps), mps, {}, epoch=1, grace_s=GRACE_S)
    assert done.verdict == ExplainVerdict.DELETABLE
    assert done.detail == (
        f"epoch 1 <= M = 3: every object of it is deletable, and a GC round deletes those still in "
        f"the bucket (past the grace of {GRACE_S:g} s)"
    )
