"""What the Spark jobs hand to the report: small tables and key figures, already collected."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class ResultTable:
    columns: list[str]
    rows: list[dict[str, Any]]


@dataclass(slots=True)
class Results:
    inputs: list[str]  # export directories
    rows: dict[str, int]  # input rows per table after deduplication
    bucket_s: float
    t0: float  # start of the first time bucket (unix seconds)
    buckets: int
    figures: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, ResultTable] = field(default_factory=dict)  # small: collected
    spark_tables: dict[str, str] = field(default_factory=dict)  # large: name -> dir Spark wrote
