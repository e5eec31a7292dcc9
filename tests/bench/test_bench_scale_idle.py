"""The idle side of the scale item: a child creates partitions, another replays them."""

from __future__ import annotations

from pathlib import Path

import anyio

from levelzero.bench import scale_idle


def test_child_replays_every_partition_and_reports_its_rss(tmp_path: Path) -> None:
    async def main() -> tuple[dict, dict]:
        await scale_idle.child("--dir", str(tmp_path / "many"), "--create", "40")
        full = await scale_idle.child("--dir", str(tmp_path / "many"), "--settle-s", "1.5")
        bare = await scale_idle.child("--dir", str(tmp_path / "empty"), "--settle-s", "1.5")
        assert full is not None and bare is not None
        return full, bare

    full, bare = anyio.run(main)
    assert full["partitions"] == 40 and bare["partitions"] == 0
    assert 0 < full["startup_s"] < 60
    # Both report their RSS. 40 idle partitions are ~0.3 MiB, within the RSS noise between two
    # processes (a CI run saw the 40-partition child 32 KiB below the bare one): the figure per
    # partition is the bench item's, at 10,000 partitions, not this smoke test's.
    assert full["rss_bytes"] > 0 and bare["rss_bytes"] > 0
    # The first rounds after a start visit every partition (start-up collection, new term).
    assert full["reconciler_visited"] >= 40 and full["housekeeper_tended"] >= 40
