"""Item 16: transactional produce (Kafka transactions of TXN_RECORDS records) vs idempotent
produce, records/s through the Kafka listener, on the same daemon in the same run.

One daemon (local object store, `batcher.linger_ms` 5, as item 9) serves both sides; each round
writes RECORDS records (16-byte keys, 100-byte values) into a fresh topic of PRODUCERS partitions
per side, from PRODUCERS confluent-kafka producers (threads of one child process), each writing
its own partition (as stream tasks do):
- sut (transactions): each producer has its own transactional.id; begin, TXN_RECORDS records,
                      commit, again (every transaction: AddPartitionsToTxn, answered once the
                      previous transaction's marker is queued, its commit on its way; the
                      records, submitted once that commit is durable, written with that
                      marker; EndTxn, answered once its prepared state is durable, with the
                      previous transaction's completion in the same commit);
- floor (idempotent): each producer (enable.idempotence) produces the same records, then flushes.
Both sides' producers differ only in what makes them transactional or idempotent: linger.ms 5,
librdkafka's default batch size, acks=all (implied by both); the idempotent side's queue is
sized to hold its share. Records are generated before the clock starts; wall clock from the
first produce to the last commit (or flush). Target: transactions at least 70% of idempotent
produce's records/s.

Before the clock both sides' producers are ready to send (`ready`): a producer id each (the
transactional side's InitProducerId; the idempotent side's, which librdkafka requests on its
own and retries on a 500 ms timer when no broker connection is up yet, taken by one record each
in a warm-up topic, flushed), and the round's topic's metadata. Without that the idempotent
round's clock held librdkafka's start: 0, 0.5 or 1 s of a round that takes 0.2-0.3 s, and the
ratio swung with it. The parent starts the clock once the warm-up records are reconciled.
"""

from __future__ import annotations

import contextlib
import functools
import json
import random
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from anyio.streams.buffered import BufferedByteReceiveStream

from .common import (
    Figure,
    Settings,
    Target,
    figure,
    interleave,
    kafka_bench_daemon,
    wait_reconciled,
    work_dir,
)

ITEM = "txn"
PRODUCERS = 4
TXN_RECORDS = 100
KEY_BYTES = 16
VALUE_BYTES = 100
TARGET = Target(0.7)
WARM_TOPIC = "warm"  # the idempotent side's warm-up records (one a producer a round)
CHILD_TIMEOUT_S = 300.0


def make_records(count: int, seed: int) -> list[tuple[bytes, bytes]]:
    rng = random.Random(seed)
    return [(rng.randbytes(KEY_BYTES), rng.randbytes(VALUE_BYTES)) for _ in range(count)]


def _producer(port: int, **extra: object):  # noqa: ANN202 - confluent_kafka imported lazily
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": f"127.0.0.1:{port}", "linger.ms": 5, **extra})


def ready(side: str, port: int, topic: str, warm_topic: str, share: int) -> list[Any]:
    """PRODUCERS producers of `side`, each with its producer id and `topic`'s metadata."""
    producers = []
    for k in range(PRODUCERS):
        if side == "txn":
            p = _producer(port, **{"transactional.id": f"{topic}-{k}"})
            p.init_transactions(30)
        else:
            p = _producer(port, **{"enable.idempotence": True, "queue.buffering.max.messages": share + 1})
            p.produce(warm_topic, value=b"warm", partition=k)
        producers.append(p)
    for p in producers:
        left = p.flush(60)  # the idempotent side's warm-up record: sent with its producer id
        assert left == 0, f"{left} warm-up records not delivered"
        p.list_topics(topic, timeout=30)
    return producers


def side_rate(producers: list[Any], side: str, topic: str, count: int, seed: int) -> float:
    """records/s of `producers` (PRODUCERS of `side`) writing `count` records in all."""
    share = count // PRODUCERS
    records = [make_records(share, seed * 100 + k) for k in range(PRODUCERS)]
    errors: list[str] = []

    def work(k: int) -> None:
        p = producers[k]
        try:
            if side == "txn":
                for start in range(0, share, TXN_RECORDS):
                    p.begin_transaction()
                    for key, value in records[k][start : start + TXN_RECORDS]:
                        p.produce(topic, key=key, value=value, partition=k)
                    p.commit_transaction(60)
            else:
                for key, value in records[k]:
                    p.produce(topic, key=key, value=value, partition=k)
                    p.poll(0)
                left = p.flush(120)
                assert left == 0, f"{left} records not delivered"
        except Exception as exc:  # noqa: BLE001 - reported by the parent
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(PRODUCERS)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    assert not errors, errors
    return share * PRODUCERS / elapsed


async def in_child(settle: Callable[[], Awaitable[None]], *args: str) -> float:
    """The child's rate: it says when its producers are ready, and starts once `settle` has
    returned."""
    command = [sys.executable, "-m", "levelzero.bench.txn", *args]
    with anyio.fail_after(CHILD_TIMEOUT_S):
        async with await anyio.open_process(command, stderr=None) as process:
            assert process.stdin is not None and process.stdout is not None
            lines = BufferedByteReceiveStream(process.stdout)
            said = await lines.receive_until(b"\n", 1 << 20)
            assert json.loads(said) == {"ready": True}, said
            await settle()
            await process.stdin.send(b"go\n")
            out = bytearray()
            with contextlib.suppress(anyio.EndOfStream):
                while True:
                    out += await lines.receive()
            code = await process.wait()
    assert code == 0, f"{command} exited with {code}"
    return float(json.loads(out.decode().strip().splitlines()[-1])["rate"])


async def run(settings: Settings) -> list[Figure]:
    count = settings.pick(40_000, 2_000)
    with work_dir(settings, ITEM) as tmp:
        async with kafka_bench_daemon(Path(tmp) / "data") as (daemon, client):
            assert daemon.kafka_port is not None and daemon.node is not None
            port, node = str(daemon.kafka_port), daemon.node

            await client.create_topic(WARM_TOPIC, PRODUCERS)
            settle = functools.partial(wait_reconciled, node)

            async def side(name: str, i: int) -> float:
                await wait_reconciled(node)
                topic = f"{name}-{i}"
                await client.create_topic(topic, PRODUCERS)
                return await in_child(settle, name, port, topic, str(count), str(i))

            async def txn_round(i: int) -> float:
                return await side("txn", i)

            async def idempotent_round(i: int) -> float:
                return await side("idempotent", i)

            pairs = await interleave(settings.rounds, txn_round, idempotent_round)
    return [
        figure(
            ITEM,
            f"transactional produce (transactions of {TXN_RECORDS}) vs idempotent produce",
            "records/s",
            pairs,
            target=TARGET,
            sut_label="txn",
            floor_label="idempotent",
            notes={
                "records_per_round": count,
                "producers": PRODUCERS,
                "records_per_transaction": TXN_RECORDS,
                "key_bytes": KEY_BYTES,
                "value_bytes": VALUE_BYTES,
                "clients": "threads of one child process a side",
            },
        )
    ]


def child_main(argv: list[str]) -> None:
    """`python -m levelzero.bench.txn txn|idempotent PORT TOPIC COUNT SEED`: prints {"ready":
    true} once its producers are ready, waits for a line on stdin, then prints {"rate": r}."""
    side, port, topic, count, seed = argv
    producers = ready(side, int(port), topic, WARM_TOPIC, int(count) // PRODUCERS)
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()
    print(json.dumps({"rate": side_rate(producers, side, topic, int(count), int(seed))}))


if __name__ == "__main__":
    child_main(sys.argv[1:])
