"""Structured Streaming with the "levelzero" data source: `spark.readStream.format("levelzero")`.

    spark.readStream.format("levelzero").option("data_dir", DIR).option("maxRecordsPerTrigger", "10000")
        .option("startingOffsets", "earliest").load("orders")

The stream's offset is a JSON object: each partition's next offset to read, by partition number
(`{"0": 1200, "1": 875}`), stored in the query's checkpoint. A micro-batch reads offsets
`[start, end)` of each partition with the batch data source's own planning and reading (object
ranges from the control plane, Arrow batches from the objects: `spark_source`), so a micro-batch
is the batch read of those offsets. Restarted from its checkpoint, a query continues at the
offsets it committed: a micro-batch that was planned but not committed is read again, the same
records (offsets name records; the store never renumbers them).

Options (besides the batch source's `data_dir`/`config` and credentials):
- `startingOffsets`: `earliest` (default: each partition's first readable offset), `latest` (its
  high watermark: only records produced after the query starts), or per-partition JSON
  (`{"0": 15, "1": -2}`; -2 earliest, -1 latest; a partition left out starts at earliest).
  Only for a new query: a restarted query continues from its checkpoint.
- `maxRecordsPerTrigger`: at most this many records per micro-batch (shared between partitions
  in proportion to what each has pending). `Trigger.AvailableNow` reads what is there when the
  query starts, in micro-batches of that size, and stops.
- `task_bytes`: as the batch source's (object ranges per Spark task).
Any other option is refused (STREAM_OPTIONS).

A partition created after the query started is read from its earliest offset. Offsets a
partition no longer holds (deleted by retention before they were read) are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .errors import ExportError
from .spark_source import (
    STORE_OPTIONS,
    _catalog,
    _int_option,
    Selection,
    _Partition,
    _replay,
    plan,
    read_partition,
    tasks,
    topic_partitions,
)

if TYPE_CHECKING:
    from levelzero.config import Config

EARLIEST, LATEST = -2, -1  # Kafka's markers in a per-partition startingOffsets
# The stream reader's options.
STREAM_OPTIONS = (*STORE_OPTIONS, "startingOffsets", "maxRecordsPerTrigger", "task_bytes")


def partition_bounds(config: Config, topic: str) -> dict[int, tuple[int, int]]:
    """Each partition's readable range now: (start offset, high watermark), from one snapshot of
    the control plane (as the batch source plans)."""
    with _catalog(config) as db:
        bounds = {}
        for pid, partition, creation_epoch in topic_partitions(db, config, topic):
            state = _replay(db, pid, creation_epoch)
            bounds[partition] = (state.start_offset, state.high_watermark)
        return bounds


def parse_starting(option: str | None) -> str | dict[str, int]:
    """The `startingOffsets` option: "earliest", "latest" or partition -> offset."""
    value = (option or "earliest").strip()
    if value in ("earliest", "latest"):
        return value
    try:
        given = json.loads(value)
    except ValueError:
        given = None
    if not isinstance(given, dict) or not all(
        isinstance(k, str) and k.isdigit() and type(v) is int and v >= -2 for k, v in given.items()
    ):
        raise ExportError(
            f"option startingOffsets={value!r}: not earliest, latest or a JSON object of"
            ' partition -> offset ({"0": 15, "1": -2}; -2 earliest, -1 latest)'
        )
    return given


def starting_offsets(option: str | None, bounds: Mapping[int, tuple[int, int]]) -> dict[str, int]:
    """The stream's first offset for the `startingOffsets` option (see the module)."""
    given = parse_starting(option)
    if given == "earliest":
        return {str(p): start for p, (start, _) in bounds.items()}
    if given == "latest":
        return {str(p): end for p, (_, end) in bounds.items()}
    assert isinstance(given, dict), given
    unknown = sorted(int(k) for k in given if int(k) not in bounds)
    if unknown:
        raise ExportError(f"option startingOffsets: no partition {unknown[0]} in the topic")
    out = {}
    for p, (start, end) in bounds.items():
        wanted = given.get(str(p), EARLIEST)
        out[str(p)] = (
            start if wanted == EARLIEST else end if wanted == LATEST else min(max(wanted, start), end)
        )
    return out


def limited(
    start: Mapping[str, int], available: Mapping[str, int], max_records: int | None
) -> dict[str, int]:
    """The end offsets of the next micro-batch: `available` (each partition's end), cut to
    `max_records` in all (None: no limit), shared in proportion to what each partition has
    pending past `start`; the records the rounding leaves go first to partitions it gave none,
    so a partition with few records pending is not starved by a busy one. Never behind `start`."""
    pending = {p: max(0, end - start.get(p, 0)) for p, end in available.items()}
    total = sum(pending.values())
    if max_records is None or total <= max_records:
        return {p: max(end, start.get(p, 0)) for p, end in available.items()}
    assert max_records >= 1, max_records
    share = {p: n * max_records // total for p, n in pending.items()}
    left = max_records - sum(share.values())
    for p in sorted(pending, key=lambda p: (share[p] > 0, -(pending[p] - share[p]), int(p))):
        if left == 0:
            break
        if share[p] < pending[p]:
            share[p] += 1
            left -= 1
    return {
        p: start.get(p, 0) + share[p] if pending[p] else max(end, start.get(p, 0))
        for p, end in available.items()
    }


try:
    from pyspark.sql.datasource import DataSourceStreamReader
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - pyspark is in the analysis extra
    DataSourceStreamReader = SupportsTriggerAvailableNow = object  # type: ignore[misc,assignment]
    ReadAllAvailable = ReadLimit = ReadMaxRows = object  # type: ignore[misc,assignment]


class LevelZeroStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of a topic's records: offsets per partition, read as the batch source reads."""

    def __init__(self, config: Config, topic: str, options: Mapping[str, str], task_bytes: int) -> None:
        self.config, self.topic, self.task_bytes = config, topic, task_bytes
        self.starting = options.get("startingOffsets")
        self.max_records = _int_option(options, "maxRecordsPerTrigger")
        if self.max_records == 0:
            raise ExportError("option maxRecordsPerTrigger=0: must be >= 1")
        self.target: dict[str, int] | None = None  # Trigger.AvailableNow: the ends to stop at
        parse_starting(self.starting)  # a malformed option fails when the query starts

    def _ends(self) -> dict[str, int]:
        return {str(p): end for p, (_, end) in partition_bounds(self.config, self.topic).items()}

    def initialOffset(self) -> dict:  # noqa: N802 - Spark's name
        return starting_offsets(self.starting, partition_bounds(self.config, self.topic))

    def getDefaultReadLimit(self) -> Any:  # noqa: N802 - Spark's name
        return ReadAllAvailable() if self.max_records is None else ReadMaxRows(self.max_records)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark's name
        self.target = self._ends()

    def latestOffset(self, start: dict, limit: Any) -> dict:  # noqa: N802 - Spark's name
        available = self.target if self.target is not None else self._ends()
        max_records = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return limited(start, available, max_records)  # a partition created since: from 0

    def reportLatestOffset(self) -> dict:  # noqa: N802 - Spark's name
        return self._ends()

    def partitions(self, start: dict, end: dict) -> Sequence[Any]:
        """Each partition's offsets `[start, end)` as the batch read plans them, in tasks of
        about `task_bytes` that never span two partitions: a micro-batch is a fraction of a
        batch read, and tasks of 128 MiB across partitions left it one task on one core."""
        out = []
        for p, stop in sorted(end.items(), key=lambda item: int(item[0])):
            first = start.get(p, 0)
            if stop > first:
                selection = Selection(first, stop, partitions=frozenset({int(p)}))
                ranges = plan(self.config, self.topic, selection)
                out += [_Partition(task) for task in tasks(ranges, self.task_bytes)]
        return out

    def read(self, partition: Any) -> Iterator[Any]:
        return read_partition(self.config, partition)

    def commit(self, end: dict) -> None:
        pass  # the store keeps records by retention, not by readers' progress
