"""A Faust application (faust-streaming, on aiokafka; tests/kafka/faust_app.py) against a levelzero
listener: an agent keeps a running sum per key in a Table, which Faust logs to a changelog topic it
creates compacted, and writes each new sum to an output topic it creates. The worker is SIGKILLed
mid-stream and run again on an empty data directory, so the table comes back from the changelog
alone (compacted meanwhile: the compactor runs every second). Each test asserts what Faust
guarantees, no more, no less:

- at-least-once: the first run stops for good inside one record, once the record's new sum is in
  the changelog but before the record is acknowledged (its offset not committed: the window
  at-least-once leaves), and is killed there. The rerun resumes at the committed offset with the
  table the changelog holds: every input is counted, the record processed twice twice. The final
  table is the arithmetic plus that record.
- exactly_once: killed inside a transaction; read_committed shows of the changelog the committed
  transactions only (the killed run's open one is aborted by the rerun's InitProducerId), the
  rerun processes every input from the committed offset once, and the final table is the
  arithmetic, or one record more where Faust's timer committed a transaction while the agent was
  inside that record. The output topic is written outside Faust's transactions.

The application works around a race in Faust's recovery (see faust_app.py). It runs as a
subprocess on the Python of the apps' virtual environment, `.venv-apps`, which `make test` builds
from tests/apps/requirements.txt (LEVELZERO_TEST_APPS_PYTHON names another interpreter that has
Faust)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import anyio
from confluent_kafka import Consumer, Producer, TopicPartition

from daemon_support import apps_python_for, clean_environ, daemon_and_client

REPO = Path(__file__).resolve().parents[2]
APP = Path(__file__).with_name("faust_app.py")
GROUP = "summing"  # the application's id: its consumer group and its topics' prefix
CHANGELOG = "summing-totals-changelog"
RECORDS = 60
KEYS = 3
HANG_AT = 20  # the input offset the first run stops inside
WAIT_S = 60.0  # each wait for the application's progress
# The compactor visits every second (15 s by default), so the changelog is compacted while the
# application runs: the rerun may recover from a compacted changelog, and the test reads it as one.
DAEMON = {"kafka__listen": "127.0.0.1:0", "compactor__interval_s": 1.0}


def apps_python() -> str:
    """The interpreter that has Faust; a one-line instruction where there is none."""
    return apps_python_for("faust", "Faust")


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


def compacted_from(log: object, full: list[tuple[str, int]]) -> bool:
    """Whether the changelog `log` is what compaction may leave of `full`: its records in order,
    each key's last one among them (all of them if nothing was compacted yet)."""
    assert isinstance(log, list)
    remaining = iter(full)
    return all(record in remaining for record in log) and dict(log) == dict(full)


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

    def produce_numbers(self, records: int) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True})
        for i in range(records):
            producer.produce("numbers", key=key_of(i), value=json.dumps({"n": value_of(i)}).encode())
        assert producer.flush(30) == 0

    def committed(self) -> int:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": GROUP})
        try:
            return consumer.committed([TopicPartition("numbers", 0)], timeout=10)[0].offset
        finally:
            consumer.close()

    def watermarks(self, topic: str) -> tuple[int, int]:
        """(last stable offset, high watermark) of `topic`/0."""
        marks = []
        for isolation in ("read_committed", "read_uncommitted"):
            consumer = self.consumer(isolation)
            try:
                marks.append(
                    consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1]
                )
            finally:
                consumer.close()
        return marks[0], marks[1]

    def consumer(self, isolation: str) -> Consumer:
        return Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"check-{time.monotonic_ns()}",
                "isolation.level": isolation,
                "enable.auto.commit": False,
            }
        )

    def read(self, topic: str, isolation: str) -> list[tuple[str, bytes]]:
        """`topic`/0 from the start to its end (the last stable offset for read_committed),
        within 30 s."""
        stable, high = self.watermarks(topic)
        end = stable if isolation == "read_committed" else high
        consumer = self.consumer(isolation)
        try:
            consumer.assign([TopicPartition(topic, 0, 0)])
            out: list[tuple[str, bytes]] = []
            deadline = time.monotonic() + 30
            while (position := consumer.position([TopicPartition(topic, 0)])[0].offset) < end:
                assert time.monotonic() < deadline, (topic, position, end)
                for message in consumer.consume(1000, timeout=0.1):
                    if message.error() is None:
                        out.append((message.key().decode(), message.value()))
            return out
        finally:
            consumer.close()

    def changelog(self, isolation: str = "read_uncommitted") -> list[tuple[str, int]]:
        """The table's changelog: (key, sum) records in order (keys JSON-serialized by Faust)."""
        return [(json.loads(key), json.loads(value)) for key, value in self.read(CHANGELOG, isolation)]

    def sums(self) -> list[tuple[str, int, int]]:
        """The output topic: (key, n, sum) records in order."""
        records = self.read("sums", "read_uncommitted")
        return [(key, (v := json.loads(value))["n"], v["total"]) for key, value in records]


def start_app(
    kafka: Kafka, guarantee: str, datadir: Path, hang_at: int = -1, delay_s: float = 0.0
) -> subprocess.Popen[bytes]:
    """The application on `datadir` (its log beside it)."""
    args = [apps_python(), str(APP), kafka.bootstrap, guarantee, str(datadir), str(delay_s), str(hang_at)]
    with datadir.with_suffix(".log").open("wb") as out:
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
    kafka.produce_numbers(RECORDS)
    first = start_app(kafka, "at_least_once", tmp / "first", hang_at=HANG_AT)
    try:
        # Faust commits every 0.5 s what the agent acknowledged: all the records before the one
        # it stopped inside; that record's new sum goes to the changelog as soon as it is set.
        wait_until(lambda: kafka.committed() == HANG_AT, "the offsets before the hung record", first)
        wait_until(lambda: kafka.watermarks(CHANGELOG)[1] == HANG_AT + 1, "the hung record's sum", first)
    finally:
        stop(first, signal.SIGKILL)
    seen: dict[str, object] = {"committed_at_kill": kafka.committed(), "changelog_at_kill": kafka.changelog()}
    rerun = start_app(kafka, "at_least_once", tmp / "second")
    try:
        wait_until(lambda: kafka.committed() == RECORDS, "every input committed by the rerun", rerun)
    finally:
        seen["rerun_exit"] = stop(rerun, signal.SIGTERM)  # a graceful stop: it commits, leaves the group
    seen["changelog"], seen["sums"] = kafka.changelog(), kafka.sums()
    return seen


async def test_faust_table_recovered_from_its_changelog_after_a_sigkill_at_least_once(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path / "d", **DAEMON) as (daemon, client):
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
    assert compacted_from(seen["changelog_at_kill"], running_sums(range(HANG_AT + 1)))
    # The rerun restored the table from the changelog (the hung record's sum included) and
    # processed every input from the committed offset once, the hung record again.
    restored = dict(running_sums(range(HANG_AT + 1)))
    rerun = running_sums(range(HANG_AT, RECORDS), start=restored)
    assert compacted_from(seen["changelog"], running_sums(range(HANG_AT + 1)) + rerun)
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


EOS_RECORDS = 300
EOS_DELAY_S = 0.02  # a pause per record: the worker is killed mid-stream, a transaction open


def freeze_inside_a_transaction(kafka: Kafka, app: subprocess.Popen[bytes]) -> bool:
    """SIGSTOP `app` and tell whether the changelog holds an open transaction (its records past
    the last stable offset) once requests in flight have been answered; SIGCONT it if not."""
    app.send_signal(signal.SIGSTOP)
    time.sleep(0.2)
    stable, high = kafka.watermarks(CHANGELOG)
    if stable < high:
        return True
    app.send_signal(signal.SIGCONT)
    return False


def kill_inside_a_transaction_then_rerun(port: int, tmp: Path) -> dict[str, object]:
    """The exactly-once worker SIGKILLed inside a transaction once a third of the inputs are
    committed, then a rerun on an empty data directory, stopped once it has committed them all."""
    kafka = Kafka(port)
    kafka.produce_numbers(EOS_RECORDS)
    first = start_app(kafka, "exactly_once", tmp / "first", delay_s=EOS_DELAY_S)
    try:
        wait_until(lambda: kafka.committed() >= EOS_RECORDS // 3, "a third of the inputs committed", first)
        wait_until(lambda: freeze_inside_a_transaction(kafka, first), "an open transaction", first)
    finally:
        stop(first, signal.SIGKILL)
    seen: dict[str, object] = {
        "committed_at_kill": kafka.committed(),
        "watermarks_at_kill": kafka.watermarks(CHANGELOG),
        "changelog_at_kill": kafka.changelog("read_committed"),
    }
    rerun = start_app(kafka, "exactly_once", tmp / "second", delay_s=EOS_DELAY_S)
    try:
        wait_until(lambda: kafka.committed() == EOS_RECORDS, "every input committed by the rerun", rerun)
    finally:
        seen["rerun_exit"] = stop(rerun, signal.SIGTERM)
    seen["watermarks"] = kafka.watermarks(CHANGELOG)
    seen["changelog"], seen["sums"] = kafka.changelog("read_committed"), kafka.sums()
    return seen


async def test_faust_exactly_once_table_through_a_sigkill_inside_a_transaction(tmp_path: Path) -> None:
    """Faust's exactly_once commits the table's changelog records and the input offsets in one
    transaction per partition (transactional.id `summing-0-0`, the same on every run, so the
    rerun's InitProducerId fences the killed run and aborts its open transaction at once)."""
    async with daemon_and_client(tmp_path / "d", **DAEMON) as (daemon, client):
        assert daemon.kafka_port is not None
        await client.create_topic("numbers", 1)
        seen = await anyio.to_thread.run_sync(
            kill_inside_a_transaction_then_rerun, daemon.kafka_port, tmp_path
        )
    assert seen["rerun_exit"] == 0
    committed = seen["committed_at_kill"]
    assert isinstance(committed, int) and EOS_RECORDS // 3 <= committed < EOS_RECORDS  # mid-stream
    stable, high = seen["watermarks_at_kill"]  # type: ignore[misc]
    assert stable < high  # ... inside a transaction: changelog records written, not committed
    # What read_committed shows of the changelog at the kill is the committed transactions' only:
    # each input's sum once, in order, up to the committed offset. Faust commits on a timer,
    # concurrently with the agent, so a transaction may also hold the sum of the record the
    # agent is inside (its offset not yet committed): one record ahead at most.
    at_kill = seen["changelog_at_kill"]
    assert isinstance(at_kill, list)
    matches = [a for a in (0, 1) if dict(at_kill) == dict(running_sums(range(committed + a)))]
    assert len(matches) == 1, (committed, dict(at_kill))
    ahead = matches[0]
    assert compacted_from(at_kill, running_sums(range(committed + ahead)))
    # The rerun restored that table (nothing of the aborted transaction) and processed every input
    # from the committed offset once: its transactions committed, the killed run's aborted.
    rerun = running_sums(range(committed, EOS_RECORDS), start=dict(at_kill))
    assert compacted_from(seen["changelog"], running_sums(range(committed + ahead)) + rerun)
    assert seen["watermarks"][0] == seen["watermarks"][1]  # type: ignore[index]
    arithmetic = dict(running_sums(range(EOS_RECORDS)))
    twice = {key_of(i): value_of(i) for i in range(committed, committed + ahead)}
    assert dict(rerun) == {key: total + twice.get(key, 0) for key, total in arithmetic.items()}
    # Faust sends the agent's output outside the transaction (to a topic the application does not
    # consume, with its plain producer): the first run's sums as it computed them, then the
    # rerun's from the committed offset; none is withdrawn.
    out = seen["sums"]
    assert isinstance(out, list)
    before = len(out) - (EOS_RECORDS - committed)
    assert committed <= before <= EOS_RECORDS, before
    expected = [
        (key, value_of(i), total)
        for i, (key, total) in zip(
            [*range(before), *range(committed, EOS_RECORDS)],
            running_sums(range(before)) + rerun,
            strict=True,
        )
    ]
    assert out == expected
