"""Item 7: the daemon's RSS over a long produce/consume/GC run.

A child process (clean RSS: none of the other items' garbage) runs the real daemon in-process
(`running_daemon`: SQLite log store, local object store with fsync, HTTP on a loopback port)
and drives it over HTTP with the `Client`: `PRODUCERS` producers send `RECORDS_PER_CALL` small
records at a time to `PARTITIONS` partitions, `CONSUMERS` consumers follow every partition,
the reconciler, housekeeper and GC run as in production (the GC's grace period shortened to
`GC_GRACE_S`, so objects are deleted while the run lasts). `VmRSS` of /proc/self/status is
sampled every `SAMPLE_S` seconds.

The figure: peak RSS after warm-up (the first `WARMUP_FRACTION` of the run) beside the RSS at
the end of warm-up (median of the first post-warm-up samples). Target: <= 110% (flat).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from typing import Any

import anyio

from .common import Figure, Settings, Target, rss_bytes

ITEM = "memory"
PARTITIONS = 256
PRODUCERS = 16
CONSUMERS = 4
RECORDS_PER_CALL = 500
VALUE_BYTES = 64
SAMPLE_S = 0.5
WARMUP_FRACTION = 1 / 3
BASELINE_SAMPLES = 5
EPOCH_BUMP_INTERVAL_S = 2.0
GC_INTERVAL_S = 1.0
GC_GRACE_S = 3.0
RESULT_PREFIX = "LEVELZERO-BENCH-MEMORY "
TARGET = Target(1.10, higher_is_better=False)


def bench_config(data_dir: str):  # noqa: ANN201 - a daemon Config (lazy import)
    """The daemon's embedded defaults, on `data_dir` and a free port, with a GC that deletes
    within the run."""
    from levelzero.config import load_config

    return load_config(
        None,
        environ={},
        overrides={
            ("storage", "data_dir"): data_dir,
            ("server", "listen"): "127.0.0.1:0",
            ("node", "epoch_bump_interval_s"): EPOCH_BUMP_INTERVAL_S,
            ("gc", "interval_s"): GC_INTERVAL_S,
            ("gc", "idle_backoff_max_s"): GC_INTERVAL_S,
            ("gc", "grace_s"): GC_GRACE_S,
            ("logging", "level"): "warning",
        },
    )


async def drive(records_target: int, seconds_min: float) -> dict[str, Any]:
    """Run the daemon and the load until both bounds are reached; return the samples."""
    from levelzero.client import Client
    from levelzero.daemon.service import running_daemon

    samples: list[tuple[float, int]] = []
    produced = consumed = 0
    rng = random.Random(7)
    values = [rng.randbytes(VALUE_BYTES) for _ in range(RECORDS_PER_CALL)]
    with tempfile.TemporaryDirectory(prefix="lz-bench-memory-") as data_dir:
        config = bench_config(data_dir)
        async with running_daemon(config) as daemon:
            node = daemon.node
            assert node is not None and daemon.url is not None
            async with Client(daemon.url) as client:
                await client.create_topic("memory", PARTITIONS)
                started = time.perf_counter()
                done = anyio.Event()

                def finished() -> bool:
                    return produced >= records_target and time.perf_counter() - started >= seconds_min

                async def sampler() -> None:
                    while not done.is_set():
                        samples.append((time.perf_counter() - started, rss_bytes()))
                        await anyio.sleep(SAMPLE_S)

                async def producer(i: int) -> None:
                    nonlocal produced
                    partition = i
                    while not finished():
                        partition = (partition + PRODUCERS) % PARTITIONS
                        await client.produce("memory", partition, values)
                        produced += RECORDS_PER_CALL
                    done.set()

                async def consumer(i: int) -> None:
                    nonlocal consumed
                    offsets = dict.fromkeys(range(i, PARTITIONS, CONSUMERS), 0)
                    while not done.is_set():
                        progressed = False
                        for partition, offset in offsets.items():
                            fetched = await client.fetch("memory", partition, offset)
                            consumed += len(fetched.records)
                            offsets[partition] = fetched.next_offset
                            progressed |= bool(fetched.records)
                            if done.is_set():
                                return
                        if not progressed:
                            await anyio.sleep(0.05)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(sampler)
                    for i in range(CONSUMERS):
                        tg.start_soon(consumer, i)
                    async with anyio.create_task_group() as producers:
                        for i in range(PRODUCERS):
                            producers.start_soon(producer, i)
                    done.set()
                elapsed = time.perf_counter() - started
                gc = node.gc.statistics()
                stats = node.batcher.stats
                return {
                    "seconds": round(elapsed, 1),
                    "records_produced": produced,
                    "records_consumed": consumed,
                    "objects_uploaded": stats.objects_uploaded,
                    "objects_deleted": gc.totals.deleted,
                    "gc_rounds": gc.rounds,
                    "l1_objects_written": node.reconciler.stats.objects_written,
                    "cluster_epoch": node.epochs.current,
                    "samples": samples,
                }


def child_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m levelzero.bench.memory")
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--seconds-min", type=float, default=0.0)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    args = parser.parse_args(argv)
    from .loop import run_async

    result = run_async(drive, args.records, args.seconds_min, loop=args.loop)
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


def figures_from(result: dict[str, Any]) -> list[Figure]:
    samples: list[tuple[float, int]] = [tuple(s) for s in result["samples"]]
    assert len(samples) >= 4, f"too few RSS samples ({len(samples)})"
    end = samples[-1][0]
    after = [rss for at, rss in samples if at >= end * WARMUP_FRACTION]
    baseline = statistics.median(after[: max(1, min(BASELINE_SAMPLES, len(after) // 3))])
    peak_after = max(after)
    last_quarter = after[-max(1, len(after) // 4) :]
    mib = 2**20
    notes = {k: v for k, v in result.items() if k != "samples"}
    notes.update(
        {
            "partitions": PARTITIONS,
            "producers": PRODUCERS,
            "consumers": CONSUMERS,
            "records_per_call": RECORDS_PER_CALL,
            "value_bytes": VALUE_BYTES,
            "gc_grace_s": GC_GRACE_S,
            "peak_rss_mib": round(max(rss for _, rss in samples) / mib, 1),
            "first_rss_mib": round(samples[0][1] / mib, 1),
            "final_rss_mib": round(samples[-1][1] / mib, 1),
            "last_quarter_median_mib": round(statistics.median(last_quarter) / mib, 1),
            "rss_mib_every_10_percent": [
                round(samples[min(len(samples) - 1, i * len(samples) // 10)][1] / mib, 1) for i in range(11)
            ],
        }
    )
    return [
        Figure(
            item=ITEM,
            name=(
                f"daemon RSS: peak after warm-up vs RSS at warm-up end "
                f"({result['records_produced']:,} records, {PARTITIONS} partitions)"
            ),
            unit="MiB",
            sut=peak_after / mib,
            floor=baseline / mib,
            ratio=peak_after / baseline,
            target=TARGET,
            sut_label="peak",
            floor_label="after warm-up",
            rounds=((peak_after / mib, baseline / mib),),
            notes=notes,
        )
    ]


async def run(settings: Settings) -> list[Figure]:
    from .common import loop_backend

    records = settings.pick(2_000_000, 50_000)
    seconds_min = settings.pick(120.0, 4.0)
    command = [
        sys.executable,
        "-m",
        "levelzero.bench.memory",
        "--records",
        str(records),
        "--seconds-min",
        str(seconds_min),
        "--loop",
        loop_backend(),
    ]
    env = dict(os.environ)
    completed = await anyio.run_process(command, env=env, check=False)
    out = completed.stdout.decode()
    lines = [line for line in out.splitlines() if line.startswith(RESULT_PREFIX)]
    if completed.returncode != 0 or not lines:
        tail = (out + completed.stderr.decode())[-3000:]
        raise RuntimeError(f"memory child failed ({completed.returncode}):\n{tail}")
    return figures_from(json.loads(lines[-1][len(RESULT_PREFIX) :]))


if __name__ == "__main__":
    sys.exit(child_main())
