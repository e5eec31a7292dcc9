"""A read_committed fetch that retention overtakes (found by the simulation's transactional
producers): the log start offset moves past an aborted transaction while the read is under way,
and the transaction index forgets the aborted ranges below the new start. The answer must then
hold none of the records below it: listing no aborted range for them, it would hand a consumer
the aborted records as committed. The same race before the index forgets them (single-node seed 765):
an aborted range whose marker lies below the new start must not be listed either, or the
consumer, never reading that marker, skips the producer's later committed records. (Timing this
with a real client and a real retention pass is not reproducible; the read is held here where
the race opens.)"""

from __future__ import annotations

from typing import Any

from levelzero.actors.reader import UNFRAMED, FetchResult, Framing, Run
from levelzero.core.l0format import Record
from levelzero.core.state import PartitionState
from levelzero.kafka import records as kr
from levelzero.kafka.fetch import FetchApi
from kio.index import load_request_schema

from levelzero.kafka.protocol import Request, make
from levelzero.kafka.transactions import PartitionIndex, marker_record, read_committed_batches, txn_header
from levelzero.sim.transactions import read_committed_fetch
from levelzero.storage.protocols import MemoryTransactionStore, TxnRangeRow

PRODUCER = 42


class _Actor:
    def __init__(self, state: PartitionState) -> None:
        self.state = state


class _Node:
    """The partition as the node serves it; its read lets retention move the start offset
    (and the coordinator's pass forget the aborted ranges below it) before it returns."""

    def __init__(self, records: list[Record], index: PartitionIndex, prune: bool = True) -> None:
        self.records = records
        self.index = index
        self.prune = prune
        self.actor = _Actor(PartitionState(1))
        self.actor.state.high_watermark = len(records)

    def partition(self, topic: str, partition: int) -> _Actor:
        return self.actor

    async def fetch(
        self, topic: str, partition: int, offset: int, max_bytes: int, framing: Framing = UNFRAMED
    ) -> FetchResult:
        result = FetchResult(
            [Run(0, self.records, offset, len(self.records))], len(self.records), len(self.records), 0, "l0"
        )
        self.actor.state.start_offset = 5  # retention, during the read
        if self.prune:
            await self.index.prune(topic, partition)
        return result


class _Intake:
    def __init__(self, node: _Node) -> None:
        self.node = node

    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        state = self.node.actor.state
        return state.start_offset, state.high_watermark

    async def wait_appended(self, timeout_s: float) -> None:
        pass


async def _served(records: list[Record], prune: bool) -> tuple[FetchApi, PartitionIndex]:
    """`records` served as t/0 (retention moving its start to 5 during a read, and forgetting
    the aborted ranges below it if `prune`), the producer's transaction over 0-3 aborted by the
    marker at 4 in the store; the fetch API over it and its transaction index, loaded."""
    store = MemoryTransactionStore()
    await store.open_txn_range(TxnRangeRow("t", 0, PRODUCER, 0, -1, False))
    await store.close_txn_range("t", 0, PRODUCER, 0, 4, True)
    node: Any = None
    index = PartitionIndex(store, lambda topic, partition: node.actor.state.start_offset)
    node = _Node(records, index, prune)
    api = FetchApi(node, _Intake(node), index)  # type: ignore[arg-type]
    await index.get("t", 0)
    return api, index


async def test_a_read_committed_answer_holds_nothing_below_a_start_offset_moved_during_the_read() -> None:
    # Offsets 0-3: an aborted transaction (its marker at 4); 5-7: records of no transaction.
    data = [Record(None, b"aborted-%d" % i, 0, (txn_header(PRODUCER, 0, -1),)) for i in range(4)]
    records = [
        *data,
        marker_record(PRODUCER, 0, False, 0.0),
        *(Record(None, b"plain-%d" % i) for i in range(3)),
    ]
    api, index = await _served(records, prune=True)
    assert index.known("t", 0).aborted == [(PRODUCER, 0, 4)]  # type: ignore[union-attr]

    code, _, _, encoded = await api._fetch_partition("t", 0, 0, 1 << 20, -1, committed=True)
    stable, aborted = api._stable("t", 0, len(records), 0, committed=True)

    assert index.known("t", 0).aborted == []  # type: ignore[union-attr]  # forgotten: below the start
    assert (code, stable, aborted) == (0, len(records), [])
    delivered = [
        (batch.base_offset + r.offset_delta, r.value)
        for batch in kr.decode_batches(encoded)
        if not batch.is_control
        for r in batch.records
        if isinstance(r, kr.KafkaRecord)
    ]
    assert delivered == [(5, b"plain-0"), (6, b"plain-1"), (7, b"plain-2")]


def _consumed(encoded: bytes, aborted: list[tuple[int, int]]) -> list[tuple[int, bytes | None]]:
    """What a read_committed consumer takes from an answer, applying its aborted list as Kafka's
    clients do (`read_committed_batches`)."""
    taken: list[tuple[int, bytes | None]] = []
    for batch, skipped in read_committed_batches(kr.decode_batches(encoded), aborted):
        if batch.is_control or skipped:
            continue
        records = [r for r in batch.records if isinstance(r, kr.KafkaRecord)]
        taken += [(batch.base_offset + r.offset_delta, r.value) for r in records]
    return taken


async def test_a_read_committed_answer_lists_no_aborted_range_its_start_moved_past_during_the_read() -> None:
    # Offsets 0-3: an aborted transaction (its marker at 4); 5-7: the producer's next transaction,
    # committed (its marker at 8). Retention moves the start to 5 during the read; the index has
    # not yet forgotten the aborted range.
    records = [
        *(Record(None, b"aborted-%d" % i, 0, (txn_header(PRODUCER, 0, -1),)) for i in range(4)),
        marker_record(PRODUCER, 0, False, 0.0),
        *(Record(None, b"committed-%d" % i, 0, (txn_header(PRODUCER, 0, -1),)) for i in range(3)),
        marker_record(PRODUCER, 0, True, 0.0),
    ]
    api, index = await _served(records, prune=False)

    answer = await api.fetch(_fetch_request(offset=0))

    (data,) = answer.responses[0].partitions
    aborted = [(int(a.producer_id), int(a.first_offset)) for a in data.aborted_transactions]
    assert index.known("t", 0).aborted == [(PRODUCER, 0, 4)]  # type: ignore[union-attr]  # not yet forgotten
    answered = (data.error_code, data.log_start_offset, data.last_stable_offset, aborted)
    assert answered == (0, 5, len(records), [])
    assert _consumed(data.records, aborted) == [(5, b"committed-0"), (6, b"committed-1"), (7, b"committed-2")]


def _fetch_request(offset: int) -> Request:
    """A read_committed Fetch v11 of t/0 at `offset`, answered at once."""
    fields = read_committed_fetch("t", 0, offset, 1 << 20)
    return Request(1, 11, 1, "test", make(load_request_schema(1, 11), **fields))
