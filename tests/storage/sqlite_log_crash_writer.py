"""Child process of the SQLite crash test: appends forever and reports each acknowledgement.

Usage: python sqlite_log_crash_writer.py DB_PATH PARTITIONS

Prints `ready` once the store is open (it then holds the lock), then one line
`ack <pid> <first_log_offset> <count>` per acknowledged append, flushed at once, so the parent
knows exactly what was durable when it sends SIGKILL. Every record's content is a function of
(pid, log_offset) — `expected_record` — so the parent can check each one byte for byte.
"""

from __future__ import annotations

import sys

import anyio

from levelzero.core.entries import LogRecord, Placeholder
from levelzero.storage.sqlite import SqliteLogStore

RECORDS_PER_APPEND = 3
APPENDS_PER_PARTITION_MAX = 100_000  # bound: the child never runs forever if the parent dies


def expected_record(pid: int, log_offset: int) -> LogRecord:
    entry = Placeholder(
        epoch=1,
        object_key=f"level_zero/data/000/{1:018}/crash-{pid}-{log_offset}",
        byte_offset=log_offset * 100,
        byte_length=100,
        record_count=1,
        checksum=(pid * 1_000_003 + log_offset) % 2**32,
    )
    return LogRecord(log_offset=log_offset, term=0, base_offset=log_offset, entry=entry)


async def main(path: str, partitions: int) -> None:
    async with await SqliteLogStore.open(path) as store:
        rows = await store.create_topic("crash", partitions, creation_epoch=1, now=0.0)
        print("ready", flush=True)

        async def appender(pid: int) -> None:
            for index in range(APPENDS_PER_PARTITION_MAX):
                first = index * RECORDS_PER_APPEND
                records = [expected_record(pid, first + i) for i in range(RECORDS_PER_APPEND)]
                await store.append(pid, 0, records)
                print(f"ack {pid} {first} {RECORDS_PER_APPEND}", flush=True)

        async with anyio.create_task_group() as tg:
            for row in rows:
                tg.start_soon(appender, row.pid)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]))
