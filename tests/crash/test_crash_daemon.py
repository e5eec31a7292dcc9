"""Crash test of the real daemon: SIGKILL at random moments against S3 (moto), with injected
object-store errors and latency, restart each time; then check the two promises. Run with each
control plane: SQLite in the data directory, and PostgreSQL.

- every acknowledged record is readable byte for byte at its offset (during the run and after);
- after the workload stops and the reconciler, housekeeper and GC catch up, no L0 object is left.

Bounded in time; the seed is printed (`LEVELZERO_TEST_CRASH_SEED=N` replays the schedule).
"""

from __future__ import annotations

import base64
import os
import random
import threading
import time
from pathlib import Path

import httpx
import pytest

from daemon_support import QUIESCENT_ENVIRON, DaemonProcess, postgres_control, s3_environ

pytestmark = [pytest.mark.s3, pytest.mark.slow]

CYCLES = 6
PARTITIONS = 4
PRODUCERS = 4
READERS = 2
RUN_S = (0.5, 2.5)  # each cycle runs this long (uniform) before SIGKILL
QUIESCE_TIMEOUT_S = 90.0
TOPIC = "crash"
L0_PREFIX = "level_zero/data/"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def daemon_environ(s3_endpoint, bucket: str) -> dict[str, str]:
    return {**s3_environ(s3_endpoint, bucket), **QUIESCENT_ENVIRON, "LEVELZERO_BATCHER_LINGER_MS": "20"}


class Workload:
    """Producers and readers in threads; `acked` is the ground truth of acknowledged records."""

    def __init__(self, url: str, rng: random.Random, cycle: int) -> None:
        self.url = url
        self.rng = random.Random(rng.randrange(1 << 30))
        self.cycle = cycle
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.acked: dict[tuple[int, int], bytes] = {}
        self.violations: list[str] = []
        self.reads_checked = 0

    def produce(self, worker: int) -> None:
        rng = random.Random(self.rng.randrange(1 << 30))
        n = 0
        with httpx.Client(base_url=self.url, trust_env=False, timeout=10.0) as http:
            while not self.stop.is_set():
                p = rng.randrange(PARTITIONS)
                values = [
                    f"c{self.cycle}-w{worker}-n{n + i}-".encode() + os.urandom(rng.randrange(0, 64))
                    for i in range(rng.randint(1, 3))
                ]
                n += len(values)
                try:
                    r = http.post(
                        f"/v1/topics/{TOPIC}/partitions/{p}/records",
                        json={"records": [{"key": None, "value": b64(v)} for v in values]},
                    )
                except httpx.HTTPError:
                    continue  # killed mid-request: not acknowledged
                if r.status_code == 200:
                    base = r.json()["base_offset"]
                    with self.lock:
                        for i, v in enumerate(values):
                            self.acked[(p, base + i)] = v

    def read(self, known: dict[tuple[int, int], bytes]) -> None:
        rng = random.Random(self.rng.randrange(1 << 30))
        with httpx.Client(base_url=self.url, trust_env=False, timeout=10.0) as http:
            while not self.stop.is_set():
                with self.lock:
                    pool = list(self.acked.items())
                pool += rng.sample(sorted(known.items()), min(len(known), 8)) if known else []
                if not pool:
                    time.sleep(0.01)
                    continue
                (p, offset), expected = rng.choice(pool)
                try:
                    r = http.get(
                        f"/v1/topics/{TOPIC}/partitions/{p}/records",
                        params={"offset": offset, "max_bytes": 1024},
                    )
                except httpx.HTTPError:
                    continue
                if r.status_code != 200:
                    if r.json().get("error") in ("object_not_found", "offset_out_of_range", "corrupt_data"):
                        self.violations.append(f"read {p}/{offset}: {r.status_code} {r.text}")
                    continue  # injected faults: 503 storage_error is retriable
                records = r.json()["records"]
                got = base64.b64decode(records[0]["value"]) if records else None
                if not records or records[0]["offset"] != offset or got != expected:
                    self.violations.append(f"read {p}/{offset}: expected {expected!r}, got {records[:1]}")
                self.reads_checked += 1


def read_everything(url: str) -> dict[tuple[int, int], bytes]:
    out: dict[tuple[int, int], bytes] = {}
    with httpx.Client(base_url=url, trust_env=False, timeout=30.0) as http:
        for p in range(PARTITIONS):
            offset = 0
            while True:
                r = http.get(
                    f"/v1/topics/{TOPIC}/partitions/{p}/records",
                    params={"offset": offset, "max_bytes": 1 << 20},
                )
                assert r.status_code == 200, r.text
                body = r.json()
                for rec in body["records"]:
                    out[(p, rec["offset"])] = base64.b64decode(rec["value"])
                if body["next_offset"] >= body["high_watermark"]:
                    break
                offset = body["next_offset"]
    return out


def l0_keys(s3_endpoint, bucket: str) -> list[str]:
    client = s3_endpoint.boto3_client()
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=L0_PREFIX):
        keys.extend(o["Key"] for o in page.get("Contents", []))
    return keys


@pytest.mark.parametrize("control", ["sqlite", "postgres"])
def test_sigkill_at_random_moments_loses_nothing_and_leaks_nothing(
    tmp_path: Path,
    s3_endpoint,
    s3_bucket: str,
    control: str,
    request: pytest.FixtureRequest,
) -> None:
    seed = int(os.environ.get("LEVELZERO_TEST_CRASH_SEED", random.randrange(1 << 30)))
    print(f"crash test seed: {seed} (replay with LEVELZERO_TEST_CRASH_SEED={seed})")
    rng = random.Random(seed)
    environ = daemon_environ(s3_endpoint, s3_bucket)
    if control == "postgres":  # the control plane in PostgreSQL, killed mid-transaction
        environ.update(postgres_control(request.getfixturevalue("postgres_dsn")))
    daemon = DaemonProcess(tmp_path / "data", tmp_path, environ)
    acked: dict[tuple[int, int], bytes] = {}
    violations: list[str] = []
    reads = 0
    try:
        for cycle in range(CYCLES):
            daemon.env["LEVELZERO_TEST_FAULTS"] = (
                f"error_rate=0.02,latency_ms=3,seed={rng.randrange(1 << 30)}"
            )
            daemon.start()
            if cycle == 0:
                with daemon.http() as http:
                    r = http.post("/v1/topics", json={"name": TOPIC, "partitions": PARTITIONS})
                    assert r.status_code in (200, 201), r.text
            work = Workload(daemon.url, rng, cycle)
            threads = [threading.Thread(target=work.produce, args=(w,)) for w in range(PRODUCERS)]
            threads += [threading.Thread(target=work.read, args=(dict(acked),)) for _ in range(READERS)]
            for t in threads:
                t.start()
            time.sleep(rng.uniform(*RUN_S))
            daemon.proc.kill()  # SIGKILL: mid-upload, mid-commit, mid-reconcile, mid-GC
            daemon.proc.wait()
            work.stop.set()
            for t in threads:
                t.join(timeout=30)
                assert not t.is_alive()
            acked.update(work.acked)
            violations += work.violations
            reads += work.reads_checked
        assert acked, "the workload acknowledged nothing"

        daemon.env.pop("LEVELZERO_TEST_FAULTS")
        daemon.start()
        stored = read_everything(daemon.url)
        missing = {k: v for k, v in acked.items() if stored.get(k) != v}
        assert not missing, (
            f"{len(missing)} acknowledged records lost or changed, e.g. {list(missing.items())[:3]}"
        )

        deadline = time.monotonic() + QUIESCE_TIMEOUT_S
        left = l0_keys(s3_endpoint, s3_bucket)
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = l0_keys(s3_endpoint, s3_bucket)
        assert not left, f"{len(left)} L0 objects leaked after quiescence, e.g. {left[:3]}"

        stored = read_everything(daemon.url)
        missing = {k: v for k, v in acked.items() if stored.get(k) != v}
        assert not missing, f"{len(missing)} acknowledged records unreadable after GC"
        assert not violations, violations[:5]
        print(f"crash test: {len(acked)} acknowledged records, {reads} reads checked, {CYCLES} kills")
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()
