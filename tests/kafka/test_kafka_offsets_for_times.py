"""ListOffsets by time with real clients (confluent-kafka's and kafka-python's
`offsets_for_times`, kcat's `-o s@TS`): the exact first offset whose timestamp is at or after
the time, over timestamps that go back and forth, in reconciled L1 objects and in L0 extents at
once; and each lookup reads at most one object range (object GETs counted at the store)."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import anyio

from daemon_support import daemon_and_client
from levelzero.daemon.service import Daemon
from levelzero.storage.counting_store import CountingObjectStore

TOPIC = "stamped"
BASE_MS = 1_700_000_000_000
EXTENTS_L1 = 3  # produced and reconciled one by one: an L1 object each
EXTENTS_L0 = 3  # produced after a restart whose reconciler waits: they stay in L0
RECORDS_PER_EXTENT = 6
KCAT = shutil.which("kcat")


def extent_timestamps(seed: int) -> list[list[int]]:
    """Timestamps in no order within an extent, and overlapping across extents (extent i's
    in a minute from 15 s * i on: later extents reach later times, but not only), so only the
    exact rule finds the first match."""
    rng = random.Random(seed)
    return [
        [BASE_MS + 15_000 * i + rng.randrange(0, 60_000) for _ in range(RECORDS_PER_EXTENT)]
        for i in range(EXTENTS_L1 + EXTENTS_L0)
    ]


def brute_force(timestamps: list[int], at_or_after: int) -> tuple[int, int]:
    for offset, stamped in enumerate(timestamps):
        if stamped >= at_or_after:
            return offset, stamped
    return -1, -1


def produce_extent(port: int, timestamps: list[int]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "linger.ms": 50})
    for stamped in timestamps:
        producer.produce(TOPIC, value=b"at %d" % stamped, partition=0, timestamp=stamped)
    assert producer.flush(30) == 0


async def wait_reconciled(daemon: Daemon, high_watermark: int) -> None:
    assert daemon.node is not None
    state = daemon.node.partition(TOPIC, 0).state
    for _ in range(600):  # the reconciler's pass is every second
        if state.high_watermark == high_watermark and state.lro == high_watermark - 1:
            return
        await anyio.sleep(0.05)
        state = daemon.node.partition(TOPIC, 0).state
    raise AssertionError(f"not reconciled: lro {state.lro}, high watermark {state.high_watermark}")


def confluent_lookup(port: int, at_or_after: int) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "times"})
    try:
        (found,) = consumer.offsets_for_times([TopicPartition(TOPIC, 0, at_or_after)], timeout=30)
        assert found.error is None, found.error
        return found.offset
    finally:
        consumer.close()


def kafka_python_lookups(port: int, probes: list[int], objects: CountingObjectStore) -> list[tuple]:
    """(probe, offset, timestamp, object GETs) per lookup (None: no record is that recent)."""
    from kafka import KafkaConsumer, TopicPartition

    tp = TopicPartition(TOPIC, 0)
    consumer = KafkaConsumer(bootstrap_servers=f"127.0.0.1:{port}", enable_auto_commit=False)
    try:
        out = []
        for probe in probes:
            before = objects.snapshot()
            found = consumer.offsets_for_times({tp: probe})[tp]
            counts = objects.snapshot() - before
            answer = (-1, -1) if found is None else (found.offset, found.timestamp)
            out.append((probe, *answer, counts.l0_gets + counts.l1_gets))
        return out
    finally:
        consumer.close()


async def test_offsets_for_times_are_exact_across_l1_and_l0_and_read_one_extent(tmp_path: Path) -> None:
    stamps = extent_timestamps(seed=33)
    timestamps = [t for extent in stamps for t in extent]
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic(TOPIC, 1)
        for i, extent in enumerate(stamps[:EXTENTS_L1]):
            await anyio.to_thread.run_sync(produce_extent, daemon.kafka_port, extent)
            await wait_reconciled(daemon, (i + 1) * RECORDS_PER_EXTENT)
    counting: list[CountingObjectStore] = []

    def wrap(inner):  # type: ignore[no-untyped-def]
        counting.append(CountingObjectStore(inner))
        return counting[-1]

    async with daemon_and_client(
        tmp_path,
        kafka__listen="127.0.0.1:0",
        wrap_object_store=wrap,
        reconciler__object_age_max_s=3600.0,
        reconciler__object_bytes_min=8 << 20,  # the default: a few hundred bytes never reach it
        # the GETs counted are the extents a lookup reads: without the readers' L0 cache, which
        # answers a second read of an L0 object from memory
        node__l0_cache_bytes_max=0,
    ) as (daemon, _):
        port = daemon.kafka_port
        for extent in stamps[EXTENTS_L1:]:
            await anyio.to_thread.run_sync(produce_extent, port, extent)
        assert daemon.node is not None
        state = daemon.node.partition(TOPIC, 0).state
        assert (state.lro, state.high_watermark) == (EXTENTS_L1 * RECORDS_PER_EXTENT - 1, len(timestamps))
        rows = await daemon.node.l1.refresh(daemon.node.partition(TOPIC, 0))
        assert [r.max_timestamp_ms for r in rows] == [max(extent) for extent in stamps[:EXTENTS_L1]]
        probes = sorted({t + d for t in timestamps for d in (0, 1)} | {BASE_MS - 1, BASE_MS + 10**9})
        looked_up = await anyio.to_thread.run_sync(kafka_python_lookups, port, probes, counting[0])
        confluent = [await anyio.to_thread.run_sync(confluent_lookup, port, p) for p in probes[::4]]
        if KCAT is not None:
            probe = sorted(timestamps)[len(timestamps) // 2] + 1
            with anyio.fail_after(60):
                done = await anyio.run_process(
                    [KCAT, "-b", f"127.0.0.1:{port}", "-C", "-t", TOPIC, "-p", "0", "-e", "-q"]
                    + ["-f", "%o %T\\n", "-o", f"s@{probe}"],
                    check=False,
                )
            assert done.returncode == 0, done.stderr.decode()
            expected = brute_force(timestamps, probe)[0]
            assert [int(line.split()[0]) for line in done.stdout.decode().splitlines()] == list(
                range(expected, len(timestamps))
            )
    # Both tiers answer: some lookups land in L1's offsets, some in L0's.
    l1_end = EXTENTS_L1 * RECORDS_PER_EXTENT
    assert {offset < l1_end for _, offset, _, _ in looked_up if offset >= 0} == {True, False}
    for probe, offset, stamped, gets in looked_up:
        assert (offset, stamped) == brute_force(timestamps, probe), probe
        assert gets == (0 if offset == -1 else 1), (probe, gets)  # the one extent holding it
    assert confluent == [brute_force(timestamps, p)[0] for p in probes[::4]]
    assert brute_force(timestamps, BASE_MS + 10**9) == (-1, -1)


def test_the_probes_need_the_exact_rule() -> None:
    """The data is non-monotonic where it matters: some time's first match comes after a record
    older than it that a lookup assuming sorted timestamps would stop at."""
    timestamps = [t for extent in extent_timestamps(seed=33) for t in extent]
    assert timestamps != sorted(timestamps)
    assert any(brute_force(timestamps, t + 1)[0] < timestamps.index(t) for t in timestamps)
