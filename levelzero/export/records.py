"""`levelzero export --records TOPIC`: a topic's records written to one Parquet file.

The records are located and read exactly as the "levelzero" Spark data source reads them
(`spark_source.plan` and `read_range`: valid L1 objects up to the LRO, L0 extents above), one
row group per object range, so memory stays bounded by one object. The file is written under
a hidden name and renamed when complete.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow.parquet as pq

from .errors import ExportError
from .schemas import RECORDS_SCHEMA as SCHEMA
from .spark_source import plan, read_batch

if TYPE_CHECKING:
    from levelzero.config import Config

RECORDS_DIR = "records"


@dataclass(frozen=True, slots=True)
class RecordsReport:
    topic: str
    path: str
    records: int
    ranges: int

    def summary(self) -> str:
        return (
            f"export --records {self.topic}: {self.records} records from {self.ranges} "
            f"object ranges to {self.path}"
        )


def records_path(out_dir: str, topic: str) -> str:
    return os.path.join(out_dir, RECORDS_DIR, f"{topic}.parquet")


def export_records(source: str | Config, out_dir: str, topic: str) -> RecordsReport:
    """`source`: a data directory (embedded defaults: SQLite, local objects) or the daemon's
    configuration (its control plane and object store, S3 included)."""
    ranges = plan(source, topic)
    path = records_path(out_dir, topic)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temp = os.path.join(os.path.dirname(path), f".{topic}.parquet.tmp")
    count = 0
    try:
        with pq.ParquetWriter(temp, SCHEMA) as writer:
            for r in ranges:
                batch = read_batch(source, r)
                writer.write_batch(batch)
                count += batch.num_rows
        os.replace(temp, path)
    except OSError as error:
        raise ExportError(f"writing {path}: {error}") from error
    finally:
        if os.path.exists(temp):
            os.remove(temp)
    return RecordsReport(topic, path, count, len(ranges))
