"""The cost item: its price parameters, its floor and dollars arithmetic, and a quick run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from levelzero.actors.batcher import BatcherConfig
from levelzero.bench import main
from levelzero.bench.cost import PerGib, S3Prices, monthly_dollars, window_floor_puts_per_gib
from levelzero.core.errors import InvalidInput
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.testing.latency_store import Latency, LatencyObjectStore


def test_prices_default_to_s3_standard_and_are_overridden_by_name() -> None:
    assert (S3Prices().put_per_1000, S3Prices().get_per_1000, S3Prices().storage_per_gb_month) == (
        0.005,
        0.0004,
        0.023,
    )
    prices = S3Prices.parse("put_per_1000=0.0025, retention_days=1")
    assert (prices.put_per_1000, prices.retention_days, prices.get_per_1000) == (0.0025, 1.0, 0.0004)
    with pytest.raises(InvalidInput, match="expected name=value"):
        S3Prices.parse("puts=1")
    with pytest.raises(InvalidInput, match="must be >= 0"):
        S3Prices.parse("get_per_1000=-1")


def test_the_window_floor_is_one_put_per_linger_or_per_object_size() -> None:
    batcher = BatcherConfig()  # 250 ms, 4 MiB
    assert window_floor_puts_per_gib(1.0, batcher) == 4096  # 1,024 s per GiB, 4 windows a second
    assert window_floor_puts_per_gib(10.0, batcher) == pytest.approx(409.6)
    assert window_floor_puts_per_gib(100.0, batcher) == 256  # 25 MiB a window: 4 MiB objects


def test_monthly_dollars_of_the_floor_at_one_mib_per_second() -> None:
    per_gib = PerGib(4096, 0, 0, 0, 0, 0, 0)
    requests, storage = monthly_dollars(per_gib, 1.0, S3Prices())
    # 4 PUTs a second for 30 days at $0.005 per 1,000; 7 days of 1 MiB/s at $0.023 per GB-month.
    assert requests == pytest.approx(4 * 86_400 * 30 * 0.005 / 1000)
    assert storage == pytest.approx(7 * 86_400 / 1024 * 0.023)


def test_quick_cost_counts_requests_at_the_object_store(tmp_path: Path) -> None:
    results_path = tmp_path / "results.json"
    assert main(["--quick", "--only", "cost", "--out", str(results_path)]) == 0
    figures = json.loads(results_path.read_text())["items"]["cost"]["figures"]
    l0 = figures[0]
    # The floor at the rate acknowledged (a loaded machine may fall behind the 1 MiB/s offered).
    # Records count by the tick that offered them, so no warm-up produce still in its batch
    # window when the window opens adds to it: it never exceeds the rate offered.
    acknowledged = l0["notes"]["acknowledged_mib_per_s"]
    assert l0["name"].startswith("L0 PUTs per GiB") and 0 < acknowledged <= 1.0
    assert l0["floor"] == pytest.approx(window_floor_puts_per_gib(acknowledged, BatcherConfig()), rel=0.01)
    counts = l0["notes"]["window_counts"]
    assert counts["l0_puts"] >= 1
    # The run (warm-up and window) PUT at least the window's payload: the window's last records
    # may be PUT after it ends, but the warm-up's records, offered for 2 s before it, were PUT in
    # the run. payload_mib is rounded to 0.1 MiB: the bytes PUT are at least the payload, less
    # that rounding.
    run = l0["notes"]["run_counts"]
    assert run["l0_put_bytes"] >= (l0["notes"]["payload_mib"] - 0.05) * 2**20
    readers = l0["notes"]["reader_counts"]
    assert readers["l0_puts"] == readers["l1_puts"] == 0 and readers["l0_gets"] + readers["l1_gets"] >= 1
    assert l0["notes"]["dollars_per_month_requests"] > 0


async def test_latency_store_draws_each_put_delay_from_its_range() -> None:

    store = LatencyObjectStore(
        MemoryObjectStore(), Latency("tiny", put_ms=(1.0, 2.0), get_ms=(0.0, 0.5)), seed=4
    )
    for i in range(5):
        await store.put(f"k{i}", b"v")
    assert await store.get("k3") == b"v"
    assert len(store.put_delays_s) == 5
    assert all(0.001 <= d <= 0.002 for d in store.put_delays_s)
    assert len(set(store.put_delays_s)) == 5  # drawn, not fixed


def test_quick_latency_and_cli_items_report_against_their_floors(tmp_path: Path) -> None:
    results_path = tmp_path / "results.json"
    assert main(["--quick", "--only", "latency,cli", "--out", str(results_path)]) == 0
    items = json.loads(results_path.read_text())["items"]
    latency = items["latency"]["figures"]
    assert [f["name"].split(",")[0] for f in latency[:2]] == ["produce latency p99", "produce latency p50"]
    p99 = latency[0]
    # The floor: the 250 ms window plus a PUT of 20-80 ms plus a commit.
    assert p99["floor"] >= 270 and p99["sut"] > 0 and p99["target"]["bound"] == 1.25
    cli = items["cli"]["figures"]
    assert cli[0]["floor"] == 30_000 and cli[0]["sut"] > 0 and cli[1]["floor"] > 0
