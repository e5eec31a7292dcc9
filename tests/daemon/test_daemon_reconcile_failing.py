"""A partition whose reconciliation keeps failing, seen from outside: `status` (JSON and
text), `gc explain`, the metrics, and the audited escape hatch over HTTP and the CLI."""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path

import anyio
import pytest

from levelzero.cli import commands, formats
from levelzero.cli import main as cli
from levelzero.client import ApiError
from levelzero.core.reconcile_health import RECONCILE_FAILURES_BEFORE_FAILING
from levelzero.storage.protocols import L1Row, L1State
from levelzero.storage.sqlite import SqliteLogStore
from levelzero.testing.faulty_store import FaultSpec, FaultyObjectStore

from daemon_support import daemon_and_client


async def test_a_failing_partition_is_named_everywhere_and_can_be_abandoned_with_confirm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with daemon_and_client(tmp_path, reconciler__enabled=False, housekeeper__enabled=False) as (
        daemon,
        client,
    ):
        node = daemon.node
        assert node is not None
        await client.create_topic("t", 2)
        await client.produce("t", 0, [b"kept"])
        await node.reconciler.run_round()
        lost = await client.produce("t", 0, [b"lost"])
        await client.produce("t", 1, [b"fine"])
        key = (await node.log_store.read_placeholders(node.partition("t", 0).row.pid, 1, 1))[
            0
        ].entry.object_key
        os.remove(os.path.join(daemon.config.storage.objects_dir, key))  # gone for good
        for _ in range(RECONCILE_FAILURES_BEFORE_FAILING):
            await node.reconciler.run_round()

        status = await client.status()
        assert status.reconciler is not None
        (failing,) = status.reconciler.failing
        assert failing.partition == "t/0" and failing.failures == RECONCILE_FAILURES_BEFORE_FAILING
        assert key in failing.last_error
        text = formats.format_status(status)
        assert "RECONCILE FAILING t/0 since" in text and "holding M back" in text
        metrics = await client.metrics()
        assert "levelzero_reconciler_failing_partitions 1.0" in metrics
        since = 'levelzero_partition_reconcile_failing_since_timestamp_seconds{partition="0",topic="t"}'
        assert since in metrics
        explained = await client.gc_explain(epoch=status.cluster_epoch)
        (holder,) = [h for h in explained.holders if h.partition == "t/0"]
        assert "reconciliation failing since" in holder.reason and key in holder.reason
        assert holder.reconcile_failing_since == failing.since
        explained_text = formats.format_explanation(explained)
        assert re.search(r"t/0 .*reconciliation failing since \d+\.\d s ago \(3 passes\)", explained_text)
        assert f"since {failing.since:.0f}" not in explained_text  # not a raw Unix time

        with pytest.raises(ApiError) as refused:
            await client.abandon_unreconciled("t", 0, operator="ops", reason="lost", confirm=False)
        assert refused.value.status == 400 and refused.value.code == "invalid_input"
        assert "never readable again" in refused.value.message
        with pytest.raises(ApiError) as healthy:
            await client.abandon_unreconciled("t", 1, operator="ops", reason="x", confirm=True)
        assert healthy.value.status == 400 and "not failing" in healthy.value.message
        with pytest.raises(ApiError) as unknown:
            await client.abandon_unreconciled("nope", 0, operator="ops", reason="x", confirm=True)
        assert unknown.value.status == 404

        args = argparse.Namespace(partition=("t", 0), by="ops@host", reason="incident 7", json=False)
        await commands._partition_abandon_call(args, client)
        printed = capsys.readouterr().out
        assert printed.startswith("t/0: data offsets 1..1 given up (log offset ")
        assert "'ops@host'" in printed and "'incident 7'" in printed

        with pytest.raises(ApiError) as gone:
            await client.fetch("t", 0, lost.base_offset)
        assert gone.value.status == 404 and gone.value.code == "offset_out_of_range"
        assert "abandoned" in gone.value.message and "next readable offset is 2" in gone.value.message
        assert [r.value for r in (await client.fetch("t", 0, 0)).records] == [b"kept"]
        assert (await client.status()).reconciler.failing == []
        assert "levelzero_reconciler_failing_partitions 0.0" in await client.metrics()


def test_the_cli_refuses_without_confirm_and_says_what_is_given_up(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli.main(
        ["partition", "abandon-unreconciled", "t/0", "--reason", "lost", "--url", "http://127.0.0.1:9"]
    )  # nothing listens there: nothing is asked
    assert code == 2
    err = capsys.readouterr().err
    assert "never readable again" in err and "Add --confirm" in err
    with pytest.raises(SystemExit) as caught:
        cli.main(["partition", "abandon-unreconciled", "t", "--reason", "x", "--confirm"])
    assert caught.value.code == 2
    assert "is not TOPIC/PARTITION" in capsys.readouterr().err


async def test_a_stored_topic_no_store_can_hold_is_named_in_status_with_what_to_do(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path) as (daemon, client):
        await client.create_topic("fine", 1)
        db_path = daemon.config.storage.db_path
    async with await SqliteLogStore.open(db_path) as store:
        await store.create_topic(".lz-tmp-old", 2, 1, 0.0)  # as an older levelzero let it
    async with daemon_and_client(tmp_path) as (_daemon, client):
        status = await client.status()
        (topic,) = status.unstorable_topics
        assert topic.topic == ".lz-tmp-old" and "reserved temp-file prefix" in topic.problem
        assert "levelzero partition abandon-unreconciled .lz-tmp-old/P --confirm" in topic.advice
        assert f"UNSTORABLE TOPIC: {topic.advice}" in formats.format_status(status)
        assert (await client.produce("fine", 0, [b"still served"])).base_offset == 0


async def test_a_failing_l1_delete_is_retried_while_running_and_shown_in_status_and_metrics(
    tmp_path: Path,
) -> None:
    """An abandoned copy whose clean-up delete fails 3 times (the faulty store) is deleted by
    the running daemon's retries; status, its text and the metrics count it while it waits."""

    faulty: list[FaultyObjectStore] = []

    def wrap(store):
        faulty.append(FaultyObjectStore(store, FaultSpec()))
        return faulty[0]

    async with daemon_and_client(
        tmp_path,
        wrap_object_store=wrap,
        reconciler__enabled=False,
        housekeeper__enabled=False,
        reconciler__copy_deadline_s=1.0,
        reconciler__delete_retry_first_s=0.1,
        reconciler__delete_retry_max_s=0.2,
    ) as (daemon, client):
        node = daemon.node
        assert node is not None
        await client.create_topic("t", 1)
        await node.reconciler.run_round()  # the start-up recovery pass is behind us
        pid = node.partition("t", 0).row.pid
        key = "level_one/t/0/00000000000000000000-00000000000000000001/1-" + "e" * 32
        await node.object_store.put(key, b"half")
        long_ago = time.time() - 3600
        await node.log_store.l1_insert(
            L1Row(key, pid, 0, 1, 2, 1, 4, L1State.COPY_STARTED, long_ago, long_ago)
        )
        faulty[0].fail_deletes("level_one/", 3)
        path = os.path.join(daemon.config.storage.objects_dir, key)

        with anyio.fail_after(10):  # the stale-copy check comes every quarter deadline
            while not len(node.l1.pending_deletes):
                await anyio.sleep(0.05)
                await node.reconciler.run_round()
        status = await client.status()
        assert status.reconciler is not None and status.reconciler.l1_deletes_pending == 1
        (shown,) = status.reconciler.l1_deletes_pending_shown
        assert (shown.key, shown.partition) == (key, "t/0") and 1 <= shown.failures <= 3
        assert "injected fault" in shown.last_error and shown.next_retry_at > shown.since
        assert "L1 DELETES PENDING 1" in formats.format_status(status)
        metrics = await client.metrics()
        assert "levelzero_l1_deletes_pending 1.0" in metrics
        assert "levelzero_l1_deletes_pending_since_timestamp_seconds " in metrics
        assert os.path.exists(path)
        assert {r.key: r.state for r in await node.log_store.l1_list(pid)} == {key: L1State.DELETE_STARTED}

        with anyio.fail_after(10):  # backoff 0.1, 0.2, 0.2 s
            while len(node.l1.pending_deletes):
                await anyio.sleep(0.05)
                await node.reconciler.run_round()
        assert {r.key: r.state for r in await node.log_store.l1_list(pid)} == {key: L1State.DELETE_FINISHED}
        assert not os.path.exists(path)
        status = await client.status()
        assert (status.reconciler.l1_deletes_pending, status.reconciler.l1_deletes_pending_shown) == (0, [])
        metrics = await client.metrics()
        assert "levelzero_l1_deletes_pending 0.0" in metrics
        assert "levelzero_l1_delete_failures_total 3.0" in metrics
        assert "levelzero_l1_delete_retries_total 3.0" in metrics
