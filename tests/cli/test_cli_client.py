"""The client commands an operator scripts against: `produce` from stdin with requests in
flight at once, malformed lines named by their number, `consume --json` with text as text,
`produce -Z` sending empty values as null ones, `topics list` with headers, `--json`
everywhere, a URL without a scheme as a usage error, and counts in the singular when there is
one."""

from __future__ import annotations

import json
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from daemon_support import QUIESCENT_ENVIRON, DaemonProcess, free_port

MARKER_POLLS_MAX = 600  # of 50 ms: a transaction's marker stored after its commit's answer


def lines(values: list[str]) -> bytes:
    return b"".join(f"{v}\n".encode() for v in values)


def consumed_values(daemon_process: DaemonProcess, topic: str, partition: int) -> list[str]:
    result = daemon_process.cli("consume", topic, "-p", str(partition), "--json")
    assert result.returncode == 0, result.stderr
    return [json.loads(line)["value"] for line in result.stdout.splitlines()]


def test_produce_pipelines_requests_and_loses_nothing(daemon_process: DaemonProcess) -> None:
    assert daemon_process.cli("topics", "create", "p", "--partitions", "2").returncode == 0
    values = [f"v{i:05d}" for i in range(20_000)]
    result = daemon_process.cli(
        "produce",
        "p",
        "-p",
        "0",
        "--batch-records",
        "1000",
        "--in-flight",
        "4",
        "--json",
        input=lines(values),
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.splitlines()[-1])
    assert summary["records"] == 20_000 and summary["requests"] == 20
    assert (summary["first_offset"], summary["last_offset"]) == (0, 19_999)
    got = consumed_values(daemon_process, "p", 0)
    assert sorted(got) == values  # every record, once
    # Each request's records are contiguous and in input order (requests may overtake).
    chunks = sorted(got[i : i + 1000] for i in range(0, 20_000, 1000))
    assert chunks == [values[i : i + 1000] for i in range(0, 20_000, 1000)]
    # One request at a time (the default) keeps the input order across requests too.
    result = daemon_process.cli(
        "produce", "p", "-p", "1", "--batch-records", "700", input=lines(values[:5000])
    )
    assert result.returncode == 0 and b"produced 5000 records to p/1 at offsets 0..4999" in result.stdout
    assert consumed_values(daemon_process, "p", 1) == values[:5000]


def test_a_malformed_line_is_named_and_stops_cleanly_or_is_skipped(daemon_process: DaemonProcess) -> None:
    assert daemon_process.cli("topics", "create", "k").returncode == 0
    text = b"a:1\nb:2\nno separator here\nc:3\n"
    result = daemon_process.cli("produce", "k", "--key-separator", ":", input=text)
    assert result.returncode == 1
    assert b"produced 2 records to k/0 at offsets 0..1" in result.stdout  # what came before it
    assert result.stderr == (
        b"levelzero: input line 3: no key separator ':' in b'no separator here'; "
        b"stopped there (--skip-malformed skips such lines)\n"
    )
    result = daemon_process.cli("produce", "k", "--key-separator", ":", "--skip-malformed", input=text)
    assert result.returncode == 0
    assert (
        result.stderr == b"levelzero: input line 3: no key separator ':' in b'no separator here' (skipped)\n"
    )
    assert b"produced 3 records to k/0 at offsets 2..4; skipped 1 malformed line" in result.stdout
    records = [json.loads(line) for line in daemon_process.cli("consume", "k", "--json").stdout.splitlines()]
    assert [(r["key"], r["value"]) for r in records] == [
        ("a", "1"),
        ("b", "2"),
        ("a", "1"),
        ("b", "2"),
        ("c", "3"),
    ]


def test_json_output_decodes_text_and_keeps_binary_as_base64(daemon_process: DaemonProcess) -> None:
    assert daemon_process.cli("topics", "create", "j").returncode == 0
    result = daemon_process.cli("produce", "j", "--key", "clé", "grüße")
    assert result.returncode == 0 and b"produced 1 record to j/0 at offsets 0..0" in result.stdout
    assert daemon_process.cli("produce", "j", input=b"\xff\xfebinary\n").returncode == 0
    for flags in (["--json"], ["--format", "json"]):
        out = daemon_process.cli("consume", "j", *flags).stdout.decode()
        assert [json.loads(line) for line in out.splitlines()] == [
            {"offset": 0, "key": "clé", "value": "grüße"},
            {"offset": 1, "key": None, "value_b64": "//5iaW5hcnk="},
        ]


def test_empty_as_null_produces_tombstones_that_json_shows_as_null(daemon_process: DaemonProcess) -> None:
    assert daemon_process.cli("topics", "create", "z").returncode == 0
    text = b"gone:\nkept:v\n"
    assert daemon_process.cli("produce", "z", "--key-separator", ":", input=text).returncode == 0
    assert daemon_process.cli("produce", "z", "--key-separator", ":", "-Z", input=text).returncode == 0
    out = daemon_process.cli("consume", "z", "--json").stdout.decode()
    assert [(r["key"], r["value"]) for r in map(json.loads, out.splitlines())] == [
        ("gone", ""),  # without -Z an empty value is sent as it is
        ("kept", "v"),
        ("gone", None),  # with -Z it is a null value
        ("kept", "v"),
    ]
    # Text output prints a null value as an empty line, as kcat does.
    assert daemon_process.cli("consume", "z", "--format", "offsets").stdout == b"0\t\n1\tv\n2\t\n3\tv\n"


def test_topics_headers_plurals_json_and_a_url_without_scheme(daemon_process: DaemonProcess) -> None:
    result = daemon_process.cli("topics", "create", "single")
    assert result.stdout == b"created topic single with 1 partition\n"
    assert daemon_process.cli("topics", "create", "many", "--partitions", "12").returncode == 0
    assert daemon_process.cli("topics", "list").stdout == b"TOPIC   PARTITIONS\nmany    12\nsingle  1\n"
    listed = json.loads(daemon_process.cli("topics", "list", "--json").stdout)
    assert listed == {"topics": [{"name": "many", "partitions": 12}, {"name": "single", "partitions": 1}]}
    assert json.loads(daemon_process.cli("epoch", "advance", "--json").stdout)["cluster_epoch"] == 2
    refused = daemon_process.cli("topics", "delete", "single")
    assert refused.returncode != 0
    assert b"Add --confirm" in refused.stderr
    result = daemon_process.cli("topics", "delete", "single", "--confirm")
    assert result.stdout == b"deleted topic single (1 partition); the GC collects its objects\n"
    assert daemon_process.cli("topics", "list").stdout == b"TOPIC  PARTITIONS\nmany   12\n"
    host_port = daemon_process.url.removeprefix("http://")
    result = daemon_process.cli("topics", "list", "--url", host_port)
    assert result.returncode == 2
    assert (
        result.stderr
        == (
            f"levelzero: daemon URL '{host_port}' has no http:// or https:// scheme "
            f"(e.g. http://{host_port})\n"
        ).encode()
    )


def test_topics_config_shows_sets_and_deletes_and_refuses_what_is_not_enforced(
    daemon_process: DaemonProcess,
) -> None:
    created = daemon_process.cli("topics", "create", "c", "--config", "retention.ms=60000")
    assert created.returncode == 0, created.stderr
    shown = daemon_process.cli("topics", "config", "c")
    assert shown.stdout == b"CONFIG        VALUE  SOURCE\nretention.ms  60000  topic\n"
    changed = daemon_process.cli("topics", "config", "c", "retention.bytes=100", "--delete", "retention.ms")
    assert changed.stdout == b"CONFIG           VALUE  SOURCE\nretention.bytes  100    topic\n"
    every = json.loads(daemon_process.cli("topics", "config", "c", "--all", "--json").stdout)
    by_name = {c["name"]: c for c in every["configs"]}
    assert by_name["retention.ms"] == {
        "name": "retention.ms",
        "value": "-1",
        "source": "node",
        "default": False,
    }
    refused = daemon_process.cli("topics", "config", "c", "message.timestamp.type=LogAppendTime")
    assert refused.returncode != 0 and b"is not supported by levelzero" in refused.stderr
    refused = daemon_process.cli("topics", "create", "d", "--config", "message.timestamp.type=LogAppendTime")
    assert refused.returncode != 0 and b"invalid_config" in refused.stderr
    assert b"d " not in daemon_process.cli("topics", "list").stdout


def test_consume_reads_past_pages_holding_only_transaction_markers(make_daemon_process) -> None:
    """A Kafka transaction's commit marker is never returned over HTTP: a page of markers alone
    (one record a page here) is empty, and `levelzero consume` reads on past it to the end."""
    kafka_port = free_port()
    process = make_daemon_process({"LEVELZERO_KAFKA_LISTEN": f"127.0.0.1:{kafka_port}"}).start()
    assert process.cli("topics", "create", "m").returncode == 0
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{kafka_port}", "transactional.id": "cli-m"})
    producer.init_transactions(30)
    for value in (b"a", b"b"):
        producer.begin_transaction()
        producer.produce("m", value=value, partition=0)
        producer.commit_transaction(30)  # a at 0, its marker at 1; b at 2, its marker at 3
    # EndTxn is answered before the marker is written: c goes after b's marker once the last
    # stable offset (read_committed's end) shows it stored.
    reader = Consumer(
        {"bootstrap.servers": f"127.0.0.1:{kafka_port}", "group.id": "m", "isolation.level": "read_committed"}
    )
    try:
        for _ in range(MARKER_POLLS_MAX):
            if reader.get_watermark_offsets(TopicPartition("m", 0), timeout=10)[1] == 4:
                break
            time.sleep(0.05)
        assert reader.get_watermark_offsets(TopicPartition("m", 0), timeout=10)[1] == 4
    finally:
        reader.close()
    assert process.cli("produce", "m", input=b"c\n").returncode == 0  # at 4
    out = process.cli("consume", "m", "--format", "offsets", "--max-bytes", "1").stdout
    assert out == b"0\ta\n2\tb\n4\tc\n"


def test_compaction_explain_shows_the_passes_the_cleaner_map_and_why_not(make_daemon_process) -> None:
    env = {**QUIESCENT_ENVIRON, "LEVELZERO_COMPACTOR_INTERVAL_S": "0.2"}
    daemon = make_daemon_process(env).start()
    config = ["--config", "cleanup.policy=compact", "--config", "min.cleanable.dirty.ratio=0.01"]
    assert daemon.cli("topics", "create", "c", *config).returncode == 0
    assert daemon.cli("topics", "create", "d").returncode == 0
    lines_in = lines([f"k{i % 3}=v{i}" for i in range(9)])
    produced = daemon.cli("produce", "c", "--key-separator", "=", input=lines_in)
    assert produced.returncode == 0, produced.stderr
    shown: dict = {}
    for _ in range(300):  # the reconciler, then the compactor: a pass within a few rounds
        shown = json.loads(daemon.cli("compaction", "explain", "--json").stdout)
        if any(p["passes"] for p in shown["partitions"]):
            break
        time.sleep(0.1)
    (part,) = shown["partitions"]
    assert part["partition"] == "c/0" and part["passes"] >= 1 and part["records_removed"] >= 1
    assert part["bytes_reclaimed"] > 0 and part["last_compaction_at"] is not None
    assert list(part["cleaner_offsets"].values())[-1] >= 2  # the cleaning reached at least k2's first
    text = daemon.cli("compaction", "explain", "c/0").stdout.decode()
    assert "c/0\n  dirty ratio " in text and "cleaner-offset map: term " in text
    assert "reclaimed " in text and "last compaction none since" not in text
    other = daemon.cli("compaction", "explain", "d/0").stdout.decode()
    assert other.startswith("d/0: not seen by this node's compactor")
    # --json shows the partition asked for only, as the text does (it showed them all)
    only = json.loads(daemon.cli("compaction", "explain", "c/0", "--json").stdout)
    assert [p["partition"] for p in only["partitions"]] == ["c/0"] and only["rounds"] >= 1
    assert json.loads(daemon.cli("compaction", "explain", "d/0", "--json").stdout)["partitions"] == []
    assert [json.loads(r)["value"] for r in daemon.cli("consume", "c", "--json").stdout.splitlines()] == [
        "v6",
        "v7",
        "v8",
    ]
