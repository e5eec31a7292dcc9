"""Structured Streaming with the "levelzero" data source: a query killed with SIGKILL mid-stream
and restarted from its checkpoint writes every record to its file sink exactly once; the
stream's offsets, startingOffsets and the per-trigger limit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from daemon_support import clean_environ, daemon_and_client
from test_spark_source import SLOW, spark  # noqa: F401 - the module's Spark session fixture

from levelzero.export.errors import ExportError
from levelzero.export.spark_stream import limited, partition_bounds, starting_offsets
from levelzero.export.spark_source import store_config

QUERY = """
import sys
from levelzero.export.spark_datasource import register
from pyspark.sql import SparkSession

data_dir, out, checkpoint = sys.argv[1:4]
spark = (
    SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
    .config("spark.ui.showConsoleProgress", "false").getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")
register(spark)
stream = (
    spark.readStream.format("levelzero").option("data_dir", data_dir)
    .option("maxRecordsPerTrigger", "30").load("s")
)
query = stream.writeStream.format("parquet").option("checkpointLocation", checkpoint).start(out)
query.awaitTermination()  # until killed
"""


def produce(data_dir: Path, start: int, count: int) -> None:
    async def scenario() -> None:
        async with daemon_and_client(data_dir, **SLOW) as (_, client):
            if start == 0:
                await client.create_topic("s", 2)
            for i in range(start, start + count, 10):
                await client.produce("s", i // 10 % 2, [f"v{j}".encode() for j in range(i, i + 10)])

    anyio.run(scenario)


def committed_batches(out: Path) -> int:
    log = out / "_spark_metadata"
    return len([f for f in log.iterdir() if f.name.isdigit()]) if log.is_dir() else 0


def test_a_query_killed_mid_stream_continues_from_its_checkpoint_exactly_once(tmp_path: Path, spark) -> None:  # noqa: F811
    data_dir, out, checkpoint = tmp_path / "data", tmp_path / "out", tmp_path / "checkpoint"
    data_dir.mkdir()
    produce(data_dir, 0, 400)  # v0..v399: 200 records in each partition
    script = tmp_path / "query.py"
    script.write_text(QUERY)
    env = clean_environ(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    query = subprocess.Popen(
        [sys.executable, str(script), str(data_dir), str(out), str(checkpoint)],
        env=env,
        start_new_session=True,  # its JVM too: killed together, as a machine dies
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        for _ in range(1200):  # at most 2 minutes for Spark to start and commit two batches
            if committed_batches(out) >= 2 or query.poll() is not None:
                break
            time.sleep(0.1)
    finally:
        os.killpg(query.pid, signal.SIGKILL)
        _, err = query.communicate()
    committed = committed_batches(out)
    assert 2 <= committed < 400 // 30, err.decode()[-2000:]  # killed mid-stream

    produce(data_dir, 400, 60)  # more records while the query is down
    restarted = (
        spark.readStream.format("levelzero")
        .option("data_dir", str(data_dir))
        .option("maxRecordsPerTrigger", "50")
        .load("s")
        .writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(out))
    )
    restarted.awaitTermination()
    assert restarted.exception() is None
    sizes = [p["numInputRows"] for p in restarted.recentProgress if p["numInputRows"]]
    assert sizes and max(sizes) <= 50, sizes
    rows = spark.read.parquet(str(out)).select("partition", "offset", "value").collect()
    got = sorted((r.partition, r.offset, bytes(r.value).decode()) for r in rows)
    expected = sorted(
        (i // 10 % 2, (i // 20) * 10 + i % 10, f"v{i}") for i in range(460)
    )  # every record once: none lost at the kill, none read twice after it
    assert got == expected
    assert sum(sizes) == 460 - 30 * committed  # the restart read what the killed run had not committed


def test_stream_offsets_starting_offsets_and_the_per_trigger_limit(tmp_path: Path) -> None:
    produce(tmp_path, 0, 60)  # 30 records in each partition
    bounds = partition_bounds(store_config(str(tmp_path)), "s")
    assert bounds == {0: (0, 30), 1: (0, 30)}
    assert starting_offsets(None, bounds) == {"0": 0, "1": 0}
    assert starting_offsets("latest", bounds) == {"0": 30, "1": 30}
    assert starting_offsets('{"0": 7, "1": -1}', bounds) == {"0": 7, "1": 30}
    assert starting_offsets('{"1": 99}', bounds) == {"0": 0, "1": 30}  # left out: earliest
    for bad in ("newest", '{"0": "7"}', '{"x": 1}', "[1]"):
        with pytest.raises(ExportError, match="option startingOffsets="):
            starting_offsets(bad, bounds)
    with pytest.raises(ExportError, match="no partition 5 in the topic"):
        starting_offsets('{"5": 0}', bounds)
    # The limit is shared in proportion to what each partition has pending.
    assert limited({"0": 0, "1": 20}, {"0": 30, "1": 30}, None) == {"0": 30, "1": 30}
    assert limited({"0": 0, "1": 20}, {"0": 30, "1": 30}, 8) == {"0": 6, "1": 22}
    assert limited({"0": 0, "1": 29}, {"0": 30, "1": 30}, 2) == {"0": 1, "1": 30}
    assert limited({"0": 30}, {"0": 30, "1": 30}, 5) == {"0": 30, "1": 5}  # a new partition: from 0
    assert limited({"0": 30, "1": 30}, {"0": 30, "1": 30}, 5) == {"0": 30, "1": 30}


def test_a_stream_of_an_empty_topic_reads_nothing_and_unknown_options_are_refused(
    tmp_path: Path,
    spark,  # noqa: F811
) -> None:
    """`Trigger.AvailableNow` on a topic without records ends with no rows; the stream reader
    and the stream sink each refuse an option they do not take, listing those they do (a
    misspelt one was ignored), and take Spark's own (the checkpoint's, a name in any case)."""

    async def scenario() -> None:
        async with daemon_and_client(tmp_path, **SLOW) as (_, client):
            await client.create_topic("e", 2)

    anyio.run(scenario)

    def stream(**options: str):
        reader = spark.readStream.format("levelzero").option("data_dir", str(tmp_path))
        return reader.options(**options).load("e")

    query = (
        stream(maxrecordspertrigger="10", STARTINGOFFSETS="earliest")
        .writeStream.format("memory")
        .queryName("empty_e")
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    assert query.exception() is None
    assert spark.table("empty_e").count() == 0

    def run(query) -> None:
        try:
            query.awaitTermination(120)
        finally:
            query.stop()

    with pytest.raises(
        Exception,
        match=r"the levelzero stream read has no option 'startingoffset'; its options: path,"
        r" data_dir, config, s3_access_key, s3_secret_key, s3_session_token, control_password,"
        r" startingOffsets, maxRecordsPerTrigger, task_bytes",
    ):
        run(stream(startingOffset="earliest").writeStream.format("memory").queryName("bad_e").start())
    writer = (
        stream()
        .writeStream.format("levelzero")
        .option("url", "http://127.0.0.1:9")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .option("tokn", "secret")
        .trigger(availableNow=True)
    )
    with pytest.raises(
        Exception,
        match=r"the levelzero stream sink has no option 'tokn'; its options: path, topic, url,"
        r" token, records_per_request, checkpointLocation, queryName",
    ):
        run(writer.start("e-copy"))


IMPORTS = """
import sys
before = set(sys.modules)
import levelzero.export.spark_datasource
print(" ".join(sorted(set(sys.modules) - before)))
"""


def test_the_data_source_imports_none_of_the_exports_or_the_analysis_modules() -> None:
    """Each Python process Spark starts for the data source (a streaming query's source process,
    every worker) imports it to unpickle it: the package's own modules for export and analysis,
    pyarrow and the stores' drivers are not loaded with it (they took seconds of a loaded
    machine before a query's first micro-batch)."""
    loaded = subprocess.run(
        [sys.executable, "-c", IMPORTS], check=True, capture_output=True, text=True
    ).stdout.split()
    assert "levelzero.export.spark_stream" in loaded and "levelzero.export.spark_sink" in loaded
    heavy = [m for m in loaded if m.split(".")[0] in ("pyarrow", "asyncpg", "aiosqlite", "numpy")]
    assert heavy == []
    package = sorted(m for m in loaded if m.startswith("levelzero.export."))
    assert package == [
        "levelzero.export.errors",
        "levelzero.export.spark_datasource",
        "levelzero.export.spark_sink",
        "levelzero.export.spark_source",
        "levelzero.export.spark_stream",
    ]


def test_the_package_names_load_when_used_and_the_functions_shadow_their_modules() -> None:
    code = """
import levelzero.export.export, levelzero.export.analyze  # the modules first
import levelzero.export as package
from levelzero.export import SCHEMAS, ExportError, analyze, export
from levelzero.export.errors import ExportError as defined
assert callable(export) and callable(analyze), (export, analyze)
assert package.export is export and package.analyze is analyze
assert ExportError is defined and "log_entries" in SCHEMAS
print("ok")
"""
    assert (
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
        == "ok\n"
    )
