"""The "levelzero" data source as a sink, in a Spark of its own (local[2,3]: a failed task is
retried): a write whose tasks fail after producing part of their rows, retried by Spark, stores
every record once; a stream of one topic written to another with writeStream."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import anyio
from daemon_support import clean_environ, daemon_and_client
from test_spark_source import SLOW

JOB = """
import sys
from levelzero.export.spark_datasource import register
from pyspark import TaskContext
from pyspark.sql import SparkSession, functions as F

url, data_dir, checkpoint = sys.argv[1:4]
spark = (
    SparkSession.builder.master("local[2,3]").config("spark.ui.enabled", "false")
    .config("spark.ui.showConsoleProgress", "false")
    .config("spark.sql.execution.arrow.maxRecordsPerBatch", "10").getOrCreate()
)
spark.sparkContext.setLogLevel("FATAL")
register(spark)


@F.udf("binary")
def value_of(i):
    if TaskContext.get().attemptNumber() == 0 and i % 2000 == 1990:
        raise RuntimeError("a task failing after it produced records")
    return f"v{i}".encode()


rows = spark.range(0, 4000, numPartitions=2).select(
    value_of("id").alias("value"), F.col("id").cast("string").alias("key"),
    (F.col("id") % 2).cast("int").alias("partition"),
)
writer = rows.write.format("levelzero").option("url", url).option("records_per_request", "100")
writer.mode("append").save("w")

stream = spark.readStream.format("levelzero").option("data_dir", data_dir).load("w")
query = (
    stream.writeStream.format("levelzero").option("url", url).option("checkpointLocation", checkpoint)
    .trigger(availableNow=True).start("copy")
)
query.awaitTermination()
"""


async def topic_values(client, topic: str, partitions: int) -> list[tuple[int, bytes | None, bytes | None]]:
    out = []
    for partition in range(partitions):
        offset = 0
        while True:
            fetched = await client.fetch(topic, partition, offset)
            if not fetched.records:
                break
            out += [(partition, r.key, r.value) for r in fetched.records]
            offset = fetched.next_offset
    return sorted(out)


def produces_served(metrics: str) -> int:
    match = re.search(r"^levelzero_produce_latency_seconds_count(?:\{[^}]*\})? (\S+)$", metrics, re.M)
    assert match, metrics[:2000]
    return int(float(match.group(1)))


def test_a_write_retried_after_its_tasks_failed_stores_each_record_once(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    data_dir = tmp_path / "data"
    data_dir.mkdir()

    async def scenario() -> None:
        async with daemon_and_client(data_dir, **SLOW) as (daemon, client):
            await client.create_topic("w", 2)
            await client.create_topic("copy", 2)
            env = clean_environ(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
            done = await anyio.to_thread.run_sync(
                lambda: subprocess.run(
                    [sys.executable, str(script), daemon.url, str(data_dir), str(tmp_path / "cp")],
                    env=env,
                    capture_output=True,
                    timeout=600,
                )
            )
            assert done.returncode == 0, done.stderr.decode()[-3000:]
            expected = sorted((i % 2, str(i).encode(), f"v{i}".encode()) for i in range(4000))
            got = await topic_values(client, "w", 2)
            assert got == expected  # each record once
            # Each task produced before it failed (100 records a produce): its retry sent those
            # produces again, answered as already stored. 40 produces without a retry, plus
            # the copy's (one per partition).
            served = produces_served(await client.metrics())
            copied = await topic_values(client, "copy", 2)
            assert copied == expected  # the stream's rows, partition for partition
            assert served > 40 + 2, served

    anyio.run(scenario)
