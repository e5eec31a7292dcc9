"""One bucket (+ key prefix) belongs to one cluster: a second cluster's GC would delete the
first one's objects, so a daemon refuses a store claimed by another data directory."""

from __future__ import annotations

import logging

import shutil
from pathlib import Path

import anyio
import pytest

from daemon_support import daemon_config, s3_environ
from levelzero.core.errors import InvalidInput, StoreRefused
from levelzero.cli.commands import leaf_errors
from levelzero.client import ApiError, Client
from levelzero.config import ConfigError, load_config
from levelzero.daemon.ownership import (
    MARKER_KEY,
    StoreOwnedByAnotherCluster,
    claim_store,
    local_cluster_id,
)
from levelzero.daemon.service import Daemon, running_daemon
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.prefixed_store import PrefixedObjectStore, check_key_prefix
from levelzero.storage.protocols import iter_objects


async def test_a_store_claimed_by_another_data_directory_is_refused(tmp_path: Path) -> None:
    store = MemoryObjectStore()
    (tmp_path / "a").mkdir()
    first = local_cluster_id(str(tmp_path / "a"))
    assert local_cluster_id(str(tmp_path / "a")) == first  # stable across restarts
    (tmp_path / "b").mkdir()
    second = local_cluster_id(str(tmp_path / "b"))
    assert first != second
    await claim_store(store, first, "mem://bucket")
    await claim_store(store, first, "mem://bucket")  # the owner again: fine
    with pytest.raises(StoreOwnedByAnotherCluster) as err:
        await claim_store(store, second, "mem://bucket")
    assert first in str(err.value) and second in str(err.value) and "s3.key_prefix" in str(err.value)
    assert (await store.get(MARKER_KEY)).decode().strip() == first


async def test_prefixed_stores_share_a_bucket_without_seeing_each_other() -> None:
    bucket = MemoryObjectStore()
    east, west = PrefixedObjectStore(bucket, "east/"), PrefixedObjectStore(bucket, "west/")
    await east.put("level_zero/data/001/000000000000000001/" + "a" * 32, b"e")
    await west.put("level_zero/data/001/000000000000000001/" + "b" * 32, b"w")
    listed = [o.key async for o in iter_objects(east, "level_zero/data/")]
    assert listed == ["level_zero/data/001/000000000000000001/" + "a" * 32]
    result = await west.delete_many(listed + ["level_zero/data/001/000000000000000001/" + "b" * 32])
    assert sorted(bucket.keys()) == ["east/level_zero/data/001/000000000000000001/" + "a" * 32]
    assert (await east.head(listed[0])).key == listed[0]
    assert "level_zero/data/001/000000000000000001/" + "b" * 32 in result.deleted
    for bad in ("/abs/", "no-slash", "a/../b/", "sp ace/"):
        with pytest.raises(InvalidInput):
            check_key_prefix(bad)


def test_a_bad_key_prefix_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(
            None,
            environ={"LEVELZERO_S3_KEY_PREFIX": "../x"},
            overrides={("storage", "data_dir"): str(tmp_path)},
        )
    assert "s3" in str(err.value) and "key prefix" in str(err.value)


async def test_two_daemons_on_one_local_store_directory_cannot_both_own_it(tmp_path: Path) -> None:
    async with running_daemon(daemon_config(tmp_path / "one")) as daemon, Client(daemon.url) as client:
        await client.create_topic("t", 1)
    config = daemon_config(tmp_path / "two")
    objects_dir = Path(daemon_config(tmp_path / "one").storage.objects_dir)
    # A second data directory pointed at the first one's objects (as two daemons sharing a
    # bucket would be): refused before anything is served or deleted.
    twin = tmp_path / "two"
    twin.mkdir()
    (twin / "objects").symlink_to(objects_dir, target_is_directory=True)
    with pytest.raises(BaseException) as caught:  # noqa: PT011 - may come in an exception group
        async with running_daemon(config):
            pass
    assert any(isinstance(e, StoreOwnedByAnotherCluster) for e in leaf_errors(caught.value))


@pytest.mark.s3
async def test_two_clusters_share_a_bucket_only_under_distinct_key_prefixes(
    tmp_path: Path,
    s3_endpoint,
    s3_bucket: str,
) -> None:
    def s3(data_dir: Path, prefix: str):
        return load_config(
            None,
            environ={
                "LEVELZERO_STORAGE_KIND": "s3",
                "LEVELZERO_S3_ENDPOINT": s3_endpoint.endpoint_url,
                "LEVELZERO_S3_BUCKET": s3_bucket,
                "LEVELZERO_S3_REGION": s3_endpoint.region,
                "LEVELZERO_S3_PATH_STYLE": "true",
                "LEVELZERO_S3_ACCESS_KEY": s3_endpoint.access_key,
                "LEVELZERO_S3_SECRET_KEY": s3_endpoint.secret_key,
                "LEVELZERO_S3_KEY_PREFIX": prefix,
            },
            overrides={
                ("storage", "data_dir"): str(data_dir),
                ("server", "listen"): "127.0.0.1:0",
                ("node", "epoch_bump_interval_s"): 0.0,
            },
        )

    async with (
        running_daemon(s3(tmp_path / "a", "east/")) as a,
        running_daemon(s3(tmp_path / "b", "west/")) as b,
        Client(a.url) as ca,
        Client(b.url) as cb,
    ):
        await ca.create_topic("t", 1)
        await cb.create_topic("t", 1)
        await ca.produce("t", 0, [(None, b"east")])
        await cb.produce("t", 0, [(None, b"west")])
    with pytest.raises(BaseException) as caught:  # noqa: PT011
        async with running_daemon(s3(tmp_path / "c", "east/")):
            pass
    assert any(isinstance(e, StoreOwnedByAnotherCluster) for e in leaf_errors(caught.value))
    keys = [o["Key"] for o in s3_endpoint.boto3_client().list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert {k.split("/")[0] for k in keys} == {"east", "west"}


async def test_a_data_directory_that_lost_its_cluster_id_is_refused_with_nothing_changed(
    tmp_path: Path,
) -> None:
    """A data directory with its control plane but without its `cluster-id`: the start made a
    new id (and migrated the database) and then was refused by the store's marker as "another
    cluster's", advising a bucket of its own. Now refused first, naming the marker's id, with
    the directory as it was; writing that id back starts it with its records."""
    config = daemon_config(tmp_path)
    async with running_daemon(config) as daemon, Client(daemon.url) as client:
        await client.create_topic("t", 1)
        await client.produce("t", 0, [b"kept"])
    data = Path(config.storage.data_dir)
    owner = (data / "cluster-id").read_text().strip()
    (data / "cluster-id").unlink()
    before = {p.name: p.read_bytes() for p in data.iterdir() if p.is_file()}
    with pytest.raises(BaseException) as caught:  # noqa: PT011 - may come in an exception group
        async with running_daemon(config):
            pass
    [refused] = [e for e in leaf_errors(caught.value) if isinstance(e, StoreRefused)]
    assert not isinstance(refused, StoreOwnedByAnotherCluster)
    assert "holds a control plane (levelzero.db) but no cluster-id file" in str(refused)
    assert f"names cluster {owner}: if this directory is that cluster's, `echo {owner} >" in str(refused)
    assert "Nothing was changed in the data directory" in str(refused)
    assert {p.name: p.read_bytes() for p in data.iterdir() if p.is_file()} == before
    (data / "cluster-id").write_text(owner + "\n")
    async with running_daemon(config) as daemon, Client(daemon.url) as client:
        assert [r.value for r in (await client.fetch("t", 0, 0)).records] == [b"kept"]


def test_a_cluster_id_file_holding_no_id_is_refused(tmp_path: Path) -> None:
    (tmp_path / "cluster-id").write_text("garbage\n")
    with pytest.raises(StoreRefused, match="holds 'garbage', not a cluster id"):
        local_cluster_id(str(tmp_path))


async def test_an_empty_unclaimed_store_under_a_control_plane_naming_objects_is_refused(
    tmp_path: Path,
) -> None:
    """A data directory whose control plane names L1 objects, started on an empty store no
    cluster claimed (its objects directory gone: a wrong mount, bucket or key prefix) claimed
    it and reported ready, every read of those objects a 500. Now refused, nothing written to
    the store; the marker written by hand (the objects lost for good) lets it start."""
    config = daemon_config(tmp_path)
    async with running_daemon(config) as daemon, Client(daemon.url) as client:
        await client.create_topic("t", 1)
        await client.produce("t", 0, [b"reconciled"])
        await daemon.node.reconciler.run_round()
        assert daemon.node.partition("t", 0).state.lro == 0
    objects = Path(config.storage.objects_dir)
    cluster_id = (Path(config.storage.data_dir) / "cluster-id").read_text().strip()
    shutil.rmtree(objects)
    with pytest.raises(BaseException) as caught:  # noqa: PT011 - may come in an exception group
        async with running_daemon(config):
            pass
    [refused] = [e for e in leaf_errors(caught.value) if isinstance(e, StoreRefused)]
    message = str(refused)
    assert f"object store {objects} is no cluster's and does not hold level_one/t/0/" in message, message
    assert f"{cluster_id} into {MARKER_KEY} in the store" in message
    assert not objects.exists() or not any(objects.rglob("*"))  # nothing written
    (objects / "levelzero").mkdir(parents=True)
    (objects / MARKER_KEY).write_text(cluster_id + "\n")
    async with running_daemon(config) as daemon, Client(daemon.url) as client:
        assert (await client.status()).partitions[0].high_watermark == 1


async def test_a_store_emptied_while_running_is_refused_at_the_next_start_though_no_longer_empty(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The bucket emptied under a running daemon: what it wrote since (new L0 objects, its
    health probe) left it non-empty, and the next start claimed it, ready, every read of the
    lost objects a 500. An object the control plane names is looked for, whatever else the
    store holds. A store that lost its marker alone is claimed again, with a warning."""
    config = daemon_config(tmp_path)
    objects = Path(config.storage.objects_dir)
    async with running_daemon(config) as daemon, Client(daemon.url) as client:
        await client.create_topic("t", 1)
        await client.produce("t", 0, [b"reconciled"])
        await daemon.node.reconciler.run_round()
        assert daemon.node.partition("t", 0).state.lro == 0
        for child in objects.iterdir():  # emptied while running
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        await client.produce("t", 0, [b"after"])  # the store holds this one's L0 object
    assert any(p.is_file() for p in objects.rglob("*"))
    with pytest.raises(BaseException) as caught:  # noqa: PT011 - may come in an exception group
        async with running_daemon(config):
            pass
    [refused] = [e for e in leaf_errors(caught.value) if isinstance(e, StoreRefused)]
    assert "does not hold level_one/t/0/" in str(refused), refused
    assert not (objects / MARKER_KEY).exists()  # nothing written

    config = daemon_config(tmp_path / "kept")
    async with running_daemon(config) as daemon, Client(daemon.url) as client:
        await client.create_topic("t", 1)
        await client.produce("t", 0, [b"reconciled"])
        await daemon.node.reconciler.run_round()
    (Path(config.storage.objects_dir) / MARKER_KEY).unlink()  # the marker alone lost
    with caplog.at_level(logging.INFO, logger="levelzero.daemon"):
        async with running_daemon(config) as daemon, Client(daemon.url) as client:
            assert [r.value for r in (await client.fetch("t", 0, 0)).records] == [b"reconciled"]
    [claimed] = [r for r in caplog.records if "claimed object store" in r.getMessage()]
    assert claimed.levelno == logging.WARNING and "again: it had no marker" in claimed.getMessage()


async def test_a_first_start_that_fails_before_its_claim_starts_the_next_time(tmp_path: Path) -> None:
    """A first start whose object store cannot be opened (here a file where its directory
    goes; an unreachable endpoint alike) made the database and no cluster-id: every later
    start was refused as a directory that lost its id. The id is made first now, and a
    directory left so by an earlier release (no id, the store never claimed) starts too."""
    config = daemon_config(tmp_path)
    objects = Path(config.storage.objects_dir)
    objects.parent.mkdir(parents=True, exist_ok=True)
    objects.write_text("in the way")
    with pytest.raises(BaseException):  # noqa: B017, PT011 - the store cannot be opened
        async with running_daemon(config):
            pass
    data = Path(config.storage.data_dir)
    assert (data / "levelzero.db").exists() and (data / "cluster-id").exists()
    objects.unlink()
    (data / "cluster-id").unlink()  # as an earlier release left it
    async with running_daemon(config) as daemon, Client(daemon.url) as client:
        await client.create_topic("t", 1)
    assert (objects / MARKER_KEY).read_text().strip() == (data / "cluster-id").read_text().strip()


@pytest.mark.s3
async def test_a_data_directory_on_s3_that_lost_its_cluster_id_is_refused_before_any_id_is_made(
    tmp_path: Path, s3_endpoint, s3_bucket: str
) -> None:
    config = load_config(
        None,
        environ=s3_environ(s3_endpoint, s3_bucket),
        overrides={("storage", "data_dir"): str(tmp_path), ("server", "listen"): "127.0.0.1:0"},
    )
    async with running_daemon(config) as daemon, Client(daemon.url) as client:
        await client.create_topic("t", 1)
    data = Path(config.storage.data_dir)
    owner = (data / "cluster-id").read_text().strip()
    (data / "cluster-id").unlink()
    with pytest.raises(BaseException) as caught:  # noqa: PT011 - may come in an exception group
        async with running_daemon(config):
            pass
    [refused] = [e for e in leaf_errors(caught.value) if isinstance(e, StoreRefused)]
    assert not isinstance(refused, StoreOwnedByAnotherCluster)
    assert f"names cluster {owner}: if this directory is that cluster's" in str(refused)
    assert not (data / "cluster-id").exists()


async def test_a_running_daemon_notices_its_store_lost_its_marker_or_was_claimed_by_another_cluster(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The marker is read again while the daemon runs. Gone (the store emptied): an ERROR, and
    written again at once (another cluster started meanwhile would claim the keyspace). Naming
    another cluster: this node's GC paused and its writes refused (each GC would delete the
    other's objects), not ready, until the marker is this cluster's again; an operator's own
    pause outlasts it."""
    config = daemon_config(tmp_path)
    marker_path = Path(config.storage.objects_dir) / MARKER_KEY
    async with running_daemon(config) as daemon, Client(daemon.url) as client:
        await client.create_topic("t", 1)
        watch = daemon.marker
        assert watch is not None and watch.owned
        ours = marker_path.read_text()
        with caplog.at_level(logging.INFO, logger="levelzero.daemon"):
            marker_path.unlink()
            await watch.check()
            assert marker_path.read_text() == ours and watch.owned  # written again
            metrics = await client.metrics()
            assert "levelzero_object_store_marker_lost_total 1.0" in metrics
            assert "levelzero_object_store_owned 1.0" in metrics

            marker_path.write_text("0" * 32 + "\n")
            await watch.check()
            assert daemon.node.gc.paused and not watch.owned
            with pytest.raises(ApiError) as refused:
                await client.produce("t", 0, [b"x"])
            assert (refused.value.status, refused.value.code) == (503, "storage_error")
            assert f"claimed by levelzero cluster {'0' * 32}" in refused.value.message
            assert "levelzero_object_store_owned 0.0" in await client.metrics()
            await client.gc_pause()  # an operator's pause meanwhile
            marker_path.write_text(ours)
            await watch.check()
            assert watch.owned and daemon.node.gc.paused_by == {"operator"}  # the operator's holds
            await client.gc_resume()
            assert not daemon.node.gc.paused
            assert (await client.produce("t", 0, [b"y"])).base_offset == 0
            await watch.check()  # no change: nothing said
    said = [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.name == "levelzero.daemon" and "object store" in r.getMessage()
    ]
    assert [level for level, _ in said] == ["ERROR", "ERROR", "INFO"], said
    assert "lost its marker" in said[0][1] and "written again" in said[0][1]
    assert f"claimed by levelzero cluster {'0' * 32}" in said[1][1] and "writes refused" in said[1][1]
    assert "this cluster's again" in said[2][1]


async def test_the_marker_is_read_again_on_its_interval(tmp_path: Path) -> None:
    config = daemon_config(tmp_path)
    daemon = Daemon(config)
    daemon.marker_check_interval_s = 0.05
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        assert daemon.marker is not None and daemon.marker.owned
        (Path(config.storage.objects_dir) / MARKER_KEY).unlink()
        with anyio.fail_after(10):
            while not daemon.marker.lost:
                await anyio.sleep(0.01)
        daemon.request_stop("the test")
