"""A Faust application (faust-streaming, on aiokafka; tests/kafka/faust_app.py) against a levelzero
listener: an agent keeps a running sum per key in a Table, which Faust logs to a changelog topic it
creates compacted, and writes each new sum to an output topic it creates.

At-least-once through a SIGKILL: the first run stops for good inside one record, once the record's
new sum is in the changelog but before the record is acknowledged, so its offset is not committed
(the window at-least-once leaves); the test SIGKILLs it there and runs the application again on an
empty data directory, so the table comes back from the changelog alone. What Faust guarantees, and
the test checks: the rerun resumes at the committed offset with the table the changelog holds, so
every input is counted, and the record processed twice is counted twice (its sum was logged before
the kill). The final table is the arithmetic plus that record, no more, no less.

The application runs as a subprocess on the Python of the apps' virtual environment, `.venv-apps`,
which `make test` builds from tests/apps/requirements.txt (LEVELZERO_TEST_APPS_PYTHON names another
interpreter that has Faust)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from daemon_support import clean_environ, daemon_and_client

REPO = Path(__file__).resolve().parents[2]
APP = Path(__file__).with_name("faust_app.py")
GROUP = "summing"  # the application's id: its consumer group and its topics' prefix
CHANGELOG = "summing-totals-changelog"
RECORDS = 60
KEYS = 3
HANG_AT = 20  # the input offset the first run stops inside
WAIT_S = 60.0  # each wait for the application's progress


def apps_python() -> str:
    """The interpreter that has Faust; a one-line instruction where there is none."""
    python = os.environ.get("LEVELZERO_TEST_APPS_PYTHON") or str(REPO / ".venv-apps" / "bin" / "python")
    probe = subprocess.run([python, "-c", "import faust"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.fail(f"Faust is not installed for {python}: run `make .venv-apps/.installed`")
    return python


def value_of(i: int) -> int:
    return i + 1  # no zero: a record counted twice always shows


def key_of(i: int) -> str:
    return f"k{i % KEYS}"


def running_sums(inputs: range, start: dict[str, int] | None = None) -> list[tuple[str, int]]:
    """(key, running sum) after each input, from `start`'s sums."""
    totals = dict.fromkeys((key_of(i) for i in range(KEYS)), 0) | (start or {})
    out = []
    for i in inputs:
        totals[key_of(i)] += value_of(i)
        out.append((key_of(i), totals[key_of(i)]))
    return out


def wait_until(condition: Callable[[], bool], what: str, app: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert app.poll() is None, f"the application exited ({app.returncode}) before {what}"
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        time.sleep(0.1)


class Kafka:
    """What the test reads and writes over the Kafka protocol (confluent-kafka)."""

    def __init__(self, port: int) -> None:
        self.bootstrap = f"127.0.0.1:{port}"

    def produce_numbers(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True})
        for i in range(RECORDS):
            producer.produce("numbers", key=key_of(i), value=json.dumps({"n": value_of(i)}).encode())
        assert producer.flush(30) == 0

    def committed(self) -> int:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": GROUP})
        try:
            return consumer.committed([TopicPartition("numbers", 0)], timeout=10)[0].offset
        finally:
            consumer.close()

    def read(self, topic: str) -> list[tuple[str, bytes]]:
        """`topic`/0 from the start to its high watermark (bounded: 300 polls of 0.1 s)."""
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"check-{time.monotonic_ns()}"})
        try:
            tp = TopicPartition(topic, 0)
            high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1]
            consumer.assign([TopicPartition(topic, 0, 0)])
            out: list[tuple[str, bytes]] = []
            for _ in range(300):
                if len(out) >= high:
                    break
                message = consumer.poll(0.1)
                if message is not None and message.error() is None:
                    out.append((message.key().decode(), message.value()))
            assert len(out) == high, (topic, len(out), high)
            return out
        finally:
            consumer.close()

    def changelog(self) -> list[tuple[str, int]]:
        """The table's changelog: (key, sum) records in order (keys JSON-serialized by Faust)."""
        return [(json.loads(key), json.loads(value)) for key, value in self.read(CHANGELOG)]

    def sums(self) -> list[tuple[str, int, int]]:
        """The output topic: (key, n, sum) records in order."""
        return [(key, (v := json.loads(value))["n"], v["total"]) for key, value in self.read("sums")]


def start_app(kafka: Kafka, datadir: Path, hang_at: int, log: Path) -> subprocess.Popen[bytes]:
    args = [apps_python(), str(APP), kafka.bootstrap, "at_least_once", str(datadir), "0", str(hang_at)]
    with log.open("wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=clean_environ())


def stop(app: subprocess.Popen[bytes], signum: int) -> int:
    """Signal `app` and reap it (SIGKILL after 30 s)."""
    if app.poll() is None:
        app.send_signal(signum)
    try:
        return app.wait(30)
    except subprocess.TimeoutExpired:
        app.kill()
        return app.wait(30)


def kill_inside_a_record_then_rerun(port: int, tmp: Path) -> dict[str, object]:
    """The first run SIGKILLed inside input HANG_AT (its sum logged, its offset not committed),
    then a rerun on an empty data directory, stopped (SIGTERM) once it has committed every input."""
    kafka = Kafka(port)
    kafka.produce_numbers()
    first = start_app(kafka, tmp / "first", HANG_AT, tmp / "first.log")
    try:
        # Faust commits every 0.5 s what the agent acknowledged: all the records before the one
        # it stopped inside; that record's new sum goes to the changelog as soon as it is set.
        wait_until(lambda: kafka.committed() == HANG_AT, "the offsets before the hung record", first)
        wait_until(lambda: len(kafka.changelog()) == HANG_AT + 1, "the hung record's sum", first)
    finally:
        stop(first, signal.SIGKILL)
    seen: dict[str, object] = {"committed_at_kill": kafka.committed(), "changelog_at_kill": kafka.changelog()}
    rerun = start_app(kafka, tmp / "second", -1, tmp / "second.log")
    try:
        wait_until(lambda: kafka.committed() == RECORDS, "every input committed by the rerun", rerun)
    finally:
        seen["rerun_exit"] = stop(rerun, signal.SIGTERM)  # a graceful stop: it commits, leaves the group
    seen["changelog"], seen["sums"] = kafka.changelog(), kafka.sums()
    return seen


async def test_faust_table_recovered_from_its_changelog_after_a_sigkill_at_least_once(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path / "d", kafka__listen="127.0.0.1:0") as (daemon, client):
        assert daemon.kafka_port is not None
        await client.create_topic("numbers", 1)
        seen = await anyio.to_thread.run_sync(kill_inside_a_record_then_rerun, daemon.kafka_port, tmp_path)
        configs = {c.name: c.value for c in (await client.topic_configs(CHANGELOG)).configs}
        topics = {t.name for t in await client.list_topics()}
    assert configs["cleanup.policy"] == "compact"  # the table's changelog, made by Faust
    assert {"sums", CHANGELOG} <= topics  # made by Faust (CreateTopics)
    assert seen["rerun_exit"] == 0
    # The first run logged each input's sum once, in order, up to and including the hung record,
    # and committed the offsets of the records before it.
    assert seen["committed_at_kill"] == HANG_AT
    assert seen["changelog_at_kill"] == running_sums(range(HANG_AT + 1))
    # The rerun restored the table from the changelog (the hung record's sum included) and
    # processed every input from the committed offset once, the hung record again.
    restored = dict(running_sums(range(HANG_AT + 1)))
    rerun = running_sums(range(HANG_AT, RECORDS), start=restored)
    assert seen["changelog"] == running_sums(range(HANG_AT + 1)) + rerun
    final = dict(rerun)
    arithmetic = dict(running_sums(range(RECORDS)))
    twice = {key_of(i): value_of(i) for i in (HANG_AT,)}
    assert final == {key: total + twice.get(key, 0) for key, total in arithmetic.items()}
    # The output: the first run's sums (the hung record's too if it was sent before the kill),
    # then the rerun's, each equal to the sum the table logged.
    out = seen["sums"]
    assert isinstance(out, list)
    before = len(out) - (RECORDS - HANG_AT)
    assert before in (HANG_AT, HANG_AT + 1), before
    expected = [
        (key, value_of(i), total)
        for i, (key, total) in zip(
            [*range(before), *range(HANG_AT, RECORDS)], running_sums(range(before)) + rerun, strict=True
        )
    ]
    assert out == expected
