"""`levelzero demo --nodes N`: a local cluster, checked end to end.

It starts a throwaway PostgreSQL (the control plane: needs the server binaries, `initdb` and
`pg_ctl`, on PATH) and N `levelzero run` processes on loopback that share it and one local
object directory (`storage.objects_path`), each with its HTTP API and a Kafka listener. Then,
through the HTTP API only, like any client:

1. producers write to a topic whose partitions the nodes lead by their leases, through whichever
   nodes are up (a node that does not lead a partition answers with a redirect the client
   follows);
2. meanwhile one node is SIGKILLed (its partitions accept writes again once its leases run out)
   and started again, and every node in turn is stopped gracefully and started again (a rolling
   restart: a stopping node hands its partitions over at once);
3. every acknowledged record is read back through every node and compared byte for byte; no
   offset may have been acknowledged twice;
4. quiescence: with the load stopped, the nodes' reconcilers, housekeepers and GC (each over its
   share of the key prefixes) run until the object directory holds no L0 object.

Progress is printed every few seconds; the summary names what each step measured.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import anyio
import httpx

from levelzero.core.keys import L0_ROOT
from levelzero.testing.loopback import free_local_port
from levelzero.testing.postgres import SUPERUSER_PASSWORD, ServerUnavailable, start_throwaway

from levelzero.client import ApiError, Client

TOPIC = "orders"
PARTITIONS = 12
LEASE_TTL_S = 3.0  # short, so the demo's failover is quick to watch (the default is 10 s)
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 40.0
PROGRESS_INTERVAL_S = 5.0
QUIESCE_S_MAX = 120.0
RETRY_PAUSE_S = 0.05
RETRIABLE = frozenset(
    {"not_leader", "unreachable", "timeout", "shutting_down", "storage_error", "http_error", "unavailable"}
)
# Background work made brisk, so that quiescence comes within seconds of the load stopping.
BRISK = {
    "LEVELZERO_BATCHER_LINGER_MS": "10",
    "LEVELZERO_NODE_EPOCH_BUMP_INTERVAL_S": "1",
    "LEVELZERO_NODE_EPOCH_CACHE_TTL_S": "1",
    "LEVELZERO_RECONCILER_INTERVAL_S": "0.5",
    "LEVELZERO_RECONCILER_OBJECT_AGE_MAX_S": "1",  # the default's 30 s outlasts the quiescence
    "LEVELZERO_HOUSEKEEPER_INTERVAL_S": "0.5",
    "LEVELZERO_HOUSEKEEPER_IDLE_AFTER_S": "1",
    "LEVELZERO_GC_INTERVAL_S": "0.5",
    "LEVELZERO_GC_IDLE_BACKOFF_MAX_S": "1",
    "LEVELZERO_GC_GRACE_S": "0",
    "LEVELZERO_GC_SWEEP_INTERVAL_S": "2",
}


class ClusterNodeProcess:
    """One `levelzero run` process of a local cluster, restartable on the same ports and data
    (the demo's nodes, and `levelzero bench`'s cluster item's)."""

    def __init__(self, name: str, root: Path, env: dict[str, str], *, kafka: bool = True) -> None:
        self.name = name
        self.port = free_local_port()
        self.kafka_port = free_local_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = root / name
        self.log_path = root / f"{name}.log"
        self.env = {
            **env,
            "LEVELZERO_CLUSTER_NODE_ID": name,
            "LEVELZERO_CLUSTER_ADVERTISE_URL": self.url,
        }
        if kafka:
            self.env["LEVELZERO_KAFKA_LISTEN"] = f"127.0.0.1:{self.kafka_port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log_file:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "levelzero.cli",
                    "run",
                    "--data-dir",
                    str(self.data_dir),
                    "--listen",
                    f"127.0.0.1:{self.port}",
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=self.env,
            )

    async def ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        async with httpx.AsyncClient(trust_env=False, timeout=2.0) as http:
            while time.monotonic() < deadline:
                if self.proc is None or self.proc.poll() is not None:
                    code = None if self.proc is None else self.proc.returncode
                    raise DemoFailed(
                        f"node {self.name} exited (status {code}); the end of its log, "
                        f"{self.log_path}:\n{self.log_tail()}"
                    )
                try:
                    if (await http.get(f"{self.url}/readyz")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await anyio.sleep(0.1)
        raise DemoFailed(
            f"node {self.name} not ready within {START_TIMEOUT_S:g} s; the end of its log, "
            f"{self.log_path}:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 25) -> str:
        """The last lines of this node's log (what a failure message shows)."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            return f"    (unreadable: {exc})"
        return "\n".join(f"    {line}" for line in text.splitlines()[-lines:])

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        """SIGTERM, as systemd stops it; its exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return 0 if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return -9


class DemoFailed(Exception):
    """A step of the demo could not be done (a node did not start, a check failed)."""


@dataclass
class ClusterDemoSummary:
    nodes: int
    acked_writes: int = 0
    retried: int = 0
    twice: int = 0  # offsets acknowledged twice (must be 0)
    mismatched: int = 0  # acknowledged records read back different or missing (must be 0)
    read_back: int = 0
    failover_s: float | None = None
    stops_clean: int = 0
    l0_left: int = -1
    failure: str | None = None
    events: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.failure is None
            and self.twice == 0
            and self.mismatched == 0
            and self.l0_left == 0
            and self.acked_writes > 0
        )


def _l0_objects(objects: Path) -> int:
    root = objects / L0_ROOT
    return sum(len(files) for _, _, files in os.walk(root)) if root.exists() else 0


async def run_cluster_demo(
    *, nodes: int, duration_s: float, producers: int, keep: bool, out: TextIO
) -> ClusterDemoSummary:
    summary = ClusterDemoSummary(nodes)
    try:
        server = await anyio.to_thread.run_sync(start_throwaway)
    except ServerUnavailable as exc:
        summary.failure = f"levelzero demo --nodes needs a PostgreSQL server to start: {exc}"
        print(summary.failure, file=out)
        return summary
    root = Path(tempfile.mkdtemp(prefix="levelzero-cluster-demo-"))
    objects = root / "objects"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LEVELZERO_")},
        **BRISK,
        "LEVELZERO_CONTROL_KIND": "postgres",
        "LEVELZERO_CONTROL_DSN": server.dsn(password=None),
        "LEVELZERO_CONTROL_PASSWORD": SUPERUSER_PASSWORD,
        "LEVELZERO_STORAGE_KIND": "local",
        "LEVELZERO_STORAGE_OBJECTS_PATH": str(objects),
        "LEVELZERO_CLUSTER_ENABLED": "true",
        "LEVELZERO_CLUSTER_LEASE_TTL_S": str(LEASE_TTL_S),
    }
    members = [ClusterNodeProcess(f"n{i + 1}", root, env) for i in range(nodes)]
    print(
        f"levelzero demo: {nodes} nodes, PostgreSQL at {server.dsn(password=None)}, objects in "
        f"{objects}, lease TTL {LEASE_TTL_S:g} s",
        file=out,
    )
    try:
        await _run(members, summary, duration_s, producers, objects, out)
    except DemoFailed as exc:
        summary.failure = str(exc)
    finally:
        for member in members:
            await anyio.to_thread.run_sync(member.stop)
        await anyio.to_thread.run_sync(server.close)
        if keep or not summary.ok:
            print(f"data and node logs kept in {root}", file=out)
        else:
            shutil.rmtree(root, ignore_errors=True)
    _print_summary(summary, out)
    return summary


async def _run(
    members: list[ClusterNodeProcess],
    summary: ClusterDemoSummary,
    duration_s: float,
    producers: int,
    objects: Path,
    out: TextIO,
) -> None:
    for member in members:
        member.start()
    for member in members:
        await member.ready()
        print(f"  {member.name} ready: {member.url}, Kafka 127.0.0.1:{member.kafka_port}", file=out)
    async with Client(members[0].url) as client:
        await client.create_topic(TOPIC, PARTITIONS)
    up = {m.name for m in members}
    by_name = {m.name: m for m in members}
    acked: dict[int, dict[int, bytes]] = {p: {} for p in range(PARTITIONS)}
    last_ack: dict[int, float] = {}
    rng = random.Random(7)

    async def produce_one(index: int, i: int) -> None:
        partition = rng.randrange(PARTITIONS)
        value = f"p{index}-{i}-{rng.randbytes(6).hex()}".encode()
        with anyio.fail_after(START_TIMEOUT_S):
            while True:
                url = by_name[rng.choice(sorted(up))].url
                try:
                    async with Client(url, timeout_s=5.0) as client:
                        ack = await client.produce(TOPIC, partition, [value])
                    break
                except ApiError as exc:
                    if exc.code not in RETRIABLE:
                        raise DemoFailed(f"a produce failed: {exc}") from None
                    summary.retried += 1
                    await anyio.sleep(RETRY_PAUSE_S)
        if ack.base_offset in acked[partition]:
            summary.twice += 1
        acked[partition][ack.base_offset] = value
        last_ack[partition] = time.monotonic()
        summary.acked_writes += 1

    async def producer(index: int, stop: anyio.Event) -> None:
        i = 0
        while not stop.is_set():
            await produce_one(index, i)
            i += 1

    async def progress(stop: anyio.Event) -> None:
        started = time.monotonic()
        while not stop.is_set():
            with anyio.move_on_after(PROGRESS_INTERVAL_S):
                await stop.wait()
            print(
                f"  {time.monotonic() - started:5.1f} s: {summary.acked_writes} writes "
                f"acknowledged, {summary.retried} retried, nodes up {sorted(up)}",
                file=out,
                flush=True,
            )

    def event(text: str) -> None:
        summary.events.append(text)
        print(f"  -> {text}", file=out, flush=True)

    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        for index in range(producers):
            tg.start_soon(producer, index, stop)
        tg.start_soon(progress, stop)
        step_s = max(duration_s / (len(members) + 3), LEASE_TTL_S)
        await anyio.sleep(step_s)
        # A crash: SIGKILL the last node, then measure until every partition (its too) has
        # taken a write again.
        victim = members[-1]
        up.discard(victim.name)
        killed_at = time.monotonic()
        victim.kill()
        event(f"SIGKILL {victim.name}")
        with anyio.fail_after(START_TIMEOUT_S):
            while not all(last_ack.get(p, 0) > killed_at for p in range(PARTITIONS)):
                await anyio.sleep(0.05)
        summary.failover_s = time.monotonic() - killed_at
        event(f"every partition took writes again {summary.failover_s:.2f} s after the kill")
        victim.start()
        await victim.ready()
        up.add(victim.name)
        event(f"{victim.name} started again and rejoined")
        await anyio.sleep(step_s)
        # A rolling restart: each node in turn is stopped gracefully and started again.
        for member in members:
            up.discard(member.name)
            status = await anyio.to_thread.run_sync(member.stop)
            summary.stops_clean += status == 0
            member.start()
            await member.ready()
            up.add(member.name)
            event(f"{member.name} stopped gracefully (exit {status}) and started again")
            await anyio.sleep(step_s / 2)
        stop.set()
    print(f"  load stopped: {summary.acked_writes} writes acknowledged", file=out)

    for member in members:
        for partition, expected in acked.items():
            stored = await read_partition(member.url, partition)
            for offset, value in expected.items():
                summary.read_back += 1
                if offset >= len(stored) or stored[offset] != value:
                    summary.mismatched += 1
    print(
        f"  every acknowledged record read back through each of {len(members)} nodes: "
        f"{summary.mismatched} mismatched",
        file=out,
    )
    deadline = time.monotonic() + QUIESCE_S_MAX
    while (left := _l0_objects(objects)) and time.monotonic() < deadline:
        await anyio.sleep(0.5)
    summary.l0_left = left
    print(f"  quiescence: {left} L0 objects left", file=out)


async def read_partition(url: str, partition: int, topic: str = TOPIC) -> list[bytes | None]:
    """Every value of a partition, from offset 0, through the node at `url`."""
    async with Client(url, timeout_s=10.0) as client:
        out: list[bytes | None] = []
        offset = 0
        while True:
            fetched = await client.fetch(topic, partition, offset)
            out.extend(r.value for r in fetched.records)
            if fetched.next_offset >= fetched.high_watermark:
                return out
            offset = fetched.next_offset


def _print_summary(s: ClusterDemoSummary, out: TextIO) -> None:
    print("", file=out)
    print(f"levelzero demo --nodes {s.nodes}: {'OK' if s.ok else 'FAILED'}", file=out)
    rows = [
        ("writes acknowledged / retried", f"{s.acked_writes} / {s.retried}"),
        ("offsets acknowledged twice", s.twice),
        ("records read back (all nodes) / mismatched", f"{s.read_back} / {s.mismatched}"),
        ("failover after SIGKILL (s)", "-" if s.failover_s is None else f"{s.failover_s:.2f}"),
        ("graceful stops that exited 0", f"{s.stops_clean} of {s.nodes}"),
        ("L0 objects left at quiescence", s.l0_left),
    ]
    for name, value in rows:
        print(f"  {name:<44} {value}", file=out)
    if s.failure:
        print(f"  failure: {s.failure}", file=out)
