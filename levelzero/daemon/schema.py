"""The HTTP API's bodies, one msgspec Struct per message, shared by the server and the client.

Bytes travel as base64 strings (msgspec's JSON encoding of `bytes`), so a bad base64 value is a
`ValidationError` naming the field (`$.records[3].value`), which the server answers with 400.
Requests forbid unknown fields: a misspelt field is an error, not silently ignored.
"""

from __future__ import annotations

import msgspec


class _Request(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    pass


class _Response(msgspec.Struct, frozen=True):
    pass


# ------------------------------------------------------------------------------ requests


class CreateTopicRequest(_Request):
    name: str
    partitions: int = 1


class RecordIn(_Request):
    value: bytes
    key: bytes | None = None


class ProduceRequest(_Request):
    records: list[RecordIn]


# ----------------------------------------------------------------------------- responses


class ErrorBody(_Response):
    error: str  # a stable code: invalid_input, unknown_topic, stale_cluster_epoch, ...
    message: str


class TopicInfo(_Response):
    name: str
    partitions: int


class TopicList(_Response):
    topics: list[TopicInfo]


class ProduceResponse(_Response):
    base_offset: int
    last_offset: int
    attempts: int  # 1 unless the fence rejected a stale epoch and the batcher retried


class RecordOut(_Response):
    offset: int
    key: bytes | None
    value: bytes


class FetchResponse(_Response):
    records: list[RecordOut]
    next_offset: int
    high_watermark: int
    start_offset: int
    tier: str  # "l0" | "l1" | "none" (nothing at this offset yet)


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
    size_bytes: int
    readers: int
    pending_records: int
    read_units: int
    window_slides: int
    stale_rejections: int
    last_rejected_gap: int
    new_epoch_fences: int
    same_epoch_fences: int


class BatcherStatus(_Response):
    objects_uploaded: int
    bytes_uploaded: int
    records_appended: int
    stale_rejections: int
    stale_retries: int
    stale_failures: int
    orphan_objects: int
    inflight_bytes: int


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


class EpochResponse(_Response):
    cluster_epoch: int


class HealthResponse(_Response):
    status: str
