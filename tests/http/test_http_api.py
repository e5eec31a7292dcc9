"""The HTTP API against an in-process daemon (real uvicorn on a free loopback port): the happy
path, and bad input of every kind answered with the right status and a JSON error, after
which the daemon still serves."""

from __future__ import annotations

import base64
import json
import logging
import time
from pathlib import Path

import anyio
import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition

from levelzero.client import ApiError
from levelzero.core.errors import ObjectNotFound, StorageError
from levelzero.cli.demo import UploadGate
from levelzero.daemon.service import Daemon
from levelzero.http.app import build_app
from levelzero.storage.protocols import ObjectStore

from daemon_support import JSON, TOKEN, assert_error, daemon_and_client, raw

RECORDS = "/v1/topics/t/partitions/0/records"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def wait_until(predicate, what: str, timeout_s: float = 10.0) -> None:
    with anyio.fail_after(timeout_s):
        while not predicate():
            await anyio.sleep(0.01)


async def test_topics_produce_fetch_status_epoch_and_metrics(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path) as (daemon, client):
        info = await client.create_topic("t", 2)
        assert (info.name, info.partitions) == ("t", 2)
        assert [(t.name, t.partitions) for t in await client.list_topics()] == [("t", 2)]

        records = [(None, b"v0"), (b"k1", b"\x00\xff binary"), (b"", b"")]
        ack = await client.produce("t", 1, records)
        assert (ack.base_offset, ack.last_offset, ack.attempts) == (0, 2, 1)
        ack = await client.produce("t", 1, [b"v3"])
        assert (ack.base_offset, ack.last_offset) == (3, 3)

        fetched = await client.fetch("t", 1, 0)
        assert [(r.offset, r.key, r.value) for r in fetched.records] == [
            (0, None, b"v0"),
            (1, b"k1", b"\x00\xff binary"),
            (2, b"", b""),
            (3, None, b"v3"),
        ]
        assert (fetched.next_offset, fetched.high_watermark, fetched.start_offset) == (4, 4, 0)
        assert fetched.tier in ("l0", "l1", "l1+l0")
        at_end = await client.fetch("t", 1, 4)
        assert (at_end.records, at_end.next_offset, at_end.tier) == ([], 4, "none")
        from_default = await client.fetch("t", 1)  # no offset: from the start offset
        assert len(from_default.records) == 4

        epoch = (await client.status()).cluster_epoch
        assert await client.advance_epoch() == epoch + 1
        status = await client.status()
        assert status.cluster_epoch == epoch + 1 and status.accepting
        by_name = {(p.topic, p.partition): p for p in status.partitions}
        p1 = by_name[("t", 1)]
        assert p1.high_watermark == 4 and p1.max_applied_epoch == epoch and p1.term >= 1
        assert p1.window is not None and p1.window[1] == epoch
        assert p1.min_epoch_lower_bound is not None
        assert status.m is None or status.m <= status.cluster_epoch - 1
        assert status.batcher.records_appended == 4
        assert (await client.status()).partitions[0].topic == "t"

        text = await client.metrics()
        assert f"levelzero_cluster_epoch {float(epoch + 1)}" in text
        assert 'levelzero_produce_latency_seconds_count{outcome="acknowledged",protocol="http"} 2.0' in text
        assert "levelzero_batcher_object_size_bytes_count 2.0" in text
        assert "levelzero_fence_window_slides_total" in text
        metric = {
            line.split()[0]: float(line.split()[1])
            for line in text.splitlines()
            if line.startswith("levelzero_appender_")
        }
        # two produces and the epoch's AdvanceEpoch entries: each a batch, some calls carry many
        assert 2 <= metric["levelzero_appender_calls_total"] <= metric["levelzero_appender_batches_total"]
        assert 'levelzero_partition_high_watermark{partition="1",topic="t"} 4.0' in text
        assert 'levelzero_http_requests_total{code="200",route="/v1/status"}' in text
        # The object sizes were drained into the histogram: a second scrape does not double them.
        assert "levelzero_batcher_object_size_bytes_count 2.0" in await client.metrics()

        assert (await raw(client, "GET", "/healthz")).json() == {"status": "ok"}
        assert (await raw(client, "GET", "/readyz")).json() == {"status": "ready"}


async def test_a_json_null_value_round_trips_distinct_from_an_empty_one(tmp_path: Path) -> None:
    """`"value": null` is a null value (a Kafka tombstone): fetched as `null`, over the raw JSON
    and through the client, never as `""`; a missing value is still a 400."""
    async with daemon_and_client(tmp_path) as (_, client):
        await client.create_topic("t", 1)
        body = {
            "records": [
                {"key": b64(b"gone"), "value": None},
                {"key": b64(b"empty"), "value": ""},
                {"key": None, "value": None},
                {"value": b64(b"v")},
            ]
        }
        response = await raw(client, "POST", RECORDS, json=body)
        assert response.status_code == 200, response.text
        fetched = (await raw(client, "GET", RECORDS)).json()["records"]
        assert [(r["offset"], r["key"], r["value"]) for r in fetched] == [
            (0, b64(b"gone"), None),
            (1, b64(b"empty"), ""),
            (2, None, None),
            (3, None, b64(b"v")),
        ]
        records = (await client.fetch("t", 0, 0)).records
        assert [(r.key, r.value) for r in records] == [
            (b"gone", None),
            (b"empty", b""),
            (None, None),
            (None, b"v"),
        ]
        response = await raw(client, "POST", RECORDS, json={"records": [{"key": None}]})
        assert_error(response, 400, "malformed_request", "missing required field `value`")


async def test_a_record_sent_without_a_timestamp_gets_the_time_it_was_received(tmp_path: Path) -> None:
    """As a Kafka producer stamps every record: stored without one, a Kafka consumer read -1
    (Kafka Streams' default timestamp extractor refuses it) and a lookup by time passed the
    record over. A timestamp given is kept; an idempotency key's repeat (stamped again) is
    still the same produce."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("t", 1)
        before = int(time.time() * 1000)
        body = {"records": [{"value": b64(b"a")}, {"value": b64(b"b"), "timestamp_ms": 5}]}
        assert (await raw(client, "POST", RECORDS, json=body)).status_code == 200
        keyed = {"records": [{"value": b64(b"c")}], "idempotency_key": "k"}
        first = (await raw(client, "POST", RECORDS, json=keyed)).json()
        await anyio.sleep(0.01)  # the repeat's own stamp differs
        again = (await raw(client, "POST", RECORDS, json=keyed)).json()
        after = int(time.time() * 1000)
        assert (first["base_offset"], again["base_offset"], again["duplicate"]) == (2, 2, True)
        fetched = (await raw(client, "GET", RECORDS)).json()["records"]
        assert [r["offset"] for r in fetched] == [0, 1, 2]
        stamped = fetched[0]["timestamp_ms"]
        assert before <= stamped <= after and fetched[1]["timestamp_ms"] == 5
        assert before <= fetched[2]["timestamp_ms"] <= after
        # A Kafka consumer's view: CreateTime, the stamp; and a lookup by time finds the record.
        bootstrap = f"127.0.0.1:{daemon.kafka_port}"
        seen = await anyio.to_thread.run_sync(_kafka_timestamps, bootstrap, stamped)
        assert seen == ([(1, stamped), (1, 5), (1, fetched[2]["timestamp_ms"])], 0)


def _kafka_timestamps(bootstrap: str, stamped: int) -> tuple[list[tuple[int, int]], int]:
    """(type, timestamp) of t/0's records, and the offset a lookup by `stamped` finds."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ts", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition("t", 0, 0)])
        out: list[tuple[int, int]] = []
        for _ in range(100):  # bounded: polls of 0.1 s
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                out.append(message.timestamp())
            if len(out) == 3:
                break
        (found,) = consumer.offsets_for_times([TopicPartition("t", 0, stamped)], 10)
        return out, found.offset
    finally:
        consumer.close()


async def test_status_m_is_capped_and_names_what_blocks_it(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path) as (_, client):
        status = await client.status()
        assert status.partitions == [] and status.m == status.cluster_epoch - 1
        assert status.m_holders == ["cap"]
        await client.create_topic("t", 3)
        await client.produce("t", 0, [b"x"])
        status = await client.status()
        without_mp = sorted(f"{p.topic}/{p.partition}" for p in status.partitions if p.mp is None)
        assert status.m_blocked_by == without_mp and status.m_blocked_count == len(without_mp)
        if without_mp:
            assert status.m is None
        else:
            mps = [p.mp for p in status.partitions]
            assert status.m == min(*mps, status.cluster_epoch - 1)


async def test_malformed_bodies_are_400_with_the_field_named(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path) as (_, client):
        await client.create_topic("t", 1)
        headers = {"content-type": "application/json"}
        cases = [
            (b"{", "not valid JSON"),
            (b"", "needs a JSON body"),
            (b"[]", "Expected `object`, got `array`"),
            (b'{"records": "x"}', "$.records"),
            (b'{"records": [{"value": 1}]}', "$.records[0].value"),
            (b'{"records": [{"value": "!!not base64"}]}', "Invalid base64"),
            (b'{"records": [{"value": "aGk=", "extra": 1}]}', "unknown field `extra`"),
            (b'{"records": [{"key": "aGk="}]}', "missing required field `value`"),
            (b'{"records": []}', "at least one record"),
        ]
        for body, fragment in cases:
            response = await raw(client, "POST", RECORDS, content=body, headers=headers)
            assert_error(response, 400, "malformed_request", fragment)
        for body, fragment in [
            (b'{"name": 5, "partitions": 1}', "$.name"),
            (b'{"name": "x", "partitions": "many"}', "$.partitions"),
            (b'{"name": "bad/name", "partitions": 1}', "topic name 'bad/name' must be 1-200 characters"),
            (b'{"name": ".", "partitions": 1}', "must not be made of dots only"),
            (b'{"name": "..", "partitions": 1}', "must not be made of dots only"),
            (b'{"name": ".lz-tmp-x", "partitions": 1}', "reserved temp-file prefix"),
            (b'{"name": "x", "partitions": 0}', "partitions must be an integer"),
            (b'{"name": "x"}', "missing required field `partitions`"),
        ]:
            response = await raw(client, "POST", "/v1/topics", content=body)
            assert response.status_code == 400, response.text
            assert fragment in response.json()["message"]
        # Still serving, nothing was created.
        assert [t.name for t in await client.list_topics()] == ["t"]
        assert (await client.produce("t", 0, [b"fine"])).base_offset == 0


def body_routes(daemon: Daemon) -> list[tuple[str, str]]:
    """Every (method, path) of the API that takes a body, its path naming partition t/0."""
    assert daemon.node is not None and daemon.metrics is not None
    return [
        (method, route.path.format(topic="t", partition=0))
        for route in build_app(daemon.node, daemon.metrics).routes
        for method in sorted(route.methods & {"POST", "PUT", "PATCH"})
    ]


async def test_every_route_with_a_body_refuses_unknown_fields(tmp_path: Path) -> None:
    """A misspelt field is a 400 on every route, those that take no fields included (none, or
    `{}`): epoch advance ran whatever its body said."""
    async with daemon_and_client(tmp_path) as (daemon, client):
        await client.create_topic("t", 1)
        epoch = (await client.status()).cluster_epoch
        routes = body_routes(daemon)
        assert ("POST", "/v1/epoch/advance") in routes and ("PATCH", "/v1/topics/t/configs") in routes
        for method, path in routes:
            response = await raw(client, method, path, json={"no_such_field": True})
            assert_error(response, 400, "malformed_request", "unknown field `no_such_field`")
        status = await client.status()
        assert status.cluster_epoch == epoch and status.gc.paused is False  # none of them ran
        for path in ("/v1/epoch/advance", "/v1/gc/pause", "/v1/gc/resume"):
            assert (await raw(client, "POST", path, json={})).status_code == 200, path
        assert await client.advance_epoch() == epoch + 2  # and without a body


async def test_a_body_not_in_utf8_is_a_400_on_every_route(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Bytes that are not UTF-8 in a string or a field name were a 500 with a traceback logged."""
    async with daemon_and_client(tmp_path) as (daemon, client):
        await client.create_topic("t", 1)
        for method, path in body_routes(daemon):
            for body in (b'{"\xff": 1}', b"\xff\xfe"):
                response = await raw(client, method, path, content=body, headers=JSON)
                assert_error(response, 400, "malformed_request", "not valid JSON")
        for method, path, body in [
            ("POST", "/v1/topics", b'{"name": "\xff", "partitions": 1}'),
            ("PATCH", "/v1/topics/t/configs", b'{"configs": {"retention.ms": "\xc3"}}'),
            ("POST", RECORDS, b'{"records": [{"value": "aGk="}], "idempotency_key": "\xed\xa0\x80"}'),
            ("POST", RECORDS, b'{"records": [{"value": "\xff"}]}'),  # base64: not base64 either
        ]:
            response = await raw(client, method, path, content=body, headers=JSON)
            assert_error(response, 400, "malformed_request")
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
        assert (await client.produce("t", 0, [b"still serving"])).base_offset == 0


async def test_size_limits_are_413(tmp_path: Path) -> None:
    async with daemon_and_client(
        tmp_path,
        server__body_bytes_max=64 * 1024,
        server__records_per_request_max=100,
        batcher__batch_bytes_max=16 * 1024,
    ) as (_, client):
        await client.create_topic("t", 1)
        huge = json.dumps({"records": [{"value": b64(b"x" * 100_000)}]}).encode()
        assert_error(await raw(client, "POST", RECORDS, content=huge), 413, "too_large", "body_bytes_max")

        async def chunked():
            for _ in range(20):
                yield b" " * 10_000

        assert_error(await raw(client, "POST", RECORDS, content=chunked()), 413, "too_large")
        many = json.dumps({"records": [{"value": ""}] * 101}).encode()
        assert_error(
            await raw(client, "POST", RECORDS, content=many), 413, "too_large", "records_per_request_max"
        )
        big_records = json.dumps({"records": [{"value": b64(b"y" * 20_000)}]}).encode()
        assert_error(
            await raw(client, "POST", RECORDS, content=big_records), 413, "too_large", "batch_bytes_max"
        )
        assert (await client.produce("t", 0, [b"small"] * 100)).last_offset == 99


async def test_a_produce_at_batch_bytes_max_by_the_size_rule_succeeds_and_one_byte_over_is_413(
    tmp_path: Path,
) -> None:
    """The README's one size rule: value + key + header names and values + 8 per record. At
    the limit (its encoding is larger: framing, a 9-byte timestamp) the produce is stored."""
    limit = 16 * 1024

    def body(value_bytes: int) -> bytes:
        record = {
            "key": b64(b"k" * 100),
            "value": b64(b"v" * value_bytes),
            "timestamp_ms": 1_700_000_000_000,
            "headers": [["h", b64(b"xyz")]],
        }
        return json.dumps({"records": [record]}).encode()

    at_limit = limit - 100 - 4 - 8
    async with daemon_and_client(tmp_path, batcher__batch_bytes_max=limit) as (_, client):
        await client.create_topic("t", 1)
        answer = await raw(client, "POST", RECORDS, content=body(at_limit))
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"base_offset": 0, "last_offset": 0, "attempts": 1}
        assert_error(
            await raw(client, "POST", RECORDS, content=body(at_limit + 1)),
            413,
            "too_large",
            f"{limit + 1} record bytes exceed batch_bytes_max {limit}",
        )
        (stored,) = (await client.fetch("t", 0, 0)).records
        assert (stored.key, stored.value) == (b"k" * 100, b"v" * at_limit)


async def test_a_fetch_returns_every_record_its_max_bytes_holds_across_l1_objects(tmp_path: Path) -> None:
    """10 single-record produces reconciled into L1 objects of at most 2 records: one GET
    returns the 10 (it returned one object's records: a consumer made five round trips)."""
    async with daemon_and_client(
        tmp_path, reconciler__placeholders_per_object_max=2, reconciler__interval_s=0.05
    ) as (_, client):
        await client.create_topic("t", 1)
        for i in range(10):
            await client.produce("t", 0, [b"value-%d" % i])

        async def reconciled() -> bool:
            (p,) = (await client.status()).partitions
            return p.lro == 9

        with anyio.fail_after(20):
            while not await reconciled():
                await anyio.sleep(0.05)
        (p,) = (await client.status()).partitions
        assert p.l1_objects >= 5
        fetched = await client.fetch("t", 0, 0, 1024)
        assert [(r.offset, r.value) for r in fetched.records] == [(i, b"value-%d" % i) for i in range(10)]
        assert (fetched.next_offset, fetched.high_watermark, fetched.tier) == (10, 10, "l1")
        cut = await client.fetch("t", 0, 0, 7 * 7)  # 7-byte values: the budget's boundary
        assert (len(cut.records), cut.next_offset) == (7, 7)


async def test_unknown_topics_partitions_offsets_and_routes(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path) as (_, client):
        await client.create_topic("t", 2)
        await client.produce("t", 0, [b"a", b"b"])
        body = {"json": {"records": [{"value": "aGk="}]}}
        assert_error(
            await raw(client, "POST", "/v1/topics/nope/partitions/0/records", **body), 404, "unknown_topic"
        )
        assert_error(
            await raw(client, "POST", "/v1/topics/t/partitions/2/records", **body), 404, "unknown_partition"
        )
        assert_error(await raw(client, "GET", "/v1/topics/nope/partitions/0/records"), 404, "unknown_topic")
        assert_error(await raw(client, "GET", "/v1/topics/t/partitions/9/records"), 404, "unknown_partition")
        assert_error(
            await raw(client, "GET", "/v1/topics/t/partitions/-1/records"),
            400,
            "malformed_request",
            "partition",
        )
        assert_error(await raw(client, "GET", "/v1/topics/t/partitions/x/records"), 400, "malformed_request")
        assert_error(
            await raw(client, "GET", RECORDS, params={"offset": "-1"}), 400, "malformed_request", "offset"
        )
        assert_error(await raw(client, "GET", RECORDS, params={"offset": "1.5"}), 400, "malformed_request")
        assert_error(
            await raw(client, "GET", RECORDS, params={"offset": "3"}), 404, "offset_out_of_range", "[0, 2)"
        )
        # max_bytes out of its range, however: one message naming the range (-5 was "must be a
        # non-negative integer", 0 "must be in 1..16777216", a long one "at most 999...")
        for given, said in (
            ("0", "max_bytes 0 is out of range (1..16777216)"),
            ("16777217", "max_bytes 16777217 is out of range (1..16777216)"),
            ("9" * 30, "is out of range (1..16777216)"),
            ("-5", "max_bytes must be an integer in 1..16777216, not '-5'"),
        ):
            assert_error(
                await raw(client, "GET", RECORDS, params={"max_bytes": given}), 400, "malformed_request", said
            )
        assert_error(
            await raw(client, "GET", RECORDS, params={"ofset": "0"}), 400, "malformed_request", "'ofset'"
        )
        assert_error(await raw(client, "GET", "/v1/status", params={"topic": "nope"}), 404, "unknown_topic")
        assert_error(await raw(client, "GET", "/v2/anything"), 404, "not_found")
        assert_error(await raw(client, "DELETE", "/v1/topics"), 405, "method_not_allowed")
        with pytest.raises(ApiError) as caught:
            await client.create_topic("t", 1)
        assert (caught.value.status, caught.value.code) == (409, "topic_exists")
        assert [r.value for r in (await client.fetch("t", 0, 0)).records] == [b"a", b"b"]


async def test_token_is_required_when_configured(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, token=TOKEN, server__token=TOKEN) as (daemon, client):
        await client.create_topic("t", 1)
        async with httpx.AsyncClient(base_url=daemon.url, trust_env=False) as anonymous:
            for method, path in [
                ("GET", "/v1/topics"),
                ("GET", "/v1/status"),
                ("GET", "/metrics"),
                ("POST", "/v1/epoch/advance"),
                ("GET", RECORDS),
            ]:
                response = await anonymous.request(method, path)
                assert_error(response, 401, "unauthorized", "missing bearer token")
                assert response.headers["www-authenticate"] == "Bearer"
            wrong = await anonymous.get("/v1/topics", headers={"Authorization": "Bearer wrong-token"})
            assert_error(wrong, 401, "unauthorized", "invalid bearer token")
            basic = await anonymous.get("/v1/topics", headers={"Authorization": "Basic dTpw"})
            assert_error(basic, 401, "unauthorized")
            assert (await anonymous.get("/healthz")).status_code == 200
            assert (await anonymous.get("/readyz")).status_code == 200
        assert [t.name for t in await client.list_topics()] == ["t"]


async def test_stale_epoch_after_retries_is_409(tmp_path: Path) -> None:
    """A write whose upload is held while the partition's window moves past its epoch is
    rejected; with no retries allowed the producer gets 409 stale_cluster_epoch."""
    gates: list[UploadGate] = []

    def wrap(store):
        gates.append(UploadGate(store))
        return gates[-1]

    async with daemon_and_client(tmp_path, wrap_object_store=wrap, batcher__stale_retries_max=0) as (
        daemon,
        client,
    ):
        await client.create_topic("t", 1)
        node = daemon.node
        await node.epoch_cache.refresh()
        await client.produce("t", 0, [b"prime"])
        gates[0].arm(node.partition("t", 0).row.pid)
        outcome: list[object] = []

        async def held() -> None:
            try:
                outcome.append(await client.produce("t", 0, [b"held"]))
            except ApiError as exc:
                outcome.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(held)
            await gates[0].arrived.wait()
            for _ in range(2):
                await client.advance_epoch()
                await node.epoch_cache.refresh()
                await client.produce("t", 0, [b"newer"])
            gates[0].release()
        [error] = outcome
        assert isinstance(error, ApiError)
        assert (error.status, error.code) == (409, "stale_cluster_epoch")
        assert "below the partition's window" in error.message
        assert (await client.status()).batcher.stale_failures == 1
        values = [r.value for r in (await client.fetch("t", 0, 0)).records]
        assert values == [b"prime", b"newer", b"newer"]


async def test_stopping_drains_in_flight_produces_and_refuses_new_ones(tmp_path: Path) -> None:
    gates: list[UploadGate] = []

    def wrap(store):
        gates.append(UploadGate(store))
        return gates[-1]

    async with daemon_and_client(tmp_path, wrap_object_store=wrap) as (daemon, client):
        await client.create_topic("t", 1)
        gates[0].arm(daemon.node.partition("t", 0).row.pid)
        acks = []

        async def in_flight() -> None:
            acks.append(await client.produce("t", 0, [b"in flight at shutdown"]))

        async with anyio.create_task_group() as tg:
            tg.start_soon(in_flight)
            await gates[0].arrived.wait()
            daemon.request_stop("test")
            await wait_until(lambda: daemon.lifecycle.stopping, "stopping")
            assert_error(await raw(client, "GET", "/readyz"), 503, "shutting_down")
            refused = await raw(client, "POST", RECORDS, json={"records": [{"value": "aGk="}]})
            assert_error(refused, 503, "shutting_down")
            assert refused.headers["retry-after"] == "1"
            create = await raw(client, "POST", "/v1/topics", json={"name": "u", "partitions": 1})
            assert_error(create, 503, "shutting_down")
            assert (await raw(client, "GET", "/healthz")).status_code == 200
            gates[0].release()
        assert acks[0].base_offset == 0
    assert daemon.stopped_cleanly


async def test_two_daemons_in_one_process_have_their_own_metrics(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path / "a") as (_, a), daemon_and_client(tmp_path / "b") as (_, b):
        await a.create_topic("t", 1)
        await a.produce("t", 0, [b"x"])
        assert (
            'levelzero_produce_latency_seconds_count{outcome="acknowledged",protocol="http"} 1.0'
            in await a.metrics()
        )
        assert (
            'levelzero_produce_latency_seconds_count{outcome="acknowledged",protocol="http"} 0.0'
            in await b.metrics()
        )
        assert "levelzero_partitions 0.0" in await b.metrics()


class FailingPuts:
    """An object store whose PUTs fail while `down` (an S3 outage, as the batcher meets it)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.down = False

    async def put(self, key: str, data: bytes | bytearray) -> None:
        if self.down:
            raise StorageError("S3 put failed: simulated outage")
        await self.inner.put(key, data)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


async def test_failed_produces_log_one_warning_per_error_code_not_one_per_request(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stores: list[FailingPuts] = []

    def wrap(store: ObjectStore) -> FailingPuts:
        stores.append(FailingPuts(store))
        return stores[-1]

    async with daemon_and_client(tmp_path, wrap_object_store=wrap, gc__enabled=False) as (_, client):
        await client.create_topic("t", 1)
        stores[0].down = True
        with caplog.at_level(logging.WARNING, logger="levelzero.api"):
            for _ in range(5):
                with pytest.raises(ApiError) as caught:
                    await client.produce("t", 0, [b"lost to the outage"])
                assert (caught.value.status, caught.value.code) == (503, "storage_error")
        failed = [r.getMessage() for r in caplog.records if "failed: storage_error" in r.getMessage()]
        assert len(failed) == 1, failed
        assert failed[0].startswith("POST /v1/topics/t/partitions/0/records failed: storage_error:"), failed


async def test_failed_produces_are_observed_apart_from_acknowledged_ones(tmp_path: Path) -> None:
    """The produce latency histogram's `outcome="acknowledged"` series (the alert's) holds only
    stored produces; a produce the store failed is observed too, as `failed`."""
    stores: list[FailingPuts] = []

    def wrap(store: ObjectStore) -> FailingPuts:
        stores.append(FailingPuts(store))
        return stores[-1]

    async with daemon_and_client(tmp_path, wrap_object_store=wrap, gc__enabled=False) as (_, client):
        await client.create_topic("t", 1)
        await client.produce("t", 0, [b"stored"])
        stores[0].down = True
        for _ in range(3):
            with pytest.raises(ApiError):
                await client.produce("t", 0, [b"lost to the outage"])
        text = await client.metrics()
    assert 'levelzero_produce_latency_seconds_count{outcome="acknowledged",protocol="http"} 1.0' in text
    assert 'levelzero_produce_latency_seconds_count{outcome="failed",protocol="http"} 3.0' in text


async def test_unexpected_errors_are_500_json_and_the_daemon_keeps_serving(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with daemon_and_client(tmp_path) as (daemon, client):
        await client.create_topic("t", 1)
        api = daemon.node  # break one call path on purpose

        original = api.views

        def broken() -> list:
            raise RuntimeError("simulated failure")

        api.views = broken  # type: ignore[method-assign]
        assert_error(await raw(client, "GET", "/v1/status"), 500, "internal_error")
        assert "simulated failure" in caplog.text

        def violated() -> list:
            raise AssertionError("simulated invariant violation")

        api.views = violated  # type: ignore[method-assign]
        assert_error(await raw(client, "GET", "/v1/status"), 500, "internal_error", "a bug")
        assert any(r.levelname == "CRITICAL" and "BUG" in r.getMessage() for r in caplog.records)
        # A client retrying at once: every retry answered, the traceback logged once an interval
        # (each retry logged its own before).
        caplog.clear()
        for _ in range(5):
            assert_error(await raw(client, "GET", "/v1/status"), 500, "internal_error", "a bug")
            api.views = broken  # type: ignore[method-assign]
            assert_error(await raw(client, "GET", "/v1/status"), 500, "internal_error")
            api.views = violated  # type: ignore[method-assign]
        logged = [
            (r.levelname, r.exc_info is not None) for r in caplog.records if "serving" in r.getMessage()
        ]
        assert logged == [], logged  # both logged within the last 10 s already
        api.views = original  # type: ignore[method-assign]
        assert (await client.status()).partitions[0].topic == "t"


async def test_a_single_node_says_it_is_not_a_cluster(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path) as (_, client):
        await client.create_topic("t", 3)
        info = await client.cluster()
        assert (info.enabled, info.node_id, info.nodes, info.partitions_total) == (False, None, [], 3)


async def test_deleting_a_topic_over_http(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path) as (_daemon, client):
        await client.create_topic("t", 2)
        await client.create_topic("other", 1)
        await client.produce("t", 1, [b"old"])
        info = await client.delete_topic("t")
        assert (info.name, info.partitions) == ("t", 2)
        assert [t.name for t in await client.list_topics()] == ["other"]
        assert_error(await raw(client, "GET", "/v1/topics/t/partitions/1/records"), 404, "unknown_topic")
        produce = {"json": {"records": [{"value": b64(b"x")}]}}
        response = await raw(client, "POST", "/v1/topics/t/partitions/1/records", **produce)
        assert_error(response, 404, "unknown_topic")
        assert_error(await raw(client, "DELETE", "/v1/topics/t"), 404, "unknown_topic")
        assert_error(await raw(client, "GET", "/v1/topics/other"), 405, "method_not_allowed")
        await client.create_topic("t", 1)  # made again: it starts empty
        assert (await client.fetch("t", 0, 0)).records == []
        assert (await client.fetch("t", 0, 0)).high_watermark == 0


async def test_a_produce_with_an_idempotency_key_is_stored_once_across_a_restart(tmp_path: Path) -> None:
    """A repeat of a keyed produce (a client's retry, a Spark task's retry) answers the first
    one's offsets and stores nothing, also after the daemon restarted; another key, another
    partition or no key store again."""
    async with daemon_and_client(tmp_path) as (_, client):
        await client.create_topic("t", 2)
        await client.produce("t", 0, [b"before"])
        first = await client.produce("t", 0, [b"a", b"b", b"c"], idempotency_key="job-1/task-3/0")
        assert (first.base_offset, first.last_offset, first.duplicate) == (1, 3, False)
        again = await client.produce("t", 0, [b"a", b"b", b"c"], idempotency_key="job-1/task-3/0")
        assert (again.base_offset, again.last_offset, again.duplicate) == (1, 3, True)
        other = await client.produce("t", 0, [b"d"], idempotency_key="job-1/task-3/1")
        assert (other.base_offset, other.duplicate) == (4, False)
        elsewhere = await client.produce("t", 1, [b"a"], idempotency_key="job-1/task-3/0")
        assert (elsewhere.base_offset, elsewhere.duplicate) == (0, False)
        plain = await client.produce("t", 0, [b"a"])
        assert (plain.base_offset, plain.duplicate) == (5, False)
        unkeyed = {"records": [{"value": b64(b"x")}], "idempotency_key": ""}
        assert_error(
            await raw(client, "POST", RECORDS, json=unkeyed),
            400,
            "malformed_request",
            "idempotency_key",
        )
        # The key with other records is not a repeat: refused, with where the key's records are.
        with pytest.raises(ApiError) as refused:
            await client.produce("t", 0, [b"a", b"b"], idempotency_key="job-1/task-3/0")
        assert (refused.value.status, refused.value.code) == (422, "idempotency_key_reused")
        assert refused.value.first_offsets == (1, 3)
        answer = await raw(
            client,
            "POST",
            RECORDS,
            json={"records": [{"value": b64(b"z")}], "idempotency_key": "job-1/task-3/0"},
        )
        assert answer.status_code == 422
        assert answer.json() == {
            "error": "idempotency_key_reused",
            "message": "idempotency_key was first used with a different request (other records) on "
            "this partition (stored at offsets 1..3); a new request needs a new key",
            "base_offset": 1,
            "last_offset": 3,
        }
    async with daemon_and_client(tmp_path) as (_, client):
        repeat = await client.produce("t", 0, [b"a", b"b", b"c"], idempotency_key="job-1/task-3/0")
        assert (repeat.base_offset, repeat.last_offset, repeat.duplicate) == (1, 3, True)
        with pytest.raises(ApiError) as refused:  # after the restart too
            await client.produce("t", 0, [b"a", b"b", b"X"], idempotency_key="job-1/task-3/0")
        assert (refused.value.code, refused.value.first_offsets) == ("idempotency_key_reused", (1, 3))
        fetched = await client.fetch("t", 0, 0)
        assert [r.value for r in fetched.records] == [b"before", b"a", b"b", b"c", b"d", b"a"]


async def test_the_l0_caches_loads_hits_and_evictions_are_in_status_and_metrics(tmp_path: Path) -> None:
    """Room for one of the two objects (600-byte records): reading the two partitions' objects
    in turn evicts the other each time; reading one again hits."""
    settings = {"reconciler__enabled": False, "node__l0_cache_bytes_max": 1024}
    async with daemon_and_client(tmp_path, **settings) as (_, client):
        await client.create_topic("t", 2)
        zero, one = b"0" * 600, b"1" * 600
        await client.produce("t", 0, [zero])
        await client.produce("t", 1, [one])
        for partition, value in [(0, zero), (1, one), (0, zero), (0, zero)]:
            fetched = await client.fetch("t", partition, 0)
            assert ([r.value for r in fetched.records], fetched.tier) == ([value], "l0")
        cache = (await client.status()).l0_cache
        assert cache is not None
        counts = (cache.loads, cache.hits, cache.shared, cache.uncached_gets, cache.evictions)
        assert counts == (3, 1, 0, 0, 2)
        assert (cache.objects, cache.bytes_max, cache.inflight_bytes, cache.hit_ratio) == (1, 1024, 0, 0.25)
        assert cache.load_every == 1  # every miss loads: not thrashing
        assert 600 < cache.held_bytes <= 1024
        text = await client.metrics()
        for line in (
            "levelzero_l0_cache_loads_total 3.0",
            "levelzero_l0_cache_hits_total 1.0",
            "levelzero_l0_cache_evictions_total 2.0",
            "levelzero_l0_cache_bytes_max 1024.0",
            "levelzero_l0_cache_load_every 1.0",
            "levelzero_l0_cache_objects 1.0",
        ):
            assert line in text.splitlines(), line


async def test_a_restarted_daemon_shows_its_l1_objects_in_its_first_status(tmp_path: Path) -> None:
    """Right after a start no read, catch-up or retention visit has cached a partition's L1
    lineage yet: status reads it from the metastore for its page (it showed 0 objects and an
    empty lineage until the reconciler's first pass, for an idle partition until its first read)."""
    async with daemon_and_client(
        tmp_path, reconciler__placeholders_per_object_max=2, reconciler__interval_s=0.05
    ) as (_, client):
        await client.create_topic("t", 2)
        for i in range(6):
            await client.produce("t", 0, [b"value-%d" % i])
        with anyio.fail_after(20):
            while (await client.status()).partitions[0].lro != 5:
                await anyio.sleep(0.05)
        before = (await client.status()).partitions[0]
        assert before.l1_objects is not None and before.l1_objects >= 3  # at most 2 records each
    # Restarted with nothing that reads the lineage on its own: what status shows, it read.
    async with daemon_and_client(
        tmp_path,
        reconciler__enabled=False,
        housekeeper__enabled=False,
        compactor__enabled=False,
    ) as (daemon, client):
        status = await client.status()
        p0, p1 = status.partitions
        assert (p0.lro, p0.l1_objects, p0.l1_lineage) == (5, before.l1_objects, before.l1_lineage)
        assert p0.l1_lineage is not None and p0.l1_lineage[0].base_offset == 0
        assert [o.base_offset for o in p0.l1_lineage[1:]] == [o.last_offset + 1 for o in p0.l1_lineage[:-1]]
        assert p0.l1_lineage[-1].last_offset == 5
        assert (p1.l1_objects, p1.l1_lineage) == (0, [])
        page = await client.status_partitions(limit=1)
        assert [(p.topic, p.partition, p.l1_objects) for p in page.partitions] == [
            ("t", 0, before.l1_objects)
        ]
        # status read the lineage without caching it: the reads' cache is theirs to fill
        assert daemon.node is not None
        assert daemon.node.l1.lineage(daemon.node.partition("t", 0)) == []

        async def failing(*_args: object) -> None:
            raise StorageError("the metastore is away")

        daemon.node.l1.read_lineage = failing  # type: ignore[method-assign]
        unknown = (await client.status()).partitions
        assert [(p.l1_objects, p.l1_lineage) for p in unknown] == [(None, None), (None, None)]


async def test_status_shows_the_objects_reconciled_after_the_lineage_was_cached(tmp_path: Path) -> None:
    """The reconciler's catch-up moves the LRO, and only then is the cached L1 lineage read
    again: a status between the two showed the LRO past the lineage's last object (4 objects of
    5, CI under load). It reads the metastore's lineage where the cache ends below the LRO."""
    async with daemon_and_client(
        tmp_path,
        reconciler__placeholders_per_object_max=2,
        reconciler__interval_s=0.05,
        housekeeper__enabled=False,
    ) as (daemon, client):
        await client.create_topic("t", 1)
        assert daemon.node is not None
        catalog = daemon.node.l1
        actor = daemon.node.partition("t", 0)

        async def produce_and_reconcile(first: int, count: int) -> None:
            """... and wait for the reconciler's refresh after its last catch-up too: one still
            under way would overwrite the cache this test sets."""
            last = first + count - 1
            for i in range(first, first + count):
                await client.produce("t", 0, [b"value-%d" % i])
            with anyio.fail_after(20):
                while (
                    actor.state.lro != last
                    or not catalog.lineage(actor)
                    or catalog.lineage(actor)[-1]["last_offset"] != last
                ):
                    await anyio.sleep(0.05)

        await produce_and_reconcile(0, 2)
        cached = await catalog.refresh(actor)
        assert cached[-1].last_offset == 1
        await produce_and_reconcile(2, 2)
        # The cache as it stands between the last catch-up and the refresh after it.
        daemon.node.l1._valid[actor.row.pid] = cached
        daemon.node.l1._valid_at_lro[actor.row.pid] = 1
        (p,) = (await client.status()).partitions
        assert p.l1_lineage is not None and p.l1_objects == len(p.l1_lineage) > len(cached)
        assert p.l1_lineage[0].base_offset == 0 and p.l1_lineage[-1].last_offset == p.lro == 3
        assert [o.base_offset for o in p.l1_lineage[1:]] == [o.last_offset + 1 for o in p.l1_lineage[:-1]]
        # A lineage cached at the LRO that ends below it for good (its objects collected, an
        # abandoned tail) is shown as cached: the metastore is not read on every status.
        daemon.node.l1._valid_at_lro[actor.row.pid] = 3

        async def failing(*_args: object) -> None:
            raise StorageError("read the metastore")

        daemon.node.l1.read_lineage = failing  # type: ignore[method-assign]
        (p,) = (await client.status()).partitions
        assert p.l1_lineage is not None
        assert [(o.base_offset, o.last_offset) for o in p.l1_lineage] == [
            (r.base_offset, r.last_offset) for r in cached
        ]


class LosingGets:
    """An object store whose GETs find nothing once `lost` is set (a bucket emptied)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.lost = False

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        if self.lost:
            raise ObjectNotFound(f"object {key} not found")
        return await self.inner.get(key, offset, length)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


async def test_reads_of_a_lost_object_are_logged_once_an_interval_with_what_it_means(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Every read of the lost data failed alike, each an ERROR line of its own.
    stores: list[LosingGets] = []

    def wrap(store: ObjectStore) -> LosingGets:
        stores.append(LosingGets(store))
        return stores[-1]

    async with daemon_and_client(tmp_path, wrap_object_store=wrap, node__l0_cache_bytes_max=0) as (
        daemon,
        client,
    ):
        await client.create_topic("t", 1)
        await client.produce("t", 0, [b"lost"])
        stores[0].lost = True
        with caplog.at_level(logging.ERROR, logger="levelzero.api"):
            for _ in range(3):
                assert_error(await raw(client, "GET", RECORDS + "?offset=0"), 500, "object_not_found")
        assert "levelzero_reads_objects_missing_total 3.0" in await client.metrics()  # the alert's
    said = [r.getMessage() for r in caplog.records if r.name == "levelzero.api"]
    assert len(said) == 1, said
    assert "failed: object_not_found" in said[0] and "A partition that cannot be reconciled" in said[0]
