"""A Python data source that hands Spark a Parquet file's own Arrow batches, decoding nothing:
what any Python data source of the records' schema costs Spark (the batches' trip from the
Python worker and the rows Spark makes of them). The analysis item reads the records through
it beside `format("levelzero")` and Parquet: the ceiling of a data source written in Python on
this Spark, so the data source's ratio to Parquet can be read as "decoding" against "the API".

    spark.dataSource.register(ArrowFileSource)
    spark.read.format(FORMAT_NAME).option("path", parquet_file).option("tasks", "2").load()

As a stream (the streaming figure's ceiling), `path` is a directory of Parquet files, read one
file per micro-batch in `tasks` tasks (`Trigger.AvailableNow` stops after the last):

    spark.readStream.format(FORMAT_NAME).option("path", parquet_dir).option("tasks", "4").load()
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import os

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, SupportsTriggerAvailableNow

from levelzero.export.spark_source import SCHEMA_DDL

FORMAT_NAME = "levelzero-bench-arrow"


class _Reader(DataSourceReader):
    def __init__(self, path: str, tasks: int) -> None:
        self.path, self.tasks = path, tasks

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(i) for i in range(self.tasks)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow.parquet as pq

        file = pq.ParquetFile(self.path)
        for group in range(partition.value, file.num_row_groups, self.tasks):
            yield from file.read_row_group(group).to_batches()


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offset: the number of the directory's files (in name order) read so far."""

    def __init__(self, path: str, tasks: int) -> None:
        self.files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".parquet"))
        self.tasks = tasks

    def initialOffset(self) -> dict:  # noqa: N802 - Spark's name
        return {"files": 0}

    def getDefaultReadLimit(self) -> Any:  # noqa: N802 - Spark's name
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark's name
        pass  # the files are listed when the query starts

    def latestOffset(self, start: dict, limit: Any) -> dict:  # noqa: N802, ARG002 - Spark's names
        return {"files": min(start["files"] + 1, len(self.files))}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return [
            InputPartition((self.files[i], task))
            for i in range(start["files"], end["files"])
            for task in range(self.tasks)
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow.parquet as pq

        path, task = partition.value
        file = pq.ParquetFile(path)
        for group in range(task, file.num_row_groups, self.tasks):
            yield from file.read_row_group(group).to_batches()

    def commit(self, end: dict) -> None:
        pass


class ArrowFileSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: Any) -> DataSourceReader:  # noqa: ARG002 - Spark's signature
        return _Reader(self.options["path"], int(self.options.get("tasks", "2")))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: ARG002, N802 - Spark's signature
        return _StreamReader(self.options["path"], int(self.options.get("tasks", "2")))
