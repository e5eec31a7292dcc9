"""Restore without holes, and recovery from the bucket alone (S3 on moto; SQLite and PostgreSQL).

A backup taken while records are unreconciled, then restored after the live reconciler copied
them to L1 and the live GC deleted their L0 objects: `levelzero restore` re-adopts the L1
objects the restored metastore does not know, so every record the backup acknowledged reads
back. A control plane lost entirely (the SQLite file and data directory, or the PostgreSQL
database): `levelzero recover --from-bucket` rebuilds topics and partitions from the topic
records and L1 keys, and the L1 metastore from the L1 objects; every reconciled record reads back.

The GC is driven by the test (paused, no grace, advanced epochs, the housekeeper forced), so
every round is one it asked for."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import anyio
import asyncpg
import pytest
from daemon_support import DaemonProcess, daemon_and_client, postgres_control, postgres_overrides, s3_environ

from levelzero.core.keys import L0_ROOT
from levelzero.daemon.ownership import StoreOwnedByAnotherCluster
from levelzero.cli.commands import leaf_errors
from levelzero.cli.main import main
from levelzero.client import Client
from levelzero.daemon import backup as backup_module

pytestmark = pytest.mark.s3

WAIT_S = 30.0
ROUNDS_MAX = 16
QUIET = {
    "gc__enabled": False,
    "gc__grace_s": 0.0,
    "reconciler__interval_s": 0.05,
    "housekeeper__enabled": False,
}
NO_RECONCILER = {**QUIET, "reconciler__enabled": False}

Records = list[tuple[bytes | None, bytes]]


def records(n: int, tag: str) -> Records:
    return [
        (None if i % 7 == 0 else f"k{i}".encode(), f"{tag}-{i}:".encode() + bytes([i % 251]) * (i % 40))
        for i in range(n)
    ]


async def cli(*argv: str) -> int:
    """`levelzero ARGV` (it runs an event loop of its own: in a thread)."""
    return await anyio.to_thread.run_sync(main, list(argv))


def s3_overrides(endpoint, bucket: str) -> dict[str, object]:
    return {
        "storage__kind": "s3",
        "s3__endpoint": endpoint.endpoint_url,
        "s3__bucket": bucket,
        "s3__region": endpoint.region,
        "s3__path_style": True,
        "s3__access_key": endpoint.access_key,
        "s3__secret_key": endpoint.secret_key,
    }


async def read_all(client: Client, topic: str, partition: int) -> Records:
    got: Records = []
    offset = 0
    for _ in range(10_000):
        fetched = await client.fetch(topic, partition, offset)
        if not fetched.records:
            return got
        got += [(r.key, r.value) for r in fetched.records]
        offset = fetched.next_offset
    raise AssertionError("the fetch loop did not end")


async def wait_reconciled(client: Client) -> None:
    with anyio.fail_after(WAIT_S):
        while (await client.status()).reconciler.lag_offsets:
            await anyio.sleep(0.02)


def l0_keys(endpoint, bucket: str) -> set[str]:
    s3 = endpoint.boto3_client()
    keys = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=L0_ROOT):
        keys.update(item["Key"] for item in page.get("Contents", []))
    return keys


async def collect_until(client: Client, done: Callable[[], bool]) -> int:
    """GC rounds (advance the epoch, reconcile, housekeep, collect) until `done()`; the rounds."""
    for rounds in range(1, ROUNDS_MAX + 1):
        await client.advance_epoch()
        await wait_reconciled(client)
        await client.run_housekeeper(force=True)
        report = await client.gc_run()
        assert report.m is not None, report  # nothing blocks the GC
        if done():
            return rounds
    raise AssertionError(f"not done after {ROUNDS_MAX} GC rounds")


async def produce_all(client: Client, topic: str, partition: int, batches: list[Records]) -> None:
    for batch in batches:
        await client.produce(topic, partition, batch)


async def restore_scenario(
    data: Path,
    endpoint,
    bucket: str,
    settings: dict[str, object],
    take_backup: Callable[[], None],
    restore: Callable[[], Awaitable[None]],
    placeholder_keys: Callable[[], set[str]],
) -> None:
    a0 = [records(25, f"a0-{i}") for i in range(4)]
    a1 = [records(20, f"a1-{i}") for i in range(3)]
    # 1. Nothing is reconciled when the backup is taken; p0 gets more records after it (the
    #    live reconciler will copy records of both sides of the backup into one object).
    async with daemon_and_client(data, **settings, **NO_RECONCILER) as (_, client):
        await client.create_topic("t", 2)
        await produce_all(client, "t", 0, a0)
        await produce_all(client, "t", 1, a1)
        take_backup()
        await produce_all(client, "t", 0, [records(10, "after-backup")])
    acknowledged = placeholder_keys()
    assert acknowledged and acknowledged <= l0_keys(endpoint, bucket)
    # 2. The live daemon goes on: it reconciles, takes more records, and its GC deletes the L0
    #    objects of every record the backup acknowledged.
    async with daemon_and_client(data, **settings, **QUIET) as (_, client):
        await wait_reconciled(client)
        await produce_all(client, "t", 1, [records(5, "later")])
        await produce_all(client, "t", 0, [records(5, "later")])
        await collect_until(client, lambda: not acknowledged & l0_keys(endpoint, bucket))
    # 3. Restore; 4. everything the backup acknowledged reads back, byte for byte.
    await restore()
    async with daemon_and_client(data, **settings, **QUIET) as (_, client):
        assert await read_all(client, "t", 0) == [r for batch in a0 for r in batch]
        assert await read_all(client, "t", 1) == [r for batch in a1 for r in batch]
        status = await client.status()
        assert status.reconciler.failing == [] and status.m is not None
        ack = await client.produce("t", 0, records(3, "restored"))
        assert ack.base_offset == 100  # it goes on from the backup's end
        await collect_until(client, lambda: not l0_keys(endpoint, bucket))  # orphans included
        assert (await client.status()).reconciler.failing == []
        assert (await read_all(client, "t", 0))[100:] == records(3, "restored")


def _print_lines(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.err == "", captured.err
    return captured.out


def sqlite_backup(data: Path, backup_dir: Path) -> None:
    assert main(["backup", str(backup_dir), "--data-dir", str(data)]) == 0


def backup_placeholder_keys(backup_dir: Path) -> set[str]:
    """The L0 keys a SQLite backup's placeholders name."""
    with sqlite3.connect(backup_dir / "levelzero.db") as db:
        return {key for (key,) in db.execute("SELECT object_key FROM log WHERE kind = 'placeholder'")}


def assert_adopted(out: str) -> None:
    """t/0's one object also holds the records written after the backup: its first 100 are
    copied into a new object; t/1's is adopted as it is."""
    assert "adopted 2 L1 objects found in the bucket into 2 partitions" in out, out
    assert "t/0: LRO -1 -> 99, high watermark 100, 1 L1 object adopted (1 copied)" in out, out
    assert "t/1: LRO -1 -> 59, high watermark 60, 1 L1 object adopted\n" in out, out


async def test_restore_readopts_what_the_live_gc_moved_to_l1_sqlite(
    tmp_path: Path,
    s3_endpoint,
    s3_bucket: str,
    monkeypatch,
    capsys,
) -> None:
    data, backup_dir = tmp_path / "data", tmp_path / "backup"
    for name, value in s3_environ(s3_endpoint, s3_bucket).items():
        monkeypatch.setenv(name, value)  # what `levelzero restore` reads its object store from

    async def restore() -> None:
        assert await cli("restore", str(backup_dir), "--data-dir", str(data)) == 0
        assert_adopted(_print_lines(capsys))

    await restore_scenario(
        data,
        s3_endpoint,
        s3_bucket,
        s3_overrides(s3_endpoint, s3_bucket),
        partial(sqlite_backup, data, backup_dir),
        restore,
        partial(backup_placeholder_keys, backup_dir),
    )


async def test_an_interrupted_restore_keeps_the_daemon_from_starting_until_run_again(
    tmp_path: Path,
    s3_endpoint,
    s3_bucket: str,
    monkeypatch,
    capsys,
) -> None:
    data, backup_dir = tmp_path / "data", tmp_path / "backup"
    environ = s3_environ(s3_endpoint, s3_bucket)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)

    async def restore() -> None:
        # What a SIGKILL between the database's replacement and the end of the adoption leaves.
        backup_module.restore(str(backup_dir), str(data))
        assert (data / "levelzero.restoring").exists()
        daemon = DaemonProcess(data, tmp_path, env=environ).start(wait=False)
        assert daemon.proc is not None
        assert daemon.proc.wait(timeout=30) == 2  # refused, as a store it must not use
        refusal = [line for line in daemon.log().splitlines() if line.startswith("levelzero: ")]
        assert refusal == [
            f"levelzero: a restore into {data} did not finish ({data / 'levelzero.restoring'} is "
            f"there): run `levelzero restore {backup_dir} --config …` again (the same command, this "
            "daemon's configuration) before starting the daemon"
        ], daemon.log()
        capsys.readouterr()
        assert await cli("restore", str(backup_dir), "--data-dir", str(data)) == 0  # completes it
        assert_adopted(_print_lines(capsys))
        assert not (data / "levelzero.restoring").exists()

    await restore_scenario(
        data,
        s3_endpoint,
        s3_bucket,
        s3_overrides(s3_endpoint, s3_bucket),
        partial(sqlite_backup, data, backup_dir),
        restore,
        partial(backup_placeholder_keys, backup_dir),
    )


def l1_keys(endpoint, bucket: str, topic: str) -> set[str]:
    s3 = endpoint.boto3_client()
    keys = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"level_one/{topic}/"):
        keys.update(item["Key"] for item in page.get("Contents", []))
    return keys


async def test_restore_drops_the_topics_deleted_after_the_backup(
    tmp_path: Path, s3_endpoint, s3_bucket: str, monkeypatch, capsys
) -> None:
    data, backup_dir = tmp_path / "data", tmp_path / "backup"
    for name, value in s3_environ(s3_endpoint, s3_bucket).items():
        monkeypatch.setenv(name, value)
    settings = {**s3_overrides(s3_endpoint, s3_bucket), **QUIET}
    kept, gone, again = records(30, "kept"), records(100, "gone"), records(20, "again")
    async with daemon_and_client(data, **settings) as (_, client):
        for topic in ("keep", "tdel", "tre"):
            await client.create_topic(topic, 1)
        await client.produce("keep", 0, kept)
        await client.produce("tdel", 0, gone)
        await client.produce("tre", 0, gone)
        await wait_reconciled(client)
        assert main(["backup", str(backup_dir), "--data-dir", str(data)]) == 0
        old_tre = l1_keys(s3_endpoint, s3_bucket, "tre")
        await client.delete_topic("tdel")
        await client.delete_topic("tre")
        await client.create_topic("tre", 1)  # made again: a record and L1 objects of its own
        await client.produce("tre", 0, again)
        await wait_reconciled(client)
        new_tre = l1_keys(s3_endpoint, s3_bucket, "tre") - old_tre
        assert old_tre and new_tre
        await collect_until(
            client,
            lambda: (
                not l1_keys(s3_endpoint, s3_bucket, "tdel")
                | (l1_keys(s3_endpoint, s3_bucket, "tre") & old_tre)
            ),
        )
        assert l1_keys(s3_endpoint, s3_bucket, "tre") == new_tre  # only the deleted one's went
    capsys.readouterr()
    assert await cli("restore", str(backup_dir), "--data-dir", str(data)) == 0
    out = _print_lines(capsys)
    assert (
        "dropped topic tdel: its topic record levelzero/topics/tdel is gone and none of the 1 L1 "
        "object the restored control plane names for it is in the bucket: deleted after the backup\n"
    ) in out, out
    assert "dropped topic tre: its topic record levelzero/topics/tre was written at " in out, out
    assert "deleted and made again after the backup\n" in out, out
    async with daemon_and_client(data, **settings) as (_, client):
        assert sorted(t.name for t in await client.list_topics()) == ["keep"]
        assert await read_all(client, "keep", 0) == kept
        status = await client.status()
        assert status.reconciler.failing == [] and status.m is not None
        await client.create_topic("tdel", 1)  # the name is free again, and starts empty
        assert await read_all(client, "tdel", 0) == []
        await client.gc_run()  # the dropped partitions' rows are collected; nothing else goes
        assert l1_keys(s3_endpoint, s3_bucket, "tre") == new_tre


async def _admin(dsn: str, statement: str) -> None:
    admin = dsn.rsplit("/", 1)[0] + "/postgres"
    connection = await asyncpg.connect(admin)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


async def _recreate(dsn: str) -> None:
    database = dsn.rsplit("/", 1)[1]
    await _admin(dsn, f'DROP DATABASE "{database}" WITH (FORCE)')
    await _admin(dsn, f'CREATE DATABASE "{database}"')


def _postgres_env(monkeypatch, dsn: str, endpoint, bucket: str) -> None:
    for name, value in {**s3_environ(endpoint, bucket), **postgres_control(dsn)}.items():
        monkeypatch.setenv(name, value)


async def test_restore_readopts_what_the_live_gc_moved_to_l1_postgres(
    tmp_path: Path,
    s3_endpoint,
    s3_bucket: str,
    postgres_dsn: str,
    monkeypatch,
    capsys,
) -> None:
    if shutil.which("pg_dump") is None or shutil.which("pg_restore") is None:
        pytest.fail("pg_dump and pg_restore must be on PATH (they come with the server binaries)")
    data, dump = tmp_path / "data", tmp_path / "levelzero.dump"
    _postgres_env(monkeypatch, postgres_dsn, s3_endpoint, s3_bucket)

    def take_backup() -> None:  # PostgreSQL's own backup, while the daemon writes
        subprocess.run(["pg_dump", "--format=custom", "--file", str(dump), postgres_dsn], check=True)

    async def restore() -> None:
        await _recreate(postgres_dsn)
        subprocess.run(["pg_restore", "--dbname", postgres_dsn, str(dump)], check=True)
        assert await cli("recover", "--from-bucket", "--data-dir", str(data)) == 0
        assert_adopted(_print_lines(capsys))

    def placeholder_keys() -> set[str]:
        listed = subprocess.run(
            ["pg_restore", "--data-only", "--table=log", "--file=-", str(dump)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return {word for line in listed.splitlines() for word in line.split("\t") if word.startswith(L0_ROOT)}

    await restore_scenario(
        data,
        s3_endpoint,
        s3_bucket,
        {**s3_overrides(s3_endpoint, s3_bucket), **postgres_overrides(postgres_dsn)},
        take_backup,
        restore,
        placeholder_keys,
    )


async def recover_scenario(
    data: Path,
    endpoint,
    bucket: str,
    settings: dict[str, object],
    lose_control_plane: Callable[[], Awaitable[None]],
    capsys,
    *,
    refused_start_first: bool = False,
) -> None:
    """`refused_start_first`: an operator's slip, a daemon started on the new, empty control
    plane before the rebuild. The bucket refuses it (it is the lost control plane's cluster's),
    and it made an id there: the rebuild was then refused too, with advice that pointed away
    from it. The refusal says to rebuild now, and the rebuild takes the bucket's id."""
    t0 = [records(30, f"t0-{i}") for i in range(3)]
    t2 = [records(12, "t2")]
    u0 = [records(40, "u0")]
    async with daemon_and_client(data, **settings, **QUIET) as (_, client):
        await client.create_topic("t", 3)
        await client.create_topic("u", 1)
        # never written: only its topic record knows it, and its configs
        await client.create_topic("v", 2, {"cleanup.policy": "compact", "retention.ms": "-1"})
        await client.replace_topic_configs("u", {"retention.ms": "604800000"})  # rewrites u's record
        await produce_all(client, "t", 0, t0[:2])
        await produce_all(client, "u", 0, u0)
        await wait_reconciled(client)
        await collect_until(client, lambda: not l0_keys(endpoint, bucket))
        await produce_all(client, "t", 0, t0[2:])
        await produce_all(client, "t", 2, t2)
        await wait_reconciled(client)
    await lose_control_plane()
    if refused_start_first:
        with pytest.raises(BaseException) as refused:  # noqa: PT011 - its leaves, checked below
            async with daemon_and_client(data, **settings, **QUIET):
                raise AssertionError("a daemon started on a store another cluster id owns")
        (leaf,) = leaf_errors(refused.value)
        assert isinstance(leaf, StoreOwnedByAnotherCluster), leaf
        assert "holds no topic" in str(leaf) and "`levelzero recover --from-bucket`" in str(leaf), leaf
    assert await cli("recover", "--from-bucket", "--data-dir", str(data)) == 0
    out = _print_lines(capsys)
    assert (
        "rebuilt the control plane from the bucket: 3 topics (t: 3 partitions, u: 1 partition, "
        "v: 2 partitions)"
    ) in out, out
    assert "topic configs: u (1), v (2)" in out, out
    async with daemon_and_client(data, **settings, **QUIET) as (_, client):
        assert {(t.name, t.partitions) for t in await client.list_topics()} == {("t", 3), ("u", 1), ("v", 2)}
        for topic, expected in (
            ("t", {}),
            ("u", {"retention.ms": "604800000"}),
            ("v", {"cleanup.policy": "compact", "retention.ms": "-1"}),
        ):
            configs = (await client.topic_configs(topic)).configs
            assert {c.name: c.value for c in configs if c.source == "topic"} == expected, topic
        assert await read_all(client, "v", 1) == []
        assert await read_all(client, "t", 0) == [r for batch in t0 for r in batch]
        assert await read_all(client, "t", 1) == []
        assert await read_all(client, "t", 2) == t2[0]
        assert await read_all(client, "u", 0) == u0[0]
        ack = await client.produce("t", 0, records(4, "recovered"))
        assert ack.base_offset == 90
        assert (await read_all(client, "t", 0))[90:] == records(4, "recovered")
        await collect_until(client, lambda: not l0_keys(endpoint, bucket))
        status = await client.status()
        assert status.reconciler.failing == [] and status.m is not None


@pytest.mark.parametrize("refused_start_first", [False, True], ids=["recovered", "started-first"])
async def test_recover_from_the_bucket_after_the_data_directory_is_lost_sqlite(
    tmp_path: Path,
    s3_endpoint,
    s3_bucket: str,
    monkeypatch,
    capsys,
    refused_start_first: bool,
) -> None:
    data = tmp_path / "data"
    for name, value in s3_environ(s3_endpoint, s3_bucket).items():
        monkeypatch.setenv(name, value)

    async def lose() -> None:
        shutil.rmtree(data)  # the SQLite file, its WAL and the cluster id: all gone

    await recover_scenario(
        data,
        s3_endpoint,
        s3_bucket,
        s3_overrides(s3_endpoint, s3_bucket),
        lose,
        capsys,
        refused_start_first=refused_start_first,
    )


async def test_recover_from_the_bucket_after_the_database_is_dropped_postgres(
    tmp_path: Path,
    s3_endpoint,
    s3_bucket: str,
    postgres_dsn: str,
    monkeypatch,
    capsys,
) -> None:
    data = tmp_path / "data"
    _postgres_env(monkeypatch, postgres_dsn, s3_endpoint, s3_bucket)

    async def lose() -> None:
        await _recreate(postgres_dsn)
        shutil.rmtree(data)

    await recover_scenario(
        data,
        s3_endpoint,
        s3_bucket,
        {**s3_overrides(s3_endpoint, s3_bucket), **postgres_overrides(postgres_dsn)},
        lose,
        capsys,
        refused_start_first=True,  # (the plain rebuild: the SQLite test's first case)
    )


def test_recover_needs_a_source(tmp_path: Path, capsys) -> None:
    assert main(["recover", "--data-dir", str(tmp_path)]) == 2
    assert "--from-bucket" in capsys.readouterr().err


async def test_restore_gives_back_what_a_compaction_after_the_backup_kept(
    tmp_path: Path, s3_endpoint, s3_bucket: str, monkeypatch, capsys
) -> None:
    """A compacted topic's 10 keyed records reconciled, a backup, one more record of k3, and a
    compaction pass: it replaced the objects of 0-10 by one keeping the latest record per key
    (offset 3 removed) and deleted them. The restored metastore names the deleted objects;
    the restore copies what the compaction kept at 0-9 into a new compacted object, so reads
    of 0-9 answer what it kept (k3's value at the backup is gone with the record of k3 written
    after it, which the restored history does not have)."""
    data, backup_dir = tmp_path / "data", tmp_path / "backup"
    for name, value in s3_environ(s3_endpoint, s3_bucket).items():
        monkeypatch.setenv(name, value)
    settings = {**s3_overrides(s3_endpoint, s3_bucket), **QUIET, "compactor__interval_s": 0.05}
    history: Records = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(10)]
    configs = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01", "retention.ms": "-1"}
    async with daemon_and_client(data, **settings, compactor__enabled=False) as (_, client):
        await client.create_topic("c", 1, configs)
        await client.produce("c", 0, history)
        await wait_reconciled(client)
        assert main(["backup", str(backup_dir), "--data-dir", str(data)]) == 0
        before = l1_keys(s3_endpoint, s3_bucket, "c")
        await client.produce("c", 0, [(b"k3", b"after-backup")])
        await wait_reconciled(client)
    async with daemon_and_client(data, **settings) as (_, client):
        with anyio.fail_after(WAIT_S):
            while not before.isdisjoint(l1_keys(s3_endpoint, s3_bucket, "c")):
                await anyio.sleep(0.05)
        compacted = await read_all(client, "c", 0)
        assert compacted == [*history[:3], *history[4:], (b"k3", b"after-backup")]
    capsys.readouterr()
    assert await cli("restore", str(backup_dir), "--data-dir", str(data)) == 0
    out = _print_lines(capsys)
    assert "c/0: the L1 objects of offsets 0-9 that the restored control plane names were replaced" in out, (
        out
    )
    async with daemon_and_client(data, **settings) as (_, client):
        fetched = await client.fetch("c", 0, 0)
        assert [r.offset for r in fetched.records] == [0, 1, 2, 4, 5, 6, 7, 8, 9]
        assert await read_all(client, "c", 0) == [*history[:3], *history[4:]]
        fetched = await client.fetch("c", 0, 3)  # a removed offset: the next record present
        assert fetched.records[0].offset == 4
        status = await client.status()
        assert status.reconciler.failing == [] and status.m is not None
