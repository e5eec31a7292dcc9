"""Quix Streams applications (stateful, their topics created by the library through
CreateTopics) against a levelzero listener: a running sum per key, checked against the
arithmetic.
- at-least-once with local state only, and with Quix's default changelog topics (its state
  store's changelog is created with cleanup.policy=compact: a compacted topic);
- exactly-once (transactions) through a SIGKILL of the application mid-stream and a restart on
  an empty state directory, so the state comes back from the compacted changelog: the output,
  read with read_committed, holds each input's sum exactly once.

The application runs as a subprocess (Quix sets signal handlers, which only the main thread
may) on the Python of its own virtual environment, `.venv-apps`, which `make test` builds from
tests/apps/requirements.txt: Quix Streams 3.28 requires confluent-kafka < 2.13, older than the
one the suite uses. LEVELZERO_TEST_APPS_PYTHON names another interpreter that has it."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import anyio
from confluent_kafka import Consumer, Producer, TopicPartition

from daemon_support import apps_python_for, daemon_and_client

REPO = Path(__file__).resolve().parents[2]


def apps_python() -> str:
    """The interpreter that has Quix Streams; a one-line instruction where there is none."""
    return apps_python_for("quixstreams", "Quix Streams")


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


EOS_RECORDS = 300
SESSION_MS = 20_000  # the killed consumer leaves the group at its session timeout: the rerun
# joins before that (it starts in a few seconds), so its round waits for the dead member
TXN_TIMEOUT_MS = 10_000  # the killed producer's open transaction is aborted at its timeout

EOS_APP = f"""
import sys, time
from quixstreams import Application

bootstrap, state_dir = sys.argv[1], sys.argv[2]
app = Application(
    broker_address=bootstrap,
    consumer_group="eos-summing",
    auto_offset_reset="earliest",
    processing_guarantee="exactly-once",
    commit_interval=0.2,
    state_dir=state_dir,
    auto_create_topics=True,
    consumer_extra_config={{"session.timeout.ms": {SESSION_MS}}},
    producer_extra_config={{"transaction.timeout.ms": {TXN_TIMEOUT_MS}}},
)
numbers = app.topic("eos-numbers", value_deserializer="json")
sums = app.topic("eos-sums", value_serializer="json")


def add(value, state):
    time.sleep(0.03)  # slow enough to be killed mid-stream, inside a transaction
    total = state.get("total", 0) + value["n"]
    state.set("total", total)
    return {{"n": value["n"], "total": total}}


app.dataframe(numbers).apply(add, stateful=True).to_topic(sums)
app.run(timeout=8)  # ends once nothing new came for 8 s (60 s more for the first assignment)
"""


def expected_sums(records: int) -> list[list[object]]:
    expected: list[list[object]] = []
    totals = dict.fromkeys(range(KEYS), 0)
    for i in range(records):
        totals[i % KEYS] += i
        expected.append([f"k{i % KEYS}", totals[i % KEYS]])
    return expected


def reader(bootstrap: str, isolation: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{time.monotonic_ns()}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )


class CommittedReader:
    """Reads `topic`/0 with read_committed from the start, as it grows: (key, n, total)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = reader(bootstrap, "read_committed")
        self.consumer.assign([TopicPartition(topic, 0, 0)])
        self.out: list[tuple[str, int, int]] = []

    def poll(self, polls: int, want: int) -> list[tuple[str, int, int]]:
        for _ in range(polls):
            if len(self.out) >= want:
                break
            message = self.consumer.poll(0.1)
            if message is not None and message.error() is None:
                value = json.loads(message.value())
                self.out.append((message.key().decode(), value["n"], value["total"]))
        return self.out

    def close(self) -> None:
        self.consumer.close()


def read_committed_to_end(bootstrap: str, topic: str) -> tuple[list[tuple[str, int, int]], int, int]:
    """`topic`/0 read with read_committed up to its last stable offset (bounded: 600 polls of
    0.1 s); (records, LSO, high watermark)."""
    lso, high = stable_and_high(bootstrap, topic)
    committed = CommittedReader(bootstrap, topic)
    try:
        for _ in range(600):
            committed.poll(1, lso + 1)
            (position,) = committed.consumer.position([TopicPartition(topic, 0)])
            if position.offset >= lso:
                break
        return committed.out, lso, high
    finally:
        committed.close()


def stable_and_high(bootstrap: str, topic: str) -> tuple[int, int]:
    """(last stable offset, high watermark) of `topic`/0."""
    committed, uncommitted = reader(bootstrap, "read_committed"), reader(bootstrap, "read_uncommitted")
    try:
        tp = TopicPartition(topic, 0)
        lso = committed.get_watermark_offsets(tp, timeout=10, cached=False)[1]
        return lso, uncommitted.get_watermark_offsets(tp, timeout=10, cached=False)[1]
    finally:
        committed.close()
        uncommitted.close()


def kill_mid_transaction_then_rerun(port: int, state_dir: Path) -> tuple[int, tuple[int, int], int]:
    """Run the exactly-once app, SIGKILL it inside a transaction once a third of the sums are
    committed, run it again on an empty state directory: (sums seen before the kill, the sums
    topic's (LSO, high watermark) just after the kill, the rerun's exit code)."""
    bootstrap = f"127.0.0.1:{port}"
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(EOS_RECORDS):
        producer.produce("eos-numbers", key=f"k{i % KEYS}", value=json.dumps({"n": i}).encode())
    assert producer.flush(30) == 0
    first = subprocess.Popen([apps_python(), "-c", EOS_APP, bootstrap, str(state_dir / "first")])
    committed = CommittedReader(bootstrap, "eos-sums")
    try:
        before = 0
        for _ in range(600):  # bounded: 600 rounds of up to 10 polls of 0.1 s
            before = len(committed.poll(10, EOS_RECORDS // 3))
            if before >= EOS_RECORDS // 3 or first.poll() is not None:
                break
        for _ in range(100):  # a transaction is open: sums written past the last stable offset
            lso, high = stable_and_high(bootstrap, "eos-sums")
            if lso < high or first.poll() is not None:
                break
    finally:
        first.kill()
        first.wait(30)
        committed.close()
    at_kill = stable_and_high(bootstrap, "eos-sums")
    rerun = subprocess.run(
        [apps_python(), "-c", EOS_APP, bootstrap, str(state_dir / "second")], timeout=240, check=False
    )
    return before, at_kill, rerun.returncode


async def test_quix_exactly_once_through_a_sigkill_counts_each_input_once(tmp_path: Path) -> None:
    """Quix's transactional.id is a new uuid per run, so nothing fences the killed run: its
    consumer leaves the group at its session timeout (the rerun's JoinGroup must not wait out
    the 300 s rebalance timeout for it) and its open transaction is aborted at its timeout."""
    async with daemon_and_client(tmp_path / "d", kafka__listen="127.0.0.1:0") as (daemon, client):
        assert daemon.kafka_port is not None
        await client.create_topic("eos-numbers", 1)
        before, (lso, high), code = await anyio.to_thread.run_sync(
            kill_mid_transaction_then_rerun, daemon.kafka_port, tmp_path
        )
        bootstrap = f"127.0.0.1:{daemon.kafka_port}"
        out, lso_after, high_after = await anyio.to_thread.run_sync(
            read_committed_to_end, bootstrap, "eos-sums"
        )
    assert EOS_RECORDS // 3 <= before < EOS_RECORDS, before  # killed mid-stream
    assert lso < high, (lso, high)  # ... inside a transaction: its sums were written, not committed
    assert code == 0
    assert lso_after == high_after  # the killed run's transaction was aborted, the rerun's committed
    # Every input once, in order, its running sum exact: nothing the killed run had begun but
    # not committed shows, and the state the rerun rebuilt from the changelog is the committed one.
    assert [n for _, n, _ in out] == list(range(EOS_RECORDS))
    assert [[key, total] for key, _, total in out] == expected_sums(EOS_RECORDS)
