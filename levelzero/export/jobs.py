"""The Spark side of the analysis: input tables as DataFrames in, collected results out.

Imported only once Java has been found (it imports PySpark). Every input stays a DataFrame
from reading to aggregating; `_keep` collects a result only when it is small by construction —
at most one row per time bucket, histogram bin, window or partition. The one result that grows
with partitions × buckets is written by Spark and never collected.

Definitions are in `analyze.py`'s docstring (and in the report).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

import pyarrow as pa

from .errors import AnalysisError
from .inputs import ExportInput
from .filesystems import NO_VALUES, join, widen
from .locations import spark_uri
from .results import Results, ResultTable
from .schemas import TABLES

OUTPUT_TIMESTAMP_TYPE = "spark.sql.parquet.outputTimestampType"
BUCKETS_MAX = 240  # time buckets of the over-time results, when the analysis chooses the bucket
BUCKETS_REQUESTED_MAX = 20_000  # ... and when the caller chose it
NICE_BUCKETS_S = (
    1,
    2,
    5,
    10,
    15,
    30,
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
    10800,
    21600,
    43200,
    86400,
    172800,
    604800,
)
HISTOGRAM_BINS = 20
FENCE_RANGES_MAX = 200  # epoch ranges of the fence results, however many epochs the data spans
# the fence_by_window table's columns, scanned or (no windowed decision) empty
FENCE_BY_WINDOW_COLUMNS = (
    "window_max_from",
    "window_max_to",
    "events",
    "rejected",
    "slides",
    "partitions",
    "rejection_rate",
)
LAG_PERCENTILES = (0.5, 0.9, 0.99)
MICROS_PER_S = 1_000_000
PERCENTILE_ACCURACY = 10_000  # percentile_approx: rank error <= rows / accuracy
L1_LIVE_UNTIL_STATES = ("DELETE_STARTED", "DELETE_FINISHED")
# The collected results in the order the report lists them (the jobs make them from two threads).
RESULT_ORDER = (
    "gc_lag_summary",
    "gc_lag_histogram",
    "l0_age_histogram",
    "gc_rounds_over_time",
    "storage_over_time",
    "watermark_over_time",
    "reconciler_lag_over_time",
    "partition_watermarks",
    "fence_by_window",
    "fence_window_sizes",
    "fence_outcomes",
    "throughput_over_time",
    "throughput_by_partition",
)


def nice_bucket_s(span_s: float) -> float:
    """The smallest round bucket that cuts `span_s` into at most BUCKETS_MAX buckets."""
    for candidate in NICE_BUCKETS_S:
        if span_s / candidate < BUCKETS_MAX:
            return float(candidate)
    return float(math.ceil(span_s / (BUCKETS_MAX - 1)))


def spark_schema(table: str) -> T.StructType:
    def spark_type(arrow_type: pa.DataType) -> T.DataType:
        if pa.types.is_int64(arrow_type):
            return T.LongType()
        if pa.types.is_float64(arrow_type):
            return T.DoubleType()
        if pa.types.is_string(arrow_type):
            return T.StringType()
        if pa.types.is_boolean(arrow_type):
            return T.BooleanType()
        if pa.types.is_timestamp(arrow_type):
            return T.TimestampType()
        raise AssertionError(f"no Spark type for {arrow_type}")

    return T.StructType([T.StructField(f.name, spark_type(f.type), True) for f in TABLES[table].schema])


def seconds_schema(schema: T.StructType) -> T.StructType:
    """`schema` with its TIMESTAMP columns as the unix seconds (double) the jobs compute on."""
    return T.StructType(
        [
            T.StructField(f.name, T.DoubleType(), f.nullable)
            if isinstance(f.dataType, T.TimestampType)
            else f
            for f in schema.fields
        ]
    )


def _count(condition: Column | None = None) -> Column:
    return F.count(F.lit(1)) if condition is None else F.count(F.when(condition, 1))


def _utc(value: Any) -> Any:
    """A collected TIMESTAMP as an aware UTC datetime (pyspark hands them over naive, in this
    process's local time); any other value as it is."""
    return value.astimezone(UTC) if isinstance(value, datetime) else value


def _decisions(condition: Column | None = None) -> Column:
    """Fence decisions (a fence_events row stands for `decisions` of them), where `condition`."""
    decisions = F.col("decisions").cast("long")
    return F.sum(decisions if condition is None else F.when(condition, decisions).otherwise(0))


class SparkAnalysis:
    def __init__(
        self,
        spark: SparkSession,
        inputs: list[ExportInput],
        out_dir: str,
        bucket_s: float | None,
        on_ready: Callable[[Results, list[str]], None] | None = None,
    ) -> None:
        """`on_ready(results, names)` is called from the jobs' threads after each step of the
        analysis with the result tables that step made (and the figures it set)."""
        self.spark = spark
        self.inputs = inputs
        self.out_dir = out_dir
        self.requested_bucket_s = bucket_s
        self._cached: list[DataFrame] = []
        self._large_writes: list[Callable[[], None]] = []
        self._on_ready = on_ready
        self._made = threading.local()  # per jobs' thread: the tables its current step made

    def run(self) -> Results:
        """Every collected result. The large results' writes wait for `write_large_results`
        (they read cached frames: `release` only after them), so that they can run beside
        the report's drawing."""
        try:
            frames = {table: self._table(table) for table in TABLES}
            rows = self._rows(frames)
            self.results = self._time_grid(frames, rows)
            self.results.figures.update(
                spark_master=self.spark.sparkContext.master,
                spark_app_name=self.spark.sparkContext.appName,
                shuffle_partitions=int(str(self.spark.conf.get("spark.sql.shuffle.partitions"))),
            )
            self.grid = self.spark.range(self.results.buckets).withColumnRenamed("id", "b")
            objects, deletions = frames["l0_objects"], frames["l0_deletions"]

            def objects_side() -> None:
                self._step(self._gc_lag, objects, deletions, frames["gc_rounds"])
                self._step(self._gc_rounds_over_time, frames["gc_rounds"])
                self._step(self._storage, objects, deletions, frames["l1_objects"])

            def partitions_side() -> None:
                self._step(self._partition_states, frames["state_samples"])
                self._step(self._fence, frames["fence_events"])
                self._step(self._throughput, frames["log_entries"])

            # Two independent halves of the results, each a sequence of Spark jobs, from two
            # threads: most of their stages are one or two tasks, and between two jobs the
            # driver plans and generates code on one core, so one half's planning and small
            # stages fill the core the other half leaves idle (one after the other, a third of
            # the wall time was the driver's between jobs; see BENCHMARKS.md, issue 37).
            with ThreadPoolExecutor(max_workers=2, thread_name_prefix="levelzero-jobs") as pool:
                halves = [pool.submit(objects_side), pool.submit(partitions_side)]
                for half in halves:
                    half.result()
            tables = self.results.tables
            self.results.tables = {name: tables[name] for name in RESULT_ORDER if name in tables}
            assert len(self.results.tables) == len(tables), sorted(tables)
            return self.results
        except BaseException:
            self.release()
            raise

    def _step(self, step: Callable[..., None], *frames: DataFrame) -> None:
        """One step of the results, then `on_ready` with the tables it made."""
        self._made.names = []
        step(*frames)
        if self._on_ready is not None:
            self._on_ready(self.results, self._made.names)

    def _put(self, name: str, table: ResultTable) -> None:
        self.results.tables[name] = table
        made = getattr(self._made, "names", None)
        if made is not None and name not in made:
            made.append(name)

    def write_large_results(self) -> None:
        """The results Spark writes itself (never collected), into `out_dir`."""
        for write in self._large_writes:
            write()

    def release(self) -> None:
        """The cached frames, unpersisted."""
        for frame in self._cached:
            frame.unpersist()
        self._cached.clear()

    # ------------------------------------------------------------------ inputs and time grid

    def _table(self, table: str) -> DataFrame:
        files = [path for found in self.inputs for path in found.files[table]]
        schema = spark_schema(table)
        if not files:
            # An empty relation the optimizer sees as empty (a filter that is always false
            # becomes one): the unions, joins and aggregates over it drop it from the plans.
            # `createDataFrame([])` is a scan of a Python RDD that every query reading the
            # table ran as tasks (and a shuffle, where it was grouped).
            nothing = [F.lit(None).cast(f.dataType).alias(f.name) for f in seconds_schema(schema).fields]
            return self.spark.range(1).where(F.lit(False)).select(*nothing)
        uris = [spark_uri(path) for path in files]
        # The jobs compute on unix seconds (float): every TIMESTAMP column becomes one here.
        seconds = [
            (F.unix_micros(F.col(f.name)) / F.lit(MICROS_PER_S)).alias(f.name)
            if isinstance(f.dataType, T.TimestampType)
            else F.col(f.name)
            for f in schema.fields
        ]
        frame = self.spark.read.schema(schema).parquet(*uris).select(*seconds)
        if len(self.inputs) > 1:
            # One directory never holds a row twice; several may overlap. Deduplicating is a
            # shuffle: do it once, not in every result that reads the table.
            frame = self._cache(frame.dropDuplicates(list(TABLES[table].key)))
        return frame

    def _rows(self, frames: dict[str, DataFrame]) -> dict[str, int]:
        """Input rows per table. One directory's are its files' footers' (no Spark job: the
        footers were read by the input checks); several directories' are counted after
        deduplication (which fills the cache the results read from)."""
        if len(self.inputs) == 1:
            (found,) = self.inputs
            return {table: found.rows[table] for table in frames}
        return {table: frame.count() for table, frame in frames.items()}

    @contextmanager
    def _timestamps_as_micros(self) -> Iterator[None]:
        """Spark writes TIMESTAMP as Parquet TIMESTAMP_MICROS (UTC), as the export does, not
        its INT96 default; the session's setting is restored after."""
        conf = self.spark.conf
        before = conf.get(OUTPUT_TIMESTAMP_TYPE, None)
        conf.set(OUTPUT_TIMESTAMP_TYPE, "TIMESTAMP_MICROS")
        try:
            yield
        finally:
            if before is None:
                conf.unset(OUTPUT_TIMESTAMP_TYPE)
            else:
                conf.set(OUTPUT_TIMESTAMP_TYPE, before)

    def _cache(self, frame: DataFrame) -> DataFrame:
        frame = frame.cache()
        self._cached.append(frame)
        return frame

    def _footer_range(self, *columns: tuple[str, str]) -> tuple[int, int] | None:
        """The (min, max) of the non-null values of the tables' `columns`, as the input files'
        footers tell them (TIMESTAMPs in microseconds; lo > hi: no value); None when they
        cannot (a file without statistics). A table without files has no values."""
        known: tuple[int, int] | None = NO_VALUES
        for found in self.inputs:
            for table, column in columns:
                if found.files[table]:
                    known = widen(known, found.range_of(table, column))
        return known

    def _time_bounds(self, frames: dict[str, DataFrame]) -> tuple[float | None, float | None]:
        """The earliest and latest time of any table (unix seconds), as the jobs compute
        times: from the input files' footers (their statistics: no Spark job) when every
        file's tell it, else a scan of every table's time column. Deduplication does not move
        them (a duplicate row has the same time)."""
        known = self._footer_range(*[(table, TABLES[table].time_column) for table in TABLES])
        if known is not None:
            lo, hi = known
            return (None, None) if lo > hi else (lo / MICROS_PER_S, hi / MICROS_PER_S)
        times = None
        for table, frame in frames.items():
            part = frame.select(F.col(TABLES[table].time_column).alias("t"))
            times = part if times is None else times.unionByName(part)
        assert times is not None
        bounds = times.agg(F.min("t").alias("lo"), F.max("t").alias("hi")).collect()[0]
        return bounds["lo"], bounds["hi"]

    def _time_grid(self, frames: dict[str, DataFrame], rows: dict[str, int]) -> Results:
        lo, hi = self._time_bounds(frames)
        if lo is None or hi is None:
            raise AnalysisError("the export directories hold no rows: nothing to analyse")
        t_min, t_max = float(lo), float(hi)
        span = t_max - t_min
        bucket_s = float(self.requested_bucket_s or nice_bucket_s(span))
        t0 = math.floor(t_min / bucket_s) * bucket_s
        buckets = int(math.floor((t_max - t0) / bucket_s)) + 1
        if buckets > BUCKETS_REQUESTED_MAX:
            raise AnalysisError(
                f"a bucket of {bucket_s:g} s cuts the data's {span:,.0f} s into {buckets:,} "
                f"buckets; choose at least {span / BUCKETS_REQUESTED_MAX:,.0f} s (or let the "
                "analysis choose)"
            )
        results = Results(
            inputs=[found.path for found in self.inputs],
            rows=rows,
            bucket_s=bucket_s,
            t0=t0,
            buckets=buckets,
        )
        results.figures.update(time_start=t_min, time_end=t_max, buckets=buckets, bucket_s=bucket_s)
        return results

    def _bucket(self, column: str) -> Column:
        """The time bucket (0-based index on the grid) of a time column."""
        t0, bucket_s = self.results.t0, self.results.bucket_s
        return F.floor((F.col(column) - F.lit(t0)) / F.lit(bucket_s)).cast("long")

    def _bucket_start(self) -> Column:
        """The bucket's start as a TIMESTAMP (microseconds, UTC), as the export's times."""
        t0, bucket_s = self.results.t0, self.results.bucket_s
        seconds = F.lit(t0) + F.col("b") * F.lit(bucket_s)
        return F.timestamp_micros(F.round(seconds * F.lit(MICROS_PER_S)).cast("long")).alias("bucket_start")

    def _keep(self, name: str, frame: DataFrame, order: Sequence[str | Column] = ()) -> ResultTable:
        """Collect a small result, ordered, for the report and the result files."""
        if order:
            frame = frame.orderBy(*order)
        rows = [{k: _utc(v) for k, v in row.asDict().items()} for row in frame.collect()]
        table = ResultTable(list(frame.columns), rows)
        self._put(name, table)
        return table

    # ------------------------------------------------------------------ GC lag

    def _eligible_since(self, objects: DataFrame, rounds: DataFrame) -> DataFrame:
        """(epoch, reached_at): the first round start at which M >= epoch, per object epoch.

        The first time M took each value, then a suffix minimum over M descending (the first
        time M was *at least* it: M is monotone per GC, rounds of several GCs or restarts need
        not be). Each M value covers the epochs above the next lower value, a range join of
        two small tables (distinct epochs × distinct M values)."""
        firsts = rounds.where(F.col("m").isNotNull()).groupBy("m").agg(F.min("started_at").alias("first_at"))
        from_above = Window.orderBy(F.col("m").desc()).rowsBetween(Window.unboundedPreceding, 0)
        steps = firsts.withColumn("reached_at", F.min("first_at").over(from_above)).withColumn(
            "m_below", F.lag("m").over(Window.orderBy("m"))
        )
        covers = (F.col("epoch") <= F.col("m")) & (
            F.col("m_below").isNull() | (F.col("epoch") > F.col("m_below"))
        )
        epochs = objects.select("epoch").distinct()
        return epochs.join(F.broadcast(steps), covers, "left").select("epoch", "reached_at")

    def _gc_lag(self, objects: DataFrame, deletions: DataFrame, rounds: DataFrame) -> None:
        eligible_at = F.when(F.col("reached_at").isNotNull(), F.greatest("created_at", "reached_at"))
        lag_s = F.col("deleted_at") - eligible_at
        lags = (
            objects.join(deletions, "key", "left")
            .join(F.broadcast(self._eligible_since(objects, rounds)), "epoch", "left")
            # One projection (each withColumn is a new plan the driver analyses again).
            .withColumns(
                {
                    "eligible_at": eligible_at,
                    "lag_s": lag_s,
                    "age_s": F.col("deleted_at") - F.col("created_at"),
                    "explained": lag_s.isNotNull() & (lag_s >= 0),
                }
            )
        )
        lags = self._cache(lags)
        deleted = F.col("deleted_at").isNotNull()
        lag = F.when(F.col("explained"), F.col("lag_s"))
        summary = lags.agg(
            _count().alias("objects"),
            F.coalesce(F.sum("size"), F.lit(0)).alias("bytes"),
            _count(deleted).alias("deleted"),
            F.coalesce(F.sum(F.when(deleted, F.col("size"))), F.lit(0)).alias("deleted_bytes"),
            _count(~deleted & F.col("eligible_at").isNotNull()).alias("eligible_live"),
            _count(deleted & ~F.col("explained")).alias("unexplained"),
            _count(F.col("explained")).alias("lags"),
            F.percentile_approx(lag, list(LAG_PERCENTILES), PERCENTILE_ACCURACY).alias("p"),
            F.max(lag).alias("lag_max"),
            F.avg(lag).alias("lag_mean"),
            F.percentile_approx("age_s", list(LAG_PERCENTILES), PERCENTILE_ACCURACY).alias("a"),
            F.max("age_s").alias("age_max"),
            F.avg("age_s").alias("age_mean"),
        ).collect()[0]
        p50, p90, p99 = summary["p"] or [None] * len(LAG_PERCENTILES)
        a50, a90, a99 = summary["a"] or [None] * len(LAG_PERCENTILES)
        figures = self.results.figures
        figures.update(
            l0_objects=summary["objects"],
            l0_bytes=summary["bytes"],
            l0_deleted=summary["deleted"],
            l0_deleted_bytes=summary["deleted_bytes"],
            l0_live_objects_end=summary["objects"] - summary["deleted"],
            l0_live_bytes_end=summary["bytes"] - summary["deleted_bytes"],
            l0_eligible_not_deleted=summary["eligible_live"],
            l0_deleted_unexplained=summary["unexplained"],
            gc_lag_count=summary["lags"],
            gc_lag_p50_s=p50,
            gc_lag_p90_s=p90,
            gc_lag_p99_s=p99,
            gc_lag_max_s=summary["lag_max"],
            gc_lag_mean_s=summary["lag_mean"],
            l0_age_p50_s=a50,
            l0_age_p90_s=a90,
            l0_age_p99_s=a99,
            l0_age_max_s=summary["age_max"],
            l0_age_mean_s=summary["age_mean"],
        )
        summary_rows = [
            {"figure": name, "value": None if figures[name] is None else float(figures[name])}
            for name in (
                "gc_lag_count",
                "gc_lag_p50_s",
                "gc_lag_p90_s",
                "gc_lag_p99_s",
                "gc_lag_max_s",
                "gc_lag_mean_s",
                "l0_age_p50_s",
                "l0_age_p90_s",
                "l0_age_p99_s",
                "l0_age_max_s",
                "l0_age_mean_s",
                "l0_objects",
                "l0_bytes",
                "l0_deleted",
                "l0_deleted_bytes",
                "l0_eligible_not_deleted",
                "l0_deleted_unexplained",
            )
        ]
        self._put("gc_lag_summary", ResultTable(["figure", "value"], summary_rows))
        self._histogram("gc_lag_histogram", lags.where(F.col("explained")), "lag_s", summary["lag_max"])
        self._histogram(
            "l0_age_histogram", lags.where(F.col("age_s").isNotNull()), "age_s", summary["age_max"]
        )

    def _histogram(self, name: str, frame: DataFrame, column: str, top: float | None) -> None:
        """HISTOGRAM_BINS equal bins from 0 to `top` of `column` (objects per bin)."""
        columns = ["bin_lo_s", "bin_hi_s", "objects"]
        if top is None:
            self._put(name, ResultTable(columns, []))
            return
        lag_max = max(top, 0.0)
        bins = HISTOGRAM_BINS if lag_max > 0 else 1
        width = lag_max / bins if lag_max > 0 else 1.0
        last_bin = F.lit(bins - 1)
        counts = (
            frame.select(
                F.least(F.floor(F.greatest(F.col(column), F.lit(0.0)) / width), last_bin)
                .cast("long")
                .alias("bin")
            )
            .groupBy("bin")
            .agg(_count().alias("objects"))
        )
        histogram = (
            self.spark.range(bins)
            .withColumnRenamed("id", "bin")
            .join(counts, "bin", "left")
            .select(
                (F.col("bin") * width).alias("bin_lo_s"),
                ((F.col("bin") + 1) * width).alias("bin_hi_s"),
                F.coalesce("objects", F.lit(0)).alias("objects"),
            )
        )
        self._keep(name, histogram, order=["bin_lo_s"])

    def _gc_rounds_over_time(self, rounds: DataFrame) -> None:
        """Rounds per bucket; the totals are sums and maxima over the buckets, collected with
        them (one job)."""
        real = ~F.col("dry_run")
        columns = [
            "bucket_start",
            "rounds",
            "cluster_epoch",
            "m",
            "cluster_lag_epochs",
            "deleted",
            "deleted_bytes",
        ]
        per_bucket = (
            rounds.withColumn("b", self._bucket("started_at"))
            .groupBy("b")
            .agg(
                _count().alias("rounds"),
                F.max("cluster_epoch").alias("cluster_epoch"),
                F.max("m").alias("m"),
                F.sum(F.when(real, F.col("deleted")).otherwise(0)).alias("deleted"),
                F.sum(F.when(real, F.col("deleted_bytes")).otherwise(0)).alias("deleted_bytes"),
                _count(F.col("dry_run")).alias("dry_runs"),
                _count(F.col("m").isNull()).alias("blocked"),
            )
            .select(
                self._bucket_start(),
                "rounds",
                "cluster_epoch",
                "m",
                (F.col("cluster_epoch") - F.col("m")).alias("cluster_lag_epochs"),
                "deleted",
                "deleted_bytes",
                "dry_runs",
                "blocked",
            )
        )
        collected = self._keep("gc_rounds_over_time", per_bucket, order=["bucket_start"])
        rows = collected.rows
        self._put("gc_rounds_over_time", ResultTable(columns, [{c: row[c] for c in columns} for row in rows]))
        self.results.figures.update(
            gc_rounds=sum(r["rounds"] for r in rows),
            gc_dry_runs=sum(r["dry_runs"] for r in rows),
            gc_blocked_rounds=sum(r["blocked"] for r in rows),
            gc_m_max=max((r["m"] for r in rows if r["m"] is not None), default=None),
            cluster_epoch_max=max(
                (r["cluster_epoch"] for r in rows if r["cluster_epoch"] is not None), default=None
            ),
        )

    # ------------------------------------------------------------------ storage

    def _storage(self, objects: DataFrame, deletions: DataFrame, l1: DataFrame) -> None:
        """Live bytes per bucket as running sums of +size (created / copied) and -size
        (deleted / deleting) events."""
        zero = F.lit(0).cast("long")

        def deltas(frame: DataFrame, at: str, sign: int, l0: bool) -> DataFrame:
            size = F.col("size") * sign
            return frame.select(
                self._bucket(at).alias("b"),
                (size if l0 else zero).alias("l0_bytes"),
                F.lit(sign if l0 else 0).cast("long").alias("l0_objects"),
                (zero if l0 else size).alias("l1_bytes"),
            )

        lifetimes = (
            l1.groupBy("key")
            .agg(
                F.max("size").alias("size"),
                F.min(F.when(F.col("state") == "COPY_FINISHED", F.col("updated_at"))).alias("live_from"),
                F.min(F.when(F.col("state").isin(*L1_LIVE_UNTIL_STATES), F.col("updated_at"))).alias(
                    "live_until"
                ),
            )
            .where(F.col("live_from").isNotNull())
        )
        events = (
            deltas(objects, "created_at", 1, l0=True)
            .unionByName(deltas(objects.join(deletions, "key"), "deleted_at", -1, l0=True))
            .unionByName(deltas(lifetimes, "live_from", 1, l0=False))
            .unionByName(deltas(lifetimes.where(F.col("live_until").isNotNull()), "live_until", -1, l0=False))
            .groupBy("b")
            .agg(*[F.sum(c).alias(c) for c in ("l0_bytes", "l0_objects", "l1_bytes")])
        )
        running = Window.orderBy("b").rowsBetween(Window.unboundedPreceding, 0)

        def live(c: str) -> Column:
            return F.sum(F.coalesce(c, F.lit(0))).over(running)

        over_time = (
            self.grid.join(events, "b", "left")
            .select(
                self._bucket_start(),
                live("l0_objects").alias("l0_live_objects"),
                live("l0_bytes").alias("l0_live_bytes"),
                live("l1_bytes").alias("l1_live_bytes"),
            )
            .withColumn(
                "amplification",
                F.when(
                    F.col("l1_live_bytes") > 0,
                    (F.col("l0_live_bytes") + F.col("l1_live_bytes")) / F.col("l1_live_bytes"),
                ),
            )
        )
        table = self._keep("storage_over_time", over_time, order=["bucket_start"])
        rows = table.rows
        amplifications = [r["amplification"] for r in rows if r["amplification"] is not None]
        self.results.figures.update(
            l0_live_bytes_peak=max((r["l0_live_bytes"] for r in rows), default=None),
            l1_live_bytes_end=rows[-1]["l1_live_bytes"] if rows else None,
            amplification_peak=max(amplifications, default=None),
            amplification_end=rows[-1]["amplification"] if rows else None,
        )

    # ------------------------------------------------------------------ partition states

    def _partition_states(self, samples: DataFrame) -> None:
        """Each partition's latest sample as of each bucket's end (forward-filled over the
        grid from its first sample on), then per bucket and per partition."""
        state = ["mp", "max_applied_epoch", "lro", "high_watermark"]
        last_in_bucket = (
            samples.withColumn("b", self._bucket("sampled_at"))
            .groupBy("topic", "partition", "b")
            .agg(F.max_by(F.struct(*state), F.struct("sampled_at", "seq")).alias("s"))
        )
        as_of = (
            Window.partitionBy("topic", "partition").orderBy("b").rowsBetween(Window.unboundedPreceding, 0)
        )
        filled = (
            samples.select("topic", "partition")
            .distinct()
            .crossJoin(self.grid)
            .join(last_in_bucket, ["topic", "partition", "b"], "left")
            .withColumn("s", F.last("s", ignorenulls=True).over(as_of))
            .where(F.col("s").isNotNull())
            .select("topic", "partition", "b", *[F.col(f"s.{c}").alias(c) for c in state])
            .withColumns(
                {
                    "lag_epochs": F.col("max_applied_epoch") - F.col("mp"),
                    "unreconciled": F.col("high_watermark") - 1 - F.col("lro"),
                }
            )
        )
        filled = self._cache(filled)
        m = F.when(F.col("without_mp") == 0, F.col("mp_min"))
        per_bucket = (
            filled.groupBy("b")
            .agg(
                _count().alias("partitions"),
                _count(F.col("mp").isNull()).alias("without_mp"),
                F.min("mp").alias("mp_min"),
                F.max("max_applied_epoch").alias("max_applied_epoch"),
                F.max("lag_epochs").alias("partition_lag_max"),
                F.avg("lag_epochs").alias("partition_lag_mean"),
                F.sum("unreconciled").alias("unreconciled_total"),
                F.max("unreconciled").alias("unreconciled_max"),
            )
            .withColumns({"m": m, "cluster_lag_epochs": F.col("max_applied_epoch") - m})
        )
        per_bucket = self._cache(per_bucket)
        watermark_columns = [
            "bucket_start",
            "partitions",
            "without_mp",
            "m",
            "max_applied_epoch",
            "cluster_lag_epochs",
            "partition_lag_max",
            "partition_lag_mean",
        ]
        reconciler_columns = ["bucket_start", "partitions", "unreconciled_total", "unreconciled_max"]
        # Both per-bucket results in one collect (one job), split here.
        both = self._keep(
            "watermark_over_time",
            per_bucket.select(self._bucket_start(), *watermark_columns[1:], *reconciler_columns[2:]),
            order=["bucket_start"],
        )
        watermarks = ResultTable(watermark_columns, [{c: r[c] for c in watermark_columns} for r in both.rows])
        reconciler = ResultTable(
            reconciler_columns, [{c: r[c] for c in reconciler_columns} for r in both.rows]
        )
        self._put("watermark_over_time", watermarks)
        self._put("reconciler_lag_over_time", reconciler)
        holds_m = F.when(F.col("without_mp") > 0, F.col("mp").isNull()).otherwise(
            F.col("mp") == F.col("mp_min")
        )
        # A partition holds M back in a bucket when it is at the minimum (or without an M(p))
        # while another partition is not: when every partition is tied, none is singled out.
        in_bucket = Window.partitionBy("b")
        held = (
            filled.join(per_bucket.select("b", "partitions", "without_mp", "mp_min"), "b")
            .withColumn("holds", holds_m)
            .withColumn("holders", F.sum(F.col("holds").cast("long")).over(in_bucket))
            .where(F.col("holds") & (F.col("holders") < F.col("partitions")))
            .groupBy("topic", "partition")
            .agg(_count().alias("buckets_holding_m"))
        )
        bucket_s = self.results.bucket_s
        sampled_buckets = max(1, len(watermarks.rows))
        holding = F.coalesce("buckets_holding_m", F.lit(0))
        per_partition = (
            filled.groupBy("topic", "partition")
            .agg(
                F.max("lag_epochs").alias("lag_epochs_max"),
                F.avg("lag_epochs").alias("lag_epochs_mean"),
                F.max("unreconciled").alias("unreconciled_max"),
                F.max_by("mp", "b").alias("mp_end"),
                F.max_by("max_applied_epoch", "b").alias("max_applied_epoch_end"),
            )
            .join(held, ["topic", "partition"], "left")
            .withColumns(
                {
                    "buckets_holding_m": holding,
                    "seconds_holding_m": holding * F.lit(bucket_s),
                    "share_holding_m": holding / F.lit(sampled_buckets),
                }
            )
        )
        holders = self._keep(
            "partition_watermarks",
            per_partition,
            order=[F.col("seconds_holding_m").desc(), "topic", "partition"],
        )
        lags = [r["cluster_lag_epochs"] for r in watermarks.rows if r["cluster_lag_epochs"] is not None]
        totals = [r["unreconciled_total"] for r in reconciler.rows]
        top = holders.rows[0] if holders.rows and holders.rows[0]["buckets_holding_m"] else None
        self.results.figures.update(
            sampled_partitions=len(holders.rows),
            watermark_lag_max_epochs=max(lags, default=None),
            watermark_lag_end_epochs=lags[-1] if lags else None,
            top_m_holder=None if top is None else f"{top['topic']}/{top['partition']}",
            top_m_holder_seconds=None if top is None else top["seconds_holding_m"],
            reconciler_lag_max_records=max(totals, default=None),
            reconciler_lag_end_records=totals[-1] if totals else None,
        )

    # ------------------------------------------------------------------ fence

    def _fence(self, events: DataFrame) -> None:
        rejected = F.col("outcome") == "rejected"
        windowed = events.where(F.col("window_max").isNotNull())
        known = self._footer_range(("fence_events", "window_max"))  # no job where they tell
        if known is None:
            bounds = windowed.agg(F.min("window_max").alias("lo"), F.max("window_max").alias("hi"))
            lo, hi = bounds.collect()[0]
        else:
            lo, hi = known if known[0] <= known[1] else (None, None)
        if lo is not None:
            # Epoch ranges of equal width, at most FENCE_RANGES_MAX of them, whatever the history.
            width = max(1, math.ceil((hi - lo + 1) / FENCE_RANGES_MAX))
            start = F.lit(lo) + F.floor((F.col("window_max") - F.lit(lo)) / width) * width
            by_window = (
                windowed.withColumn("window_max_from", start.cast("long"))
                .groupBy("window_max_from")
                .agg(
                    _decisions().alias("events"),
                    _decisions(rejected).alias("rejected"),
                    _decisions(F.col("outcome") == "admitted_new_epoch").alias("slides"),
                    F.countDistinct("topic", "partition").alias("partitions"),
                )
                .withColumn(
                    "window_max_to",
                    F.least(F.col("window_max_from") + F.lit(width - 1), F.lit(hi)).cast("long"),
                )
                .withColumn("rejection_rate", F.col("rejected") / F.col("events"))
                .select(*FENCE_BY_WINDOW_COLUMNS)
            )
            self._keep("fence_by_window", by_window, order=["window_max_from"])
            self.results.figures["fence_epochs_per_range"] = width
        else:
            self._put("fence_by_window", ResultTable(list(FENCE_BY_WINDOW_COLUMNS), []))
        window_size = F.col("window_max") - F.col("window_min") + 1
        sizes = (
            events.where(F.col("window_min").isNotNull() & F.col("window_max").isNotNull())
            .groupBy(window_size.alias("window_size"))
            .agg(_decisions().alias("events"), _decisions(rejected).alias("rejected"))
        )
        size_table = self._keep("fence_window_sizes", sizes, order=["window_size"])
        outcomes = self._keep(
            "fence_outcomes",
            events.groupBy("outcome").agg(_decisions().alias("events")),
            order=["outcome"],
        )
        total = sum(r["events"] for r in outcomes.rows)
        rejections = sum(r["events"] for r in outcomes.rows if r["outcome"] == "rejected")
        self.results.figures.update(
            fence_events=total,
            fence_rejected=rejections,
            fence_rejection_rate=rejections / total if total else None,
            window_size_max=max((r["window_size"] for r in size_table.rows), default=None),
        )

    # ------------------------------------------------------------------ throughput

    def _throughput(self, log_entries: DataFrame) -> None:
        bucket_s = self.results.bucket_s
        per_bucket = (
            log_entries.where(F.col("kind") == "placeholder")
            .withColumn("b", self._bucket("appended_at"))
            .groupBy("topic", "partition", "b")
            .agg(
                F.sum("record_count").alias("records"),
                F.sum("byte_length").alias("bytes"),
                _count().alias("placeholders"),
            )
        )
        per_bucket = self._cache(per_bucket)
        path = join(self.out_dir, "tables", "throughput_partition_buckets")
        per_partition_buckets = per_bucket.select(
            "topic",
            "partition",
            self._bucket_start(),
            "records",
            "bytes",
            "placeholders",
            (F.col("records") / bucket_s).alias("records_per_s"),
            (F.col("bytes") / bucket_s).alias("bytes_per_s"),
        )

        def write() -> None:
            with self._timestamps_as_micros():
                per_partition_buckets.write.mode("overwrite").parquet(spark_uri(path))

        self._large_writes.append(write)
        self.results.spark_tables["throughput_partition_buckets"] = path
        totals = per_bucket.groupBy("b").agg(
            F.sum("records").alias("records"),
            F.sum("bytes").alias("bytes"),
            _count().alias("active_partitions"),
        )
        over_time = (
            self.grid.join(totals, "b", "left")
            .select(
                self._bucket_start(),
                F.coalesce("records", F.lit(0)).alias("records"),
                F.coalesce("bytes", F.lit(0)).alias("bytes"),
                F.coalesce("active_partitions", F.lit(0)).alias("active_partitions"),
            )
            .withColumns(
                {
                    "records_per_s": F.col("records") / bucket_s,
                    "bytes_per_s": F.col("bytes") / bucket_s,
                }
            )
        )
        series = self._keep("throughput_over_time", over_time, order=["bucket_start"])
        by_partition = per_bucket.groupBy("topic", "partition").agg(
            F.sum("records").alias("records"),
            F.sum("bytes").alias("bytes"),
            F.sum("placeholders").alias("placeholders"),
            (F.max("records") / bucket_s).alias("peak_records_per_s"),
            (F.max("bytes") / bucket_s).alias("peak_bytes_per_s"),
        )
        partitions = self._keep(
            "throughput_by_partition",
            by_partition,
            order=[F.col("bytes").desc(), "topic", "partition"],
        )
        self.results.figures.update(
            records_total=sum(r["records"] for r in partitions.rows),
            bytes_total=sum(r["bytes"] for r in partitions.rows),
            partitions=len(partitions.rows),
            records_per_s_peak=max((r["records_per_s"] for r in series.rows), default=None),
            bytes_per_s_peak=max((r["bytes_per_s"] for r in series.rows), default=None),
        )
