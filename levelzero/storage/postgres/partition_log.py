"""The partitions and their logs: topics made, appends fenced by term and next offset in the
database, reads of records, placeholders and snapshots.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import asyncpg
import msgspec

from levelzero.core.entries import ENTRY_KINDS, LogRecord, TermStart, decode_entry
from levelzero.core.errors import (
    CorruptData,
    InvalidInput,
    InvariantViolation,
    LevelZeroError,
    LogMovedOn,
    NotLeader,
    SnapshotSuperseded,
    TopicExists,
    UnknownTopic,
)
from levelzero.storage.log_rules import check_append_records, check_create_topic, log_row
from levelzero.storage.protocols import Append, L1State, OnDurable, PartitionRow, Snapshot
from .base import (
    PostgresBase,
    _Job,
    _LOG_COLUMNS,
    _LOG_INSERT,
    _PARTITION_COLUMNS,
    _SELECT_PLACEHOLDERS,
    _columns,
    unknown_partition,
)


# A topic's configs from two arrays (names, values).
INSERT_TOPIC_CONFIGS = (
    "INSERT INTO topic_configs (topic, name, value, updated_at)"
    " SELECT $1::text, n, v, $4::float8 FROM unnest($2::text[], $3::text[]) AS c (n, v)"
)


class PartitionLogRole(PostgresBase):
    # ------------------------------------------------------------------ partitions

    async def create_topic(
        self,
        topic: str,
        partitions: int,
        creation_epoch: int,
        now: float,
        configs: Mapping[str, str] | None = None,
    ) -> list[PartitionRow]:
        check_create_topic(topic, partitions, creation_epoch)
        names, values = zip(*sorted((configs or {}).items()), strict=True) if configs else ((), ())

        async def read(connection: asyncpg.Connection) -> list[PartitionRow]:
            rows = await connection.fetch(
                f"SELECT {_PARTITION_COLUMNS} FROM partitions WHERE topic = $1 ORDER BY partition",
                topic,
            )
            return [PartitionRow(*row) for row in rows]

        async def work(connection: asyncpg.Connection) -> list[PartitionRow]:
            # The creation epoch is at least the cluster epoch as stored, read under a share
            # lock that holds back any raise until this commits: a GC round whose snapshot
            # misses the new partitions read E <= their creation epoch, so its cap E - 1 keeps
            # their objects, however stale the creating node's epoch cache is.
            stored = await connection.fetchval("SELECT epoch FROM cluster_epoch WHERE id = 1 FOR SHARE")
            epoch = max(creation_epoch, stored or 1)
            try:
                await connection.execute(
                    "INSERT INTO partitions (topic, partition, creation_epoch, term, created_at)"
                    " SELECT $1::text, p, $2::bigint, 0, $3::float8"
                    " FROM generate_series(0, $4::int - 1) AS p",
                    topic,
                    epoch,
                    now,
                    partitions,
                )
            except asyncpg.UniqueViolationError:
                raise TopicExists(f"topic {topic!r} exists") from None
            await connection.execute("DELETE FROM topic_configs WHERE topic = $1", topic)  # leftovers
            await connection.execute(INSERT_TOPIC_CONFIGS, topic, list(names), list(values), now)
            created = await read(connection)
            assert [row.partition for row in created] == list(range(partitions))
            return created

        return await self._transact(f"creating topic {topic!r}", work, read)

    async def add_partitions(
        self, topic: str, count: int, creation_epoch: int, now: float
    ) -> list[PartitionRow]:
        check_create_topic(topic, count, creation_epoch)

        async def work(connection: asyncpg.Connection) -> list[PartitionRow]:
            # Two adds at once: the second waits on the first's locked rows, then counts its
            # partitions too (the UNIQUE (topic, partition) refuses what slips through).
            locked = await connection.fetch(
                "SELECT partition FROM partitions WHERE topic = $1 FOR UPDATE", topic
            )
            current = len(locked)
            if not current:
                raise UnknownTopic(topic)
            if count <= current:
                raise InvalidInput(f"topic {topic!r} has {current} partitions; {count} would not add any")
            # At least the stored cluster epoch, under a share lock, as `create_topic`.
            stored = await connection.fetchval("SELECT epoch FROM cluster_epoch WHERE id = 1 FOR SHARE")
            epoch = max(creation_epoch, stored or 1)
            try:
                await connection.execute(
                    "INSERT INTO partitions (topic, partition, creation_epoch, term, created_at)"
                    " SELECT $1::text, p, $2::bigint, 0, $3::float8"
                    " FROM generate_series($4::int, $5::int - 1) AS p",
                    topic,
                    epoch,
                    now,
                    current,
                    count,
                )
            except asyncpg.UniqueViolationError:
                raise InvalidInput(f"topic {topic!r} grew meanwhile; ask again") from None
            rows = await connection.fetch(
                f"SELECT {_PARTITION_COLUMNS} FROM partitions WHERE topic = $1 AND partition >= $2"
                " ORDER BY partition",
                topic,
                current,
            )
            return [PartitionRow(*row) for row in rows]

        async def resolve(connection: asyncpg.Connection) -> list[PartitionRow]:
            rows = await connection.fetch(
                f"SELECT {_PARTITION_COLUMNS} FROM partitions WHERE topic = $1 AND created_at = $2"
                " ORDER BY partition",
                topic,
                now,
            )
            return [PartitionRow(*row) for row in rows]

        return await self._transact(f"adding partitions to topic {topic!r}", work, resolve)

    async def delete_topic(self, topic: str, now: float) -> list[PartitionRow]:
        async def work(connection: asyncpg.Connection) -> list[PartitionRow]:
            # The rows locked first: an append, a lease or a watermark of these partitions in
            # flight commits before this (and its rows go with the rest) or finds them gone.
            rows = [
                PartitionRow(*row)
                for row in await connection.fetch(
                    f"SELECT {_PARTITION_COLUMNS} FROM partitions WHERE topic = $1 ORDER BY pid FOR UPDATE",
                    topic,
                )
            ]
            if not rows:
                raise UnknownTopic(topic)
            pids = [row.pid for row in rows]
            await connection.execute(
                "INSERT INTO deleted_partitions (pid, topic, partition, creation_epoch, term,"
                " created_at, deleted_at) SELECT pid, topic, partition, creation_epoch, term,"
                " created_at, $2 FROM partitions WHERE pid = ANY($1::bigint[])",
                pids,
                now,
            )
            for table in ("partition_leases", "partition_watermarks", "log", "snapshots", "partitions"):
                await connection.execute(f"DELETE FROM {table} WHERE pid = ANY($1::bigint[])", pids)
            for table in ("consumer_offsets", "producer_batches", "topic_configs", "txn_ranges"):
                await connection.execute(f"DELETE FROM {table} WHERE topic = $1", topic)
            return rows

        async def resolve(connection: asyncpg.Connection) -> list[PartitionRow]:
            rows = await connection.fetch(
                "SELECT pid, topic, partition, creation_epoch, term, created_at FROM deleted_partitions"
                " WHERE topic = $1 AND deleted_at = $2 ORDER BY pid",
                topic,
                now,
            )
            return [PartitionRow(*row) for row in rows]

        return await self._transact(f"deleting topic {topic!r}", work, resolve)

    async def deleted_partitions(self) -> list[PartitionRow]:
        rows = await self._read(
            "listing deleted partitions",
            "SELECT pid, topic, partition, creation_epoch, term, created_at FROM deleted_partitions"
            " WHERE collected_at IS NULL ORDER BY pid",
        )
        return [PartitionRow(*row) for row in rows]

    async def forget_deleted_partition(self, pid: int) -> bool:
        now = self._clock()

        async def work(connection: asyncpg.Connection) -> bool:
            pending = await connection.fetchval(
                "SELECT 1 FROM deleted_partitions WHERE pid = $1 AND collected_at IS NULL FOR UPDATE", pid
            )
            unfinished = await connection.fetchval(
                "SELECT 1 FROM l1_objects WHERE pid = $1 AND state <> $2 LIMIT 1",
                pid,
                L1State.DELETE_FINISHED,
            )
            if pending is None or unfinished is not None:
                return False
            await connection.execute("DELETE FROM l1_objects WHERE pid = $1", pid)
            await connection.execute("DELETE FROM l1_compacted WHERE pid = $1", pid)
            await connection.execute("DELETE FROM cleaner_offsets WHERE pid = $1", pid)
            await connection.execute(
                "UPDATE deleted_partitions SET collected_at = $2 WHERE pid = $1", pid, now
            )
            return True

        async def resolve(_connection: asyncpg.Connection) -> bool:
            return True

        return await self._transact("forgetting a deleted partition", work, resolve)

    async def list_partitions(self) -> list[PartitionRow]:
        rows = await self._read(
            "listing partitions", f"SELECT {_PARTITION_COLUMNS} FROM partitions ORDER BY pid"
        )
        return [PartitionRow(*row) for row in rows]

    async def begin_term(self, pid: int, log_offset: int, base_offset: int, at_least: int = 0) -> LogRecord:
        now = self._clock()

        async def work(connection: asyncpg.Connection) -> LogRecord:
            row = await connection.fetchrow(
                "UPDATE partitions SET term = GREATEST(term + 1, $3), next_log_offset = next_log_offset + 1"
                " WHERE pid = $1 AND next_log_offset = $2 RETURNING term",
                pid,
                log_offset,
                at_least,
            )
            if row is None:
                raise await self._offset_refused(connection, pid, "TermStart", log_offset, moved_on=True)
            term = row["term"]
            record = LogRecord(log_offset, term, base_offset, TermStart(term))
            await connection.execute(_LOG_INSERT, *_columns([log_row(pid, record, now)], 11))
            return record

        async def resolve(connection: asyncpg.Connection) -> LogRecord:
            rows = await connection.fetch(
                f"SELECT {_LOG_COLUMNS} FROM log WHERE pid = $1 AND log_offset = $2", pid, log_offset
            )
            return self._decode(pid, rows[0])

        return await self._transact(f"starting a term of partition id {pid}", work, resolve)

    async def _offset_refused(
        self, connection: asyncpg.Connection, pid: int, what: str, log_offset: int, *, moved_on: bool = False
    ) -> LevelZeroError | InvariantViolation:
        """Why an append or term start at `log_offset` was refused. With `moved_on`, a log that
        grew past it is `LogMovedOn` (a term start after a replay raced the last append)."""
        row = await connection.fetchrow(
            "SELECT topic, partition, next_log_offset FROM partitions WHERE pid = $1", pid
        )
        if row is None:
            return await unknown_partition(connection, pid, what)
        if moved_on and row["next_log_offset"] > log_offset:
            return LogMovedOn(f"{row['topic']}/{row['partition']}", log_offset, row["next_log_offset"])
        return InvariantViolation(
            f"partition {row['topic']}/{row['partition']}: {what} at log offset {log_offset}, "
            f"the log continues at {row['next_log_offset']}"
        )

    # ------------------------------------------------------------------ log

    async def append(self, pid: int, expected_term: int, records: Sequence[LogRecord]) -> None:
        await self._submit(self._append_job(pid, expected_term, records))

    async def append_many(
        self, appends: Sequence[Append], on_durable: OnDurable | None = None
    ) -> list[NotLeader | None]:
        # A job per partition, all sent before the first wait: the writers batch them together
        # (a partition's job is one statement's rows; the batch is one round trip). A crowd of
        # them may go out as two batches on two writers (`_pick`); `on_durable` tells each
        # partition at its own batch's COMMIT, so the first batch's callers write again while
        # the second commits, as a writer per half of the partitions would.
        jobs = [self._append_job(a.pid, a.expected_term, a.records) for a in appends]
        assert len({job.pid for job in jobs}) == len(jobs), "append_many: a partition twice"
        failures: list[Exception] = []
        if on_durable is not None:
            index_of = {job.pid: index for index, job in enumerate(jobs)}

            def notify(job: _Job) -> None:
                if job.error is None or isinstance(job.error, NotLeader):
                    try:
                        on_durable(index_of[job.pid], job.error)
                    except Exception as error:  # noqa: BLE001 - raised from this call, not the batch task
                        failures.append(error)

            for job in jobs:
                job.notify = notify
        await self._send_all(jobs)
        for job in jobs:
            await job.done.wait()
        for job in jobs:
            if job.error is not None and not isinstance(job.error, NotLeader):
                raise job.error
        if failures:
            raise failures[0]
        return [job.error if isinstance(job.error, NotLeader) else None for job in jobs]

    def _append_job(self, pid: int, expected_term: int, records: Sequence[LogRecord]) -> _Job:
        now = self._clock()
        records = list(records)
        check_append_records(pid, expected_term, records)
        rows = [log_row(pid, record, now) for record in records]
        return _Job(weight=len(records), pid=pid, term=expected_term, records=records, log_rows=rows)

    async def read_log(self, pid: int, from_log_offset: int, limit: int | None = None) -> list[LogRecord]:
        if limit is not None and limit < 0:
            raise InvalidInput(f"limit must be >= 0, not {limit}")
        rows = await self._read(
            "reading a log",
            f"SELECT {_LOG_COLUMNS} FROM log WHERE pid = $1 AND log_offset >= $2"
            " ORDER BY log_offset LIMIT $3",
            pid,
            from_log_offset,
            limit,
        )
        return [self._decode(pid, row) for row in rows]

    async def read_placeholders(self, pid: int, from_data_offset: int, limit: int) -> list[LogRecord]:
        if limit < 0:
            raise InvalidInput(f"limit must be >= 0, not {limit}")
        rows = await self._read("reading placeholders", _SELECT_PLACEHOLDERS, pid, from_data_offset, limit)
        return [self._decode(pid, row) for row in rows]

    def _decode(self, pid: int, row: asyncpg.Record) -> LogRecord:
        log_offset, term, base_offset, kind, blob = row
        try:
            entry = decode_entry(blob)
        except (msgspec.DecodeError, TypeError) as error:
            raise CorruptData(
                f"{self._where}: partition pid={pid} log offset {log_offset}: "
                f"entry blob does not decode ({error})"
            ) from None
        if ENTRY_KINDS[type(entry)] != kind:
            raise CorruptData(
                f"{self._where}: partition pid={pid} log offset {log_offset}: "
                f"entry blob holds {ENTRY_KINDS[type(entry)]}, row says {kind}"
            )
        return LogRecord(log_offset, term, base_offset, entry)

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        """Replace the partition's snapshot; it must cover no more than the log holds and never
        go back (truncation may already have removed what an older snapshot would need)."""
        now = self._clock()

        async def work(connection: asyncpg.Connection) -> None:
            row = await connection.fetchrow(
                "SELECT p.topic, p.partition, p.next_log_offset, s.log_offset AS saved"
                " FROM partitions p LEFT JOIN snapshots s ON s.pid = p.pid WHERE p.pid = $1"
                " FOR UPDATE OF p",
                snapshot.pid,
            )
            if row is None:
                raise await unknown_partition(connection, snapshot.pid, "snapshot")
            name = f"{row['topic']}/{row['partition']}"
            if not (-1 <= snapshot.log_offset < row["next_log_offset"]):
                raise InvariantViolation(
                    f"partition {name}: snapshot at log offset {snapshot.log_offset}, "
                    f"the log ends before {row['next_log_offset']}"
                )
            if row["saved"] is not None and snapshot.log_offset < row["saved"]:
                raise SnapshotSuperseded(name, snapshot.log_offset, row["saved"])
            await connection.execute(
                "INSERT INTO snapshots (pid, log_offset, data, saved_at) VALUES ($1, $2, $3, $4)"
                " ON CONFLICT (pid) DO UPDATE SET log_offset = excluded.log_offset,"
                " data = excluded.data, saved_at = excluded.saved_at",
                snapshot.pid,
                snapshot.log_offset,
                snapshot.data,
                now,
            )

        await self._transact("saving a snapshot", work)

    async def load_snapshot(self, pid: int) -> Snapshot | None:
        rows = await self._read(
            "loading a snapshot", "SELECT log_offset, data FROM snapshots WHERE pid = $1", pid
        )
        if not rows:
            return None
        return Snapshot(pid=pid, log_offset=rows[0]["log_offset"], data=bytes(rows[0]["data"]))

    async def truncate_below(self, pid: int, log_offset: int) -> int:
        async def work(connection: asyncpg.Connection) -> int:
            row = await connection.fetchrow(
                "SELECT p.topic, p.partition, s.log_offset AS saved FROM partitions p"
                " LEFT JOIN snapshots s ON s.pid = p.pid WHERE p.pid = $1",
                pid,
            )
            if row is None:
                raise await unknown_partition(connection, pid, "truncation")
            allowed = -1 if row["saved"] is None else row["saved"]
            if log_offset > allowed + 1:
                raise InvariantViolation(
                    f"partition {row['topic']}/{row['partition']}: truncating below log offset "
                    f"{log_offset} would drop entries no snapshot covers "
                    f"(snapshot at {row['saved']})"
                )
            status = await connection.execute(
                "DELETE FROM log WHERE pid = $1 AND log_offset < $2", pid, log_offset
            )
            return int(status.split()[-1])

        async def resolve(_connection: asyncpg.Connection) -> int:
            return 0  # done before the answer was lost; how many rows it removed is not kept

        return await self._transact("truncating a log", work, resolve)
