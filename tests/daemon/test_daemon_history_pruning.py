"""The control plane's history tables are pruned by age while the daemon runs
(`control.history_retention_s`): they grew without end (a soak test: ~85 KB a minute of fence
events, state samples, GC rounds and deleted L0 objects' rows under a steady load)."""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path

import anyio
import pytest
from daemon_support import daemon_config

from levelzero.config import ConfigError
from levelzero.daemon.history_pruning import prune_history_once
from levelzero.daemon.service import Daemon
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.protocols import FenceEventRow

WAIT_S = 20.0


def event(at: float) -> FenceEventRow:
    return FenceEventRow(at, 1, 1, 1, "admitted", 1, 1, 1)


async def test_a_pass_prunes_batch_after_batch_and_says_how_many(caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryLogStore()
    await store.record_fence_events([event(float(t)) for t in range(25)] + [event(1000.0)])
    with caplog.at_level(logging.INFO, logger="levelzero.daemon"):
        assert await prune_history_once(store, retention_s=3600.0, now=3600.0 + 20, batch=7) == 20
    assert [e.at for e in store.fence_events] == [*map(float, range(20, 25)), 1000.0]
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith("pruned 20 history rows older than 1970-01-01T00:00:20Z"), said


async def test_the_running_daemon_prunes_what_is_older_than_the_retention(tmp_path: Path) -> None:
    config = daemon_config(tmp_path, control__history_retention_s=3600.0)
    daemon = Daemon(config)
    daemon.history_prune_interval_s = 0.05
    now = time.time()
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        assert daemon.node is not None
        store = daemon.node.log_store
        await store.record_fence_events([event(now - 7200), event(now - 7100), event(now - 10)])

        def ats() -> list[float]:
            with sqlite3.connect(config.storage.db_path) as db:
                rows = db.execute("SELECT at FROM fence_events ORDER BY rowid").fetchall()
            db.close()
            return [row[0] for row in rows]

        with anyio.fail_after(WAIT_S):
            while len(ats()) != 1:
                await anyio.sleep(0.05)
        assert ats() == [now - 10]
        daemon.request_stop("the test")


@pytest.mark.parametrize("retention_s", [1.0, 3599.0, -5.0, 3651 * 86_400.0])
def test_a_retention_out_of_bounds_is_refused(tmp_path: Path, retention_s: float) -> None:
    with pytest.raises(ConfigError, match="history_retention_s must be 0"):
        daemon_config(tmp_path, control__history_retention_s=retention_s)
