"""Three real daemons, one throwaway PostgreSQL, one moto S3 bucket, on loopback: a cluster.

Every node takes every request: a partition led elsewhere is answered with a 307 to its leader,
which the bundled client follows. Records produced through all nodes are readable byte for byte
through any node; no offset is acknowledged twice; a SIGKILLed leader's partitions accept writes
again once its leases expire (about the TTL); a gracefully stopped node hands over at once; a
SIGSTOPped leader (a zombie) loses its partitions and, woken, acknowledges nothing it does not
lead any more."""

from __future__ import annotations

import contextlib
import random
import signal
import time
from pathlib import Path

import anyio
import asyncpg
import pytest

from daemon_support import QUIESCENT_ENVIRON, DaemonProcess, postgres_control, s3_environ
from levelzero.client import ApiError, Client
from levelzero.cli.cluster_demo import read_partition

pytestmark = pytest.mark.s3

TTL_S = 2.0
TOPIC = "c"
PARTITIONS = 6
WAIT_S = 60.0
QUIESCE_S = 90.0


def cluster_env(name: str, dsn: str, endpoint, bucket: str) -> dict[str, str]:
    return {
        **postgres_control(dsn),
        **s3_environ(endpoint, bucket),
        **QUIESCENT_ENVIRON,
        "LEVELZERO_NODE_EPOCH_BUMP_INTERVAL_S": "0.5",
        "LEVELZERO_GC_SWEEP_INTERVAL_S": "1",
        "LEVELZERO_CLUSTER_ENABLED": "true",
        "LEVELZERO_CLUSTER_NODE_ID": name,
        "LEVELZERO_CLUSTER_LEASE_TTL_S": str(TTL_S),
    }


def start_nodes(
    tmp_path: Path,
    dsn: str,
    endpoint,
    bucket: str,
    names: list[str],
    start: bool = True,
) -> dict[str, DaemonProcess]:
    nodes = {}
    for name in names:
        process = DaemonProcess(
            tmp_path / name, tmp_path / f"{name}-logs", env=cluster_env(name, dsn, endpoint, bucket)
        )
        (tmp_path / f"{name}-logs").mkdir()
        process.env["LEVELZERO_CLUSTER_ADVERTISE_URL"] = process.url
        nodes[name] = process
    for process in nodes.values() if start else ():
        process.start()
    return nodes


async def produce_until_acknowledged(urls: list[str], partition: int, value: bytes) -> tuple[int, float]:
    """Through the given nodes in turn until one acknowledges; (offset, seconds it took)."""
    started = time.monotonic()
    with anyio.fail_after(WAIT_S):
        while True:
            for url in urls:
                async with Client(url, timeout_s=5.0) as client:
                    try:
                        ack = await client.produce(TOPIC, partition, [value])
                        return ack.base_offset, time.monotonic() - started
                    except ApiError as exc:
                        if exc.code not in (
                            "not_leader",
                            "unreachable",
                            "timeout",
                            "shutting_down",
                            "storage_error",
                            "http_error",
                        ):
                            raise
            await anyio.sleep(0.1)


async def no_l0_left(s3_endpoint, bucket: str) -> None:
    """Wait (at most QUIESCE_S) until the bucket holds no L0 object, listed with the S3 API."""
    s3 = s3_endpoint.boto3_client()

    def l0_left() -> list[str]:
        listed = s3.list_objects_v2(Bucket=bucket, Prefix="level_zero/")
        return [item["Key"] for item in listed.get("Contents", [])]

    with anyio.fail_after(QUIESCE_S):
        while l0_left():
            await anyio.sleep(0.5)


async def test_three_daemons_keep_every_acknowledged_record_through_kill_stop_and_pause(
    tmp_path: Path,
    postgres_dsn: str,
    s3_endpoint,
    s3_bucket: str,
) -> None:
    nodes = start_nodes(tmp_path, postgres_dsn, s3_endpoint, s3_bucket, ["n1", "n2", "n3"])
    acked: dict[int, dict[int, bytes]] = {p: {} for p in range(PARTITIONS)}
    rng = random.Random(20)

    async def produce_some(names: list[str], tag: str, count: int) -> list[float]:
        waits = []
        for i in range(count):
            partition = i % PARTITIONS
            value = f"{tag}-{i}-{rng.randbytes(8).hex()}".encode()
            urls = [nodes[n].url for n in rng.sample(names, len(names))]
            offset, waited = await produce_until_acknowledged(urls, partition, value)
            assert offset not in acked[partition], f"offset {offset} of {partition} acknowledged twice"
            acked[partition][offset] = value
            waits.append(waited)
        return waits

    async def check_everything(names: list[str]) -> None:
        for name in names:
            for partition in range(PARTITIONS):
                stored = await read_partition(nodes[name].url, partition, TOPIC)
                for offset, value in acked[partition].items():
                    assert stored[offset] == value, (name, partition, offset)

    try:
        async with Client(nodes["n1"].url) as client:
            await client.create_topic(TOPIC, PARTITIONS)
        await produce_some(["n1", "n2", "n3"], "first", 60)
        await check_everything(["n1", "n2", "n3"])
        async with Client(nodes["n2"].url) as client:
            info = await client.cluster()
        assert info.enabled and info.node_id == "n2"
        assert [(n.node_id, n.advertise_url, n.live) for n in info.nodes] == [
            (name, nodes[name].url, True) for name in ("n1", "n2", "n3")
        ]
        assert sum(n.partitions_led for n in info.nodes) == PARTITIONS
        assert info.partitions_without_leader == 0
        shown = nodes["n1"].cli("cluster")
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.decode().splitlines()
        assert lines[0].split() == ["NODE", "URL", "STATE", "LEADS", "LEASE"]
        assert [line.split()[0] for line in lines[1:4]] == ["n1", "n2", "n3"]
        assert lines[-1].startswith(f"{PARTITIONS} partitions, 0 without a live leader")

        # SIGKILL one node: its partitions accept writes again after about the TTL.
        nodes["n3"].signal(signal.SIGKILL)
        nodes["n3"].wait_exit()
        waits = await produce_some(["n1", "n2"], "after-kill", 30)
        assert max(waits) < TTL_S + 8.0, max(waits)
        await check_everything(["n1", "n2"])

        # A graceful stop hands over without waiting for the TTL.
        assert nodes["n2"].stop() == 0
        waits = await produce_some(["n1"], "after-stop", 30)
        assert max(waits) < TTL_S, max(waits)

        # n2 and n3 come back and take their shares again.
        for name in ("n2", "n3"):
            nodes[name].start()
        await produce_some(["n1", "n2", "n3"], "rejoined", 30)

        # SIGSTOP one past its lease (a zombie), then SIGCONT: nothing it acknowledges is lost.
        nodes["n2"].signal(signal.SIGSTOP)
        await anyio.sleep(TTL_S * 1.5)
        waits = await produce_some(["n1", "n3"], "while-paused", 30)
        nodes["n2"].signal(signal.SIGCONT)
        await produce_some(["n1", "n2", "n3"], "after-pause", 30)
        await check_everything(["n1", "n2", "n3"])

        # Quiescence: every L0 object (the zombie's orphans too) is collected, listed with S3.
        await no_l0_left(s3_endpoint, s3_bucket)
        await check_everything(["n1", "n2", "n3"])  # from L1 now
    finally:
        for process in nodes.values():
            if process.proc is not None and process.proc.poll() is None:
                process.signal(signal.SIGCONT)
            process.cleanup()


async def test_a_join_a_kill_a_pause_and_a_rolling_restart_under_load(
    tmp_path: Path,
    postgres_dsn: str,
    s3_endpoint,
    s3_bucket: str,
) -> None:
    """Producers write without pause through whichever nodes are up while a third node joins, a
    leader is SIGKILLed and started again, another is SIGSTOPped past its lease and woken (a
    zombie), and then every node in turn is stopped (SIGTERM) and started again. No
    acknowledged record is lost, none is acknowledged twice, and at quiescence no L0 object is
    left."""
    nodes = start_nodes(tmp_path, postgres_dsn, s3_endpoint, s3_bucket, ["n1", "n2", "n3"], start=False)
    up: set[str] = set()
    for name in ("n1", "n2"):
        nodes[name].start()
        up.add(name)
    acked: dict[int, dict[int, bytes]] = {p: {} for p in range(PARTITIONS)}
    counts = {"acked": 0, "retried": 0}
    rng = random.Random(21)

    async def producer(index: int, stop: anyio.Event) -> None:
        i = 0
        while not stop.is_set():
            partition = rng.randrange(PARTITIONS)
            value = f"load-{index}-{i}".encode()
            i += 1
            with anyio.fail_after(WAIT_S):
                while True:
                    url = nodes[rng.choice(sorted(up))].url
                    try:
                        async with Client(url, timeout_s=5.0) as client:
                            ack = await client.produce(TOPIC, partition, [value])
                        break
                    except ApiError as exc:
                        if exc.code not in (
                            "not_leader",
                            "unreachable",
                            "timeout",
                            "shutting_down",
                            "storage_error",
                            "http_error",
                            "unavailable",
                        ):
                            raise
                        counts["retried"] += 1
                        await anyio.sleep(0.05)
            assert ack.base_offset not in acked[partition], (partition, ack.base_offset, "acked twice")
            acked[partition][ack.base_offset] = value
            counts["acked"] += 1

    try:
        async with Client(nodes["n1"].url) as client:
            await client.create_topic(TOPIC, PARTITIONS)
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            for index in range(4):
                tg.start_soon(producer, index, stop)
            await anyio.sleep(TTL_S)
            before_join = counts["acked"]
            # n3 joins under load and takes its share, a few partitions a round.
            await anyio.to_thread.run_sync(nodes["n3"].start)
            up.add("n3")
            await anyio.sleep(2 * TTL_S)
            async with Client(nodes["n3"].url) as client:
                assert (await client.cluster()).nodes[2].partitions_led > 0
            # A leader is SIGKILLed under load, and comes back.
            up.discard("n2")
            nodes["n2"].signal(signal.SIGKILL)
            nodes["n2"].wait_exit()
            before_kill = counts["acked"]
            await anyio.sleep(2 * TTL_S)
            assert counts["acked"] > before_kill  # its partitions moved; writes go on
            await anyio.to_thread.run_sync(nodes["n2"].start)
            up.add("n2")
            await anyio.sleep(TTL_S)
            # Another is paused past its lease (a zombie), then woken.
            up.discard("n1")
            nodes["n1"].signal(signal.SIGSTOP)
            await anyio.sleep(1.5 * TTL_S)
            nodes["n1"].signal(signal.SIGCONT)
            up.add("n1")
            await anyio.sleep(TTL_S)
            # A rolling restart: each node in turn hands over, stops, starts and rejoins.
            for name in ("n1", "n2", "n3"):
                up.discard(name)
                assert await anyio.to_thread.run_sync(nodes[name].stop) == 0
                await anyio.to_thread.run_sync(nodes[name].start)
                up.add(name)
                await anyio.sleep(TTL_S)
            stop.set()
        assert counts["acked"] > before_join + 50, counts

        async with Client(nodes["n2"].url) as client:
            info = await client.cluster()
        assert info.partitions_without_leader == 0
        assert all(n.live and n.partitions_led > 0 for n in info.nodes), info
        for name in ("n1", "n2", "n3"):
            for partition in range(PARTITIONS):
                stored = await read_partition(nodes[name].url, partition, TOPIC)
                for offset, value in acked[partition].items():
                    assert stored[offset] == value, (name, partition, offset)

        await no_l0_left(s3_endpoint, s3_bucket)
        print(f"\n{counts['acked']} writes acknowledged under load, {counts['retried']} retried")
    finally:
        for process in nodes.values():
            if process.proc is not None and process.proc.poll() is None:
                process.signal(signal.SIGCONT)
            process.cleanup()


PAUSE_TTL_S = 12.0  # the leases (and the paused session) outlast the measurement
PAUSE_WINDOW_S = 4.0
ONE_COMMIT_S = 2.0  # a produce acknowledged within this is not stalled (the old stall: 5 s)


async def _sql(dsn: str, query: str, *args) -> list:
    connection = await asyncpg.connect(dsn)
    try:
        return await connection.fetch(query, *args)
    finally:
        await connection.close()


async def test_a_node_paused_inside_a_write_transaction_stalls_no_other_nodes_partitions(
    tmp_path: Path,
    postgres_dsn: str,
    s3_endpoint,
    s3_bucket: str,
) -> None:
    """n3 is caught inside a write batch that is inserting its L0 catalog row (the table is
    share-locked from outside until n3's insert waits on it, then n3 is SIGSTOPped and the
    lock released: the server finishes its part and waits for the stopped node inside the
    transaction, which holds n3's partitions' rows and an L0 row). While
    it is stopped, with its leases and its open transaction alive, the partitions n1 and n2
    lead keep acknowledging, each produce within one commit's time. Before, every batch with
    an L0 row took one cluster-wide lock, and n3 held it: nothing was acknowledged until the
    server ended n3's session."""
    names = ["n1", "n2", "n3"]
    nodes = start_nodes(tmp_path, postgres_dsn, s3_endpoint, s3_bucket, names, start=False)
    for process in nodes.values():
        process.env["LEVELZERO_CLUSTER_LEASE_TTL_S"] = str(PAUSE_TTL_S)
        process.start()
    stop_load = anyio.Event()
    try:
        async with Client(nodes["n1"].url) as client:
            await client.create_topic(TOPIC, PARTITIONS)
        leaders: dict[int, str] = {}
        with anyio.fail_after(WAIT_S):  # every node leads some partitions
            while set(leaders.values()) != set(names) or len(leaders) != PARTITIONS:
                await anyio.sleep(0.5)
                leaders = {
                    r["partition"]: r["node_id"]
                    for r in await _sql(
                        postgres_dsn,
                        "SELECT p.partition, l.node_id FROM partition_leases l"
                        " JOIN partitions p USING (pid) WHERE l.lease_expires_at > extract(epoch from now())",
                    )
                }
        paused_partitions = [p for p, n in leaders.items() if n == "n3"]
        other_partitions = sorted(p for p, n in leaders.items() if n != "n3")

        outcomes: dict[str, int] = {}  # what n3's load was answered, for a failure's message

        async def load_on_n3() -> None:  # n3 keeps writing L0 objects
            i = 0
            while not stop_load.is_set():
                async with Client(nodes["n3"].url, timeout_s=2.0) as client:
                    try:
                        await client.produce(TOPIC, paused_partitions[i % len(paused_partitions)], [b"x"])
                        outcome = "acknowledged"
                    except ApiError as exc:
                        outcome = exc.code
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                i += 1

        async def n3_is_waiting_on(query: str, what: str) -> None:
            """Until n3's sessions match `query`; failing with what they and n3 were doing.
            Each look is a session of its own: inside the locker's transaction PostgreSQL
            would show every look the sessions' activity as at the first one (a transaction
            keeps one snapshot of it), so a wait that began after it was never seen."""
            deadline = time.monotonic() + WAIT_S
            while not (await _sql(postgres_dsn, query))[0][0]:
                if time.monotonic() > deadline:
                    sessions = await _sql(
                        postgres_dsn,
                        "SELECT state, wait_event_type, wait_event, left(query, 80) AS query"
                        " FROM pg_stat_activity WHERE application_name = 'levelzero n3'",
                    )
                    pytest.fail(
                        f"n3 not {what} within {WAIT_S} s; its load: {outcomes}; n3 running:"
                        f" {nodes['n3'].proc.poll() is None}; its sessions: {[dict(r) for r in sessions]};"
                        f" leaders: {leaders}; its log's end:\n{nodes['n3'].log()[-3000:]}"
                    )
                await anyio.sleep(0.05)

        locker = await asyncpg.connect(postgres_dsn)
        waits: list[float] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(load_on_n3)
            transaction = locker.transaction()
            await transaction.start()
            await locker.execute("LOCK TABLE l0_objects IN SHARE MODE")
            # n3's batch inserts its L0 row: it waits on the lock.
            await n3_is_waiting_on(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'levelzero n3'"
                " AND wait_event_type = 'Lock' AND wait_event = 'relation'",
                "waiting on the L0 catalog's lock",
            )
            nodes["n3"].signal(signal.SIGSTOP)
            await transaction.commit()
            await locker.close()
            # Its insert done, its session waits for the stopped node inside the transaction.
            open_batch = (
                "SELECT count(*) FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid"
                " WHERE a.application_name = 'levelzero n3' AND a.wait_event = 'ClientRead'"
                " AND a.state IN ('active', 'idle in transaction')"
                " AND l.relation = 'l0_objects'::regclass AND l.mode = 'RowExclusiveLock'"
                " AND l.granted"
            )
            await n3_is_waiting_on(open_batch, "stopped inside its batch")
            # n3 is stopped inside its batch. The other nodes' partitions:
            started = time.monotonic()
            i = 0
            while time.monotonic() - started < PAUSE_WINDOW_S:
                partition = other_partitions[i % len(other_partitions)]
                before = time.monotonic()
                async with Client(nodes[leaders[partition]].url, timeout_s=30.0) as client:
                    with contextlib.suppress(ApiError):  # a stall past the timeout: the wait says so
                        await client.produce(TOPIC, partition, [f"during-{i}".encode()])
                waits.append(time.monotonic() - before)
                i += 1
            still_open = (await _sql(postgres_dsn, open_batch))[0][0]
            nodes["n3"].signal(signal.SIGCONT)
            stop_load.set()
        assert still_open, "n3's transaction ended during the measurement"
        assert max(waits) < ONE_COMMIT_S, (max(waits), len(waits))
        assert len(waits) >= 4, waits
    finally:
        stop_load.set()
        for process in nodes.values():
            if process.proc is not None and process.proc.poll() is None:
                process.signal(signal.SIGCONT)
            process.cleanup()


async def test_a_second_daemon_under_a_running_nodes_id_exits_2_and_a_crashed_one_restarts(
    tmp_path: Path,
    postgres_dsn: str,
    s3_endpoint,
    s3_bucket: str,
) -> None:
    """A copy of n1's configuration with only its ports changed, started while n1 runs, is
    refused at start (exit 2, not restarted by systemd) with one line naming the node id, the
    running node's advertise URL and what to do; n1 keeps its registration (before: both ran,
    taking the row from each other every round). n1 SIGKILLed and started again at once (its
    registration still live, the same advertise URL) starts as before."""
    nodes = start_nodes(tmp_path, postgres_dsn, s3_endpoint, s3_bucket, ["n1"])
    n1 = nodes["n1"]
    copy = DaemonProcess(
        tmp_path / "n1-copy",
        tmp_path / "n1-copy-logs",
        env=cluster_env("n1", postgres_dsn, s3_endpoint, s3_bucket),
    )
    (tmp_path / "n1-copy-logs").mkdir()
    copy.env["LEVELZERO_CLUSTER_ADVERTISE_URL"] = copy.url
    try:
        copy.start(wait=False)
        assert copy.wait_exit(timeout_s=WAIT_S) == 2, copy.log()[-4000:]
        refusals = [line for line in copy.log().splitlines() if "is taken" in line]
        assert len(refusals) == 1, copy.log()[-4000:]
        assert "cluster.node_id 'n1'" in refusals[0] and n1.url in refusals[0], refusals
        assert "give this node its own cluster.node_id" in refusals[0], refusals
        rows = await _sql(postgres_dsn, "SELECT advertise_url FROM cluster_nodes WHERE node_id = 'n1'")
        assert [row["advertise_url"] for row in rows] == [n1.url]

        async with Client(n1.url) as client:
            await client.create_topic(TOPIC, 1)
        n1.signal(signal.SIGKILL)
        n1.wait_exit()
        n1.start()  # within its lease: the same URL takes its row back
        await produce_until_acknowledged([n1.url], 0, b"after the restart")
        assert "is taken" not in n1.log()
    finally:
        for process in (n1, copy):
            process.cleanup()
