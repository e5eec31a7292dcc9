"""`levelzero demo` end to end (short), and the status table the CLI prints."""

from __future__ import annotations

import io
from pathlib import Path

from levelzero.daemon.cli import format_status
from levelzero.daemon.demo import run_demo
from levelzero.daemon.schema import BatcherStatus, PartitionStatus, StatusResponse


async def test_demo_verifies_every_produced_record(tmp_path: Path) -> None:
    out = io.StringIO()
    summary = await run_demo(duration_s=3, data_dir=str(tmp_path / "demo"), producers=4, seed=7, out=out)
    assert summary.ok, out.getvalue()
    assert summary.produced > 0 and summary.verified == summary.produced
    assert summary.mismatched == summary.missing == 0
    assert summary.epoch_last > summary.epoch_first
    assert summary.window_slides > 0 and summary.objects > 0
    # The too-old in-flight write was rejected once and retried; its first object is an orphan.
    assert summary.stale_rejections >= 1 and summary.stale_retries >= 1 and summary.orphan_objects >= 1
    assert [s.name for s in summary.scenarios] == ["in-flight old epoch", "too-old in-flight write"]
    assert all(s.passed for s in summary.scenarios)
    text = out.getvalue()
    assert f"records verified          {summary.verified} byte for byte" in text
    assert "result                    OK" in text
    assert (tmp_path / "demo" / "levelzero.db").exists()  # a given data dir is kept


def test_status_table_is_readable() -> None:
    partition = PartitionStatus(
        topic="orders", partition=3, term=2, window=(4, 5), previous_applied_epoch=4,
        max_applied_epoch=5, min_epoch_lower_bound=4, mp=3, lro=9, lrlo=12, high_watermark=10,
        start_offset=0, size_bytes=100, readers=0, pending_records=0, read_units=0,
        window_slides=2, stale_rejections=1, last_rejected_gap=1, new_epoch_fences=2,
        same_epoch_fences=7,
    )
    status = StatusResponse(
        cluster_epoch=6, cached_epoch=5, m=3, m_holders=["orders/3"], m_blocked_by=[],
        m_blocked_count=0, accepting=True, partitions=[partition],
        batcher=BatcherStatus(objects_uploaded=4, bytes_uploaded=1000, records_appended=10,
                              stale_rejections=1, stale_retries=1, stale_failures=0,
                              orphan_objects=1, inflight_bytes=0),
    )
    lines = format_status(status).splitlines()
    assert lines[0] == "cluster epoch 6 (cached 5)   M 3 (held by orders/3)   accepting yes"
    assert lines[3].split() == ["PARTITION", "TERM", "WINDOW", "APPLIED", "LOWER", "M(p)", "LRO", "HWM", "START", "SLIDES", "STALE"]
    assert lines[4].split() == ["orders/3", "2", "[4,5]", "[4,5]", "4", "3", "9", "10", "0", "2", "1"]
