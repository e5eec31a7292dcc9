"""`levelzero export` from a PostgreSQL control plane: the same tables, from one read-only
snapshot, with the same incremental watermarks (`seq` where SQLite has rowid)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import asyncpg
from daemon_support import daemon_and_client, postgres_overrides

from levelzero.export.cli import export_main
from levelzero.export.export import export
from levelzero.storage.postgres.store import PostgresLogStore

sys.path.insert(0, str(Path(__file__).parent))
from test_export_analysis import prune_between_two_exports, read_table


async def _log_keys(dsn: str) -> set[tuple[str, int, int]]:
    connection = await asyncpg.connect(dsn)
    try:
        rows = await connection.fetch(
            "SELECT p.topic, p.partition, l.log_offset FROM log l JOIN partitions p USING (pid)"
        )
    finally:
        await connection.close()
    return {(r["topic"], r["partition"], r["log_offset"]) for r in rows}


async def _workload(data_dir: Path, dsn: str) -> None:
    async with daemon_and_client(data_dir, **postgres_overrides(dsn)) as (_, client):
        await client.create_topic("t", 2)
        for i in range(5):
            await client.produce("t", i % 2, [b"a", b"b"])
        await client.advance_epoch()
        await client.run_housekeeper(force=True)
        await client.gc_run()


def test_export_reads_a_postgres_control_plane_incrementally(tmp_path: Path, postgres_dsn: str) -> None:
    asyncio.run(_workload(tmp_path / "data", postgres_dsn))
    out = str(tmp_path / "out")
    report = export(postgres_dsn, out)
    expected = asyncio.run(_log_keys(postgres_dsn))
    exported = read_table(out, "log_entries").to_pylist()
    assert {(r["topic"], r["partition"], r["log_offset"]) for r in exported} == expected
    assert report.rows["log_entries"] == len(expected) > 0
    assert report.rows["l0_objects"] >= 1 and report.rows["gc_rounds"] >= 1
    assert report.rows["fence_events"] >= 1
    assert "levelzero-test" not in report.db_path  # the password is never shown
    again = export(postgres_dsn, out)
    assert again.total_rows == 0  # nothing new: the watermarks held


def test_export_cli_takes_a_dsn_and_refuses_a_database_that_is_not_a_store(
    tmp_path: Path,
    postgres_dsn: str,
    capsys,
) -> None:
    assert export_main(["--dsn", postgres_dsn, "--out", str(tmp_path / "o"), "--quiet"]) != 0
    assert "is not a levelzero store of schema version" in capsys.readouterr().err


def test_a_row_committing_after_a_higher_seq_is_exported_once(tmp_path: Path, postgres_dsn: str) -> None:
    """Writers commit concurrently (no lock orders them), so a row can commit after a row with
    a higher `seq` was exported. The export takes only rows of transactions below its
    snapshot's horizon: the late row is exported by the next export, and no row twice."""

    async def create_store() -> None:
        async with await PostgresLogStore.open(postgres_dsn) as store:
            await store.create_topic("t", 1, 1, 0.0)

    insert = "INSERT INTO l0_objects (key, epoch, size, created_at, extents) VALUES ($1, 1, 1, 0, 1)"
    asyncio.run(create_store())
    loop = asyncio.new_event_loop()
    try:
        slow, fast = (loop.run_until_complete(asyncpg.connect(postgres_dsn)) for _ in range(2))
        transaction = slow.transaction()
        loop.run_until_complete(transaction.start())
        loop.run_until_complete(slow.execute(insert, "late"))  # draws the lower seq
        loop.run_until_complete(fast.execute(insert, "early"))  # a higher seq, committed
        out = str(tmp_path / "out")
        first = export(postgres_dsn, out)
        loop.run_until_complete(transaction.commit())
        second = export(postgres_dsn, out)
        third = export(postgres_dsn, out)
        for connection in (slow, fast):
            loop.run_until_complete(connection.close())
    finally:
        loop.close()
    assert (first.rows["l0_objects"], second.rows["l0_objects"], third.rows["l0_objects"]) == (0, 2, 0)
    keys = [row["key"] for row in read_table(out, "l0_objects").to_pylist()]
    assert sorted(keys) == ["early", "late"]


def test_rows_restored_from_another_servers_dump_are_exported(tmp_path: Path, postgres_dsn: str) -> None:
    """A logical dump restored into another server keeps the rows' xids while the server's
    transaction counter starts again low: the store, when it opens, hands such rows over to
    the seq rule (xid 0), so the export takes them now instead of when the counter passes."""

    async def restore_and_open() -> int:
        async with await PostgresLogStore.open(postgres_dsn) as store:
            await store.create_topic("t", 1, 1, 0.0)
        connection = await asyncpg.connect(postgres_dsn)
        try:
            await connection.execute(
                "INSERT INTO l0_objects (key, epoch, size, created_at, extents, xid)"
                " VALUES ('restored', 1, 1, 0, 1, txid_current() + 1000000)"
            )
            async with await PostgresLogStore.open(postgres_dsn):
                pass
            return await connection.fetchval("SELECT xid FROM l0_objects WHERE key = 'restored'")
        finally:
            await connection.close()

    assert asyncio.run(restore_and_open()) == 0
    out = str(tmp_path / "out")
    assert export(postgres_dsn, out).rows["l0_objects"] == 1
    assert [row["key"] for row in read_table(out, "l0_objects").to_pylist()] == ["restored"]


def test_the_pruned_deletions_of_objects_live_at_the_last_export_are_named(
    tmp_path: Path, postgres_dsn: str
) -> None:
    """As on SQLite, but only the deletions of the L0 objects live at the last export are
    counted (its runs name rows that were all there): a sequence leaves gaps (a group commit
    retried, a transaction still open), so a count of the rows missing above a watermark would
    name rows that never were."""
    first, second = asyncio.run(
        prune_between_two_exports(
            lambda: PostgresLogStore.open(postgres_dsn), postgres_dsn, str(tmp_path / "out")
        )
    )
    assert first.warnings == [] and (first.rows["fence_events"], first.rows["l0_objects"]) == (2, 1)
    assert (second.rows["fence_events"], second.rows["l0_objects"], second.rows["l0_deletions"]) == (2, 1, 0)
    assert second.warnings == [
        "1 history row (1 of l0_deletions) was pruned from the store (older than its "
        "control.history_retention_s) before this directory exported it: export more often than "
        "that to keep every row"
    ]
