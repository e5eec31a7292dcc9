"""PySpark analysis of exported levelzero tables: GC lag, storage amplification, watermarks,
fence rejections, reconciler lag and throughput.

    report = analyze(["/data/lz-export"], "/data/lz-report")

or on a cluster, with nothing of levelzero installed on the executors (the jobs are DataFrame
expressions only; `submit.py` is the driver script):

    spark-submit --master spark://host:7077 --conf spark.sql.shuffle.partitions=64 \
        "$(python -m levelzero.export.submit --path)" --in file:///shared/lz-export \
        --out file:///shared/lz-report

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
  round (rounds missing from the exports) is counted as unexplained, not given a lag. The L0
  object's age at deletion = deleted_at - created_at is reported beside it: it is what
  storage costs.
- Live L0 bytes at t: objects created by t and not deleted by t. Live L1 bytes: objects from
  COPY_FINISHED until DELETE_STARTED. Amplification = (L0 + L1) / L1 live bytes.
- Each partition's state at t is its latest sample by t. M at t = min M(p) over sampled
  partitions (unset while any has none). Holders: the partitions equal to that minimum (or
  without an M(p)) — time as holder is what held M back. Watermark lag = max applied epoch -
  M(p); reconciler lag = high watermark - 1 - LRO (records not yet in L1). A partition is
  counted as holding M in a bucket only while another partition is above it.
- Fence rejections are grouped by the window's upper edge (the epoch the window had moved to),
  in at most FENCE_RANGES_MAX equal epoch ranges; window size = window_max - window_min + 1.

Every collected result is bounded whatever the history's length: time buckets (<= 240 unless
the caller chooses), histogram bins, epoch ranges, or one row per partition.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .errors import AnalysisError
from .filesystems import HadoopFiles, is_local, join
from .inputs import ExportInput, check_java, load_inputs
from .locations import local_path
from .readable import human

APP_NAME = "levelzero-analysis"  # when neither the caller nor spark-submit named it
DEFAULT_MASTER = "local[*]"  # when neither the caller nor spark-submit chose one
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
            return human(name, f.get(name), unit)

        per_table = ", ".join(f"{name} {count:,}" for name, count in self.rows.items())
        return "\n".join(
            [
                f"report: {self.report_path}",
                f"input rows: {sum(self.rows.values()):,} ({per_table})",
                f"L0 objects: {show('l0_objects')} ({show('l0_bytes')}), deleted "
                f"{show('l0_deleted')}, live at end {show('l0_live_objects_end')}",
                f"L0 age at deletion (created -> deleted): p50 {show('l0_age_p50_s', ' s')}, "
                f"p90 {show('l0_age_p90_s', ' s')}, p99 {show('l0_age_p99_s', ' s')}, "
                f"max {show('l0_age_max_s', ' s')}",
                f"GC lag (eligible -> deleted): p50 {show('gc_lag_p50_s', ' s')}, "
                f"p90 {show('gc_lag_p90_s', ' s')}, p99 {show('gc_lag_p99_s', ' s')}, "
                f"max {show('gc_lag_max_s', ' s')}",
                f"fence: {show('fence_events')} events, {show('fence_rejected')} rejected "
                f"(rate {show('fence_rejection_rate')})",
                f"throughput: {show('records_total')} records, {show('bytes_total')} in "
                f"{show('partitions')} partitions",
                f"analysed in {self.duration_s:.1f} s (bucket {self.bucket_s:g} s) on "
                f"{show('spark_master')}, {show('shuffle_partitions')} shuffle partitions, "
                f"application {show('spark_app_name')}",
            ]
        )


def analyze(
    in_dirs: Sequence[str],
    out_dir: str,
    master: str | None = None,
    *,
    bucket_s: float | None = None,
    conf: Mapping[str, str] | None = None,
) -> AnalysisReport:
    """Analyse the export directories `in_dirs` into `out_dir` (report.html, plots/, tables/).

    Reuses the active SparkSession, or the one `spark-submit` configured (its master and every
    `--conf`), and leaves it as it was. Only when there is neither does it start one: on
    `master` (default `local[*]`) with `conf`, stopped at the end. Inputs and the report are
    local paths, `file://` URIs, or URIs of any filesystem Spark has (`s3a://` with the
    hadoop-aws package, `hdfs://`, ...): see filesystems.py. Local inputs are checked before
    Spark starts; a URI's once the session is there, through Spark's own filesystems."""
    started = time.monotonic()
    if bucket_s is not None and not (isinstance(bucket_s, (int, float)) and bucket_s > 0):
        raise AnalysisError(f"bucket_s must be a positive number of seconds, not {bucket_s!r}")
    in_dirs = [os.fspath(in_dir) for in_dir in in_dirs]
    out_dir = os.fspath(out_dir)
    remote = not all(is_local(location) for location in [*in_dirs, out_dir])
    if not remote:  # every check before Spark starts
        inputs = load_inputs(in_dirs)
        out_dir = _local_out(out_dir, inputs)
    check_java()

    from py4j.protocol import Py4JError  # Spark only once Java is there
    from pyspark.errors import PySparkException

    from .jobs import SparkAnalysis
    from .report import PlotDrawer, plots_dir, write_report

    spark, owned = _session(master, dict(conf or {}))
    staging: str | None = None
    try:
        hadoop = HadoopFiles(spark) if remote else None
        if hadoop is not None:  # the same checks, through Spark's filesystems
            inputs = load_inputs(in_dirs, hadoop)
            if is_local(out_dir):
                out_dir = _local_out(out_dir, inputs)
            else:
                out_dir = out_dir.rstrip("/")
                if out_dir in {found.path for found in inputs}:
                    raise AnalysisError(f"the report directory {out_dir} must not be an input directory")
                hadoop.make_dirs(join(out_dir, "tables"))
                staging = tempfile.mkdtemp(prefix="levelzero-report-")
        # Work of this process beside Spark's (a Spark job holds its thread only to wait on the
        # JVM): matplotlib's imports while the jobs start, and each plot drawn as soon as the
        # step that makes its tables is done, in one thread of its own, while the other steps'
        # jobs run; the last ones while Spark writes the large results.
        report_dir = out_dir if staging is None else staging
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="levelzero-plots") as pool:
            drawer = PlotDrawer(plots_dir(report_dir), pool)
            analysis = SparkAnalysis(spark, inputs, out_dir, bucket_s, on_ready=drawer.ready)
            results = analysis.run()
            try:
                analysis.write_large_results()
            finally:
                analysis.release()
            plots = drawer.finish()
        if staging is None:
            written = write_report(results, out_dir, plots=plots)
        else:
            written = write_report(results, staging, link_root=out_dir, plots=plots)
        if staging is not None:
            assert hadoop is not None
            hadoop.upload_dir(staging, out_dir)
            written = written.moved(staging, out_dir)
    except (PySparkException, Py4JError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        raise AnalysisError(f"Spark failed: {first_line}") from error
    finally:
        if owned:
            spark.stop()
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
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


def _local_out(out_dir: str, inputs: list[ExportInput]) -> str:
    out_dir = os.path.abspath(local_path(out_dir, "report directory"))
    for found in inputs:
        if out_dir == found.path:
            raise AnalysisError(f"the report directory {out_dir} must not be an input directory")
    try:
        os.makedirs(os.path.join(out_dir, "tables"), exist_ok=True)
    except OSError as error:
        raise AnalysisError(f"cannot create report directory {out_dir}: {error.strerror}") from None
    return out_dir


def _session(master: str | None, conf: dict[str, str]) -> tuple[Any, bool]:
    """The session to run on, and whether it is ours to stop.

    An active session (a notebook's, or a caller's) is used as it is. Under `spark-submit`
    (which starts the JVM before this process and passes its gateway) the builder's
    `getOrCreate` takes spark-submit's master and `--conf`s; nothing here overrides them.
    Otherwise the session is started on `master` (default local[*]) with `conf`, plus the local
    defaults (no UI, SHUFFLE_PARTITIONS_LOCAL) where `conf` does not say otherwise."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        for key, value in conf.items():
            try:
                active.conf.set(key, value)
            except Exception as error:  # noqa: BLE001 - a static setting of a running session
                first_line = str(error).strip().splitlines()[0]
                raise AnalysisError(f"cannot set {key} on the active session: {first_line}") from None
        return active, False
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started the JVM for us
    builder = SparkSession.builder
    if not submitted:  # spark-submit named the application already (--name, or the script's)
        builder = builder.appName(APP_NAME)
    chosen = master or (None if submitted else DEFAULT_MASTER)
    if chosen is not None:
        builder = builder.master(chosen)
    if chosen is not None and chosen.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        defaults = {
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": str(SHUFFLE_PARTITIONS_LOCAL),
        }
        for key, value in defaults.items():
            builder = builder.config(key, conf.get(key, value))
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as error:
        where = chosen or "the spark-submit master"
        raise AnalysisError(f"cannot start Spark on {where}: {error}") from error
    spark.sparkContext.setLogLevel("ERROR")
    return spark, True
