"""The "levelzero" PySpark data source on local[2]: records produced through a running daemon,
some reconciled to L1 and some only in L0, read by Spark straight from the store, equal byte for
byte to what the API serves; offset-range options narrow the object ranges planned; and
`levelzero export --records` writes the same records to Parquet."""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from daemon_support import daemon_and_client, postgres_control, postgres_overrides

from levelzero.client import Client
from levelzero.export.cli import export_main
from levelzero.export.errors import ExportError
from levelzero.export.spark_datasource import register
from levelzero.export.spark_source import (
    ObjectRange,
    Selection,
    plan,
    read_batch,
    read_range,
    store_config,
    tasks,
)
from levelzero.storage.sqlite import SqliteLogStore

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


def utc(timestamp_ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=timestamp_ms)


async def api_rows(client: Client, topic: str, partitions: int) -> tuple[list[tuple], set[str]]:
    rows: list[tuple] = []
    tiers: set[str] = set()
    for partition in range(partitions):
        offset = 0
        while True:
            fetched = await client.fetch(topic, partition, offset)
            if not fetched.records:
                break
            tiers.update(fetched.tier.split("+"))  # "l1+l0": a fetch served from both
            for r in fetched.records:
                when = None if r.timestamp_ms is None else utc(r.timestamp_ms)
                rows.append((topic, partition, r.offset, when, r.key, r.value, r.headers or []))
            offset = fetched.next_offset
    return rows, tiers


def spark_rows(
    spark,
    data_dir: Path | None,
    topic: str,
    *,
    where: str | None = None,
    config: Path | None = None,
    partitions: int | None = None,
    **options: int,
) -> list[tuple]:
    reader = spark.read.format("levelzero")
    reader = reader.option("config", str(config)) if config else reader.option("data_dir", str(data_dir))
    for name, value in options.items():
        reader = reader.option(name, str(value))
    df = reader.load(topic)
    if where is not None:
        df = df.where(where)
    if partitions is not None:  # Spark partitions holding records
        from pyspark.sql import functions as F

        assert df.select(F.spark_partition_id().alias("p")).distinct().count() == partitions
    assert df.columns == ["topic", "partition", "offset", "timestamp", "key", "value", "headers"]
    out = []
    for r in df.collect():
        key = None if r.key is None else bytes(r.key)
        headers = [(h.key, None if h.value is None else bytes(h.value)) for h in r.headers]
        value = None if r.value is None else bytes(r.value)  # a null value stays null
        when = None if r.timestamp is None else r.timestamp.astimezone(UTC)  # TIMESTAMP: the session's zone
        out.append((r.topic, r.partition, r.offset, when, key, value, headers))
    return sorted(out, key=lambda row: (row[1], row[2]))


def test_spark_reads_l1_and_l0_records_as_the_api_serves_them(tmp_path: Path, spark) -> None:
    async def scenario() -> None:
        async with daemon_and_client(tmp_path, **FAST) as (_, client):
            await client.create_topic("t", 2)
            for i in range(5):
                await client.produce("t", 0, [f"a{i}".encode(), (f"k{i}".encode(), bytes([i, 0, 255]))])
                await client.produce("t", 1, [(None, f"b{i}".encode() * 100)])
            await client.produce("t", 0, [(b"tombstone-l1", None)])  # a null value, reconciled
            with anyio.fail_after(WAIT_S):
                while (await client.status()).reconciler.lag_offsets:
                    await anyio.sleep(0.02)
        async with daemon_and_client(tmp_path, **SLOW) as (_, client):
            for i in range(3):
                await client.produce("t", 0, [f"late{i}".encode(), (b"", b"")])
                await client.produce("t", 1, [(b"\x00key", f"tail{i}".encode())])
            await client.produce("t", 1, [(b"tombstone-l0", None)])  # a null value, in L0
            served, tiers = await api_rows(client, "t", 2)
            nulls = {row[4]: row[5] for row in served if row[4] in (b"tombstone-l1", b"tombstone-l0", b"")}
            assert nulls == {b"tombstone-l1": None, b"tombstone-l0": None, b"": b""}
            assert tiers == {"l0", "l1"}
            ranges = plan(str(tmp_path), "t")
            assert {r.tier for r in ranges} == {"l0", "l1"}
            read = await anyio.to_thread.run_sync(spark_rows, spark, tmp_path, "t")
            assert len(served) == 2 * 5 + 5 + 2 * 3 + 3 + 2
            assert read == served

            # Offset ranges: only the objects holding [3, 12) are planned, and Spark reads those.
            narrowed = plan(str(tmp_path), "t", Selection(3, 12))
            assert len(narrowed) < len(ranges)
            assert all(r.first >= 3 and r.last <= 11 for r in narrowed)
            read = await anyio.to_thread.run_sync(
                lambda: spark_rows(spark, tmp_path, "t", start_offset=3, end_offset=12)
            )
            assert read == [row for row in served if 3 <= row[2] < 12]
            # The same range as a filter on the offset column: the same rows read.
            read = await anyio.to_thread.run_sync(
                lambda: spark_rows(spark, tmp_path, "t", where="offset BETWEEN 3 AND 11")
            )
            assert read == [row for row in served if 3 <= row[2] < 12]
            read = await anyio.to_thread.run_sync(
                lambda: spark_rows(spark, tmp_path, "t", where="offset > 4 AND offset IN (5, 7, 40)")
            )
            assert read == [row for row in served if row[2] in (5, 7)]

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
            (
                r["topic"],
                r["partition"],
                r["offset"],
                r["timestamp"],
                r["key"],
                r["value"],
                [(h["key"], h["value"]) for h in r["headers"]],
            )
            for r in rows
        ),
        key=lambda row: (row[1], row[2]),
    )


def test_unknown_topic_and_missing_data_dir_are_clear_errors(tmp_path: Path, capsys) -> None:
    with pytest.raises(ExportError, match="not a levelzero data directory"):
        plan(str(tmp_path), "t")
    code = export_main(["--db", str(tmp_path / "x.db"), "--out", str(tmp_path), "--records", "t"])
    assert code == 2
    assert "--records needs --data-dir or --config" in capsys.readouterr().err
    code = export_main(["--data-dir", str(tmp_path), "--out", str(tmp_path), "--records", "t"])
    assert code == 1
    assert "not a levelzero data directory" in capsys.readouterr().err


def test_a_damaged_or_foreign_store_is_one_line_for_records_as_for_the_tables(tmp_path: Path, capsys) -> None:
    """`--records` read the store through a connection of its own, unchecked: a damaged
    levelzero.db ended it in sqlite3's traceback where the table export said what is wrong."""
    db = tmp_path / "levelzero.db"

    async def create() -> None:
        async with await SqliteLogStore.open(db) as store:
            for i in range(30):
                await store.create_topic(f"t{i}", 4, creation_epoch=1, now=0.0)

    anyio.run(create)
    os.truncate(db, 5000)
    expected = f"levelzero export: {db} is not a levelzero store: database disk image is malformed\n"
    for records in (["--records", "t1"], []):
        code = export_main(["--data-dir", str(tmp_path), "--out", str(tmp_path / "out"), *records])
        assert (code, capsys.readouterr().err) == (1, expected), records
    with pytest.raises(ExportError, match="is not a levelzero store: database disk image is malformed"):
        plan(str(tmp_path), "t1")  # the Spark data source plans through the same snapshot
    db.unlink()
    with sqlite3.connect(db) as foreign:
        foreign.execute("CREATE TABLE notes (x)")
    foreign.close()
    code = export_main(["--data-dir", str(tmp_path), "--out", str(tmp_path / "out"), "--records", "t1"])
    assert code == 1
    assert "is not a levelzero store of schema version" in capsys.readouterr().err


@pytest.mark.s3
def test_spark_reads_from_s3_with_a_postgresql_control_plane(
    tmp_path: Path,
    spark,
    s3_endpoint,
    s3_bucket: str,
    postgres_dsn: str,
) -> None:
    """The daemon's own TOML (S3 with a key prefix, PostgreSQL) is all the data source needs."""
    s3 = {
        "storage__kind": "s3",
        "s3__endpoint": s3_endpoint.endpoint_url,
        "s3__bucket": s3_bucket,
        "s3__region": s3_endpoint.region,
        "s3__path_style": True,
        "s3__key_prefix": "lz/",
        "s3__access_key": s3_endpoint.access_key,
        "s3__secret_key": s3_endpoint.secret_key,
    }
    control = postgres_control(postgres_dsn)
    password_file = tmp_path / "pg-password"
    password_file.write_text(control["LEVELZERO_CONTROL_PASSWORD"] + "\n")
    config = tmp_path / "levelzero.toml"
    config.write_text(
        f'[storage]\nkind = "s3"\ndata_dir = "{tmp_path / "elsewhere"}"\n'
        f'[s3]\nendpoint = "{s3_endpoint.endpoint_url}"\nbucket = "{s3_bucket}"\n'
        f'region = "{s3_endpoint.region}"\npath_style = true\nkey_prefix = "lz/"\n'
        f'access_key = "{s3_endpoint.access_key}"\nsecret_key = "{s3_endpoint.secret_key}"\n'
        f'[control]\nkind = "postgres"\ndsn = "{control["LEVELZERO_CONTROL_DSN"]}"\n'
        f'password_file = "{password_file}"\n'
    )

    async def scenario() -> None:
        settings = {**s3, **postgres_overrides(postgres_dsn)}
        async with daemon_and_client(tmp_path, **settings, **FAST) as (_, client):
            await client.create_topic("s", 2)
            for i in range(4):
                await client.produce("s", i % 2, [(f"k{i}".encode(), f"v{i}".encode() * 50)])
            with anyio.fail_after(WAIT_S):
                while (await client.status()).reconciler.lag_offsets:
                    await anyio.sleep(0.02)
        async with daemon_and_client(tmp_path, **settings, **SLOW) as (_, client):
            for i in range(3):
                await client.produce("s", i % 2, [(None, f"tail{i}".encode())])
            served, tiers = await api_rows(client, "s", 2)
            assert tiers == {"l0", "l1"}
            ranges = await anyio.to_thread.run_sync(plan, store_config(config_path=str(config)), "s")
            assert {r.tier for r in ranges} == {"l0", "l1"}
            read = await anyio.to_thread.run_sync(
                lambda: spark_rows(spark, None, "s", config=config, partitions=len(ranges), task_bytes=1)
            )
            assert len(served) == 4 + 3
            assert read == served
        keys = [o["Key"] for o in s3_endpoint.boto3_client().list_objects_v2(Bucket=s3_bucket)["Contents"]]
        assert keys and all(key.startswith("lz/") for key in keys)  # really read from there

    anyio.run(scenario)


def test_a_dataframe_reused_after_a_filtered_query_reads_all_its_records(tmp_path: Path, spark) -> None:
    """Spark (up to 4.3) keeps the read planned for a query's pushed filters on the DataFrame's
    relation: a later query of the same DataFrame without filters reused it. Each query here
    counts exactly the records it asks for, in any order."""

    async def scenario() -> None:
        async with daemon_and_client(tmp_path, **SLOW) as (_, client):
            await client.create_topic("r", 2)
            for i in range(4):
                await client.produce("r", 0, [f"a{i}-{j}".encode() for j in range(50)])
                await client.produce("r", 1, [f"b{i}-{j}".encode() for j in range(25)])

    anyio.run(scenario)
    df = spark.read.format("levelzero").option("data_dir", str(tmp_path)).load("r")
    assert df.where("offset BETWEEN 100 AND 149").count() == 50
    assert df.count() == 300
    assert df.where("partition = 1").count() == 100
    assert df.where("offset IN (7, 130, 199, 500)").count() == 3 + 1
    assert df.count() == 300
    assert df.where("topic = 'other'").count() == 0
    assert df.groupBy("partition").count().orderBy("partition").collect() == [(0, 200), (1, 100)]


def test_plans_for_topic_partition_and_offset_filters(tmp_path: Path) -> None:
    """Which object ranges (one Spark task each) a read plans for the filters it takes: a
    partition set, an offset set (only the offsets asked for, not the range between them),
    offset bounds and the topic, each from pyspark's own filter objects."""
    from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, In, LessThan

    async def scenario() -> None:
        async with daemon_and_client(tmp_path, **SLOW) as (_, client):
            await client.create_topic("p", 3)
            for partition in range(3):
                for _ in range(4):  # four extents of 100 records in each partition
                    await client.produce("p", partition, [b"x"] * 100)

    anyio.run(scenario)

    def planned(*filters: object) -> list[tuple[int, int, int]]:
        selection = Selection()
        for f in filters:
            assert selection.push(f), f
        return [(r.partition, r.first, r.last) for r in plan(str(tmp_path), "p", selection)]

    every = planned()
    assert len(every) == 12
    assert planned(EqualTo(("partition",), 1)) == [(1, b, b + 99) for b in (0, 100, 200, 300)]
    assert planned(In(("partition",), (0, 2)), EqualTo(("offset",), 5)) == [(0, 5, 5), (2, 5, 5)]
    assert planned(In(("partition",), (2,)), In(("offset",), (7, 300, 301, 399, 400))) == [
        (2, 7, 7),
        (2, 300, 301),
        (2, 399, 399),
    ]
    assert planned(
        EqualTo(("partition",), 0), GreaterThanOrEqual(("offset",), 150), LessThan(("offset",), 250)
    ) == [(0, 150, 199), (0, 200, 249)]
    assert planned(EqualTo(("topic",), "p")) == every
    assert planned(In(("topic",), ("q", "r"))) == []
    assert planned(EqualTo(("partition",), 1), EqualTo(("partition",), 2)) == []
    # Not taken: Spark evaluates them (a string offset, a column the plan does not know).
    assert not Selection().push(EqualTo(("offset",), "7"))
    assert not Selection().push(EqualTo(("key",), b"k"))


def test_object_ranges_are_grouped_into_tasks_of_about_task_bytes() -> None:
    def sized(*sizes: int) -> list[ObjectRange]:
        return [ObjectRange("t", 0, "l0", f"k{i}", i, i, i, size_bytes=s) for i, s in enumerate(sizes)]

    def shape(grouped: list[list[ObjectRange]]) -> list[list[int]]:
        return [[r.size_bytes for r in task] for task in grouped]

    assert shape(tasks(sized(40, 40, 40, 40, 10), 100)) == [[40, 40], [40, 40, 10]]
    assert shape(tasks(sized(300, 10, 10), 100)) == [[300], [10, 10]]  # never split
    assert shape(tasks(sized(5, 5), 1)) == [[5], [5]]
    assert tasks([], 100) == []
    # Equal shares, not the first task filled up to task_bytes (that gave [100] and [40]): a
    # range goes where its middle byte falls.
    assert shape(tasks(sized(60, 10, 10, 10, 10, 10, 10, 10, 10), 100)) == [[60, 10], [10] * 7]
    # At least min_tasks (the session's parallelism) while there are ranges for them.
    assert shape(tasks(sized(10, 10, 10, 10), 100, min_tasks=2)) == [[10, 10], [10, 10]]
    assert shape(tasks(sized(10, 10, 10), 100, min_tasks=8)) == [[10], [10], [10]]
    assert shape(tasks(sized(10, 10, 10, 10), 100)) == [[10, 10, 10, 10]]


def test_a_read_is_cut_into_the_sessions_parallelism_of_tasks_unless_min_tasks_says(
    tmp_path: Path, spark
) -> None:
    async def scenario() -> None:
        async with daemon_and_client(tmp_path, **SLOW) as (_, client):
            await client.create_topic("m", 1)
            for _ in range(4):
                await client.produce("m", 0, [b"z" * 100] * 10)

    anyio.run(scenario)
    from pyspark.sql import functions as F

    def load(**options: str):
        reader = spark.read.format("levelzero").option("data_dir", str(tmp_path))
        return reader.options(**options).load("m")

    # Four extents of a few KB, far below task_bytes: one task once, one core idle on local[2].
    df = load()
    assert df.rdd.getNumPartitions() == spark.sparkContext.defaultParallelism == 2
    per_task = df.groupBy(F.spark_partition_id().alias("task")).count().collect()
    assert sorted(r["count"] for r in per_task) == [20, 20]
    assert load(min_tasks="1").rdd.getNumPartitions() == 1
    assert load(min_tasks="3").rdd.getNumPartitions() == 3
    assert load(min_tasks="9").count() == 40  # never more tasks than ranges, every record once
    assert load(min_tasks="9").rdd.getNumPartitions() == 4
    with pytest.raises(Exception, match="option min_tasks='0': must be >= 1"):
        load(min_tasks="0").count()


def test_the_partitions_option_plans_only_those_partitions_tasks(tmp_path: Path, spark) -> None:
    async def scenario() -> None:
        async with daemon_and_client(tmp_path, **SLOW) as (_, client):
            await client.create_topic("o", 3)
            for partition in range(3):
                for _ in range(2):
                    await client.produce("o", partition, [b"y"] * 10)

    anyio.run(scenario)
    from pyspark.sql import functions as F

    df = (
        spark.read.format("levelzero")
        .option("data_dir", str(tmp_path))
        .option("partitions", "0, 2")
        .option("start_offset", "5")
        .option("task_bytes", "1")  # a task per object range
        .load("o")
    )
    assert df.rdd.getNumPartitions() == 4  # two extents in each of partitions 0 and 2
    rows = df.select("partition", "offset", F.spark_partition_id().alias("task")).collect()
    assert sorted((r.partition, r.offset) for r in rows) == [(p, o) for p in (0, 2) for o in range(5, 20)]
    with pytest.raises(Exception, match="option partitions='1,x': not a list of non-negative integers"):
        spark.read.format("levelzero").option("data_dir", str(tmp_path)).option("partitions", "1,x").load(
            "o"
        ).count()


def test_an_empty_topic_partition_or_range_reads_no_rows_and_a_missing_partition_is_refused(
    tmp_path: Path, spark
) -> None:
    """A read that plans no object ranges is a DataFrame of no rows (Spark read a task of
    `InputPartition(None)` for it, and failed); a partition the `partitions` option names
    that the topic lacks, and a start_offset past end_offset, are errors saying so."""

    async def scenario() -> None:
        async with daemon_and_client(tmp_path, **SLOW) as (_, client):
            await client.create_topic("empty", 2)
            await client.create_topic("o", 3)
            for partition in (0, 1):  # partition 2 holds no records
                await client.produce("o", partition, [b"y"] * 10)

    anyio.run(scenario)

    def load(topic: str, **options: str):
        reader = spark.read.format("levelzero").option("data_dir", str(tmp_path))
        return reader.options(**options).load(topic)

    empty = load("empty")
    assert empty.columns == ["topic", "partition", "offset", "timestamp", "key", "value", "headers"]
    assert empty.collect() == []
    assert empty.count() == 0
    assert load("o", partitions="2").count() == 0  # a partition without records
    assert load("o", start_offset="7", end_offset="7").count() == 0  # [7, 7): no offsets
    assert load("o", start_offset="500").count() == 0  # past every partition's end
    assert load("o", partitions="1,2", start_offset="4").count() == 6
    assert load("o").where("partition = 7").count() == 0  # a filter: no rows, not an error
    assert load("o").count() == 20
    with pytest.raises(
        Exception,
        match=r"option partitions: partition 99 of topic 'o' not found in \S*levelzero\.db"
        r" \(its partitions: 0\.\.2\)",
    ):
        load("o", partitions="1,99").count()
    with pytest.raises(Exception, match=r"option start_offset='50': past end_offset='10'"):
        load("o", start_offset="50", end_offset="10").count()


def test_an_unknown_option_is_refused_by_the_reader_and_the_sink(tmp_path: Path, spark) -> None:
    """A misspelt option (`partitons`) read the whole topic: each side of the data source
    refuses an option it does not take, listing those it does; names are case-insensitive,
    as Spark matches them."""

    async def scenario() -> None:
        async with daemon_and_client(tmp_path, **SLOW) as (_, client):
            await client.create_topic("u", 2)
            for partition in range(2):
                await client.produce("u", partition, [b"x"] * 10)

    anyio.run(scenario)

    def load(**options: str):
        reader = spark.read.format("levelzero").option("data_dir", str(tmp_path))
        return reader.options(**options).load("u")

    with pytest.raises(
        Exception,
        match=r"the levelzero batch read has no option 'partitons'; its options: path, data_dir,"
        r" config, s3_access_key, s3_secret_key, s3_session_token, control_password, start_offset,"
        r" end_offset, partitions, task_bytes, min_tasks",
    ):
        load(partitons="1").count()
    assert load(Partitions="1", START_OFFSET="4").count() == 6
    rows = spark.createDataFrame([("k", "v")], "key string, value string")
    writer = rows.write.format("levelzero").option("url", "http://127.0.0.1:9").mode("append")
    with pytest.raises(
        Exception,
        match=r"the levelzero sink has no option 'records_per_requst'; its options: path, topic, url,"
        r" token, records_per_request",
    ):
        writer.option("records_per_requst", "5").save("u")


@pytest.mark.s3
def test_credentials_as_options_and_export_records_from_an_s3_daemon(
    tmp_path: Path, spark, s3_endpoint, s3_bucket: str, capsys, monkeypatch
) -> None:
    """A daemon on S3 (moto) with its SQLite control plane: its TOML names the bucket but no
    credentials. The data source takes them as options (the executors get them with the task;
    they appear in no plan string), and `levelzero export --records --config` reads the same
    records from S3 (it knew only the local object store)."""
    s3 = {
        "storage__kind": "s3",
        "s3__endpoint": s3_endpoint.endpoint_url,
        "s3__bucket": s3_bucket,
        "s3__region": s3_endpoint.region,
        "s3__path_style": True,
        "s3__key_prefix": "lz/",
        "s3__access_key": s3_endpoint.access_key,
        "s3__secret_key": s3_endpoint.secret_key,
    }
    config = tmp_path / "levelzero.toml"
    config.write_text(
        f'[storage]\nkind = "s3"\ndata_dir = "{tmp_path}"\n'
        f'[s3]\nendpoint = "{s3_endpoint.endpoint_url}"\nbucket = "{s3_bucket}"\n'
        f'region = "{s3_endpoint.region}"\npath_style = true\nkey_prefix = "lz/"\n'
    )

    async def scenario() -> list[tuple]:
        async with daemon_and_client(tmp_path, **s3, **FAST) as (_, client):
            await client.create_topic("c", 2)
            for i in range(4):
                await client.produce("c", i % 2, [(f"k{i}".encode(), f"v{i}".encode() * 50)])
            with anyio.fail_after(WAIT_S):
                while (await client.status()).reconciler.lag_offsets:
                    await anyio.sleep(0.02)
        async with daemon_and_client(tmp_path, **s3, **SLOW) as (_, client):
            await client.produce("c", 0, [(None, b"tail")])
            served, tiers = await api_rows(client, "c", 2)
        assert tiers == {"l0", "l1"}
        return served

    served = anyio.run(scenario)
    secret = s3_endpoint.secret_key
    reader = (
        spark.read.format("levelzero")
        .option("config", str(config))
        .option("s3_access_key", s3_endpoint.access_key)
        .option("s3_secret_key", secret)
    )
    df = reader.load("c")
    rows = df.collect()
    assert len(rows) == len(served) == 5
    plans = df._jdf.queryExecution().toString() + df.where("offset > 0")._jdf.queryExecution().toString()
    assert secret not in plans

    out = tmp_path / "out"
    # The daemon's environment, as `levelzero export` would run in it.
    monkeypatch.setenv("LEVELZERO_S3_ACCESS_KEY", s3_endpoint.access_key)
    monkeypatch.setenv("LEVELZERO_S3_SECRET_KEY", secret)
    code = export_main(["--config", str(config), "--out", str(out), "--records", "c"])
    assert code == 0, capsys.readouterr().err
    assert parquet_rows(out / "records" / "c.parquet") == served
    # Without --config the local object store is looked in, and the error says where else to look.
    code = export_main(["--data-dir", str(tmp_path), "--out", str(out), "--records", "c"])
    assert code == 1
    assert "the daemon keeps its objects elsewhere" in capsys.readouterr().err


# GC every second under a 1 s grace, the epoch bumped every second, a quick reconciler.
CHURN = {
    "gc__enabled": True,
    "gc__interval_s": 1.0,
    "gc__idle_backoff_max_s": 1.0,
    "gc__grace_s": 1.0,
    "node__epoch_bump_interval_s": 1.0,
    "reconciler__interval_s": 0.05,
}


def test_a_read_planned_over_l0_objects_reads_them_from_l1_once_the_gc_deleted_them(
    tmp_path: Path, spark
) -> None:
    """A read is a snapshot as of planning: its ranges are planned over L0 extents, then the
    reconciler copies them to L1 and the GC (every second, 1 s grace) deletes the L0 objects
    while a producer keeps writing; the planned ranges, read as a task reads them, give the
    records as of planning, byte for byte (from L1 now). A Spark read under the same churn
    gives every record up to its planning."""

    async def scenario() -> tuple[list, list, int]:
        async with daemon_and_client(tmp_path, **SLOW) as (_, client):
            await client.create_topic("g", 2)
            for i in range(6):
                for partition in range(2):
                    await client.produce("g", partition, [f"v{i}-{j}".encode() * 20 for j in range(30)])
            served, tiers = await api_rows(client, "g", 2)
        assert tiers == {"l0"}
        planned = plan(str(tmp_path), "g")
        assert {r.tier for r in planned} == {"l0"}
        l0_files = {tmp_path / "objects" / r.object_key for r in planned}
        assert all(path.exists() for path in l0_files)

        async with daemon_and_client(tmp_path, **CHURN) as (_, client):
            produced = 0

            async def producer() -> None:
                nonlocal produced
                while True:
                    await client.produce("g", produced % 2, [b"during the read"])
                    produced += 1
                    await anyio.sleep(0.01)

            async with anyio.create_task_group() as tg:
                tg.start_soon(producer)
                with anyio.fail_after(60):
                    while any(path.exists() for path in l0_files):
                        await client.run_housekeeper(force=True)  # M(p) follows the LRO now
                        await anyio.sleep(0.2)
                # The planned objects are gone; read as the tasks would, while the GC goes on.
                batches = [await anyio.to_thread.run_sync(read_batch, str(tmp_path), r) for r in planned]
                read = await anyio.to_thread.run_sync(lambda: spark_rows(spark, tmp_path, "g"))
                tg.cancel_scope.cancel()
        rows = sorted(
            (
                (
                    b["topic"],
                    b["partition"],
                    b["offset"],
                    b["timestamp"],
                    b["key"],
                    b["value"],
                    [(h["key"], h["value"]) for h in b["headers"]],
                )
                for batch in batches
                for b in batch.to_pylist()
            ),
            key=lambda row: (row[1], row[2]),
        )
        assert rows == served
        return served, read, produced

    served, read, produced = anyio.run(scenario)
    assert produced > 0
    before = 6 * 30  # offsets per partition produced before the churn
    assert [row for row in read if row[2] < before] == served
    assert all(row[5] == b"during the read" for row in read if row[2] >= before)


def test_a_batch_carries_timestamps_headers_and_null_keys_column_by_column(tmp_path: Path) -> None:
    """The Arrow batch of an extent (built column by column): TIMESTAMP from milliseconds, null
    where the record has none; headers as lists of (key, value) with null values; null keys;
    only the planned offsets."""
    from levelzero.core.l0format import Record, checksum, encode_extent

    records = [
        Record(b"k0", b"v0", 1_700_000_000_123, (("h", b"1"), ("n", None))),
        Record(None, b"v1"),
        Record(b"k2", b"", 5, ()),
        Record(b"k3", b"v3", 7, (("only", b""),)),
    ]
    extent = encode_extent(records)
    (tmp_path / "objects").mkdir()
    (tmp_path / "objects" / "x").write_bytes(b"junk" + extent)
    r = ObjectRange("t", 3, "l0", "x", 100, 101, 103, 4, len(extent), 4, checksum(extent))
    rows = read_batch(str(tmp_path), r).to_pylist()
    assert [(row["offset"], row["partition"], row["topic"]) for row in rows] == [
        (101, 3, "t"),
        (102, 3, "t"),
        (103, 3, "t"),
    ]
    assert [row["timestamp"] for row in rows] == [None, utc(5), utc(7)]
    assert [row["key"] for row in rows] == [None, b"k2", b"k3"]
    assert [row["value"] for row in rows] == [b"v1", b"", b"v3"]
    assert [row["headers"] for row in rows] == [[], [], [{"key": "only", "value": b""}]]
    first = read_batch(
        str(tmp_path), ObjectRange("t", 3, "l0", "x", 100, 100, 100, 4, len(extent), 4, checksum(extent))
    )
    assert first.to_pylist()[0]["headers"] == [{"key": "h", "value": b"1"}, {"key": "n", "value": None}]
    assert first.to_pylist()[0]["timestamp"] == utc(1_700_000_000_123)


def test_a_timestamp_no_timestamp_column_holds_is_null_and_said_so(tmp_path: Path, caplog) -> None:
    """A record may carry any int64 milliseconds (the API takes up to 2**63-1, as Kafka does);
    a TIMESTAMP (microseconds in an int64) holds those within 294247 years of 1970. Beyond, the
    milliseconds were multiplied into microseconds anyway, wrapping around: 2**63-1 read as
    1969-12-31T23:59:59.999, 10**16 as a date in year -292277. Now null, with a warning; the
    edges of the range, and times before 1970, read as they are."""
    from levelzero.core.l0format import Record, checksum, encode_extent
    from levelzero.export.spark_source import TIMESTAMP_MS_MAX

    stamps = [2**63 - 1, 10**16, TIMESTAMP_MS_MAX, -TIMESTAMP_MS_MAX, -(10**16), -5, 1_700_000_000_123]
    for i, headers in enumerate([(), (("h", b"1"),)]):  # column by column, and record by record
        records = [Record(b"k", b"v", ms, headers) for ms in stamps]
        extent = encode_extent(records)
        (tmp_path / "objects").mkdir(exist_ok=True)
        (tmp_path / "objects" / f"x{i}").write_bytes(extent)
        r = ObjectRange("t", 0, "l0", f"x{i}", 0, 0, 6, 0, len(extent), 7, checksum(extent))
        caplog.clear()
        with caplog.at_level(logging.WARNING, "levelzero.export"):
            batch = read_batch(str(tmp_path), r)
        micros = batch.column("timestamp").cast(pa.int64()).to_pylist()
        assert micros == [
            None,
            None,
            TIMESTAMP_MS_MAX * 1000,
            -TIMESTAMP_MS_MAX * 1000,
            None,
            -5000,
            1_700_000_000_123_000,
        ]
        assert [rec.getMessage() for rec in caplog.records] == [
            f"3 records' timestamps are beyond what a TIMESTAMP holds ({TIMESTAMP_MS_MAX} ms either "
            "side of 1970): read with a null timestamp"
        ]


def test_a_compacted_partition_is_planned_and_read_with_its_gaps(tmp_path: Path) -> None:
    """After compaction the data source plans the compacted object (valid because its result
    was accepted) and reads each kept record at its own offset, row by row and as a batch."""
    from levelzero.core.l0format import Record

    async def scenario() -> None:
        async with daemon_and_client(
            tmp_path, reconciler__object_bytes_min=0, reconciler__object_age_max_s=0
        ) as (daemon, _):
            node = daemon.node
            await node.create_topic(
                "c", 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}
            )
            for key, value in [(b"a", b"1"), (b"b", b"1"), (b"a", b"2"), (b"b", None), (b"c", b"1")]:
                await node.produce("c", 0, [Record(key, value)])
            await node.reconciler.run_round()
            assert await node.compactor.run_round() == 1

    anyio.run(scenario)
    (r,) = plan(str(tmp_path), "c")
    assert (r.tier, r.first, r.last) == ("l1", 0, 4)
    rows = [(offset, key, value) for _, _, offset, _, key, value, _ in read_range(str(tmp_path), r)]
    assert rows == [(2, b"a", b"2"), (3, b"b", None), (4, b"c", b"1")]
    batch = read_batch(str(tmp_path), r)
    assert batch.column("offset").to_pylist() == [2, 3, 4]
    assert batch.column("value").to_pylist() == [b"2", None, b"1"]
