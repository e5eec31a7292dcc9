"""Pruning the control plane's history tables by age (`control.history_retention_s`): the
rule and the statements are `storage/history.py`'s; this is the daemon's hourly task.

Each pass deletes bounded batches (`HISTORY_PRUNE_BATCH` rows per table and statement), a
short pause between them so that appends and group commits go on, until nothing old is left
or `PRUNE_BATCHES_MAX` batches ran (the rest waits for the next pass: a first pass over years
of rows does not hold the store for minutes). In a cluster every node prunes the shared tables;
the deletes are idempotent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import anyio

from levelzero.core.errors import LevelZeroError
from levelzero.core.throttled_warning import ThrottledWarnings
from levelzero.storage.history import HISTORY_PRUNE_BATCH
from levelzero.storage.protocols import EventLog

log = logging.getLogger("levelzero.daemon")

HISTORY_PRUNE_INTERVAL_S = 3600.0
PRUNE_BATCHES_MAX = 200  # per pass: 400,000 rows a table at most (the rest the next hour)
PRUNE_PAUSE_S = 0.05  # between batches


async def prune_history_once(
    store: EventLog, retention_s: float, now: float, batch: int = HISTORY_PRUNE_BATCH
) -> int:
    """One pass: rows older than `now - retention_s`, batch after batch; how many went."""
    assert retention_s > 0, retention_s
    before = now - retention_s
    gone = 0
    for _ in range(PRUNE_BATCHES_MAX):
        pruned = await store.prune_history(before, batch)
        gone += pruned
        if pruned == 0:
            break
        await anyio.sleep(PRUNE_PAUSE_S)
    if gone:
        log.info(
            "pruned %d history rows older than %s",
            gone,
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(before)),
            extra={"rows": gone, "retention_s": retention_s},
        )
    return gone


async def run_history_pruning(
    store: EventLog,
    retention_s: float,
    *,
    interval_s: float = HISTORY_PRUNE_INTERVAL_S,
    clock: Callable[[], float] = time.time,
) -> None:
    """A pass every `interval_s` (the first one `interval_s` after the start); a failed pass is
    a warning (once an interval) and the next one tries again. Nothing with retention 0."""
    if retention_s == 0:
        return
    failures = ThrottledWarnings(log, time.monotonic)
    while True:
        await anyio.sleep(interval_s)
        try:
            await prune_history_once(store, retention_s, clock())
        except LevelZeroError as exc:
            failures.warn(
                "prune", "pruning the history tables failed, tried again in %g s: %s", interval_s, exc
            )
