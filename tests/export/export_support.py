"""Hand-made export directories: rows written in the documented layout and schemas."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from levelzero.export import SCHEMAS

T0 = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC: the rows of these tests fall on that date


def write_table(out: Path, table: str, rows: list[dict]) -> None:
    """`rows` (times as unix seconds) as the export writes them (times as TIMESTAMP)."""
    schema = SCHEMAS[table]
    times = [f.name for f in schema if pa.types.is_timestamp(f.type)]
    rows = [{**row, **{t: datetime.fromtimestamp(row[t], UTC) for t in times}} for row in rows]
    directory = out / table / "date=2023-11-14"
    directory.mkdir(parents=True)
    pq.write_table(
        pa.Table.from_pylist(rows, schema=schema),
        directory / "part-000001-20231114T221320Z.parquet",
    )


def sample(seq: int, at: float, partition: int, mp: int) -> dict:
    return dict(
        seq=seq,
        sampled_at=T0 + at,
        topic="a",
        partition=partition,
        term=1,
        previous_applied_epoch=mp,
        max_applied_epoch=mp + 1,
        min_epoch_lower_bound=mp,
        mp=mp,
        lro=-1,
        high_watermark=0,
        start_offset=0,
    )
