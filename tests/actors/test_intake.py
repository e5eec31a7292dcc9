"""The produce intake both front ends share (actors/intake.py), on a node over memory stores:
fetchers are woken by every produce through it, whichever door it came from; an idempotent
batch is stored once; a record set is refused as the batcher would refuse it."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from levelzero.actors.batcher import BatcherConfig
from levelzero.actors.housekeeper import HousekeeperConfig
from levelzero.actors.intake import Pending, ProduceIntake, idempotency_producer_id
from levelzero.actors.node import NodeConfig
from levelzero.actors.reconciler import ReconcilerConfig
from levelzero.core.errors import InvalidInput, TooLarge, UnknownTopic
from levelzero.core.l0format import Record
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.protocols import ProducerBatchRow
from levelzero.storage.sqlite.store import SqliteLogStore
from levelzero.testing.nodes import running_node, wait_until

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
