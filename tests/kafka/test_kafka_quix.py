"""Quix Streams applications (stateful, their topics created by the library through
CreateTopics) against a levelzero listener: a running sum per key, checked against the
arithmetic.
- at-least-once with local state only, and with Quix's default changelog topics (its state
  store's changelog is created with cleanup.policy=compact: a compacted topic);

The application runs as a subprocess (Quix sets signal handlers, which only the main thread
may) on the Python of its own virtual environment, `.venv-apps`, which `make test` builds from
tests/apps/requirements.txt: Quix Streams 3.28 requires confluent-kafka < 2.13, older than the
one the suite uses. LEVELZERO_TEST_APPS_PYTHON names another interpreter that has it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import anyio
import pytest

from daemon_support import daemon_and_client

REPO = Path(__file__).resolve().parents[2]


def apps_python() -> str:
    """The interpreter that has Quix Streams; a one-line instruction where there is none."""
    python = os.environ.get("LEVELZERO_TEST_APPS_PYTHON") or str(REPO / ".venv-apps" / "bin" / "python")
    probe = subprocess.run([python, "-c", "import quixstreams"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.fail(f"Quix Streams is not installed for {python}: run `make .venv-apps/.installed`")
    return python


RECORDS = 30
KEYS = 3

APP = """
import json, sys
from confluent_kafka import Consumer, TopicPartition
from quixstreams import Application

bootstrap, changelog, state_dir = sys.argv[1], sys.argv[2] == "changelog", sys.argv[3]
records, keys = int(sys.argv[4]), int(sys.argv[5])
app = Application(
    broker_address=bootstrap,
    consumer_group="summing",
    auto_offset_reset="earliest",
    processing_guarantee="at-least-once",
    state_dir=state_dir,
    use_changelog_topics=changelog,
    auto_create_topics=True,
)
numbers = app.topic("numbers", value_deserializer="json")
sums = app.topic("sums", value_serializer="json")
with app.get_producer() as producer:
    for i in range(records):
        producer.produce("numbers", key=f"k{i % keys}", value=json.dumps({"n": i}).encode())


def add(value, state):
    total = state.get("total", 0) + value["n"]
    state.set("total", total)
    return {"total": total}


app.dataframe(numbers).apply(add, stateful=True).to_topic(sums)
app.run(count=records, timeout=60)

consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "auto.offset.reset": "earliest"})
consumer.assign([TopicPartition("sums", 0, 0)])
out = []
for _ in range(600):
    if len(out) == records:
        break
    message = consumer.poll(0.1)
    if message is not None and message.error() is None:
        out.append([message.key().decode(), json.loads(message.value())["total"]])
committed = Consumer({"bootstrap.servers": bootstrap, "group.id": "summing"}).committed(
    [TopicPartition("numbers", 0)], timeout=20
)[0].offset
consumer.close()
print(json.dumps({"sums": out, "committed": committed}))
"""


def run_app(port: int, variant: str, state_dir: Path) -> subprocess.CompletedProcess[str]:
    args = [apps_python(), "-c", APP, f"127.0.0.1:{port}", variant, str(state_dir), str(RECORDS), str(KEYS)]
    return subprocess.run(args, capture_output=True, text=True, timeout=240, check=False)


async def test_quix_stateful_at_least_once_app_sums_each_key(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path / "d", kafka__listen="127.0.0.1:0") as (daemon, client):
        assert daemon.kafka_port is not None
        done = await anyio.to_thread.run_sync(run_app, daemon.kafka_port, "plain", tmp_path / "state")
        topics = await client.list_topics()
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["sums"] == expected_sums(RECORDS)  # one partition: in order, each running sum exact
    assert seen["committed"] == RECORDS  # at-least-once: the group's offset follows what was processed
    assert {"numbers", "sums"} <= {t.name for t in topics}  # made by the library


async def test_quix_changelog_topics_are_compacted_topics_and_the_sums_are_exact(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path / "d", kafka__listen="127.0.0.1:0") as (daemon, client):
        assert daemon.kafka_port is not None
        done = await anyio.to_thread.run_sync(run_app, daemon.kafka_port, "changelog", tmp_path / "state")
        changelog = "changelog__summing--numbers--default"
        configs = {c.name: c.value for c in (await client.topic_configs(changelog)).configs}
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["sums"] == expected_sums(RECORDS)
    assert seen["committed"] == RECORDS
    assert configs["cleanup.policy"] == "compact"  # the state store's changelog, made by Quix


def expected_sums(records: int) -> list[list[object]]:
    expected: list[list[object]] = []
    totals = dict.fromkeys(range(KEYS), 0)
    for i in range(records):
        totals[i % KEYS] += i
        expected.append([f"k{i % KEYS}", totals[i % KEYS]])
    return expected
