"""The levelzero data source as Spark sees it: `spark.read.format("levelzero")` (the batch reader,
spark_source.py), `spark.readStream` (the stream reader, spark_stream.py), `df.write` and
`writeStream` (the sink, spark_sink.py). Apart from them so that they need not import each
other: each of the three imports only what it shares from spark_source."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader

from .errors import ExportError
from .spark_sink import (
    SINK_OPTIONS,
    STREAM_SINK_OPTIONS,
    LevelZeroStreamWriter,
    LevelZeroWriter,
    sink_target,
)
from .spark_source import (
    BATCH_OPTIONS,
    FORMAT_NAME,
    PLAN_SCOPED_TO_SCAN,
    PUSHDOWN_CONF,
    SCHEMA_DDL,
    LevelZeroPushdownReader,
    LevelZeroReader,
    _min_tasks,
    _task_bytes,
    check_options,
    secrets_of,
    selection_of,
    store_config,
)
from .spark_stream import STREAM_OPTIONS, LevelZeroStreamReader

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    from levelzero.config import Config


class LevelZeroDataSource(DataSource):
    # A batch read's tasks when option min_tasks is not given: `register` sets the session's
    # default parallelism (a reader in a Python worker cannot ask the session for it).
    min_tasks_default = 1

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:  # noqa: ARG002 - Spark's signature
        check_options(self.options, BATCH_OPTIONS, "batch read")
        config, topic = self._store()
        options = self.options
        reader = LevelZeroPushdownReader if PLAN_SCOPED_TO_SCAN else LevelZeroReader
        min_tasks = _min_tasks(options, self.min_tasks_default)
        return reader(config, topic, selection_of(options), _task_bytes(options), min_tasks)

    def streamReader(self, schema: StructType) -> Any:  # noqa: ARG002, N802 - Spark's signature
        check_options(self.options, STREAM_OPTIONS, "stream read")
        config, topic = self._store()
        return LevelZeroStreamReader(config, topic, self.options, _task_bytes(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        check_options(self.options, SINK_OPTIONS, "sink")
        _append_only(overwrite)
        return LevelZeroWriter(sink_target(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:  # noqa: N802 - Spark's name
        check_options(self.options, STREAM_SINK_OPTIONS, "stream sink")
        _append_only(overwrite)
        return LevelZeroStreamWriter(sink_target(self.options, schema))

    def _store(self) -> tuple[Config, str]:
        options = self.options
        topic = options.get("path")
        if not topic:
            raise ExportError('the levelzero data source needs a topic: load("topic")')
        config = store_config(
            options.get("data_dir") or None, options.get("config") or None, secrets_of(options)
        )
        return config, topic


def _append_only(overwrite: bool) -> None:
    if overwrite:
        raise ExportError("the levelzero sink appends records to a topic: mode append, not overwrite")


def register(spark: SparkSession) -> None:
    """Make `spark.read.format("levelzero")` available in this session, its batch reads cut
    into at least the session's default parallelism of tasks (option min_tasks). Where Spark plans each
    scan from its own pushed filters, Python data-source filter pushdown is turned on too (the
    reader then takes filters on topic, partition and offset; Spark refuses a reader that takes
    filters while the setting is off, so elsewhere the reader has no `pushFilters`)."""
    if PLAN_SCOPED_TO_SCAN:
        spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(_with_parallelism(spark))


def _with_parallelism(spark: SparkSession) -> type[LevelZeroDataSource]:
    """The data source with the session's default parallelism as its tasks' minimum (as Spark
    splits a file read into at least that many tasks): a subclass made here, which Spark
    pickles by value (it is no module's attribute), so the number reaches the Python workers
    that plan the read. A session without a SparkContext (Spark Connect) keeps the minimum 1."""
    try:
        parallelism = spark.sparkContext.defaultParallelism
    except Exception:  # noqa: BLE001 - Spark Connect raises its own error for sparkContext
        return LevelZeroDataSource
    assert parallelism >= 1, parallelism
    return type("LevelZeroDataSource", (LevelZeroDataSource,), {"min_tasks_default": parallelism})
