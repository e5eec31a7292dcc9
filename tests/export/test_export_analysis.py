"""Export and analysis end to end: a real Node on SQLite and a local object store produces the
data (with epoch bumps, reconciliation, housekeeping and GC rounds at controlled wall-clock
times), the export copies it to Parquet incrementally, and the Spark analysis must find what the
scenario knows independently (objects, bytes, deletes, GC lags, rejections, records).

One scenario and one SparkSession per module keep the runtime down. Input validation, export
errors and the Java check run without Spark.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import random
import shutil
import sqlite3
import stat
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from levelzero.actors.batcher import BatcherConfig
from levelzero.actors.gc import GcActor, GcConfig
from levelzero.actors.housekeeper import HousekeeperConfig
from levelzero.actors.node import Node, NodeConfig
from levelzero.actors.reconciler import ReconcilerConfig
from levelzero.core.entries import AdvanceEpoch
from levelzero.core.errors import StaleClusterEpoch
from levelzero.core.keys import L0_ROOT, parse_l0_key
from levelzero.core.l0format import Record
from levelzero.export import (
    SCHEMAS,
    TABLES,
    AnalysisError,
    AnalysisReport,
    ExportError,
    ExportProgress,
    ExportReport,
    JavaNotFound,
    analyze,
    analyze_main,
    db_path_in,
    export,
    export_main,
)
from levelzero.export.export import LOCK_NAME
from levelzero.export.inputs import check_java, load_inputs
from levelzero.export.manifest import MANIFEST_NAME
from levelzero.export.schemas import render_markdown
from levelzero.storage.local_store import LocalObjectStore
from levelzero.storage.protocols import (
    FenceEventRow,
    GcRoundRow,
    L0ObjectRow,
    L1Row,
    L1State,
    iter_objects,
)
from levelzero.storage.sqlite import SqliteLogStore

DAY_S = 86_400
SQL_RESERVED = {
    "at",
    "timestamp",
    "date",
    "time",
    "order",
    "group",
    "select",
    "from",
    "user",
    "value",
    "values",
    "table",
    "default",
    "offset",
    "limit",
    "range",
    "interval",
}
BUCKET_S = 10.0


class WallClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def scenario_start() -> float:
    """Two minutes before a UTC midnight at least a day ahead: the data spans two dates, and
    every object file (stamped with the real time) is older than the GC's clock says now."""
    return (math.floor(time.time() / DAY_S) + 2) * DAY_S - 120.0


def nearest_rank(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p * len(ordered))) - 1]


@dataclass
class Scenario:
    data_dir: str
    db_path: str
    out: str  # exported incrementally: once while running, once after, once with nothing new
    out_full: str  # one export of the stopped store
    start: float
    created_at: dict[str, float] = field(default_factory=dict)  # L0 key -> upload time
    sizes: dict[str, int] = field(default_factory=dict)  # L0 key -> bytes in the object store
    deleted_at: dict[str, float] = field(default_factory=dict)  # L0 key -> GC delete time
    rounds: list[tuple[float, int | None, bool]] = field(default_factory=list)  # started, M, dry
    records: int = 0
    stale_rejections: int = 0
    unreconciled_peak: int = 0
    exports: list[ExportReport] = field(default_factory=list)
    cli_exit: int | None = None
    db_rows: dict[str, int] = field(default_factory=dict)

    def expected_lags(self) -> list[float]:
        lags = []
        for key, deleted_at in self.deleted_at.items():
            epoch = parse_l0_key(key).epoch
            reached = min(t for t, m, _ in self.rounds if m is not None and m >= epoch)
            lags.append(deleted_at - max(self.created_at[key], reached))
        return lags


def node_config() -> NodeConfig:
    return NodeConfig(
        epoch_bump_interval_s=None,
        epoch_cache_ttl_s=0.0,
        batcher=BatcherConfig(linger_ms=1),
        reconciler=ReconcilerConfig(enabled=False, object_age_max_s=0.0),  # an L1 object every pass
        housekeeper=HousekeeperConfig(enabled=False, idle_after_s=0.0),
    )


async def run_scenario(s: Scenario) -> None:
    wall = WallClock(s.start)
    objects = LocalObjectStore(os.path.join(s.data_dir, "objects"), fsync=False)
    async with await SqliteLogStore.open(s.db_path, synchronous="NORMAL", clock=wall) as store:
        node = Node(node_config(), store, objects, rng=random.Random(11), wall_clock=wall)
        gc = GcActor(
            GcConfig(grace_s=0.0),
            objects,
            store,
            cluster_epoch=lambda: node.epochs.current,
            board=node.board,
            views=node.views,
            clock=wall,
            rng=random.Random(3),
        )

        async def produce(topic: str, partition: int, size: int) -> None:
            result = await node.produce(topic, partition, [Record(None, b"v" * size)])
            s.created_at[result.object_key] = wall.now
            s.records += 1
            wall.now += 1

        async def advance_epoch() -> None:
            await node.epochs.advance()
            node.epoch_cache.invalidate()

        async def l0_sizes() -> dict[str, int]:
            return {o.key: o.size async for o in iter_objects(objects, L0_ROOT)}

        async def gc_round(*, dry_run: bool = False) -> None:
            before = await l0_sizes()
            s.sizes.update(before)
            report = await gc.run_round(dry_run=dry_run)
            s.rounds.append((report.started_at, report.m, dry_run))
            gone = before.keys() - (await l0_sizes()).keys()
            assert report.deleted == len(gone) and (not dry_run or not gone)
            for key in gone:
                s.deleted_at[key] = wall.now  # the GC's clock does not move inside a round

        async with anyio.create_task_group() as tg:
            await tg.start(node.run)
            await node.create_topic("orders", 3)
            await node.create_topic("audit", 1)
            orders = [node.partition("orders", p) for p in range(3)]
            audit = node.partition("audit", 0)

            # Phase 1: epochs 1..3, reconciled and housekept after each, so M reaches 2.
            for r in range(3):
                for p in range(3):
                    await produce("orders", p, 40 + 10 * p + r)
                if r == 0:
                    await produce("audit", 0, 25)
                await advance_epoch()
                await node.reconciler.run_round()
                await node.housekeeper.run_round(force=True)
                wall.now += 2
            with pytest.raises(StaleClusterEpoch):
                await orders[0].write(AdvanceEpoch(1))
            s.stale_rejections += 1
            await gc_round(dry_run=True)  # epochs 1, 2 eligible now ...
            wall.now += 50
            await gc_round()  # ... and deleted 50 s later

            s.exports.append(await anyio.to_thread.run_sync(export, s.db_path, s.out))

            # Phase 2: epoch 4 data, unreconciled for a while; audit/0 alone holds M back.
            wall.now += 100
            for p in range(3):
                for _ in range(2):
                    await produce("orders", p, 30)
            assert await node.housekeeper.sample_states() == 3
            s.unreconciled_peak = 6
            wall.now += 30
            await advance_epoch()
            await node.reconciler.run_round()
            for actor in orders:
                await node.housekeeper.tend(actor, force=True)
            await node.housekeeper.sample_states()
            await gc_round(dry_run=True)  # M stays 2: audit/0 is behind
            wall.now += 40
            await node.housekeeper.tend(audit, force=True)
            await node.housekeeper.sample_states()
            await gc_round(dry_run=True)  # epoch 3 eligible now ...
            wall.now += 30
            await gc_round()  # ... and deleted 30 s later

            # Phase 3: M passes epoch 4 and the GC deletes it in the same round (lag 0).
            wall.now += 10
            await advance_epoch()
            await node.housekeeper.run_round(force=True)
            await gc_round()
            await produce("orders", 1, 33)  # stays live
            s.sizes.update(await l0_sizes())
            await node.shutdown()

    with sqlite3.connect(f"file:{s.db_path}?mode=ro", uri=True) as db:
        for table in ("log", "state_samples", "fence_events", "l0_objects", "gc_rounds", "l1_objects"):
            s.db_rows[table] = db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]  # noqa: S608 (constant names)
        s.db_rows["l0_deletions"] = db.execute(
            "SELECT COUNT(*) FROM l0_objects WHERE deleted_at IS NOT NULL"
        ).fetchone()[0]
        s.db_rows["placeholder_bytes"] = db.execute(
            "SELECT SUM(byte_length) FROM log WHERE kind = 'placeholder'"
        ).fetchone()[0]
        s.db_rows["fence_decisions"] = db.execute("SELECT SUM(decisions) FROM fence_events").fetchone()[0]
    db.close()


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    base = tmp_path_factory.mktemp("scenario")
    data_dir = base / "data"
    data_dir.mkdir()
    s = Scenario(
        data_dir=str(data_dir),
        db_path=db_path_in(data_dir),
        out=str(base / "export"),
        out_full=str(base / "export-full"),
        start=scenario_start(),
    )
    anyio.run(run_scenario, s)
    s.cli_exit = export_main(["--data-dir", s.data_dir, "--out", s.out, "--quiet"])
    s.exports.append(export(s.db_path, s.out))  # nothing new
    export(s.db_path, s.out_full)
    return s


@pytest.fixture(scope="module")
def spark():
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("levelzero-export-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def analysis(scenario: Scenario, spark, tmp_path_factory: pytest.TempPathFactory) -> AnalysisReport:
    out = tmp_path_factory.mktemp("report")
    return analyze([scenario.out], str(out), master="local[2]", bucket_s=BUCKET_S)


def db_table(table: str) -> str:
    """The store's table (or count) an exported table's rows come from."""
    return "log" if table == "log_entries" else table


def read_table(out: str, table: str) -> pa.Table:
    """An exported table, its TIMESTAMP columns as unix seconds (what the store recorded)."""
    path = os.path.join(out, table)
    if not os.path.isdir(path):
        data = SCHEMAS[table].empty_table()
    else:
        data = ds.dataset(path, format="parquet", schema=SCHEMAS[table]).to_table()
    for index, column in enumerate(data.schema):
        if pa.types.is_timestamp(column.type):
            micros = data.column(index).cast(pa.int64()).to_pylist()
            seconds = pa.array([None if m is None else m / 1e6 for m in micros], pa.float64())
            data = data.set_column(index, column.name, seconds)
    return data


# ------------------------------------------------------------------------ export


def test_scenario_exercised_every_table(scenario: Scenario) -> None:
    assert len(scenario.created_at) == 17
    assert len(scenario.deleted_at) == 16
    assert sorted(scenario.expected_lags()) == [0.0] * 6 + [30.0] * 3 + [50.0] * 7
    assert all(count > 0 for count in scenario.db_rows.values()), scenario.db_rows


def test_export_while_the_store_is_open_then_after_adds_exactly_the_new_rows(
    scenario: Scenario,
) -> None:
    """The first export ran beside the running node; the CLI export of the stopped data
    directory added the rest; together they hold every row of the store exactly once."""
    first, third = scenario.exports
    assert scenario.cli_exit == 0
    history = json.loads(Path(scenario.out, MANIFEST_NAME).read_text())["exports"]
    added = [sum(e["rows"].values()) for e in history]
    assert added[0] == first.total_rows > 0
    assert added[1] > 0
    assert added[2] == third.total_rows == 0 and third.files == []
    for table in TABLES:
        exported = read_table(scenario.out, table)
        assert exported.num_rows == scenario.db_rows[db_table(table)], table
        keys = [tuple(k.values()) for k in exported.select(list(TABLES[table].key)).to_pylist()]
        assert len(set(keys)) == len(keys), f"{table} holds a row twice"
    assert sum(added) == sum(scenario.db_rows[db_table(table)] for table in TABLES)


def utc_date(t: float | datetime) -> str:
    moment = t if isinstance(t, datetime) else datetime.fromtimestamp(t, UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d")


def test_rows_are_partitioned_by_utc_date_of_their_time_column(scenario: Scenario) -> None:
    dates = {entry.name for entry in os.scandir(os.path.join(scenario.out, "log_entries"))}
    assert dates == {f"date={utc_date(scenario.start)}", f"date={utc_date(scenario.start + 200)}"}
    for date_dir in dates:
        table = pq.read_table(os.path.join(scenario.out, "log_entries", date_dir))
        assert {utc_date(t) for t in table.column("appended_at").to_pylist()} == {date_dir[5:]}


def test_exported_l0_objects_match_the_object_store(scenario: Scenario) -> None:
    created = read_table(scenario.out, "l0_objects").to_pylist()
    assert {r["key"]: r["size"] for r in created} == scenario.sizes
    for row in created:
        assert row["created_at"] == scenario.created_at[row["key"]]
        assert row["epoch"] == parse_l0_key(row["key"]).epoch
    deleted = read_table(scenario.out, "l0_deletions").to_pylist()
    assert {r["key"]: r["deleted_at"] for r in deleted} == scenario.deleted_at


def gc_round(round_id: int, *, started_at: float, m: int) -> GcRoundRow:
    return GcRoundRow(round_id, started_at, started_at + 1, m + 1, m, False, 4, 0, 0, 0, 0, 0, None)


def rows_of(report: ExportReport, *tables: str) -> tuple[int, ...]:
    return tuple(report.rows[table] for table in tables)


async def prune_between_two_exports(
    open_store: Any, source: str, out: str
) -> tuple[ExportReport, ExportReport]:
    """Two fence events and a live L0 object (created 50) exported; then four more events (at
    300..600), an L0 object created (300) and deleted (350), a live one (600), the first one
    deleted (350), and a pruning of what is older than 450 before the second export: two
    events, the second object's row and the first one's deletion were never exported."""
    async with await open_store() as store:
        (row,) = await store.create_topic("t", 1, 1, 0.0)
        await store.record_fence_events(
            [FenceEventRow(at, row.pid, 1, 1, "admitted", 1, 1) for at in (100.0, 200.0)]
        )
        await store.record_l0_object(L0ObjectRow("old", 1, 10, 50.0, 1))
    first = await anyio.to_thread.run_sync(export, source, out)
    async with await open_store() as store:
        await store.record_fence_events(
            [FenceEventRow(at, row.pid, 1, 1, "admitted", 1, 1) for at in (300.0, 400.0, 500.0, 600.0)]
        )
        await store.record_l0_object(L0ObjectRow("gone", 1, 10, 300.0, 1))
        await store.record_l0_object(L0ObjectRow("live", 1, 10, 600.0, 1))
        await store.mark_l0_deleted(["gone", "old"], at=350.0, m=1)
    async with await open_store() as store:
        assert await store.prune_history(450.0, 100) == 4 + 2  # events 100..400, the deleted rows
    second = await anyio.to_thread.run_sync(export, source, out)
    return first, second


async def test_rows_pruned_before_an_export_read_them_are_named_in_a_warning(tmp_path: Path, capsys) -> None:
    """History rows pruned (`control.history_retention_s`) before an export read them were
    simply missing from it. On SQLite the export counts them exactly (rows are numbered without
    gaps), and the deletions of the objects live at the last export; the CLI prints it."""
    db, out = str(tmp_path / "levelzero.db"), str(tmp_path / "out")
    first, second = await prune_between_two_exports(lambda: SqliteLogStore.open(db), db, out)
    assert first.warnings == [] and rows_of(first, "fence_events", "l0_objects") == (2, 1)
    assert rows_of(second, "fence_events", "l0_objects", "l0_deletions") == (2, 1, 0)
    assert second.warnings == [
        "4 history rows (2 of fence_events, 1 of l0_objects, 1 of l0_deletions) were pruned from "
        "the store (older than its control.history_retention_s) before this directory exported "
        "them: export more often than that to keep every row"
    ]
    async with await SqliteLogStore.open(db) as store:
        await store.record_fence_events([FenceEventRow(700.0, 1, 1, 1, "admitted", 1, 1)])
    assert export_main(["--db", db, "--out", out]) == 0  # nothing pruned since: no warning
    assert "warning" not in capsys.readouterr().err
    fresh = str(tmp_path / "fresh")  # a first export after the pruning: the rows it cannot have
    assert export_main(["--db", db, "--out", fresh, "--quiet"]) == 0
    said = capsys.readouterr().err
    assert "levelzero export: warning: 6 history rows (4 of fence_events, 2 of l0_objects) were" in said


async def test_rows_updated_in_place_are_exported_once_per_change(tmp_path: Path, capsys) -> None:
    """A delete stamped with an old time, a GC whose round ids restart, and L1 objects moving
    through their lifecycle are each exported exactly once per change."""
    db, out = str(tmp_path / "levelzero.db"), str(tmp_path / "out")
    async with await SqliteLogStore.open(db, clock=lambda: 5_000.0) as store:
        (row,) = await store.create_topic("t", 1, creation_epoch=1, now=1_000.0)
        for i in range(4):
            await store.record_l0_object(L0ObjectRow(f"k{i}", 1, 10 + i, 1_000.0 + i, 1))
        l1 = L1Row("l1a", row.pid, 0, 9, 3, 1, 99, L1State.COPY_STARTED, 1_000.0, 1_000.0)
        await store.l1_insert(l1)
        await store.record_gc_round(gc_round(1, started_at=2_000.0, m=2))
        await store.mark_l0_deleted(["k2"], at=3_000.0, m=2)
        progress: list[ExportProgress] = []
        first = await anyio.to_thread.run_sync(lambda: export(db, out, progress=progress.append))
        assert [p.table for p in progress if p.done] == list(TABLES)
        assert max(p.rows for p in progress if p.table == "l0_objects") == 4
        assert rows_of(first, "l0_objects", "l0_deletions", "l1_objects") == (4, 1, 1)

        await store.mark_l0_deleted(["k0"], at=2_500.0, m=2)  # older than the last exported delete
        await store.l1_transition("l1a", L1State.COPY_STARTED, L1State.COPY_FINISHED, 3_100.0)
        # A restarted GC numbers its rounds from 1 again (the store replaces the row).
        await store.record_gc_round(gc_round(1, started_at=4_000.0, m=3))
        second = await anyio.to_thread.run_sync(export, db, out)
        assert second.rows == {
            "log_entries": 0,
            "state_samples": 0,
            "fence_events": 0,
            "l0_objects": 0,
            "l0_deletions": 1,
            "gc_rounds": 1,
            "l1_objects": 1,
        }
        await store.l1_transition("l1a", L1State.COPY_FINISHED, L1State.DELETE_STARTED, 3_200.0)
        await store.l1_transition("l1a", L1State.DELETE_STARTED, L1State.DELETE_FINISHED, 3_300.0)
        await store.mark_l0_deleted(["k1", "k3"], at=2_000.0, m=2)
        third = await anyio.to_thread.run_sync(export, db, out)
        assert rows_of(third, "l0_deletions", "l1_objects", "gc_rounds") == (2, 1, 0)
    assert export_main(["--db", db, "--out", out]) == 0  # nothing new; progress on stderr
    captured = capsys.readouterr()
    assert "0 new rows" in captured.out
    for table in TABLES:
        assert f"levelzero export: {table}: 0 rows done" in captured.err
    manifest = json.loads(Path(out, MANIFEST_NAME).read_text())
    assert manifest["watermarks"]["l0_open"] == [] and manifest["watermarks"]["l1_open"] == []
    deletions = read_table(out, "l0_deletions").to_pylist()
    assert sorted((r["key"], r["deleted_at"]) for r in deletions) == [
        ("k0", 2_500.0),
        ("k1", 2_000.0),
        ("k2", 3_000.0),
        ("k3", 2_000.0),
    ]
    l1_rows = read_table(out, "l1_objects").to_pylist()
    states = sorted((r["state"], r["updated_at"]) for r in l1_rows)
    assert states == [("COPY_FINISHED", 3_100.0), ("COPY_STARTED", 1_000.0), ("DELETE_FINISHED", 3_300.0)]
    round_rows = read_table(out, "gc_rounds").to_pylist()
    rounds = sorted((r["round_id"], r["started_at"]) for r in round_rows)
    assert rounds == [(1, 2_000.0), (1, 4_000.0)]


def test_rows_of_many_dates_stream_through_a_bounded_number_of_open_files(
    tmp_path: Path, monkeypatch
) -> None:
    """Log entries whose dates alternate, exported in tiny chunks with two open writers: a date
    evicted and seen again gets a new file, and every row lands in its own date."""
    # The module, not the package attribute of the same name (the function).
    export_module = importlib.import_module("levelzero.export.export")
    db = str(tmp_path / "levelzero.db")

    async def create() -> None:
        async with await SqliteLogStore.open(db) as store:
            await store.create_topic("t", 2, creation_epoch=1, now=0.0)

    anyio.run(create)
    with sqlite3.connect(db) as connection:
        connection.executemany(
            "INSERT INTO log VALUES (?, ?, 1, ?, 'advance_epoch', 1, 0, 0, NULL, x'', ?)",
            [(pid, o, 0, (o % 5) * DAY_S + pid) for pid in (1, 2) for o in range(20)],
        )
    connection.close()
    monkeypatch.setattr(export_module, "WRITERS_OPEN_MAX", 2)
    report = export(db, tmp_path / "out", chunk_rows=3, small_file_bytes=0)  # no compaction
    assert report.rows["log_entries"] == 40
    per_date = {}
    for relative in report.files:
        date = relative.split("/")[1][5:]
        table = pq.read_table(tmp_path / "out" / relative)
        assert {utc_date(t) for t in table.column("appended_at").to_pylist()} == {date}
        per_date[date] = per_date.get(date, 0) + table.num_rows
    assert per_date == {utc_date(day * DAY_S): 8 for day in range(5)}
    assert len(report.files) > 5  # dates were evicted and reopened


def test_small_files_are_compacted_into_one_per_date(tmp_path: Path, monkeypatch) -> None:
    """Exports of a few rows each (dates alternating, writers evicted: several files per date)
    leave one file per date, committed with the manifest; the files folded are superseded at
    that commit, deleted after it, and ignored if a crash left them."""
    export_module = importlib.import_module("levelzero.export.export")
    db = str(tmp_path / "levelzero.db")
    out = tmp_path / "out"

    async def create() -> None:
        async with await SqliteLogStore.open(db) as store:
            await store.create_topic("t", 2, creation_epoch=1, now=0.0)

    def append(offsets: range) -> None:
        with sqlite3.connect(db) as connection:
            connection.executemany(
                "INSERT INTO log VALUES (?, ?, 1, ?, 'advance_epoch', 1, 0, 0, NULL, x'', ?)",
                [(pid, o, 0, (o % 5) * DAY_S + pid) for pid in (1, 2) for o in offsets],
            )
        connection.close()

    def data_files() -> list[str]:
        return sorted(str(p.relative_to(out)) for p in out.glob("log_entries/date=*/part-*"))

    anyio.run(create)
    monkeypatch.setattr(export_module, "WRITERS_OPEN_MAX", 2)
    append(range(20))
    first = export(db, out, chunk_rows=3)
    assert len(first.files) == 5 and data_files() == sorted(first.files)
    append(range(20, 40))
    second = export(db, out, chunk_rows=3)
    assert second.rows["log_entries"] == 40
    assert data_files() == sorted(second.files)  # one per date, the older ones folded in
    assert all(f.split("/")[-1].startswith("part-000002-") for f in second.files)
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert sorted(manifest["superseded"]) == sorted(first.files)
    found = load_inputs([str(out)])[0]
    rows = read_table(str(out), "log_entries").to_pylist()
    assert len(found.files["log_entries"]) == 5
    assert sorted((r["partition"], r["log_offset"]) for r in rows) == [
        (p, o) for p in (0, 1) for o in range(40)
    ]
    # A crash between the commit and the deletes: a superseded file is back; nobody counts it.
    shutil.copy(out / second.files[0], out / first.files[0])
    assert str(out / first.files[0]) not in load_inputs([str(out)])[0].files["log_entries"]
    third = export(db, out)
    assert third.total_rows == 0 and not (out / first.files[0]).exists()
    assert json.loads((out / MANIFEST_NAME).read_text())["superseded"] == []


def test_a_crashed_export_leaves_nothing_the_next_export_or_the_analysis_uses(
    scenario: Scenario, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    shutil.copytree(scenario.out, out)
    date_dir = next((out / "l0_objects").iterdir())
    (date_dir / ".part-000009-20300101T000000Z.parquet.tmp").write_bytes(b"half")
    stray = date_dir / "part-000009-20300101T000000Z.parquet"
    shutil.copy(next(date_dir.glob("part-*.parquet")), stray)  # renamed, manifest not written
    before = load_inputs([str(out)])[0]
    assert str(stray) not in before.files["l0_objects"]
    report = export(scenario.db_path, out)
    assert report.total_rows == 0
    assert not stray.exists() and not list(date_dir.glob(".part-*"))


async def test_a_damaged_data_file_of_an_earlier_export_is_named_in_one_line(tmp_path: Path, capsys) -> None:
    """An export folds the earlier files of the dates it writes into (compaction): one
    overwritten with text used to end it in pyarrow's traceback, on every retry."""
    db, out = str(tmp_path / "levelzero.db"), tmp_path / "out"
    async with await SqliteLogStore.open(db, clock=lambda: 5_000.0) as store:
        await store.create_topic("t", 1, creation_epoch=1, now=1_000.0)
        for i in range(2):
            await store.record_l0_object(L0ObjectRow(f"k{i}", 1, 10, 1_000.0 + i, 1))
        assert await anyio.to_thread.run_sync(export_main, ["--db", db, "--out", str(out), "--quiet"]) == 0
        (damaged,) = out.glob("l0_objects/date=*/part-*.parquet")
        damaged.write_text("not Parquet, but long enough to have a footer's place\n")
        await store.record_l0_object(L0ObjectRow("k2", 1, 10, 1_002.0, 1))
        capsys.readouterr()
        for _ in range(2):  # the same on a retry, and nothing of the failed export is left
            rc = await anyio.to_thread.run_sync(export_main, ["--db", db, "--out", str(out), "--quiet"])
            err = capsys.readouterr().err
            assert rc == 1
            assert err == (
                f"levelzero export: {damaged} is not a readable Parquet file: Parquet magic bytes "
                "not found in footer. Either the file is corrupted or this is not a parquet file; "
                f"{out} holds a damaged export: export into a new directory (levelzero export "
                "--out NEW_DIR), or delete the file to go on without its rows\n"
            )
            assert json.loads((out / MANIFEST_NAME).read_text())["last_seq"] == 1
        damaged.unlink()  # what the message offers: the export goes on without its rows
        report = await anyio.to_thread.run_sync(export, db, out)
    assert report.rows["l0_objects"] == 1
    assert [r["key"] for r in read_table(str(out), "l0_objects").to_pylist()] == ["k2"]


def test_export_errors_are_clear(scenario: Scenario, tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    with pytest.raises(ExportError, match="no such database file"):
        export(tmp_path / "missing.db", out)
    with pytest.raises(ExportError, match="directory without levelzero.db"):
        export(tmp_path, out)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ExportError, match="not a levelzero store"):
        export(junk, out)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE log (x)")
        db.execute("PRAGMA user_version = 7")
    db.close()
    with pytest.raises(ExportError, match="schema version 7"):
        export(other, out)
    with pytest.raises(ExportError, match="export of another store"):
        anyio.run(_export_fresh_store_into, tmp_path / "fresh", scenario.out)


async def _export_fresh_store_into(data_dir: Path, out: str) -> None:
    data_dir.mkdir()
    async with await SqliteLogStore.open(db_path_in(data_dir)) as store:
        await store.create_topic("elsewhere", 1, creation_epoch=1, now=1.0)
    export(db_path_in(data_dir), out)


def test_two_exports_into_one_directory_exclude_each_other(scenario: Scenario, tmp_path: Path) -> None:
    import fcntl

    out = tmp_path / "out"
    out.mkdir()
    with open(out / LOCK_NAME, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(ExportError, match="another export is writing"):
            export(scenario.db_path, out)


def test_export_cli_reports_errors_without_traceback(tmp_path: Path, capsys) -> None:
    assert export_main(["--db", str(tmp_path / "nope.db"), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "levelzero export: " in err and "no such database file" in err
    assert "Traceback" not in err
    assert export_main(["--out", str(tmp_path / "o")]) == 2  # no source
    assert export_main(["--db", "a", "--data-dir", "b", "--out", "o"]) == 2


def test_schemas_md_is_generated_from_the_schemas() -> None:
    path = Path(__file__).resolve().parents[2] / "levelzero" / "export" / "SCHEMAS.md"
    assert path.read_text() == render_markdown()
    for table, schema in SCHEMAS.items():
        for column in schema:
            assert column.metadata and column.metadata[b"doc"], (table, column.name)
            assert column.name not in SQL_RESERVED, (table, column.name)
            if column.name.endswith("_at"):
                assert column.type == pa.timestamp("us", tz="UTC"), (table, column.name)
        assert pa.types.is_timestamp(schema.field(TABLES[table].time_column).type)


def test_times_are_exported_as_utc_timestamps(scenario: Scenario) -> None:
    rows = pq.read_table(os.path.join(scenario.out, "l0_objects")).to_pylist()
    assert {r["key"]: r["created_at"] for r in rows} == {
        key: datetime.fromtimestamp(t, UTC) for key, t in scenario.created_at.items()
    }
    samples = pq.read_table(os.path.join(scenario.out, "state_samples"))
    assert samples.schema.field("sampled_at").type == pa.timestamp("us", tz="UTC")
    assert "at" not in samples.schema.names


# ------------------------------------------------------------------------ analysis input checks


def test_missing_or_empty_input_directories_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(AnalysisError, match="does not exist"):
        load_inputs([str(tmp_path / "absent")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(AnalysisError, match="is empty"):
        load_inputs([str(tmp_path / "empty")])
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("hi")
    with pytest.raises(AnalysisError, match="not a levelzero export directory"):
        load_inputs([str(tmp_path / "other")])
    with pytest.raises(AnalysisError, match="no input directory"):
        load_inputs([])


def test_an_export_without_rows_is_nothing_to_analyse(tmp_path: Path) -> None:
    async def empty_store() -> None:
        async with await SqliteLogStore.open(tmp_path / "levelzero.db"):
            pass

    anyio.run(empty_store)
    export(tmp_path / "levelzero.db", tmp_path / "out")
    with pytest.raises(AnalysisError, match="hold no rows"):
        analyze([str(tmp_path / "out")], str(tmp_path / "report"))


def test_parquet_of_the_wrong_schema_is_rejected_before_spark(scenario: Scenario, tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(scenario.out, out)
    victim = next((out / "state_samples").glob("date=*/part-*.parquet"))
    table = pq.read_table(victim)
    strings = pa.array(["x"] * table.num_rows)
    table = table.set_column(table.schema.get_field_index("mp"), "mp", strings)
    pq.write_table(table, victim)
    with pytest.raises(AnalysisError, match=r"state_samples schema: column mp is string, expected"):
        load_inputs([str(out)])
    victim.write_bytes(b"PAR1 not really")
    with pytest.raises(AnalysisError, match="not a readable Parquet file"):
        load_inputs([str(out)])
    rc = analyze_main(["--in", str(out), "--out", str(tmp_path / "report")])
    assert rc == 1


def test_files_the_manifest_counts_on_and_that_are_gone_are_an_error(
    scenario: Scenario, tmp_path: Path, capsys
) -> None:
    """A deleted gc_rounds/ folder was analysed as an export without GC rounds (gc_rounds 0,
    every deletion unexplained), no word said; as a damaged file, it is one line naming it."""
    out = tmp_path / "out"
    shutil.copytree(scenario.out, out)
    shutil.rmtree(out / "gc_rounds")
    rounds = scenario.db_rows["gc_rounds"]
    assert rounds == len(scenario.rounds) == 6
    expected = (
        f"{out / 'gc_rounds'} holds 0 rows, but the export manifest (_levelzero_export.json) lists "
        f"{rounds} exported: files of it are missing (deleted, or left out of a copy); put them "
        "back, or export the store again into a new directory (levelzero export --out NEW_DIR) "
        "and analyse that one"
    )
    with pytest.raises(AnalysisError) as failed:
        load_inputs([str(out)])
    assert str(failed.value) == expected
    assert analyze_main(["--in", str(out), "--out", str(tmp_path / "report")]) == 1
    assert capsys.readouterr().err == f"levelzero analyze: {expected}\n"
    shutil.copytree(scenario.out_full, tmp_path / "full")  # one file of a table of several gone
    (victim, *others) = sorted((tmp_path / "full" / "l0_objects").glob("date=*/part-*.parquet"))
    assert others, "the scenario spans two dates"
    gone = pq.ParquetFile(victim).metadata.num_rows
    victim.unlink()
    with pytest.raises(AnalysisError, match=f"holds {17 - gone} rows, but .* lists 17 exported"):
        load_inputs([str(tmp_path / "full")])
    assert load_inputs([scenario.out, scenario.out_full])[0].rows["gc_rounds"] == rounds


# ------------------------------------------------------------------------ Java


def test_missing_java_is_a_clear_error(monkeypatch, tmp_path: Path, scenario: Scenario, capsys) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(JavaNotFound, match="apt-get install openjdk-17-jre-headless"):
        check_java()
    assert analyze_main(["--in", scenario.out, "--out", str(tmp_path / "report")]) == 1
    err = capsys.readouterr().err
    assert "Java 17 (a JRE) is required" in err and "Traceback" not in err
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    with pytest.raises(JavaNotFound, match="has no bin/java"):
        check_java()


def test_too_old_java_is_a_clear_error(monkeypatch, tmp_path: Path) -> None:
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("#!/bin/sh\necho 'openjdk version \"11.0.20\" 2023-07-18' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(JavaNotFound, match="is Java 11; Spark 4 needs 17"):
        check_java()


# ------------------------------------------------------------------------ analysis


def test_gc_lag_counts_and_bytes_match_what_the_scenario_did(
    analysis: AnalysisReport, scenario: Scenario
) -> None:
    f = analysis.figures
    lags = scenario.expected_lags()
    assert f["l0_objects"] == len(scenario.created_at) == 17
    assert f["l0_bytes"] == sum(scenario.sizes.values())
    assert f["l0_live_bytes_end"] == sum(
        size for key, size in scenario.sizes.items() if key not in scenario.deleted_at
    )
    assert f["l0_deleted"] == len(scenario.deleted_at)
    assert f["l0_deleted_bytes"] == sum(scenario.sizes[k] for k in scenario.deleted_at)
    assert f["l0_live_objects_end"] == 1
    assert f["l0_deleted_unexplained"] == 0
    assert f["gc_lag_count"] == len(lags)
    assert f["gc_lag_p50_s"] == nearest_rank(lags, 0.5) == 30.0
    assert f["gc_lag_p90_s"] == nearest_rank(lags, 0.9) == 50.0
    assert f["gc_lag_p99_s"] == nearest_rank(lags, 0.99) == 50.0
    assert f["gc_lag_max_s"] == max(lags) == 50.0
    assert f["gc_lag_mean_s"] == pytest.approx(sum(lags) / len(lags))
    assert f["gc_rounds"] == len(scenario.rounds)
    assert f["gc_dry_runs"] == sum(dry for _, _, dry in scenario.rounds)
    histogram = pq.read_table(analysis.tables["gc_lag_histogram"]).to_pylist()
    assert sum(r["objects"] for r in histogram) == len(lags)
    assert histogram[0]["objects"] == 6 and histogram[-1]["objects"] == 7


def test_l0_age_at_deletion_is_reported_beside_the_gc_lag(
    analysis: AnalysisReport, scenario: Scenario
) -> None:
    """Created -> deleted (what storage costs) next to eligible -> deleted (the GC's share)."""
    f = analysis.figures
    ages = [deleted - scenario.created_at[key] for key, deleted in scenario.deleted_at.items()]
    assert f["l0_age_p50_s"] == nearest_rank(ages, 0.5)
    assert f["l0_age_p90_s"] == nearest_rank(ages, 0.9)
    assert f["l0_age_p99_s"] == nearest_rank(ages, 0.99)
    assert f["l0_age_max_s"] == max(ages)
    assert f["l0_age_mean_s"] == pytest.approx(sum(ages) / len(ages))
    assert f["l0_age_p50_s"] > f["gc_lag_p50_s"]  # the watermark took time to pass the objects
    histogram = pq.read_table(analysis.tables["l0_age_histogram"]).to_pylist()
    assert sum(r["objects"] for r in histogram) == len(ages)
    assert histogram[-1]["bin_hi_s"] == pytest.approx(max(ages))
    assert "L0 age at deletion (created -> deleted): p50 " in analysis.summary()


def test_cluster_lag_e_minus_m_is_a_result_and_a_plot(analysis: AnalysisReport, scenario: Scenario) -> None:
    rounds = pq.read_table(analysis.tables["gc_rounds_over_time"]).to_pylist()
    with_m = [r for r in rounds if r["m"] is not None]
    assert with_m
    for r in with_m:
        assert r["cluster_lag_epochs"] == r["cluster_epoch"] - r["m"]
    assert "cluster_lag" in analysis.plots
    assert "<h2>Cluster lag</h2>" in Path(analysis.report_path).read_text()


def test_fence_reconciler_watermark_and_throughput_figures(
    analysis: AnalysisReport, scenario: Scenario
) -> None:
    f = analysis.figures
    assert f["fence_rejected"] == scenario.stale_rejections == 1
    # A row stands for `decisions` fence decisions: the figures count decisions, not rows.
    assert scenario.db_rows["fence_decisions"] > scenario.db_rows["fence_events"]
    assert f["fence_events"] == scenario.db_rows["fence_decisions"]
    by_window = pq.read_table(analysis.tables["fence_by_window"]).to_pylist()
    assert sum(r["rejected"] for r in by_window) == 1
    assert sum(r["events"] for r in by_window) == scenario.db_rows["fence_decisions"]
    assert f["reconciler_lag_max_records"] == scenario.unreconciled_peak
    assert f["reconciler_lag_end_records"] == 0
    assert f["top_m_holder"] == "audit/0"
    holding = {
        f"{r['topic']}/{r['partition']}": r["seconds_holding_m"]
        for r in pq.read_table(analysis.tables["partition_watermarks"]).to_pylist()
    }
    # audit/0 alone held M for the 40 s between the orders partitions' housekeeping and its own.
    for p in range(3):
        assert holding["audit/0"] - holding[f"orders/{p}"] == 40.0
    assert f["records_total"] == scenario.records == 17
    assert f["bytes_total"] == scenario.db_rows["placeholder_bytes"]
    assert f["partitions"] == 4
    assert analysis.rows == {table: scenario.db_rows[db_table(table)] for table in TABLES}


def test_report_plots_and_result_tables_exist(analysis: AnalysisReport) -> None:
    html = Path(analysis.report_path).read_text()
    assert html.count("<img") == len(analysis.plots) >= 6
    for section in (
        "GC lag",
        "Storage amplification",
        "Safe-to-GC watermark",
        "Epoch fence",
        "Reconciler lag",
        "Throughput",
    ):
        assert f"<h2>{section}</h2>" in html
    for path in analysis.plots.values():
        assert Path(path).stat().st_size > 5_000 and Path(path).read_bytes()[:4] == b"\x89PNG"
    for name, path in analysis.tables.items():
        assert os.path.exists(path), name
        if path.endswith(".parquet"):
            assert Path(path[: -len(".parquet")] + ".csv").stat().st_size > 0
    throughput = pq.read_table(analysis.tables["throughput_partition_buckets"])
    assert sum(throughput.column("records").to_pylist()) == 17


def test_overlapping_export_directories_are_deduplicated(
    analysis: AnalysisReport, scenario: Scenario, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "report"
    rc = analyze_main(
        [
            "--in",
            scenario.out,
            "--in",
            scenario.out_full,
            "--out",
            str(out),
            "--master",
            "local[2]",
            "--bucket-s",
            str(BUCKET_S),
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "report: " in captured.out
    summary_rows = pq.read_table(out / "tables" / "gc_lag_summary.parquet").to_pylist()
    summary = {r["figure"]: r["value"] for r in summary_rows}
    assert summary["l0_objects"] == analysis.figures["l0_objects"]
    assert summary["l0_deleted"] == analysis.figures["l0_deleted"]
    assert summary["gc_lag_p50_s"] == analysis.figures["gc_lag_p50_s"]
    assert summary["gc_lag_mean_s"] == pytest.approx(analysis.figures["gc_lag_mean_s"])
    throughput = pq.read_table(out / "tables" / "throughput_by_partition.parquet")
    assert sum(throughput.column("records").to_pylist()) == 17


def test_a_directory_of_an_older_export_format_is_refused_with_what_to_do(tmp_path: Path) -> None:
    """Format 3 made times TIMESTAMP columns and renamed `at`: a format-2 directory is neither
    appended to (its files would have two schemas) nor analysed (the footers do not match)."""

    async def empty_store() -> None:
        async with await SqliteLogStore.open(tmp_path / "levelzero.db"):
            pass

    anyio.run(empty_store)
    out = tmp_path / "out"
    export(tmp_path / "levelzero.db", out)
    manifest_path = out / "_levelzero_export.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["version"] == 3
    manifest["version"] = 2
    manifest_path.write_text(json.dumps(manifest))
    expected = "export format version 2; this levelzero reads and writes version 3: export again"
    with pytest.raises(ExportError, match=expected):
        export(tmp_path / "levelzero.db", out)
    with pytest.raises(AnalysisError, match=expected):
        load_inputs([str(out)])


def test_a_store_made_before_fence_decisions_exports_one_decision_per_row(tmp_path: Path) -> None:
    """The log store adds fence_events.decisions when it opens a file; the export only reads,
    so a file no new levelzero has opened yet still exports, each row one decision."""

    async def store_with_a_fence_row() -> None:
        async with await SqliteLogStore.open(tmp_path / "levelzero.db") as store:
            (p,) = await store.create_topic("t", 1, creation_epoch=1, now=1.0)
            await store.record_fence_events([FenceEventRow(2.0, p.pid, 1, 1, "admitted", 1, 1, 9)])

    anyio.run(store_with_a_fence_row)
    with sqlite3.connect(tmp_path / "levelzero.db") as db:
        db.execute("ALTER TABLE fence_events DROP COLUMN decisions")
    db.close()
    out = tmp_path / "out"
    export(tmp_path / "levelzero.db", out)
    rows = pq.read_table(str(out / "fence_events")).to_pylist()
    assert [(r["outcome"], r["decisions"]) for r in rows] == [("admitted", 1)]


def test_a_topic_deleted_and_made_again_keeps_both_lives_rows_across_directories(tmp_path: Path) -> None:
    """Overlapping directories are deduplicated on each table's key. A topic deleted and made
    again under its name numbers its log from the start again: keyed by topic, partition and
    log offset alone, the second life's entries were taken for copies of the first's (in two
    directories: one exported before the deletion, one after) and dropped."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    db_path = db_path_in(data_dir)
    first, second = tmp_path / "before", tmp_path / "after"

    async def scenario() -> None:
        objects = LocalObjectStore(str(data_dir / "objects"), fsync=False)
        async with await SqliteLogStore.open(db_path, synchronous="NORMAL") as store:
            node = Node(node_config(), store, objects, rng=random.Random(5))
            async with anyio.create_task_group() as tg:
                await tg.start(node.run)
                for life, (records, out) in enumerate(((3, first), (5, second))):
                    if life:
                        await node.delete_topic("again")
                    await node.create_topic("again", 1)
                    for i in range(records):
                        await node.produce("again", 0, [Record(None, b"%d-%d" % (life, i))])
                    await anyio.to_thread.run_sync(export, db_path, str(out))
                await node.shutdown()

    anyio.run(scenario)
    out = str(tmp_path / "report")
    report = analyze([str(first), str(second)], out, master="local[2]", bucket_s=BUCKET_S)
    throughput = pq.read_table(report.tables["throughput_by_partition"]).to_pylist()
    assert sum(r["records"] for r in throughput) == 3 + 5, throughput


async def test_an_l1_objects_finished_delete_pruned_before_an_export_read_it_is_named(tmp_path: Path) -> None:
    """The rows of L1 objects whose delete is over are pruned as history: an object open at the
    last export whose delete finished and was pruned before the next one read it kept showing
    as live in the exported table, with no word of it. Counted and named, as the L0 deletions."""
    db, out = str(tmp_path / "levelzero.db"), str(tmp_path / "out")
    async with await SqliteLogStore.open(db, clock=lambda: 5_000.0) as store:
        (row,) = await store.create_topic("t", 1, creation_epoch=1, now=100.0)
        await store.l1_insert(L1Row("a", row.pid, 0, 9, 3, 1, 99, L1State.COPY_FINISHED, 100.0, 100.0))
    first = await anyio.to_thread.run_sync(export, db, out)
    assert first.warnings == [] and rows_of(first, "l1_objects") == (1,)
    async with await SqliteLogStore.open(db, clock=lambda: 5_000.0) as store:
        await store.l1_insert(L1Row("b", row.pid, 10, 19, 3, 1, 99, L1State.COPY_FINISHED, 600.0, 600.0))
        await store.l1_transition("a", L1State.COPY_FINISHED, L1State.DELETE_STARTED, 300.0)
        await store.l1_transition("a", L1State.DELETE_STARTED, L1State.DELETE_FINISHED, 350.0)
        assert await store.prune_history(450.0, 100) == 1
    second = await anyio.to_thread.run_sync(export, db, out)
    assert rows_of(second, "l1_objects") == (1,)  # "b"
    assert second.warnings == [
        "1 history row (1 of l1_deletions) was pruned from the store (older than its "
        "control.history_retention_s) before this directory exported it: export more often than "
        "that to keep every row"
    ]
