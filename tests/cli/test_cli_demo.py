"""`levelzero demo` end to end (short, ending with zero L0 objects), and the status the CLI prints."""

from __future__ import annotations

import io
from pathlib import Path

import anyio
import msgspec

from levelzero.cli.formats import format_status
from levelzero.cli.demo import EpochBumper, run_demo
from levelzero.http.schema import (
    BatcherStatus,
    GcStatus,
    HousekeeperStatus,
    PartitionStatus,
    L0CacheStatus,
    ReconcilerStatus,
    StatusResponse,
)


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
    # Quiescence: everything reconciled, every L0 object (the orphan too) collected, and every
    # record still readable, now from L1.
    assert summary.l0_left == 0 and summary.gc_deleted == summary.objects > 0
    assert 1 <= summary.quiesce_rounds <= 20
    assert summary.reconciled_offsets == summary.written_offsets >= summary.produced
    assert summary.l1_objects > 0 and summary.gc_max_deleted_epoch is not None
    assert summary.after_gc.verified == summary.produced and summary.after_gc.tiers == {
        "l1": summary.produced
    }
    assert summary.after_gc.mismatched == summary.after_gc.missing == 0
    ms = [s.m for s in summary.samples if s.m is not None]
    assert ms and ms == sorted(ms) and ms[-1] == summary.m  # M never decreases
    text = out.getvalue()
    assert f"records verified          {summary.verified} byte for byte" in text
    assert "L0 objects left: 0\n" in text and "L0 objects left           0\n" in text
    assert f"verified after GC         {summary.produced} byte for byte ({summary.produced} from L1)" in text
    assert "M/deleted over time" in text
    assert "result                    OK" in text
    assert (tmp_path / "demo" / "levelzero.db").exists()  # a given data dir is kept


def test_status_table_is_readable() -> None:
    partition = PartitionStatus(
        topic="orders",
        partition=3,
        term=2,
        window=(4, 5),
        previous_applied_epoch=4,
        max_applied_epoch=5,
        min_epoch_lower_bound=4,
        mp=3,
        lro=9,
        lrlo=12,
        high_watermark=10,
        start_offset=0,
        size_bytes=100,
        readers=0,
        pending_records=0,
        read_units=0,
        window_slides=2,
        stale_rejections=1,
        last_rejected_gap=1,
        new_epoch_fences=2,
        same_epoch_fences=7,
    )
    status = StatusResponse(
        cluster_epoch=6,
        cached_epoch=5,
        m=3,
        m_holders=["orders/3"],
        m_blocked_by=[],
        m_blocked_count=0,
        accepting=True,
        partitions=[partition],
        batcher=BatcherStatus(
            objects_uploaded=4,
            bytes_uploaded=1000,
            records_appended=10,
            stale_rejections=1,
            stale_retries=1,
            stale_failures=0,
            orphan_objects=1,
            inflight_bytes=0,
        ),
    )
    lines = format_status(status).splitlines()
    assert lines[0] == "cluster epoch 6 (cached 5)   M 3 (held by orders/3)   accepting yes"
    # the batcher's counters since the daemon started, not the L0 objects in the store
    assert lines[1] == (
        "since start: L0 objects uploaded 4 (1000 bytes), orphans 1, stale rejections 1, retries 1, "
        "failures 0"
    )
    assert lines[3].split() == [
        "PARTITION",
        "TERM",
        "WINDOW",
        "APPLIED",
        "LOWER",
        "M(p)",
        "LRO",
        "HWM",
        "LAG",
        "L1",
        "START",
        "SLIDES",
        "STALE",
    ]
    assert lines[4].split() == [
        "orders/3",
        "2",
        "[4,5]",
        "[4,5]",
        "4",
        "3",
        "9",
        "10",
        "0",
        "0",
        "0",
        "2",
        "1",
    ]
    # L1 objects the node could not read (none cached, the metastore failing): unknown, not 0
    unknown = msgspec.structs.replace(partition, l1_objects=None, l1_lineage=None)
    line = format_status(msgspec.structs.replace(status, partitions=[unknown])).splitlines()[4]
    assert line.split()[8:11] == ["0", "?", "0"]

    with_components = msgspec.structs.replace(
        status,
        reconciler=ReconcilerStatus(
            rounds=3,
            objects_written=2,
            bytes_written=2 * 1024 * 1024,
            records_reconciled=10,
            catch_ups_rejected=0,
            errors=0,
            lag_offsets=0,
        ),
        l0_cache=L0CacheStatus(
            bytes_max=64 * 1024 * 1024,
            held_bytes=3 * 1024 * 1024,
            inflight_bytes=0,
            objects=12,
            hits=70,
            shared=20,
            loads=8,
            uncached_gets=2,
            evictions=1,
            released=30,
            hit_ratio=0.9,
        ),
        housekeeper=HousekeeperStatus(
            rounds=3, epochs_advanced=4, catch_ups=2, start_offsets_set=0, l1_deleted=0, errors=0
        ),
        gc=GcStatus(
            paused=True,
            m=3,
            epoch_lag=3,
            rounds=5,
            dry_runs=1,
            failed_rounds=0,
            safety_blocked_rounds=0,
            objects_deleted=4,
            bytes_deleted=1024 * 1024,
            max_deleted_epoch=3,
            backlog=0,
            next_round_in_s=None,
            pace_reason=None,
            last_round=None,
        ),
    )
    lines = format_status(with_components).splitlines()
    assert lines[2] == (
        "reconciler: 2 L1 objects (2.0 MiB), 10 records, lag 0 offsets, rejected catch-ups 0, errors 0"
    )
    assert lines[3] == (
        "L0 cache: 12 objects (3.0 MiB of 64.0 MiB), extents without a GET of their own 90 (90%), "
        "object GETs 8, extent GETs 2, evictions 1, released (collected) 30"
    )
    assert with_components.l0_cache is not None
    thrashing = msgspec.structs.replace(with_components.l0_cache, load_every=4)
    line = format_status(msgspec.structs.replace(with_components, l0_cache=thrashing)).splitlines()[3]
    assert line.endswith("released (collected) 30, thrashing: one miss in 4 loads its object"), line
    assert (
        lines[4] == "housekeeper: epochs advanced 4, catch-ups 2, start offsets set 0, L1 deleted 0, errors 0"
    )
    assert lines[5] == "GC: PAUSED, M 3 (epoch lag 3), 5 rounds, deleted 4 objects (1.0 MiB), backlog 0"
    assert lines[7].split()[0] == "PARTITION"


class _SlowAdvances:
    """A client whose epoch advances take a while; counts those started and those finished."""

    def __init__(self) -> None:
        self.started = 0
        self.finished = 0
        self.in_flight = anyio.Event()

    async def advance_epoch(self) -> int:
        self.started += 1
        self.in_flight.set()
        await anyio.sleep(0.05)
        self.finished += 1
        return self.finished


async def test_stopping_the_epoch_bumper_waits_out_an_advance_in_flight() -> None:
    # An advance cancelled on the client side can still land on the server afterwards and move
    # the epoch under the in-flight scenarios (CI: "window [6, 7], attempts 2"): stop() waits.
    client = _SlowAdvances()
    bumper = EpochBumper(client, 0.001)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        await tg.start(bumper.run)
        await client.in_flight.wait()
        await bumper.stop()
        assert client.started == client.finished == bumper.advances == 1
    assert client.started == client.finished  # nothing started after stop()


def _status_held_by(holders: list[str], count: int) -> StatusResponse:
    return StatusResponse(
        cluster_epoch=6,
        cached_epoch=5,
        m=2,
        m_holders=holders,
        m_blocked_by=[],
        m_blocked_count=0,
        accepting=True,
        partitions=[],
        batcher=BatcherStatus(
            objects_uploaded=0,
            bytes_uploaded=0,
            records_appended=0,
            stale_rejections=0,
            stale_retries=0,
            stale_failures=0,
            orphan_objects=0,
            inflight_bytes=0,
        ),
        m_holders_count=count,
    )


def test_status_says_how_many_holders_of_m_it_left_out() -> None:
    four = ["audit/0", "orders/0", "orders/1", "orders/2"]
    line = format_status(_status_held_by(four, 4)).splitlines()[0]
    assert "M 2 (held by audit/0, orders/0, orders/1 and 1 more)   accepting yes" in line
    line = format_status(_status_held_by(four, 25)).splitlines()[0]  # the server lists the first 20
    assert "(held by audit/0, orders/0, orders/1 and 22 more)" in line
    line = format_status(_status_held_by(four[:3], 3)).splitlines()[0]
    assert "(held by audit/0, orders/0, orders/1)   accepting" in line
