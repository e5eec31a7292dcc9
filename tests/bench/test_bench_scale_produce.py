"""The produce side of the scale item: how producers pick partitions (evenly: every partition
in turn; skewed: 1% of them take 90% of the writes), and a short real run over more partitions
than one topic holds."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from levelzero.bench import scale


def test_spread_evenly_every_partition_takes_writes_in_turn() -> None:
    partitions = 3000
    picks = Counter()
    for i in range(scale.PRODUCERS):
        pick = scale._partition_picker(i, partitions, skewed=False)
        picks.update(pick() for _ in range(6))
    assert set(picks) == set(range(partitions))  # 1024 producers x 6 calls cover 3000
    assert max(picks.values()) - min(picks.values()) <= 2


def test_skewed_one_percent_of_partitions_take_ninety_percent_of_writes() -> None:
    partitions = 10_000
    hot = int(partitions * scale.SKEW_HOT_SHARE)
    picks = [scale._partition_picker(i, partitions, skewed=True)() for i in range(20_000)]
    to_hot = sum(1 for g in picks if g < hot) / len(picks)
    assert 0.88 < to_hot < 0.92
    assert all(0 <= g < partitions for g in picks)
    assert len({g for g in picks if g >= hot}) > 1000  # the cold ones are spread


async def test_a_produce_run_spans_topics_when_partitions_exceed_one_topic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scale, "PARTITIONS_PER_TOPIC_MAX", 4)
    monkeypatch.setattr(scale, "PRODUCERS", 8)
    run = await scale.produce_for(0.3, 10, tmp_path, "t")
    assert run.partitions == 10 and not run.skewed
    assert run.records_per_s > 0 and run.extents_per_object >= 1
    skewed = await scale.produce_for(0.3, 10, tmp_path, "s", skewed=True)
    assert skewed.skewed and skewed.records_per_s > 0
