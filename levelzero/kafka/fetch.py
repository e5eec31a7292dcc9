"""Fetch: long polls over the node's reads, filling a response's budget across partitions as
Kafka's fetch does. Woken by every produce through the intake (and re-checking every
FETCH_POLL_S)."""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from levelzero.actors.intake import ProduceIntake
from levelzero.actors.node import Node
from levelzero.actors.reader import FETCH_BYTES_MAX, Framing
from levelzero.core.errors import LevelZeroError
from levelzero.core.throttled_warning import ThrottledBugs
from levelzero.kafka import records as kr
from levelzero.kafka.epochs import NO_EPOCH, encode_with_epochs, epoch_error
from levelzero.kafka.errors import error_code_for
from levelzero.kafka.protocol import Request, make
from levelzero.kafka.transactions import PartitionIndex

log = logging.getLogger("levelzero.kafka")

FETCH_WAIT_MAX_MS = 30_000  # a client asking to wait longer waits this long
FETCH_RESPONSE_BYTES_MAX = 64 * 1024 * 1024  # whatever max_bytes a fetch asks for
FETCH_POLL_S = 0.1  # long polls re-check partitions this often when nothing wakes them
# What a fetch's encoding adds to its records' keys, values and headers, counted against the
# partition's max_bytes as Kafka counts the batches it returns: a record batch's header per run,
# and per record its length, attributes, timestamp and offset deltas, key and value lengths and
# header count (varints: 11 bytes for a record of a few KiB, 10,000 records into its batch and
# seconds after its first). Small records were returned at three to four times max_bytes.
KAFKA_FRAMING = Framing(record=12, run=kr.BATCH_HEADER_BYTES)


class FetchApi:
    def __init__(self, node: Node, intake: ProduceIntake, txns: PartitionIndex | None = None) -> None:
        self.node = node
        self.intake = intake
        self.txns = txns  # read_committed: each partition's last stable offset, aborted ranges
        # A partition's read failing unexpectedly (a bug): the partition answers
        # UNKNOWN_SERVER_ERROR, as Kafka's broker does, and the traceback is logged at most
        # once an interval per kind of error (a client retries such a fetch at once, for ever).
        self._bugs = ThrottledBugs(log, time.monotonic, keys_max=64)

    async def fetch(self, request: Request) -> Any:
        body = request.body
        # (topic, partition, offset, max bytes, the leader epoch the client knows: Fetch v9+)
        wanted = [
            (
                t.topic,
                p.partition,
                p.fetch_offset,
                min(max(p.partition_max_bytes, 1), FETCH_BYTES_MAX),
                getattr(p, "current_leader_epoch", NO_EPOCH),
            )
            for t in body.topics
            for p in t.partitions
        ]
        wait_ms = min(max(int(body.max_wait.total_seconds() * 1000), 0), FETCH_WAIT_MAX_MS)
        deadline = time.monotonic() + wait_ms / 1000
        min_bytes = max(body.min_bytes, 1)
        committed = getattr(body, "isolation_level", 0) == 1 and self.txns is not None
        if committed:  # each partition's transactions loaded (from the store after a restart)
            for topic, partition, _, _, _ in wanted:
                try:
                    self.node.partition(topic, partition)
                    await self.txns.get(topic, partition)  # type: ignore[union-attr]
                except LevelZeroError:
                    pass
        seen_hwms: list[int] | None = None
        while True:
            hwms = [self._high_watermark(t, p, committed) for t, p, _, _, _ in wanted]
            if hwms != seen_hwms:
                seen_hwms = hwms
                results = await self._fetch_all(wanted, body.max_bytes, committed)
                size = sum(len(data) for _, _, _, data in results)
                if size >= min_bytes or any(code != ErrorCode.none for code, _, _, _ in results):
                    break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await self.intake.wait_appended(min(remaining, FETCH_POLL_S))
        m = request.response_module
        by_topic: dict[str, list[Any]] = {}
        for (topic, partition, offset, _, _), (code, hwm, start, data) in zip(wanted, results, strict=True):
            # (from the start offset the answer holds, if retention moved it past `offset`)
            stable, aborted = self._stable(topic, partition, hwm, max(offset, start), committed)
            by_topic.setdefault(topic, []).append(
                make(
                    m.PartitionData,
                    partition_index=partition,
                    error_code=code,
                    high_watermark=hwm,
                    last_stable_offset=stable,
                    log_start_offset=start,
                    aborted_transactions=aborted
                    if aborted is None
                    else tuple(make(m.AbortedTransaction, producer_id=p, first_offset=f) for p, f in aborted),
                    preferred_read_replica=-1,
                    records=data,
                )
            )
        responses = tuple(
            make(m.FetchableTopicResponse, topic=topic, partitions=tuple(parts))
            for topic, parts in by_topic.items()
        )
        return make(
            m.FetchResponse, throttle_time=0, error_code=ErrorCode.none, session_id=0, responses=responses
        )

    def _stable(
        self, topic: str, partition: int, hwm: int, offset: int, committed: bool
    ) -> tuple[int, list[tuple[int, int]] | None]:
        """The last stable offset, and for read_committed the aborted transactions overlapping
        what the fetch could return ([offset, LSO)): none whose abort marker lies below
        `offset`, since a consumer applies a listed range until it reads the range's marker."""
        txns = None if self.txns is None or hwm < 0 else self.txns.known(topic, partition)
        if txns is None:
            return hwm, [] if committed else None
        stable = txns.last_stable_offset(hwm)
        if not committed:
            return stable, None
        return stable, txns.aborted_between(offset, stable)

    def _limit(self, topic: str, partition: int, committed: bool) -> int | None:
        """read_committed reads below the last stable offset (None: no limit)."""
        if not committed or self.txns is None:
            return None
        txns = self.txns.known(topic, partition)
        if txns is None:
            return None
        return txns.last_stable_offset(2**62)

    def _start_offset(self, topic: str, partition: int, default: int) -> int:
        try:
            return self.node.partition(topic, partition).state.start_offset
        except LevelZeroError:
            return default

    def _high_watermark(self, topic: str, partition: int, committed: bool = False) -> int:
        try:
            hwm = self.intake.offsets(topic, partition)[1]
        except LevelZeroError:
            return -1
        limit = self._limit(topic, partition, committed)
        return hwm if limit is None else min(hwm, limit)

    async def _fetch_all(
        self, wanted: list[tuple[str, int, int, int, int]], max_bytes: int, committed: bool = False
    ) -> list[tuple[ErrorCode, int, int, bytes]]:
        """As Kafka's fetch: partitions in request order, each up to its own maximum, while the
        response's budget lasts; the budget counts only the bytes a partition returned, so a
        partition with nothing to read uses none of it. Partitions with data are read
        concurrently, in waves: a wave takes partitions while their maxima fit what is left
        (the first always), and what they did not use goes to the next wave."""
        results = [self._empty(topic, partition) for topic, partition, _, _, _ in wanted]
        budget = min(max(max_bytes, 1), FETCH_RESPONSE_BYTES_MAX)
        todo = [
            i
            for i, (topic, partition, offset, _, epoch) in enumerate(wanted)
            if self._has_data(topic, partition, offset, epoch, committed)
        ]

        async def read(i: int, limit: int) -> None:
            topic, partition, offset, _, epoch = wanted[i]
            results[i] = await self._fetch_partition(topic, partition, offset, limit, epoch, committed)

        while todo and budget > 0:
            wave: list[tuple[int, int]] = []
            reserved = 0
            while todo and reserved < budget:
                i = todo.pop(0)
                limit = min(wanted[i][3], budget - reserved)
                wave.append((i, limit))
                reserved += limit
            async with anyio.create_task_group() as tg:
                for i, limit in wave:
                    tg.start_soon(read, i, limit)
            budget -= sum(len(results[i][3]) for i, _ in wave)
        return results

    def _has_data(self, topic: str, partition: int, offset: int, epoch: int, committed: bool = False) -> bool:
        """Whether reading `offset` answers anything but an empty record set: records, or an error."""
        try:
            state = self.node.partition(topic, partition).state
        except LevelZeroError:
            return True  # read it to answer its error
        if epoch_error(state.term, epoch) != ErrorCode.none:
            return True
        limit = self._limit(topic, partition, committed)
        if limit is not None and offset >= limit and offset <= state.high_watermark:
            return False
        return offset != state.high_watermark

    def _empty(self, topic: str, partition: int) -> tuple[ErrorCode, int, int, bytes]:
        try:
            start, high_watermark = self.intake.offsets(topic, partition)
        except LevelZeroError as exc:
            return error_code_for(exc), -1, -1, b""
        return ErrorCode.none, high_watermark, start, b""

    async def _fetch_partition(
        self, topic: str, partition: int, offset: int, max_bytes: int, epoch: int, committed: bool = False
    ) -> tuple[ErrorCode, int, int, bytes]:
        """One partition's answer. An error carries empty records, as Kafka's does (a null record
        set is a parse failure for librdkafka, which then retries forever)."""
        try:
            state = self.node.partition(topic, partition).state
            refused = epoch_error(state.term, epoch)
            if refused != ErrorCode.none:
                return refused, -1, -1, b""
            start, high_watermark = state.first_readable_offset, state.high_watermark
            if offset == high_watermark:
                return ErrorCode.none, high_watermark, start, b""
            if not start <= offset < high_watermark:
                return ErrorCode.offset_out_of_range, high_watermark, start, b""
            result = await self.node.fetch(topic, partition, offset, max_bytes, KAFKA_FRAMING)
        except LevelZeroError as exc:
            code = error_code_for(exc)
            if code not in (ErrorCode.unknown_topic_or_partition, ErrorCode.offset_out_of_range):
                log.warning("kafka fetch %s/%d@%d failed: %s: %s", topic, partition, offset, exc.code, exc)
            return code, -1, -1, b""
        except Exception as exc:  # noqa: BLE001 - a bug: logged, answered (cancelling is not an Exception)
            self._bugs.failed(
                exc,
                None,
                "BUG: kafka fetch %s/%d@%d failed unexpectedly (%s); answered UNKNOWN_SERVER_ERROR",
                topic,
                partition,
                offset,
                type(exc).__name__,
            )
            return ErrorCode.unknown_server_error, -1, -1, b""
        runs, start = result.runs, result.start_offset
        limit = self._limit(topic, partition, committed)
        if limit is not None:
            # read_committed: nothing at or past the last stable offset, nor below the log
            # start offset as it is now: retention may have moved it while the read was under
            # way, and the aborted ranges below it are forgotten (`PartitionIndex.prune`), so
            # the answer would list none of theirs (the client is told out of range next).
            # Nor may it list a range whose marker lies below the new start, not yet forgotten:
            # the consumer, never reading that marker, would skip the producer's later
            # committed records as aborted. The answer says the new start, and `_stable`
            # lists the ranges from there.
            floor = self._start_offset(topic, partition, state.start_offset)
            runs = [
                run._replace(
                    start=max(run.start, floor - run.base_offset), stop=min(run.stop, limit - run.base_offset)
                )
                for run in runs
                if run.base_offset + run.start < limit and run.base_offset + run.stop > floor
            ]
            start = max(start, floor)
        data = encode_with_epochs(runs, state) if runs else b""
        return ErrorCode.none, result.high_watermark, start, data
