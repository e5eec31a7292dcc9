"""`levelzero run` freezes the heap start-up built (the collector then skips it); a daemon run
in-process, sharing its process with a test or the demo, never does."""

from __future__ import annotations

import gc
from pathlib import Path

import anyio
from daemon_support import daemon_config

from levelzero.daemon.service import Daemon, running_daemon


async def test_a_daemon_that_owns_its_process_freezes_its_start_up_heap(tmp_path: Path) -> None:
    config = daemon_config(tmp_path / "data")
    assert gc.get_freeze_count() == 0
    async with running_daemon(config) as shared:  # in-process: never freezes
        assert shared.node is not None
        await shared.node.create_topic("t", 2)
        assert gc.get_freeze_count() == 0

    try:
        daemon = Daemon(config, freeze_heap_at_start=True)
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            assert daemon.lifecycle.ready and gc.get_freeze_count() > 0
            seen = {id(o) for o in gc.get_objects()}  # the collector's view: nothing frozen
            assert daemon.node is not None and len(daemon.node.partitions()) == 2
            assert id(daemon.node) not in seen  # built before the freeze
            assert all(id(p) in seen for p in daemon.node.partitions())  # replayed after it
            daemon.request_stop("test over")
        assert daemon.stopped_cleanly
    finally:
        gc.unfreeze()
