"""Item 12: failover of a three-node cluster — how long a SIGKILLed leader's partition refuses
writes, against the lease TTL.

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
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx

from levelzero.storage.postgres.throwaway import SUPERUSER_PASSWORD, start_throwaway

from .common import Figure, Settings, Target, figure, moto_server, work_dir
from .moto_fill import free_local_port

ITEM = "cluster"
NODES = 3
PARTITIONS = 6
TOPIC = "failover"
PROBE_S = 0.05
SLACK_S = 2.0  # the target: failover within the TTL plus this
START_TIMEOUT_S = 60.0
BUCKET = "levelzero-bench-cluster"


class _Daemon:
    def __init__(self, name: str, root: Path, env: dict[str, str]) -> None:
        self.name = name
        self.port = free_local_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = root / name
        self.log_path = root / f"{name}.log"
        self.env = {
            **env, "LEVELZERO_CLUSTER_NODE_ID": name, "LEVELZERO_CLUSTER_ADVERTISE_URL": self.url,
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log_file:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "levelzero.daemon.cli", "run", "--data-dir", str(self.data_dir),
                 "--listen", f"127.0.0.1:{self.port}"],
                stdout=log_file, stderr=subprocess.STDOUT, env=self.env,
            )

    async def ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        async with httpx.AsyncClient(trust_env=False, timeout=2.0) as http:
            while time.monotonic() < deadline:
                assert self.proc is not None and self.proc.poll() is None, (
                    f"node {self.name} exited: {self.log_path.read_text()[-2000:]}")
                try:
                    if (await http.get(f"{self.url}/readyz")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await anyio.sleep(0.1)
        raise AssertionError(f"node {self.name} not ready in {START_TIMEOUT_S} s")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


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


async def run(settings: Settings) -> list[Figure]:
    rounds = settings.pick(3, 1)
    ttl_s = settings.pick(10.0, 2.0)  # the default lease TTL; --quick shortens it
    with work_dir(settings, ITEM) as root:
        server = start_throwaway()
        try:
            async with moto_server(root) as s3_url:
                import boto3  # noqa: PLC0415 - the bench's moto client

                boto3.client("s3", endpoint_url=s3_url, region_name="us-east-1",
                             aws_access_key_id="bench", aws_secret_access_key="bench").create_bucket(Bucket=BUCKET)
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
                    "LEVELZERO_CLUSTER_LEASE_TTL_S": str(ttl_s),
                }
                daemons = [_Daemon(f"n{i + 1}", root, env) for i in range(NODES)]
                try:
                    for daemon in daemons:
                        daemon.start()
                    for daemon in daemons:
                        await daemon.ready()
                    async with httpx.AsyncClient(trust_env=False, timeout=10.0) as http:
                        created = await http.post(
                            daemons[0].url + "/v1/topics", json={"name": TOPIC, "partitions": PARTITIONS},
                        )
                        assert created.status_code == 201, created.text
                    pairs = []
                    for _ in range(rounds):
                        leader = await _leader(daemons)
                        pairs.append((await _failover_s(daemons, leader), ttl_s))
                        leader.start()
                        await leader.ready()
                        await anyio.sleep(ttl_s)  # it rejoins and takes its share back
                finally:
                    for daemon in daemons:
                        daemon.stop()
        finally:
            server.close()
    return [
        figure(
            ITEM,
            f"failover after SIGKILL of a leader, {NODES} nodes (lease TTL {ttl_s:g} s)",
            "s",
            pairs,
            target=Target((ttl_s + SLACK_S) / ttl_s, higher_is_better=False),
            sut_label="writes accepted again after",
            floor_label="lease TTL",
            notes={"nodes": NODES, "partitions": PARTITIONS, "probe_s": PROBE_S, "lease_ttl_s": ttl_s},
        )
    ]
