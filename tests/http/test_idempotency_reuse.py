"""An HTTP produce's `idempotency_key` names one request: sent again with the same records it is
a repeat (200, the first offsets, `duplicate: true`, nothing stored); sent with other records
it is refused (422 `idempotency_key_reused`, nothing stored), wherever the key is recognised:
in the intake's memory, from the store's sequence table after a restart (SQLite, PostgreSQL),
and from the partition's own placeholders when that table missed the key (a crash between the
commit of the records and the table's row)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from levelzero.client import ApiError, Client, RecordIn

from daemon_support import daemon_and_client, postgres_overrides, raw

RECORDS = "/v1/topics/t/partitions/0/records"
KEY = "job-7/task-2/0"
FIRST = [b"a", b"b", b"c"]  # stored at offsets 1..3, after one record without a key


async def _first_use(client: Client) -> None:
    await client.create_topic("t", 1)
    await client.produce("t", 0, [b"before"])
    first = await client.produce("t", 0, FIRST, idempotency_key=KEY)
    assert (first.base_offset, first.last_offset, first.duplicate) == (1, 3, False)


async def _values(client: Client) -> list[bytes | None]:
    return [r.value for r in (await client.fetch("t", 0, 0)).records]


async def _refused(client: Client, records: list[Any]) -> ApiError:
    with pytest.raises(ApiError) as refused:
        await client.produce("t", 0, records, idempotency_key=KEY)
    assert (refused.value.status, refused.value.code) == (422, "idempotency_key_reused")
    return refused.value


async def test_the_same_key_and_records_is_a_repeat_with_the_first_offsets(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path) as (_, client):
        await _first_use(client)
        for _ in range(2):
            again = await client.produce("t", 0, FIRST, idempotency_key=KEY)
            assert (again.base_offset, again.last_offset, again.duplicate) == (1, 3, True)
        assert await _values(client) == [b"before", *FIRST]


async def test_the_same_key_with_other_values_is_refused_and_stores_nothing(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path) as (_, client):
        await _first_use(client)
        refused = await _refused(client, [b"a", b"b", b"X"])
        assert refused.first_offsets == (1, 3)  # where the key's records are
        assert "first used with a different request" in refused.message
        assert "a new request needs a new key" in refused.message
        answer = await raw(
            client, "POST", RECORDS, json={"records": [{"value": "WA=="}] * 3, "idempotency_key": KEY}
        )
        assert answer.status_code == 422
        assert answer.json()["error"] == "idempotency_key_reused"
        assert (answer.json()["base_offset"], answer.json()["last_offset"]) == (1, 3)
        assert await _values(client) == [b"before", *FIRST]
        assert (await client.fetch("t", 0, 0)).high_watermark == 4
        # The daemon still serves the key's repeat and new requests.
        again = await client.produce("t", 0, FIRST, idempotency_key=KEY)
        assert (again.base_offset, again.duplicate) == (1, True)
        assert (await client.produce("t", 0, [b"d"], idempotency_key=KEY + "/next")).base_offset == 4


async def test_the_same_key_with_another_record_count_is_refused(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path) as (_, client):
        await _first_use(client)
        assert (await _refused(client, FIRST[:2])).first_offsets == (1, 3)
        assert (await _refused(client, [*FIRST, b"d"])).first_offsets == (1, 3)
        assert await _values(client) == [b"before", *FIRST]


async def test_the_same_key_with_another_record_key_header_or_timestamp_is_refused(tmp_path: Path) -> None:
    """What the client sent is compared: a record's key, value, headers and timestamp."""
    async with daemon_and_client(tmp_path) as (_, client):
        await _first_use(client)
        for changed in (
            RecordIn(b"c", key=b"k"),
            RecordIn(b"c", headers=[("h", b"1")]),
            RecordIn(b"c", headers=[("h", None)]),
            RecordIn(b"c", timestamp_ms=1_700_000_000_000),
            RecordIn(None),  # a null value is not an empty one
        ):
            await _refused(client, [b"a", b"b", changed])
        assert await _values(client) == [b"before", *FIRST]
        # Written out in full or left to defaults, the same records are the same request.
        same = [RecordIn(b"a", key=None, headers=[]), RecordIn(b"b"), RecordIn(b"c", timestamp_ms=None)]
        assert (await client.produce("t", 0, same, idempotency_key=KEY)).duplicate


async def test_a_reuse_sharing_the_digest_by_chance_is_refused_by_its_record_count(tmp_path: Path) -> None:
    """The digest has 15 bits: these two records share the first request's by chance (found by
    search), and their count tells them apart."""
    async with daemon_and_client(tmp_path) as (_, client):
        await _first_use(client)
        assert (await _refused(client, [b"a", b"23861"])).first_offsets == (1, 3)
        assert await _values(client) == [b"before", *FIRST]


async def _reused_after_a_restart(tmp_path: Path, **settings: Any) -> None:
    async with daemon_and_client(tmp_path, **settings) as (_, client):
        await _first_use(client)
    async with daemon_and_client(tmp_path, **settings) as (_, client):
        assert (await _refused(client, [b"a", b"b", b"X"])).first_offsets == (1, 3)
        assert (await _refused(client, FIRST[:1])).first_offsets == (1, 3)
        again = await client.produce("t", 0, FIRST, idempotency_key=KEY)
        assert (again.base_offset, again.last_offset, again.duplicate) == (1, 3, True)
        assert await _values(client) == [b"before", *FIRST]


async def test_a_reused_key_is_refused_after_a_restart(tmp_path: Path) -> None:
    """The key's digest is kept in the store's sequence table: a restarted daemon refuses it."""
    await _reused_after_a_restart(tmp_path)


async def test_a_reused_key_is_refused_after_a_restart_with_postgresql(
    tmp_path: Path, postgres_dsn: str
) -> None:
    await _reused_after_a_restart(tmp_path, **postgres_overrides(postgres_dsn))


async def test_a_reused_key_the_sequence_table_missed_is_refused_from_the_partitions_placeholders(
    tmp_path: Path,
) -> None:
    """The table's row gone (as after a crash between the records' commit and the row), the
    key's producer and digest are still in the partition's placeholders: the lane refuses the
    other records rather than store them as the producer's new epoch."""
    async with daemon_and_client(tmp_path) as (_, client):
        await _first_use(client)
    with sqlite3.connect(tmp_path / "levelzero.db") as db:
        assert db.execute("DELETE FROM producer_batches").rowcount == 1
    db.close()
    async with daemon_and_client(tmp_path) as (_, client):
        assert (await _refused(client, [b"a", b"b", b"X"])).first_offsets == (1, 3)
        again = await client.produce("t", 0, FIRST, idempotency_key=KEY)
        assert (again.base_offset, again.last_offset, again.duplicate) == (1, 3, True)
        assert (await _refused(client, [b"X"])).first_offsets == (1, 3)
        assert await _values(client) == [b"before", *FIRST]
