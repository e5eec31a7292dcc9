"""`levelzero backup` copies the log store consistently while the daemon writes; `levelzero
restore` puts it back (refused while a daemon runs); the restored daemon serves what the backup
held, byte for byte, and goes on from there."""

from __future__ import annotations

import json
from pathlib import Path

import anyio

from daemon_support import daemon_and_client

from levelzero.cli.main import main


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
