"""A partition whose first range an operator abandoned (`partition abandon-unreconciled`):
every reader is told the first readable offset as its start, so reading "from the start" (the
CLI's consume without --offset, an HTTP fetch without one, a Kafka consumer resetting to
earliest) reads what is left instead of failing on offsets that will never be readable."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from kio.schema.errors import ErrorCode

from levelzero.cli import main as cli
from levelzero.core.reconcile_health import RECONCILE_FAILURES_BEFORE_FAILING

from daemon_support import daemon_and_client
from test_kafka_listener import Wire, fetch, list_offsets, records_of

EARLIEST = -2  # ListOffsets: the log start offset


async def test_reading_from_the_start_begins_past_a_range_abandoned_at_the_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with daemon_and_client(
        tmp_path, reconciler__enabled=False, housekeeper__enabled=False, kafka__listen="127.0.0.1:0"
    ) as (daemon, client):
        node = daemon.node
        assert node is not None and daemon.url is not None and daemon.kafka_port is not None
        await client.create_topic("t", 2)
        assert (await client.produce("t", 1, [b"lost 0", b"lost 1"])).base_offset == 0
        [placeholder] = await node.log_store.read_placeholders(node.partition("t", 1).row.pid, 0, 1)
        os.remove(os.path.join(daemon.config.storage.objects_dir, placeholder.entry.object_key))
        for _ in range(RECONCILE_FAILURES_BEFORE_FAILING):
            await node.reconciler.run_round()
        abandoned = await client.abandon_unreconciled("t", 1, operator="ops", reason="lost", confirm=True)
        assert (abandoned.first_offset, abandoned.last_offset) == (0, 1)
        assert (await client.produce("t", 1, [b"after 2", b"after 3"])).base_offset == 2

        # The CLI, as the operator ran it: no --offset is "the start".
        code = await anyio.to_thread.run_sync(
            cli.main, ["consume", "t", "-p", "1", "--format", "offsets", "--url", daemon.url]
        )
        out, err = capsys.readouterr()
        assert (code, err) == (0, "")
        assert [line.split("\t")[0] for line in out.splitlines()] == ["2", "3"]

        # One start everywhere: the HTTP fetch without an offset, status, Kafka's ListOffsets.
        fetched = await client.fetch("t", 1)
        assert [r.offset for r in fetched.records] == [2, 3] and fetched.start_offset == 2
        [status] = [p for p in (await client.status("t")).partitions if p.partition == 1]
        assert status.start_offset == 2
        wire = await Wire.connect(daemon.kafka_port)
        try:
            answer = await list_offsets(wire, "t", 1, EARLIEST)
            assert (answer.error_code, answer.offset) == (ErrorCode.none, 2)
            response = await fetch(wire, "t", 1, 2)
            part = response.responses[0].partitions[0]
            assert part.error_code == ErrorCode.none and part.log_start_offset == 2
            assert [offset for offset, _, _ in records_of(response)] == [2, 3]
            gone = (await fetch(wire, "t", 1, 0)).responses[0].partitions[0]
            assert gone.error_code == ErrorCode.offset_out_of_range
        finally:
            await wire.aclose()
