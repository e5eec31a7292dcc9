"""The PostgreSQL control plane's schema as versioned migrations, applied at start-up under an
advisory lock so that nodes starting together migrate once; a database whose version is newer
than this code is refused (StoreRefused: the daemon exits with status 2).

Tables mirror the SQLite ones (storage/sqlite/schema.py) with two differences that fencing and
export need: `partitions.next_log_offset` is the database's own cursor of each log (an append
names its term and first offset, and the transaction refuses it unless both still hold), and
the event tables carry a `seq` column (the row's identity, which SQLite's rowid gives) and the
inserting transaction's `xid` (the export's watermark: see EXPORTED_TABLES);
object keys compare bytewise (COLLATE "C"), as in SQLite, whatever the database's locale.
"""

from __future__ import annotations

import asyncpg

from levelzero.core.errors import StoreRefused

# pg_advisory_lock key: "levelzero" in ASCII, folded into a bigint. Only migrations take it.
MIGRATION_LOCK_KEY = 0x6C65_7665_6C7A_6572

# The tables the export reads incrementally. Their `seq` values are drawn when a row is
# inserted, not when it commits, so a seq watermark alone could skip a row that commits late.
# Each row also keeps its transaction's id (`xid`, from migration 6): the export takes the rows
# whose xid is below its snapshot's xmin (every such transaction has ended, so that set is
# final) and above the last export's, and no writer serialises with another to make that hold.
EXPORTED_TABLES = ("l0_objects", "l1_objects", "fence_events", "state_samples")

# The end of each partition's log: its last entry, or its snapshot when truncation emptied it
# (the export's log watermarks; the same query as SQLite's, in PostgreSQL's spelling).
SELECT_LOG_ENDS = """SELECT p.pid, p.topic, p.partition, p.term,
       GREATEST(COALESCE((SELECT MAX(log_offset) FROM log WHERE log.pid = p.pid), -1),
                COALESCE((SELECT log_offset FROM snapshots s WHERE s.pid = p.pid), -1))
FROM partitions p ORDER BY p.pid"""
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
        "consumer_offsets",
        "producer_batches",
        "cluster_nodes",
        "partition_leases",
        "partition_watermarks",
        "cluster_identity",
        "topic_configs",
        "deleted_partitions",
        "cleaner_offsets",
        "l1_compacted",
        "group_metadata",
    }
)

MIGRATIONS: tuple[str, ...] = (
    # 1: the tables of SQLite schema 1
    """
CREATE TABLE partitions (
    pid BIGSERIAL PRIMARY KEY,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    creation_epoch BIGINT NOT NULL,
    term BIGINT NOT NULL,
    next_log_offset BIGINT NOT NULL DEFAULT 0,
    created_at DOUBLE PRECISION NOT NULL,
    UNIQUE (topic, partition)
);
CREATE TABLE log (
    pid BIGINT NOT NULL,
    log_offset BIGINT NOT NULL,
    term BIGINT NOT NULL,
    base_offset BIGINT NOT NULL,
    kind TEXT NOT NULL,
    epoch BIGINT,
    record_count BIGINT NOT NULL,
    byte_length BIGINT NOT NULL,
    object_key TEXT,
    entry BYTEA NOT NULL,
    appended_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (pid, log_offset)
);
CREATE INDEX log_placeholders ON log (pid, base_offset) WHERE kind = 'placeholder';
CREATE TABLE snapshots (
    pid BIGINT PRIMARY KEY,
    log_offset BIGINT NOT NULL,
    data BYTEA NOT NULL,
    saved_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE cluster_epoch (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch BIGINT NOT NULL CHECK (epoch >= 1)
);
CREATE TABLE l1_objects (
    seq BIGSERIAL UNIQUE,
    key TEXT COLLATE "C" PRIMARY KEY,
    pid BIGINT NOT NULL,
    base_offset BIGINT NOT NULL,
    last_offset BIGINT NOT NULL,
    last_log_offset BIGINT NOT NULL,
    term BIGINT NOT NULL,
    size BIGINT NOT NULL,
    state TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX l1_objects_by_partition ON l1_objects (pid, base_offset);
CREATE TABLE l0_objects (
    seq BIGSERIAL UNIQUE,
    key TEXT COLLATE "C" PRIMARY KEY,
    epoch BIGINT NOT NULL,
    size BIGINT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    extents BIGINT NOT NULL,
    deleted_at DOUBLE PRECISION,
    deleted_at_m BIGINT
);
CREATE INDEX l0_objects_live ON l0_objects (epoch, key) WHERE deleted_at IS NULL;
CREATE TABLE gc_rounds (
    round_id BIGINT PRIMARY KEY,
    started_at DOUBLE PRECISION NOT NULL,
    finished_at DOUBLE PRECISION NOT NULL,
    cluster_epoch BIGINT NOT NULL,
    m BIGINT,
    dry_run BOOLEAN NOT NULL,
    listed BIGINT NOT NULL,
    deleted BIGINT NOT NULL,
    deleted_bytes BIGINT NOT NULL,
    too_young BIGINT NOT NULL,
    above_m BIGINT NOT NULL,
    errors BIGINT NOT NULL,
    blocked_by TEXT
);
CREATE TABLE fence_events (
    seq BIGSERIAL PRIMARY KEY,
    at DOUBLE PRECISION NOT NULL,
    pid BIGINT NOT NULL,
    term BIGINT NOT NULL,
    epoch BIGINT NOT NULL,
    outcome TEXT NOT NULL,
    window_min BIGINT,
    window_max BIGINT,
    decisions BIGINT NOT NULL DEFAULT 1
);
CREATE TABLE state_samples (
    seq BIGSERIAL PRIMARY KEY,
    at DOUBLE PRECISION NOT NULL,
    pid BIGINT NOT NULL,
    term BIGINT NOT NULL,
    previous_applied_epoch BIGINT,
    max_applied_epoch BIGINT,
    min_epoch_lower_bound BIGINT,
    mp BIGINT,
    lro BIGINT NOT NULL,
    high_watermark BIGINT NOT NULL,
    start_offset BIGINT NOT NULL
);
""",
    # 2: the Kafka listener's committed offsets (the consumer-offsets role)
    """
CREATE TABLE consumer_offsets (
    group_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    committed_offset BIGINT NOT NULL,
    metadata TEXT NOT NULL,
    committed_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (group_id, topic, partition)
);
""",
    # 3: idempotent Kafka producers' last batches per partition (the producer-batch role)
    """
CREATE TABLE producer_batches (
    producer_id BIGINT NOT NULL,
    producer_epoch INTEGER NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    base_sequence INTEGER NOT NULL,
    record_count INTEGER NOT NULL,
    base_offset BIGINT NOT NULL,
    stored_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (producer_id, topic, partition, base_sequence)
);
""",
    # 4: the cluster: members, partition leadership leases, published M(p) (ClusterControl)
    """
CREATE TABLE cluster_nodes (
    node_id TEXT PRIMARY KEY,
    advertise_url TEXT NOT NULL,
    kafka_url TEXT,
    registered_at DOUBLE PRECISION NOT NULL,
    lease_expires_at DOUBLE PRECISION NOT NULL,
    draining BOOLEAN NOT NULL DEFAULT false
);
CREATE TABLE partition_leases (
    pid BIGINT PRIMARY KEY REFERENCES partitions (pid),
    node_id TEXT,
    lease_expires_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE partition_watermarks (
    pid BIGINT PRIMARY KEY REFERENCES partitions (pid),
    mp BIGINT NOT NULL,
    published_at DOUBLE PRECISION NOT NULL
);
""",
    # 5: the cluster's id, the one every node claims the object store with
    """
CREATE TABLE cluster_identity (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    cluster_id TEXT NOT NULL
);
""",
    # 6: each exported row's transaction id (the export's horizon; rows older than this
    # migration keep 0 and are exported by `seq`, as they were written under a global lock)
    "".join(
        f"""
ALTER TABLE {table} ADD COLUMN xid BIGINT NOT NULL DEFAULT 0;
ALTER TABLE {table} ALTER COLUMN xid SET DEFAULT txid_current();
CREATE INDEX {table}_by_xid ON {table} (xid, seq);
"""
        for table in EXPORTED_TABLES
    ),
    # 7: each topic's Kafka topic configs (the topic-config role)
    """
CREATE TABLE topic_configs (
    topic TEXT NOT NULL,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (topic, name)
);
""",
    # 8: deleted partitions (DeleteTopics), kept until their L1 objects are collected; the row
    # stays after that with `collected_at` set
    """
CREATE TABLE deleted_partitions (
    pid BIGINT PRIMARY KEY,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    creation_epoch BIGINT NOT NULL,
    term BIGINT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    deleted_at DOUBLE PRECISION NOT NULL,
    collected_at DOUBLE PRECISION
);
""",
    # 9: Kafka transactions: the coordinators' state, partitions' open and aborted ranges
    """
CREATE TABLE transactions (
    transactional_id TEXT PRIMARY KEY,
    producer_id BIGINT NOT NULL,
    producer_epoch INTEGER NOT NULL,
    state TEXT NOT NULL,
    timeout_ms BIGINT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    partitions TEXT NOT NULL,
    groups TEXT NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE txn_ranges (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    producer_id BIGINT NOT NULL,
    first_offset BIGINT NOT NULL,
    last_offset BIGINT NOT NULL,
    aborted BOOLEAN NOT NULL,
    PRIMARY KEY (topic, partition, first_offset, producer_id)
);
""",
    # 10: compaction: each partition's accepted cleaner-offset map (term -> the offset its
    # cleaning reached), and the L1 objects compaction wrote (valid once their result is accepted)
    """
CREATE TABLE cleaner_offsets (
    pid BIGINT NOT NULL,
    term BIGINT NOT NULL,
    cleaned_to BIGINT NOT NULL,
    PRIMARY KEY (pid, term)
);
CREATE TABLE l1_compacted (
    key TEXT PRIMARY KEY,
    pid BIGINT NOT NULL,
    committed_at DOUBLE PRECISION NOT NULL
);
""",
    # 11: each L1 object's largest record timestamp, so ListOffsets by time reads only the
    # object holding its answer; older rows keep NULL and a lookup reads such an object
    """
ALTER TABLE l1_objects ADD COLUMN IF NOT EXISTS max_timestamp_ms BIGINT;
""",
    # 12: the committed leader epoch of each consumer group offset (KIP-320)
    """
ALTER TABLE consumer_offsets ADD COLUMN leader_epoch INTEGER NOT NULL DEFAULT -1;
""",
    # 13: a prepared transaction completing beside its successor (JSON; '' when none)
    """
ALTER TABLE transactions ADD COLUMN prepared TEXT NOT NULL DEFAULT '';
""",
    # 14: each node row's incarnation (every registration takes a new one from the sequence):
    # the calls about a node's row and leases name it, and a late one of a previous run is void
    """
CREATE SEQUENCE IF NOT EXISTS cluster_node_incarnations;
ALTER TABLE cluster_nodes ADD COLUMN IF NOT EXISTS incarnation BIGINT NOT NULL DEFAULT 0;
""",
    # 15: each consumer group's metadata as its coordinator last stored it (the members of its
    # last completed rebalance; the coordinator's encoding), restored by the next coordinator
    """
CREATE TABLE group_metadata (
    group_id TEXT PRIMARY KEY,
    metadata BYTEA NOT NULL,
    stored_at DOUBLE PRECISION NOT NULL
);
""",
)
SCHEMA_VERSION = len(MIGRATIONS)

# Rows whose xid is ahead of this server's transaction counter came from another server (a
# logical dump restored here: the counter starts again low). Their transactions ended long ago;
# xid 0 makes the export take them by seq, as rows from before migration 6, instead of waiting
# until the counter passes them. A row written here that the UPDATE sees committed before the
# UPDATE's snapshot, so its xid is below the UPDATE's own (assigned after that snapshot): only
# foreign rows match. Run at every open; the (xid, seq) index makes it a short range scan.
FORGET_FOREIGN_XIDS = tuple(
    f"UPDATE {table} SET xid = 0 WHERE xid >= (SELECT txid_current())" for table in EXPORTED_TABLES
)

_VERSION_TABLE = """CREATE TABLE IF NOT EXISTS levelzero_schema (
    version INTEGER PRIMARY KEY,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)"""


async def migrate(connection: asyncpg.Connection, where: str) -> int:
    """Bring the database to SCHEMA_VERSION, one migration per transaction, under an advisory
    lock (a node that waited finds the work done). Returns the version found before."""
    await connection.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    try:
        await connection.execute(_VERSION_TABLE)
        found = await connection.fetchval("SELECT COALESCE(MAX(version), 0) FROM levelzero_schema")
        if found > SCHEMA_VERSION:
            raise StoreRefused(
                f"{where}: schema version {found} is newer than this levelzero supports "
                f"({SCHEMA_VERSION}); upgrade levelzero"
            )
        for version in range(found + 1, SCHEMA_VERSION + 1):
            async with connection.transaction():
                await connection.execute(MIGRATIONS[version - 1])
                await connection.execute("INSERT INTO levelzero_schema (version) VALUES ($1)", version)
        for statement in FORGET_FOREIGN_XIDS:
            await connection.execute(statement)
        return int(found)
    finally:
        await connection.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
