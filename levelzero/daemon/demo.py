"""`levelzero demo`: the whole write path on embedded defaults, checked end to end.

It starts a daemon in this process (SQLite + a local object directory in a fresh temp dir, HTTP
on a free loopback port) and talks to it only through the HTTP API, like any client:

1. several producers write random records to several partitions while the cluster epoch is
   advanced every ~2 s (shared L0 objects, window slides, a stale epoch cache);
2. two in-flight-old-epoch scenarios, made deterministic by holding one upload at a gate in
   front of the object store:
   a. a write whose object was uploaded under epoch N is acknowledged after N+1 has appeared
      and been admitted at the same partition: the window [N, N+1] absorbs it, no retry;
   b. a write held until the partition's window has moved on to [N+1, N+2] is rejected
      (StaleClusterEpoch), retried with a fresh epoch in a new object, and acknowledged; its
      first object is an orphan the GC will collect by epoch;
3. every partition is read back and each acknowledged record compared byte for byte.

The in-process hooks are only the upload gate and telling the node's epoch cache to refresh
(in production that happens when its TTL runs out).
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

import anyio

from levelzero.actors.node import Node
from levelzero.core.errors import CorruptData
from levelzero.core.keys import L0_ROOT
from levelzero.core.l0format import read_header
from levelzero.storage.protocols import LIST_PAGE_KEYS_MAX, DeleteResult, ListPage, ObjectInfo, ObjectStore

from .client import ApiError, Client
from .config import load_config
from .schema import ProduceResponse
from .service import running_daemon

TOPICS = (("orders", 4), ("clicks", 4))
FENCE_TOPIC = "fence-demo"
RECORDS_PER_REQUEST_MAX = 50
VALUE_BYTES_MAX = 1024
BUMP_INTERVAL_S = 2.0
PROGRESS_INTERVAL_S = 5.0
VERIFY_FETCH_BYTES = 4 * 1024 * 1024

Key = tuple[str, int]
Expected = dict[Key, dict[int, tuple[bytes | None, bytes]]]


class UploadGate:
    """An ObjectStore wrapper that holds the next L0 upload carrying partition `pid` until
    `release()`: an upload kept 'in flight' for exactly as long as the demo needs."""

    def __init__(self, inner: ObjectStore) -> None:
        self._inner = inner
        self._pid: int | None = None
        self.arrived = anyio.Event()
        self._released = anyio.Event()
        self.held_key: str | None = None

    def arm(self, pid: int) -> None:
        assert self._pid is None, "gate already armed"
        self._pid = pid
        self.arrived = anyio.Event()
        self._released = anyio.Event()
        self.held_key = None

    def release(self) -> None:
        self._released.set()

    def _catches(self, key: str, data: bytes) -> bool:
        if self._pid is None or not key.startswith(L0_ROOT):
            return False
        try:
            header = read_header(data, key)
        except CorruptData:
            return False
        return any(extent.pid == self._pid for extent in header.extents)

    async def put(self, key: str, data: bytes) -> None:
        if self._catches(key, data):
            self._pid = None  # one upload only; the retry of a rejected write goes through
            self.held_key = key
            self.arrived.set()
            await self._released.wait()
        await self._inner.put(key, data)

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        return await self._inner.get(key, offset, length)

    async def head(self, key: str) -> ObjectInfo | None:
        return await self._inner.head(key)

    async def list_page(
        self, prefix: str, start_after: str | None = None, limit: int = LIST_PAGE_KEYS_MAX
    ) -> ListPage:
        return await self._inner.list_page(prefix, start_after, limit)

    async def delete_many(self, keys: Sequence[str]) -> DeleteResult:
        return await self._inner.delete_many(keys)

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass
class ScenarioResult:
    name: str
    passed: bool
    detail: str


@dataclass
class DemoSummary:
    duration_s: float
    producers: int
    partitions: int
    data_dir: str
    produced: int = 0
    produced_bytes: int = 0
    failed_requests: int = 0
    verified: int = 0
    mismatched: int = 0
    missing: int = 0
    unacknowledged_in_log: int = 0
    epoch_first: int = 0
    epoch_last: int = 0
    window_slides: int = 0
    stale_rejections: int = 0
    stale_retries: int = 0
    objects: int = 0
    object_bytes: int = 0
    orphan_objects: int = 0
    m: int | None = None
    scenarios: list[ScenarioResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.produced > 0
            and self.verified == self.produced
            and self.mismatched == 0
            and self.missing == 0
            and all(s.passed for s in self.scenarios)
        )

    def render(self) -> str:
        mib = 1024 * 1024
        lines = [
            "",
            "levelzero demo summary",
            f"  load                      {self.duration_s:.0f} s, {self.producers} producers, "
            f"{self.partitions} partitions",
            f"  records produced (acked)  {self.produced} ({self.produced_bytes / mib:.1f} MiB), "
            f"failed requests {self.failed_requests}",
            f"  records verified          {self.verified} byte for byte"
            + (f", {self.mismatched} MISMATCHED" if self.mismatched else "")
            + (f", {self.missing} MISSING" if self.missing else ""),
            f"  cluster epochs            {self.epoch_first} -> {self.epoch_last}",
            f"  fence window slides       {self.window_slides}",
            f"  stale rejections/retries  {self.stale_rejections} / {self.stale_retries}",
            f"  L0 objects written        {self.objects} ({self.object_bytes / mib:.1f} MiB), "
            f"orphans {self.orphan_objects}",
            f"  M (safe-to-GC epoch)      {'undefined' if self.m is None else self.m}",
        ]
        for scenario in self.scenarios:
            mark = "ok" if scenario.passed else "FAILED"
            lines.append(f"  {scenario.name:<25} {mark}: {scenario.detail}")
        lines.append(f"  data                      {self.data_dir}")
        lines.append(f"  result                    {'OK' if self.ok else 'FAILED'}")
        return "\n".join(lines)


class _Workload:
    """Producers and the expected contents of every partition."""

    def __init__(self, client: Client, rng: random.Random) -> None:
        self.client = client
        self.rng = rng
        self.expected: Expected = {}
        self.produced = 0
        self.produced_bytes = 0
        self.failed_requests = 0

    def records(self, producer: int, seq: int) -> list[tuple[bytes | None, bytes]]:
        out: list[tuple[bytes | None, bytes]] = []
        for i in range(self.rng.randint(1, RECORDS_PER_REQUEST_MAX)):
            key = None if self.rng.random() < 0.3 else f"key-{self.rng.randrange(1000)}".encode()
            value = f"p{producer}-{seq}-{i}:".encode() + self.rng.randbytes(
                self.rng.randint(0, VALUE_BYTES_MAX)
            )
            out.append((key, value))
        return out

    async def produce(
        self, topic: str, partition: int, records: list[tuple[bytes | None, bytes]]
    ) -> ProduceResponse:
        ack = await self.client.produce(topic, partition, records)
        assert ack.last_offset - ack.base_offset + 1 == len(records), ack
        slot = self.expected.setdefault((topic, partition), {})
        for offset, record in enumerate(records, start=ack.base_offset):
            assert offset not in slot, f"offset {offset} of {topic}/{partition} acknowledged twice"
            slot[offset] = record
        self.produced += len(records)
        self.produced_bytes += sum(len(v) + len(k or b"") for k, v in records)
        return ack

    async def producer(self, producer: int, targets: list[Key], deadline: float) -> None:
        seq = 0
        while anyio.current_time() < deadline:
            topic, partition = self.rng.choice(targets)
            try:
                await self.produce(topic, partition, self.records(producer, seq))
            except ApiError:
                self.failed_requests += 1  # not acknowledged: nothing is promised
            seq += 1


async def _bump_epochs(client: Client, lock: anyio.Lock, interval_s: float) -> None:
    while True:
        await anyio.sleep(interval_s)
        async with lock:
            await client.advance_epoch()


async def _progress(client: Client, workload: _Workload, started: float, out: TextIO) -> None:
    while True:
        await anyio.sleep(PROGRESS_INTERVAL_S)
        status = await client.status()
        print(
            f"  {anyio.current_time() - started:4.0f} s: {workload.produced} records acknowledged, "
            f"epoch {status.cluster_epoch}, {status.batcher.objects_uploaded} L0 objects",
            file=out, flush=True,
        )


async def _held_write_scenario(
    client: Client, node: Node, gate: UploadGate, workload: _Workload, advances: int
) -> tuple[int, int, int, tuple[int, int] | None]:
    """Hold one write's upload (epoch N) while the epoch advances `advances` times and a write
    of each new epoch is admitted at the same partition; then let it finish.
    Returns (N, attempts of the held write, its base offset, the window afterwards)."""
    pid = node.partition(FENCE_TOPIC, 0).row.pid
    epoch = await node.epoch_cache.refresh()
    await workload.produce(FENCE_TOPIC, 0, [(None, b"prime")])  # the window now ends at N
    gate.arm(pid)
    held: list[ProduceResponse] = []

    async def held_write() -> None:
        held.append(await workload.produce(FENCE_TOPIC, 0, [(b"held", f"uploaded under epoch {epoch}".encode())]))

    async with anyio.create_task_group() as tg:
        tg.start_soon(held_write)
        await gate.arrived.wait()  # the object (epoch N) is uploaded but not fenced yet
        for _ in range(advances):
            new_epoch = await client.advance_epoch()
            await node.epoch_cache.refresh()  # the node sees it (in production: TTL expiry)
            await workload.produce(FENCE_TOPIC, 0, [(None, f"epoch {new_epoch}".encode())])
        gate.release()
    status = await client.status()
    window = next(p.window for p in status.partitions if p.topic == FENCE_TOPIC)
    return epoch, held[0].attempts, held[0].base_offset, window


def _window(window: tuple[int, int] | None) -> str:
    return "none" if window is None else f"[{window[0]}, {window[1]}]"


async def _scenarios(client: Client, node: Node, gate: UploadGate, workload: _Workload) -> list[ScenarioResult]:
    results = []
    epoch, attempts, _, window = await _held_write_scenario(client, node, gate, workload, advances=1)
    results.append(
        ScenarioResult(
            "in-flight old epoch",
            attempts == 1,
            f"upload under epoch {epoch} acknowledged after epoch {epoch + 1} was admitted; "
            f"window {_window(window)}, attempts {attempts}",
        )
    )
    before = (await client.status()).batcher
    epoch, attempts, _, window = await _held_write_scenario(client, node, gate, workload, advances=2)
    after = (await client.status()).batcher
    rejected = after.stale_rejections - before.stale_rejections
    results.append(
        ScenarioResult(
            "too-old in-flight write",
            attempts == 2 and rejected == 1,
            f"upload under epoch {epoch} rejected by window {_window(window)}, retried with a fresh "
            f"epoch and acknowledged (attempts {attempts}); its first object is an orphan",
        )
    )
    return results


async def _verify(client: Client, expected: Expected, summary: DemoSummary) -> None:
    for (topic, partition), records in sorted(expected.items()):
        seen: set[int] = set()
        offset = 0
        while True:
            result = await client.fetch(topic, partition, offset, VERIFY_FETCH_BYTES)
            for record in result.records:
                want = records.get(record.offset)
                if want is None:
                    summary.unacknowledged_in_log += 1
                elif want == (record.key, record.value):
                    summary.verified += 1
                    seen.add(record.offset)
                else:
                    summary.mismatched += 1
            if not result.records or result.next_offset >= result.high_watermark:
                break
            offset = result.next_offset
        summary.missing += len(records.keys() - seen)


async def run_demo(
    *,
    duration_s: float = 30.0,
    data_dir: str | None = None,
    keep: bool = False,
    producers: int = 6,
    seed: int | None = None,
    out: TextIO = sys.stdout,
) -> DemoSummary:
    assert duration_s > 0 and producers >= 1
    owned_dir = data_dir is None
    directory = data_dir or tempfile.mkdtemp(prefix="levelzero-demo-")
    config = load_config(
        None,
        environ={},  # embedded defaults, whatever the shell exports
        overrides={
            ("storage", "data_dir"): directory,
            ("server", "listen"): "127.0.0.1:0",
            ("node", "epoch_bump_interval_s"): 0.0,  # the demo advances the epoch over HTTP
            ("node", "epoch_cache_ttl_s"): 1.0,  # a cache that lags the service, by design
            ("batcher", "linger_ms"): 50.0,
        },
    )
    rng = random.Random(seed)
    partitions = sum(count for _, count in TOPICS)
    summary = DemoSummary(duration_s, producers, partitions, directory)
    gates: list[UploadGate] = []

    def wrap(store: ObjectStore) -> ObjectStore:
        gates.append(UploadGate(store))
        return gates[-1]

    try:
        async with running_daemon(config, wrap_object_store=wrap) as daemon:
            assert daemon.url is not None and daemon.node is not None
            print(f"levelzero demo: daemon at {daemon.url}, data in {directory}", file=out, flush=True)
            async with Client(daemon.url) as client:
                for name, count in TOPICS:
                    await client.create_topic(name, count)
                await client.create_topic(FENCE_TOPIC, 1)
                summary.epoch_first = (await client.status()).cluster_epoch
                workload = _Workload(client, rng)
                targets = [(name, p) for name, count in TOPICS for p in range(count)]
                bump_lock = anyio.Lock()
                bump_interval_s = min(BUMP_INTERVAL_S, max(0.5, duration_s / 5))
                print(
                    f"producing for {duration_s:.0f} s with {producers} producers on {partitions} "
                    f"partitions, advancing the epoch every {bump_interval_s:.1f} s",
                    file=out, flush=True,
                )
                started = anyio.current_time()
                async with anyio.create_task_group() as background:
                    background.start_soon(_bump_epochs, client, bump_lock, bump_interval_s)
                    background.start_soon(_progress, client, workload, started, out)
                    async with anyio.create_task_group() as load:
                        for producer in range(producers):
                            load.start_soon(workload.producer, producer, targets, started + duration_s)
                    background.cancel_scope.cancel()
                print("in-flight old-epoch scenarios ...", file=out, flush=True)
                summary.scenarios = await _scenarios(client, daemon.node, gates[0], workload)
                print("reading everything back ...", file=out, flush=True)
                await _verify(client, workload.expected, summary)
                status = await client.status()
        summary.produced = workload.produced
        summary.produced_bytes = workload.produced_bytes
        summary.failed_requests = workload.failed_requests
        summary.epoch_last = status.cluster_epoch
        summary.window_slides = sum(p.window_slides for p in status.partitions)
        summary.stale_rejections = status.batcher.stale_rejections
        summary.stale_retries = status.batcher.stale_retries
        summary.objects = status.batcher.objects_uploaded
        summary.object_bytes = status.batcher.bytes_uploaded
        summary.orphan_objects = status.batcher.orphan_objects
        summary.m = status.m
    finally:
        if owned_dir and not keep:
            shutil.rmtree(directory, ignore_errors=True)
            summary.data_dir = f"{directory} (removed; --keep keeps it)"
    print(summary.render(), file=out, flush=True)
    return summary
