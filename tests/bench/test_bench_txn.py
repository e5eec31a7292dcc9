"""The txn item's rounds: both sides' producers are readied before the clock, and the timed
work is the same records into the round's topic (the idempotent side's warm-up records, which
take its producer ids, go to a topic of their own)."""

from __future__ import annotations

from pathlib import Path

import anyio

from levelzero.bench import txn
from levelzero.bench.common import kafka_bench_daemon

RECORDS = 800  # two transactions of TXN_RECORDS a producer
SHARE = RECORDS // txn.PRODUCERS
# The transactional side's partitions: its records and a commit marker a transaction (the last
# one's is written after EndTxn was answered, so it is waited for).
TXN_END = SHARE + SHARE // txn.TXN_RECORDS
MARKERS_WAIT_S = 30.0


async def _rounds(data_dir: Path) -> tuple[dict[str, dict[str, list[int]]], list[str]]:
    """Each side's round into a topic named after it: the high watermarks of every topic after
    each side, and the order of what happened (the parent's settle, the child's rate)."""
    events: list[str] = []
    ends: dict[str, dict[str, list[int]]] = {}
    async with kafka_bench_daemon(data_dir) as (daemon, client):
        assert daemon.kafka_port is not None
        await client.create_topic(txn.WARM_TOPIC, txn.PRODUCERS)

        async def settle() -> None:
            events.append("settle")

        for side in ("txn", "idempotent"):
            await client.create_topic(side, txn.PRODUCERS)
            rate = await txn.in_child(settle, side, str(daemon.kafka_port), side, str(RECORDS), "0")
            assert rate > 0
            events.append(f"rate {side}")
            with anyio.fail_after(MARKERS_WAIT_S):
                while True:
                    marks: dict[str, list[int]] = {}
                    for status in await client.all_partitions():
                        marks.setdefault(status.topic, []).append(status.high_watermark)
                    if min(marks["txn"]) >= TXN_END:
                        break
                    await anyio.sleep(0.05)
            ends[side] = marks
    return ends, events


def test_each_side_writes_its_records_alone_into_the_rounds_topic(tmp_path: Path) -> None:
    ends, events = anyio.run(_rounds, tmp_path / "data")

    # the transactions' records and one commit marker each, nothing else
    assert ends["txn"]["txn"] == [TXN_END] * txn.PRODUCERS
    assert ends["txn"][txn.WARM_TOPIC] == [0] * txn.PRODUCERS  # its ids from InitProducerId
    # the same records; one warm-up record a producer, in the warm-up topic only
    assert ends["idempotent"]["idempotent"] == [SHARE] * txn.PRODUCERS
    assert ends["idempotent"][txn.WARM_TOPIC] == [1] * txn.PRODUCERS
    # the clock starts only once the parent has settled, for each side
    assert events == ["settle", "rate txn", "settle", "rate idempotent"]
