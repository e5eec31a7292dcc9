"""The consumer-offsets role (Kafka's committed offsets): durable across reopening, last write
wins per (group, topic, partition), groups kept apart; a file made before the table existed gets
it when opened. SQLite and the memory store answer alike. The producer-batch role (idempotent
Kafka producers' newest batches per partition) is kept alike by SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.postgres.store import PostgresLogStore
from levelzero.storage.protocols import (
    ConsumerOffsetStore,
    OffsetRow,
    ProducerBatchExpiry,
    ProducerBatchRow,
    ProducerBatchStore,
)
from levelzero.storage.sqlite.store import SqliteLogStore


async def exercise(store: ConsumerOffsetStore) -> None:
    assert isinstance(store, ConsumerOffsetStore)
    await store.commit_offsets(
        [OffsetRow("g", "t", 1, 10, "a", 1.0, 3), OffsetRow("g", "t", 0, 5, "", 1.0, 2)]
    )
    await store.commit_offsets([OffsetRow("g", "t", 1, 12, "b", 2.0), OffsetRow("h", "t", 0, 99, "", 2.0)])
    assert await store.committed_offsets("g") == [
        OffsetRow("g", "t", 0, 5, "", 1.0, 2),  # the committed leader epoch is kept
        OffsetRow("g", "t", 1, 12, "b", 2.0, -1),  # and replaced with the rest
    ]
    assert await store.committed_offsets("h") == [OffsetRow("h", "t", 0, 99, "", 2.0)]
    assert await store.committed_offsets("nobody") == []
    # ListGroups' offsets-only groups, OffsetDelete and DeleteGroups.
    assert await store.offset_groups() == ["g", "h"]
    await store.delete_offsets("g", [("t", 0), ("t", 7)])
    assert await store.committed_offsets("g") == [OffsetRow("g", "t", 1, 12, "b", 2.0)]
    await store.delete_offsets("h", None)
    assert await store.committed_offsets("h") == []
    assert await store.offset_groups() == ["g"]
    # The groups with metadata (ListGroups loads them after a restart).
    assert await store.metadata_groups() == []
    await store.store_group_metadata("m2", b"two", 1.0)
    await store.store_group_metadata("m1", b"one", 1.0)
    assert await store.metadata_groups() == ["m1", "m2"]
    await store.store_group_metadata("m2", None, 2.0)
    assert await store.metadata_groups() == ["m1"]
    # Offsets retention: those committed before the bound go, those committed since stay.
    await store.commit_offsets(
        [
            OffsetRow("x", "t", 0, 1, "", 10.0),
            OffsetRow("x", "t", 1, 2, "", 20.0),
            OffsetRow("y", "t", 0, 3, "", 5.0),
        ]
    )
    await store.expire_offsets("x", 20.0)
    assert await store.committed_offsets("x") == [OffsetRow("x", "t", 1, 2, "", 20.0)]
    assert await store.committed_offsets("y") == [OffsetRow("y", "t", 0, 3, "", 5.0)]  # another group's
    await store.expire_offsets("x", 20.5)
    assert await store.committed_offsets("x") == []
    assert "x" not in await store.offset_groups()


async def test_memory_store_keeps_committed_offsets() -> None:
    await exercise(MemoryLogStore())


async def test_sqlite_store_keeps_committed_offsets_across_reopening(tmp_path: Path) -> None:
    db = tmp_path / "levelzero.db"
    async with await SqliteLogStore.open(str(db)) as store:
        await exercise(store)
    async with await SqliteLogStore.open(str(db)) as store:
        assert [r.committed_offset for r in await store.committed_offsets("g")] == [12]


async def test_a_file_of_schema_6_gets_the_committed_leader_epoch(tmp_path: Path) -> None:
    """Schema 7 keeps each committed offset's leader epoch; offsets committed before it read -1."""
    db = tmp_path / "levelzero.db"
    async with await SqliteLogStore.open(str(db)) as store:
        await store.commit_offsets([OffsetRow("g", "t", 0, 3, "m", 1.0, 4)])
    with sqlite3.connect(db) as connection:  # what schema 6 wrote
        connection.execute("ALTER TABLE consumer_offsets DROP COLUMN leader_epoch")
        connection.execute("PRAGMA user_version = 6")
    async with await SqliteLogStore.open(str(db)) as store:
        assert await store.committed_offsets("g") == [OffsetRow("g", "t", 0, 3, "m", 1.0, -1)]
        await store.commit_offsets([OffsetRow("g", "t", 0, 5, "m", 2.0, 7)])
        assert await store.committed_offsets("g") == [OffsetRow("g", "t", 0, 5, "m", 2.0, 7)]


async def test_a_file_made_before_consumer_offsets_gets_the_table(tmp_path: Path) -> None:
    db = tmp_path / "levelzero.db"
    async with await SqliteLogStore.open(str(db)) as store:
        await store.create_topic("t", 1, 1, 0.0)
    with sqlite3.connect(db) as connection:
        connection.execute("DROP TABLE consumer_offsets")
        connection.execute("PRAGMA user_version = 1")  # files without the table are of schema 1
    async with await SqliteLogStore.open(str(db)) as store:
        await store.commit_offsets([OffsetRow("g", "t", 0, 3, "", 1.0)])
        assert [r.committed_offset for r in await store.committed_offsets("g")] == [3]
        assert len(await store.list_partitions()) == 1


async def test_a_file_of_schema_10_gets_the_group_metadata_table(tmp_path: Path) -> None:
    db = tmp_path / "levelzero.db"
    async with await SqliteLogStore.open(str(db)) as store:
        await store.commit_offsets([OffsetRow("g", "t", 0, 3, "m", 1.0, 4)])
    with sqlite3.connect(db) as connection:  # what schema 10 wrote
        connection.execute("DROP TABLE group_metadata")
        connection.execute("PRAGMA user_version = 10")
    async with await SqliteLogStore.open(str(db)) as store:
        assert await store.group_metadata("g") is None
        await store.store_group_metadata("g", b"members", 2.0)
        assert await store.group_metadata("g") == b"members"
        assert [r.committed_offset for r in await store.committed_offsets("g")] == [3]
    with sqlite3.connect(db) as connection:
        assert connection.execute("PRAGMA user_version").fetchone() == (11,)


async def test_memory_store_keeps_group_metadata() -> None:
    store = MemoryLogStore()
    await store.store_group_metadata("g", b"members", 1.0)
    assert await store.group_metadata("g") == b"members"
    await store.store_group_metadata("g", None, 2.0)
    assert await store.group_metadata("g") is None


async def record_producer_batches(store: ProducerBatchStore) -> None:
    assert isinstance(store, ProducerBatchStore)
    for seq in range(7):
        await store.record_producer_batches(
            [
                ProducerBatchRow(9, 0, "t", 0, seq * 10, 10, seq * 10, float(seq)),
                ProducerBatchRow(9, 0, "t", 1, seq, 1, seq, float(seq)),
            ],
            keep=5,
        )
    await store.record_producer_batches([ProducerBatchRow(8, 0, "t", 0, 0, 1, 500, 1.0)], keep=5)
    # The same batch again (a retry recorded twice) replaces its row.
    await store.record_producer_batches([ProducerBatchRow(8, 1, "t", 0, 0, 1, 501, 2.0)], keep=5)


async def check_producer_batches(store: ProducerBatchStore) -> None:
    rows = await store.producer_batches(9)
    assert [(r.partition, r.base_sequence) for r in rows] == (
        [(0, s * 10) for s in range(2, 7)] + [(1, s) for s in range(2, 7)]
    )
    assert [(r.producer_epoch, r.base_offset) for r in await store.producer_batches(8)] == [(1, 501)]
    assert await store.producer_batches(7) == []


async def test_sqlite_keeps_the_newest_producer_batches_durably(tmp_path: Path) -> None:
    db = tmp_path / "levelzero.db"
    async with await SqliteLogStore.open(str(db)) as store:
        await record_producer_batches(store)
    async with await SqliteLogStore.open(str(db)) as store:
        await check_producer_batches(store)


async def test_postgres_keeps_the_newest_producer_batches_durably(postgres_dsn: str) -> None:
    async with await PostgresLogStore.open(postgres_dsn) as store:
        await record_producer_batches(store)
        await store.commit_offsets([OffsetRow("g", "t", 0, 3, "", 1.0)])  # one batch, both roles
    async with await PostgresLogStore.open(postgres_dsn) as store:
        await check_producer_batches(store)
        assert [r.committed_offset for r in await store.committed_offsets("g")] == [3]


async def test_postgres_keeps_committed_offsets(postgres_dsn: str) -> None:
    async with await PostgresLogStore.open(postgres_dsn) as store:
        await exercise(store)


KEYED = 1 << 62  # HTTP idempotency keys' producers (actors/intake.py: IDEMPOTENCY_ID_BASE)


async def expire_keyed_batches(store: ProducerBatchStore) -> None:
    """Keys' batches stored before the bound go, the oldest first and at most `rows_max` a
    call; a Kafka producer's (an id below the keys') stay whatever their age."""
    assert isinstance(store, ProducerBatchExpiry)
    rows = [ProducerBatchRow(KEYED + key, 0, "t", 0, 0, 1, key, 100.0 + key) for key in range(5)]
    rows.append(ProducerBatchRow(9, 0, "t", 0, 0, 1, 50, 1.0))  # a Kafka producer's, old
    await store.record_producer_batches(rows, keep=5)
    await store.expire_producer_batches(KEYED, 103.0, rows_max=2)  # keys 0..2 are old: two go
    assert [key for key in range(5) if await store.producer_batches(KEYED + key)] == [2, 3, 4]
    await store.expire_producer_batches(KEYED, 103.0, rows_max=10)
    assert [key for key in range(5) if await store.producer_batches(KEYED + key)] == [3, 4]
    assert [r.base_offset for r in await store.producer_batches(9)] == [50]
    # Kafka producers' (ids below the keys'): their own bound, the keys' untouched whatever
    # their age (producer.id.expiration.ms).
    await store.record_producer_batches([ProducerBatchRow(10, 0, "t", 0, 0, 1, 60, 200.0)], keep=5)
    await store.expire_producer_batches(0, 150.0, 10, producer_id_below=KEYED)
    assert await store.producer_batches(9) == []
    assert [r.base_offset for r in await store.producer_batches(10)] == [60]
    assert [key for key in range(5) if await store.producer_batches(KEYED + key)] == [3, 4]


async def test_sqlite_expires_idempotency_keys_batches(tmp_path: Path) -> None:
    db = tmp_path / "levelzero.db"
    async with await SqliteLogStore.open(str(db)) as store:
        await expire_keyed_batches(store)
    async with await SqliteLogStore.open(str(db)) as store:  # durable
        assert [key for key in range(5) if await store.producer_batches(KEYED + key)] == [3, 4]


async def test_postgres_expires_idempotency_keys_batches(postgres_dsn: str) -> None:
    async with await PostgresLogStore.open(postgres_dsn) as store:
        await expire_keyed_batches(store)
    async with await PostgresLogStore.open(postgres_dsn) as store:
        assert [key for key in range(5) if await store.producer_batches(KEYED + key)] == [3, 4]
