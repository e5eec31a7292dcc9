"""GC selection (sans-IO): the cluster watermark M, the per-prefix scan, batching, sharding."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from levelzero.core.errors import InvariantViolation, MalformedKey
from levelzero.core.gc import (
    DELETE_BATCH_KEYS_MAX,
    MonotoneWatermark,
    Verdict,
    WatermarkDecision,
    batches,
    classify,
    compute_cluster_watermark,
    worker_prefixes,
)
from levelzero.core.keys import format_l0_key, new_uuid, parse_l0_key

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


# ---------------------------------------------------------------- keys the GC never deletes


def test_malformed_keys_are_never_deletable() -> None:
    """The scans (`RangeScan`, tests/actors/test_gc_pure.py) delete only keys that parse: none of
    these does, so none is ever deletable whatever M is."""
    uuid = "0af1" * 8  # has hex letters, so upper() changes it
    malformed = [
        "level_zero/data/042/000000000000000001/" + uuid.upper(),
        "level_zero/data/042/000000000000000000/" + uuid,  # epoch 0
        "level_zero/data/042/1/" + uuid,
        "level_zero/data/042/000000000000000001/" + uuid + "/extra",
        "level_zero/data/042/000000000000000001/" + uuid + ".tmp",
        "level_zero/data/042/000000000000000001/" + uuid + "\n",
    ]
    assert parse_l0_key(l0(1, 0).key).epoch == 1
    for key in malformed:
        with pytest.raises(MalformedKey, match="L0 key"):
            parse_l0_key(key)


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
