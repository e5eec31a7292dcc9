"""Item 15: `levelzero produce` from stdin at its defaults, as a user runs it.

One daemon (local object store, the daemon's defaults but `batcher.linger_ms` = 5, as item 9).
Each round pipes a file of RECORDS lines (VALUE_BYTES printable bytes each) into
`python -m levelzero.cli produce TOPIC --url URL` (default batch of 10,000 records, one request
in flight) and times the process from start to exit: interpreter start-up, reading stdin,
requests, the summary. The floor is the rate the issue set as the target (30,000 records/s):
the ratio says how far above it the command stays (target >= 100%). An information row sets it
beside the bundled client producing the same lines from a child process (`Client.produce` with
the same batch size and an idempotency key a request, as the command sends them, one request at
a time: what the command adds to the HTTP client).
"""

from __future__ import annotations

import json
import random
import string
import sys
import time
from pathlib import Path

import anyio

from .common import Figure, Settings, Target, figure, interleave, kafka_bench_daemon, work_dir

ITEM = "cli"
RECORDS = 300_000
VALUE_BYTES = 100
BATCH_RECORDS = 10_000  # levelzero.cli.commands.PRODUCE_BATCH_RECORDS
TARGET_RECORDS_PER_S = 30_000.0
TARGET = Target(1.0)


def write_lines(path: Path, count: int) -> None:
    rng = random.Random(3)
    alphabet = string.ascii_letters + string.digits
    with path.open("w", encoding="ascii") as out:
        for _ in range(count):
            out.write("".join(rng.choices(alphabet, k=VALUE_BYTES)) + "\n")


async def cli_round(url: str, topic: str, lines: Path) -> float:
    started = time.perf_counter()
    with lines.open("rb") as stdin:
        result = await anyio.run_process(
            [sys.executable, "-m", "levelzero.cli", "produce", topic, "--url", url, "--json"], stdin=stdin
        )
    elapsed = time.perf_counter() - started
    summary = json.loads(result.stdout.decode().strip().splitlines()[-1])
    assert summary["records"] == sum(1 for _ in lines.open("rb")), summary
    return summary["records"] / elapsed


async def client_round(url: str, topic: str, lines: Path) -> float:
    started = time.perf_counter()
    result = await anyio.run_process(
        [sys.executable, "-m", "levelzero.bench.cli_produce", url, topic, str(lines)]
    )
    elapsed = time.perf_counter() - started
    return int(result.stdout.decode().strip().splitlines()[-1]) / elapsed


async def _client_side(url: str, topic: str, lines: Path) -> int:
    import secrets

    from levelzero.cli.commands import PRODUCE_RUN_ID_BYTES, produce_key
    from levelzero.client import Client

    values = lines.read_bytes().splitlines()
    run = secrets.token_hex(PRODUCE_RUN_ID_BYTES)  # each request keyed, as the command's are
    async with Client(url) as client:
        for n, i in enumerate(range(0, len(values), BATCH_RECORDS)):
            batch = [(None, v) for v in values[i : i + BATCH_RECORDS]]
            await client.produce(topic, 0, batch, idempotency_key=produce_key(run, n))
    return len(values)


async def run(settings: Settings) -> list[Figure]:
    count = settings.pick(RECORDS, 20_000)
    with work_dir(settings, ITEM) as tmp:
        lines = Path(tmp) / "lines.txt"
        write_lines(lines, count)
        data_dir = Path(tmp) / "data"
        async with kafka_bench_daemon(data_dir, kafka=False, l1_every_pass=False) as (daemon, client):
            assert daemon.url is not None
            url = daemon.url

            async def sut(i: int) -> float:
                await client.create_topic(f"cli-{i}", 1)
                return await cli_round(url, f"cli-{i}", lines)

            async def floor(i: int) -> float:
                await client.create_topic(f"client-{i}", 1)
                return await client_round(url, f"client-{i}", lines)

            pairs = await interleave(settings.pick(settings.rounds, 1), sut, floor)
    notes = {
        "records_per_round": count,
        "value_bytes": VALUE_BYTES,
        "cli_rounds": [round(s) for s, _ in pairs],
    }
    return [
        figure(
            ITEM,
            "levelzero produce from stdin at its defaults vs the 30,000 records/s target",
            "records/s",
            [(s, TARGET_RECORDS_PER_S) for s, _ in pairs],
            target=TARGET,
            sut_label="produce",
            floor_label="target",
            notes=notes,
        ),
        figure(
            ITEM,
            "levelzero produce from stdin vs the bundled client (same batches, child process)",
            "records/s",
            pairs,
            sut_label="produce",
            floor_label="client",
            notes=notes,
        ),
    ]


if __name__ == "__main__":
    print(anyio.run(_client_side, sys.argv[1], sys.argv[2], Path(sys.argv[3])))
