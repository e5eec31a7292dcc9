"""The `LogStore` on PostgreSQL (asyncpg): every role of the SQLite store in a database that many
nodes can share.

Fencing lives in the database, not in this process: `partitions` holds each log's term and next
log offset, and an append's transaction locks its partitions' rows (in pid order, so concurrent
batches cannot deadlock), then updates only the rows whose term and next offset are still the
ones the caller names. An append whose row was not updated is refused (`NotLeader` when the term
moved on) and inserts nothing; the primary key `(pid, log_offset)` backs this up. Two writers,
in one process or two, can therefore never both extend a log at the same offset.

Group commit: a dispatcher takes every waiting write call (appends of many partitions, L0
catalog rows, event rows) into one transaction with one statement per table (arrays through
`unnest`), so a batch costs a handful of round trips whatever its size. Up to `writers` batches
are on their way at once, each on its own pooled connection; a partition has at most one append
in flight, so its appends commit in the order they were made.

Connection trouble (server restart, dropped connection, failover) is retried for up to
`reconnect_timeout_s`, then answered with `StorageError` (retriable: HTTP 503). A batch whose
COMMIT got no answer is resolved with `txid_status`: committed batches are answered as committed,
the others run again, so an acknowledged append is always in the database and an unacknowledged
one is wholly there or wholly absent.

The store is one class over one pool and one dispatcher (`base.PostgresBase`: opening and
closing, retries, group commit), with a module per role: `partition_log`, `epochs`, `l1`,
`catalog`, `consumer_offsets`, `cluster_control`, `producers`, `topic_configs`, `transactions`.
"""

from __future__ import annotations

from .base import CONNECTION_ERRORS, redacted
from .catalog import CatalogRole
from .cluster_control import ClusterRole
from .consumer_offsets import ConsumerOffsetRole
from .epochs import EpochRole
from .l1 import L1Role
from .partition_log import PartitionLogRole
from .producers import ProducerBatchRole
from .topic_configs import TopicConfigRole
from .transactions import TransactionRole

__all__ = ["CONNECTION_ERRORS", "PostgresLogStore", "redacted"]


class PostgresLogStore(
    PartitionLogRole,
    EpochRole,
    L1Role,
    CatalogRole,
    ConsumerOffsetRole,
    ClusterRole,
    ProducerBatchRole,
    TopicConfigRole,
    TransactionRole,
):
    """The `LogStore` (and `ClusterControl`, `ProducerBatchStore`) on PostgreSQL."""
