"""PySpark analysis of exported levelzero tables: GC lag, storage amplification, watermarks,
fence rejections, reconciler lag and throughput.

    report = analyze(["/data/lz-export"], "/data/lz-report", master="local[*]")

Inputs are checked before Spark starts (`inputs.py`: directories, manifests, every file's
schema, then Java). The Spark jobs (`jobs.py`) keep every input a DataFrame from reading to
aggregating; only aggregated results (at most one row per time bucket, histogram bin, window or
partition) reach the driver, for the plots, result files and `report.html` (`report.py`). The
one per-(partition, bucket) result is written by Spark itself.

Inputs from several export directories are unioned and deduplicated on each table's key (one
directory never holds a row twice, so a single input skips that shuffle). Times are bucketed
on a grid of `bucket_s` seconds starting at the earliest time of any table (UTC, aligned to a
multiple of `bucket_s`); a value "at" a bucket is the value at its end.

Definitions (also in the report):
- An L0 object is *eligible* at the first recorded GC round (dry runs count: they compute M the
  same way) whose M is >= its epoch — not before it was created. GC lag = deleted_at -
  eligible_at; it includes the grace period and the GC's pacing. A deleted object with no such
  round (rounds missing from the exports) is counted as unexplained, not given a lag.
- Live L0 bytes at t: objects created by t and not deleted by t. Live L1 bytes: objects from
  COPY_FINISHED until DELETE_STARTED. Amplification = (L0 + L1) / L1 live bytes.
- Each partition's state at t is its latest sample by t. M at t = min M(p) over sampled
  partitions (unset while any has none). Holders: the partitions equal to that minimum (or
  without an M(p)) — time as holder is what held M back. Watermark lag = max applied epoch -
  M(p); reconciler lag = high watermark - 1 - LRO (records not yet in L1).
- Fence rejections are grouped by the window's upper edge (the epoch the window had moved to);
  window size = window_max - window_min + 1.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import AnalysisError
from .inputs import check_java, load_inputs

SHUFFLE_PARTITIONS_LOCAL = 8  # Spark's 200 default is made for clusters, not one machine


@dataclass(frozen=True, slots=True)
class AnalysisReport:
    out_dir: str
    report_path: str
    rows: dict[str, int]
    figures: dict[str, Any]
    tables: dict[str, str]  # result name -> Parquet path (CSV beside it, where small)
    plots: dict[str, str]  # plot name -> PNG path
    bucket_s: float
    duration_s: float

    def summary(self) -> str:
        f = self.figures

        def show(name: str, unit: str = "") -> str:
            value = f.get(name)
            if value is None:
                return "n/a"
            if isinstance(value, float):
                return f"{value:,.3f}{unit}"
            return f"{value:,}{unit}"

        per_table = ", ".join(f"{name} {count:,}" for name, count in self.rows.items())
        return "\n".join(
            [
                f"report: {self.report_path}",
                f"input rows: {sum(self.rows.values()):,} ({per_table})",
                f"L0 objects: {show('l0_objects')} ({show('l0_bytes', ' B')}), deleted "
                f"{show('l0_deleted')}, live at end {show('l0_live_objects_end')}",
                f"GC lag: p50 {show('gc_lag_p50_s', ' s')}, p90 {show('gc_lag_p90_s', ' s')}, "
                f"p99 {show('gc_lag_p99_s', ' s')}, max {show('gc_lag_max_s', ' s')}",
                f"fence: {show('fence_events')} events, {show('fence_rejected')} rejected "
                f"(rate {show('fence_rejection_rate')})",
                f"throughput: {show('records_total')} records, {show('bytes_total', ' B')} in "
                f"{show('partitions')} partitions",
                f"analysed in {self.duration_s:.1f} s (bucket {self.bucket_s:g} s)",
            ]
        )


def analyze(
    in_dirs: Sequence[str],
    out_dir: str,
    master: str = "local[*]",
    *,
    bucket_s: float | None = None,
) -> AnalysisReport:
    """Analyse the export directories `in_dirs` into `out_dir` (report.html, plots/, tables/).

    Reuses the active SparkSession if there is one (and leaves it running); otherwise starts one
    on `master` and stops it at the end."""
    started = time.monotonic()
    if bucket_s is not None and not (isinstance(bucket_s, (int, float)) and bucket_s > 0):
        raise AnalysisError(f"bucket_s must be a positive number of seconds, not {bucket_s!r}")
    inputs = load_inputs(list(in_dirs))
    out_dir = os.path.abspath(os.fspath(out_dir))
    for found in inputs:
        if out_dir == found.path:
            raise AnalysisError(f"the report directory {out_dir} must not be an input directory")
    try:
        os.makedirs(os.path.join(out_dir, "tables"), exist_ok=True)
    except OSError as error:
        raise AnalysisError(f"cannot create report directory {out_dir}: {error.strerror}") from None
    check_java()

    from py4j.protocol import Py4JError  # noqa: PLC0415 - Spark only once Java is there
    from pyspark.errors import PySparkException  # noqa: PLC0415

    from .jobs import SparkAnalysis  # noqa: PLC0415

    spark, owned = _session(master)
    try:
        results = SparkAnalysis(spark, inputs, out_dir, bucket_s).run()
    except (PySparkException, Py4JError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        raise AnalysisError(f"Spark failed: {first_line}") from error
    finally:
        if owned:
            spark.stop()

    from .report import write_report  # noqa: PLC0415 - matplotlib only when reporting

    written = write_report(results, out_dir)
    return AnalysisReport(
        out_dir=out_dir,
        report_path=written.report_path,
        rows=results.rows,
        figures=results.figures,
        tables=written.tables,
        plots=written.plots,
        bucket_s=results.bucket_s,
        duration_s=time.monotonic() - started,
    )


def _session(master: str) -> tuple[Any, bool]:
    """The active SparkSession (not ours to stop), or a new one on `master` (ours)."""
    from pyspark.sql import SparkSession  # noqa: PLC0415

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    try:
        spark = (
            SparkSession.builder.master(master)
            .appName("levelzero-analysis")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS_LOCAL))
            .getOrCreate()
        )
    except Exception as error:  # noqa: BLE001 - the JVM did not start: say so, once
        raise AnalysisError(f"cannot start Spark on {master}: {error}") from error
    spark.sparkContext.setLogLevel("ERROR")
    return spark, True
