"""GC selection (sans-IO): the cluster watermark M, the per-prefix scan, batching, sharding."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from levelzero.core.errors import InvariantViolation
from levelzero.core.gc import (
    DELETE_BATCH_KEYS_MAX,
    MonotoneWatermark,
    PrefixScan,
    Verdict,
    WatermarkDecision,
    batches,
    classify,
    compute_cluster_watermark,
    scan_prefix,
    worker_prefixes,
)
from levelzero.core.keys import format_l0_key, new_uuid

NOW = 10_000.0
GRACE_S = 60.0
OLD = NOW - 3600.0


@dataclass(frozen=True)
class Listed:
    key: str
    size: int = 1
    last_modified: float = OLD


def l0(epoch: int, n: int = 0, prefix: int = 42, age_s: float = 3600.0) -> Listed:
    return Listed(format_l0_key(prefix, epoch, new_uuid(n)), last_modified=NOW - age_s)


def epochs_of(objects: list[Listed]) -> list[int]:
    return [int(o.key.split("/")[3]) for o in objects]


# ---------------------------------------------------------------- the cluster watermark M


def test_m_is_the_min_over_partitions_and_names_the_holder() -> None:
    decision = compute_cluster_watermark(100, {"t/0": 5, "t/1": 3, "t/2": 9})
    assert decision == WatermarkDecision(cluster_epoch=100, m=3, holders=("t/1",))
    assert not decision.blocked


def test_every_partition_at_m_is_a_holder() -> None:
    decision = compute_cluster_watermark(100, {"b/0": 3, "a/0": 3, "c/0": 4})
    assert decision.m == 3
    assert decision.holders == ("a/0", "b/0")


def test_cap_e_minus_1_binds() -> None:
    decision = compute_cluster_watermark(4, {"t/0": 5, "t/1": 7})
    assert decision.m == 3
    assert decision.holders == ("cap",)
    tied = compute_cluster_watermark(4, {"t/0": 3, "t/1": 9})
    assert tied.m == 3
    assert tied.holders == ("cap", "t/0")


def test_partition_without_mp_blocks_the_round_and_is_named() -> None:
    decision = compute_cluster_watermark(50, {"t/2": None, "t/0": 7, "t/1": None})
    assert decision.m is None
    assert decision.blocked
    assert decision.blocked_by == ("t/1", "t/2")
    assert decision.holders == ()


def test_no_partitions_gives_e_minus_1() -> None:
    decision = compute_cluster_watermark(7, {})
    assert decision.m == 6
    assert decision.holders == ("cap",)
    assert compute_cluster_watermark(1, {}).m == 0  # nothing has epoch <= 0


def test_the_cap_keeps_m_below_e_whatever_the_partitions_publish() -> None:
    mps = {"t/0": 9, "t/1": 7}
    decision = compute_cluster_watermark(4, mps)
    assert decision.m == 3  # not 7: a partition created at epoch 4 keeps its objects
    assert decision.holders == ("cap",)


def test_monotone_watermark_raises_on_decrease() -> None:
    watermark = MonotoneWatermark()
    assert watermark.value is None
    for m in (3, 5, 5, None, 8):
        watermark.observe(m)
    assert watermark.value == 8
    with pytest.raises(InvariantViolation, match="M fell from 8 to 7"):
        watermark.observe(7)
    assert watermark.value == 8


# ---------------------------------------------------------------- classify


@pytest.mark.parametrize(
    ("epoch", "m", "age_s", "verdict"),
    [
        (5, 5, 3600.0, Verdict.DELETE),
        (4, 5, 3600.0, Verdict.DELETE),
        (6, 5, 3600.0, Verdict.ABOVE_M),
        (6, 5, 0.0, Verdict.ABOVE_M),
        (5, 5, GRACE_S - 1, Verdict.TOO_YOUNG),
        (5, 5, GRACE_S, Verdict.DELETE),
        (1, None, 3600.0, Verdict.ABOVE_M),
    ],
)
def test_classify(epoch: int, m: int | None, age_s: float, verdict: Verdict) -> None:
    assert classify(epoch, NOW - age_s, m, NOW, GRACE_S) is verdict


# ---------------------------------------------------------------- scanning a prefix


def test_scan_deletes_at_or_below_m_and_stops_above_m() -> None:
    listing = [l0(e, i) for i, e in enumerate([1, 2, 3, 5, 5, 6, 8, 9])]
    scan = scan_prefix(listing, m=5, now=NOW, grace_s=GRACE_S)
    assert epochs_of(scan.deletable) == [1, 2, 3, 5, 5]
    assert scan.deletable == listing[:5]
    assert scan.above_m == 1
    assert scan.listed == 6  # the first epoch above M is the last key looked at
    assert scan.stopped
    assert scan.too_young == 0
    assert scan.malformed == []


def test_scan_stops_consuming_the_listing_at_the_first_epoch_above_m() -> None:
    consumed: list[int] = []

    def listing() -> Iterator[Listed]:
        for i, epoch in enumerate([2, 4, 7]):
            consumed.append(epoch)
            yield l0(epoch, i)
        raise AssertionError("the scan listed past the first epoch above M")

    scan = scan_prefix(listing(), m=4, now=NOW, grace_s=GRACE_S)
    assert consumed == [2, 4, 7]
    assert epochs_of(scan.deletable) == [2, 4]
    assert scan.stopped


def test_scan_with_no_m_deletes_nothing() -> None:
    listing = [l0(1, 0), l0(2, 1)]
    scan = scan_prefix(iter(listing), m=None, now=NOW, grace_s=GRACE_S)
    assert scan.deletable == []
    assert scan.listed == 1
    assert scan.stopped


def test_scan_skips_objects_inside_the_grace_period() -> None:
    listing = [
        l0(1, 0, age_s=3600),
        l0(2, 1, age_s=5),  # young
        l0(2, 2, age_s=30),  # young, and the oldest of the young
        l0(3, 3, age_s=GRACE_S),  # exactly the grace period: old enough
        l0(3, 4, age_s=10),  # young
    ]
    scan = scan_prefix(listing, m=3, now=NOW, grace_s=GRACE_S)
    assert scan.deletable == [listing[0], listing[3]]
    assert scan.too_young == 3
    assert scan.oldest_young_at == NOW - 30
    assert not scan.stopped  # young objects do not end the prefix
    assert scan.listed == 5


def test_malformed_keys_are_never_deletable() -> None:
    good = l0(1, 0)
    uuid = "0af1" * 8  # has hex letters, so upper() changes it
    malformed = [
        "level_zero/data/042/000000000000000001/" + uuid.upper(),
        "level_zero/data/042/000000000000000000/" + uuid,  # epoch 0
        "level_zero/data/042/1/" + uuid,
        "level_zero/data/042/000000000000000001/" + uuid + "/extra",
        "level_zero/data/042/000000000000000001/" + uuid + ".tmp",
        "level_zero/data/042/000000000000000001/" + uuid + "\n",
    ]
    listing = [Listed(k) for k in malformed[:3]] + [good] + [Listed(k) for k in malformed[3:]]
    scan = scan_prefix(listing, m=10**17, now=NOW, grace_s=GRACE_S)
    assert scan.deletable == [good]
    assert scan.malformed == malformed
    assert scan.listed == 7
    assert not scan.stopped


def test_feed_after_stop_is_a_bug() -> None:
    scan = PrefixScan()
    assert scan.feed(l0(9), 3, NOW, GRACE_S) is False
    with pytest.raises(AssertionError):
        scan.feed(l0(10), 3, NOW, GRACE_S)


# ---------------------------------------------------------------- batches and sharding


def test_delete_batches_hold_at_most_1000_keys() -> None:
    assert DELETE_BATCH_KEYS_MAX == 1000
    keys = [f"k{i}" for i in range(2500)]
    split = batches(keys)
    assert [len(b) for b in split] == [1000, 1000, 500]
    assert [k for b in split for k in b] == keys
    assert batches([]) == []
    assert [len(b) for b in batches(keys[:7], size=3)] == [3, 3, 1]
    assert [len(b) for b in batches(keys[:1000])] == [1000]
    with pytest.raises(AssertionError):
        batches(keys, size=1001)
    with pytest.raises(AssertionError):
        batches(keys, size=0)


@pytest.mark.parametrize("count", [1, 2, 3, 7, 10, 64, 333, 999, 1000])
def test_worker_prefixes_partition_0_to_999_disjointly_and_completely(count: int) -> None:
    shares = [worker_prefixes(i, count) for i in range(count)]
    flat = [p for share in shares for p in share]
    assert flat == list(range(1000))  # complete, disjoint, in order
    sizes = [len(share) for share in shares]
    assert min(sizes) >= 1
    assert max(sizes) - min(sizes) <= 1


def test_worker_prefixes_rejects_bad_arguments() -> None:
    with pytest.raises(AssertionError):
        worker_prefixes(3, 3)
    with pytest.raises(AssertionError):
        worker_prefixes(-1, 3)
    with pytest.raises(AssertionError):
        worker_prefixes(0, 1001)
    assert list(worker_prefixes(1, 2, prefix_count=10)) == [5, 6, 7, 8, 9]
