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
3. every partition is read back and each acknowledged record compared byte for byte;
4. quiescence: with the load stopped, a bounded loop advances the epoch, waits for the
   reconciler, forces the housekeeper and runs a GC round (all over HTTP) until the object
   store holds no L0 object at all, orphans included; then everything is read back again,
   now from L1, and compared once more.

Meanwhile the reconciler, housekeeper and GC run on their own (a short GC grace period), and
`M` and the GC's deletions are sampled every second. The in-process hooks are only the upload
gate, telling the node's epoch cache to refresh (in production that happens when its TTL runs
out), and counting the L0 objects left in the object store.
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
import anyio.abc

from levelzero.actors.node import Node
from levelzero.core.errors import CorruptData
from levelzero.core.keys import L0_ROOT
from levelzero.core.l0format import read_header
from levelzero.storage.protocols import LIST_PAGE_KEYS_MAX, DeleteResult, ListPage, ObjectInfo, ObjectStore

from levelzero.client import ApiError, Client
from levelzero.config import load_config
from levelzero.http.schema import ProduceResponse
from levelzero.daemon.service import running_daemon

TOPICS = (("orders", 4), ("clicks", 4))
FENCE_TOPIC = "fence-demo"
RECORDS_PER_REQUEST_MAX = 50
VALUE_BYTES_MAX = 1024
BUMP_INTERVAL_S = 2.0
PROGRESS_INTERVAL_S = 5.0
VERIFY_FETCH_BYTES = 4 * 1024 * 1024
SAMPLE_INTERVAL_S = 1.0  # M and GC deletions over time
SERIES_LINE_CHARS = 72
# The demo's GC: short grace and pacing, so objects go while the demo watches.
GC_GRACE_S = 0.5
GC_INTERVAL_S = 1.0
GC_IDLE_BACKOFF_MAX_S = 2.0
IDLE_AFTER_S = 2.0  # the housekeeper advances an idle partition after this
QUIESCE_ROUNDS_MAX = 20
# L1 objects wait at most this long for more data (the default's 30 s would outlast the demo's
# quiescence rounds): the demo shows reconciliation and the GC, not the object sizes.
RECONCILE_AGE_MAX_S = 1.0
RECONCILE_WAIT_S = 5.0  # per quiescence round: for the reconciler to catch up
RECONCILE_POLL_S = 0.1

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

    async def put(self, key: str, data: bytes | bytearray) -> None:
        # read_header only slices and unpacks the header: a bytearray reads as bytes do
        if self._catches(key, data):  # type: ignore[arg-type]
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
class Verification:
    """Reading every partition back and comparing with what was acknowledged."""

    verified: int = 0
    mismatched: int = 0
    missing: int = 0
    unacknowledged_in_log: int = 0
    tiers: dict[str, int] = field(default_factory=dict)  # records by the tier that served them


@dataclass
class Sample:
    at_s: float
    m: int | None
    deleted: int


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
    reconciled_offsets: int = 0  # sum over partitions of LRO + 1
    written_offsets: int = 0  # sum over partitions of the high watermark
    l1_objects: int = 0
    l1_bytes: int = 0
    mp_low: int | None = None  # min and max M(p) over partitions at the end
    mp_high: int | None = None
    gc_rounds: int = 0
    gc_deleted: int = 0
    gc_deleted_bytes: int = 0
    gc_max_deleted_epoch: int | None = None
    samples: list[Sample] = field(default_factory=list)
    quiesce_rounds: int = 0
    l0_left: int | None = None  # L0 objects in the object store after quiescence
    after_gc: Verification = field(default_factory=Verification)

    @property
    def ok(self) -> bool:
        return (
            self.produced > 0
            and self.verified == self.produced
            and self.mismatched == 0
            and self.missing == 0
            and all(s.passed for s in self.scenarios)
            and self.l0_left == 0
            and self.gc_deleted > 0
            and self.after_gc.verified == self.produced
            and self.after_gc.mismatched == 0
            and self.after_gc.missing == 0
        )

    def series(self) -> list[str]:
        """`M` and deletions whenever either changed: 't s: M/deleted', wrapped."""
        points: list[str] = []
        last: tuple[int | None, int] | None = None
        for sample in self.samples:
            if (sample.m, sample.deleted) == last:
                continue
            last = (sample.m, sample.deleted)
            points.append(f"{sample.at_s:.0f}s:{'-' if sample.m is None else sample.m}/{sample.deleted}")
        lines: list[str] = []
        for point in points:
            if lines and len(lines[-1]) + 2 + len(point) <= SERIES_LINE_CHARS:
                lines[-1] += "  " + point
            else:
                lines.append(point)
        return lines

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
            f"  M (safe-to-GC epoch)      {'undefined' if self.m is None else self.m}"
            + ("" if self.mp_low is None else f"; M(p) over partitions {self.mp_low}..{self.mp_high}"),
            f"  reconciled offsets        {self.reconciled_offsets} of {self.written_offsets} "
            f"into {self.l1_objects} L1 objects ({self.l1_bytes / mib:.1f} MiB)",
            f"  L0 objects deleted        {self.gc_deleted} ({self.gc_deleted_bytes / mib:.1f} MiB) "
            f"in {self.gc_rounds} GC rounds, highest epoch deleted "
            f"{'-' if self.gc_max_deleted_epoch is None else self.gc_max_deleted_epoch}",
        ]
        series = self.series()
        for i, line in enumerate(series):
            label = "M/deleted over time" if i == 0 else ""
            lines.append(f"  {label:<25} {line}")
        for scenario in self.scenarios:
            mark = "ok" if scenario.passed else "FAILED"
            lines.append(f"  {scenario.name:<25} {mark}: {scenario.detail}")
        after = self.after_gc
        served = ", ".join(f"{n} from {tier.upper()}" for tier, n in sorted(after.tiers.items()))
        lines += [
            f"  quiescence                {self.quiesce_rounds} rounds of epoch advance, "
            "reconcile, housekeeping, GC",
            f"  L0 objects left           {'unknown' if self.l0_left is None else self.l0_left}",
            f"  verified after GC         {after.verified} byte for byte ({served or 'nothing read'})"
            + (f", {after.mismatched} MISMATCHED" if after.mismatched else "")
            + (f", {after.missing} MISSING" if after.missing else ""),
        ]
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


class EpochBumper:
    """Advances the cluster epoch every `interval_s` until stopped.

    `stop()` waits out an advance in flight before cancelling: an advance cancelled on the
    client side may still land on the server afterwards, moving the epoch under the scenarios
    that follow (they count the epochs they advance themselves)."""

    def __init__(self, client: Client, interval_s: float) -> None:
        self._client = client
        self._interval_s = interval_s
        self._lock = anyio.Lock()
        self._scope: anyio.CancelScope | None = None
        self.advances = 0

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        with anyio.CancelScope() as scope:
            self._scope = scope
            task_status.started()
            while True:
                await anyio.sleep(self._interval_s)
                async with self._lock:
                    await self._client.advance_epoch()
                    self.advances += 1

    async def stop(self) -> None:
        assert self._scope is not None, "stop() before run() started"
        async with self._lock:  # no advance is in flight while the lock is held
            self._scope.cancel()


async def _progress(client: Client, workload: _Workload, started: float, out: TextIO) -> None:
    while True:
        await anyio.sleep(PROGRESS_INTERVAL_S)
        status = await client.status()
        print(
            f"  {anyio.current_time() - started:4.0f} s: {workload.produced} records acknowledged, "
            f"epoch {status.cluster_epoch}, {status.batcher.objects_uploaded} L0 objects uploaded",
            file=out,
            flush=True,
        )


async def _held_write_scenario(
    client: Client, node: Node, gate: UploadGate, workload: _Workload, advances: int
) -> tuple[int, list[int], int, tuple[int, int] | None]:
    """Hold one write's upload (epoch N) while the epoch advances `advances` times and a write
    of each new epoch is admitted at the same partition; then let it finish.
    Returns (N, the epochs advanced to, attempts of the held write, the window afterwards)."""
    pid = node.partition(FENCE_TOPIC, 0).row.pid
    epoch = await node.epoch_cache.refresh()
    await workload.produce(FENCE_TOPIC, 0, [(None, b"prime")])  # the window now ends at N
    gate.arm(pid)
    held: list[ProduceResponse] = []
    advanced: list[int] = []

    async def held_write() -> None:
        held.append(
            await workload.produce(FENCE_TOPIC, 0, [(b"held", f"uploaded under epoch {epoch}".encode())])
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(held_write)
        await gate.arrived.wait()  # the object (epoch N) is uploaded but not fenced yet
        for _ in range(advances):
            new_epoch = await client.advance_epoch()
            advanced.append(new_epoch)
            await node.epoch_cache.refresh()  # the node sees it (in production: TTL expiry)
            await workload.produce(FENCE_TOPIC, 0, [(None, f"epoch {new_epoch}".encode())])
        gate.release()
    status = await client.status()
    window = next(p.window for p in status.partitions if p.topic == FENCE_TOPIC)
    return epoch, advanced, held[0].attempts, window


def _window(window: tuple[int, int] | None) -> str:
    return "none" if window is None else f"[{window[0]}, {window[1]}]"


async def _scenarios(
    client: Client, node: Node, gate: UploadGate, workload: _Workload
) -> list[ScenarioResult]:
    results = []
    epoch, advanced, attempts, window = await _held_write_scenario(client, node, gate, workload, advances=1)
    results.append(
        ScenarioResult(
            "in-flight old epoch",
            attempts == 1 and advanced == [epoch + 1],
            f"upload under epoch {epoch} acknowledged after epoch {_epochs(advanced)} was admitted; "
            f"window {_window(window)}, attempts {attempts}",
        )
    )
    before = (await client.status()).batcher
    epoch, advanced, attempts, window = await _held_write_scenario(client, node, gate, workload, advances=2)
    after = (await client.status()).batcher
    rejected = after.stale_rejections - before.stale_rejections
    results.append(
        ScenarioResult(
            "too-old in-flight write",
            attempts == 2 and rejected == 1 and advanced == [epoch + 1, epoch + 2],
            f"upload under epoch {epoch} rejected by window {_window(window)} (epochs "
            f"{_epochs(advanced)} admitted meanwhile), retried with a fresh epoch and acknowledged "
            f"(attempts {attempts}); its first object is an orphan",
        )
    )
    return results


def _epochs(epochs: list[int]) -> str:
    """The epochs a scenario advanced to; one not following its predecessor means something else
    advanced the epoch during the scenario."""
    return ", ".join(str(e) for e in epochs)


async def _verify(client: Client, expected: Expected) -> Verification:
    result = Verification()
    for (topic, partition), records in sorted(expected.items()):
        seen: set[int] = set()
        offset = 0
        while True:
            fetched = await client.fetch(topic, partition, offset, VERIFY_FETCH_BYTES)
            for record in fetched.records:
                want = records.get(record.offset)
                if want is None:
                    result.unacknowledged_in_log += 1
                elif want == (record.key, record.value):
                    result.verified += 1
                    result.tiers[fetched.tier] = result.tiers.get(fetched.tier, 0) + 1
                    seen.add(record.offset)
                else:
                    result.mismatched += 1
            if not fetched.records or fetched.next_offset >= fetched.high_watermark:
                break
            offset = fetched.next_offset
        result.missing += len(records.keys() - seen)
    return result


async def _sample(client: Client, started: float, samples: list[Sample]) -> None:
    while True:
        status = await client.status()
        deleted = 0 if status.gc is None else status.gc.objects_deleted
        samples.append(Sample(anyio.current_time() - started, status.m, deleted))
        await anyio.sleep(SAMPLE_INTERVAL_S)


async def count_l0_objects(store: ObjectStore) -> int:
    """L0 objects in the store, orphans included (listing level_zero/data/)."""
    count = 0
    start_after: str | None = None
    while True:
        page = await store.list_page(L0_ROOT, start_after)
        count += len(page.objects)
        if page.next_start_after is None:
            return count
        start_after = page.next_start_after


async def _wait_reconciled(client: Client) -> None:
    """Until the reconciler has copied every written offset into L1 (bounded)."""
    with anyio.move_on_after(RECONCILE_WAIT_S):
        while True:
            status = await client.status()
            if status.reconciler is not None and status.reconciler.lag_offsets == 0:
                return
            await anyio.sleep(RECONCILE_POLL_S)


async def _quiesce(client: Client, store: ObjectStore, out: TextIO) -> tuple[int, int]:
    """Advance, reconcile, housekeep, collect until no L0 object is left (bounded).

    Two rounds suffice in principle: after the first, every partition's window holds only
    epochs above the load's; after the second its lower bound, and so M, is past every L0
    object's epoch. A third one collects what the grace period kept (objects written just
    before). Returns (rounds, L0 objects left)."""
    left = await count_l0_objects(store)
    rounds = 0
    while left > 0 and rounds < QUIESCE_ROUNDS_MAX:
        rounds += 1
        epoch = await client.advance_epoch()
        await _wait_reconciled(client)
        await client.run_housekeeper(force=True)
        report = await client.gc_run()
        left = await count_l0_objects(store)
        print(
            f"  quiescence round {rounds}: epoch {epoch}, M {report.m}, deleted {report.deleted}"
            + (f", {report.too_young} too young" if report.too_young else "")
            + f", {left} L0 objects left",
            file=out,
            flush=True,
        )
        if left and report.too_young:
            await anyio.sleep(GC_GRACE_S)  # let the young ones age past the grace period
    return rounds, left


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
            ("kafka", "listen"): "127.0.0.1:0",  # Kafka clients may watch: kcat -b ... -C -t orders
            ("node", "epoch_bump_interval_s"): 0.0,  # the demo advances the epoch over HTTP
            ("node", "epoch_cache_ttl_s"): 1.0,  # a cache that lags the service, by design
            ("batcher", "linger_ms"): 50.0,
            ("gc", "grace_s"): GC_GRACE_S,
            ("gc", "interval_s"): GC_INTERVAL_S,
            ("gc", "idle_backoff_max_s"): GC_IDLE_BACKOFF_MAX_S,
            ("housekeeper", "idle_after_s"): IDLE_AFTER_S,
            ("reconciler", "object_age_max_s"): RECONCILE_AGE_MAX_S,
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
            print(f"Kafka clients: bootstrap server 127.0.0.1:{daemon.kafka_port}", file=out, flush=True)
            async with Client(daemon.url) as client:
                for name, count in TOPICS:
                    await client.create_topic(name, count)
                await client.create_topic(FENCE_TOPIC, 1)
                summary.epoch_first = (await client.status()).cluster_epoch
                workload = _Workload(client, rng)
                targets = [(name, p) for name, count in TOPICS for p in range(count)]
                bump_interval_s = min(BUMP_INTERVAL_S, max(0.5, duration_s / 5))
                bumper = EpochBumper(client, bump_interval_s)
                print(
                    f"producing for {duration_s:.0f} s with {producers} producers on {partitions} "
                    f"partitions, advancing the epoch every {bump_interval_s:.1f} s",
                    file=out,
                    flush=True,
                )
                started = anyio.current_time()
                async with anyio.create_task_group() as sampler:
                    sampler.start_soon(_sample, client, started, summary.samples)
                    async with anyio.create_task_group() as background:
                        await background.start(bumper.run)
                        background.start_soon(_progress, client, workload, started, out)
                        async with anyio.create_task_group() as load:
                            for producer in range(producers):
                                load.start_soon(workload.producer, producer, targets, started + duration_s)
                        await bumper.stop()
                        background.cancel_scope.cancel()
                    print("in-flight old-epoch scenarios ...", file=out, flush=True)
                    summary.scenarios = await _scenarios(client, daemon.node, gates[0], workload)
                    print("reading everything back ...", file=out, flush=True)
                    first = await _verify(client, workload.expected)
                    print(
                        "quiescence: advance the epoch, reconcile, housekeep, GC until no L0 "
                        "object is left ...",
                        file=out,
                        flush=True,
                    )
                    summary.quiesce_rounds, summary.l0_left = await _quiesce(client, gates[0], out)
                    print(f"L0 objects left: {summary.l0_left}", file=out, flush=True)
                    print("reading everything back again, after GC ...", file=out, flush=True)
                    summary.after_gc = await _verify(client, workload.expected)
                    sampler.cancel_scope.cancel()
                status = await client.status()
                summary.samples.append(
                    Sample(
                        anyio.current_time() - started,
                        status.m,
                        0 if status.gc is None else status.gc.objects_deleted,
                    )
                )
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
        summary.verified = first.verified
        summary.mismatched = first.mismatched
        summary.missing = first.missing
        summary.unacknowledged_in_log = first.unacknowledged_in_log
        summary.reconciled_offsets = sum(p.lro + 1 for p in status.partitions)
        summary.written_offsets = sum(p.high_watermark for p in status.partitions)
        mps = [p.mp for p in status.partitions if p.mp is not None]
        summary.mp_low, summary.mp_high = (min(mps), max(mps)) if mps else (None, None)
        if status.reconciler is not None:
            summary.l1_objects = status.reconciler.objects_written
            summary.l1_bytes = status.reconciler.bytes_written
        if status.gc is not None:
            summary.gc_rounds = status.gc.rounds
            summary.gc_deleted = status.gc.objects_deleted
            summary.gc_deleted_bytes = status.gc.bytes_deleted
            summary.gc_max_deleted_epoch = status.gc.max_deleted_epoch
    finally:
        if owned_dir and not keep:
            shutil.rmtree(directory, ignore_errors=True)
            summary.data_dir = f"{directory} (removed; --keep keeps it)"
    print(summary.render(), file=out, flush=True)
    return summary
