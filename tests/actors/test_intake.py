"""The produce intake both front ends share (actors/intake.py), on a node over memory stores:
fetchers are woken by every produce through it, whichever door it came from; an idempotent
batch is stored once; a record set is refused as the batcher would refuse it."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from levelzero.actors.batcher import BatcherConfig
from levelzero.actors.housekeeper import HousekeeperConfig
from levelzero.actors.intake import Pending, ProduceIntake, idempotency_producer_id
from levelzero.actors.node import NodeConfig
from levelzero.actors.reconciler import ReconcilerConfig
from levelzero.core.entries import Placeholder
from levelzero.core.errors import (
    IdempotencyKeyReused,
    InvalidInput,
    OutOfOrderSequence,
    StaleProducerEpoch,
    StorageError,
    TooLarge,
    UnknownTopic,
)
from levelzero.core.l0format import Record
from levelzero.core.producers import request_epoch
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.protocols import ProducerBatchRow
from levelzero.storage.sqlite.store import SqliteLogStore
from levelzero.testing.nodes import running_node, wait_until
from levelzero.testing.virtual_time import in_virtual_time

TOPIC = "t"
WAIT_FOREVER_S = 3600.0  # a fetcher that is not woken never returns within the test


def node_config() -> NodeConfig:
    return NodeConfig(
        epoch_bump_interval_s=None,
        batcher=BatcherConfig(linger_ms=1.0, batch_bytes_max=1024),
        reconciler=ReconcilerConfig(enabled=False),
        housekeeper=HousekeeperConfig(enabled=False),
    )


async def test_a_plain_produce_wakes_a_waiting_fetcher() -> None:
    """HTTP's produce goes through the intake, so a Kafka long poll waiting on it wakes at once
    (it used to notice an HTTP produce only at its next poll)."""
    async with running_node(node_config(), MemoryLogStore(), MemoryObjectStore()) as node:
        await node.create_topic(TOPIC, 1)
        intake = ProduceIntake(node)
        woken: list[bool] = []

        async def fetcher() -> None:
            await intake.wait_appended(WAIT_FOREVER_S)
            woken.append(True)

        async with anyio.create_task_group() as tg:
            tg.start_soon(fetcher)
            await wait_until(lambda: intake._appended.statistics().tasks_waiting == 1, "the fetcher waits")
            result = await intake.produce(TOPIC, 0, [Record(b"k", b"v")])
            await wait_until(lambda: woken == [True], "the fetcher is woken")
        assert (result.base_offset, result.last_offset) == (0, 0)
        assert intake.offsets(TOPIC, 0) == (0, 1)


async def test_an_idempotent_batch_is_stored_once_and_a_retry_answers_its_offset() -> None:
    async with running_node(node_config(), MemoryLogStore(), MemoryObjectStore()) as node:
        await node.create_topic(TOPIC, 1)
        intake = ProduceIntake(node)
        async with anyio.create_task_group() as tg:
            await tg.start(intake.run)
            first = intake.submit(TOPIC, 0, [Record(None, b"a")], None)  # not idempotent
            identity = (7, 0, TOPIC, 0, 0)
            batch = [Record(None, b"b"), Record(None, b"c")]
            second = intake.submit(TOPIC, 0, batch, identity)
            again = intake.submit(TOPIC, 0, batch, identity)  # a retry while it is being stored
            assert isinstance(first, Pending) and isinstance(second, Pending)
            assert again is second
            await second.done.wait()
            assert (first.error, second.error) == (None, None)
            assert (first.base_offset, second.base_offset) == (0, 1)  # in the order submitted
            assert intake.submit(TOPIC, 0, batch, identity) == 1  # stored: its offset
            tg.cancel_scope.cancel()
        assert intake.offsets(TOPIC, 0) == (0, 3)


async def test_an_idempotent_batch_out_of_sequence_order_is_refused_until_the_earlier_one_is_stored() -> None:
    """Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER: the intake remembers a producer's last five batches,
    which covers a client's window of five unacknowledged batches only if they are stored in
    sequence order. A batch that skips ahead of the last one stored is refused (retriable); the
    earlier batch, then the refused one again, are stored; a retry of any of them answers its
    offset."""
    async with running_node(node_config(), MemoryLogStore(), MemoryObjectStore()) as node:
        await node.create_topic(TOPIC, 1)
        intake = ProduceIntake(node)
        async with anyio.create_task_group() as tg:
            await tg.start(intake.run)

            async def stored(sequence: int, count: int) -> Pending:
                records = [Record(None, b"%d" % (sequence + i)) for i in range(count)]
                pending = intake.submit(TOPIC, 0, records, (7, 0, TOPIC, 0, sequence))
                assert isinstance(pending, Pending)
                await pending.done.wait()
                return pending

            assert (await stored(0, 2)).error is None  # sequences 0, 1 at offsets 0, 1
            ahead = await stored(3, 1)  # sequence 2 is missing
            assert isinstance(ahead.error, OutOfOrderSequence) and ahead.error.retriable
            assert ahead.error.expected == 2
            assert (await stored(2, 1)).base_offset == 2
            assert (await stored(3, 1)).base_offset == 3  # its retry, now in order
            behind = await stored(1, 1)  # not a batch stored (1 is inside the batch at 0)
            assert isinstance(behind.error, OutOfOrderSequence)
            assert intake.submit(TOPIC, 0, [Record(None, b"0"), Record(None, b"1")], (7, 0, TOPIC, 0, 0)) == 0
            assert intake.submit(TOPIC, 0, [Record(None, b"3")], (7, 0, TOPIC, 0, 3)) == 3
            tg.cancel_scope.cancel()
        assert intake.offsets(TOPIC, 0) == (0, 4)


async def test_a_producers_older_epoch_is_refused_and_a_newer_one_starts_at_sequence_0() -> None:
    """Kafka's ProducerAppendInfo: once a partition stored a producer id's batches under epoch
    1, a batch of epoch 0 is a zombie's (INVALID_PRODUCER_EPOCH, not retriable, not stored); a
    batch of epoch 2 must start its sequences at 0 (OUT_OF_ORDER_SEQUENCE_NUMBER otherwise),
    within one round too (two batches of the new epoch taken together)."""
    async with running_node(node_config(), MemoryLogStore(), MemoryObjectStore()) as node:
        await node.create_topic(TOPIC, 1)
        intake = ProduceIntake(node)
        async with anyio.create_task_group() as tg:
            await tg.start(intake.run)

            def submit(epoch: int, sequence: int, value: bytes) -> Pending:
                pending = intake.submit(TOPIC, 0, [Record(None, value)], (7, epoch, TOPIC, 0, sequence))
                assert isinstance(pending, Pending)
                return pending

            first = submit(1, 0, b"a")
            await first.done.wait()
            assert (first.error, first.base_offset) == (None, 0)
            zombie = submit(0, 1, b"zombie")
            await zombie.done.wait()
            assert isinstance(zombie.error, StaleProducerEpoch) and not zombie.error.retriable
            assert (zombie.error.producer_epoch, zombie.error.current) == (0, 1)
            skipped = submit(2, 5, b"skipped")
            await skipped.done.wait()
            assert isinstance(skipped.error, OutOfOrderSequence) and skipped.error.expected == 0
            together = [submit(2, 0, b"b"), submit(2, 1, b"c"), submit(1, 1, b"late")]
            for pending in together:
                await pending.done.wait()
            assert [p.error for p in together[:2]] == [None, None]
            assert [p.base_offset for p in together[:2]] == [1, 2]
            assert isinstance(together[2].error, StaleProducerEpoch)  # epoch 2 taken before it
            tg.cancel_scope.cancel()
        assert intake.offsets(TOPIC, 0) == (0, 3)


@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_a_topic_made_again_with_its_name_knows_no_key_or_producer_of_the_old_one(
    tmp_path: Path, store: str
) -> None:
    """An idempotency key (and a Kafka producer's batch) stored on a partition of a topic since
    deleted and made again with its name is new to the new partition: stored, not answered as
    a repeat of a record the new log never held (the intake's memory of producers answered
    `duplicate: true` with offset 0, which held another record, until a restart)."""
    async with contextlib.AsyncExitStack() as stack:
        log_store: Any = MemoryLogStore()
        if store == "sqlite":
            log_store = await stack.enter_async_context(await SqliteLogStore.open(tmp_path / "log.db"))
        await _made_again(
            await stack.enter_async_context(running_node(node_config(), log_store, MemoryObjectStore()))
        )


async def _made_again(node: Any) -> None:
    """The produces of the test above on `node`."""
    await node.create_topic(TOPIC, 1)
    intake = ProduceIntake(node)
    async with anyio.create_task_group() as tg:
        await tg.start(intake.run)
        assert await intake.produce_once(TOPIC, 0, [Record(None, b"old")], "z") == (0, 1, False)
        kafka = intake.submit(TOPIC, 0, [Record(None, b"k-old")], (7, 0, TOPIC, 0, 0))
        assert isinstance(kafka, Pending)
        await kafka.done.wait()
        await node.delete_topic(TOPIC)
        await node.create_topic(TOPIC, 1)
        others = [Record(None, b"other%d" % i) for i in range(3)]
        assert (await intake.produce(TOPIC, 0, others)).base_offset == 0
        assert await intake.produce_once(TOPIC, 0, [Record(None, b"old")], "z") == (3, 1, False)
        again = intake.submit(TOPIC, 0, [Record(None, b"k-old")], (7, 0, TOPIC, 0, 0))
        assert isinstance(again, Pending)  # not an offset: not stored here before
        await again.done.wait()
        assert (again.error, again.base_offset) == (None, 4)
        tg.cancel_scope.cancel()
    assert intake.offsets(TOPIC, 0) == (0, 5)


async def test_record_sets_the_batcher_would_refuse_are_refused_at_the_door() -> None:
    async with running_node(node_config(), MemoryLogStore(), MemoryObjectStore()) as node:
        await node.create_topic(TOPIC, 1)
        intake = ProduceIntake(node)
        with pytest.raises(InvalidInput):
            intake.submit(TOPIC, 0, [], None)
        with pytest.raises(InvalidInput):
            await intake.produce(TOPIC, 0, [])
        with pytest.raises(TooLarge):  # 1,017 value bytes + 8 > batch_bytes_max 1024
            intake.submit(TOPIC, 0, [Record(None, b"x" * 1017)], None)
        with pytest.raises(UnknownTopic):
            intake.submit("nope", 0, [Record(None, b"x")], None)
        assert intake.offsets(TOPIC, 0) == (0, 0)


@in_virtual_time
async def test_a_batch_whose_placeholder_left_the_log_is_recognised_by_the_next_run() -> None:
    """A producer's batches are stored, reconciled, and the log is truncated below a snapshot
    (their placeholders gone; a memory log store keeps no sequence table), then the node stops
    and a new one starts on the same stores. The partition's state, restored from the snapshot,
    still holds the producer's batches: a retry of the last one answers its offset (not stored
    twice), and the next one follows it (not refused)."""
    log, objects = MemoryLogStore(), MemoryObjectStore()
    config = NodeConfig(
        epoch_bump_interval_s=None,
        batcher=BatcherConfig(linger_ms=1.0),
        reconciler=ReconcilerConfig(interval_s=0.05, object_bytes_min=1, object_age_max_s=0.0),
        housekeeper=HousekeeperConfig(enabled=False),
        snapshot_every_records=2,
        log_keep_records=0,
    )

    async def send(intake: ProduceIntake, sequence: int) -> tuple[int, bool]:
        """(base offset, answered as a repeat) of producer 7's one-record batch."""
        await intake.prepare_producer(7, [(TOPIC, 0)])
        outcome = intake.submit(TOPIC, 0, [Record(None, b"%d" % sequence)], (7, 0, TOPIC, 0, sequence))
        if isinstance(outcome, int):
            return outcome, True
        await outcome.done.wait()
        assert outcome.error is None, outcome.error
        return outcome.base_offset, outcome.stored is not None

    def spans_in_log() -> int:
        return sum(
            len(r.entry.producers)
            for records in log.logs.values()
            for r in records
            if isinstance(r.entry, Placeholder)
        )

    async with running_node(config, log, objects) as node:
        await node.create_topic(TOPIC, 1)
        intake = ProduceIntake(node)
        async with anyio.create_task_group() as tg:
            await tg.start(intake.run)
            for sequence in range(3):
                assert await send(intake, sequence) == (sequence, False)
            for i in range(6):  # plain records: snapshots and truncation go on
                await intake.produce(TOPIC, 0, [Record(None, b"plain %d" % i)])
                await anyio.sleep(0.2)
            await wait_until(lambda: spans_in_log() == 0, "the producer's placeholders truncated")
            tg.cancel_scope.cancel()

    async with running_node(config, log, objects) as node:
        intake = ProduceIntake(node)
        async with anyio.create_task_group() as tg:
            await tg.start(intake.run)
            assert await send(intake, 2) == (2, True)  # stored by the previous run: its offset
            assert await send(intake, 3) == (9, False)  # follows it
            tg.cancel_scope.cancel()
        fetched = await node.fetch(TOPIC, 0, 0, 1 << 20)
        values = [r.value for r in fetched.records]
        assert values == [b"0", b"1", b"2", *(b"plain %d" % i for i in range(6)), b"3"]


async def test_idempotency_keys_batches_expire_after_the_retention(tmp_path: Path) -> None:
    """A keyed produce's stored batch is forgotten once older than `key_retention_s` (the
    first expiry pass runs as the intake starts); a younger key's stays."""
    retention_s = 3_600.0
    async with (
        await SqliteLogStore.open(str(tmp_path / "levelzero.db")) as store,
        running_node(node_config(), store, MemoryObjectStore()) as node,
    ):
        await node.create_topic(TOPIC, 1)
        intake = ProduceIntake(node, key_retention_s=retention_s)
        old, young = idempotency_producer_id("old-key"), idempotency_producer_id("young-key")
        now = time.time()
        await store.record_producer_batches(
            [
                ProducerBatchRow(old, 0, TOPIC, 0, 0, 1, 0, now - retention_s - 60),
                ProducerBatchRow(young, 0, TOPIC, 0, 0, 1, 1, now - retention_s + 60),
            ],
            keep=1,
        )
        async with anyio.create_task_group() as tg:
            await tg.start(intake.run)
            assert await store.producer_batches(old) == []
            assert [r.base_offset for r in await store.producer_batches(young)] == [1]
            base_offset, count, duplicate = await intake.produce_once(TOPIC, 0, [Record(None, b"v")], "k")
            keyed = idempotency_producer_id("k")
            assert [r.base_offset for r in await store.producer_batches(keyed)] == [base_offset]
            await intake.expire_keys(time.time() + retention_s + 1)
            assert await store.producer_batches(keyed) == []
            assert await store.producer_batches(young) == []
            tg.cancel_scope.cancel()
        assert (count, duplicate) == (1, False)


async def test_a_kafka_batch_is_answered_before_its_sequence_row_a_keyed_one_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Kafka producer's batch is acknowledged once it is stored (its producer span commits
    with it): the sequence table's row follows, and its failure fails nothing. An idempotency
    key's row is its record for the retention: the produce is answered after it, and fails
    with it."""

    async def lost(rows: Any, keep: int) -> None:
        raise StorageError("simulated: the sequence table's commit failed")

    async with (
        await SqliteLogStore.open(str(tmp_path / "levelzero.db")) as store,
        running_node(node_config(), store, MemoryObjectStore()) as node,
    ):
        await node.create_topic(TOPIC, 1)
        intake = ProduceIntake(node)
        monkeypatch.setattr(store, "record_producer_batches", lost)
        async with anyio.create_task_group() as tg:
            await tg.start(intake.run)
            pending = intake.submit(TOPIC, 0, [Record(None, b"a"), Record(None, b"b")], (7, 0, TOPIC, 0, 0))
            assert isinstance(pending, Pending)
            await pending.done.wait()
            assert (pending.error, pending.base_offset) == (None, 0)
            with pytest.raises(StorageError):
                await intake.produce_once(TOPIC, 0, [Record(None, b"v")], "k")
            tg.cancel_scope.cancel()


async def test_a_kafka_producers_stored_batches_expire_at_the_producer_id_expiration(tmp_path: Path) -> None:
    """Every Kafka producer instance gets a new producer id, and up to five rows per partition
    it wrote to were kept until the topic was deleted: a daemon whose clients restart (cron
    jobs, deploys) grew them for ever. Forgotten `producer_id_expiration_s` after they were
    stored (Kafka's producer.id.expiration.ms), by the keys' pass, which keeps its own bound."""
    expiration_s = 600.0
    async with (
        await SqliteLogStore.open(str(tmp_path / "levelzero.db")) as store,
        running_node(node_config(), store, MemoryObjectStore()) as node,
    ):
        await node.create_topic(TOPIC, 1)
        intake = ProduceIntake(node, key_retention_s=3_600.0, producer_id_expiration_s=expiration_s)
        key = idempotency_producer_id("a-key")
        now = time.time()
        await store.record_producer_batches(
            [
                ProducerBatchRow(7, 0, TOPIC, 0, 0, 1, 0, now - expiration_s - 60),  # a gone producer's
                ProducerBatchRow(8, 0, TOPIC, 0, 0, 1, 1, now - expiration_s + 60),
                ProducerBatchRow(key, 0, TOPIC, 0, 0, 1, 2, now - expiration_s - 60),  # a key: 1 h
            ],
            keep=5,
        )
        await intake.expire_keys(now)
        assert await store.producer_batches(7) == []
        assert [r.base_offset for r in await store.producer_batches(8)] == [1]
        assert [r.base_offset for r in await store.producer_batches(key)] == [2]


async def test_without_a_retention_idempotency_keys_are_kept(tmp_path: Path) -> None:
    async with (
        await SqliteLogStore.open(str(tmp_path / "levelzero.db")) as store,
        running_node(node_config(), store, MemoryObjectStore()) as node,
    ):
        intake = ProduceIntake(node, key_retention_s=None)
        key = idempotency_producer_id("old-key")
        await store.record_producer_batches([ProducerBatchRow(key, 0, TOPIC, 0, 0, 1, 0, 1.0)], keep=1)
        await intake.expire_keys(time.time())
        assert [r.base_offset for r in await store.producer_batches(key)] == [0]


async def test_a_record_set_is_not_stored_behind_one_it_must_follow_that_failed() -> None:
    """`after`: a record set (a transaction's records) is refused with the error of the one
    ahead of it that it must follow (the previous transaction's marker), whether that one
    failed in an earlier round or in the same one."""
    async with running_node(node_config(), MemoryLogStore(), MemoryObjectStore()) as node:
        await node.create_topic(TOPIC, 1)
        intake = ProduceIntake(node)
        async with anyio.create_task_group() as tg:
            await tg.start(intake.run)
            stored = intake.submit(TOPIC, 0, [Record(None, b"a")], (7, 0, TOPIC, 0, 0))
            assert isinstance(stored, Pending)
            await stored.done.wait()
            # Out of sequence (the producer's next is 1): refused by the lane, in the round that
            # also takes the record set behind it.
            ahead = intake.submit(TOPIC, 0, [Record(None, b"b")], (7, 0, TOPIC, 0, 5))
            behind = intake.submit(TOPIC, 0, [Record(None, b"c")], None, after=ahead)
            assert isinstance(ahead, Pending) and isinstance(behind, Pending)
            await behind.done.wait()
            assert isinstance(ahead.error, OutOfOrderSequence)
            assert behind.error is ahead.error
            # Failed in an earlier round: refused too.
            later = intake.submit(TOPIC, 0, [Record(None, b"d")], None, after=ahead)
            assert isinstance(later, Pending)
            await later.done.wait()
            assert later.error is ahead.error
            tg.cancel_scope.cancel()
        assert intake.offsets(TOPIC, 0) == (0, 1)  # only "a"


async def test_a_gathering_record_set_waits_for_the_next_and_shares_its_round() -> None:
    """`gather_s`: a record set alone in its lane waits for another to share its round (a
    transaction's marker, for the next transaction's records) rather than being stored alone."""
    async with running_node(node_config(), MemoryLogStore(), MemoryObjectStore()) as node:
        await node.create_topic(TOPIC, 1)
        intake = ProduceIntake(node)
        rounds: list[int] = []
        produce = node.produce

        async def counted(topic: str, partition: int, records: list[Record], *args: Any) -> Any:
            rounds.append(len(records))
            return await produce(topic, partition, records, *args)

        node.produce = counted  # type: ignore[method-assign]
        async with anyio.create_task_group() as tg:
            await tg.start(intake.run)
            marker = intake.submit(TOPIC, 0, [Record(None, b"m")], None, gather_s=WAIT_FOREVER_S)
            assert isinstance(marker, Pending)
            await wait_until(lambda: (TOPIC, 0) in intake._lane_grew, "the lane waits for more")
            assert not marker.done.is_set() and rounds == []
            data = intake.submit(TOPIC, 0, [Record(None, b"d1"), Record(None, b"d2")], None)
            assert isinstance(data, Pending)
            await data.done.wait()
            assert (marker.error, data.error) == (None, None)
            assert (marker.base_offset, data.base_offset) == (0, 1)
            assert rounds == [3]  # one write for both
            tg.cancel_scope.cancel()


async def test_a_record_set_with_a_linger_cuts_the_batch_window_for_its_round() -> None:
    """`linger_s` (a transaction's marker: its producer's next transaction waits on the round):
    the batch window that takes the round is cut then, not at the batcher's `linger_ms`; what
    the window already held goes in the same object."""
    config = NodeConfig(
        epoch_bump_interval_s=None,
        batcher=BatcherConfig(linger_ms=WAIT_FOREVER_S * 1000),
        reconciler=ReconcilerConfig(enabled=False),
        housekeeper=HousekeeperConfig(enabled=False),
    )
    async with running_node(config, MemoryLogStore(), MemoryObjectStore()) as node:
        await node.create_topic(TOPIC, 2)
        intake = ProduceIntake(node)
        async with anyio.create_task_group() as tg:
            await tg.start(intake.run)
            plain = intake.submit(TOPIC, 1, [Record(None, b"p")], None)
            assert isinstance(plain, Pending)
            await anyio.wait_all_tasks_blocked()  # in the window, which lingers
            assert not plain.done.is_set() and node.batcher.stats.objects_uploaded == 0
            marker = intake.submit(TOPIC, 0, [Record(None, b"m")], None, linger_s=0.0)
            data = intake.submit(TOPIC, 0, [Record(None, b"d")], None)
            assert isinstance(marker, Pending) and isinstance(data, Pending)
            await anyio.wait_all_tasks_blocked()
            assert marker.done.is_set() and data.done.is_set() and plain.done.is_set()
            assert (marker.error, data.error, plain.error) == (None, None, None)
            assert (marker.base_offset, data.base_offset, plain.base_offset) == (0, 1, 0)
            assert node.batcher.stats.objects_uploaded == 1  # the plain record went with them
            later = intake.submit(TOPIC, 1, [Record(None, b"q")], None)
            assert isinstance(later, Pending)
            await anyio.wait_all_tasks_blocked()
            assert not later.done.is_set()  # the next window lingers again
            tg.cancel_scope.cancel()


async def _keyed(intake: ProduceIntake, values: list[bytes], key: str = "k") -> tuple[int, int, bool]:
    return await intake.produce_once(TOPIC, 0, [Record(None, v) for v in values], key)


async def test_an_idempotency_key_repeated_with_other_records_is_refused_and_stores_nothing(
    tmp_path: Path,
) -> None:
    """The same key and records: a repeat (the first offsets, nothing stored). The same key and
    other records (another value, another count, a key, a header, a timestamp): refused, in
    memory and, after a restart, from the store's sequence table; nothing stored."""
    objects = MemoryObjectStore()
    async with await SqliteLogStore.open(str(tmp_path / "levelzero.db")) as store:
        async with running_node(node_config(), store, objects) as node:
            await node.create_topic(TOPIC, 1)
            intake = ProduceIntake(node)
            async with anyio.create_task_group() as tg:
                await tg.start(intake.run)
                assert await _keyed(intake, [b"a", b"b"]) == (0, 2, False)
                assert await _keyed(intake, [b"a", b"b"]) == (0, 2, True)
                for other in (
                    [Record(None, b"a"), Record(None, b"X")],
                    [Record(None, b"a")],
                    [Record(b"key", b"a"), Record(None, b"b")],
                    [Record(None, b"a", headers=(("h", b"1"),)), Record(None, b"b")],
                    [Record(None, b"a", timestamp_ms=5), Record(None, b"b")],
                ):
                    with pytest.raises(IdempotencyKeyReused) as refused:
                        await intake.produce_once(TOPIC, 0, other, "k")
                    assert refused.value.first == (0, 2)  # where the key's records are
                assert await _keyed(intake, [b"c"], key="k2") == (2, 1, False)  # another key
                assert intake.offsets(TOPIC, 0) == (0, 3)
                tg.cancel_scope.cancel()
        async with running_node(node_config(), store, objects) as node:  # a restart
            intake = ProduceIntake(node)
            async with anyio.create_task_group() as tg:
                await tg.start(intake.run)
                with pytest.raises(IdempotencyKeyReused) as refused:
                    await _keyed(intake, [b"a", b"X"])
                assert refused.value.first == (0, 2)
                assert await _keyed(intake, [b"a", b"b"]) == (0, 2, True)
                assert intake.offsets(TOPIC, 0) == (0, 3)
                tg.cancel_scope.cancel()


async def test_a_reused_key_is_refused_from_the_partitions_own_state_and_within_one_round() -> None:
    """Without a sequence table (the memory store) a new intake knows the key only from the
    partition's placeholders: the lane refuses it. Two requests of one key with other records
    queued together: one is stored, the other refused."""
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(node_config(), log_store, objects) as node:
        await node.create_topic(TOPIC, 1)
        first = ProduceIntake(node)
        async with anyio.create_task_group() as tg:
            await tg.start(first.run)
            assert await _keyed(first, [b"a"]) == (0, 1, False)
            tg.cancel_scope.cancel()
        intake = ProduceIntake(node)  # as after a crash: nothing in its memory
        outcomes: dict[bytes, object] = {}

        async def produce(value: bytes) -> None:
            try:
                outcomes[value] = await _keyed(intake, [value], key="together")
            except IdempotencyKeyReused as exc:
                outcomes[value] = exc

        async with anyio.create_task_group() as tg:
            await tg.start(intake.run)
            with pytest.raises(IdempotencyKeyReused) as refused:
                await _keyed(intake, [b"other"])
            assert refused.value.first == (0, 1)
            assert await _keyed(intake, [b"a"]) == (0, 1, True)
            async with anyio.create_task_group() as both:
                both.start_soon(produce, b"x")
                both.start_soon(produce, b"y")
            tg.cancel_scope.cancel()
        refused = [v for v, outcome in outcomes.items() if isinstance(outcome, IdempotencyKeyReused)]
        assert len(refused) == 1 and sorted(outcomes) == [b"x", b"y"]
        # the first of the two was not stored when the second was refused: no offsets known
        assert isinstance(outcomes[refused[0]], IdempotencyKeyReused) and outcomes[refused[0]].first is None
        stored = [v for v in outcomes if v not in refused]
        assert outcomes[stored[0]] == (1, 1, False)
        assert intake.offsets(TOPIC, 0) == (0, 2)


async def test_a_key_stored_before_its_records_digest_was_kept_is_compared_by_record_count(
    tmp_path: Path,
) -> None:
    """Rows of keys stored by an earlier release (producer epoch 0, no digest) are answered as
    repeats when the retry holds as many records, whatever they are, as that release did; with
    another number of records it is refused, where that release dropped it silently."""
    async with (
        await SqliteLogStore.open(str(tmp_path / "levelzero.db")) as store,
        running_node(node_config(), store, MemoryObjectStore()) as node,
    ):
        await node.create_topic(TOPIC, 1)
        intake = ProduceIntake(node)
        key = idempotency_producer_id("legacy")
        await store.record_producer_batches(
            [ProducerBatchRow(key, 0, TOPIC, 0, 0, 3, 40, time.time())], keep=1
        )
        async with anyio.create_task_group() as tg:
            await tg.start(intake.run)
            assert await _keyed(intake, [b"x", b"y", b"z"], key="legacy") == (40, 3, True)
            with pytest.raises(IdempotencyKeyReused) as refused:
                await _keyed(intake, [b"anything"], key="legacy")
            assert refused.value.first == (40, 3)
            tg.cancel_scope.cancel()
        assert intake.offsets(TOPIC, 0) == (0, 0)


async def test_a_key_stored_at_epoch_0_in_the_partitions_state_is_compared_by_record_count() -> None:
    """After a crash (nothing in memory, no sequence table) a key the partition's placeholders
    hold at epoch 0 (stored before the digest was kept) is a repeat with as many records and
    refused with another number: the lane answers it stored, produce_once compares counts."""
    async with running_node(node_config(), MemoryLogStore(), MemoryObjectStore()) as node:
        await node.create_topic(TOPIC, 1)
        first = ProduceIntake(node)
        async with anyio.create_task_group() as tg:
            await tg.start(first.run)
            identity = (idempotency_producer_id("legacy"), 0, TOPIC, 0, 0)
            pending = first.submit(TOPIC, 0, [Record(None, b"a"), Record(None, b"b")], identity)
            assert isinstance(pending, Pending)
            await pending.done.wait()
            assert (pending.error, pending.base_offset) == (None, 0)
            tg.cancel_scope.cancel()
        intake = ProduceIntake(node)
        async with anyio.create_task_group() as tg:
            await tg.start(intake.run)
            with pytest.raises(IdempotencyKeyReused) as refused:
                await _keyed(intake, [b"a"], key="legacy")
            assert refused.value.first == (0, 2)
            assert await _keyed(intake, [b"p", b"q"], key="legacy") == (0, 2, True)
            tg.cancel_scope.cancel()
        assert intake.offsets(TOPIC, 0) == (0, 2)


async def test_a_repeat_sharing_the_digest_by_chance_with_another_record_count_is_refused() -> None:
    """Two requests whose 15-bit digests happen to be equal are the same producer epoch: told
    apart by their record counts, the second is refused, not answered as a repeat."""
    three = [Record(None, b"a"), Record(None, b"b"), Record(None, b"c")]
    two = [Record(None, b"a"), Record(None, b"23861")]
    assert request_epoch(two) == request_epoch(three)  # found by search: a chance collision
    async with running_node(node_config(), MemoryLogStore(), MemoryObjectStore()) as node:
        await node.create_topic(TOPIC, 1)
        intake = ProduceIntake(node)
        async with anyio.create_task_group() as tg:
            await tg.start(intake.run)
            assert await intake.produce_once(TOPIC, 0, three, "k") == (0, 3, False)
            with pytest.raises(IdempotencyKeyReused) as refused:
                await intake.produce_once(TOPIC, 0, two, "k")
            assert refused.value.first == (0, 3)
            assert await intake.produce_once(TOPIC, 0, three, "k") == (0, 3, True)
            tg.cancel_scope.cancel()
        assert intake.offsets(TOPIC, 0) == (0, 3)


async def test_a_kafka_producers_new_epoch_starting_over_at_sequence_0_is_stored_not_a_repeat() -> None:
    """Producer epoch 0 is also a Kafka producer's first: its next epoch's batch at sequence 0
    is new (only an idempotency key stored at epoch 0 repeats by key alone)."""
    async with running_node(node_config(), MemoryLogStore(), MemoryObjectStore()) as node:
        await node.create_topic(TOPIC, 1)
        intake = ProduceIntake(node)
        async with anyio.create_task_group() as tg:
            await tg.start(intake.run)
            for epoch, value, offset in ((0, b"a", 0), (1, b"b", 1)):
                pending = intake.submit(TOPIC, 0, [Record(None, value)], (7, epoch, TOPIC, 0, 0))
                assert isinstance(pending, Pending)
                await pending.done.wait()
                assert (pending.error, pending.stored, pending.base_offset) == (None, None, offset)
            tg.cancel_scope.cancel()
        assert intake.offsets(TOPIC, 0) == (0, 2)
