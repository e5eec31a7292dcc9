"""The garbage collector's thresholds for a daemon process (`levelzero run`).

CPython collects its youngest generation every 700 net container allocations, and a placeholder
allocates dozens (its records, reply, log row, job). Objects that live for one object cycle (tens
of milliseconds: the records of an extent wait for their placeholder to be durable) outlive
several young collections and are promoted, and promoted objects pending trigger full collections
that traverse every object of the heap: 10,000 partitions' actors included. At 10,000 partitions
that was half of the event loop's time per record (`levelzero bench --only scale`: 9.3 -> 5.0 µs
per record with these thresholds, 7.0 -> 4.1 at 1,024 partitions; 1 partition unchanged).

With a young generation of 50,000, an object cycle's garbage dies young, and full collections
become rare (every 10 middle collections of 20 young ones: 10 million net allocations). What a
young collection can hold back is cyclic garbage of at most 50,000 container objects: a few MB.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

THRESHOLDS = (50_000, 20, 10)  # young, middle, old (gc.set_threshold)


def tune_gc() -> tuple[int, int, int]:
    """Set the daemon's thresholds; the previous ones."""
    previous = gc.get_threshold()
    gc.set_threshold(*THRESHOLDS)
    return previous


@contextmanager
def tuned_gc() -> Iterator[None]:
    """The daemon's thresholds for a block (a benchmark measuring what the daemon runs)."""
    previous = tune_gc()
    try:
        yield
    finally:
        gc.set_threshold(*previous)
