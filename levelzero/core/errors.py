"""Errors of levelzero.

Two families, kept apart on purpose (STYLE.md): a `LevelZeroError` is an *operating* error —
bad input from outside or a retriable condition — and is answered with a clear message.
A violated invariant is a bug: it is an `AssertionError` (or `InvariantViolation`) and crashes
loudly. Nothing here imports I/O.
"""

from __future__ import annotations


class LevelZeroError(Exception):
    """Base of every operating error. `code` is the stable machine-readable name."""

    code = "error"
    retriable = False


class InvariantViolation(AssertionError):
    """A core invariant broke. Always a bug; never caught to keep going."""


class StaleClusterEpoch(LevelZeroError):
    """The epoch is below the partition's window: refresh the epoch cache and retry."""

    code = "stale_cluster_epoch"
    retriable = True

    def __init__(self, epoch: int, window_min: int, window_max: int) -> None:
        super().__init__(f"epoch {epoch} is below the partition's window [{window_min}, {window_max}]")
        self.epoch = epoch
        self.window_min = window_min
        self.window_max = window_max


class LogMovedOn(LevelZeroError):
    """A `TermStart` was refused: the log grew after the new leader's replay read it (the
    previous leader's last append landed in between). The new leader replays the rest and
    tries again; the store never lets a term start anywhere but at the end of the log."""

    code = "log_moved_on"
    retriable = True

    def __init__(self, partition: str, log_offset: int, next_log_offset: int) -> None:
        super().__init__(
            f"partition {partition}: TermStart at log offset {log_offset}, the log continues "
            f"at {next_log_offset}"
        )
        self.partition = partition
        self.next_log_offset = next_log_offset


class NotLeader(LevelZeroError):
    """An append carried a term that is no longer the partition's current term."""

    code = "not_leader"
    retriable = True

    def __init__(self, partition: str, expected_term: int, current_term: int | None) -> None:
        super().__init__(
            f"partition {partition}: append expected term {expected_term}, current term is {current_term}"
        )
        self.partition = partition
        self.expected_term: int | None = expected_term
        self.current_term = current_term


class LedElsewhere(LevelZeroError):
    """In a cluster, another node leads the partition (or none does, during a move)."""

    code = "not_leader"
    retriable = True

    def __init__(self, topic: str, partition: int, leader_url: str | None) -> None:
        where = f"its leader is {leader_url}" if leader_url else "it has no live leader (moving)"
        super().__init__(f"partition {topic}/{partition} is not led by this node: {where}")
        self.topic = topic
        self.partition = partition
        self.leader_url = leader_url


class SnapshotSuperseded(NotLeader):
    """A snapshot older than the one the store holds: a newer leader saved that one, so the
    sender is deposed (a paused leader's save arriving after its successor's). Nothing is
    written; the sender acts as on any NotLeader."""

    def __init__(self, partition: str, log_offset: int, saved: int) -> None:
        LevelZeroError.__init__(
            self,
            f"partition {partition}: snapshot at log offset {log_offset} is older than the saved "
            f"one at {saved} (a newer leader saved it)",
        )
        self.partition = partition
        self.expected_term = None
        self.current_term = None


class PartitionDeleted(NotLeader):
    """A write to a partition whose topic was deleted (a leader that has not yet heard of the
    deletion): nothing is written, and the sender acts as on any NotLeader (it resigns; its
    clients find the topic gone)."""

    def __init__(self, partition: str, what: str) -> None:
        LevelZeroError.__init__(self, f"partition {partition} was deleted: {what} refused")
        self.partition = partition
        self.expected_term = None
        self.current_term = None


class MalformedKey(LevelZeroError, ValueError):
    """An object key does not follow the levelzero key layout."""

    code = "malformed_key"


class InvalidInput(LevelZeroError, ValueError):
    """A request or configuration value is out of its allowed range or shape."""

    code = "invalid_input"


class TooLarge(LevelZeroError):
    """A produce request over the one size rule's limit (`core.produce_size`): split it."""

    code = "too_large"

    def __init__(
        self,
        size: int,
        limit: int,
        limit_name: str = "batch_bytes_max",
        records: int = 0,
        *,
        as_sent: bool = False,
    ) -> None:
        # One record over the limit cannot be split: say so rather than "split the request".
        advice = "one record cannot be larger than the limit" if records == 1 else "split the request"
        # `as_sent`: a Kafka record batch's size on the wire (compressed), as Kafka's broker
        # holds a topic's max.message.bytes to it
        if as_sent:
            text = f"a record batch of {size} bytes as sent exceeds {limit_name} {limit}"
        else:
            text = (
                f"{size} record bytes exceed {limit_name} {limit} (value + key + header names "
                "and values + 8 per record)"
            )
        super().__init__(f"{text}; {advice}")
        self.size, self.limit = size, limit


class IdempotencyKeyReused(LevelZeroError):
    """An HTTP produce whose idempotency key was first used with other records on the
    partition: not a repeat, so not answered as one, and not stored (a key names one request)."""

    code = "idempotency_key_reused"

    def __init__(self, first: tuple[int, int] | None = None) -> None:
        # (base offset, record count) of the request the key was first used with, when known
        # (not for two requests of one key taken together, the first one not stored yet)
        at = "" if first is None else f" (stored at offsets {first[0]}..{first[0] + first[1] - 1})"
        super().__init__(
            f"idempotency_key was first used with a different request (other records) on this "
            f"partition{at}; a new request needs a new key"
        )
        self.first = first


class KeylessRecord(LevelZeroError):
    """A record without a key produced to a compacted topic (Kafka's INVALID_RECORD)."""

    code = "invalid_record"

    def __init__(self, topic: str) -> None:
        super().__init__(f"compacted topic {topic!r} cannot accept a record without a key")


class UnknownTopic(LevelZeroError, KeyError):
    code = "unknown_topic"

    def __init__(self, topic: str) -> None:
        super().__init__(f"unknown topic {topic!r}")
        self.topic = topic

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class UnknownPartition(LevelZeroError, KeyError):
    code = "unknown_partition"

    def __init__(self, topic: str, partition: int) -> None:
        super().__init__(f"unknown partition {topic}/{partition}")
        self.topic = topic
        self.partition = partition

    def __str__(self) -> str:
        return str(self.args[0])


class TopicExists(LevelZeroError):
    code = "topic_exists"


class TopicNameCollides(LevelZeroError):
    """A new topic's name is an existing topic's but for '.' against '_' (`names.colliding_topic`):
    refused as Kafka refuses it (INVALID_TOPIC_EXCEPTION), the two being one in metric names."""

    code = "topic_collides"

    def __init__(self, topic: str, existing: str) -> None:
        super().__init__(
            f"topic {topic!r} collides with existing topic {existing!r}: '.' and '_' are the same "
            "character in Kafka's metric names, so Kafka refuses a topic that differs from another "
            "only there"
        )
        self.topic, self.existing = topic, existing


class InternalTopicName(LevelZeroError):
    """A new topic named as one of Kafka's internal topics (`names.INTERNAL_TOPICS`): refused
    as Kafka's controller refuses creating its own metadata topic (INVALID_REQUEST)."""

    code = "internal_topic"

    def __init__(self, topic: str) -> None:
        super().__init__(
            f"Creation of internal topic {topic} is prohibited: it is Kafka's internal topic, and "
            "levelzero keeps consumer group offsets and transactions in its control plane, not in "
            "topics"
        )
        self.topic = topic


class InvalidConfig(LevelZeroError, ValueError):
    """A topic config that is unknown, malformed, or not enforced by levelzero (Kafka's
    INVALID_CONFIG): refused, never stored and ignored."""

    code = "invalid_config"


class PolicyViolation(LevelZeroError):
    """A request a topic's configured policy forbids (Kafka's POLICY_VIOLATION): DeleteRecords
    on a topic whose cleanup.policy lacks `delete`."""

    code = "policy_violation"


class OffsetOutOfRange(LevelZeroError):
    """A fetch offset is below the start offset or above the high watermark."""

    code = "offset_out_of_range"

    def __init__(self, offset: int, start_offset: int, high_watermark: int) -> None:
        super().__init__(
            f"offset {offset} is outside the readable range "
            f"[{start_offset}, {high_watermark}) of the partition"
        )
        self.offset = offset
        self.start_offset = start_offset
        self.high_watermark = high_watermark


class OffsetsAbandoned(OffsetOutOfRange):
    """A fetch offset lies in a range an operator gave up (`abandon-unreconciled`): its L0 data
    was lost and it will never be readable. Same code as any unreadable offset."""

    def __init__(self, offset: int, first: int, last: int, start_offset: int, high_watermark: int) -> None:
        super().__init__(offset, start_offset, high_watermark)
        self.args = (
            f"offset {offset} is in the range {first}..{last} that an operator abandoned "
            f"(its L0 data was lost); the next readable offset is {last + 1}",
        )
        self.first, self.last = first, last


class CorruptData(LevelZeroError):
    """Stored bytes failed a checksum or could not be decoded."""

    code = "corrupt_data"


class StorageError(LevelZeroError):
    """An object store or log store failed in a way the caller may retry."""

    code = "storage_error"
    retriable = True


class StoreRefused(StorageError):
    """A store this levelzero must not use as it is: a newer or unknown schema, another
    cluster's objects. Neither a retry nor a restart can fix it, only an operator: the daemon
    exits with status 2, which its systemd unit does not restart (`RestartPreventExitStatus`)."""

    code = "store_refused"
    retriable = False


class StoreNeedsRestart(StorageError):
    """A store that refuses every write until it is opened again: the SQLite log store once a
    write batch failed mid-way (a full disk, an I/O error, its writer process gone), whose view
    of the file can no longer be trusted. A restart fixes it (the log is replayed: nothing
    acknowledged is lost), so the daemon exits with status 1 and systemd restarts it; waiting
    does not."""


class NodeIdTaken(StoreRefused):
    """A node registering under a `cluster.node_id` that another live node holds with another
    advertise URL: two processes under one id would take the row from each other every round
    (leases lost, terms restarted, redirects flapping). A restart under the same advertise URL
    is never refused, whether or not its previous run's registration is still live."""

    code = "node_id_taken"

    def __init__(self, node_id: str, other_url: str, lease_left_s: float) -> None:
        super().__init__(
            f"cluster.node_id {node_id!r} is taken: another live node registered it with advertise_url "
            f"{other_url} (its lease runs {max(lease_left_s, 0.0):.1f} s more); give this node its own "
            "cluster.node_id, or stop that node first (a crashed one's registration lapses with its lease)"
        )
        self.node_id = node_id
        self.other_url = other_url


class ShuttingDown(LevelZeroError):
    code = "shutting_down"
    retriable = True


class OutOfOrderSequence(LevelZeroError):
    """An idempotent producer's batch does not follow the last one stored for its partition
    (Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER): an earlier batch is still to come (its retry)."""

    code = "out_of_order_sequence"
    retriable = True

    def __init__(self, producer_id: int, base_sequence: int, expected: int) -> None:
        super().__init__(
            f"producer {producer_id}'s batch at sequence {base_sequence} is out of order: "
            f"the next stored must be {expected}"
        )
        self.producer_id = producer_id
        self.base_sequence = base_sequence
        self.expected = expected


class StaleProducerEpoch(LevelZeroError):
    """An idempotent producer's batch of an epoch older than one the partition has stored for
    the producer id (Kafka's INVALID_PRODUCER_EPOCH): a zombie of the producer, which has moved
    on to a newer epoch since. Not stored, not retriable."""

    code = "invalid_producer_epoch"

    def __init__(self, producer_id: int, producer_epoch: int, current: int) -> None:
        super().__init__(
            f"producer {producer_id}'s batch has epoch {producer_epoch}, older than the epoch "
            f"{current} stored for it in this partition"
        )
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.current = current


class ObjectNotFound(LevelZeroError):
    """An object store has no object under the key."""

    code = "object_not_found"

    def __init__(self, key: str, where: str = "") -> None:
        super().__init__(f"object {key!r} not found" + (f" in {where}" if where else ""))
        self.key = key


def directory_problem(path: object, exc: OSError) -> str:
    """Why a directory at `path` could not be made (`os.makedirs`), for an operator: a file in
    the way says so, where the OS's own words are "File exists" or "Not a directory"."""
    if isinstance(exc, FileExistsError):
        return f"{path} is a file, not a directory"
    if isinstance(exc, NotADirectoryError):
        return f"{path}: a part of the path is a file, not a directory"
    return f"cannot create directory {path}: {exc.strerror or exc}"
