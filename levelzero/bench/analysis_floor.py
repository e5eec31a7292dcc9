"""The analysis item's floor: the same result tables as `levelzero analyze`, written by hand.

What a Spark user would write to get the report's numbers from the export directory: each table
read from its Parquet files, times as unix seconds, the same time grid (`bucket_s` from the
earliest to the latest time of any table), and the same 14 results: the GC-lag/age summary and
both histograms, GC rounds, live storage, watermarks, reconciler lag and the holders of M,
fence results by window, window size and outcome, throughput per partition and bucket (written
as Parquet, as the analysis writes it), per bucket and per partition. The small results are
collected and written as Parquet; no plots, no report. Its wall time against `analyze()`'s is
the item's honest ratio: the same tables both ways.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

BUCKETS_MAX = 240
BINS = 20
RANGES_MAX = 200
PERCENTILES = [0.5, 0.9, 0.99]
NICE_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
TIMES = {
    "log_entries": "appended_at",
    "l0_objects": "created_at",
    "l0_deletions": "deleted_at",
    "gc_rounds": "started_at",
    "state_samples": "sampled_at",
    "fence_events": "decided_at",
    "l1_objects": "updated_at",
}


def floor_tables(spark: SparkSession, export_dir: str, out_dir: str) -> dict[str, int]:
    """The 14 result tables of `export_dir` into `out_dir`; their row counts."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    def read(name: str) -> DataFrame | None:
        path = os.path.join(export_dir, name)
        if not os.path.isdir(path):
            return None
        frame = spark.read.parquet(f"file://{path}")
        return frame.select(
            *[
                (F.unix_micros(c) / 1e6).alias(c) if t.startswith("timestamp") else F.col(c)
                for c, t in frame.dtypes
            ]
        )

    frames = {name: read(name) for name in TIMES}
    present = {name: frame for name, frame in frames.items() if frame is not None}
    times = None
    for name, frame in present.items():
        part = frame.select(F.col(TIMES[name]).alias("t"))
        times = part if times is None else times.unionByName(part)
    assert times is not None
    lo, hi = times.agg(F.min("t"), F.max("t")).collect()[0]
    bucket_s = next((float(b) for b in NICE_S if (hi - lo) / b < BUCKETS_MAX), 86400.0)
    t0 = math.floor(lo / bucket_s) * bucket_s
    buckets = int((hi - t0) // bucket_s) + 1
    grid = spark.range(buckets).withColumnRenamed("id", "b")

    def bucket(c: str) -> Column:
        return F.floor((F.col(c) - t0) / bucket_s).cast("long")

    start = F.timestamp_micros(F.round((F.lit(t0) + F.col("b") * bucket_s) * 1e6).cast("long")).alias(
        "bucket_start"
    )
    out: dict[str, int] = {}

    def keep(name: str, frame: DataFrame) -> None:
        rows = frame.collect()
        pq.write_table(
            pa.Table.from_pylist([r.asDict() for r in rows]), os.path.join(out_dir, f"{name}.parquet")
        )
        out[name] = len(rows)

    objects, deletions, rounds = present["l0_objects"], present["l0_deletions"], present["gc_rounds"]
    # GC lag: eligible when a round first saw M >= the object's epoch.
    firsts = rounds.where(F.col("m").isNotNull()).groupBy("m").agg(F.min("started_at").alias("at"))
    firsts = firsts.withColumn(
        "reached",
        F.min("at").over(Window.orderBy(F.col("m").desc()).rowsBetween(Window.unboundedPreceding, 0)),
    ).withColumn("below", F.lag("m").over(Window.orderBy("m")))
    epochs = objects.select("epoch").distinct()
    covers = (F.col("epoch") <= F.col("m")) & (F.col("below").isNull() | (F.col("epoch") > F.col("below")))
    eligible = epochs.join(F.broadcast(firsts), covers, "left").select("epoch", "reached")
    lags = (
        objects.join(deletions, "key", "left")
        .join(F.broadcast(eligible), "epoch", "left")
        .withColumn("eligible_at", F.when(F.col("reached").isNotNull(), F.greatest("created_at", "reached")))
        .withColumn("lag", F.col("deleted_at") - F.col("eligible_at"))
        .withColumn("age", F.col("deleted_at") - F.col("created_at"))
        .withColumn("ok", F.col("lag").isNotNull() & (F.col("lag") >= 0))
        .cache()
    )
    lag = F.when(F.col("ok"), F.col("lag"))
    summary = lags.agg(
        F.count(F.lit(1)).alias("objects"),
        F.sum("size").alias("bytes"),
        F.count("deleted_at").alias("deleted"),
        F.sum(F.when(F.col("deleted_at").isNotNull(), F.col("size"))).alias("deleted_bytes"),
        F.count(F.when(F.col("deleted_at").isNull() & F.col("eligible_at").isNotNull(), 1)).alias("eligible"),
        F.count(F.when(F.col("deleted_at").isNotNull() & ~F.col("ok"), 1)).alias("unexplained"),
        F.count(lag).alias("lags"),
        F.percentile_approx(lag, PERCENTILES, 10_000).alias("p"),
        F.max(lag).alias("lag_max"),
        F.avg(lag).alias("lag_mean"),
        F.percentile_approx("age", PERCENTILES, 10_000).alias("a"),
        F.max("age").alias("age_max"),
        F.avg("age").alias("age_mean"),
    ).collect()[0]
    figures = {k: v for k, v in summary.asDict().items() if k not in ("p", "a")}
    figures.update(
        {f"lag_p{int(p * 100)}": v for p, v in zip(PERCENTILES, summary["p"] or [None] * 3, strict=True)}
    )
    figures.update(
        {f"age_p{int(p * 100)}": v for p, v in zip(PERCENTILES, summary["a"] or [None] * 3, strict=True)}
    )
    pq.write_table(
        pa.table(
            {"figure": list(figures), "value": [None if v is None else float(v) for v in figures.values()]}
        ),
        os.path.join(out_dir, "gc_lag_summary.parquet"),
    )
    out["gc_lag_summary"] = len(figures)
    for name, column, top in (
        ("gc_lag_histogram", "lag", summary["lag_max"]),
        ("l0_age_histogram", "age", summary["age_max"]),
    ):
        width = max(top or 0.0, 0.0) / BINS or 1.0
        counts = (
            lags.where(F.col(column).isNotNull() & (F.col("ok") if column == "lag" else F.lit(True)))
            .groupBy(
                F.least(F.floor(F.greatest(column, F.lit(0.0)) / width), F.lit(BINS - 1))
                .cast("long")
                .alias("bin")
            )
            .count()
        )
        keep(
            name,
            spark.range(BINS)
            .withColumnRenamed("id", "bin")
            .join(counts, "bin", "left")
            .select(
                (F.col("bin") * width).alias("bin_lo_s"),
                ((F.col("bin") + 1) * width).alias("bin_hi_s"),
                F.coalesce("count", F.lit(0)).alias("objects"),
            )
            .orderBy("bin_lo_s"),
        )
    real = ~F.col("dry_run")
    keep(
        "gc_rounds_over_time",
        rounds.groupBy(bucket("started_at").alias("b"))
        .agg(
            F.count(F.lit(1)).alias("rounds"),
            F.max("cluster_epoch").alias("cluster_epoch"),
            F.max("m").alias("m"),
            F.sum(F.when(real, F.col("deleted")).otherwise(0)).alias("deleted"),
            F.sum(F.when(real, F.col("deleted_bytes")).otherwise(0)).alias("deleted_bytes"),
        )
        .select(
            start,
            "rounds",
            "cluster_epoch",
            "m",
            (F.col("cluster_epoch") - F.col("m")).alias("lag"),
            "deleted",
            "deleted_bytes",
        )
        .orderBy("bucket_start"),
    )
    # Live storage: running sums of sizes in and out.
    events = objects.select(
        bucket("created_at").alias("b"), F.col("size").alias("l0"), F.lit(1).alias("n"), F.lit(0).alias("l1")
    )
    events = events.unionByName(
        objects.join(deletions, "key").select(
            bucket("deleted_at").alias("b"),
            (-F.col("size")).alias("l0"),
            F.lit(-1).alias("n"),
            F.lit(0).alias("l1"),
        )
    )
    if "l1_objects" in present:
        life = (
            present["l1_objects"]
            .groupBy("key")
            .agg(
                F.max("size").alias("size"),
                F.min(F.when(F.col("state") == "COPY_FINISHED", F.col("updated_at"))).alias("on"),
                F.min(
                    F.when(F.col("state").isin("DELETE_STARTED", "DELETE_FINISHED"), F.col("updated_at"))
                ).alias("off"),
            )
            .where(F.col("on").isNotNull())
        )
        events = events.unionByName(
            life.select(
                bucket("on").alias("b"), F.lit(0).alias("l0"), F.lit(0).alias("n"), F.col("size").alias("l1")
            )
        )
        events = events.unionByName(
            life.where(F.col("off").isNotNull()).select(
                bucket("off").alias("b"),
                F.lit(0).alias("l0"),
                F.lit(0).alias("n"),
                (-F.col("size")).alias("l1"),
            )
        )
    running = Window.orderBy("b").rowsBetween(Window.unboundedPreceding, 0)
    totals = events.groupBy("b").agg(F.sum("l0").alias("l0"), F.sum("n").alias("n"), F.sum("l1").alias("l1"))
    storage = grid.join(totals, "b", "left").select(
        start,
        F.sum(F.coalesce("n", F.lit(0))).over(running).alias("l0_live_objects"),
        F.sum(F.coalesce("l0", F.lit(0))).over(running).alias("l0_live_bytes"),
        F.sum(F.coalesce("l1", F.lit(0))).over(running).alias("l1_live_bytes"),
    )
    keep(
        "storage_over_time",
        storage.withColumn(
            "amplification",
            F.when(
                F.col("l1_live_bytes") > 0,
                (F.col("l0_live_bytes") + F.col("l1_live_bytes")) / F.col("l1_live_bytes"),
            ),
        ).orderBy("bucket_start"),
    )
    # Partition states: each partition's latest sample by each bucket's end.
    samples = present["state_samples"]
    cols = ["mp", "max_applied_epoch", "lro", "high_watermark"]
    last = samples.groupBy("topic", "partition", bucket("sampled_at").alias("b")).agg(
        F.max_by(F.struct(*cols), F.struct("sampled_at", "seq")).alias("s")
    )
    filled = (
        samples.select("topic", "partition")
        .distinct()
        .crossJoin(grid)
        .join(last, ["topic", "partition", "b"], "left")
        .withColumn(
            "s",
            F.last("s", ignorenulls=True).over(
                Window.partitionBy("topic", "partition")
                .orderBy("b")
                .rowsBetween(Window.unboundedPreceding, 0)
            ),
        )
        .where(F.col("s").isNotNull())
        .select("topic", "partition", "b", *[F.col(f"s.{c}").alias(c) for c in cols])
        .withColumn("lag", F.col("max_applied_epoch") - F.col("mp"))
        .withColumn("behind", F.col("high_watermark") - 1 - F.col("lro"))
        .cache()
    )
    per_bucket = (
        filled.groupBy("b")
        .agg(
            F.count(F.lit(1)).alias("partitions"),
            F.count(F.when(F.col("mp").isNull(), 1)).alias("without_mp"),
            F.min("mp").alias("mp_min"),
            F.max("max_applied_epoch").alias("max_applied_epoch"),
            F.max("lag").alias("partition_lag_max"),
            F.avg("lag").alias("partition_lag_mean"),
            F.sum("behind").alias("unreconciled_total"),
            F.max("behind").alias("unreconciled_max"),
        )
        .withColumn("m", F.when(F.col("without_mp") == 0, F.col("mp_min")))
        .cache()
    )
    keep(
        "watermark_over_time",
        per_bucket.select(
            start,
            "partitions",
            "without_mp",
            "m",
            "max_applied_epoch",
            (F.col("max_applied_epoch") - F.col("m")).alias("cluster_lag_epochs"),
            "partition_lag_max",
            "partition_lag_mean",
        ).orderBy("bucket_start"),
    )
    keep(
        "reconciler_lag_over_time",
        per_bucket.select(start, "partitions", "unreconciled_total", "unreconciled_max").orderBy(
            "bucket_start"
        ),
    )
    holds = F.when(F.col("without_mp") > 0, F.col("mp").isNull()).otherwise(F.col("mp") == F.col("mp_min"))
    held = (
        filled.join(per_bucket.select("b", "partitions", "without_mp", "mp_min"), "b")
        .withColumn("holds", holds)
        .withColumn("holders", F.sum(F.col("holds").cast("long")).over(Window.partitionBy("b")))
        .where(F.col("holds") & (F.col("holders") < F.col("partitions")))
        .groupBy("topic", "partition")
        .agg(F.count(F.lit(1)).alias("held"))
    )
    keep(
        "partition_watermarks",
        filled.groupBy("topic", "partition")
        .agg(
            F.max("lag").alias("lag_max"),
            F.avg("lag").alias("lag_mean"),
            F.max("behind").alias("behind_max"),
            F.max_by("mp", "b").alias("mp_end"),
        )
        .join(held, ["topic", "partition"], "left")
        .withColumn("seconds_holding_m", F.coalesce("held", F.lit(0)) * bucket_s)
        .orderBy(F.col("seconds_holding_m").desc(), "topic", "partition"),
    )
    # Fence decisions.
    fence = present["fence_events"]
    n = F.col("decisions").cast("long")
    rejected = F.col("outcome") == "rejected"
    w_lo, w_hi = fence.agg(F.min("window_max"), F.max("window_max")).collect()[0]
    width = max(1, math.ceil((w_hi - w_lo + 1) / RANGES_MAX))
    keep(
        "fence_by_window",
        fence.where(F.col("window_max").isNotNull())
        .groupBy(
            (F.lit(w_lo) + F.floor((F.col("window_max") - w_lo) / width) * width)
            .cast("long")
            .alias("window_max_from")
        )
        .agg(
            F.sum(n).alias("events"),
            F.sum(F.when(rejected, n).otherwise(0)).alias("rejected"),
            F.sum(F.when(F.col("outcome") == "admitted_new_epoch", n).otherwise(0)).alias("slides"),
            F.countDistinct("topic", "partition").alias("partitions"),
        )
        .withColumn("window_max_to", F.least(F.col("window_max_from") + width - 1, F.lit(w_hi)))
        .withColumn("rejection_rate", F.col("rejected") / F.col("events"))
        .orderBy("window_max_from"),
    )
    keep(
        "fence_window_sizes",
        fence.groupBy((F.col("window_max") - F.col("window_min") + 1).alias("window_size"))
        .agg(F.sum(n).alias("events"), F.sum(F.when(rejected, n).otherwise(0)).alias("rejected"))
        .where(F.col("window_size").isNotNull())
        .orderBy("window_size"),
    )
    keep("fence_outcomes", fence.groupBy("outcome").agg(F.sum(n).alias("events")).orderBy("outcome"))
    # Throughput.
    per_partition = (
        present["log_entries"]
        .where(F.col("kind") == "placeholder")
        .groupBy("topic", "partition", bucket("appended_at").alias("b"))
        .agg(
            F.sum("record_count").alias("records"),
            F.sum("byte_length").alias("bytes"),
            F.count(F.lit(1)).alias("placeholders"),
        )
        .cache()
    )
    per_partition.select(
        "topic",
        "partition",
        start,
        "records",
        "bytes",
        "placeholders",
        (F.col("records") / bucket_s).alias("records_per_s"),
        (F.col("bytes") / bucket_s).alias("bytes_per_s"),
    ).write.mode("overwrite").parquet(f"file://{os.path.join(out_dir, 'throughput_partition_buckets')}")
    out["throughput_partition_buckets"] = -1  # written by Spark, not collected
    keep(
        "throughput_over_time",
        grid.join(
            per_partition.groupBy("b").agg(
                F.sum("records").alias("records"),
                F.sum("bytes").alias("bytes"),
                F.count(F.lit(1)).alias("active"),
            ),
            "b",
            "left",
        )
        .select(
            start,
            F.coalesce("records", F.lit(0)).alias("records"),
            F.coalesce("bytes", F.lit(0)).alias("bytes"),
            F.coalesce("active", F.lit(0)).alias("active_partitions"),
        )
        .withColumn("records_per_s", F.col("records") / bucket_s)
        .withColumn("bytes_per_s", F.col("bytes") / bucket_s)
        .orderBy("bucket_start"),
    )
    keep(
        "throughput_by_partition",
        per_partition.groupBy("topic", "partition")
        .agg(
            F.sum("records").alias("records"),
            F.sum("bytes").alias("bytes"),
            F.sum("placeholders").alias("placeholders"),
            (F.max("records") / bucket_s).alias("peak_records_per_s"),
            (F.max("bytes") / bucket_s).alias("peak_bytes_per_s"),
        )
        .orderBy(F.col("bytes").desc(), "topic", "partition"),
    )
    for frame in (lags, filled, per_bucket, per_partition):
        frame.unpersist()
    return out
