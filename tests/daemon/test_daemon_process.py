"""`levelzero run` as a real process: HTTP round trips, the CLI client commands, SIGTERM (drain,
exit 0, data survives), SIGKILL mid-load (every acknowledged record survives, byte for byte),
SIGHUP (logs re-opened), and the systemd notify protocol."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import sqlite3
import socket
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
from daemon_support import DaemonProcess

PRODUCER_THREADS = 4
ACKED_BEFORE_SIGNAL = 300


def produce(http: httpx.Client, topic: str, partition: int, values: list[bytes]) -> dict:
    response = http.post(
        f"/v1/topics/{topic}/partitions/{partition}/records",
        json={"records": [{"value": base64.b64encode(v).decode()} for v in values]},
    )
    assert response.status_code == 200, response.text
    return response.json()


def read_all(http: httpx.Client, topic: str, partition: int) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    offset = 0
    while True:
        response = http.get(f"/v1/topics/{topic}/partitions/{partition}/records", params={"offset": offset})
        assert response.status_code == 200, response.text
        body = response.json()
        for record in body["records"]:
            out[record["offset"]] = base64.b64decode(record["value"])
        if not body["records"] or body["next_offset"] >= body["high_watermark"]:
            return out
        offset = body["next_offset"]


class ProduceLoad:
    """Threads producing to one partition each, remembering exactly what was acknowledged."""

    def __init__(self, url: str, topic: str) -> None:
        self.url = url
        self.topic = topic
        self.acked: dict[tuple[int, int], bytes] = {}
        self.lock = threading.Lock()
        self.enough = threading.Event()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(p,)) for p in range(PRODUCER_THREADS)]

    def run(self, partition: int) -> None:
        seq = 0
        with httpx.Client(base_url=self.url, trust_env=False, timeout=30.0) as http:
            while not self.stop.is_set():
                values = [f"{partition}-{seq}-{i}-".encode() + os.urandom(i * 7) for i in range(5)]
                seq += 1
                try:
                    response = http.post(
                        f"/v1/topics/{self.topic}/partitions/{partition}/records",
                        json={"records": [{"value": base64.b64encode(v).decode()} for v in values]},
                    )
                except httpx.HTTPError:
                    return  # the daemon went away: this request was not acknowledged
                if response.status_code != 200:
                    assert response.status_code == 503, response.text  # shutting down
                    return
                base = response.json()["base_offset"]
                with self.lock:
                    for i, value in enumerate(values):
                        self.acked[(partition, base + i)] = value
                    if len(self.acked) >= ACKED_BEFORE_SIGNAL:
                        self.enough.set()

    def __enter__(self) -> ProduceLoad:
        for thread in self.threads:
            thread.start()
        assert self.enough.wait(timeout=60), "the producers did not get going"
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)
            assert not thread.is_alive()


def assert_all_acked_present(process: DaemonProcess, topic: str, acked: dict[tuple[int, int], bytes]) -> None:
    with process.http() as http:
        stored = {
            (p, offset): value
            for p in range(PRODUCER_THREADS)
            for offset, value in read_all(http, topic, p).items()
        }
    missing = [key for key in acked if key not in stored]
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:5]}"
    wrong = [key for key, value in acked.items() if stored[key] != value]
    assert not wrong, f"{len(wrong)} records differ, e.g. {wrong[:5]}"


def test_create_produce_consume_status_over_http(daemon_process: DaemonProcess) -> None:
    with daemon_process.http() as http:
        assert http.post("/v1/topics", json={"name": "orders", "partitions": 2}).status_code == 201
        assert http.get("/v1/topics").json() == {"topics": [{"name": "orders", "partitions": 2}]}
        ack = produce(http, "orders", 1, [b"first", b"second"])
        assert (ack["base_offset"], ack["last_offset"]) == (0, 1)
        assert read_all(http, "orders", 1) == {0: b"first", 1: b"second"}
        status = http.get("/v1/status").json()
        assert status["cluster_epoch"] >= 1 and status["accepting"] is True
        partition = next(p for p in status["partitions"] if p["partition"] == 1)
        assert partition["high_watermark"] == 2 and partition["start_offset"] == 0
        for key in (
            "term",
            "window",
            "previous_applied_epoch",
            "max_applied_epoch",
            "min_epoch_lower_bound",
            "mp",
            "lro",
        ):
            assert key in partition
        json_type = {"content-type": "application/json"}
        assert (
            http.post("/v1/epoch/advance", headers=json_type).json()["cluster_epoch"]
            == status["cluster_epoch"] + 1
        )
        assert "levelzero_cluster_epoch" in http.get("/metrics").text
        bad = http.post("/v1/topics/orders/partitions/0/records", content=b"{nope", headers=json_type)
        assert bad.status_code == 400 and bad.json()["error"] == "malformed_request"
        assert http.get("/readyz").status_code == 200  # still serving
    assert daemon_process.stop() == 0


def test_cli_client_commands(daemon_process: DaemonProcess) -> None:
    result = daemon_process.cli("topics", "create", "logs", "--partitions", "3")
    assert result.returncode == 0, result.stderr
    assert b"created topic logs with 3 partitions" in result.stdout
    assert daemon_process.cli("topics", "list").stdout == b"TOPIC  PARTITIONS\nlogs   3\n"

    result = daemon_process.cli("produce", "logs", "-p", "2", "alpha", "beta")
    assert result.returncode == 0 and b"at offsets 0..1" in result.stdout
    lines = b"".join(f"line {i}\n".encode() for i in range(12_000))
    result = daemon_process.cli("produce", "logs", "-p", "1", "--batch-records", "500", input=lines)
    assert result.returncode == 0, result.stderr
    assert b"produced 12000 records to logs/1 at offsets 0..11999" in result.stdout
    assert result.stderr.startswith(b"produced 10000 records (0.1 MiB)\n")  # progress line

    result = daemon_process.cli("consume", "logs", "-p", "2", "--format", "offsets")
    assert result.stdout == b"0\talpha\n1\tbeta\n"
    result = daemon_process.cli("consume", "logs", "-p", "1", "--offset", "11998")
    assert result.stdout == b"line 11998\nline 11999\n"
    result = daemon_process.cli(
        "consume",
        "logs",
        "-p",
        "1",
        "--follow",
        "--offset",
        "11999",
        "--max-records",
        "1",
        "--format",
        "json",
    )
    assert json.loads(result.stdout)["offset"] == 11999

    result = daemon_process.cli("epoch", "advance")
    assert result.returncode == 0 and result.stdout.startswith(b"cluster epoch is now ")
    result = daemon_process.cli("status")
    assert result.returncode == 0
    assert b"PARTITION" in result.stdout and b"logs/1" in result.stdout
    assert (
        json.loads(daemon_process.cli("status", "--json").stdout)["partitions"][1]["high_watermark"] == 12000
    )

    result = daemon_process.cli("consume", "nope")
    assert result.returncode == 1
    assert result.stderr == b"levelzero: unknown topic 'nope' (unknown_topic, HTTP 404)\n"
    result = daemon_process.cli("topics", "create", "logs")
    assert result.returncode == 1 and b"topic_exists" in result.stderr and b"Traceback" not in result.stderr
    result = daemon_process.cli("status", "--url", "http://127.0.0.1:1")
    assert result.returncode == 1 and b"cannot reach levelzero" in result.stderr
    assert daemon_process.stop() == 0


def test_sigterm_drains_exits_zero_and_acknowledged_records_survive(daemon_process: DaemonProcess) -> None:
    with daemon_process.http() as http:
        assert http.post("/v1/topics", json={"name": "t", "partitions": PRODUCER_THREADS}).status_code == 201
    with ProduceLoad(daemon_process.url, "t") as load:
        daemon_process.signal(signal.SIGTERM)  # producers are mid-flight
        assert daemon_process.wait_exit() == 0
    log = daemon_process.log()
    assert "stopping: draining in-flight produces" in log and "clean=true" in log
    daemon_process.start()
    assert_all_acked_present(daemon_process, "t", load.acked)
    assert daemon_process.stop() == 0


def test_sigkill_mid_produce_loses_no_acknowledged_record(daemon_process: DaemonProcess) -> None:
    with daemon_process.http() as http:
        assert http.post("/v1/topics", json={"name": "t", "partitions": PRODUCER_THREADS}).status_code == 201
    with ProduceLoad(daemon_process.url, "t") as load:
        daemon_process.signal(signal.SIGKILL)
        assert daemon_process.wait_exit() == -signal.SIGKILL
    assert len(load.acked) >= ACKED_BEFORE_SIGNAL
    daemon_process.start()
    assert_all_acked_present(daemon_process, "t", load.acked)
    with daemon_process.http() as http:  # and it takes writes again after the crash
        assert produce(http, "t", 0, [b"after restart"])["base_offset"] >= 0
    assert daemon_process.stop() == 0


def test_sighup_reopens_the_log_file(make_daemon_process, tmp_path: Path) -> None:
    log_file = tmp_path / "levelzero.log"
    process = make_daemon_process(
        {"LEVELZERO_LOGGING_FILE": str(log_file), "LEVELZERO_LOGGING_FORMAT": "json"}
    )
    process.start()
    rotated = tmp_path / "levelzero.log.1"
    log_file.rename(rotated)  # what logrotate does
    process.signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while not (log_file.exists() and "log handlers re-opened" in log_file.read_text()):
        assert time.monotonic() < deadline, "no new log file after SIGHUP"
        assert process.proc.poll() is None, process.log()
        time.sleep(0.05)
    assert "levelzero ready" in rotated.read_text()
    assert process.stop() == 0
    events = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert any(event["msg"] == "levelzero stopped" and event["clean"] for event in events)


def test_notify_socket_gets_ready_watchdog_and_stopping(make_daemon_process) -> None:
    name = f"levelzero-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(b"\0" + name.encode())
        notify.settimeout(0.2)
        process = make_daemon_process({"NOTIFY_SOCKET": f"@{name}", "WATCHDOG_USEC": "200000"})
        process.start(wait=False)
        messages: list[str] = []

        def receive_until(line: str, timeout_s: float = 30.0) -> None:
            deadline = time.monotonic() + timeout_s
            while not any(line in m.splitlines() for m in messages):
                assert time.monotonic() < deadline, f"no {line} in {messages!r}:\n{process.log()}"
                assert process.proc.poll() is None or line == "STOPPING=1", process.log()
                with contextlib.suppress(TimeoutError):
                    messages.append(notify.recv(4096).decode())

        receive_until("READY=1")
        ready = next(m for m in messages if "READY=1" in m.splitlines())
        # While replaying, start-up asked for more time (the unit's TimeoutStartSec is short).
        extend = next(i for i, m in enumerate(messages) if m.startswith("EXTEND_TIMEOUT_USEC="))
        assert extend < messages.index(ready) and messages[extend] == "EXTEND_TIMEOUT_USEC=30000000"
        assert f"MAINPID={process.proc.pid}" in ready.splitlines()
        assert any(line.startswith("STATUS=serving on") for line in ready.splitlines())
        process.wait_ready()  # READY=1 came when the HTTP listener was already serving
        messages.clear()
        receive_until("WATCHDOG=1")
        receive_until("WATCHDOG=1")  # keeps coming
        process.signal(signal.SIGTERM)
        receive_until("STOPPING=1")
        assert process.wait_exit() == 0


def test_watchdog_for_another_pid_is_not_ours(make_daemon_process) -> None:
    name = f"levelzero-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(b"\0" + name.encode())
        notify.settimeout(0.2)
        process = make_daemon_process(
            {"NOTIFY_SOCKET": f"@{name}", "WATCHDOG_USEC": "100000", "WATCHDOG_PID": "1"}
        )
        process.start()
        process.signal(signal.SIGTERM)
        assert process.wait_exit() == 0
        messages = []
        while True:
            try:
                messages.append(notify.recv(4096).decode())
            except TimeoutError:
                break
        lines = [line for m in messages for line in m.splitlines()]
        assert "READY=1" in lines and "STOPPING=1" in lines
        assert "WATCHDOG=1" not in lines


def test_bad_configuration_exits_2_without_restart_loop(make_daemon_process) -> None:
    process = make_daemon_process({"LEVELZERO_NODE_FENCING_MODE": "sloppy"})
    process.start(wait=False)
    assert process.wait_exit() == 2
    assert "LEVELZERO_NODE_FENCING_MODE (node.fencing_mode) = 'sloppy'" in process.log()


def test_a_store_of_a_newer_schema_exits_2_without_restart_loop(make_daemon_process) -> None:
    """A restart cannot fix a newer schema: exit 2, which systemd does not restart."""
    process = make_daemon_process()
    process.start()
    assert process.stop() == 0
    with sqlite3.connect(process.data_dir / "levelzero.db") as connection:
        connection.execute("PRAGMA user_version = 99")
    process.start(wait=False)
    assert process.wait_exit() == 2
    assert "schema version 99 is newer than this levelzero supports" in process.log()
    assert "Traceback" not in process.log()


def test_a_busy_port_is_a_clear_start_up_error(daemon_process: DaemonProcess, make_daemon_process) -> None:
    second = make_daemon_process(name="other")
    second.port = daemon_process.port
    second.start(wait=False)
    assert second.wait_exit() == 1
    assert f"cannot listen on 127.0.0.1:{daemon_process.port}" in second.log()
    assert second.log().count(f"cannot listen on 127.0.0.1:{daemon_process.port}") == 1  # printed once
    assert "Traceback" not in second.log()
    assert daemon_process.stop() == 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stop_signals_exit_zero(make_daemon_process, signum: int) -> None:
    process = make_daemon_process()
    process.start()
    process.signal(signum)
    assert process.wait_exit() == 0
