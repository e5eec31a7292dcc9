"""The admin APIs that look at transactions, the tools for finding a hanging one (Kafka's
`kafka-transactions.sh`, kafka-python's `find_hanging_transactions`):

- ListTransactions: the transactional ids this node coordinates, by state and producer id (and,
  v1, those running longer than a duration);
- DescribeTransactions: a coordinated transaction's state, timeout, start time, producer and
  partitions (NOT_COORDINATOR for one another node coordinates, TRANSACTIONAL_ID_NOT_FOUND for
  one nobody initialised);
- DescribeProducers: a led partition's active producers, as its log knows them (the last
  batches of each, `core.producers`), with the first offset of the transaction each holds open
  there. Producers of HTTP idempotency keys are not Kafka producers and are not shown; a
  producer's last timestamp and the coordinator epoch are not kept (-1).

They read what the transaction coordinator and the partitions hold, and change nothing.
"""

from __future__ import annotations

import datetime
from typing import Any

from kio.schema.errors import ErrorCode

from levelzero.actors.intake import IDEMPOTENCY_ID_BASE
from levelzero.actors.node import Node
from levelzero.core.errors import LevelZeroError
from levelzero.core.producers import SEQUENCE_MAX
from levelzero.kafka.errors import coordinator_unavailable, error_code_for
from levelzero.kafka.protocol import Request, make
from levelzero.kafka.transactions import (
    COMPLETE_ABORT,
    COMPLETE_COMMIT,
    EMPTY,
    ONGOING,
    PREPARE_ABORT,
    PREPARE_COMMIT,
    TransactionCoordinator,
    TxnState,
)

# The coordinator's states by Kafka's names (TransactionState.name).
KAFKA_STATE_NAMES = {
    EMPTY: "Empty",
    ONGOING: "Ongoing",
    PREPARE_COMMIT: "PrepareCommit",
    PREPARE_ABORT: "PrepareAbort",
    COMPLETE_COMMIT: "CompleteCommit",
    COMPLETE_ABORT: "CompleteAbort",
}
# States Kafka has that a transaction here never is in: a filter naming one matches nothing,
# but it is a state Kafka knows (not an unknown filter).
_OTHER_KAFKA_STATES = ("Dead", "PrepareEpochFence")
_NO_TIME = datetime.datetime.fromtimestamp(-0.001, tz=datetime.timezone.utc)  # -1 on the wire


class TransactionAdminApi:
    def __init__(self, node: Node, transactions: TransactionCoordinator) -> None:
        self.node = node
        self.transactions = transactions

    async def list_transactions(self, request: Request) -> Any:
        m = request.response_module
        body = request.body
        known = set(KAFKA_STATE_NAMES.values()) | set(_OTHER_KAFKA_STATES)
        states = set(body.state_filters)
        producers = set(body.producer_id_filters)
        duration_ms = getattr(body, "duration_filter", -1)  # v1: running at least this long
        now = self.transactions.clock()
        listed = []
        try:
            coordinated = await self.transactions.coordinated()
        except LevelZeroError as exc:
            return make(
                m.ListTransactionsResponse,
                throttle_time=0,
                error_code=coordinator_unavailable("ListTransactions", exc),
                unknown_state_filters=(),
                transaction_states=(),
            )
        for txn in coordinated:
            name = KAFKA_STATE_NAMES[txn.state]
            if states and name not in states or producers and txn.producer_id not in producers:
                continue
            if duration_ms >= 0 and not (
                txn.state == ONGOING and txn.started_at > 0 and (now - txn.started_at) * 1000 >= duration_ms
            ):
                continue
            listed.append(
                make(
                    m.TransactionState,
                    transactional_id=txn.transactional_id,
                    producer_id=txn.producer_id,
                    transaction_state=name,
                )
            )
        return make(
            m.ListTransactionsResponse,
            throttle_time=0,
            error_code=ErrorCode.none,
            unknown_state_filters=tuple(sorted(states - known)),
            transaction_states=tuple(listed),
        )

    async def describe_transactions(self, request: Request) -> Any:
        m = request.response_module
        answers = []
        for tid in request.body.transactional_ids:
            try:
                code, txn = await self.transactions.described(tid)
            except LevelZeroError as exc:
                code, txn = coordinator_unavailable(f"DescribeTransactions of {tid}", exc), None
            answers.append(_described(m, tid, code, txn))
        return make(m.DescribeTransactionsResponse, throttle_time=0, transaction_states=tuple(answers))

    async def describe_producers(self, request: Request) -> Any:
        m = request.response_module
        topics = []
        for topic in request.body.topics:
            partitions = []
            for index in topic.partition_indexes:
                code, message, active = ErrorCode.none, None, ()
                try:
                    active = await self._active_producers(m, topic.name, index)
                except LevelZeroError as exc:
                    code, message = error_code_for(exc), str(exc)
                partitions.append(
                    make(
                        m.PartitionResponse,
                        partition_index=index,
                        error_code=code,
                        error_message=message,
                        active_producers=active,
                    )
                )
            topics.append(make(m.TopicResponse, name=topic.name, partitions=tuple(partitions)))
        return make(m.DescribeProducersResponse, throttle_time=0, topics=tuple(topics))

    async def _active_producers(self, m: Any, topic: str, partition: int) -> tuple[Any, ...]:
        """The partition's Kafka producers (those of its log's remembered batches, and those
        holding a transaction open there) in producer id order; LevelZeroError where this node
        does not lead it (NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION)."""
        actor = await self.node.led_partition(topic, partition)
        rows = {pid: (epoch, batches) for pid, epoch, batches in actor.state.producers.rows()}
        open_at = (await self.transactions.index.get(topic, partition)).open
        out = []
        for producer_id in sorted(
            (rows.keys() | open_at.keys()) - {p for p in rows if p >= IDEMPOTENCY_ID_BASE}
        ):
            epoch, batches = rows.get(producer_id, (-1, ()))
            last_sequence = -1
            if batches:
                base_sequence, count, _ = batches[-1]
                last_sequence = (base_sequence + count - 1) % (SEQUENCE_MAX + 1)
            out.append(
                make(
                    m.ProducerState,
                    producer_id=producer_id,
                    producer_epoch=epoch,
                    last_sequence=last_sequence,
                    last_timestamp=-1,
                    coordinator_epoch=-1,
                    current_txn_start_offset=open_at.get(producer_id, -1),
                )
            )
        return tuple(out)


def _described(m: Any, tid: str, code: ErrorCode, txn: TxnState | None) -> Any:
    if txn is None:
        return make(
            m.TransactionState,
            error_code=code,
            transactional_id=tid,
            transaction_state="",
            transaction_timeout=0,
            transaction_start_time=_NO_TIME,
            producer_id=-1,
            producer_epoch=-1,
            topics=(),
        )
    by_topic: dict[str, list[int]] = {}
    for topic, partition in txn.partitions:
        by_topic.setdefault(topic, []).append(partition)
    started = (
        datetime.datetime.fromtimestamp(txn.started_at, tz=datetime.timezone.utc)
        if txn.state == ONGOING and txn.started_at > 0
        else _NO_TIME
    )
    return make(
        m.TransactionState,
        error_code=ErrorCode.none,
        transactional_id=tid,
        transaction_state=KAFKA_STATE_NAMES[txn.state],
        transaction_timeout=txn.timeout_ms,
        transaction_start_time=started,
        producer_id=txn.producer_id,
        producer_epoch=txn.producer_epoch,
        topics=tuple(
            make(m.TopicData, topic=topic, partitions=tuple(sorted(ps)))
            for topic, ps in sorted(by_topic.items())
        ),
    )
