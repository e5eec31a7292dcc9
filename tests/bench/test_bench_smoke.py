"""Smoke test of `levelzero bench`: the cheap items run end to end in quick mode and write a
results file of the promised shape. No timing is asserted: figures depend on the machine."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import anyio
import pytest

from levelzero.bench import ITEM_NAMES, main
from levelzero.bench.analysis import main as analysis_main
from levelzero.bench.cli import MARK_BEGIN, MARK_END, update_markdown
from levelzero.cli import commands
from levelzero.cli import main as cli
from levelzero.bench.common import Figure, Target, figure
from levelzero.bench.cli import _with_spread_cell
from levelzero.bench.durable import raw_rows_per_s
from levelzero.bench.fence import DroppingLogStore, fenced_writes

FIGURE_KEYS = {
    "judged_ratio",
    "spread",
    "item",
    "name",
    "unit",
    "sut_label",
    "floor_label",
    "sut",
    "floor",
    "ratio",
    "target",
    "verdict",
    "rounds",
    "notes",
}


def test_quick_fence_and_stall_write_results_with_positive_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results_path = tmp_path / "out" / "results.json"
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text("# Benchmarks\n\nHand-written notes stay.\n", encoding="utf-8")

    code = main(
        [
            "--quick",
            "--only",
            "fence,stall",
            "--results",
            str(results_path),
            "--markdown",
            str(markdown),
            "--loop",
            "asyncio",
        ]
    )

    assert code == 0
    results = json.loads(results_path.read_text(encoding="utf-8"))
    assert {"command", "quick", "loop", "started_at", "duration_s", "machine", "items"} <= set(results)
    assert results["quick"] is True and results["loop"] == "asyncio"
    assert results["command"] == "levelzero bench --quick --only fence,stall --loop asyncio"
    machine = results["machine"]
    assert machine["nproc"] >= 1 and machine["python"].count(".") == 2 and machine["cpu_model"]
    assert set(results["items"]) == {"fence", "stall"}

    fence = results["items"]["fence"]["figures"]
    assert len(fence) == 1
    (figure,) = fence
    assert set(figure) == FIGURE_KEYS
    assert figure["sut"] > 0 and figure["floor"] > 0
    assert math.isclose(figure["ratio"], figure["sut"] / figure["floor"], rel_tol=1e-9)
    assert figure["target"] == {"bound": 0.5, "higher_is_better": True}
    assert figure["verdict"] in ("pass", "miss")
    assert len(figure["rounds"]) == 1 and all(v > 0 for v in figure["rounds"][0])

    stall = results["items"]["stall"]["figures"]
    assert stall and all(set(f) == FIGURE_KEYS for f in stall)
    assert all(f["sut"] >= 0 and f["floor"] >= 0 for f in stall)
    notes = stall[0]["notes"]
    assert notes["windowed"]["seeds"] == notes["strict"]["seeds"] > 0
    assert notes["strict"]["leadership_changes"] > 0

    text = markdown.read_text(encoding="utf-8")
    assert text.startswith("# Benchmarks\n\nHand-written notes stay.\n")
    assert text.count(MARK_BEGIN) == text.count(MARK_END) == 1
    assert "| fence |" in text and "| stall |" in text

    printed = capsys.readouterr().out
    assert "fenced writes/s vs the same writes unfenced" in printed
    assert f"wrote {results_path}" in printed


def test_unknown_item_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--only", "nonsense"])
    assert exited.value.code == 2
    assert "unknown item nonsense" in capsys.readouterr().err
    assert "fence" in ITEM_NAMES and "compaction" in ITEM_NAMES and "txn" in ITEM_NAMES
    assert len(ITEM_NAMES) == 18


def test_markdown_section_is_replaced_not_appended(tmp_path: Path) -> None:
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# Benchmarks\n\nbefore\n\n" + MARK_BEGIN + "\nold\n" + MARK_END + "\n\nafter\n")
    results = {
        "command": "levelzero bench --only fence",
        "quick": False,
        "loop": "asyncio",
        "started_at": "2026-01-01T00:00:00+00:00",
        "duration_s": 12.0,
        "machine": {
            "nproc": 2,
            "cpu_model": "CPU",
            "memory_gib": 4.0,
            "implementation": "CPython",
            "python": "3.11.7",
            "platform": "Linux",
        },
        "items": {
            "fence": {
                "title": "3.",
                "seconds": 1.0,
                "figures": [
                    {
                        "name": "fences",
                        "unit": "ops/CPU-s",
                        "sut_label": "fences",
                        "floor_label": "bare",
                        "sut": 5.0,
                        "floor": 10.0,
                        "ratio": 0.5,
                        "target": {"bound": 0.5, "higher_is_better": True},
                        "verdict": "pass",
                    }
                ],
            }
        },
    }
    update_markdown(path, results)
    update_markdown(path, results)
    text = path.read_text()
    assert text.startswith("# Benchmarks\n\nbefore\n\n") and text.endswith("\n\nafter\n")
    assert "old" not in text and text.count(MARK_BEGIN) == 1
    assert "| fence | fences | ops/CPU-s | fences 5.000 | bare 10.0 | 50.0% | - | ≥ 50% | pass |" in text


def test_a_target_is_judged_on_the_worst_quartile_of_rounds_and_the_spread_is_shown() -> None:

    # Median 1.20 passes a >= 100% target, but the worst of four rounds (0.80) does not.
    swinging = figure("x", "f", "u", [(120, 100), (80, 100), (150, 100), (125, 100)], target=Target(1.0))
    assert swinging.ratio == pytest.approx(1.225)
    assert swinging.judged_ratio == pytest.approx(0.80)
    assert (swinging.verdict, swinging.spread) == ("miss", "80%–150%")
    # Lower is better: the worst quartile is the highest ratios; of 5 rounds, the second worst.
    latency = figure(
        "x", "f", "u", [(10, 10), (11, 10), (12, 10), (14, 10), (30, 10)], target=Target(1.25, False)
    )
    assert latency.judged_ratio == pytest.approx(1.4) and latency.verdict == "miss"
    steady = figure("x", "f", "u", [(101, 100), (104, 100), (103, 100)], target=Target(1.0))
    assert (steady.judged_ratio, steady.verdict) == (pytest.approx(1.01), "pass")
    single = figure("x", "f", "u", [(90, 100)], target=Target(1.0))
    assert (single.judged_ratio, single.spread) == (pytest.approx(0.9), "-")


def test_a_figure_comes_back_whole_from_its_json() -> None:
    # (a child process's figures reach the item as JSON: the analysis item's records figures)
    rounds = [(10, 10), (11, 10), (30, 10)]
    before = figure("x", "f", "u", rounds, target=Target(1.25, False), sut_label="a", notes={"n": 1})
    again = Figure.from_json(json.loads(json.dumps(before.to_json())))
    assert again == before and again.verdict == before.verdict == "miss"
    assert Figure.from_json(figure("x", "f", "u", [(1, 2)]).to_json()).target is None


def test_rows_kept_from_before_the_rounds_column_get_a_dash_there() -> None:

    old = "| gc | GC deletes/s | objects/s | gc 19,869 | raw 24,023 | 84.0% | ≥ 80% | pass |"
    new = "| gc | GC deletes/s | objects/s | gc 19,869 | raw 24,023 | 84.0% | - | ≥ 80% | pass |"
    assert _with_spread_cell(old) == new
    assert _with_spread_cell(new) == new


def test_quick_durable_reports_the_sqlite_path_and_the_in_memory_ceiling(tmp_path: Path) -> None:
    results_path = tmp_path / "asked" / "here.json"  # --out: where the user asks, never ./bench
    assert main(["--quick", "--only", "durable", "--out", str(results_path)]) == 0
    sqlite_figure, memory_figure = json.loads(results_path.read_text())["items"]["durable"]["figures"]
    assert sqlite_figure["target"] == {"bound": 0.5, "higher_is_better": True}
    assert memory_figure["target"] is None and memory_figure["verdict"] == "info"
    # One round: both figures are measured against the same raw group-commit run.
    assert sqlite_figure["floor"] == memory_figure["floor"] > 0
    assert sqlite_figure["sut"] > 0 and memory_figure["sut"] > 0
    assert sqlite_figure["notes"]["records_per_commit"][0] >= 1
    assert sqlite_figure["notes"]["partitions_per_commit"][0] >= 1  # the floor's shape too
    assert all(us > 0 for us in sqlite_figure["notes"]["loop_cpu_us_per_placeholder"])
    assert all(us > 0 for us in memory_figure["notes"]["loop_cpu_us_per_placeholder"])


def test_durable_floor_writes_each_commit_over_as_many_partitions_as_the_actors_did(
    tmp_path: Path,
) -> None:
    path = tmp_path / "raw.db"
    # 10 rows a commit over 4 of 6 partitions (3, 3, 2, 2 rows), partitions taken in turn
    assert anyio.run(lambda: raw_rows_per_s(path, 10, 0.05, partitions=6, partitions_per_batch=4)) > 0
    with sqlite3.connect(path) as connection:
        rows = connection.execute("SELECT pid, log_offset, base_offset FROM log ORDER BY rowid").fetchall()
    commits = len(rows) // 10
    assert commits >= 1 and len(rows) == commits * 10
    first = rows[:10]  # grouped by partition, each at its log's next offsets
    assert first == [(1, 0, 0), (1, 1, 10), (1, 2, 20), (2, 0, 0), (2, 1, 10), (2, 2, 20)] + [
        (3, 0, 0),
        (3, 1, 10),
        (4, 0, 0),
        (4, 1, 10),
    ]
    for pid in range(1, 7):  # every partition's log: consecutive offsets from 0, no gap
        offsets = [offset for p, offset, _ in rows if p == pid]
        assert offsets == list(range(len(offsets)))
    if commits >= 2:  # the next commit starts where the turn stopped: partitions 5, 6, 1, 2
        assert [pid for pid, _, _ in rows[10:20]] == [5, 5, 5, 6, 6, 6, 1, 1, 2, 2]


def test_bench_without_its_extra_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(commands, "BENCH_NEEDS", "levelzero_module_that_is_not_installed")
    assert cli.main(["bench", "--quick"]) == 2
    assert (
        "needs the bench extra (levelzero_module_that_is_not_installed): pip install 'levelzero[bench]'"
        in (capsys.readouterr().err)
    )


def test_bench_writes_no_file_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["--quick", "--only", "stall"]) == 0
    assert list(tmp_path.iterdir()) == []


def test_quick_control_reports_postgres_beside_the_raw_driver_and_sqlite_latency(tmp_path: Path) -> None:
    results_path = tmp_path / "control.json"
    assert main(["--quick", "--only", "control", "--out", str(results_path)]) == 0
    durable, p50, p99, nodes = json.loads(results_path.read_text())["items"]["control"]["figures"]
    assert durable["target"] == {"bound": 0.7, "higher_is_better": True}
    assert durable["sut"] > 0 and durable["floor"] > 0
    assert durable["notes"]["records_per_commit"][0] >= 1
    assert durable["notes"]["partitions_per_commit"][0] >= 1 and durable["notes"]["floor_connections"] == 2
    assert (nodes["sut_label"], nodes["floor_label"], nodes["verdict"]) == ("3 nodes", "1 node", "info")
    assert nodes["sut"] > 0 and nodes["floor"] > 0
    assert (p50["sut_label"], p50["floor_label"], p50["verdict"]) == ("postgres", "sqlite", "info")
    assert 0 < p50["sut"] <= p99["sut"] and 0 < p50["floor"] <= p99["floor"]


def test_quick_analysis_times_the_report_against_a_hand_written_job(tmp_path: Path) -> None:
    results_path = tmp_path / "analysis.json"
    assert main(["--quick", "--only", "analysis", "--out", str(results_path)]) == 0
    figures = json.loads(results_path.read_text())["items"]["analysis"]["figures"]
    per_table, records, streamed, streamed_vs_job = figures
    assert per_table["target"] == {"bound": 1.2, "higher_is_better": False}
    # The records, read through the data source and from their Parquet export (both counted and
    # summed inside the item): MB/s for each, information only.
    assert (records["unit"], records["sut_label"]) == ("MB/s", 'format("levelzero")')
    assert records["target"] == {"bound": 0.5, "higher_is_better": True}
    assert records["verdict"] in ("pass", "miss")
    assert records["sut"] > 0 and records["floor"] > 0 and records["ratio"] > 0
    assert records["notes"]["records"] == 8_000 and records["notes"]["object_ranges"] >= 4
    # The same records streamed in four micro-batches against Parquet streamed the same way
    # (test_quick_stream_figure_streams_both_sides_in_the_same_micro_batches), and against one
    # batch read of them (information).
    assert (streamed["unit"], streamed["notes"]["max_records_per_trigger"]) == ("records/s", 2_000)
    assert streamed["sut"] > 0 and streamed["floor"] > 0 and streamed["ratio"] > 0
    assert streamed_vs_job["verdict"] == "info" and streamed_vs_job["sut"] == streamed["sut"]
    assert per_table["sut"] > 0 and per_table["floor"] > 0
    notes = per_table["notes"]
    assert notes["log_rows"] == 50_000 and notes["result_tables"] == 14
    assert notes["driver_jvm_peak_rss_bytes"] > 0 and notes["driver_python_peak_rss_bytes"] > 0
    # Each run's CPU seconds in the timed part (the JVM's: planning and the local executors'
    # tasks) and the machine's load average before and after it.
    for side in ("analysis", "floor"):
        assert len(notes[f"{side}_jvm_cpu_s"]) == 1 and notes[f"{side}_jvm_cpu_s"][0] > 0
        assert notes[f"{side}_python_cpu_s"][0] > 0
        assert len(notes[f"{side}_load"][0]) == 2 and min(notes[f"{side}_load"][0]) >= 0


def test_quick_records_figure_alone_scans_both_sides_in_as_many_tasks(tmp_path: Path) -> None:
    """`python -m levelzero.bench.analysis records`: the batch records figure without the
    analysis runs, with each side's tasks, CPU seconds per scan and the load in its notes."""
    results_path = tmp_path / "records.json"
    assert analysis_main(["records", "--quick", "--out", str(results_path)]) == 0
    (records,) = json.loads(results_path.read_text())
    assert (records["unit"], records["sut_label"]) == ("MB/s", 'format("levelzero")')
    assert records["target"] == {"bound": 0.5, "higher_is_better": True}
    assert records["sut"] > 0 and records["floor"] > 0 and records["ratio"] > 0
    notes = records["notes"]
    assert notes["records"] == 8_000 and notes["scans_per_side_per_round"] == 2
    # The data source and the ceiling run in local[2]'s parallelism of tasks (the 4 MB Parquet
    # file is one split: below Spark's 4 MiB open cost per split).
    assert notes["tasks"] == {"levelzero": 2, "parquet": 1, "ceiling": 2}
    cpu = notes["cpu_s_per_scan"]
    assert all(cpu[side]["jvm"] > 0 for side in ("levelzero", "parquet", "ceiling"))
    assert cpu["levelzero"]["python_workers"] > 0 and cpu["ceiling"]["python_workers"] > 0
    assert notes["cpu_ratio"] > 0
    assert len(notes["load"]) == 2 and min(notes["load"]) >= 0  # before the round, after the last


def test_quick_stream_figure_streams_both_sides_in_the_same_micro_batches(tmp_path: Path) -> None:
    """The streaming figure's floor does the stream's work: Spark's Parquet stream over the same
    records, one file per micro-batch, read in as many micro-batches of as many records as the
    levelzero stream's (each run counts its progress reports' numInputRows)."""
    results_path = tmp_path / "stream.json"
    assert analysis_main(["stream", "--quick", "--out", str(results_path)]) == 0
    streamed, streamed_vs_job = json.loads(results_path.read_text())
    assert streamed["floor_label"] == "readStream Parquet, maxFilesPerTrigger 1, AvailableNow"
    # No target: a Python stream source decoding nothing is below 50% of Parquet's stream.
    assert (streamed["target"], streamed["verdict"]) == (None, "info")
    assert streamed["sut"] > 0 and streamed["floor"] > 0 and streamed["ratio"] > 0
    notes = streamed["notes"]
    assert notes["records"] == 8_000 and notes["parquet_file_records"] == [2_000] * 4
    # ... and so does the ceiling of any Python stream source (the files' own Arrow batches).
    assert notes["micro_batch_records"] == {
        side: [[2_000] * 4] for side in ("levelzero", "parquet", "ceiling")
    }
    assert notes["python_source_ceiling_records_s"][0] > 0 and notes["python_source_ceiling_ratio"] > 0
    for side in ("levelzero", "parquet", "ceiling"):
        assert notes["spent_ms"][side]["addBatch"] > 0 and notes["spent_ms"][side]["outside"] >= 0
    assert (streamed_vs_job["floor_label"], streamed_vs_job["verdict"]) == (
        'read.format("levelzero"), one job',
        "info",
    )
    assert streamed_vs_job["sut"] == streamed["sut"] and streamed_vs_job["floor"] > 0


def test_quick_cluster_times_a_failover_a_stale_cache_move_and_throughput_by_nodes(tmp_path: Path) -> None:
    results_path = tmp_path / "cluster.json"
    assert main(["--quick", "--only", "cluster", "--out", str(results_path)]) == 0
    failover, stall, rejections, two, three = json.loads(results_path.read_text())["items"]["cluster"][
        "figures"
    ]
    assert failover["floor"] == 2.0 and failover["notes"]["lease_ttl_s"] == 2.0
    assert failover["target"] == {"bound": 2.0, "higher_is_better": False}  # (TTL + 2 s) / TTL
    assert failover["sut"] > 0 and failover["notes"]["nodes"] == 3
    assert (stall["sut_label"], stall["floor_label"]) == ("windowed", "strict")
    assert stall["sut"] > 0 and stall["floor"] > 0 and rejections["unit"] == "rejections"
    assert two["sut"] > 0 and two["floor"] > 0 and three["sut"] > 0 and three["floor"] == two["floor"]


def test_a_run_of_some_items_keeps_the_other_items_rows(tmp_path: Path) -> None:
    def run(item: str, value: float, when: str, names: tuple[str, ...] = ("figure",)) -> dict:
        figures = [
            {
                "name": f"{item} {name}",
                "unit": "ops/s",
                "sut_label": "sut",
                "sut": value,
                "floor_label": "floor",
                "floor": 1.0,
                "ratio": value,
                "target": None,
                "verdict": "info",
            }
            for name in names
        ]
        return {
            "machine": {
                "nproc": 2,
                "cpu_model": "x",
                "memory_gib": 1,
                "implementation": "CPython",
                "python": "3.11",
                "platform": "linux",
            },
            "started_at": when,
            "command": f"levelzero bench --only {item}",
            "duration_s": 1.0,
            "loop": "asyncio",
            "items": {item: {"figures": figures}},
        }

    markdown = tmp_path / "BENCHMARKS.md"
    update_markdown(markdown, run("fence", 2.0, "day 1"))
    update_markdown(markdown, run("cluster", 3.0, "day 2"))
    update_markdown(markdown, run("fence", 4.0, "day 3"))  # replaces fence's row, in place
    rows = [
        line
        for line in markdown.read_text().splitlines()
        if line.startswith("| fence") or line.startswith("| cluster")
    ]
    assert rows == [
        "| fence | fence figure | ops/s | sut 4.000 | floor 1.000 | 400.0% | - | - | info |",
        "| cluster | cluster figure | ops/s | sut 3.000 | floor 1.000 | 300.0% | - | - | info |",
    ]
    text = markdown.read_text()
    assert "Measured day 3" in text and "Other rows: Measured day 2" in text


def test_a_rerun_of_an_item_replaces_all_its_rows_even_renamed_ones(tmp_path: Path) -> None:
    """An item of several figures, run again with a figure renamed and one added: its rows are
    exactly the new run's (an old row left beside the new ones would read as a second figure)."""

    def run(value: float, names: tuple[str, ...], when: str) -> dict:
        figures = [
            {
                "name": name,
                "unit": "ops/s",
                "sut_label": "sut",
                "sut": value,
                "floor_label": "floor",
                "floor": 1.0,
                "ratio": value,
                "target": None,
                "verdict": "info",
            }
            for name in names
        ]
        return {
            "machine": {
                "nproc": 2,
                "cpu_model": "x",
                "memory_gib": 1,
                "implementation": "CPython",
                "python": "3.11",
                "platform": "linux",
            },
            "started_at": when,
            "command": "levelzero bench --only scale",
            "duration_s": 1.0,
            "loop": "asyncio",
            "items": {"scale": {"figures": figures}},
        }

    markdown = tmp_path / "BENCHMARKS.md"
    update_markdown(markdown, run(2.0, ("a", "b at 1024", "c"), "day 1"))
    update_markdown(markdown, run(4.0, ("a", "b at 1,024", "c", "d"), "day 2"))
    rows = [
        line.split("|")[2].strip() for line in markdown.read_text().splitlines() if line.startswith("| scale")
    ]
    assert rows == ["a", "b at 1,024", "c", "d"]


def test_quick_compaction_item_reports_the_pass_against_its_floor_and_the_space_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results_path = tmp_path / "results.json"
    assert main(["--quick", "--only", "compaction", "--results", str(results_path)]) == 0
    (fig,) = json.loads(results_path.read_text())["items"]["compaction"]["figures"]
    assert fig["sut"] > 0 and fig["floor"] > 0
    # 1% distinct keys: the compacted object holds about 1% of the records' bytes.
    assert 0 < fig["notes"]["space_after_over_before"] < 0.05
    assert "compaction of 20000 records" in capsys.readouterr().out


def test_quick_lookup_item_measures_lookups_beside_one_get(tmp_path: Path) -> None:
    results_path = tmp_path / "results.json"
    code = main(["--quick", "--only", "lookup", "--results", str(results_path), "--loop", "asyncio"])
    assert code == 0
    (lookup,) = json.loads(results_path.read_text(encoding="utf-8"))["items"]["lookup"]["figures"]
    assert (lookup["sut_label"], lookup["floor_label"]) == ("lookup", "one GET")
    assert lookup["sut"] > 0 and lookup["floor"] > 0 and lookup["target"]["bound"] == 1.5


def test_quick_txn_times_transactions_against_idempotent_produce(tmp_path: Path) -> None:
    results_path = tmp_path / "results.json"
    assert main(["--quick", "--only", "txn", "--rounds", "1", "--out", str(results_path)]) == 0
    (row,) = json.loads(results_path.read_text())["items"]["txn"]["figures"]
    assert row["target"] == {"bound": 0.7, "higher_is_better": True}
    assert row["sut"] > 0 and row["floor"] > 0
    assert row["notes"]["records_per_transaction"] == 100


@pytest.mark.parametrize("fenced", [True, False])
def test_fence_floor_does_the_same_writes_without_the_fence(fenced: bool) -> None:
    """The fence item's floor appends and applies what the fenced writes do; only the fence
    decisions (and their events) are missing from it."""
    store = DroppingLogStore()
    rate = anyio.run(lambda: fenced_writes(4, 8, 0.05, fenced=fenced, store=store))

    assert rate > 0
    assert store.records_seen > 4  # the one write per actor before the loop, and the loop's
    for pid in range(1, 5):
        (last,) = store.logs[pid]  # the log keeps its last record: offsets were checked
        assert last.entry.epoch == 3
    if fenced:
        assert store.fence_events_seen > 0
    else:
        assert store.fence_events_seen == 0
