"""The HTTP API's bodies, one msgspec Struct per message, shared by the server and the client.

Bytes travel as base64 strings (msgspec's JSON encoding of `bytes`), so a bad base64 value is a
`ValidationError` naming the field (`$.records[3].value`), which the server answers with 400.
Requests forbid unknown fields: a misspelt field is an error, not silently ignored.
"""

from __future__ import annotations

import msgspec

from levelzero.core.reconcile_health import Abandoned


# The largest number a query or path parameter (offset, partition, max_bytes, limit, epoch) may
# hold: 18 digits, below 2**63 (Kafka's int64 offsets) whatever the digits.
UNSIGNED_MAX = 10**18 - 1

# The answer to an abandon-unreconciled: the node's record of it, as is.
AbandonResponse = Abandoned


class _Request(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    pass


class _Response(msgspec.Struct, frozen=True):
    pass


# ------------------------------------------------------------------------------ requests


class CreateTopicRequest(_Request):
    name: str
    partitions: int  # required: no default count is guessed for the caller
    # Kafka's topic configs (docs/kafka.md): one that is unknown, malformed or not enforced is a
    # 400 invalid_config and the topic is not made.
    configs: dict[str, str] = msgspec.field(default_factory=dict)


class TopicConfigsRequest(_Request):
    """PUT: the topic's whole set (configs left out go back to their defaults). PATCH: only
    these change; a null value deletes one (back to its default)."""

    configs: dict[str, str | None]


class RecordIn(_Request):
    value: bytes | None  # null: a null value (Kafka's tombstone), distinct from "" (empty)
    key: bytes | None = None
    # Kafka's record model (L0/L1 format 2): a timestamp in ms since the epoch and headers,
    # each [name, value (base64) or null]. Both optional.
    timestamp_ms: int | None = None
    headers: list[tuple[str, bytes | None]] | None = None


class ProduceRequest(_Request):
    records: list[RecordIn]
    # A produce with a key is stored once: the same key again with the same records (a retry)
    # answers the offsets the first one was stored at, duplicate true, and stores nothing; with
    # other records it is refused, 422 idempotency_key_reused (see intake.produce_once).
    idempotency_key: str | None = None


class EmptyRequest(_Request):
    """The body of a POST that takes no parameters (epoch advance, GC pause and resume): none,
    or `{}`; any field is unknown, as on every other route."""


class GcRunRequest(_Request):
    dry_run: bool = False  # list what would be deleted, delete nothing


class HousekeeperRunRequest(_Request):
    force: bool = False  # treat every partition as idle (advance its epoch now)


class AbandonRequest(_Request):
    """`abandon-unreconciled`: topic and partition in the body, not the path, so a topic an
    older levelzero accepted (`.`, `..`) can be named too."""

    topic: str
    partition: int
    operator: str  # who asks (recorded in the log and the audit line)
    reason: str  # why (the incident)
    confirm: bool = False  # must be true: the offsets given up are never readable again


# ----------------------------------------------------------------------------- responses


# Seconds in the `Retry-After` header of every 503 (the API's and a refused connection's).
RETRY_AFTER_S = 1


class ErrorBody(_Response):
    error: str  # a stable code: invalid_input, unknown_topic, stale_cluster_epoch, ...
    message: str


class KeyReusedBody(ErrorBody):
    """422 `idempotency_key_reused`, with the offsets the key's first request was stored at
    (when known), so that a client can tell what of it was stored (the Spark sink does)."""

    base_offset: int
    last_offset: int


class TopicInfo(_Response):
    name: str
    partitions: int


class TopicList(_Response):
    topics: list[TopicInfo]


class TopicConfigOut(_Response):
    name: str
    value: str
    source: str  # topic (set on the topic) | node (the node's configuration) | default (Kafka's)
    default: bool


class TopicConfigs(_Response):
    topic: str
    configs: list[TopicConfigOut]  # every Kafka topic config, by name


class ProduceResponse(_Response, omit_defaults=True):  # duplicate: only when true
    base_offset: int
    last_offset: int
    attempts: int  # 1 unless the fence rejected a stale epoch and the batcher retried
    duplicate: bool = False  # its idempotency_key was stored before: that produce's offsets


class RecordOut(_Response, omit_defaults=True):
    offset: int
    key: bytes | None  # always present: null when the record has no key
    value: bytes | None  # always present: null for a null value, "" for an empty one
    timestamp_ms: int | None = None  # left out when the record has none
    headers: list[tuple[str, bytes | None]] | None = None  # left out when the record has none


class FetchResponse(_Response):
    records: list[RecordOut]
    next_offset: int
    high_watermark: int
    start_offset: int
    tier: str  # "l1" | "l0" | "l1+l0" (on from L1 into L0) | "none" (nothing at this offset yet)


class L1ObjectStatus(_Response):
    """One L1 object of a partition's valid lineage."""

    base_offset: int
    last_offset: int
    term: int
    key: str


class PartitionStatus(_Response):
    topic: str
    partition: int
    term: int
    window: tuple[int, int] | None  # the fence's effective window [previous, max]
    previous_applied_epoch: int | None
    max_applied_epoch: int | None
    min_epoch_lower_bound: int | None
    mp: int | None  # M(p) as published to the GC (held lower by active L0 readers)
    lro: int
    lrlo: int
    high_watermark: int
    start_offset: int
    size_bytes: int  # record bytes ever appended (retention, DeleteRecords subtract nothing)
    readers: int
    pending_records: int
    read_units: int
    window_slides: int
    stale_rejections: int
    last_rejected_gap: int
    new_epoch_fences: int
    same_epoch_fences: int
    reconciler_lag: int = 0  # offsets not yet reconciled: high watermark - 1 - LRO
    # Valid L1 objects (COPY_FINISHED, within the term lineage); null when unknown: the node had
    # not cached them and reading them from the metastore failed.
    l1_objects: int | None = 0
    # The newest of them (at most L1_LINEAGE_SHOWN_MAX), as the node's L1 catalog last read them
    # (read from the metastore for a partition it has not cached yet, right after a start):
    # read again right after each of its copies, so for a moment after a catch-up the LRO is
    # ahead of the lineage shown. Null when unknown, as `l1_objects`.
    l1_lineage: list[L1ObjectStatus] | None = []


class BatcherStatus(_Response):
    """The node's batcher counters since it started (not the L0 objects the store holds)."""

    objects_uploaded: int
    bytes_uploaded: int
    records_appended: int
    stale_rejections: int
    stale_retries: int
    stale_failures: int
    orphan_objects: int
    inflight_bytes: int


class L0CacheStatus(_Response):
    """The readers' cache of L0 objects (`node.l0_cache_bytes_max`): one GET per object."""

    bytes_max: int
    held_bytes: int  # objects held
    inflight_bytes: int  # GETs of objects in flight, each counted at the largest object loaded lately
    objects: int
    hits: int  # extents sliced from a held object
    shared: int  # extents sliced from a GET another read had in flight
    loads: int  # GETs of an object
    uncached_gets: int  # extents read with a GET of their own (off, no room, thrashing, failed load)
    evictions: int  # objects dropped for room
    hit_ratio: float  # (hits + shared) / extents read
    load_every: int = 1  # one miss in this many loads its object (more than 1: thrashing)
    released: int = 0  # objects dropped once the GC's watermark passed their epoch (collected)


class ReconcilerStatus(_Response):
    rounds: int
    objects_written: int  # L1 objects
    bytes_written: int
    records_reconciled: int
    catch_ups_rejected: int  # a newer term took over: the object is outside the lineage
    errors: int
    lag_offsets: int  # over every partition, now
    failing: list[ReconcileFailingStatus] = []  # partitions whose reconciliation keeps failing
    # L1 objects whose delete failed (DELETE_STARTED, still in the bucket), retried with backoff
    l1_deletes_pending: int = 0
    l1_deletes_pending_shown: list[L1DeletePendingStatus] = []  # the oldest 20
    # L1 objects no row named (a restore's lost history), deleted by the prefix sweeps
    l1_strays_deleted: int = 0


class PartitionCompactionStatus(_Response):
    """One compacted partition led here, as its compactor last saw it."""

    partition: str
    dirty_ratio: float  # L1 bytes above the cleaner offset over all its L1 bytes
    last_compaction_at: float | None  # unix time of its last accepted result
    bytes_reclaimed: int
    records_removed: int
    tombstones_dropped: int
    cleaner_offsets: dict[str, int]  # term -> the offset the cleaning reached under it
    passes: int
    refused: int  # results the control plane refused (outside the term lineage)
    not_compacted: str | None  # why its last visit did not compact


class CompactorStatus(_Response):
    rounds: int
    passes: int
    refused: int
    bytes_read: int
    bytes_written: int
    errors: int
    partitions: list[PartitionCompactionStatus] = []


class L1DeletePendingStatus(_Response):
    """An L1 object whose delete failed: tried again at `next_retry_at`, until it goes."""

    key: str
    partition: str
    since: float  # unix time of its first failed delete
    failures: int
    last_error: str
    next_retry_at: float  # unix time of its next try (backoff doubling up to delete_retry_max_s)


class ReconcileFailingStatus(_Response):
    """A partition whose reconciliation keeps failing: it holds M (and the GC) back."""

    partition: str
    since: float  # unix time of the first failure of this run of failures
    failures: int  # consecutive failed passes
    last_error: str
    last_failed_at: float


class HousekeeperStatus(_Response):
    rounds: int
    epochs_advanced: int
    catch_ups: int
    start_offsets_set: int  # retention
    l1_deleted: int
    errors: int


class GcRoundSummary(_Response):
    """The last GC round (or dry run), without its key lists."""

    round_id: int
    dry_run: bool
    finished_at: float  # unix seconds
    duration_s: float
    cluster_epoch: int
    m: int | None  # None: blocked (some partition had no M(p))
    blocked_by: list[str]
    listed: int
    eligible: int
    deleted: int
    deleted_bytes: int
    too_young: int
    errors: int
    backlog: int


class GcStatus(_Response):
    paused: bool
    m: int | None  # the highest M the GC has acted on (None: no round with an M yet)
    epoch_lag: int | None  # cluster epoch now - that M
    rounds: int
    dry_runs: int
    failed_rounds: int
    safety_blocked_rounds: int  # rounds that deleted nothing: a partition had no M(p)
    objects_deleted: int
    bytes_deleted: int
    max_deleted_epoch: int | None
    backlog: int  # eligible but not deleted at the end of the last round
    next_round_in_s: float | None
    pace_reason: str | None
    last_round: GcRoundSummary | None


class UnstorableTopic(_Response):
    """A stored topic an older levelzero accepted whose name no object store can hold."""

    topic: str
    problem: str
    advice: str  # what an operator does


class PartitionOutlier(_Response):
    """A partition worth an operator's look, named in the default status summary."""

    partition: str  # "topic/p"
    # Why, any of: "m_holder" (its M(p) is M while another partition's is above),
    # "reconciler_lag", "stale_rejections", "reconcile_failing", "unstorable".
    reasons: list[str]
    mp: int | None
    reconciler_lag: int
    stale_rejections: int


class PartitionPage(_Response):
    """One page of `GET /v1/status/partitions`, in (topic, partition) order."""

    partitions: list[PartitionStatus]
    partitions_total: int  # partitions on this node (matching ?topic= when given)
    next_after: str | None  # pass as ?after= for the next page; None: this was the last


class StatusResponse(_Response):
    cluster_epoch: int
    cached_epoch: int | None  # this node's epoch cache (may lag by design)
    m: int | None  # min over published M(p), capped at cluster_epoch - 1; None: blocked
    m_holders: list[str]  # partitions whose M(p) equals M ("cap" when epoch - 1 binds)
    m_blocked_by: list[str]  # partitions without an M(p) yet (first few)
    m_blocked_count: int
    accepting: bool
    partitions: list[PartitionStatus]
    batcher: BatcherStatus
    reconciler: ReconcilerStatus | None = None
    l0_cache: L0CacheStatus | None = None
    compactor: CompactorStatus | None = None
    housekeeper: HousekeeperStatus | None = None
    gc: GcStatus | None = None
    unstorable_topics: list[UnstorableTopic] = []  # stored topics today's name rule refuses
    # Why `accepting` is false (and /readyz 503): starting, stopping, storage unhealthy (which
    # store, since when, the last error).
    not_accepting_reason: str | None = None
    # Only the first page of partitions is in `partitions` (the whole list when it is short):
    # `GET /v1/status/partitions?after=` pages through the rest from `partitions_next_after`.
    partitions_total: int = 0
    partitions_next_after: str | None = None
    # The partitions worth a look (at most STATUS_OUTLIERS_MAX, the worst first) and how many
    # there are in all.
    outliers: list[PartitionOutlier] = []
    outliers_count: int = 0
    # When `m` was computed (unix seconds): alone, now; in a cluster, from every partition's
    # M(p) in the control plane, read every third of the lease TTL. None: not read yet.
    m_read_at: float | None = None
    # In a cluster: each holder and blocker (as listed above) -> the node leading it by this
    # node's last cluster view ("" while it has no live leader).
    m_led_by: dict[str, str] = {}
    # How many partitions hold M in all (`m_holders` lists the first few).
    m_holders_count: int = 0


class EpochResponse(_Response):
    cluster_epoch: int


class HealthResponse(_Response):
    status: str


class ClusterNodeInfo(_Response):
    node_id: str
    advertise_url: str
    live: bool  # its lease is current
    draining: bool
    partitions_led: int
    lease_expires_in_s: float  # negative: expired that long ago


class ClusterInfo(_Response):
    """`GET /v1/cluster`: the members and who leads what, as this node last read them."""

    enabled: bool  # False: a single node (it leads every partition)
    node_id: str | None  # the node that answered
    nodes: list[ClusterNodeInfo]
    partitions_total: int
    partitions_without_leader: int
