"""The analysis on long histories, under other masters and against URIs, on a hand-made export.

The export here is written directly (the documented layout and schemas) so that it can hold
what a test scenario on a real node cannot reach quickly: 100,000 epochs of fence decisions,
and partitions whose M(p) are tied or not at chosen times.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from export_support import T0, sample, write_table

from levelzero.export import AnalysisError, AnalysisReport, analyze, analyze_main
from levelzero.export import jobs
from levelzero.export.cli import export_main
from levelzero.export.locations import local_path
from levelzero.export.manifest import Manifest, save
from levelzero.export.readable import duration_unit, human, human_bytes, human_number, y_limits

EPOCHS = 100_000
REJECTED_EVERY = 1_000
HOLDER = "a/0"


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three partitions: tied at M(p)=1 for 10 s, then a/0 alone behind for 10 s, then tied
    again; and one fence decision per epoch for EPOCHS epochs, every REJECTED_EVERY-th one a
    rejection."""
    out = tmp_path_factory.mktemp("export")
    samples = [sample(p + 1, 0.0, p, 1) for p in range(3)]
    samples += [sample(4, 10.0, 1, 2), sample(5, 10.0, 2, 2), sample(6, 20.0, 0, 2)]
    samples += [sample(7 + p, 29.0, p, 2) for p in range(3)]
    write_table(out, "state_samples", samples)
    write_table(
        out,
        "fence_events",
        [
            dict(
                seq=e,
                decided_at=T0 + e * 0.000_29,
                topic="a",
                partition=e % 3,
                term=1,
                epoch=e,
                outcome="rejected" if e % REJECTED_EVERY == 0 else "admitted",
                window_min=e - 1,
                window_max=e,
                decisions=1,
            )
            for e in range(1, EPOCHS + 1)
        ],
    )
    save(str(out), Manifest(last_seq=1))
    return out


@pytest.fixture(scope="module")
def local_report(export_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> AnalysisReport:
    out = tmp_path_factory.mktemp("report")
    report = analyze(
        [str(export_dir)],
        f"file://{out}",
        master="local[2]",
        bucket_s=1.0,
        conf={"spark.sql.shuffle.partitions": "3"},
    )
    return report


def test_fence_results_stay_bounded_over_a_hundred_thousand_epochs(
    local_report: AnalysisReport,
) -> None:
    rows = pq.read_table(local_report.tables["fence_by_window"]).to_pylist()
    assert len(rows) == 200
    width = EPOCHS // 200
    assert [(r["window_max_from"], r["window_max_to"]) for r in rows] == [
        (1 + i * width, (i + 1) * width) for i in range(200)
    ]
    assert sum(r["events"] for r in rows) == EPOCHS
    assert sum(r["rejected"] for r in rows) == EPOCHS // REJECTED_EVERY
    assert all(r["partitions"] == 3 for r in rows)
    assert local_report.figures["fence_epochs_per_range"] == width
    assert local_report.figures["fence_rejection_rate"] == pytest.approx(1 / REJECTED_EVERY)
    assert Path(local_report.plots["fence"]).stat().st_size > 5_000


def test_only_a_partition_behind_the_others_holds_m(local_report: AnalysisReport) -> None:
    rows = pq.read_table(local_report.tables["partition_watermarks"]).to_pylist()
    holding = {f"{r['topic']}/{r['partition']}": r["seconds_holding_m"] for r in rows}
    assert holding == {"a/0": 10.0, "a/1": 0.0, "a/2": 0.0}
    assert local_report.figures["top_m_holder"] == HOLDER
    assert "watermark_holders" in local_report.plots


def test_the_two_halves_of_the_results_run_at_once(
    export_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The L0/GC results and the partition-state results are computed concurrently: each
    half's first job waits at a barrier only the other half can pass (a bounded wait: one
    after the other, the barrier breaks), and the report still lists its tables in order."""
    meeting = threading.Barrier(2, timeout=120)
    threads: dict[str, str] = {}

    def meeting_first(name: str, original: Callable[..., None]) -> Callable[..., None]:
        def wrapped(self: jobs.SparkAnalysis, *args: object) -> None:
            threads[name] = threading.current_thread().name
            meeting.wait()
            return original(self, *args)

        return wrapped

    monkeypatch.setattr(jobs.SparkAnalysis, "_gc_lag", meeting_first("gc", jobs.SparkAnalysis._gc_lag))
    monkeypatch.setattr(
        jobs.SparkAnalysis,
        "_partition_states",
        meeting_first("states", jobs.SparkAnalysis._partition_states),
    )
    report = analyze([str(export_dir)], str(tmp_path / "report"), master="local[2]", bucket_s=1.0)
    assert threads["gc"] != threads["states"]
    collected = [name for name in report.tables if name != "throughput_partition_buckets"]
    assert collected == list(jobs.RESULT_ORDER)
    rows = pq.read_table(report.tables["partition_watermarks"]).to_pylist()
    assert {f"{r['topic']}/{r['partition']}": r["seconds_holding_m"] for r in rows}[HOLDER] == 10.0


def test_the_callers_master_and_settings_are_used(local_report: AnalysisReport) -> None:
    assert local_report.figures["spark_master"] == "local[2]"
    assert local_report.figures["shuffle_partitions"] == 3
    assert "on local[2], 3 shuffle partitions, application levelzero-analysis" in local_report.summary()


def test_bucket_starts_are_timestamps_like_the_exports_times(local_report: AnalysisReport) -> None:
    for name in ("watermark_over_time", "throughput_partition_buckets"):  # collected; Spark's own
        table = pq.read_table(local_report.tables[name])
        assert str(table.schema.field("bucket_start").type) == "timestamp[us, tz=UTC]", name
    starts = pq.read_table(local_report.tables["watermark_over_time"]).column("bucket_start").to_pylist()
    assert starts[0].timestamp() == T0  # the grid starts at the first sample, 1 s buckets
    assert [b - a for a, b in zip(starts, starts[1:], strict=False)] == [timedelta(seconds=1)] * 29


def test_plot_axes_do_not_magnify_noise() -> None:
    wobble = [1_000_000.0 * (1 + 0.0002 * (-1) ** i) for i in range(50)]
    assert y_limits(wobble) == (0.0, max(wobble) * 1.05)  # from zero: a flat line
    assert y_limits([0.0, 0.0]) == (0.0, 1.0)
    assert y_limits([]) == (0.0, 1.0)
    low, high = y_limits([100_000.0, 100_001.0], span_min=10.0)  # epochs: at least 10 shown
    assert high - low == pytest.approx(11.0)
    assert low < 100_000 and high > 100_001
    assert y_limits([-5.0, 5.0]) == pytest.approx((-5.5, 5.5))


def test_long_durations_read_in_hours_and_days() -> None:
    assert duration_unit(90.0) == ("s", 1.0)
    assert duration_unit(150.0) == ("min", 60.0)
    assert duration_unit(11_520.0) == ("h", 3_600.0)
    assert duration_unit(3 * 86_400.0) == ("d", 86_400.0)


def test_numbers_read_as_people_read_them() -> None:
    assert human_bytes(1_000_000_000_000) == "1.00 TB"
    assert human_bytes(1234) == "1.23 kB"
    assert human_bytes(512) == "512 B"
    assert human_bytes(123_456_789) == "123 MB"
    assert human_number(1 / 4_067) == "0.000246"
    assert human_number(12.5) == "12.5"
    assert human_number(4.0) == "4"
    assert human_number(123_456.7) == "123,457"
    assert human("l0_bytes", 1e12) == "1.00 TB"
    assert human("bytes_per_s_peak", 2.5e6) == "2.50 MB/s"
    assert human("fence_rejection_rate", 1 / 4_067) == "0.000246"
    assert human("gc_lag_p50_s", 0.016, " s") == "0.016 s"
    assert human("top_m_holder", None) == "n/a"


def test_the_export_refuses_an_output_uri_it_cannot_write(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    rc = export_main(["--db", str(tmp_path / "levelzero.db"), "--out", "hdfs://nn/export"])
    assert rc == 1
    assert "output directory hdfs://nn/export: hdfs:// is not supported" in (capsys.readouterr().err)
    assert os.listdir(tmp_path) == []  # no directory named "hdfs:"


def test_file_uris_name_local_paths() -> None:
    assert local_path("file:///data/export", "input") == "/data/export"
    with pytest.raises(AnalysisError, match="names no host"):
        local_path("file://host/data", "input")


def test_a_conf_without_equals_is_a_usage_error(capsys) -> None:
    rc = analyze_main(["--in", "x", "--out", "y", "--conf", "spark.sql.shuffle.partitions"])
    assert rc == 2
    assert "--conf takes KEY=VALUE" in capsys.readouterr().err


def test_inputs_and_report_go_through_sparks_filesystems(
    export_dir: Path, local_report: AnalysisReport, tmp_path: Path, monkeypatch
) -> None:
    """A URI of a scheme other than file:// is read and written through Hadoop's FileSystem
    in Spark's JVM: here `viewfs://lz/`, Hadoop's mount-table filesystem, mounted onto a local
    directory (the one non-local filesystem every Spark ships). An `s3a://` URI without the
    hadoop-aws package is one line naming the package, and no local directory named `s3a:`."""
    from pyspark.sql import SparkSession

    shared = tmp_path / "shared"
    (shared / "exports").mkdir(parents=True)
    os.symlink(export_dir, shared / "exports" / "e1")
    monkeypatch.chdir(tmp_path)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("levelzero-uri-test")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "3")
        .config("spark.hadoop.fs.viewfs.mounttable.lz.link./shared", f"file://{shared}")
        .getOrCreate()
    )
    try:
        report = analyze(["viewfs://lz/shared/exports/e1/"], "viewfs://lz/shared/reports/r1", bucket_s=1.0)
        with pytest.raises(AnalysisError) as refused:
            analyze(["viewfs://lz/shared/exports/e1"], "s3a://bucket/r1", bucket_s=1.0)
        with pytest.raises(AnalysisError, match="input directory viewfs://lz/shared/nothing does not exist"):
            analyze(["viewfs://lz/shared/nothing"], "viewfs://lz/shared/reports/r2")
    finally:
        spark.stop()
    written = shared / "reports" / "r1"
    assert report.out_dir == "viewfs://lz/shared/reports/r1"
    assert report.report_path == "viewfs://lz/shared/reports/r1/report.html"
    assert (written / "report.html").stat().st_size > 10_000
    fence = pq.read_table(written / "tables" / "fence_by_window.parquet").to_pylist()
    assert fence == pq.read_table(local_report.tables["fence_by_window"]).to_pylist()
    assert report.tables["fence_by_window"] == "viewfs://lz/shared/reports/r1/tables/fence_by_window.parquet"
    assert (written / "tables" / "fence_by_window.csv").exists()
    # (Hadoop's local filesystem keeps a .crc file beside each file it writes.)
    assert {p.name for p in (written / "plots").iterdir() if not p.name.startswith(".")} == {
        os.path.basename(path) for path in local_report.plots.values()
    }
    # Spark wrote its per-partition table there itself.
    assert any((written / "tables" / "throughput_partition_buckets").glob("*.parquet"))
    assert report.figures["fence_rejection_rate"] == local_report.figures["fence_rejection_rate"]
    message = str(refused.value)
    assert "\n" not in message
    assert "s3a://bucket/r1" in message and "org.apache.hadoop:hadoop-aws:" in message
    assert sorted(os.listdir(tmp_path)) == ["shared"]  # nothing named viewfs: or s3a:


def test_the_time_grid_and_the_fence_ranges_come_from_the_footers_without_a_spark_job(
    export_dir: Path,
) -> None:
    """The earliest and latest time of any table, and the fence windows' epochs, are the input
    files' footer statistics (the input checks read them anyway): no Spark job scans the
    tables for them (the analysis below has no session at all)."""
    from levelzero.export.inputs import load_inputs

    (found,) = load_inputs([str(export_dir)])
    for table, column in (("state_samples", "sampled_at"), ("fence_events", "decided_at")):
        (path,) = found.files[table]
        micros = pq.read_table(path).column(column).cast("int64").to_pylist()
        assert found.range_of(table, column) == (min(micros), max(micros)), table
    assert found.range_of("fence_events", "window_max") == (1, EPOCHS)
    assert found.files["log_entries"] == []  # no file: no times to widen the grid with
    analysis = jobs.SparkAnalysis(None, [found], "unused", None)  # type: ignore[arg-type]
    lo, hi = analysis._time_bounds({})
    assert lo == T0
    assert (
        hi
        == max(
            found.range_of(t, c)[1]
            for t, c in (("state_samples", "sampled_at"), ("fence_events", "decided_at"))
        )
        / 1e6
    )  # type: ignore[index]
    assert analysis._footer_range(("fence_events", "window_max")) == (1, EPOCHS)


def test_files_without_statistics_get_their_time_grid_from_a_scan(
    export_dir: Path, local_report: AnalysisReport, tmp_path: Path
) -> None:
    """Footers that cannot tell a range (written without statistics): the time grid and the
    fence's epoch ranges come from scans of the tables, and they are what the statistics gave."""
    from levelzero.export.inputs import load_inputs

    bare = tmp_path / "bare"
    for source in export_dir.rglob("*"):
        target = bare / source.relative_to(export_dir)
        if source.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif source.suffix == ".parquet":
            pq.write_table(pq.read_table(source), target, write_statistics=False)
        else:
            target.write_bytes(source.read_bytes())
    (found,) = load_inputs([str(bare)])
    assert found.range_of("state_samples", "sampled_at") is None
    assert found.range_of("fence_events", "window_max") is None
    report = analyze([str(bare)], str(tmp_path / "report"), master="local[2]", bucket_s=1.0)
    for figure in ("time_start", "time_end", "buckets"):
        assert report.figures[figure] == local_report.figures[figure], figure
    for name in ("watermark_over_time", "fence_by_window"):
        assert pq.read_table(report.tables[name]).equals(pq.read_table(local_report.tables[name])), name


def test_a_table_without_files_is_an_empty_relation_the_plans_drop(
    export_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An input table with no files (this export has no L1 objects) is an empty relation the
    optimizer removes from the queries over it, not a scan of an empty Python RDD."""
    from pyspark.sql import SparkSession

    from levelzero.export.inputs import load_inputs

    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only
    spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    try:
        analysis = jobs.SparkAnalysis(spark, load_inputs([str(export_dir)]), "unused", None)
        l1 = analysis._table("l1_objects")
        assert l1.schema == jobs.seconds_schema(jobs.spark_schema("l1_objects"))
        lifetimes = l1.groupBy("key").agg({"size": "max"})
        plan = lifetimes._jdf.queryExecution().optimizedPlan().toString()
        assert plan.startswith("LocalRelation <empty>"), plan
        assert lifetimes.collect() == []
    finally:
        spark.stop()


def test_each_plot_is_drawn_while_the_other_jobs_run(
    export_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plot is drawn as soon as the step making its tables is done, in the drawing thread,
    while later steps' jobs run: the throughput step (the last of its half) waits until the
    holders' plot (its half's first step) is drawn — a bounded wait that a report drawn only
    after the jobs never ends."""
    from levelzero.export import report as report_module

    drawn = threading.Event()
    drawn_in: list[str] = []
    seen: list[bool] = []
    holders_plot = report_module._plot_watermark_holders

    def holders_then_signal(canvas: object, results: object) -> None:
        holders_plot(canvas, results)  # type: ignore[arg-type]
        drawn_in.append(threading.current_thread().name)
        drawn.set()

    throughput = jobs.SparkAnalysis._throughput

    def throughput_after_the_plot(self: jobs.SparkAnalysis, *args: object) -> None:
        seen.append(drawn.wait(timeout=120))
        throughput(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(
        report_module,
        "_PLOTS",
        tuple(
            (name, needs, holders_then_signal if name == "watermark_holders" else draw)
            for name, needs, draw in report_module._PLOTS
        ),
    )
    monkeypatch.setattr(jobs.SparkAnalysis, "_throughput", throughput_after_the_plot)
    report = analyze([str(export_dir)], str(tmp_path / "report"), master="local[2]", bucket_s=1.0)
    assert seen == [True]
    assert drawn_in and drawn_in[0].startswith("levelzero-plots")
    assert list(report.plots) == [name for name, _, _ in report_module._PLOTS if name in report.plots]
    assert {"watermark_holders", "fence", "watermark_over_time"} <= set(report.plots)
    assert Path(report.plots["watermark_holders"]).stat().st_size > 5_000
