"""The SQLite log store's schema: one definition of its tables, the statements the store and the
export run against them, and the versioned migrations applied when a file is opened.

Every reader of a levelzero SQLite file (the store, `levelzero export`, `levelzero backup`) takes
table names, columns and the version from here; nothing else spells the schema out.
"""

from __future__ import annotations

import logging
import sqlite3
import aiosqlite
import msgspec

from levelzero.core.errors import StorageError, StoreRefused
from levelzero.storage.log_rules import LOG_ROW_COLUMNS
from levelzero.storage.protocols import (
    FenceEventRow,
    GcRoundRow,
    L0ObjectRow,
    L1Row,
    StateSampleRow,
)

# Version 1: the tables of the first release. Version 2: consumer offsets and idempotent
# producers' batches (the Kafka listener), the live-L0 index, fence_events.decisions. Version 3:
# the log table in order of appends (a rowid table), (pid, log_offset) a unique index.
# Version 4: topic_configs (each topic's Kafka topic configs). Version 5: deleted partitions
# (DeleteTopics), kept until their L1 objects are collected. Version 6: Kafka transactions
# (the coordinators' state, partitions' open and aborted transaction ranges). Version 7:
# cleaner_offsets and l1_compacted (compaction). Version 8: l1_objects.max_timestamp_ms
# (ListOffsets by time reads only the object holding its answer; rows of older files keep
# NULL, and a lookup reads such an object to find out). Version 9:
# consumer_offsets.leader_epoch (the committed leader epoch, KIP-320). Version 10:
# transactions.prepared (a prepared transaction completing beside its successor). Version 11:
# group_metadata (each consumer group's last completed rebalance, restored at start-up).
# MIGRATIONS[v - 1] brings a file of version v to v + 1; a new file gets SCHEMA at once.
log = logging.getLogger(__name__)

SCHEMA_VERSION = 11
OLDEST_SCHEMA_VERSION = 1

L0_LIVE_INDEX = (
    "CREATE INDEX IF NOT EXISTS l0_objects_live ON l0_objects (epoch, key) WHERE deleted_at IS NULL"
)

# Added within schema 1 (the Kafka listener's consumer groups): files made before it get it at
# open, as they get the index above.
CONSUMER_OFFSETS = """CREATE TABLE IF NOT EXISTS consumer_offsets (
    group_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    committed_offset INTEGER NOT NULL,
    metadata TEXT NOT NULL,
    committed_at REAL NOT NULL,
    leader_epoch INTEGER NOT NULL DEFAULT -1,
    PRIMARY KEY (group_id, topic, partition)
) WITHOUT ROWID"""
UPSERT_OFFSET = (
    "INSERT INTO consumer_offsets (group_id, topic, partition, committed_offset, metadata,"
    " committed_at, leader_epoch) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (group_id, topic, partition)"
    " DO UPDATE SET committed_offset = excluded.committed_offset, metadata = excluded.metadata,"
    " committed_at = excluded.committed_at, leader_epoch = excluded.leader_epoch"
)
ADD_OFFSET_LEADER_EPOCH = "ALTER TABLE consumer_offsets ADD COLUMN leader_epoch INTEGER NOT NULL DEFAULT -1"
# Idempotent Kafka producers' last batches (added within schema 1, like consumer_offsets).
PRODUCER_BATCHES = """CREATE TABLE IF NOT EXISTS producer_batches (
    producer_id INTEGER NOT NULL,
    producer_epoch INTEGER NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    base_sequence INTEGER NOT NULL,
    record_count INTEGER NOT NULL,
    base_offset INTEGER NOT NULL,
    stored_at REAL NOT NULL,
    PRIMARY KEY (producer_id, topic, partition, base_sequence)
) WITHOUT ROWID"""
INSERT_PRODUCER_BATCH = (
    "INSERT OR REPLACE INTO producer_batches (producer_id, producer_epoch, topic, partition,"
    " base_sequence, record_count, base_offset, stored_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
# Keep the `keep` newest batches of one (producer, topic, partition); the parameters are the
# producer, topic, partition, then the same three again and `keep`.
PRUNE_PRODUCER_BATCHES = (
    "DELETE FROM producer_batches WHERE producer_id = ? AND topic = ? AND partition = ?"
    " AND base_sequence NOT IN (SELECT base_sequence FROM producer_batches WHERE producer_id = ?"
    " AND topic = ? AND partition = ? ORDER BY stored_at DESC, base_sequence DESC LIMIT ?)"
)
# Batches of producers from an id up (?1, below ?4) stored before a time (?2), the oldest ?3.
EXPIRE_PRODUCER_BATCHES = (
    "DELETE FROM producer_batches WHERE (producer_id, topic, partition, base_sequence) IN"
    " (SELECT producer_id, topic, partition, base_sequence FROM producer_batches"
    " WHERE producer_id >= ?1 AND producer_id < ?4 AND stored_at < ?2 ORDER BY stored_at LIMIT ?3)"
)
SELECT_PRODUCER_BATCHES = (
    "SELECT producer_id, producer_epoch, topic, partition, base_sequence, record_count,"
    " base_offset, stored_at FROM producer_batches WHERE producer_id = ?"
    " ORDER BY topic, partition, stored_at, base_sequence"
)
TRANSACTIONS = """CREATE TABLE IF NOT EXISTS transactions (
    transactional_id TEXT PRIMARY KEY,
    producer_id INTEGER NOT NULL,
    producer_epoch INTEGER NOT NULL,
    state TEXT NOT NULL,
    timeout_ms INTEGER NOT NULL,
    started_at REAL NOT NULL,
    partitions TEXT NOT NULL,
    groups TEXT NOT NULL,
    updated_at REAL NOT NULL,
    prepared TEXT NOT NULL DEFAULT ''
) WITHOUT ROWID"""
ADD_TRANSACTION_PREPARED = "ALTER TABLE transactions ADD COLUMN prepared TEXT NOT NULL DEFAULT ''"
TXN_RANGES = """CREATE TABLE IF NOT EXISTS txn_ranges (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    producer_id INTEGER NOT NULL,
    first_offset INTEGER NOT NULL,
    last_offset INTEGER NOT NULL,
    aborted INTEGER NOT NULL,
    PRIMARY KEY (topic, partition, first_offset, producer_id)
) WITHOUT ROWID"""
EXPIRE_TRANSACTION = "DELETE FROM transactions WHERE transactional_id = ? AND updated_at = ?"
UPSERT_TRANSACTION = (
    "INSERT OR REPLACE INTO transactions (transactional_id, producer_id, producer_epoch, state,"
    " timeout_ms, started_at, partitions, groups, updated_at, prepared)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
SELECT_TRANSACTIONS = (
    "SELECT transactional_id, producer_id, producer_epoch, state, timeout_ms, started_at,"
    " partitions, groups, updated_at, prepared FROM transactions ORDER BY transactional_id"
)
INSERT_TXN_RANGE = (
    "INSERT OR IGNORE INTO txn_ranges (topic, partition, producer_id, first_offset, last_offset,"
    " aborted) VALUES (?, ?, ?, ?, ?, ?)"
)
ABORT_TXN_RANGE = (
    "UPDATE txn_ranges SET last_offset = ?, aborted = 1"
    " WHERE topic = ? AND partition = ? AND producer_id = ? AND first_offset = ?"
)
DELETE_TXN_RANGE = (
    "DELETE FROM txn_ranges WHERE topic = ? AND partition = ? AND producer_id = ? AND first_offset = ?"
)
PRUNE_TXN_RANGES = (
    "DELETE FROM txn_ranges WHERE topic = ? AND partition = ? AND aborted = 1 AND last_offset < ?"
)
SELECT_TXN_RANGES = (
    "SELECT topic, partition, producer_id, first_offset, last_offset, aborted FROM txn_ranges"
    " WHERE topic = ? AND partition = ? ORDER BY first_offset, producer_id"
)
# Each consumer group's metadata as its coordinator last stored it (schema 11): the members of
# its last completed rebalance, or none once it went empty (Kafka's group metadata records in
# __consumer_offsets). The coordinator's encoding, opaque here.
GROUP_METADATA = """CREATE TABLE IF NOT EXISTS group_metadata (
    group_id TEXT PRIMARY KEY,
    metadata BLOB NOT NULL,
    stored_at REAL NOT NULL
) WITHOUT ROWID"""
UPSERT_GROUP_METADATA = (
    "INSERT INTO group_metadata (group_id, metadata, stored_at) VALUES (?, ?, ?)"
    " ON CONFLICT (group_id) DO UPDATE SET metadata = excluded.metadata, stored_at = excluded.stored_at"
)
DELETE_GROUP_METADATA = "DELETE FROM group_metadata WHERE group_id = ?"
SELECT_GROUP_METADATA = "SELECT metadata FROM group_metadata WHERE group_id = ?"
SELECT_OFFSET_GROUPS = "SELECT DISTINCT group_id FROM consumer_offsets ORDER BY group_id"
SELECT_METADATA_GROUPS = "SELECT group_id FROM group_metadata ORDER BY group_id"
DELETE_GROUP_OFFSETS = "DELETE FROM consumer_offsets WHERE group_id = ?"
DELETE_OFFSET = "DELETE FROM consumer_offsets WHERE group_id = ? AND topic = ? AND partition = ?"
EXPIRE_OFFSETS = "DELETE FROM consumer_offsets WHERE group_id = ? AND committed_at < ?"
SELECT_OFFSETS = (
    "SELECT group_id, topic, partition, committed_offset, metadata, committed_at, leader_epoch"
    " FROM consumer_offsets WHERE group_id = ? ORDER BY topic, partition"
)

# The log in order of appends, and each partition's entries found through an index. Clustered on
# (pid, log_offset) (schema 1 and 2), a commit holding one entry of each of 1,024 partitions
# rewrote a table page per partition: 29 ms a commit where this layout takes 5.5 (issue 24).
LOG_COLUMNS = LOG_ROW_COLUMNS
LOG_TABLE = """CREATE TABLE log (
    pid INTEGER NOT NULL,
    log_offset INTEGER NOT NULL,
    term INTEGER NOT NULL,
    base_offset INTEGER NOT NULL,
    kind TEXT NOT NULL,
    epoch INTEGER,
    record_count INTEGER NOT NULL,
    byte_length INTEGER NOT NULL,
    object_key TEXT,
    entry BLOB NOT NULL,
    appended_at REAL NOT NULL,
    UNIQUE (pid, log_offset)
)"""
LOG_PLACEHOLDERS_INDEX = "CREATE INDEX log_placeholders ON log (pid, base_offset) WHERE kind = 'placeholder'"

# Each topic's topic configs (schema 4): name -> value as text, checked by core.topic_configs.
TOPIC_CONFIGS = """CREATE TABLE topic_configs (
    topic TEXT NOT NULL,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (topic, name)
) WITHOUT ROWID"""
INSERT_TOPIC_CONFIG = "INSERT INTO topic_configs (topic, name, value, updated_at) VALUES (?, ?, ?, ?)"
DELETE_TOPIC_CONFIGS = "DELETE FROM topic_configs WHERE topic = ?"
SELECT_TOPIC_CONFIGS = "SELECT topic, name, value FROM topic_configs"

# A deleted topic's partitions: a row per partition from its deletion on; `collected_at` is set
# once its L1 objects are all deleted (the row stays: a partition id is never given again).
DELETED_PARTITIONS = """CREATE TABLE IF NOT EXISTS deleted_partitions (
    pid INTEGER PRIMARY KEY,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    creation_epoch INTEGER NOT NULL,
    term INTEGER NOT NULL,
    created_at REAL NOT NULL,
    deleted_at REAL NOT NULL,
    collected_at REAL
)"""

# Compaction (schema 7): each partition's accepted cleaner-offset map (term -> the offset its
# cleaning reached), and the L1 objects compaction wrote (valid once their result is accepted).
CLEANER_OFFSETS = """CREATE TABLE IF NOT EXISTS cleaner_offsets (
    pid INTEGER NOT NULL,
    term INTEGER NOT NULL,
    cleaned_to INTEGER NOT NULL,
    PRIMARY KEY (pid, term)
) WITHOUT ROWID"""
L1_COMPACTED = """CREATE TABLE IF NOT EXISTS l1_compacted (
    key TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    committed_at REAL NOT NULL
)"""
# Version 8: each L1 object's largest record timestamp (NULL: unknown, the object is read).
ADD_L1_MAX_TIMESTAMP = "ALTER TABLE l1_objects ADD COLUMN max_timestamp_ms INTEGER"

ADD_FENCE_DECISIONS = "ALTER TABLE fence_events ADD COLUMN decisions INTEGER NOT NULL DEFAULT 1"

SCHEMA = (
    """
CREATE TABLE partitions (
    pid INTEGER PRIMARY KEY,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    creation_epoch INTEGER NOT NULL,
    term INTEGER NOT NULL,
    created_at REAL NOT NULL,
    UNIQUE (topic, partition)
);
"""
    + LOG_TABLE
    + ";\n"
    + LOG_PLACEHOLDERS_INDEX
    + """;
CREATE TABLE snapshots (
    pid INTEGER PRIMARY KEY,
    log_offset INTEGER NOT NULL,
    data BLOB NOT NULL,
    saved_at REAL NOT NULL
);
CREATE TABLE cluster_epoch (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch INTEGER NOT NULL CHECK (epoch >= 1)
);
CREATE TABLE l1_objects (
    key TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    base_offset INTEGER NOT NULL,
    last_offset INTEGER NOT NULL,
    last_log_offset INTEGER NOT NULL,
    term INTEGER NOT NULL,
    size INTEGER NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    max_timestamp_ms INTEGER
);
CREATE INDEX l1_objects_by_partition ON l1_objects (pid, base_offset);
CREATE TABLE l0_objects (
    key TEXT PRIMARY KEY,
    epoch INTEGER NOT NULL,
    size INTEGER NOT NULL,
    created_at REAL NOT NULL,
    extents INTEGER NOT NULL,
    deleted_at REAL,
    deleted_at_m INTEGER
);
CREATE TABLE gc_rounds (
    round_id INTEGER PRIMARY KEY,
    started_at REAL NOT NULL,
    finished_at REAL NOT NULL,
    cluster_epoch INTEGER NOT NULL,
    m INTEGER,
    dry_run INTEGER NOT NULL,
    listed INTEGER NOT NULL,
    deleted INTEGER NOT NULL,
    deleted_bytes INTEGER NOT NULL,
    too_young INTEGER NOT NULL,
    above_m INTEGER NOT NULL,
    errors INTEGER NOT NULL,
    blocked_by TEXT
);
CREATE TABLE fence_events (
    at REAL NOT NULL,
    pid INTEGER NOT NULL,
    term INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    window_min INTEGER,
    window_max INTEGER,
    decisions INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE state_samples (
    at REAL NOT NULL,
    pid INTEGER NOT NULL,
    term INTEGER NOT NULL,
    previous_applied_epoch INTEGER,
    max_applied_epoch INTEGER,
    min_epoch_lower_bound INTEGER,
    mp INTEGER,
    lro INTEGER NOT NULL,
    high_watermark INTEGER NOT NULL,
    start_offset INTEGER NOT NULL
);
"""
    + L0_LIVE_INDEX
    + ";\n"
    + CONSUMER_OFFSETS
    + ";\n"
    + PRODUCER_BATCHES
    + ";\n"
    + TOPIC_CONFIGS
    + ";\n"
    + DELETED_PARTITIONS
    + ";\n"
    + TRANSACTIONS
    + ";\n"
    + TXN_RANGES
    + ";\n"
    + CLEANER_OFFSETS
    + ";\n"
    + L1_COMPACTED
    + ";\n"
    + GROUP_METADATA
    + ";\n"
)
# one definition each: the migration to version 2 adds the index and the Kafka tables to older files
# The tables every version has (what the export reads); SCHEMA_TABLES_OF_VERSION adds the rest.
SCHEMA_TABLES = frozenset(
    {
        "partitions",
        "log",
        "snapshots",
        "cluster_epoch",
        "l1_objects",
        "l0_objects",
        "gc_rounds",
        "fence_events",
        "state_samples",
    }
)

SCHEMA_TABLES_OF_VERSION = {
    1: SCHEMA_TABLES,
    2: SCHEMA_TABLES | {"consumer_offsets", "producer_batches"},
    3: SCHEMA_TABLES | {"consumer_offsets", "producer_batches"},
    4: SCHEMA_TABLES | {"consumer_offsets", "producer_batches", "topic_configs"},
    5: SCHEMA_TABLES | {"consumer_offsets", "producer_batches", "topic_configs", "deleted_partitions"},
    6: SCHEMA_TABLES
    | {"consumer_offsets", "producer_batches", "topic_configs", "deleted_partitions"}
    | {"transactions", "txn_ranges"},
    7: SCHEMA_TABLES
    | {"consumer_offsets", "producer_batches", "topic_configs", "deleted_partitions"}
    | {"transactions", "txn_ranges", "cleaner_offsets", "l1_compacted"},
}
SCHEMA_TABLES_OF_VERSION[8] = SCHEMA_TABLES_OF_VERSION[7]
SCHEMA_TABLES_OF_VERSION[9] = SCHEMA_TABLES_OF_VERSION[8]
SCHEMA_TABLES_OF_VERSION[10] = SCHEMA_TABLES_OF_VERSION[9]
SCHEMA_TABLES_OF_VERSION[11] = SCHEMA_TABLES_OF_VERSION[10] | {"group_metadata"}
assert set(SCHEMA_TABLES_OF_VERSION) == set(range(OLDEST_SCHEMA_VERSION, SCHEMA_VERSION + 1))


def insert_sql(table: str, row_type: type[msgspec.Struct], verb: str = "INSERT") -> str:
    """The INSERT for a row struct; column names are the struct's fields (one source of truth)."""
    columns = row_type.__struct_fields__
    return f"{verb} INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


INSERT_LOG = f"INSERT INTO log ({', '.join(LOG_COLUMNS)}) VALUES ({', '.join('?' * len(LOG_COLUMNS))})"
UPDATE_TERM = "UPDATE partitions SET term = ? WHERE pid = ?"
INSERT_L1 = insert_sql("l1_objects", L1Row)
INSERT_L0 = insert_sql("l0_objects", L0ObjectRow) + " ON CONFLICT (key) DO NOTHING"
# One statement for a page of keys (a JSON array: one parameter, whatever the page's size): an
# executemany of one UPDATE per key cost the writer ~30% more per key, in SQLite and in the
# rows sent to it.
MARK_L0_DELETED = (
    "UPDATE l0_objects SET deleted_at = ?, deleted_at_m = ?"
    " WHERE key IN (SELECT value FROM json_each(?)) AND deleted_at IS NULL"
)
INSERT_GC_ROUND = insert_sql("gc_rounds", GcRoundRow, "INSERT OR REPLACE")
INSERT_FENCE_EVENT = insert_sql("fence_events", FenceEventRow)
INSERT_STATE_SAMPLE = insert_sql("state_samples", StateSampleRow)
SELECT_L1 = f"SELECT {', '.join(L1Row.__struct_fields__)} FROM l1_objects"
SELECT_LOG = "SELECT log_offset, term, base_offset, kind, entry FROM log"
# Placeholder ranges [base_offset, base_offset + record_count) are sorted and disjoint (the state
# machine assigns base_offset = high watermark), so only the last placeholder starting at or
# below the offset, and those starting above it, can end above it: both are index range scans.
SELECT_PLACEHOLDERS = f"""{SELECT_LOG}
WHERE pid = ?1 AND kind = 'placeholder'
  AND base_offset >= COALESCE(
      (SELECT MAX(base_offset) FROM log
       WHERE pid = ?1 AND kind = 'placeholder' AND base_offset <= ?2), ?2)
  AND base_offset + record_count > ?2
ORDER BY base_offset, log_offset
LIMIT ?3"""

# The end of each partition's log: its last entry, or its snapshot when truncation emptied it
# (one definition: the store's cursors and the export's watermarks both start from it).
SELECT_LOG_ENDS = """SELECT p.pid, p.topic, p.partition, p.term,
       MAX(COALESCE((SELECT MAX(log_offset) FROM log WHERE log.pid = p.pid), -1),
           COALESCE((SELECT log_offset FROM snapshots s WHERE s.pid = p.pid), -1))
FROM partitions p ORDER BY p.pid"""
SELECT_CLUSTER_EPOCH = "SELECT epoch FROM cluster_epoch WHERE id = 1"


def check_version(version: int, tables: set[str], db_path: str) -> None:
    """Refuse a file of a newer, unknown or incomplete schema (StoreRefused: exit status 2)."""
    if version > SCHEMA_VERSION:
        raise StoreRefused(
            f"{db_path}: schema version {version} is newer than this levelzero supports "
            f"({SCHEMA_VERSION}); upgrade levelzero"
        )
    if version < OLDEST_SCHEMA_VERSION:
        raise StoreRefused(
            f"{db_path}: unknown schema version {version} (tables: {', '.join(sorted(tables))}); "
            "not a levelzero log store"
        )
    missing = SCHEMA_TABLES_OF_VERSION[version] - tables
    if missing:
        raise StoreRefused(f"{db_path}: schema {version} lacks tables {', '.join(sorted(missing))}")


async def _migrate_1_to_2(connection: aiosqlite.Connection) -> None:
    await connection.execute(L0_LIVE_INDEX)
    await connection.execute(CONSUMER_OFFSETS)
    await connection.execute(PRODUCER_BATCHES)
    fence_columns = {
        name for _, name, *_ in await connection.execute_fetchall("PRAGMA table_info(fence_events)")
    }
    if "decisions" not in fence_columns:  # files of version 1 written before the column existed
        await connection.execute(ADD_FENCE_DECISIONS)


async def _migrate_2_to_3(connection: aiosqlite.Connection) -> None:
    """The log table rebuilt in order of appends (the rows copied, the old table dropped)."""
    ((rows,),) = await connection.execute_fetchall("SELECT COUNT(*) FROM log")
    log.info("rebuilding the log table", extra={"rows": rows})
    columns = ", ".join(LOG_COLUMNS)
    await connection.execute(LOG_TABLE.replace("CREATE TABLE log (", "CREATE TABLE log_v3 (", 1))
    await connection.execute(
        f"INSERT INTO log_v3 ({columns}) SELECT {columns} FROM log ORDER BY pid, log_offset"
    )
    await connection.execute("DROP TABLE log")  # and its index
    await connection.execute("ALTER TABLE log_v3 RENAME TO log")
    await connection.execute(LOG_PLACEHOLDERS_INDEX)


async def _migrate_3_to_4(connection: aiosqlite.Connection) -> None:
    await connection.execute(TOPIC_CONFIGS.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1))


async def _migrate_4_to_5(connection: aiosqlite.Connection) -> None:
    await connection.execute(DELETED_PARTITIONS)


async def _migrate_5_to_6(connection: aiosqlite.Connection) -> None:
    await connection.execute(TRANSACTIONS)
    await connection.execute(TXN_RANGES)


async def _migrate_6_to_7(connection: aiosqlite.Connection) -> None:
    await connection.execute(CLEANER_OFFSETS)
    await connection.execute(L1_COMPACTED)


async def _migrate_7_to_8(connection: aiosqlite.Connection) -> None:
    columns = {name for _, name, *_ in await connection.execute_fetchall("PRAGMA table_info(l1_objects)")}
    if "max_timestamp_ms" not in columns:
        await connection.execute(ADD_L1_MAX_TIMESTAMP)


async def _migrate_8_to_9(connection: aiosqlite.Connection) -> None:
    columns = {
        name for _, name, *_ in await connection.execute_fetchall("PRAGMA table_info(consumer_offsets)")
    }
    if "leader_epoch" not in columns:  # a file migrated from version 1 got the table with it
        await connection.execute(ADD_OFFSET_LEADER_EPOCH)


async def _migrate_9_to_10(connection: aiosqlite.Connection) -> None:
    columns = {name for _, name, *_ in await connection.execute_fetchall("PRAGMA table_info(transactions)")}
    if "prepared" not in columns:  # a file migrated from version 5 got the table with it
        await connection.execute(ADD_TRANSACTION_PREPARED)


async def _migrate_10_to_11(connection: aiosqlite.Connection) -> None:
    await connection.execute(GROUP_METADATA)


MIGRATIONS = (
    _migrate_1_to_2,
    _migrate_2_to_3,
    _migrate_3_to_4,
    _migrate_4_to_5,
    _migrate_5_to_6,
    _migrate_6_to_7,
    _migrate_7_to_8,
    _migrate_8_to_9,
    _migrate_9_to_10,
    _migrate_10_to_11,
)
assert len(MIGRATIONS) == SCHEMA_VERSION - OLDEST_SCHEMA_VERSION


def read_version(connection: sqlite3.Connection) -> tuple[int, set[str]]:
    """The file's schema version and its tables (a blocking connection: the export's)."""
    ((version,),) = connection.execute("PRAGMA user_version").fetchall()
    tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    return version, tables


async def check_or_create_schema(connection: aiosqlite.Connection, db_path: str) -> None:
    """Create the schema in an empty file; refuse files of a newer or unknown schema."""
    rows = list(await connection.execute_fetchall("PRAGMA journal_mode = WAL"))
    if rows[0][0].lower() != "wal":
        raise StorageError(f"{db_path}: cannot switch to WAL mode (journal_mode={rows[0][0]})")
    ((version,),) = await connection.execute_fetchall("PRAGMA user_version")
    tables = {
        name
        for (name,) in await connection.execute_fetchall(
            "SELECT name FROM sqlite_master WHERE type = 'table'"
        )
    }
    if version == 0 and not tables:
        await connection.executescript(
            f"BEGIN IMMEDIATE; {SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
        )
        return
    check_version(version, tables, db_path)
    await migrate(connection, version, db_path)


async def migrate(connection: aiosqlite.Connection, version: int, db_path: str) -> None:
    """Bring a file of an older version to SCHEMA_VERSION, one migration per transaction. The
    store's lock file keeps other daemons out; BEGIN IMMEDIATE takes SQLite's write lock, so a
    concurrent reader (an export, a backup) sees the file before or after a step, never half."""
    while version < SCHEMA_VERSION:
        await connection.execute("BEGIN IMMEDIATE")
        ((current,),) = await connection.execute_fetchall("PRAGMA user_version")
        assert current == version, f"{db_path}: schema version moved from {version} to {current}"
        await MIGRATIONS[version - OLDEST_SCHEMA_VERSION](connection)
        await connection.execute(f"PRAGMA user_version = {version + 1}")
        await connection.commit()
        log.info("log store migrated", extra={"path": db_path, "from": version, "to": version + 1})
        version += 1
