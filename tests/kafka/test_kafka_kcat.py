"""kcat (Debian's `kcat` package, librdkafka's command-line client) against a levelzero listener:
metadata (-L), producing (-P), consuming from the beginning, the end, the last N and a
timestamp (-C -o beginning|end|-N|s@TS), and offsets for times (-Q)."""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio
import pytest

from daemon_support import daemon_and_client

KCAT = shutil.which("kcat")
pytestmark = pytest.mark.skipif(
    KCAT is None, reason="kcat is not installed (a Debian package, not a PyPI one: apt-get install kcat)"
)
TOPIC = "kcat"
BASE_MS = 1_700_000_000_000  # record i has timestamp BASE_MS + 1000 * i


async def kcat(bootstrap: str, *args: str, stdin: bytes | None = None) -> str:
    assert KCAT is not None
    with anyio.fail_after(60):
        done = await anyio.run_process([KCAT, "-b", bootstrap, *args], input=stdin, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


def create_and_fill(bootstrap: str) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(TOPIC, 1, 1), NewTopic("typed", 1, 1)]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(10):
        producer.produce(TOPIC, key=b"k%d" % i, value=b"v%d" % i, partition=0, timestamp=BASE_MS + 1000 * i)
    assert producer.flush(30) == 0


async def test_kcat_lists_produces_consumes_and_finds_offsets_for_times(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        bootstrap = f"127.0.0.1:{daemon.kafka_port}"
        await anyio.to_thread.run_sync(create_and_fill, bootstrap)
        listing = await kcat(bootstrap, "-L")
        consume = ("-C", "-t", TOPIC, "-p", "0", "-e", "-q", "-f", "%o %k %s %T\\n")
        beginning = await kcat(bootstrap, *consume, "-o", "beginning")
        end = await kcat(bootstrap, *consume, "-o", "end")
        last_three = await kcat(bootstrap, *consume, "-o", "-3")
        from_time = await kcat(bootstrap, *consume, "-o", f"s@{BASE_MS + 6500}")
        offsets = [
            await kcat(bootstrap, "-Q", "-t", f"{TOPIC}:0:{BASE_MS + t}") for t in (3000, 3001, 99_000)
        ]
        await kcat(bootstrap, "-P", "-t", "typed", "-p", "0", "-K:", stdin=b"a:one\nb:two\n")
        typed = await kcat(
            bootstrap, "-C", "-t", "typed", "-p", "0", "-o", "beginning", "-e", "-q", "-f", "%o %k %s\\n"
        )

    assert f'topic "{TOPIC}" with 1 partitions' in listing
    assert "1 brokers:" in listing and f"127.0.0.1:{daemon.kafka_port}" in listing
    assert beginning.splitlines() == [f"{i} k{i} v{i} {BASE_MS + 1000 * i}" for i in range(10)]
    assert end == ""
    assert [line.split()[0] for line in last_three.splitlines()] == ["7", "8", "9"]
    assert [line.split()[0] for line in from_time.splitlines()] == ["7", "8", "9"]
    # -Q: the first offset whose timestamp is at or after the time (-1: none is).
    assert offsets == [f"{TOPIC} [0] offset 3\n", f"{TOPIC} [0] offset 4\n", f"{TOPIC} [0] offset -1\n"]
    assert typed.splitlines() == ["0 a one", "1 b two"]
