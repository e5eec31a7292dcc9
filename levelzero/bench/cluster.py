"""Item 12: a cluster of `levelzero run` processes — failover against the lease TTL, the write
stall when leadership moves to a node with a stale epoch cache (windowed vs strict fencing), and
produce throughput with 1, 2 and 3 nodes.

Three `levelzero run` processes (cluster mode, default settings but the ports) share one
throwaway PostgreSQL (started for the run; fsync off, as the tests run it: failover is lease
timing, not commit cost) and one moto S3 bucket. A topic of PARTITIONS partitions is spread
over them by their leases. Each round:

- the leader of partition 0 is found (a node that does not lead it answers 307 to the one that
  does), then SIGKILLed;
- sut:   seconds from the kill until a produce to partition 0, sent every PROBE_S through the
         surviving nodes, is acknowledged;
- floor: the lease TTL: no crash can be noticed sooner than the lease it held runs out.
Then the killed node is started again and rejoins. Target: failover <= TTL + 2 s, as a ratio
<= (TTL + 2) / TTL.

Stale-cache move (information): the cluster epoch advances every STALE_BUMP_S; the leader of
partition 0 refreshes its epoch cache every FRESH_CACHE_TTL_S (the partition's window follows the
epoch), the other nodes every STALE_CACHE_TTL_S (their cached epochs lag by dozens).
A writer sends a record to partition 0 every STALE_PROBE_S (following redirects); the leader of
partition 0 is stopped gracefully, and its successor (stale cache) takes over. Per round:
- stall: the longest a write sent in the STALE_WINDOW_S after the stop waited, minus the median
  write's time before the stop;
- rejections: stale-epoch rejections the nodes counted (their /metrics) during the round.
Windowed rounds run on a cluster started with `fencing_mode = "windowed"`, strict rounds on one
started with "strict", alternately; pairs are (windowed, strict).

Throughput (information: the nodes share this machine's CPUs): THROUGHPUT_PRODUCERS closed-loop
producers send batches of THROUGHPUT_BATCH records to the partitions of a topic, each straight
to its partition's leader (a redirect is followed once and remembered), for THROUGHPUT_S; the
same with 1, 2 and 3 nodes up (a node joins, or stops gracefully, between measurements); each
figure is k nodes against 1 node in the same cycle.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from pathlib import Path

import anyio
import httpx

from levelzero.core.cluster import preferred_leader
from levelzero.cli.cluster_demo import ClusterNodeProcess
from levelzero.testing.postgres import SUPERUSER_PASSWORD, start_throwaway

from .common import Figure, Settings, Target, figure, moto_server, work_dir

ITEM = "cluster"
NODES = 3
PARTITIONS = 6
TOPIC = "failover"
PROBE_S = 0.05
SLACK_S = 2.0  # the target: failover within the TTL plus this
START_TIMEOUT_S = 60.0
BUCKET = "levelzero-bench-cluster"
STALE_CACHE_TTL_S = 30.0
FRESH_CACHE_TTL_S = 0.05
STALE_AGE_S = 2.0  # from the round's first writes (every cache loaded) to the move
STALE_BUMP_S = 0.3
STALE_PROBE_S = 0.02
STALE_WINDOW_S = 2.0
STALE_LEASE_TTL_S = 2.0
THROUGHPUT_TOPIC = "throughput"
THROUGHPUT_PARTITIONS = 12
THROUGHPUT_PRODUCERS = 16
THROUGHPUT_BATCH = 1000  # records per request: the nodes' CPUs bound the rate, not the linger
THROUGHPUT_VALUE_BYTES = 100


class _Daemon(ClusterNodeProcess):
    def __init__(self, name: str, root: Path, env: dict[str, str]) -> None:
        super().__init__(name, root, env, kafka=False)


_RECORDS_PATH = f"/v1/topics/{TOPIC}/partitions/0/records"
_HEADERS = {"Content-Type": "application/json"}


async def _first_to_store(daemons: list[_Daemon], body: bytes, *, follow: bool) -> _Daemon:
    """Produce to partition 0 through `daemons` in turn, every PROBE_S, until one answers 200;
    that one (without `follow`, the partition's leader itself)."""
    with anyio.fail_after(START_TIMEOUT_S):
        async with httpx.AsyncClient(trust_env=False, timeout=5.0, follow_redirects=follow) as http:
            while True:
                for daemon in daemons:
                    try:
                        response = await http.post(daemon.url + _RECORDS_PATH, content=body, headers=_HEADERS)
                    except httpx.HTTPError:
                        continue
                    if response.status_code == 200:
                        return daemon
                await anyio.sleep(PROBE_S)


async def _leader(daemons: list[_Daemon]) -> _Daemon:
    """The node leading partition 0: the one that stores a record there itself (the others
    answer 307)."""
    return await _first_to_store(daemons, b'{"records": [{"value": "cHJvYmU="}]}', follow=False)


async def _failover_s(daemons: list[_Daemon], leader: _Daemon) -> float:
    leader.kill()
    killed_at = time.monotonic()
    survivors = [d for d in daemons if d is not leader]
    await _first_to_store(survivors, b'{"records": [{"value": "YWZ0ZXI="}]}', follow=True)
    return time.monotonic() - killed_at


async def _start(daemons: list[_Daemon]) -> None:
    for daemon in daemons:
        daemon.start()
    for daemon in daemons:
        await daemon.ready()


async def _create(daemon: _Daemon, topic: str, partitions: int) -> None:
    async with httpx.AsyncClient(trust_env=False, timeout=10.0) as http:
        created = await http.post(daemon.url + "/v1/topics", json={"name": topic, "partitions": partitions})
        assert created.status_code == 201, created.text


async def _settled(daemon: _Daemon, live: int) -> None:
    """Until `live` nodes are up and every partition has a live leader, then two TTLs more
    (a joining node is handed its share a few partitions a round)."""
    info: dict = {}
    try:
        with anyio.fail_after(START_TIMEOUT_S):
            async with httpx.AsyncClient(trust_env=False, timeout=5.0) as http:
                while True:
                    info = (await http.get(daemon.url + "/v1/cluster")).json()
                    up = [n for n in info["nodes"] if n["live"] and not n["draining"]]
                    if info["partitions_without_leader"] == 0 and len(up) == live:
                        await anyio.sleep(2 * STALE_LEASE_TTL_S)  # hand-overs to a joiner: rounds
                        return
                    await anyio.sleep(0.2)
    except TimeoutError:
        raise AssertionError(f"the cluster did not settle on {live} leading nodes: {info}") from None


async def _failover_pairs(
    root: Path, env: dict[str, str], rounds: int, ttl_s: float
) -> list[tuple[float, float]]:
    daemons = [
        _Daemon(f"n{i + 1}", root, {**env, "LEVELZERO_CLUSTER_LEASE_TTL_S": str(ttl_s)}) for i in range(NODES)
    ]
    try:
        await _start(daemons)
        await _create(daemons[0], TOPIC, PARTITIONS)
        pairs = []
        for _ in range(rounds):
            leader = await _leader(daemons)
            pairs.append((await _failover_s(daemons, leader), ttl_s))
            leader.start()
            await leader.ready()
            await anyio.sleep(ttl_s)  # it rejoins and takes its share back
        return pairs
    finally:
        for daemon in daemons:
            daemon.stop()


# ------------------------------------------------------------------ stale-cache leadership moves

_STALE_METRIC = "levelzero_batcher_stale_rejections_total"


async def _stale_rejections(daemons: list[_Daemon]) -> float:
    total = 0.0
    async with httpx.AsyncClient(trust_env=False, timeout=5.0) as http:
        for daemon in daemons:
            for line in (await http.get(daemon.url + "/metrics")).text.splitlines():
                if line.startswith(_STALE_METRIC + " "):
                    total += float(line.split()[1])
    return total


async def _stale_move(daemons: list[_Daemon]) -> tuple[float, float]:
    """One move of partition 0 to a node with a stale cache: (stall s, stale rejections)."""
    leader = await _leader(daemons)
    survivors = [d for d in daemons if d is not leader]
    async with httpx.AsyncClient(trust_env=False, timeout=10.0, follow_redirects=True) as http:
        for partition in range(1, PARTITIONS):  # every node has loaded its cache (then it ages)
            path = f"/v1/topics/{TOPIC}/partitions/{partition}/records"
            response = await http.post(
                daemons[0].url + path, headers=_HEADERS, content=b'{"records": [{"value": "d2FybQ=="}]}'
            )
            assert response.status_code == 200, response.text
    rejected_before = await _stale_rejections(survivors)
    before: list[float] = []
    after: list[float] = []
    moved_at: list[float] = []
    done = anyio.Event()

    async def writer() -> None:
        async with httpx.AsyncClient(trust_env=False, timeout=10.0, follow_redirects=True) as http:
            while not done.is_set():
                sent = time.monotonic()
                while True:  # until acknowledged, through the nodes that are up
                    target = random.choice(survivors if moved_at else daemons)
                    try:
                        response = await http.post(
                            target.url + _RECORDS_PATH,
                            headers=_HEADERS,
                            content=b'{"records": [{"value": "c3RhbGU="}]}',
                        )
                        if response.status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    await anyio.sleep(STALE_PROBE_S / 4)
                waited = time.monotonic() - sent
                if not moved_at:
                    before.append(waited)
                elif sent - moved_at[0] <= STALE_WINDOW_S:
                    after.append(waited)
                await anyio.sleep(STALE_PROBE_S)

    async with anyio.create_task_group() as tg:
        tg.start_soon(writer)
        await anyio.sleep(STALE_AGE_S)  # the successor's cache ages by a few epochs
        moved_at.append(time.monotonic())
        await anyio.to_thread.run_sync(leader.stop)  # a graceful hand-over
        await anyio.sleep(STALE_WINDOW_S + 0.5)
        done.set()
    rejections = await _stale_rejections(survivors) - rejected_before
    leader.start()
    await leader.ready()
    await _settled(daemons[0], len(daemons))
    return max(after) - statistics.median(before), rejections


async def _stale_rounds(root: Path, env: dict[str, str], mode: str, rounds: int) -> list[tuple[float, float]]:
    names = [f"s{i + 1}" for i in range(NODES)]
    # Partition 0's leader (by rendezvous: it takes the partition back after each restart)
    # keeps a fresh cache, so the partition's window follows the cluster epoch; the node it
    # moves to has a cache STALE_CACHE_TTL_S old.
    fresh = preferred_leader(f"{TOPIC}/0", names)
    daemons = [
        _Daemon(
            name,
            root,
            {
                **env,
                "LEVELZERO_NODE_FENCING_MODE": mode,
                "LEVELZERO_NODE_EPOCH_CACHE_TTL_S": str(
                    FRESH_CACHE_TTL_S if name == fresh else STALE_CACHE_TTL_S
                ),
                "LEVELZERO_NODE_EPOCH_BUMP_INTERVAL_S": str(STALE_BUMP_S),
                "LEVELZERO_CLUSTER_LEASE_TTL_S": str(STALE_LEASE_TTL_S),
            },
        )
        for name in names
    ]
    try:
        await _start(daemons)
        await _settled(daemons[0], NODES)
        return [await _stale_move(daemons) for _ in range(rounds)]
    finally:
        for daemon in daemons:
            daemon.stop()


# ------------------------------------------------------------------ throughput with 1, 2, 3 nodes


def _throughput_body() -> bytes:
    import base64
    import json

    value = base64.b64encode(b"x" * THROUGHPUT_VALUE_BYTES).decode()
    return json.dumps({"records": [{"value": value}] * THROUGHPUT_BATCH}).encode()


async def _records_per_s(daemons: list[_Daemon], seconds: float) -> float:
    """Closed-loop producers, each on one partition, straight to its leader once found."""
    body = _throughput_body()
    stored = 0
    leaders: dict[int, str] = {}
    deadline = time.monotonic() + seconds

    async def producer(index: int, http: httpx.AsyncClient) -> None:
        nonlocal stored
        partition = index % THROUGHPUT_PARTITIONS
        path = f"/v1/topics/{THROUGHPUT_TOPIC}/partitions/{partition}/records"
        while time.monotonic() < deadline:
            base = leaders.get(partition) or daemons[index % len(daemons)].url
            try:
                response = await http.post(base + path, content=body, headers=_HEADERS)
            except httpx.HTTPError:
                leaders.pop(partition, None)
                continue
            if response.status_code == 200:
                stored += THROUGHPUT_BATCH
                if response.history:  # redirected: remember the leader
                    leaders[partition] = f"{response.url.scheme}://{response.url.netloc.decode()}"
            else:
                leaders.pop(partition, None)
                await anyio.sleep(0.05)

    started = time.monotonic()
    limits = httpx.Limits(max_connections=THROUGHPUT_PRODUCERS * 2)
    async with (
        httpx.AsyncClient(trust_env=False, timeout=30.0, follow_redirects=True, limits=limits) as http,
        anyio.create_task_group() as tg,
    ):
        for index in range(THROUGHPUT_PRODUCERS):
            tg.start_soon(producer, index, http)
    return stored / (time.monotonic() - started)


async def _throughput_pairs(
    root: Path, env: dict[str, str], cycles: int, seconds: float
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    daemons = [
        _Daemon(f"t{i + 1}", root, {**env, "LEVELZERO_CLUSTER_LEASE_TTL_S": "2"}) for i in range(NODES)
    ]
    two: list[tuple[float, float]] = []
    three: list[tuple[float, float]] = []
    try:
        await _start(daemons[:1])
        await _create(daemons[0], THROUGHPUT_TOPIC, THROUGHPUT_PARTITIONS)
        for _ in range(cycles):
            rates = []
            for k in (1, 2, 3):
                if k > 1:
                    await _start(daemons[k - 1 : k])
                await _settled(daemons[0], k)
                rates.append(await _records_per_s(daemons[:k], seconds))
            two.append((rates[1], rates[0]))
            three.append((rates[2], rates[0]))
            for daemon in daemons[1:]:
                daemon.stop()
        return two, three
    finally:
        for daemon in daemons:
            daemon.stop()


async def run(settings: Settings) -> list[Figure]:
    rounds = settings.pick(3, 1)
    ttl_s = settings.pick(10.0, 2.0)  # the default lease TTL; --quick shortens it
    with work_dir(settings, ITEM) as root:
        server = start_throwaway()
        try:
            async with moto_server(root) as s3_url:
                import boto3

                boto3.client(
                    "s3",
                    endpoint_url=s3_url,
                    region_name="us-east-1",
                    aws_access_key_id="bench",
                    aws_secret_access_key="bench",  # noqa: S106 - moto's
                ).create_bucket(Bucket=BUCKET)
                env = {
                    **{k: v for k, v in os.environ.items() if not k.startswith("LEVELZERO_")},
                    "LEVELZERO_CONTROL_KIND": "postgres",
                    "LEVELZERO_CONTROL_DSN": server.dsn(password=None),
                    "LEVELZERO_CONTROL_PASSWORD": SUPERUSER_PASSWORD,
                    "LEVELZERO_STORAGE_KIND": "s3",
                    "LEVELZERO_S3_ENDPOINT": s3_url,
                    "LEVELZERO_S3_BUCKET": BUCKET,
                    "LEVELZERO_S3_PATH_STYLE": "true",
                    "LEVELZERO_S3_ACCESS_KEY": "bench",
                    "LEVELZERO_S3_SECRET_KEY": "bench",
                    "LEVELZERO_CLUSTER_ENABLED": "true",
                }
                failover = await _failover_pairs(root, env, rounds, ttl_s)
                stale: list[tuple[float, float]] = []
                rejections: list[tuple[float, float]] = []
                windowed = await _stale_rounds(root, env, "windowed", rounds)
                strict = await _stale_rounds(root, env, "strict", rounds)
                for (w_stall, w_rej), (s_stall, s_rej) in zip(windowed, strict, strict=True):
                    stale.append((w_stall, s_stall))
                    rejections.append((w_rej, s_rej))
                two, three = await _throughput_pairs(root, env, settings.pick(2, 1), settings.pick(4.0, 1.0))
        finally:
            server.close()
    stale_notes = {
        "nodes": NODES,
        "epoch_cache_ttl_s": STALE_CACHE_TTL_S,
        "leader_epoch_cache_ttl_s": FRESH_CACHE_TTL_S,
        "epoch_bump_interval_s": STALE_BUMP_S,
        "window_s": STALE_WINDOW_S,
        "probe_s": STALE_PROBE_S,
        "lease_ttl_s": STALE_LEASE_TTL_S,
    }
    throughput_notes = {
        "partitions": THROUGHPUT_PARTITIONS,
        "producers": THROUGHPUT_PRODUCERS,
        "records_per_request": THROUGHPUT_BATCH,
        "value_bytes": THROUGHPUT_VALUE_BYTES,
    }
    return [
        figure(
            ITEM,
            f"failover after SIGKILL of a leader, {NODES} nodes (lease TTL {ttl_s:g} s)",
            "s",
            failover,
            target=Target((ttl_s + SLACK_S) / ttl_s, higher_is_better=False),
            sut_label="writes accepted again after",
            floor_label="lease TTL",
            notes={"nodes": NODES, "partitions": PARTITIONS, "probe_s": PROBE_S, "lease_ttl_s": ttl_s},
        ),
        figure(
            ITEM,
            "write stall after a move to a node with a stale epoch cache",
            "s",
            stale,
            sut_label="windowed",
            floor_label="strict",
            notes=stale_notes,
        ),
        figure(
            ITEM,
            "stale-epoch rejections in that move",
            "rejections",
            rejections,
            sut_label="windowed",
            floor_label="strict",
            notes=stale_notes,
        ),
        figure(
            ITEM,
            "produce throughput, 2 nodes vs 1 (shared CPUs)",
            "records/s",
            two,
            sut_label="2 nodes",
            floor_label="1 node",
            notes=throughput_notes,
        ),
        figure(
            ITEM,
            "produce throughput, 3 nodes vs 1 (shared CPUs)",
            "records/s",
            three,
            sut_label="3 nodes",
            floor_label="1 node",
            notes=throughput_notes,
        ),
    ]
