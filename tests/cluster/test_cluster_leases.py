"""Two daemons of a cluster in this process on one throwaway PostgreSQL (one of them through a TCP
proxy that can blackhole its connections) and one shared objects directory: a node cut off from
the control plane stops serving its partitions, reads and writes, by its own lease deadline,
whatever its renewal round is doing (its calls hang on a dead connection); every node's status,
metrics and GC explain show the `M` the GC uses, over every partition of the cluster."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import anyio
import pytest
import httpx

from daemon_support import BlackholeProxy, daemon_config, free_port, postgres_overrides
from levelzero.core.cluster import LeaseClock
from levelzero.cli.main import main as cli_main
from levelzero.client import Client
from levelzero.cli.cluster_demo import read_partition
from levelzero.daemon.service import Daemon, running_daemon

TTL_S = 2.0
TOPIC = "l"
PARTITIONS = 6
WAIT_S = 60.0
REQUEST_TIMEOUT_S = 5.0  # far below the PostgreSQL client's own timeouts (30-60 s)


def cluster_overrides(tmp_path: Path, name: str, dsn: str, **more: Any) -> dict[str, Any]:
    port = free_port()
    return {
        **more,
        **postgres_overrides(dsn),
        "server__listen": f"127.0.0.1:{port}",
        "server__shutdown_timeout_s": 10.0,
        "node__drain_timeout_s": 5.0,
        "storage__objects_path": str(tmp_path / "objects"),
        "cluster__enabled": True,
        "cluster__node_id": name,
        "cluster__advertise_url": f"http://127.0.0.1:{port}",
        "cluster__lease_ttl_s": TTL_S,
    }


async def wait_for(condition, what: str) -> None:
    with anyio.fail_after(WAIT_S):
        while not condition():
            await anyio.sleep(0.05)
    assert condition(), what


def led(daemon: Daemon) -> set[int]:
    assert daemon.node is not None
    return {actor.row.partition for actor in daemon.node.partitions()}


async def test_a_node_cut_off_from_postgres_stops_serving_its_partitions_by_its_lease_deadline(
    tmp_path: Path, postgres_dsn: str
) -> None:
    proxy = await BlackholeProxy(int(postgres_dsn.rsplit(":", 1)[1].split("/")[0])).start()
    l0_only = {"reconciler__enabled": False}  # a read needs the partition log's placeholders
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(proxy.aclose)
        a = await stack.enter_async_context(
            running_daemon(
                daemon_config(
                    tmp_path / "a", **cluster_overrides(tmp_path, "a", proxy.dsn(postgres_dsn), **l0_only)
                )
            )
        )
        b = await stack.enter_async_context(
            running_daemon(
                daemon_config(tmp_path / "b", **cluster_overrides(tmp_path, "b", postgres_dsn, **l0_only))
            )
        )
        stack.callback(proxy.heal)  # before the daemons stop: a leaves the cluster cleanly
        async with Client(a.url) as client:
            await client.create_topic(TOPIC, PARTITIONS)
        await wait_for(
            lambda: led(a) and led(b) and len(led(a) | led(b)) == PARTITIONS,
            "both nodes lead some partitions",
        )
        async with Client(b.url) as client:  # follows 307 to the leader
            for p in range(PARTITIONS):
                assert (await client.produce(TOPIC, p, [f"before-{p}".encode()])).base_offset == 0
        former = sorted(led(a))

        proxy.blackhole()
        async with httpx.AsyncClient(
            base_url=a.url, trust_env=False, timeout=REQUEST_TIMEOUT_S, follow_redirects=False
        ) as http:
            # Reads sent at the cut wait on the dead connection for their placeholders; they
            # are answered when the lease's deadline passes, not when the connection times out.
            async def read_at_the_cut(p: int) -> None:
                read = await http.get(f"/v1/topics/{TOPIC}/partitions/{p}/records", params={"offset": 0})
                assert read.status_code in (307, 503), (p, read.status_code, read.text)

            async with anyio.create_task_group() as tg:
                for p in former:
                    tg.start_soon(read_at_the_cut, p)
            # Every renewal a answered was sent before the cut: its local deadline (sent + TTL
            # less the margin) has passed by now, whatever its round is doing.
            for p in former:
                path = f"/v1/topics/{TOPIC}/partitions/{p}/records"
                read = await http.get(path, params={"offset": 0})
                assert read.status_code in (307, 503), (p, read.status_code, read.text)
                assert read.json()["error"] == "not_leader", read.text
                write = await http.post(path, json={"records": [{"value": "YWZ0ZXI="}]})
                assert write.status_code in (307, 503), (p, write.status_code, write.text)

        # b takes them over once a's leases have run out, and serves every acknowledged record.
        async with Client(b.url) as client:
            for p in former:
                with anyio.fail_after(WAIT_S):
                    while p not in led(b):
                        await anyio.sleep(0.05)
                assert (await client.produce(TOPIC, p, [b"after"])).base_offset == 1
        for p in former:
            assert await read_partition(b.url, p, TOPIC) == [f"before-{p}".encode(), b"after"]


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


async def test_status_metrics_and_explain_of_every_node_show_the_m_the_gc_uses(
    tmp_path: Path, postgres_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The node that created the topic once showed M = null in status and metrics, blocked by
    the partitions the other node leads (its own board listed every partition it created and
    none it did not lead): the LevelZeroGcBlocked alert fired on a healthy cluster."""
    quiet = {"reconciler__enabled": False, "housekeeper__enabled": False, "gc__enabled": False}
    async with contextlib.AsyncExitStack() as stack:
        a = await stack.enter_async_context(
            running_daemon(
                daemon_config(tmp_path / "a", **cluster_overrides(tmp_path, "a", postgres_dsn, **quiet))
            )
        )
        b = await stack.enter_async_context(
            running_daemon(
                daemon_config(tmp_path / "b", **cluster_overrides(tmp_path, "b", postgres_dsn, **quiet))
            )
        )
        async with Client(a.url) as client:
            await client.create_topic(TOPIC, PARTITIONS)
            await wait_for(
                lambda: led(a) and led(b) and len(led(a) | led(b)) == PARTITIONS,
                "both nodes lead some partitions",
            )
            await client.advance_epoch()
            await client.advance_epoch()
            for p in range(PARTITIONS):
                await client.produce(TOPIC, p, [b"x"])
            with anyio.fail_after(WAIT_S):  # every leader has published its M(p)
                while (gc := await client.gc_run(dry_run=True)).m is None:
                    await anyio.sleep(0.1)
        assert gc.blocked_by == [] and gc.holders

        for daemon, other in ((a, "b"), (b, "a")):
            other_led = {f"{TOPIC}/{p}" for p in (led(b) if other == "b" else led(a))}
            async with Client(daemon.url) as client:
                # M is read from the control plane, and the cluster view (who leads what) read,
                # every third of the TTL: wait for reads after the last publish and the last
                # move (nothing changes either any more: no reconciler, housekeeper, epochs).
                with anyio.fail_after(WAIT_S):
                    while True:
                        status = await client.status()
                        # Every partition holds an epoch far above M back; the other node's
                        # say where they are led.
                        explained = await client.gc_explain(epoch=gc.cluster_epoch + 10)
                        reasons = {h.partition: h.reason for h in explained.holders}
                        elsewhere = {n for n, r in reasons.items() if r.startswith(f"led by node {other}")}
                        if status.m == gc.m and elsewhere == other_led:
                            break
                        await anyio.sleep(0.1)
                assert sorted(status.m_holders) == sorted(gc.holders)
                assert status.m_blocked_by == [] and status.m_blocked_count == 0
                assert status.m_led_by == {
                    n: other if n in other_led else daemon.config.cluster.node_id
                    for n in gc.holders
                    if n != "cap"
                }
                assert explained.m == gc.m
                assert set(reasons) == {f"{TOPIC}/{p}" for p in range(PARTITIONS)} | {"cap"}
            async with httpx.AsyncClient(base_url=daemon.url, trust_env=False) as http:
                text = (await http.get("/metrics")).text
            assert metric(text, "levelzero_gc_watermark_blocked") == 0
            assert metric(text, "levelzero_gc_watermark") == gc.m
            # the membership and the leases, as the shipped cluster alerts read them
            assert metric(text, 'levelzero_cluster_nodes{state="live"}') == 2
            assert metric(text, 'levelzero_cluster_nodes{state="expired"}') == 0
            assert metric(text, "levelzero_cluster_partitions_without_leader") == 0
            assert metric(text, "levelzero_cluster_partitions_led") == len(led(daemon))
            # `levelzero status` lists the partitions the node leads, and says so (an operator
            # took it, `--all` too, for every partition of the cluster).
            capsys.readouterr()
            assert await anyio.to_thread.run_sync(cli_main, ["status", "--url", daemon.url]) == 0
            node = daemon.config.cluster.node_id
            said = capsys.readouterr().out
            assert f"(node {node} leads the partitions above; the cluster has {PARTITIONS}:" in said, said

        # A node past its lease deadline (here: one whose renewals never count) still answers
        # status, with the partitions it has not resigned yet, and serves none of them.
        class NeverRenewed(LeaseClock):
            def renewed(self, sent_at: float) -> None:
                pass

        assert a.node is not None and a.node.member is not None
        a.node.member.lease = NeverRenewed(TTL_S)
        async with httpx.AsyncClient(base_url=a.url, trust_env=False, follow_redirects=False) as http:
            status = await http.get("/v1/status")
            assert status.status_code == 200, status.text
            shown = {(p["topic"], p["partition"]) for p in status.json()["partitions"]}
            assert shown == {(TOPIC, p) for p in led(a)}
            for p in led(a):
                read = await http.get(f"/v1/topics/{TOPIC}/partitions/{p}/records")
                assert read.status_code in (307, 503), read.text
