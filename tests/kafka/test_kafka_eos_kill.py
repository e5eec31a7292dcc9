"""Exactly-once through crashes: a consume-transform-produce application (tests/kafka/eos_app.py:
confluent-kafka's transactional producer, a read_committed consumer, the input offsets committed
with `send_offsets_to_transaction`) runs against a `levelzero run` daemon that is SIGKILLed and
restarted at seeded random points, and is itself SIGKILLed once and restarted. Every input record
is in the output topic exactly once, read with read_committed, and the group's committed offsets
are at the input's end."""

from __future__ import annotations

import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from daemon_support import DaemonProcess, clean_environ, free_port

SOURCE, SINK = "eos-in", "eos-out"
PARTITIONS = 2
RECORDS = 2_000
SEED = 36
DAEMON_KILLS = 3
APP_KILLS = 1
PROGRESS_WAIT_S = 90.0
APP = Path(__file__).with_name("eos_app.py")
COMMITTED = re.compile(rb"^committed (\d+)$", re.M)


class App:
    """The application as a child process, restartable; its progress summed over incarnations."""

    def __init__(self, port: int, log_dir: Path) -> None:
        self.port = port
        self.log_dir = log_dir
        self.starts = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def log_path(self, start: int) -> Path:
        return self.log_dir / f"app-{start}.log"

    def ensure_running(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        self.starts += 1
        with self.log_path(self.starts).open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(APP), str(self.port), SOURCE, SINK, str(PARTITIONS), "eos-app-tx"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=clean_environ(),
            )

    def transactions(self) -> int:
        total = 0
        for start in range(1, self.starts + 1):
            counts = COMMITTED.findall(self.log_path(start).read_bytes())
            total += int(counts[-1]) if counts else 0
        return total

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(timeout=30)

    def logs(self) -> str:
        return "\n".join(
            f"--- app {s}\n" + self.log_path(s).read_text(errors="replace")[-2000:]
            for s in range(1, self.starts + 1)
        )


def produce_inputs(port: int) -> None:
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "enable.idempotence": True})
    for i in range(RECORDS):
        producer.produce(SOURCE, value=b"%05d" % i, partition=i % PARTITIONS)
        if i % 500 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


def committed_inputs(port: int) -> int:
    consumer = Consumer(
        {"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "eos-app", "enable.auto.commit": False}
    )
    try:
        tps = consumer.committed([TopicPartition(SOURCE, p) for p in range(PARTITIONS)], timeout=10)
        return sum(max(tp.offset, 0) for tp in tps)
    finally:
        consumer.close()


def read_committed_output(port: int) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": "eos-checker",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    values: list[bytes] = []
    try:
        consumer.assign([TopicPartition(SINK, p, 0) for p in range(PARTITIONS)])
        empty = 0
        for _ in range(RECORDS * 2):
            message = consumer.poll(0.5)
            if message is None:
                empty += 1
                if empty >= 6:
                    break
                continue
            empty = 0
            assert message.error() is None, message.error()
            values.append(message.value())
    finally:
        consumer.close()
    return values


def wait_for_progress(app: App, target: int) -> None:
    """Until the application committed `target` transactions in all (restarted if it exited)."""
    deadline = time.monotonic() + PROGRESS_WAIT_S
    while app.transactions() < target:
        assert time.monotonic() < deadline, f"no progress to {target} transactions:\n{app.logs()}"
        app.ensure_running()
        time.sleep(0.02)


def test_consume_transform_produce_through_sigkills_processes_each_input_once(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    kafka_port = free_port()
    daemon = DaemonProcess(
        tmp_path / "data", tmp_path, env={"LEVELZERO_KAFKA_LISTEN": f"127.0.0.1:{kafka_port}"}
    )
    app = App(kafka_port, tmp_path)
    try:
        daemon.start()
        with daemon.http() as http:
            for topic in (SOURCE, SINK):
                assert (
                    http.post("/v1/topics", json={"name": topic, "partitions": PARTITIONS}).status_code == 201
                )
        produce_inputs(kafka_port)
        app.ensure_running()
        kills = ["daemon"] * DAEMON_KILLS + ["app"] * APP_KILLS
        rng.shuffle(kills)
        for victim in kills:
            # a random point: some transactions on, then a random moment within the next one
            wait_for_progress(app, app.transactions() + rng.randint(2, 8))
            time.sleep(rng.uniform(0.0, 0.05))
            if victim == "daemon":
                daemon.signal(signal.SIGKILL)
                daemon.wait_exit()
                daemon.start()
            else:
                app.kill()
        deadline = time.monotonic() + PROGRESS_WAIT_S
        while committed_inputs(kafka_port) < RECORDS:
            assert time.monotonic() < deadline, f"inputs left unprocessed:\n{app.logs()}"
            app.ensure_running()
            time.sleep(0.2)
        app.kill()
        assert app.starts > APP_KILLS  # the kills did restart it
        assert committed_inputs(kafka_port) == RECORDS
        output = read_committed_output(kafka_port)
        counts = Counter(output)
        assert [v for v, n in counts.items() if n > 1] == []  # nothing twice
        assert sorted(output) == [b"out-%05d" % i for i in range(RECORDS)]  # nothing lost
    finally:
        app.kill()
        daemon.cleanup()
