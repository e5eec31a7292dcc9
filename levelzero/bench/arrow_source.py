"""A Python data source that hands Spark a Parquet file's own Arrow batches, decoding nothing:
what any Python data source of the records' schema costs Spark (the batches' trip from the
Python worker and the rows Spark makes of them). The analysis item reads the records through
it beside `format("levelzero")` and Parquet: the ceiling of a data source written in Python on
this Spark, so the data source's ratio to Parquet can be read as "decoding" against "the API".

    spark.dataSource.register(ArrowFileSource)
    spark.read.format(FORMAT_NAME).option("path", parquet_file).option("tasks", "2").load()
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

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


class ArrowFileSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: Any) -> DataSourceReader:  # noqa: ARG002 - Spark's signature
        return _Reader(self.options["path"], int(self.options.get("tasks", "2")))
