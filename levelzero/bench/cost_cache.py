"""The L0 cache's size against readers' GETs and memory: item 13's measurement of one workload
(`cost.measure`), in a child process per (workload, `node.l0_cache_bytes_max`), with a short
window. Not an item of `levelzero bench` (it runs the cost item's workloads several times over);
what chose the default of `node.l0_cache_bytes_max` (BENCHMARKS.md, "The L0 cache's size").

    python -m levelzero.bench.cost_cache [--window-s 15] [--warm-up-s 3] [--sizes-mib 0,64,128,256]
        [--workloads 64x1,64x10,1024x1,1024x10]

One JSON line per run: the readers' GETs per GiB through the cache and with each L0 extent
read alone, the rate acknowledged, the cache's counters and the process's peak RSS (VmHWM) and
RSS after the reads. The object store is in memory (the process holds every object written), so
the RSS to compare is between sizes of the same workload, not across workloads.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from levelzero.actors.node import Node, NodeConfig

from .common import rss_bytes
from .cost import MIB, Workload, measure
from .loop import resolve_loop, run_async


def _one(workload: Workload, cache_mib: int, warm_up_s: float, window_s: float) -> dict[str, Any]:
    config = replace(NodeConfig(), l0_cache_bytes_max=cache_mib * MIB)
    cache_stats: dict[str, Any] = {}
    shutdown = Node.shutdown

    async def capture(node: Node) -> None:  # the cache's counters before the node goes
        cache_stats.update(asdict(node.l0_cache.statistics()))
        await shutdown(node)

    Node.shutdown = capture  # type: ignore[method-assign,assignment]

    async def main() -> Any:
        with tempfile.TemporaryDirectory(prefix="lz-cost-cache-") as tmp:
            return await measure(workload, Path(tmp), warm_up_s, window_s, config)

    m = run_async(main, loop=resolve_loop("auto"))
    per_gib = m.per_gib()
    return {
        "partitions": workload.partitions,
        "offered_mib_per_s": workload.mib_per_s,
        "acknowledged_mib_per_s": round(m.mib_per_s, 2),
        "cache_mib": cache_mib,
        "read_mib": round(m.read_bytes / MIB, 1),
        "reader_gets_per_gib": round(per_gib.reader_gets, 1),
        "reader_gets_per_gib_uncached": round(m.per_gib(uncached=True).reader_gets, 1),
        "reader_gets": m.readers.gets,
        "reader_gets_uncached": m.readers_uncached.gets,
        "reader_get_mib": round((m.readers.l0_get_bytes + m.readers.l1_get_bytes) / MIB, 1),
        "cache": {k: v for k, v in cache_stats.items() if k != "bytes_max"},
        # the peak (VmHWM: ru_maxrss, KiB on Linux) and the resident set now
        "vm_hwm_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "vm_rss_mib": round(rss_bytes() / MIB, 1),
    }


def _child(queue: Any, *args: Any) -> None:
    queue.put(_one(*args))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window-s", type=float, default=15.0)
    parser.add_argument("--warm-up-s", type=float, default=3.0)
    parser.add_argument("--sizes-mib", default="0,64,128,256")
    parser.add_argument("--workloads", default="64x1,64x10,1024x1,1024x10")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes_mib.split(",")]
    workloads = []
    for text in args.workloads.split(","):
        partitions, _, rate = text.partition("x")
        workloads.append(Workload(int(partitions), float(rate)))
    context = multiprocessing.get_context("spawn")
    for workload in workloads:
        for size in sizes:
            queue = context.Queue()
            run = (queue, workload, size, args.warm_up_s, args.window_s)
            child = context.Process(target=_child, args=run)
            child.start()
            print(json.dumps(queue.get()), flush=True)
            child.join()


if __name__ == "__main__":
    main()
