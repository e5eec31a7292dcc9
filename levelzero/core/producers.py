"""Idempotent producers: per (producer id, partition) the last batches acknowledged, so a batch a
client retries (same producer id, epoch and base sequence) is answered with the offset it was
stored at instead of being stored twice. Pure and bounded: at most `producers_max` (producer,
partition) pairs are remembered, the least recently used are forgotten first; for each, the last
`BATCHES_REMEMBERED` batches (Kafka's broker keeps five, the most a client has in flight).

Five batches are enough only if they are stored in sequence order (a client's window of five
unacknowledged batches then spans at most five stored ones): a batch that does not follow the
last one stored is refused (`next_sequence`, Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER), and the
client sends it again after the earlier one it waits for.

Every batch recorded is a fact about the log (stored at `base_offset`), learnt from wherever: an
append just made, the partition's durable placeholders, the log store's sequence table. Facts may
arrive in any order, so a producer's batches are kept in offset order and "the last one stored" is
the one at the highest offset, not the one recorded last; a batch of an older producer epoch,
below the newest batch known, changes nothing.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from .errors import LevelZeroError, OutOfOrderSequence, StaleProducerEpoch
from .l0format import Record

BATCHES_REMEMBERED = 5
# An HTTP idempotency key's producer epoch (see `request_epoch`): keys stored before the epoch
# carried the request's digest have this one; a repeat of such a key is compared with its first
# request by record count alone (`key_repeat_differs`).
KEY_EPOCH_UNCHECKED = 0
KEY_EPOCH_MAX = 2**15 - 1  # a producer epoch is an int16, as Kafka's
SEQUENCE_MAX = 2**31 - 1  # a sequence is an int32; past the largest it wraps to 0 (Kafka's rule)
PRODUCERS_MAX_DEFAULT = 100_000


@dataclass(frozen=True, slots=True)
class StoredBatch:
    base_sequence: int
    record_count: int
    base_offset: int


def batch_with_sequence(batches: Sequence[StoredBatch], base_sequence: int) -> StoredBatch | None:
    """The one of a producer's last `batches` (of its current epoch) that began at
    `base_sequence`: the batch a retry with that sequence repeats; None if it is new."""
    for batch in batches:
        if batch.base_sequence == base_sequence:
            return batch
    return None


_request_encoder = msgspec.msgpack.Encoder()


def request_epoch(records: Sequence[Record]) -> int:
    """The producer epoch an HTTP idempotency key's batch is stored under: 15 bits of the
    SHA-256 of its request's records (as given: per record its key, value, timestamp or none
    and headers, msgpack-encoded as the `Record` structs they are), 1..KEY_EPOCH_MAX. A repeat
    of the key with other records finds the key's producer stored at another epoch
    (`key_reused`); with the same ones, at the same epoch, a repeat. Two different requests
    share an epoch once in 32,767 (`key_repeat_differs` still tells them apart when their
    record counts differ): the guard is against a mistake (a key reused by a bug), not an
    adversary. The digest of given records must never change (a repeat stored under the old
    one would be refused): a test pins it."""
    digest = hashlib.sha256(_request_encoder.encode(records)).digest()
    return 1 + int.from_bytes(digest[:8], "big") % KEY_EPOCH_MAX


def key_reused(stored_epoch: int | None, epoch: int) -> bool:
    """Whether an idempotency key whose producer is stored at `stored_epoch` (None: not
    stored) was first used with other records than a request whose epoch is `epoch`."""
    assert 1 <= epoch <= KEY_EPOCH_MAX, epoch
    return stored_epoch is not None and stored_epoch not in (epoch, KEY_EPOCH_UNCHECKED)


def key_repeat_differs(stored_record_count: int, record_count: int) -> bool:
    """Whether a request of `record_count` records, found to repeat a key's batch stored with
    `stored_record_count` (the same epoch, or a key stored before the digest was kept), holds
    other records all the same: a digest shared by chance, or a key without a digest (then
    the record count is all that is compared)."""
    assert stored_record_count >= 1 and record_count >= 1, (stored_record_count, record_count)
    return stored_record_count != record_count


def epoch_refusal(
    producer_id: int, known_epoch: int | None, producer_epoch: int, base_sequence: int
) -> LevelZeroError | None:
    """Why a Kafka idempotent producer's batch must not be stored given the epoch the partition
    knows for the producer id (`known_epoch`; None: the producer is not known, any epoch and
    sequence will do), as Kafka's ProducerAppendInfo checks it: an older epoch is a zombie's
    (INVALID_PRODUCER_EPOCH); a newer one starts its sequences over, so its first batch has
    sequence 0 (OUT_OF_ORDER_SEQUENCE_NUMBER otherwise). None if it may be stored (the
    sequence within an epoch is `next_sequence`'s rule)."""
    if known_epoch is None or producer_epoch == known_epoch:
        return None
    if producer_epoch < known_epoch:
        return StaleProducerEpoch(producer_id, producer_epoch, known_epoch)
    if base_sequence != 0:
        return OutOfOrderSequence(producer_id, base_sequence, 0)
    return None


class ProducerSequences:
    def __init__(self, producers_max: int = PRODUCERS_MAX_DEFAULT) -> None:
        assert producers_max >= 1
        self.producers_max = producers_max
        # (producer id, topic, partition) -> (producer epoch, last batches, oldest first)
        self._states: OrderedDict[tuple[int, str, int], tuple[int, list[StoredBatch]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._states)

    def duplicate_of(
        self, producer_id: int, producer_epoch: int, topic: str, partition: int, base_sequence: int
    ) -> StoredBatch | None:
        """The stored batch this one repeats, or None if it is new."""
        if producer_id < 0 or base_sequence < 0:
            return None
        state = self._states.get((producer_id, topic, partition))
        if state is None or state[0] != producer_epoch:
            return None
        return batch_with_sequence(state[1], base_sequence)

    def epoch_of(self, producer_id: int, topic: str, partition: int) -> int | None:
        """The epoch the producer's batches in the partition were stored under; None if none is
        remembered."""
        state = self._states.get((producer_id, topic, partition))
        return None if state is None else state[0]

    def next_sequence(self, producer_id: int, producer_epoch: int, topic: str, partition: int) -> int | None:
        """The base sequence the producer's next new batch must have, or None when any will do
        (a producer not known here, or a new epoch: it starts over)."""
        state = self._states.get((producer_id, topic, partition))
        if state is None or state[0] != producer_epoch or not state[1]:
            return None
        last = state[1][-1]
        return following_sequence(last.base_sequence, last.record_count)

    def record(
        self,
        producer_id: int,
        producer_epoch: int,
        topic: str,
        partition: int,
        base_sequence: int,
        record_count: int,
        base_offset: int,
    ) -> None:
        if producer_id < 0 or base_sequence < 0:
            return
        assert record_count >= 1 and base_offset >= 0
        key = (producer_id, topic, partition)
        state = self._states.pop(key, None)
        batch = StoredBatch(base_sequence, record_count, base_offset)
        if state is None:
            batches = [batch]
        elif state[0] != producer_epoch:
            if state[1] and base_offset < state[1][-1].base_offset:
                # An older epoch's batch (the producer moved on since): nothing to remember.
                self._states[key] = state
                return
            batches = [batch]  # a new epoch: its sequences start over
        else:
            batches = [b for b in state[1] if b.base_sequence != base_sequence]  # recorded again: once
            batches.append(batch)
            if len(batches) > 1 and base_offset < batches[-2].base_offset:
                batches.sort(key=_offset)  # an older fact learnt late: in offset order
            batches = batches[-BATCHES_REMEMBERED:]
        self._states[key] = (producer_epoch, batches)
        while len(self._states) > self.producers_max:
            self._states.popitem(last=False)
        assert len(self._states) <= self.producers_max

    def forget_partition(self, topic: str, partition: int) -> None:
        """Forget every producer's batches in one partition (its view is rebuilt from the log)."""
        for key in [k for k in self._states if k[1] == topic and k[2] == partition]:
            del self._states[key]

    def forget_topic(self, topic: str) -> None:
        """Forget every producer's batches in the topic's partitions (it was deleted)."""
        for key in [k for k in self._states if k[1] == topic]:
            del self._states[key]


def _offset(batch: StoredBatch) -> int:
    return batch.base_offset


def following_sequence(base_sequence: int, record_count: int) -> int:
    """The sequence after a batch of `record_count` records at `base_sequence` (wrapping)."""
    following = base_sequence + record_count
    return following if following <= SEQUENCE_MAX else following - SEQUENCE_MAX - 1


# A partition's state remembers this many producers (the least recently appended forgotten
# first): their batches ride in its snapshots.
PARTITION_PRODUCERS_MAX = 1_000

# A producer's row in a partition snapshot: (producer id, epoch, ((base sequence, record count,
# base offset), ...) oldest first).
ProducerRow = tuple[int, int, tuple[tuple[int, int, int], ...]]


class PartitionProducers:
    """One partition's idempotent producers as its log says (Kafka's ProducerStateManager): fed
    every placeholder's producer spans in log order by the partition state, so it is rebuilt
    from the snapshot and the log whenever a term begins, and holds exactly what is durable.
    Per producer its epoch and last `BATCHES_REMEMBERED` batches; at most `producers_max`
    producers, the least recently appended forgotten first (deterministic: log order)."""

    __slots__ = ("producers_max", "_states")

    def __init__(self, producers_max: int = PARTITION_PRODUCERS_MAX) -> None:
        assert producers_max >= 1
        self.producers_max = producers_max
        self._states: dict[int, tuple[int, tuple[StoredBatch, ...]]] = {}

    def __len__(self) -> int:
        return len(self._states)

    def append(
        self, producer_id: int, producer_epoch: int, base_sequence: int, record_count: int, base_offset: int
    ) -> None:
        """A batch stored at `base_offset`, above every batch appended before."""
        assert record_count >= 1 and base_offset >= 0
        state = self._states.pop(producer_id, None)
        batch = StoredBatch(base_sequence, record_count, base_offset)
        if state is None or state[0] != producer_epoch:
            batches: tuple[StoredBatch, ...] = (batch,)  # new, or a new epoch: starts over
        else:
            assert not state[1] or state[1][-1].base_offset < base_offset, (state, batch)
            batches = (*state[1], batch)[-BATCHES_REMEMBERED:]
        self._states[producer_id] = (producer_epoch, batches)
        if len(self._states) > self.producers_max:
            del self._states[next(iter(self._states))]

    def duplicate_of(self, producer_id: int, producer_epoch: int, base_sequence: int) -> StoredBatch | None:
        """The stored batch this one repeats, or None."""
        state = self._states.get(producer_id)
        if state is None or state[0] != producer_epoch:
            return None
        return batch_with_sequence(state[1], base_sequence)

    def epoch_of(self, producer_id: int) -> int | None:
        """The epoch the producer's remembered batches were stored under; None if it has none."""
        state = self._states.get(producer_id)
        return None if state is None else state[0]

    def next_sequence(self, producer_id: int, producer_epoch: int) -> int | None:
        """The base sequence the producer's next new batch must have, or None when any will do
        (a producer not known here, or a new epoch: it starts over)."""
        state = self._states.get(producer_id)
        if state is None or state[0] != producer_epoch:
            return None
        last = state[1][-1]
        return following_sequence(last.base_sequence, last.record_count)

    def rows(self) -> tuple[ProducerRow, ...]:
        return tuple(
            (producer_id, epoch, tuple((b.base_sequence, b.record_count, b.base_offset) for b in batches))
            for producer_id, (epoch, batches) in self._states.items()
        )

    @classmethod
    def from_rows(cls, rows: tuple[ProducerRow, ...]) -> PartitionProducers:
        producers = cls()
        for producer_id, epoch, batches in rows:
            producers._states[producer_id] = (epoch, tuple(StoredBatch(*b) for b in batches))
        return producers
