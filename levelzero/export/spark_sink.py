"""The "levelzero" data source as a sink: `df.write.format("levelzero")` and `writeStream`
produce a DataFrame's rows as records through a daemon's HTTP API.

    df.write.format("levelzero").option("url", "http://127.0.0.1:8080").mode("append").save("orders")
    stream.writeStream.format("levelzero").option("url", URL).option("checkpointLocation", CP).start("orders")

Columns: `value` (binary or string, required), and where present `key` (binary or string),
`partition` (int), `timestamp` (TIMESTAMP), `headers` (array of (key string, value binary)
structs, as the source reads them). Other columns are ignored, so a levelzero stream's rows can
be written to another topic as they are. Without a `partition` column a record goes to the
partition of its key's CRC-32 (modulo the topic's partitions), a record without a key to the
Spark task's partition number (modulo the same).

Once per task attempt: a task sends its records to each topic partition in produces of
`records_per_request` (default 1,000), each with an idempotency key naming the write, the task's
Spark partition, the topic partition and the produce's number (`<write>/<task>/<partition>/<n>`).
A task retried after a failure (Spark's spark.task.maxFailures) sends the same produces again,
and the daemon answers those already stored with their offsets instead of storing them twice
(`ProduceRequest.idempotency_key`; a key sent again with other records is refused, 422
`idempotency_key_reused`, with the offsets of the records stored under it). The task then reads
the records stored under the key and compares them with its own: a failed attempt may have
stored only the first records of a produce (PySpark ends a writer's input without an error when
the rows' upstream fails, so the writer sends what it holds before the task fails); the rest are
sent under a key of their own (`<key>+<count>`). Records that differ fail the task with a message
saying so.

`<write>` is one id per `df.write` (made on the driver); for
a stream it is the query's id and micro-batch id, so a micro-batch Spark runs again after a
restart from its checkpoint is recognised too. This holds where a retried task produces the same
rows in the same order (a deterministic input, as a levelzero stream's micro-batch is) and while
the daemon remembers the keys (the last 100,000 (key, partition) pairs, durable across restarts).
A job that fails leaves the records its finished produces stored (there is no commit across
tasks): what its tasks stored is logged by the driver, as is what retries found stored.

`url` (or LEVELZERO_URL in the executors' environment) names the daemon; `token` its bearer token
(carried to the executors inside the task, never logged). Any other option is refused
(SINK_OPTIONS, STREAM_SINK_OPTIONS).
"""

from __future__ import annotations

import logging
import os
import uuid
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .errors import ExportError

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

log = logging.getLogger("levelzero.export")

RECORDS_PER_REQUEST_DEFAULT = 1000
STREAM_QUERY_ID = "sql.streaming.queryId"  # Spark's task-local properties of a micro-batch
STREAM_BATCH_ID = "streaming.sql.batchId"
_SINK_COLUMNS = ("key", "value", "partition", "timestamp", "headers")
# The sink's options (`path`: Spark passes `save("topic")` as it); a stream's also those Spark
# passes for writeStream's checkpoint and query name.
SINK_OPTIONS = ("path", "topic", "url", "token", "records_per_request")
STREAM_SINK_OPTIONS = (*SINK_OPTIONS, "checkpointLocation", "queryName")


@dataclass(frozen=True, slots=True)
class SinkTarget:
    url: str
    token: str | None
    topic: str
    records_per_request: int
    columns: frozenset[str]

    def __repr__(self) -> str:  # no token in a plan string or a log line
        return f"SinkTarget({self.url!r}, {self.topic!r})"


def sink_target(options: Any, schema: StructType) -> SinkTarget:
    from pyspark.sql.types import BinaryType, StringType

    from .spark_source import _int_option

    topic = options.get("path") or options.get("topic")
    if not topic:
        raise ExportError('the levelzero sink needs a topic: save("topic") or option("topic", ...)')
    url = options.get("url") or os.environ.get("LEVELZERO_URL")
    if not url:
        raise ExportError('the levelzero sink needs the daemon\'s URL: option("url", "http://host:port")')
    fields = {f.name: f.dataType for f in schema.fields}
    if not isinstance(fields.get("value"), (BinaryType, StringType)):
        raise ExportError("the levelzero sink needs a column value (binary or string)")
    if "key" in fields and not isinstance(fields["key"], (BinaryType, StringType)):
        raise ExportError("the levelzero sink's column key must be binary or string")
    per_request = _int_option(options, "records_per_request") or RECORDS_PER_REQUEST_DEFAULT
    columns = frozenset(c for c in _SINK_COLUMNS if c in fields)
    return SinkTarget(url, options.get("token") or None, topic, per_request, columns)


def _bytes(value: Any) -> bytes | None:
    if value is None:
        return None
    return value.encode() if isinstance(value, str) else bytes(value)


async def produce_rows(target: SinkTarget, write: str, task: int, rows: Iterator[Any]) -> tuple[int, int]:
    """Produce `rows` (one Spark task's) to the target topic, each produce keyed
    `<write>/<task>/<partition>/<n>`. Returns (records stored, records found already stored)."""
    from levelzero.client import ApiError, Client, RecordIn

    stored = duplicates = 0
    columns = target.columns
    async with Client(target.url, token=target.token) as client:
        try:
            counts = {t.name: t.partitions for t in await client.list_topics()}
        except ApiError as error:
            raise ExportError(f"levelzero sink: {error}") from None
        if target.topic not in counts:
            raise ExportError(f"levelzero sink: no topic {target.topic!r} at {target.url}")
        count = counts[target.topic]
        buffers: dict[int, list[RecordIn]] = {}
        sent: dict[int, int] = {}

        async def flush(partition: int) -> None:
            n = sent.get(partition, 0)
            sent[partition] = n + 1
            await send(partition, buffers.pop(partition), f"{write}/{task}/{partition}/{n}")

        async def send(partition: int, records: list[RecordIn], key: str) -> None:
            nonlocal stored, duplicates
            try:
                try:
                    answer = await client.produce(target.topic, partition, records, idempotency_key=key)
                except ApiError as error:
                    if error.code != "idempotency_key_reused" or error.first_offsets is None:
                        raise
                    # Stored by an earlier attempt of this task with other records: (an attempt
                    # whose input ended early, then failed) the first `count` of these, or not.
                    base, last = error.first_offsets
                else:
                    base, last = answer.base_offset, answer.last_offset
                    if not answer.duplicate:
                        stored += last - base + 1
                        return
                    # Stored by an earlier attempt of this task: the same records.
                count = last - base + 1
                before = await _stored(client, target.topic, partition, base, count)
            except ApiError as error:
                raise ExportError(f"levelzero sink: produce to {target.topic}/{partition}: {error}") from None
            if len(before) != count or not all(map(_same, records[:count], before)):
                raise ExportError(
                    f"levelzero sink: produce {key} to {target.topic}/{partition}: an earlier attempt"
                    " of this task stored other records under this key (the task's input is not"
                    " deterministic: a retried task must produce the same rows in the same order)"
                )
            duplicates += count
            if count < len(records):
                await send(partition, records[count:], f"{key}+{count}")

        for row in rows:
            key = _bytes(row["key"]) if "key" in columns else None
            if "partition" in columns and row["partition"] is not None:
                partition = row["partition"]
                if not 0 <= partition < count:
                    raise ExportError(
                        f"levelzero sink: partition {partition} is not in topic {target.topic!r}"
                        f" (partitions 0..{count - 1})"
                    )
            else:
                partition = (task if key is None else zlib.crc32(key)) % count
            when = row["timestamp"] if "timestamp" in columns else None
            headers = row["headers"] if "headers" in columns else None
            buffer = buffers.setdefault(partition, [])
            buffer.append(
                RecordIn(
                    _bytes(row["value"]),
                    key,
                    None if when is None else _millis(when),
                    [(h["key"], _bytes(h["value"])) for h in headers] if headers else None,
                )
            )
            if len(buffer) >= target.records_per_request:
                await flush(partition)
        for partition in sorted(buffers):
            await flush(partition)
    return stored, duplicates


def _identity(r: Any) -> tuple[Any, ...]:
    """A record as stored (RecordIn or RecordOut), for comparing what two attempts produced."""
    return (r.key, r.value, r.timestamp_ms, tuple(tuple(h) for h in r.headers or ()))


def _same(sent: Any, stored: tuple[Any, ...]) -> bool:
    """`sent` (a RecordIn) is the record stored as `stored` (an `_identity`): a record sent
    without a timestamp is stored with the time the daemon received it, each attempt its own."""
    mine = _identity(sent)
    if sent.timestamp_ms is None:
        return mine[:2] + mine[3:] == stored[:2] + stored[3:]
    return mine == stored


async def _stored(client: Any, topic: str, partition: int, base: int, count: int) -> list[tuple[Any, ...]]:
    """The records at offsets base..base+count-1, as `_identity`s."""
    out: list[tuple[Any, ...]] = []
    offset = base
    while len(out) < count:
        fetched = await client.fetch(topic, partition, offset)
        if not fetched.records:
            break  # deleted since (retention): they differ from what is sent
        out += [_identity(r) for r in fetched.records[: count - len(out)]]
        offset = fetched.next_offset
    return out


def _millis(when: datetime) -> int:
    return int(when.timestamp() * 1000)


try:
    from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
except ImportError:  # pragma: no cover - pyspark is in the analysis extra
    DataSourceStreamWriter = DataSourceWriter = WriterCommitMessage = object  # type: ignore[misc,assignment]


@dataclass
class Produced(WriterCommitMessage):
    stored: int
    duplicates: int  # found already stored: a retried task's produces


def _write(target: SinkTarget, write: str, rows: Iterator[Any]) -> Produced:
    import anyio
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None, "a sink's write runs in a Spark task"
    stored, duplicates = anyio.run(produce_rows, target, write, context.partitionId(), rows)
    return Produced(stored, duplicates)


def _log_commit(target: SinkTarget, what: str, messages: Sequence[Any]) -> None:
    produced = [m for m in messages if isinstance(m, Produced)]
    log.info(
        "levelzero sink %s to %s: %d records stored, %d found already stored (retried tasks)",
        what,
        target.topic,
        sum(m.stored for m in produced),
        sum(m.duplicates for m in produced),
    )


class LevelZeroWriter(DataSourceWriter):
    def __init__(self, target: SinkTarget) -> None:
        self.target = target
        self.write_id = uuid.uuid4().hex  # on the driver: the same for every attempt of a task

    def write(self, iterator: Iterator[Any]) -> Produced:
        return _write(self.target, self.write_id, iterator)

    def commit(self, messages: list[Any]) -> None:
        _log_commit(self.target, "write", messages)

    def abort(self, messages: list[Any]) -> None:
        _log_commit(self.target, "write failed;", messages)


class LevelZeroStreamWriter(DataSourceStreamWriter):
    def __init__(self, target: SinkTarget) -> None:
        self.target = target

    def write(self, iterator: Iterator[Any]) -> Produced:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None, "a sink's write runs in a Spark task"
        query, batch = context.getLocalProperty(STREAM_QUERY_ID), context.getLocalProperty(STREAM_BATCH_ID)
        if query is None or batch is None:
            raise ExportError("levelzero sink: a micro-batch without Spark's query and batch ids")
        return _write(self.target, f"{query}/{batch}", iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
        _log_commit(self.target, f"micro-batch {batchId}", messages)

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
        _log_commit(self.target, f"micro-batch {batchId} failed;", messages)
