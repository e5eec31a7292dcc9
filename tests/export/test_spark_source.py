"""The "levelzero" PySpark data source on local[2]: records produced through a running daemon,
some reconciled to L1 and some only in L0, read by Spark straight from the store, equal byte for
byte to what the API serves; offset-range options narrow the object ranges planned; and
`levelzero export --records` writes the same records to Parquet."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pyarrow.parquet as pq
import pytest
from daemon_support import daemon_and_client

from levelzero.daemon.client import Client
from levelzero.export.cli import export_main
from levelzero.export.errors import ExportError
from levelzero.export.spark_source import plan, register

WAIT_S = 15.0
FAST = {"gc__enabled": False, "reconciler__interval_s": 0.05, "housekeeper__enabled": False}
# The second run never reconciles: what it writes stays in L0.
SLOW = {"gc__enabled": False, "reconciler__interval_s": 3600.0, "housekeeper__enabled": False}


@pytest.fixture(scope="module")
def spark():
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers import levelzero from this venv
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("levelzero-spark-source-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


async def api_rows(client: Client, topic: str, partitions: int) -> tuple[list[tuple], set[str]]:
    rows: list[tuple] = []
    tiers: set[str] = set()
    for partition in range(partitions):
        offset = 0
        while True:
            fetched = await client.fetch(topic, partition, offset)
            if not fetched.records:
                break
            tiers.add(fetched.tier)
            for r in fetched.records:
                rows.append((topic, partition, r.offset, r.timestamp_ms, r.key, r.value, r.headers or []))
            offset = fetched.next_offset
    return rows, tiers


def spark_rows(spark, data_dir: Path, topic: str, **options: int) -> list[tuple]:
    reader = spark.read.format("levelzero").option("data_dir", str(data_dir))
    for name, value in options.items():
        reader = reader.option(name, str(value))
    df = reader.load(topic)
    assert df.columns == ["topic", "partition", "offset", "timestamp", "key", "value", "headers"]
    out = []
    for r in df.collect():
        key = None if r.key is None else bytes(r.key)
        headers = [(h.key, None if h.value is None else bytes(h.value)) for h in r.headers]
        out.append((r.topic, r.partition, r.offset, r.timestamp, key, bytes(r.value), headers))
    return sorted(out, key=lambda row: (row[1], row[2]))


def test_spark_reads_l1_and_l0_records_as_the_api_serves_them(tmp_path: Path, spark) -> None:
    async def scenario() -> None:
        async with daemon_and_client(tmp_path, **FAST) as (_, client):
            await client.create_topic("t", 2)
            for i in range(5):
                await client.produce("t", 0, [f"a{i}".encode(), (f"k{i}".encode(), bytes([i, 0, 255]))])
                await client.produce("t", 1, [(None, f"b{i}".encode() * 100)])
            with anyio.fail_after(WAIT_S):
                while (await client.status()).reconciler.lag_offsets:
                    await anyio.sleep(0.02)
        async with daemon_and_client(tmp_path, **SLOW) as (_, client):
            for i in range(3):
                await client.produce("t", 0, [f"late{i}".encode(), (b"", b"")])
                await client.produce("t", 1, [(b"\x00key", f"tail{i}".encode())])
            served, tiers = await api_rows(client, "t", 2)
            assert tiers == {"l0", "l1"}
            ranges = plan(str(tmp_path), "t")
            assert {r.tier for r in ranges} == {"l0", "l1"}
            read = await anyio.to_thread.run_sync(spark_rows, spark, tmp_path, "t")
            assert len(served) == 2 * 5 + 5 + 2 * 3 + 3
            assert read == served

            # Offset ranges: only the objects holding [3, 12) are planned, and Spark reads those.
            narrowed = plan(str(tmp_path), "t", 3, 12)
            assert len(narrowed) < len(ranges)
            assert all(r.first >= 3 and r.last <= 11 for r in narrowed)
            read = await anyio.to_thread.run_sync(
                lambda: spark_rows(spark, tmp_path, "t", start_offset=3, end_offset=12)
            )
            assert read == [row for row in served if 3 <= row[2] < 12]

            # `levelzero export --records`: the same records, in a Parquet file.
            out = tmp_path / "out"
            code = export_main(["--data-dir", str(tmp_path), "--out", str(out), "--records", "t"])
            assert code == 0
            assert parquet_rows(out / "records" / "t.parquet") == served

    anyio.run(scenario)


def parquet_rows(path: Path) -> list[tuple]:
    rows = pq.read_table(path).to_pylist()
    return sorted(
        (
            (r["topic"], r["partition"], r["offset"], r["timestamp"], r["key"], r["value"],
             [(h["key"], h["value"]) for h in r["headers"]])
            for r in rows
        ),
        key=lambda row: (row[1], row[2]),
    )


def test_unknown_topic_and_missing_data_dir_are_clear_errors(tmp_path: Path, capsys) -> None:
    with pytest.raises(ExportError, match="not a levelzero data directory"):
        plan(str(tmp_path), "t")
    code = export_main(["--db", str(tmp_path / "x.db"), "--out", str(tmp_path), "--records", "t"])
    assert code == 2
    assert "--records needs --data-dir" in capsys.readouterr().err
    code = export_main(["--data-dir", str(tmp_path), "--out", str(tmp_path), "--records", "t"])
    assert code == 1
    assert "not a levelzero data directory" in capsys.readouterr().err
