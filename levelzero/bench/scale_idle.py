"""Item 8 (scale), the idle side: what many partitions cost when they take no writes.

A child process per measurement (RSS is a process's): it creates `PARTITIONS` partitions in a
SQLite log store (topics of at most 4,096 partitions), lets the housekeeper give each its first
epoch and catch-up, and stops. A second child starts a `Node` over that store — replay of every
partition's snapshot and log, a new term each — and reports the time from `Node.run` to ready,
then lets the housekeeper and reconciler settle (`SETTLE_S`) and reports its RSS. The same child
run over an empty store is the floor of the RSS figure. The node runs its reconciler and
housekeeper (the periodic work of an idle node), no GC and no epoch bumps.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from levelzero.daemon.gc_tuning import tune_gc

from .common import Figure, Settings, Target, figure, rss_bytes, work_dir

ITEM = "scale"
PARTITIONS = 10_000
TOPIC_PARTITIONS_MAX = 4_096  # node.PARTITIONS_PER_TOPIC_MAX
SETTLE_S = 6.0  # housekeeper and reconciler rounds after start-up before RSS is read
RSS_PER_PARTITION_KIB_MAX = 10.0
STARTUP_S_MAX = 10.0
RESULT_PREFIX = "LEVELZERO-BENCH-SCALE-IDLE "


def node_config():  # noqa: ANN201 - a NodeConfig (lazy imports: the child's)
    from levelzero.actors.gc import GcConfig
    from levelzero.actors.housekeeper import HousekeeperConfig
    from levelzero.actors.node import NodeConfig

    return NodeConfig(
        epoch_bump_interval_s=None,
        gc=GcConfig(enabled=False),
        housekeeper=HousekeeperConfig(interval_s=0.5, idle_after_s=0.0),
    )


async def create(root: Path, partitions: int) -> None:
    from levelzero.actors.node import Node
    from levelzero.storage.local_store import LocalObjectStore
    from levelzero.storage.sqlite import SqliteLogStore

    async with await SqliteLogStore.open(root / "log.db") as log_store:
        node = Node(node_config(), log_store, LocalObjectStore(root / "objects"))
        async with anyio.create_task_group() as tg:
            await tg.start(node.run)
            left, topic = partitions, 0
            while left:
                count = min(TOPIC_PARTITIONS_MAX, left)
                await node.create_topic(f"idle{topic}", count)
                left, topic = left - count, topic + 1
            for _ in range(3):  # first epochs, then the catch-ups that settle them
                await node.housekeeper.run_round()
            await node.shutdown()


async def start(root: Path, settle_s: float = SETTLE_S) -> dict[str, Any]:
    from levelzero.actors.node import Node
    from levelzero.storage.local_store import LocalObjectStore
    from levelzero.storage.sqlite import SqliteLogStore

    async with await SqliteLogStore.open(root / "log.db") as log_store:
        node = Node(node_config(), log_store, LocalObjectStore(root / "objects"))
        async with anyio.create_task_group() as tg:
            started = time.perf_counter()
            await tg.start(node.run)
            startup_s = time.perf_counter() - started
            await anyio.sleep(settle_s)
            cpu_started, wall_started = time.process_time(), time.perf_counter()
            await anyio.sleep(settle_s / 2)
            idle_cpu = (time.process_time() - cpu_started) / (time.perf_counter() - wall_started)
            gc.collect()
            rss = rss_bytes()
            result = {
                "partitions": len(node.partitions()),
                "startup_s": startup_s,
                "rss_bytes": rss,
                "idle_cpu_fraction": idle_cpu,
                "housekeeper_tended": node.housekeeper.stats.partitions_tended,
                "reconciler_visited": node.reconciler.stats.partitions_visited,
            }
            await node.shutdown()
    return result


def child_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m levelzero.bench.scale_idle")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--create", type=int, default=0, help="create this many partitions first")
    parser.add_argument("--settle-s", type=float, default=SETTLE_S)
    args = parser.parse_args(argv)
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    if args.create:
        anyio.run(create, root, args.create)
        return 0
    tune_gc()  # as `levelzero run` does (daemon/gc_tuning.py)
    print(RESULT_PREFIX + json.dumps(anyio.run(start, root, args.settle_s)), flush=True)
    return 0


async def child(*args: str) -> dict[str, Any] | None:
    completed = await anyio.run_process(
        [sys.executable, "-m", "levelzero.bench.scale_idle", *args], check=False
    )
    out = completed.stdout.decode()
    if completed.returncode != 0:
        tail = (out + completed.stderr.decode())[-3000:]
        raise RuntimeError(f"scale_idle child failed ({completed.returncode}):\n{tail}")
    lines = [line for line in out.splitlines() if line.startswith(RESULT_PREFIX)]
    return json.loads(lines[-1][len(RESULT_PREFIX) :]) if lines else None


async def run(settings: Settings) -> list[Figure]:
    rounds = settings.pick(min(settings.rounds, 3), 1)
    partitions = settings.pick(PARTITIONS, 300)
    runs: list[tuple[dict[str, Any], dict[str, Any]]] = []
    with work_dir(settings, f"{ITEM}-idle") as root:
        for r in range(rounds):
            many, empty = root / f"many-r{r}", root / f"empty-r{r}"
            await child("--dir", str(many), "--create", str(partitions))
            full = await child("--dir", str(many))
            bare = await child("--dir", str(empty))
            assert full is not None and bare is not None
            assert full["partitions"] == partitions and bare["partitions"] == 0, (full, bare)
            runs.append((full, bare))
    per_partition_kib = [(full["rss_bytes"] - bare["rss_bytes"]) / partitions / 1024 for full, bare in runs]
    notes = {
        "partitions": partitions,
        "settle_s": SETTLE_S,
        "rss_mib": [round(full["rss_bytes"] / 2**20, 1) for full, _ in runs],
        "empty_rss_mib": [round(bare["rss_bytes"] / 2**20, 1) for _, bare in runs],
        "startup_s": [round(full["startup_s"], 2) for full, _ in runs],
        "idle_cpu_fraction": [round(full["idle_cpu_fraction"], 4) for full, _ in runs],
        "housekeeper_tended": [full["housekeeper_tended"] for full, _ in runs],
        "reconciler_visited": [full["reconciler_visited"] for full, _ in runs],
    }
    return [
        figure(
            ITEM,
            f"daemon RSS per idle partition above the empty node vs {RSS_PER_PARTITION_KIB_MAX:.0f} KiB, "
            f"{partitions:,} partitions",
            "KiB",
            [(kib, RSS_PER_PARTITION_KIB_MAX) for kib in per_partition_kib],
            target=Target(1.0, higher_is_better=False),
            sut_label="per partition",
            floor_label="limit",
            notes=notes,
        ),
        figure(
            ITEM,
            f"start-up (replay to ready) with {partitions:,} partitions vs {STARTUP_S_MAX:.0f} s",
            "s",
            [(full["startup_s"], STARTUP_S_MAX) for full, _ in runs],
            target=Target(1.0, higher_is_better=False),
            sut_label="start-up",
            floor_label="limit",
            notes=notes,
        ),
    ]


if __name__ == "__main__":
    sys.exit(child_main())
