"""Item 9: produce and fetch throughput through the Kafka listener (confluent-kafka, librdkafka)
beside the HTTP API, on the same node in the same run.

One daemon (local object store, the daemon's defaults but `batcher.linger_ms` = 5, as the test
helpers use, and an L1 object every reconciler pass) serves both; a round starts once the data
of the rounds before it is reconciled, so no side pays for another's copy. Each round writes
RECORDS records (16-byte keys, 100-byte values, PARTITIONS partitions) into a fresh topic per side:
- sut (Kafka):   one confluent-kafka Producer (linger.ms 5, default batch sizes), produce all, flush;
                 then one Consumer assigned every partition from offset 0 reads them all back;
- floor (HTTP):  the bundled client, HTTP_CALLERS concurrent requests of HTTP_RECORDS_PER_REQUEST
                 records (16 in flight: with 4, the HTTP side waited on its round trips, a durable
                 write each, whose time moves with the machine's disk and CPU: its rate swung
                 65-248k records/s within one run, and the ratio 99-220%); then one
                 fetch loop per partition (max_bytes 1 MiB) reads them back.
Each client runs in a child process of its own (`python -m levelzero.bench.kafka SIDE PHASE ...`,
one for the produce, one for the fetch), so neither takes the daemon's interpreter from it; the
records are generated there from the same seed, before the clock starts. Wall clock, records/s,
rounds alternating. Targets: the Kafka listener at least the HTTP API's records/s on produce
(>= 100%), one and a half times it on fetch (>= 150%). A third row, information: the daemon's
CPU seconds per produced record on each side (the daemon runs in this process; the clients do
not), which the clients' share of a busy machine does not move: the wall-clock rates are set by
the clients and the durable writes as much as by the listener (the daemon used 0.1-0.3 CPU-s
per second on either side in the rounds of issue 38).
"""

from __future__ import annotations

import json
import os
import random
import sys
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

ITEM = "kafka"
PARTITIONS = 6
KEY_BYTES = 16
VALUE_BYTES = 100
HTTP_CALLERS = 16
HTTP_RECORDS_PER_REQUEST = 5_000
FETCH_BYTES = 1024 * 1024
TARGET = Target(1.0)
# Fetch: the Kafka door encodes each extent's run of records into one batch straight from the
# stored records, where the HTTP door builds an object and a JSON record per record.
FETCH_TARGET = Target(1.5)
CONSUME_POLLS_MAX = 100_000
# `poll(0)` after every `produce()` was a second call per record in the client's Python loop,
# a third of its enqueue time, on the Kafka side only (the HTTP client makes no call per record).
POLL_EVERY = 1_000


# Where a Kafka round's produce time went (printed with the rates, kept in the notes).
PHASES: dict[str, float] = {}


def make_records(count: int, seed: int) -> list[tuple[int, bytes, bytes]]:
    rng = random.Random(seed)
    return [(i % PARTITIONS, rng.randbytes(KEY_BYTES), rng.randbytes(VALUE_BYTES)) for i in range(count)]


def kafka_produce(port: int, topic: str, records: list[tuple[int, bytes, bytes]]) -> float:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "linger.ms": 5,
            "queue.buffering.max.messages": len(records) + 1,
        }
    )
    started = time.perf_counter()
    for n, (partition, key, value) in enumerate(records):
        producer.produce(topic, key=key, value=value, partition=partition)
        if n % POLL_EVERY == 0:
            producer.poll(0)  # serves delivery reports (none asked for): now and then is enough
    enqueued = time.perf_counter()
    left = producer.flush(120)
    elapsed = time.perf_counter() - started
    assert left == 0, f"{left} records not delivered"
    PHASES["enqueue_s"] = enqueued - started
    PHASES["flush_s"] = elapsed - (enqueued - started)
    return len(records) / elapsed


def kafka_fetch(port: int, topic: str, count: int) -> float:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": f"bench-{topic}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
    )
    try:
        started = time.perf_counter()
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        seen = 0
        for _ in range(CONSUME_POLLS_MAX):
            for message in consumer.consume(10_000, 1.0):
                assert message.error() is None, message.error()
                seen += 1
            if seen >= count:
                break
        elapsed = time.perf_counter() - started
    finally:
        consumer.close()
    assert seen == count, f"read {seen} of {count}"
    return count / elapsed


async def http_produce(
    client,  # noqa: ANN001 - a daemon Client (lazy import)
    topic: str,
    records: list[tuple[int, bytes, bytes]],
) -> float:
    by_partition: dict[int, list[tuple[bytes, bytes]]] = {}
    for partition, key, value in records:
        by_partition.setdefault(partition, []).append((key, value))
    requests = [
        (partition, rows[i : i + HTTP_RECORDS_PER_REQUEST])
        for partition, rows in by_partition.items()
        for i in range(0, len(rows), HTTP_RECORDS_PER_REQUEST)
    ]
    limiter = anyio.Semaphore(HTTP_CALLERS)

    async def send(partition: int, rows: list[tuple[bytes, bytes]]) -> None:
        async with limiter:
            await client.produce(topic, partition, rows)

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for partition, rows in requests:
            tg.start_soon(send, partition, rows)
    return len(records) / (time.perf_counter() - started)


async def http_fetch(client, topic: str, count: int) -> float:  # noqa: ANN001 - as http_produce
    seen = 0

    async def read(partition: int) -> None:
        nonlocal seen
        offset = 0
        while True:
            result = await client.fetch(topic, partition, offset=offset, max_bytes=FETCH_BYTES)
            if not result.records:
                return
            seen += len(result.records)
            offset = result.next_offset
            if offset >= result.high_watermark:
                return

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for partition in range(PARTITIONS):
            tg.start_soon(read, partition)
    elapsed = time.perf_counter() - started
    assert seen == count, f"read {seen} of {count}"
    return count / elapsed


async def in_child(*args: str) -> dict[str, float]:
    """What a client in a child process measured: {"produce" or "fetch": records/s, phases}."""
    result = await anyio.run_process([sys.executable, "-m", "levelzero.bench.kafka", *args])
    answer: dict[str, float] = json.loads(result.stdout.decode().strip().splitlines()[-1])
    return answer


async def run(settings: Settings) -> list[Figure]:
    count = settings.pick(300_000, 6_000)  # a round of ~1 s a side: shorter ones scattered 66-173%
    with work_dir(settings, ITEM) as tmp:
        # An L1 object every pass: each round starts once the last one's data is reconciled
        # (see `observed`), not 30 s later.
        async with kafka_bench_daemon(Path(tmp) / "data") as (daemon, client):
            assert daemon.kafka_port is not None and daemon.url is not None and daemon.node is not None
            port, url, node = str(daemon.kafka_port), daemon.url, daemon.node
            background: dict[str, list[dict[str, float]]] = {"kafka": [], "http": []}
            # The daemon's CPU seconds per produced record, per round: (kafka, http).
            produce_cpu: dict[str, list[float]] = {"kafka": [], "http": []}

            async def observed(side: str, where: str, topic: str, seed: str) -> tuple[float, float]:
                """A side's round, with what ran beside it in the daemon: the reconciler's work
                (its L1 objects come in bursts), the daemon's CPU and the machine's load."""
                # The previous round's data reconciled first: otherwise its copy runs inside
                # this round, on the CPUs this side's client and the daemon share, and which
                # side pays for it depends on the order (it swung the produce figure 67-226%).
                await wait_reconciled(node)
                reconciled = node.reconciler.stats.records_reconciled
                cpu, wall = time.process_time(), time.perf_counter()
                answer = await in_child(side, "produce", where, topic, str(count), seed)
                # The daemon runs in this process (its threads too); the client does not.
                produce_cpu[side].append((time.process_time() - cpu) / count)
                answer |= await in_child(side, "fetch", where, topic, str(count), seed)
                produced, fetched = answer.pop("produce"), answer.pop("fetch")
                phases = answer
                background[side].append(
                    {
                        "records_reconciled": node.reconciler.stats.records_reconciled - reconciled,
                        "daemon_cpu_per_wall": round(
                            (time.process_time() - cpu) / (time.perf_counter() - wall), 2
                        ),
                        "load_1m": os.getloadavg()[0],
                        **{k: round(v, 3) for k, v in phases.items()},
                    }
                )
                return produced, fetched

            async def kafka_round(i: int) -> tuple[float, float]:
                await client.create_topic(f"kafka-{i}", PARTITIONS)
                return await observed("kafka", port, f"kafka-{i}", str(i))

            async def http_round(i: int) -> tuple[float, float]:
                await client.create_topic(f"http-{i}", PARTITIONS)
                return await observed("http", url, f"http-{i}", str(i))

            pairs = await interleave(settings.rounds, kafka_round, http_round)
    produce_pairs = [(k[0], h[0]) for k, h in pairs]
    cpu_pairs = [(k * 1e6, h * 1e6) for k, h in zip(produce_cpu["kafka"], produce_cpu["http"], strict=True)]
    fetch_pairs = [(k[1], h[1]) for k, h in pairs]
    notes = {
        "rounds_background": background,
        "records_per_round": count,
        "partitions": PARTITIONS,
        "value_bytes": VALUE_BYTES,
        "key_bytes": KEY_BYTES,
        "http_callers": HTTP_CALLERS,
        "http_records_per_request": HTTP_RECORDS_PER_REQUEST,
        "clients": "child processes",
    }
    return [
        figure(
            ITEM,
            "produce: Kafka listener (confluent-kafka) vs HTTP API",
            "records/s",
            produce_pairs,
            target=TARGET,
            sut_label="kafka",
            floor_label="http",
            notes=notes,
        ),
        figure(
            ITEM,
            "produce: the daemon's CPU per record, Kafka listener vs HTTP API (the clients' excluded)",
            "CPU µs/record",
            cpu_pairs,
            sut_label="kafka",
            floor_label="http",
            notes={"measured": "process CPU of the daemon's process (all threads) during the produce"},
        ),
        figure(
            ITEM,
            "fetch: Kafka listener (confluent-kafka) vs HTTP API",
            "records/s",
            fetch_pairs,
            target=FETCH_TARGET,
            sut_label="kafka",
            floor_label="http",
            notes=notes,
        ),
    ]


async def _http_produce(url: str, topic: str, records: list[tuple[int, bytes, bytes]]) -> float:
    from levelzero.client import Client

    async with Client(url) as client:
        return await http_produce(client, topic, records)


async def _http_fetch(url: str, topic: str, count: int) -> float:
    from levelzero.client import Client

    async with Client(url) as client:
        return await http_fetch(client, topic, count)


def child_main(argv: list[str]) -> None:
    """`python -m levelzero.bench.kafka kafka|http produce|fetch PORT|URL TOPIC COUNT SEED`: one
    half of a side's round; prints {"produce" or "fetch": records/s, and the produce's phases}."""
    side, phase, where, topic, count_text, seed_text = argv
    count = int(count_text)
    if phase == "produce":
        records = make_records(count, seed=int(seed_text))
        if side == "kafka":
            rate = kafka_produce(int(where), topic, records)
        else:
            rate = anyio.run(_http_produce, where, topic, records)
    elif side == "kafka":
        rate = kafka_fetch(int(where), topic, count)
    else:
        rate = anyio.run(_http_fetch, where, topic, count)
    print(json.dumps({phase: rate, **PHASES}))


if __name__ == "__main__":
    child_main(sys.argv[1:])
