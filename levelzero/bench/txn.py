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
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from pathlib import Path

import anyio

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


def make_records(count: int, seed: int) -> list[tuple[bytes, bytes]]:
    rng = random.Random(seed)
    return [(rng.randbytes(KEY_BYTES), rng.randbytes(VALUE_BYTES)) for _ in range(count)]


def _producer(port: int, **extra: object):  # noqa: ANN202 - confluent_kafka imported lazily
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": f"127.0.0.1:{port}", "linger.ms": 5, **extra})


def side_rate(side: str, port: int, topic: str, count: int, seed: int) -> float:
    """records/s of PRODUCERS producers of `side` writing `count` records in all."""
    share = count // PRODUCERS
    records = [make_records(share, seed * 100 + k) for k in range(PRODUCERS)]
    producers = []
    for k in range(PRODUCERS):
        if side == "txn":
            p = _producer(port, **{"transactional.id": f"{topic}-{k}"})
            p.init_transactions(30)
        else:
            p = _producer(port, **{"enable.idempotence": True, "queue.buffering.max.messages": share + 1})
        producers.append(p)
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


async def in_child(*args: str) -> float:
    result = await anyio.run_process([sys.executable, "-m", "levelzero.bench.txn", *args])
    return float(json.loads(result.stdout.decode().strip().splitlines()[-1])["rate"])


async def run(settings: Settings) -> list[Figure]:
    count = settings.pick(40_000, 2_000)
    with work_dir(settings, ITEM) as tmp:
        async with kafka_bench_daemon(Path(tmp) / "data") as (daemon, client):
            assert daemon.kafka_port is not None and daemon.node is not None
            port, node = str(daemon.kafka_port), daemon.node

            async def side(name: str, i: int) -> float:
                await wait_reconciled(node)
                topic = f"{name}-{i}"
                await client.create_topic(topic, PRODUCERS)
                return await in_child(name, port, topic, str(count), str(i))

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
    """`python -m levelzero.bench.txn txn|idempotent PORT TOPIC COUNT SEED`: prints {"rate": r}."""
    side, port, topic, count, seed = argv
    print(json.dumps({"rate": side_rate(side, int(port), topic, int(count), int(seed))}))


if __name__ == "__main__":
    child_main(sys.argv[1:])
