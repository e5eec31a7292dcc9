"""`levelzero backup` copies the log store consistently while the daemon writes; `levelzero
restore` puts it back (refused while a daemon runs); the restored daemon serves what the backup
held, byte for byte, and goes on from there."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from daemon_support import daemon_and_client

from levelzero.cli.main import main
from levelzero.daemon import backup as backup_module
from levelzero.storage.sqlite import readonly


def records(n: int, tag: str) -> list[tuple[bytes | None, bytes]]:
    return [(f"k{i}".encode(), f"{tag}-{i}".encode() * 3) for i in range(n)]


async def test_backup_while_running_then_restore_serves_what_the_backup_held(tmp_path: Path, capsys) -> None:
    data = tmp_path / "data"
    dest = tmp_path / "backup"
    async with daemon_and_client(data) as (daemon, client):
        await client.create_topic("t", 2)
        for p in (0, 1):
            await client.produce("t", p, records(50, f"before{p}"))
        assert main(["backup", str(dest), "--data-dir", str(data)]) == 0  # the daemon keeps running
        await client.produce("t", 0, records(7, "after"))  # not in the backup
        assert (await client.fetch("t", 0, 0, None)).high_watermark == 57
    out = capsys.readouterr().out
    assert f"backed up {data} to {dest}: cluster epoch 1, 2 partitions" in out
    manifest = json.loads((dest / "backup.json").read_text())
    assert manifest["partitions"] == 2 and manifest["cluster_id"] == (data / "cluster-id").read_text().strip()
    assert sorted(p.name for p in dest.iterdir()) == ["backup.json", "cluster-id", "levelzero.db"]

    # `restore` ends by adopting L1 objects from the bucket, on an event loop of its own.
    assert await anyio.to_thread.run_sync(main, ["restore", str(dest), "--data-dir", str(data)]) == 0
    assert len(list(data.glob("levelzero.db.replaced-*"))) == 1  # the replaced store is kept
    async with daemon_and_client(data) as (daemon, client):
        for p in (0, 1):
            fetched = await client.fetch("t", p, 0, None)
            assert fetched.high_watermark == 50  # what the backup held; later records are not
            assert [(r.key, r.value) for r in fetched.records] == records(50, f"before{p}")
        ack = await client.produce("t", 0, records(1, "restored"))
        assert ack.base_offset == 50  # it goes on from the backup's end


async def test_restore_is_refused_while_the_daemon_runs(tmp_path: Path, capsys) -> None:
    data = tmp_path / "data"
    async with daemon_and_client(data) as (daemon, client):
        await client.create_topic("t", 1)
        assert main(["backup", str(tmp_path / "b"), "--data-dir", str(data)]) == 0
        argv = ["restore", str(tmp_path / "b"), "--data-dir", str(data)]  # on a loop of its own
        assert await anyio.to_thread.run_sync(main, argv) == 1
        assert "is open by a running daemon: stop it first" in capsys.readouterr().err
        assert (await client.fetch("t", 0, 0, None)).high_watermark == 0  # untouched, still serving


async def test_backup_of_a_stopped_store_and_bad_destinations(tmp_path: Path, capsys) -> None:
    data = tmp_path / "data"
    async with daemon_and_client(data) as (daemon, client):
        await client.create_topic("t", 3)
    assert main(["backup", str(tmp_path / "b"), "--data-dir", str(data)]) == 0
    assert "3 partitions" in capsys.readouterr().out
    assert main(["backup", str(tmp_path / "b"), "--data-dir", str(data)]) == 1
    assert "exists and is not an empty directory" in capsys.readouterr().err
    assert main(["backup", str(tmp_path / "c"), "--data-dir", str(tmp_path / "nothing")]) == 1
    assert "no log store at" in capsys.readouterr().err
    assert main(["restore", str(tmp_path / "nothing"), "--data-dir", str(data)]) == 1
    assert "is not a levelzero backup" in capsys.readouterr().err


async def test_recover_is_refused_while_the_daemon_runs(tmp_path: Path, capsys) -> None:
    data = tmp_path / "data"
    async with daemon_and_client(data) as (daemon, client):
        await client.create_topic("t", 1)
        argv = ["recover", "--from-bucket", "--data-dir", str(data)]
        assert await anyio.to_thread.run_sync(main, argv) == 1
        err = capsys.readouterr().err
        assert "is already open by another log store" in err and err.count("\n") == 1, err
        assert (await client.fetch("t", 0, 0, None)).high_watermark == 0  # untouched, still serving


async def test_backup_to_a_destination_that_cannot_be_made_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    data = tmp_path / "data"
    async with daemon_and_client(data) as (daemon, client):
        await client.create_topic("t", 1)
    (tmp_path / "somefile").write_text("x")
    for destination, why in (
        (tmp_path / "somefile" / "x", "a part of the path is a file, not a directory"),
        (Path("/proc/levelzero-backup"), "cannot create directory /proc/levelzero-backup"),
    ):
        assert main(["backup", str(destination), "--data-dir", str(data)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("levelzero: backup destination: ") and why in err, err
        assert err.count("\n") == 1, err
    assert main(["backup", str(tmp_path / "b"), "--data-dir", str(data)]) == 0
    capsys.readouterr()
    argv = ["restore", str(tmp_path / "b"), "--data-dir", str(tmp_path / "somefile" / "d")]
    assert await anyio.to_thread.run_sync(main, argv) == 2
    err = capsys.readouterr().err
    why = "a part of the path is a file, not a directory"
    assert err == f"levelzero: storage.data_dir: {tmp_path}/somefile/d: {why}\n"


async def test_backup_and_restore_on_a_postgres_control_plane_are_refused(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    data = tmp_path / "data"
    async with daemon_and_client(data) as (daemon, client):
        await client.create_topic("t", 1)
    assert main(["backup", str(tmp_path / "b"), "--data-dir", str(data)]) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in data.iterdir() if p.is_file()}
    monkeypatch.setenv("LEVELZERO_CONTROL_KIND", "postgres")
    monkeypatch.setenv("LEVELZERO_CONTROL_DSN", "postgresql://u@127.0.0.1:1/db")
    argv = ["restore", str(tmp_path / "b"), "--data-dir", str(data)]
    assert await anyio.to_thread.run_sync(main, argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the control plane is PostgreSQL" in err, err
    assert "pg_restore" in err and "levelzero recover --from-bucket" in err and "nothing was changed" in err
    assert {p.name: p.read_bytes() for p in data.iterdir() if p.is_file()} == before  # cluster-id too
    assert main(["backup", str(tmp_path / "c"), "--data-dir", str(data)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the control plane is PostgreSQL" in err and "pg_dump" in err, err
    assert "no log store" not in err and not (tmp_path / "c").exists()


async def test_restore_of_another_clusters_backup_is_refused_before_anything_is_written(
    tmp_path: Path, capsys
) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for data in (ours, theirs):  # two clusters, each with its own objects (data_dir/objects)
        async with daemon_and_client(data) as (daemon, client):
            await client.create_topic("t", 1)
    assert main(["backup", str(tmp_path / "b"), "--data-dir", str(theirs)]) == 0
    capsys.readouterr()
    before = sorted((p.name, p.read_bytes() if p.is_file() else b"") for p in ours.rglob("*"))
    argv = ["restore", str(tmp_path / "b"), "--data-dir", str(ours)]
    assert await anyio.to_thread.run_sync(main, argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("levelzero: refusing to restore, nothing was changed:"), (
        err
    )
    their_id = (theirs / "cluster-id").read_text().strip()
    assert f"belongs to levelzero cluster {(ours / 'cluster-id').read_text().strip()}" in err
    assert f"but the backup {tmp_path / 'b'} is cluster {their_id}" in err
    assert sorted((p.name, p.read_bytes() if p.is_file() else b"") for p in ours.rglob("*")) == before
    async with daemon_and_client(ours) as (daemon, client):  # still starts, as it was
        assert (await client.fetch("t", 0, 0, None)).high_watermark == 0


def _can_bind_mount_read_only(directory: Path) -> bool:
    probe = f"mount --bind {directory} {directory} && mount -o remount,ro,bind {directory}"
    return subprocess.run(["unshare", "-rm", "sh", "-c", probe], capture_output=True).returncode == 0


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare")
async def test_export_and_backup_of_a_store_on_a_read_only_file_system(tmp_path: Path) -> None:
    """A read-only bind mount (in a mount namespace of its own): read-only even for root."""
    data, ro = tmp_path / "data", tmp_path / "ro"
    ro.mkdir()
    if not _can_bind_mount_read_only(ro):
        pytest.skip("read-only bind mounts are not available here")
    async with daemon_and_client(data) as (daemon, client):
        await client.create_topic("t", 2)
        await client.produce("t", 0, records(5, "x"))
    cli = f"{shlex.quote(sys.executable)} -m levelzero.cli"
    script = (
        f"mount --bind {data} {ro} && mount -o remount,ro,bind {ro} && "
        f"{cli} export --data-dir {ro} --out {tmp_path / 'out'} && "
        f"{cli} backup {tmp_path / 'b'} --data-dir {ro}"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, cwd=root)
    assert done.returncode == 0, done.stderr
    assert f"backed up {ro} to {tmp_path / 'b'}: cluster epoch" in done.stdout
    assert json.loads((tmp_path / "b" / "backup.json").read_text())["partitions"] == 2
    assert not list(data.glob("levelzero.db-*"))  # nothing was made beside the store


async def test_a_store_sqlite_cannot_open_read_only_says_why(tmp_path: Path, capsys, monkeypatch) -> None:
    """Where the directory is not writable, SQLite cannot create levelzero.db-shm; as root (the
    tests' user) a dangling symlink in its place makes SQLite fail the same way, and the checks
    of the directory (a read-only file system, write permission) are stood in for."""
    data = tmp_path / "data"
    async with daemon_and_client(data) as (daemon, client):
        await client.create_topic("t", 2)
    (data / "levelzero.db-shm").symlink_to(tmp_path / "nowhere" / "shm")
    db = data / "levelzero.db"

    monkeypatch.setattr(readonly, "_writable", lambda directory: False)  # another user's directory
    assert main(["backup", str(tmp_path / "b1"), "--data-dir", str(data)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot open {db} read-only: SQLite reads it through" in err, err
    assert f"{data} is not writable by this user (permission denied)" in err
    assert main(["export", "--data-dir", str(data), "--out", str(tmp_path / "out")]) != 0
    err = capsys.readouterr().err
    assert (
        f"{data} is not writable by this user (permission denied)" in err
        and "not a levelzero store" not in err
    )

    monkeypatch.setattr(readonly, "_file_system_read_only", lambda directory: True)  # nothing to replay
    assert main(["backup", str(tmp_path / "b2"), "--data-dir", str(data)]) == 0
    assert "2 partitions" in capsys.readouterr().out
    assert main(["export", "--data-dir", str(data), "--out", str(tmp_path / "out")]) == 0
    capsys.readouterr()

    (data / "levelzero.db-wal").write_bytes(b"\0" * 32)  # a log to replay: immutable would skip it
    assert main(["backup", str(tmp_path / "b3"), "--data-dir", str(data)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "read-only file system and has a write-ahead log" in err, err


async def test_a_restore_run_again_after_a_kill_before_the_swap_keeps_the_store_it_replaces(
    tmp_path: Path,
) -> None:
    # Killed after writing its marker, before renaming the store it replaces: the store in the
    # data directory is still the original. The restore run again keeps it (renamed, never
    # deleted), each replaced store under a name of its own.
    data = tmp_path / "data"
    async with daemon_and_client(data) as (daemon, client):
        await client.create_topic("t", 1)
    assert main(["backup", str(tmp_path / "b"), "--data-dir", str(data)]) == 0
    original = (data / "levelzero.db").read_bytes()
    (data / backup_module.RESTORE_MARKER).write_text("{}\n")  # what the kill left
    backup_module.restore(str(tmp_path / "b"), str(data))
    backup_module.restore(str(tmp_path / "b"), str(data))  # again, within the same second
    kept = sorted(data.glob("levelzero.db.replaced-*"))
    assert len(kept) == 2 and kept[0].read_bytes() == original
    assert (data / backup_module.RESTORE_MARKER).exists()  # the adoption is still to run


async def test_a_half_restored_data_directory_is_neither_backed_up_nor_recovered(
    tmp_path: Path, capsys
) -> None:
    # A restore killed before its adoption: a backup of it would hold a store the daemon refuses
    # to start on, and a recover would write to it and leave the marker (only the restore run
    # again finishes it).
    data = tmp_path / "data"
    async with daemon_and_client(data) as (daemon, client):
        await client.create_topic("t", 1)
    assert main(["backup", str(tmp_path / "b"), "--data-dir", str(data)]) == 0
    backup_module.restore(str(tmp_path / "b"), str(data))  # the copy, not the adoption
    capsys.readouterr()
    assert main(["backup", str(tmp_path / "c"), "--data-dir", str(data)]) == 1
    assert "refusing to back up: a restore into" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
    before = (data / "levelzero.db").read_bytes()
    argv = ["recover", "--from-bucket", "--data-dir", str(data)]
    assert await anyio.to_thread.run_sync(main, argv) == 1
    assert "refusing to recover, nothing was changed: a restore into" in capsys.readouterr().err
    assert (data / "levelzero.db").read_bytes() == before
    assert (
        await anyio.to_thread.run_sync(main, ["restore", str(tmp_path / "b"), "--data-dir", str(data)]) == 0
    )
    out = capsys.readouterr().out
    assert out.splitlines()[-2] == f"restored {tmp_path / 'b'} into {data}"
    assert not (data / backup_module.RESTORE_MARKER).exists()


async def test_a_backup_is_as_private_as_the_store_it_copies(tmp_path: Path) -> None:
    """A store at 0600 in a 0700 directory was backed up as 0644 files (the umask's): the
    copy's files take the store's mode, a new backup directory the data directory's."""
    data = tmp_path / "data"
    async with daemon_and_client(data) as (_, client):
        await client.create_topic("t", 1)
    data.chmod(0o700)
    (data / "levelzero.db").chmod(0o600)
    previous = os.umask(0o022)
    try:
        assert main(["backup", str(tmp_path / "backup"), "--data-dir", str(data)]) == 0
    finally:
        os.umask(previous)
    dest = tmp_path / "backup"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o700
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in dest.iterdir()}
    assert modes == {"backup.json": 0o600, "cluster-id": 0o600, "levelzero.db": 0o600}
