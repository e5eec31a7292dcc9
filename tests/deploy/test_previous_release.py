"""Today's code opens a data directory written by the previous release (levelzero 0.1.0, commit
a0b1def; `tests/fixtures/previous_release/generate.py` says how it was made) and serves every
record it held byte for byte, from L1 (reconciled, L0 collected) and from L0, then goes on."""

from __future__ import annotations

import importlib.util
import sqlite3
import tarfile
from pathlib import Path

import anyio
from daemon_support import daemon_and_client

from levelzero.cli.main import main
from levelzero.storage.sqlite import SCHEMA_VERSION

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "previous_release"
_spec = importlib.util.spec_from_file_location("previous_release", FIXTURE / "generate.py")
assert _spec is not None and _spec.loader is not None
previous = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(previous)
WRITTEN = previous.FIRST_BATCH + previous.SECOND_BATCH


def unpack(tmp_path: Path) -> Path:
    with tarfile.open(FIXTURE / "data-0.1.0.tar.gz") as archive:
        archive.extractall(tmp_path, filter="data")
    data = tmp_path / "data"
    with sqlite3.connect(data / "levelzero.db") as db:
        assert db.execute("PRAGMA user_version").fetchone() == (1,)  # written with schema 1
    return data


async def test_a_data_directory_of_the_previous_release_opens_and_serves_every_record(tmp_path: Path) -> None:
    data = unpack(tmp_path)
    async with daemon_and_client(data) as (daemon, client):
        topics = {t.name: t.partitions for t in await client.list_topics()}
        assert topics == previous.TOPICS
        tiers = set()
        for topic, partitions in previous.TOPICS.items():
            for p in range(partitions):
                got: list[tuple[bytes | None, bytes]] = []
                offset = 0
                for _ in range(WRITTEN):  # bounded: at least one record per fetch
                    fetched = await client.fetch(topic, p, offset, None)
                    assert fetched.high_watermark == WRITTEN
                    if not fetched.records:
                        break
                    tiers.add(fetched.tier)
                    got += [(r.key, r.value) for r in fetched.records]
                    offset = fetched.next_offset
                assert got == previous.expected_records(topic, p, WRITTEN), (topic, p)
        # the first batch was reconciled and its L0 objects collected (a fetch may go on into L0)
        assert any("l1" in tier.split("+") for tier in tiers), tiers
        ack = await client.produce("orders", 0, [(b"new", b"written by today's code")])
        assert ack.base_offset == WRITTEN
        status = await client.status()
        assert status.cluster_epoch > 1 and len(status.partitions) == 4
    with sqlite3.connect(data / "levelzero.db") as db:  # migrated forward on the way
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)


async def test_the_previous_releases_l1_objects_rebuild_a_lost_log_store(tmp_path: Path, capsys) -> None:
    """L1 objects describe themselves (key: topic, partition, range, term; body: the L0 format
    with one extent): the previous release's bring back every reconciled record once its log
    store and cluster id are lost. Its second batch was never reconciled: it does not."""
    data = unpack(tmp_path)
    for lost in ("levelzero.db", "levelzero.db-wal", "levelzero.db-shm", "cluster-id"):
        (data / lost).unlink(missing_ok=True)
    assert await anyio.to_thread.run_sync(main, ["recover", "--from-bucket", "--data-dir", str(data)]) == 0
    assert "rebuilt the control plane from the bucket: 2 topics" in capsys.readouterr().out
    async with daemon_and_client(data) as (daemon, client):
        assert {t.name: t.partitions for t in await client.list_topics()} == previous.TOPICS
        for topic, partitions in previous.TOPICS.items():
            for p in range(partitions):
                got: list[tuple[bytes | None, bytes]] = []
                for _ in range(previous.FIRST_BATCH + 1):  # bounded: at least one record per fetch
                    fetched = await client.fetch(topic, p, len(got), None)
                    assert fetched.high_watermark == previous.FIRST_BATCH
                    if not fetched.records:
                        break
                    got += [(r.key, r.value) for r in fetched.records]
                assert got == previous.expected_records(topic, p, previous.FIRST_BATCH), (topic, p)
        ack = await client.produce("orders", 0, [(b"new", b"written after the recovery")])
        assert ack.base_offset == previous.FIRST_BATCH
