"""Transactional ids expire as Kafka's transactional.id.expiration.ms has them: one whose
transaction ended (or never began) that long ago is forgotten in memory and in the store, with
its producer id. A client that takes a new transactional id at every start (Quix Streams does)
made both grow for ever. An id in a transaction stays; a forgotten id starts afresh."""

from __future__ import annotations

from pathlib import Path

import anyio
import anyio.lowlevel

from kio.schema.errors import ErrorCode

from daemon_support import daemon_and_client
from levelzero.kafka.protocol import make
from levelzero.kafka.transactions import TRANSACTIONAL_ID_EXPIRATION_S, TransactionalIdExpired
from test_kafka_listener import MS, Wire, module_of


async def _init(wire: Wire, tid: str) -> tuple[int, int]:
    init = await wire.request(
        22, 4, transactional_id=tid, transaction_timeout=60_000 * MS, producer_id=-1, producer_epoch=-1
    )
    assert init.error_code == ErrorCode.none
    return init.producer_id, init.producer_epoch


async def test_an_idle_transactional_id_is_forgotten_and_one_in_a_transaction_is_not(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("t", 1)
        coordinator = daemon.kafka.handlers.transactions
        now = [1_000_000.0]
        coordinator.clock = lambda: now[0]
        wire = await Wire.connect(daemon.kafka_port)
        try:
            idle_pid, _ = await _init(wire, "idle")
            busy_pid, busy_epoch = await _init(wire, "busy")
            now[0] += TRANSACTIONAL_ID_EXPIRATION_S - 10
            m = module_of(24, 3)
            added = await wire.request(
                24,
                3,
                v3_and_below_transactional_id="busy",
                v3_and_below_producer_id=busy_pid,
                v3_and_below_producer_epoch=busy_epoch,
                v3_and_below_topics=(make(m.AddPartitionsToTxnTopic, name="t", partitions=(0,)),),
            )
            assert added.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == 0
            now[0] += 11  # "idle": 7 days and a second since its last state; "busy": 11 s in
            await coordinator.expire()
            assert sorted(coordinator._txns) == ["busy"]
            assert idle_pid not in coordinator._producers and idle_pid not in coordinator._epochs
            stored = [r.transactional_id for r in await daemon.node.log_store.transactions()]
            assert stored == ["busy"]
            # The forgotten id starts afresh: another producer id, epoch 0.
            again_pid, again_epoch = await _init(wire, "idle")
            assert again_pid != idle_pid and again_epoch == 0
        finally:
            await wire.aclose()


async def test_a_request_that_waited_on_an_id_expired_meanwhile_is_refused(tmp_path: Path) -> None:
    """The expiry holds the id's lock as it forgets it: a request that took the id before and
    waited for the lock gets a retriable refusal (COORDINATOR_NOT_AVAILABLE), and its retry
    finds the id gone, instead of storing the forgotten id again behind the coordinator's back."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        coordinator = daemon.kafka.handlers.transactions
        now = [1_000_000.0]
        coordinator.clock = lambda: now[0]
        wire = await Wire.connect(daemon.kafka_port)
        try:
            await _init(wire, "gone")
        finally:
            await wire.aclose()
        txn = coordinator._txns["gone"]
        now[0] += TRANSACTIONAL_ID_EXPIRATION_S
        outcome: list[str] = []

        async def request() -> None:  # as every request about the id takes it
            try:
                async with coordinator._locked(txn):
                    outcome.append("worked on")
            except TransactionalIdExpired:
                outcome.append("refused")

        async with anyio.create_task_group() as tg:
            await txn.lock.acquire()  # (held, so that the expiry and the request both wait)
            tg.start_soon(coordinator.expire)
            for _ in range(20):  # the expiry waits for the lock first
                await anyio.lowlevel.checkpoint()
            tg.start_soon(request)
            for _ in range(20):
                await anyio.lowlevel.checkpoint()
            assert outcome == []
            txn.lock.release()
        assert outcome == ["refused"]
        assert "gone" not in coordinator._txns and txn.expired
