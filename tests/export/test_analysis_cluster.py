"""The analysis under `spark-submit` on a standalone cluster: a master and a worker started from
pyspark's bundled `spark-class`, on loopback, for this module only.

What it pins: spark-submit's master, `--name` and `--conf` reach the analysis unchanged (nothing
forces local[*], 8 shuffle partitions or another application name), the documented driver script
runs by path, and the results computed on the cluster's executor are the right ones.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pyspark
import pytest
from export_support import T0, sample, write_table

from levelzero.export import submit
from levelzero.export.manifest import Manifest, save
from levelzero.testing.loopback import free_local_port

pytestmark = pytest.mark.slow

SPARK_BIN = Path(pyspark.__file__).parent / "bin"
CLUSTER_START_TIMEOUT_S = 180.0
POLL_INTERVAL_S = 0.5
SUBMIT_TIMEOUT_S = 900.0
EPOCHS = 1_000


def loopback_env() -> dict[str, str]:
    return {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }


def alive_workers(webui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{webui_port}/json/", timeout=5) as reply:
            return json.load(reply).get("aliveworkers", 0)
    except OSError:
        return 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """spark://127.0.0.1:PORT with one registered worker (one core)."""
    base = tmp_path_factory.mktemp("cluster")
    port, master_ui, worker_ui = free_local_port(), free_local_port(), free_local_port()
    url = f"spark://127.0.0.1:{port}"
    spark_class = str(SPARK_BIN / "spark-class")
    commands = [
        [
            spark_class,
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(master_ui),
        ],
        [
            spark_class,
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            "127.0.0.1",
            "--cores",
            "1",
            "--memory",
            "1g",
            "--webui-port",
            str(worker_ui),
            "--work-dir",
            str(base / "work"),
            url,
        ],
    ]
    processes = []
    try:
        for index, command in enumerate(commands):
            log = open(base / f"daemon-{index}.log", "wb")  # noqa: SIM115 - closed below
            processes.append(
                (
                    subprocess.Popen(
                        command,
                        cwd=base,
                        env=loopback_env(),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    ),
                    log,
                )
            )
        deadline = time.monotonic() + CLUSTER_START_TIMEOUT_S
        while alive_workers(master_ui) < 1:
            for process, _ in processes:
                assert process.poll() is None, f"a cluster daemon exited: see {base}"
            assert time.monotonic() < deadline, f"no worker registered in time: see {base}"
            time.sleep(POLL_INTERVAL_S)
        yield url
    finally:
        for process, log in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
            log.close()


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export")
    samples = [sample(p + 1, 0.0, p, 1) for p in range(3)]
    samples += [sample(4, 10.0, 1, 2), sample(5, 10.0, 2, 2), sample(6, 20.0, 0, 2)]
    write_table(out, "state_samples", samples)
    write_table(
        out,
        "fence_events",
        [
            dict(
                seq=e,
                decided_at=T0 + e * 0.02,
                topic="a",
                partition=e % 3,
                term=1,
                epoch=e,
                outcome="rejected" if e % 100 == 0 else "admitted",
                window_min=e - 1,
                window_max=e,
                decisions=1,
            )
            for e in range(1, EPOCHS + 1)
        ],
    )
    save(str(out), Manifest(last_seq=1))
    return out


def test_the_analysis_runs_unchanged_under_spark_submit_on_a_standalone_cluster(
    cluster: str, export_dir: Path, tmp_path: Path
) -> None:
    report = tmp_path / "report"
    command = [
        str(SPARK_BIN / "spark-submit"),
        "--master",
        cluster,
        "--name",
        "nightly-lz-report",
        "--conf",
        "spark.sql.shuffle.partitions=3",
        "--conf",
        "spark.ui.enabled=false",
        "--driver-memory",
        "512m",
        "--executor-memory",
        "512m",
        submit.__file__,
        "--in",
        str(export_dir),
        "--out",
        f"file://{report}",
        "--bucket-s",
        "1",
    ]
    done = subprocess.run(
        command,
        cwd=tmp_path,
        env=loopback_env(),
        capture_output=True,
        text=True,
        timeout=SUBMIT_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"on {cluster}, 3 shuffle partitions, application nightly-lz-report" in done.stdout
    holders = pq.read_table(report / "tables" / "partition_watermarks.parquet").to_pylist()
    assert {f"{r['topic']}/{r['partition']}": r["seconds_holding_m"] for r in holders} == {
        "a/0": 10.0,
        "a/1": 0.0,
        "a/2": 0.0,
    }
    fence = pq.read_table(report / "tables" / "fence_by_window.parquet").to_pylist()
    assert len(fence) == 200 and {r["window_max_to"] - r["window_max_from"] for r in fence} == {4}
    assert sum(r["events"] for r in fence) == EPOCHS
    assert sum(r["rejected"] for r in fence) == EPOCHS // 100
    assert (report / "report.html").stat().st_size > 10_000
