"""After a restore from an older backup, the lost history's L1 objects (no row of the restored
control plane names them) are deleted by the sweep of their partition's prefix, and every
record the restored daemon serves still reads back."""

from __future__ import annotations

import os
import time
from pathlib import Path

import anyio

from daemon_support import daemon_and_client
from levelzero.cli.main import main
from levelzero.client import Client

WAIT_S = 15.0
GRACE_S = 60.0  # the least the config takes: the lost history's objects are made older below
SWEEPING = {"reconciler__interval_s": 0.05, "reconciler__l1_stray_grace_s": GRACE_S}


def records(n: int, tag: str) -> list[tuple[bytes | None, bytes]]:
    return [(f"k{i}".encode(), f"{tag}-{i}".encode()) for i in range(n)]


def l1_files(objects: Path, topic: str, partition: int) -> set[str]:
    """The keys stored under the partition's prefix (`os.walk` skips a directory the daemon
    removes meanwhile)."""
    root = objects / "level_one" / topic / str(partition)
    return {
        os.path.relpath(os.path.join(parent, name), objects)
        for parent, _, names in os.walk(root)
        for name in names
        if not name.startswith(".")
    }


async def wait_reconciled(client: Client) -> None:
    with anyio.fail_after(WAIT_S):
        while (await client.status()).reconciler.lag_offsets:
            await anyio.sleep(0.02)


async def test_a_restore_from_an_older_backup_leaves_no_l1_object_of_the_lost_history(tmp_path: Path) -> None:
    data, dest = tmp_path / "data", tmp_path / "backup"
    objects = data / "objects"
    async with daemon_and_client(data, **SWEEPING) as (_, client):
        await client.create_topic("t", 2)
        for p in (0, 1):
            await client.produce("t", p, records(20, f"kept{p}"))
        await wait_reconciled(client)
        assert main(["backup", str(dest), "--data-dir", str(data)]) == 0
        kept = {p: l1_files(objects, "t", p) for p in (0, 1)}
        for round_ in range(3):  # three L1 objects of the lost history
            await client.produce("t", 0, records(5, f"lost{round_}"))
            await wait_reconciled(client)
    lost = l1_files(objects, "t", 0) - kept[0]
    assert len(lost) == 3 and all(kept.values())

    assert await anyio.to_thread.run_sync(main, ["restore", str(dest), "--data-dir", str(data)]) == 0
    assert l1_files(objects, "t", 0) == kept[0] | lost  # not adopted: nothing was unreconciled
    aged = time.time() - 10 * GRACE_S  # every L1 object, named or not, older than the grace
    for key in kept[0] | kept[1] | lost:
        os.utime(objects / key, (aged, aged))

    async with daemon_and_client(data, **SWEEPING) as (daemon, client):
        assert daemon.node is not None
        # Waited for by the sweep's count, not by the files: the local store deletes on a worker
        # thread, so the files are gone a moment before the sweep counts them.
        with anyio.fail_after(WAIT_S):
            while daemon.node.l1.strays_deleted < 3:
                await anyio.sleep(0.02)
        assert l1_files(objects, "t", 0) == kept[0]
        assert l1_files(objects, "t", 1) == kept[1]
        assert daemon.node.l1.strays_deleted == 3
        assert "levelzero_l1_strays_deleted_total 3.0" in await client.metrics()
        assert (await client.status()).reconciler.l1_strays_deleted == 3
        for p in (0, 1):
            fetched = await client.fetch("t", p, 0, None)
            assert fetched.high_watermark == 20
            assert [(r.key, r.value) for r in fetched.records] == records(20, f"kept{p}")
        ack = await client.produce("t", 0, records(1, "after"))
        assert ack.base_offset == 20
        await wait_reconciled(client)
        fetched = await client.fetch("t", 0, 0, None)
        assert [(r.key, r.value) for r in fetched.records] == records(20, "kept0") + records(1, "after")
