"""Produce and InitProducerId: record batches decoded here, taken in by the produce intake (the
size rule, idempotence, the partitions' lanes, the hand-off to the node: `actors.intake`)."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from levelzero.actors.intake import Pending, ProduceIntake, ProduceObserver, unobserved
from levelzero.core.errors import LevelZeroError, ShuttingDown
from levelzero.core.l0format import Record
from levelzero.kafka import records as kr
from levelzero.kafka.errors import error_code_for
from levelzero.kafka.metadata import AutoCreate
from levelzero.kafka.protocol import Request, UnansweredFailure, make
from levelzero.core.txn_marks import RESERVED_HEADER_REFUSAL, has_reserved_header
from levelzero.kafka.transactions import TransactionCoordinator, txn_header

log = logging.getLogger("levelzero.kafka")

# A record set whose first batch claims more records than this is decoded in a worker thread.
DECODE_OFF_LOOP_RECORDS = 10_000
VALID_ACKS = (-1, 0, 1)  # all, none, the leader (Kafka's ReplicaManager.isValidRequiredAcks)
# What a refused transactional record set is told (the error's meaning here)
TXN_REFUSALS = {
    ErrorCode.invalid_producer_id_mapping: "no transaction here has this producer id and transactional id",
    ErrorCode.invalid_txn_state: "the partition is not in the producer's ongoing transaction",
}


class ProduceApi:
    def __init__(
        self,
        intake: ProduceIntake,
        auto_create: AutoCreate | None = None,
        transactions: TransactionCoordinator | None = None,
        observe: ProduceObserver = unobserved,
    ) -> None:
        self.intake = intake
        self.auto_create = auto_create  # kafka.auto_create_topics: unknown topics are made
        self.transactions = transactions
        self.observe = observe  # each request: acknowledged when every partition was stored

    async def produce(
        self, request: Request, after: anyio.Event | None = None, submitted: anyio.Event | None = None
    ) -> Any | None:
        """Records reach each partition's lane in the intake in the order the connection sent them: this
        request submits once the connection's previous produce has (`after`), then lets the next
        one submit (`submitted`); it does not wait for the previous one to be stored. Observed
        (`observe`) from here to the partitions' outcomes, a request failing or refused on any
        partition as not acknowledged."""
        started = time.perf_counter()
        body = request.body
        jobs = [(t.name, p.index, p.records) for t in body.topic_data for p in t.partition_data]
        try:
            results = await self._results(body, jobs, after, submitted)
        except Exception:
            self.observe(time.perf_counter() - started, False)
            raise
        self.observe(time.perf_counter() - started, all(code == ErrorCode.none for code, _, _ in results))
        if body.acks == 0:
            failed = [
                f"{topic}/{partition}: {code.name}"
                for (topic, partition, _), (code, _, _) in zip(jobs, results, strict=True)
                if code != ErrorCode.none
            ]
            if failed:
                raise UnansweredFailure(f"a produce with acks=0 failed ({', '.join(failed[:5])})")
            return None
        return self._response(request.response_module, jobs, results)

    async def _results(
        self,
        body: Any,
        jobs: list[tuple[str, int, bytes | None]],
        after: anyio.Event | None,
        submitted: anyio.Event | None,
    ) -> list[tuple[ErrorCode, int, str | None]]:
        """Per job, its error code, base offset and error message."""
        if body.acks not in VALID_ACKS:  # as Kafka: every partition refused, nothing stored or made
            refusal = (ErrorCode.invalid_required_acks, -1, f"acks must be -1, 0 or 1, not {body.acks}")
            return [refusal] * len(jobs)
        transactional_id = getattr(body, "transactional_id", None)
        if transactional_id is None and any(kr.transactional_head(data or b"") for _, _, data in jobs):
            # As Kafka's handler: transactional records need the producer's transactional id;
            # stored, their range would hold the last stable offset for good (no transaction
            # here would ever end it), every read_committed consumer of the partition stuck.
            refusal = (
                ErrorCode.transactional_id_authorization_failed,
                -1,
                "transactional records need the request's transactional_id",
            )
            return [refusal] * len(jobs)
        if self.auto_create is not None:
            known = self.intake.node.topics()
            unknown = [t.name for t in body.topic_data if t.name not in known]
            if unknown:
                await self.auto_create(unknown)  # a topic not made answers unknown topic below
        targets: dict[int, list[tuple[str, int]]] = {}
        for topic, partition, data in jobs:
            producer_id = kr.producer_id_of(data or b"")
            if producer_id >= 0:
                targets.setdefault(producer_id, []).append((topic, partition))
        for producer_id, partitions in targets.items():
            await self.intake.prepare_producer(producer_id, partitions)
        refused = await self._open_transactions(jobs, transactional_id)
        decoded = await self._decode_large(jobs, refused)
        if after is not None:
            await after.wait()
        outcomes = [
            refused.get(i) or self._submit(topic, partition, data, decoded.get(i))
            for i, (topic, partition, data) in enumerate(jobs)
        ]
        if submitted is not None:
            submitted.set()
        results: list[tuple[ErrorCode, int, str | None]] = []
        for outcome in outcomes:
            if isinstance(outcome, Pending):
                await outcome.done.wait()
                if outcome.error is not None:
                    results.append(self._produce_failed(outcome.topic, outcome.partition, outcome.error))
                else:
                    results.append((ErrorCode.none, outcome.base_offset, None))
            else:
                results.append(outcome)
        return results

    @staticmethod
    def _response(
        m: Any, jobs: list[tuple[str, int, bytes | None]], results: list[tuple[ErrorCode, int, str | None]]
    ) -> Any:
        by_topic: dict[str, list[Any]] = {}
        for (topic, partition, _), (code, base_offset, message) in zip(jobs, results, strict=True):
            by_topic.setdefault(topic, []).append(
                make(
                    m.PartitionProduceResponse,
                    index=partition,
                    error_code=code,
                    base_offset=base_offset,
                    log_append_time=None,
                    log_start_offset=-1,
                    record_errors=(),
                    error_message=message,
                )
            )
        responses = tuple(
            make(m.TopicProduceResponse, name=name, partition_responses=tuple(parts))
            for name, parts in by_topic.items()
        )
        return make(m.ProduceResponse, responses=responses, throttle_time=0)

    async def _open_transactions(
        self, jobs: list[tuple[str, int, bytes | None]], transactional_id: str | None
    ) -> dict[int, tuple[ErrorCode, int, str | None]]:
        """A transactional record set's partition gets its open range (durable) before the
        records are submitted; a fenced epoch is refused. The refused jobs by index."""
        refused: dict[int, tuple[ErrorCode, int, str | None]] = {}
        for i, (topic, partition, data) in enumerate(jobs):
            head = kr.transactional_head(data or b"")
            if head is None:
                continue
            producer_id, epoch = head
            if self.transactions is None:
                refused[i] = (ErrorCode.invalid_txn_state, -1, "transactions are not served here")
                continue
            try:
                await self.transactions.load()  # (after a restart: every transaction known first)
            except LevelZeroError as exc:  # the store failing: the producer retries
                refused[i] = (error_code_for(exc), -1, str(exc))
                continue
            code = self.transactions.produce_error(producer_id, epoch, topic, partition, transactional_id)
            if code == ErrorCode.not_enough_replicas:
                # the AddPartitionsToTxn that added it, answered, not yet durable: waited for
                await self.transactions.registered(producer_id, topic, partition)
                code = self.transactions.produce_error(producer_id, epoch, topic, partition, transactional_id)
            if code != ErrorCode.none:
                refused[i] = (
                    code,
                    -1,
                    TXN_REFUSALS.get(code, "the producer's epoch is fenced by a newer one"),
                )
                continue
            try:
                # Loaded first: the high watermark read next is the one the range opens at (one
                # read before an await could be stale, and the last stable offset move back).
                await self.transactions.index.get(topic, partition)
                _, high_watermark = self.intake.offsets(topic, partition)
                await self.transactions.index.open_range(topic, partition, producer_id, high_watermark)
            except LevelZeroError as exc:
                refused[i] = self._produce_failed(topic, partition, exc)
        return refused

    @staticmethod
    async def _decode_large(
        jobs: list[tuple[str, int, bytes | None]], refused: Mapping[int, object]
    ) -> dict[int, list[kr.KafkaBatch] | LevelZeroError]:
        """The record sets claiming more than DECODE_OFF_LOOP_RECORDS records, decoded in a
        worker thread (by index): a batch of a million empty records is 821 bytes of zstd and
        took 0.36 s of the event loop to decode (four clients sending 30 each stalled every
        request of the daemon for 46 s)."""
        decoded: dict[int, list[kr.KafkaBatch] | LevelZeroError] = {}
        for i, (_, _, data) in enumerate(jobs):
            if i in refused or not data or kr.records_claimed(data) <= DECODE_OFF_LOOP_RECORDS:
                continue
            try:
                decoded[i] = await anyio.to_thread.run_sync(
                    functools.partial(kr.decode_batches, data, stored=True)
                )
            except LevelZeroError as exc:
                decoded[i] = exc
        return decoded

    def _submit(
        self,
        topic: str,
        partition: int,
        data: bytes | None,
        decoded: list[kr.KafkaBatch] | LevelZeroError | None = None,
    ) -> Pending | tuple[ErrorCode, int, str | None]:
        """Decode one partition's record set (unless `decoded` already) and hand it to the
        intake (no await: requests submit in the order they call this)."""
        try:
            self.intake.check_led(topic, partition)
            if isinstance(decoded, LevelZeroError):
                raise decoded
            batches = kr.decode_batches(data or b"", stored=True) if decoded is None else decoded
        except LevelZeroError as exc:
            return self._produce_failed(topic, partition, exc)
        problem = kr.client_record_set_problem(batches)
        if problem is not None:
            return ErrorCode.invalid_record, -1, problem
        records: list[Record] = batches[0].records  # type: ignore[assignment]
        if any(has_reserved_header(r.headers) for r in records):
            return ErrorCode.invalid_record, -1, RESERVED_HEADER_REFUSAL
        first = batches[0]
        if first.is_transactional and self.transactions is not None:
            # Checked again with no await before the submit: a record set submitted while its
            # transaction is ongoing is ahead of the transaction's markers in the lane.
            code = self.transactions.produce_error(
                first.producer_id, first.producer_epoch, topic, partition, None
            )
            if code != ErrorCode.none:
                return code, -1, "the producer's transaction is fenced, not ongoing, or behind a marker"
        if first.is_transactional:  # stored with the transaction's header (see transactions)
            header = txn_header(first.producer_id, first.producer_epoch, -1)
            records = [Record(r.key, r.value, r.timestamp_ms, (*r.headers, header)) for r in records]
        identity = None
        if first.producer_id >= 0 and first.base_sequence >= 0:
            identity = (first.producer_id, first.producer_epoch, topic, partition, first.base_sequence)
        after = None
        if first.is_transactional and self.transactions is not None:
            # the previous transaction's marker, ahead in the lane: not stored without it
            after = self.transactions.marker_ahead(first.producer_id, topic, partition)
        try:
            outcome = self.intake.submit(
                topic, partition, records, identity, after, wire_bytes=len(data or b"")
            )
        except LevelZeroError as exc:
            return self._produce_failed(topic, partition, exc)
        if isinstance(outcome, int):  # an idempotent batch already stored: its offset
            return ErrorCode.none, outcome, None
        return outcome

    def _produce_failed(
        self, topic: str, partition: int, exc: LevelZeroError
    ) -> tuple[ErrorCode, int, str | None]:
        if isinstance(exc, ShuttingDown) and not self.intake.node.accepting:  # a graceful stop's
            log.info("kafka produce to %s/%d refused: %s: %s", topic, partition, exc.code, exc)
        elif exc.retriable or exc.code in ("storage_error", "store_refused"):
            log.warning("kafka produce to %s/%d failed: %s: %s", topic, partition, exc.code, exc)
        return error_code_for(exc), -1, str(exc)

    def init_producer_id(self, request: Request) -> Any:
        m = request.response_module
        if request.body.transactional_id is not None:
            return make(
                m.InitProducerIdResponse,
                throttle_time=0,
                error_code=ErrorCode.transactional_id_authorization_failed,
                producer_id=-1,
                producer_epoch=-1,
            )
        producer_id = self.intake.new_producer_id()
        return make(
            m.InitProducerIdResponse,
            throttle_time=0,
            error_code=ErrorCode.none,
            producer_id=producer_id,
            producer_epoch=0,
        )
