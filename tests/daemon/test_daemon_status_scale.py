"""`GET /v1/status` with many partitions: a bounded summary naming the outliers, and
`GET /v1/status/partitions` paging through every partition exactly once; the CLI's
`status --all` pages through too."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio

from daemon_support import assert_error, daemon_and_client, raw

from levelzero.http.app import STATUS_OUTLIERS_MAX, STATUS_PAGE_LIMIT_MAX, STATUS_PARTITIONS_SHOWN_MAX
from levelzero.cli.formats import format_status
from levelzero.cli.main import main

PARTITIONS = 2_000
LAGGING = STATUS_OUTLIERS_MAX + 10  # more outliers than the summary shows


async def test_status_summary_is_bounded_and_pagination_visits_every_partition(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, reconciler__enabled=False) as (daemon, client):
        await client.create_topic("a", PARTITIONS // 2)
        await client.create_topic("b", PARTITIONS // 2)
        # Lagging partitions (the reconciler is off): b/7 has the most records behind.
        for p in range(LAGGING):
            await client.produce("a", p, [b"x"])
        await client.produce("b", 7, [b"y"] * 5)
        daemon.node.reconciler.health.note_failure("b/9", "disk on fire", time.time(), permanent=True)

        response = await raw(client, "GET", "/v1/status")
        assert response.status_code == 200
        summary_bytes = len(response.content)
        status = await client.status()
        assert status.partitions_total == PARTITIONS
        assert len(status.partitions) == STATUS_PARTITIONS_SHOWN_MAX
        assert [(p.topic, p.partition) for p in status.partitions[:3]] == [("a", 0), ("a", 1), ("a", 2)]
        assert status.partitions_next_after == f"a/{STATUS_PARTITIONS_SHOWN_MAX - 1}"
        # Outliers: every lagging or failing partition counted, at most STATUS_OUTLIERS_MAX
        # named, the most pressing first: failing, then lagging by how far.
        assert status.outliers_count == LAGGING + 2
        assert len(status.outliers) == STATUS_OUTLIERS_MAX
        failing, most_lag = status.outliers[:2]
        assert (failing.partition, failing.reasons) == ("b/9", ["reconcile_failing"])
        assert (most_lag.partition, most_lag.reasons, most_lag.reconciler_lag) == (
            "b/7",
            ["reconciler_lag"],
            5,
        )
        lagging = [o for o in status.outliers if o.partition.startswith("a/")]
        assert all(o.reasons == ["reconciler_lag"] for o in lagging)
        assert len(lagging) == STATUS_OUTLIERS_MAX - 2
        # Bounded: the summary of 2,000 partitions is far smaller than the full list.
        everything = await client.all_partitions(page_limit=STATUS_PAGE_LIMIT_MAX)
        full_bytes = sum(len(p.topic) + 400 for p in everything)  # a floor on the full list's JSON
        assert summary_bytes < full_bytes / 10, (summary_bytes, full_bytes)

        # Pagination visits every partition exactly once, in order, across topics.
        seen = []
        after = None
        pages = 0
        while pages <= PARTITIONS:  # bounded loop
            page = await client.status_partitions(after, 333)
            pages += 1
            assert page.partitions_total == PARTITIONS and len(page.partitions) <= 333
            seen += [(p.topic, p.partition) for p in page.partitions]
            if page.next_after is None:
                break
            after = page.next_after
        expected = [("a", p) for p in range(PARTITIONS // 2)] + [("b", p) for p in range(PARTITIONS // 2)]
        assert seen == expected and pages == -(-PARTITIONS // 333)
        assert [(p.topic, p.partition) for p in everything] == expected
        b7 = everything[PARTITIONS // 2 + 7]
        assert (b7.topic, b7.partition, b7.high_watermark, b7.reconciler_lag) == ("b", 7, 5, 5)

        only_b = await client.status_partitions("b/997", topic="b")
        assert [p.partition for p in only_b.partitions] == [998, 999]
        assert only_b.partitions_total == PARTITIONS // 2 and only_b.next_after is None

        text = format_status(status)
        assert f"outliers: {LAGGING + 2} partitions ({STATUS_OUTLIERS_MAX} shown)" in text
        assert "b/9: reconcile_failing" in text
        assert f"{STATUS_PARTITIONS_SHOWN_MAX} of {PARTITIONS} partitions shown (--all" in text


async def test_m_holders_are_outliers_only_while_another_partition_is_above(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, reconciler__enabled=False) as (daemon, client):
        await client.create_topic("t", 3)
        board = daemon.node.board
        for name, mp in (("t/0", 5), ("t/1", 5), ("t/2", 5)):
            board.publish(name, mp)
        await client.advance_epoch()
        while (await client.status()).cluster_epoch <= 6:
            await client.advance_epoch()
        status = await client.status()
        assert status.m == 5 and sorted(status.m_holders) == ["t/0", "t/1", "t/2"]
        assert status.outliers_count == 0  # all equal: nobody holds M back
        board.publish("t/2", 6)
        status = await client.status()
        assert status.m == 5
        holders = sorted(o.partition for o in status.outliers if "m_holder" in o.reasons)
        assert holders == ["t/0", "t/1"] and status.outliers_count == 2


async def test_status_partitions_bad_params_are_400(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path) as (_, client):
        await client.create_topic("t", 2)
        path = "/v1/status/partitions"
        for query, fragment in (
            ("limit=0", "limit must be 1..1000"),
            (f"limit={STATUS_PAGE_LIMIT_MAX + 1}", "limit must be 1..1000"),
            ("limit=-1", "limit must be a non-negative integer"),
            ("limit=ten", "limit must be a non-negative integer"),
            ("after=t", "after must be TOPIC/PARTITION"),
            ("after=t/x", "after must be TOPIC/PARTITION"),
            ("after=/0", "after must be TOPIC/PARTITION"),
            ("after=t/0&after=t/1", "given more than once"),
            ("page=2", "unknown query parameter 'page'"),
        ):
            assert_error(await raw(client, "GET", f"{path}?{query}"), 400, "malformed_request", fragment)
        assert_error(await raw(client, "GET", f"{path}?topic=nope"), 404, "unknown_topic")
        page = await client.status_partitions("t/0", 1)
        assert [p.partition for p in page.partitions] == [1] and page.next_after is None
        page = await client.status_partitions(limit=1)
        assert [p.partition for p in page.partitions] == [0] and page.next_after == "t/0"


async def test_every_route_refuses_a_query_parameter_it_does_not_read(tmp_path: Path) -> None:
    """`/v1/status?topc=t` answered the whole node's status as if nothing was asked, where the
    records route refused such a parameter: every route now refuses one it does not read
    (a typo is not silently a different question)."""
    async with daemon_and_client(tmp_path) as (_, client):
        await client.create_topic("t", 1)
        for method, path in (
            ("GET", "/v1/status?topc=t"),
            ("GET", "/v1/topics?x=1"),
            ("GET", "/v1/cluster?x=1"),
            ("GET", "/metrics?x=1"),
            ("GET", "/healthz?x=1"),
            ("GET", "/v1/topics/t/configs?x=1"),
            ("GET", "/v1/topics/t/partitions/0/records?offset=0&x=1"),
            ("POST", "/v1/gc/run?x=1"),
        ):
            assert_error(
                await raw(client, method, path), 400, "malformed_request", "unknown query parameter '"
            )
        assert (await raw(client, "GET", "/v1/status?topic=t")).status_code == 200
        assert (
            await raw(client, "GET", "/v1/topics/t/partitions/0/records?offset=0&max_bytes=9")
        ).status_code == 200


async def test_abandoning_partition_minus_one_is_a_bad_request_as_in_a_path(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path) as (_, client):
        await client.create_topic("t", 1)
        body = {"topic": "t", "partition": -1, "operator": "me", "reason": "test", "confirm": True}
        response = await raw(client, "POST", "/v1/partitions/abandon-unreconciled", json=body)
        assert_error(response, 400, "malformed_request", "partition must be a non-negative integer, not '-1'")


async def test_cli_status_all_pages_through_every_partition(tmp_path: Path, capsys) -> None:
    partitions = STATUS_PARTITIONS_SHOWN_MAX + 150
    async with daemon_and_client(tmp_path, reconciler__enabled=False) as (daemon, client):
        await client.create_topic("t", partitions)
        await client.produce("t", partitions - 1, [b"z"] * 3)
        url = daemon.url
        assert url is not None

        assert await anyio.to_thread.run_sync(main, ["status", "--url", url]) == 0
        summary = capsys.readouterr().out
        assert f"{STATUS_PARTITIONS_SHOWN_MAX} of {partitions} partitions shown" in summary
        assert f"t/{partitions - 1}: reconciler_lag" in summary  # the outlier, though not on page 1
        rows = [line.split()[0] for line in summary.splitlines() if line.startswith("t/")]
        assert rows == [f"t/{p}" for p in range(STATUS_PARTITIONS_SHOWN_MAX)]

        assert await anyio.to_thread.run_sync(main, ["status", "--all", "--url", url]) == 0
        every = capsys.readouterr().out
        rows = [line.split()[0] for line in every.splitlines() if line.startswith("t/")]
        assert rows == [f"t/{p}" for p in range(partitions)]
        assert "partitions shown" not in every

        assert await anyio.to_thread.run_sync(main, ["status", "--all", "--json", "--url", url]) == 0
        body = json.loads(capsys.readouterr().out)
        assert [p["partition"] for p in body["partitions"]] == list(range(partitions))
        assert body["partitions_total"] == partitions and body["partitions_next_after"] is None
        assert body["partitions"][-1]["high_watermark"] == 3
        assert [o["partition"] for o in body["outliers"]] == [f"t/{partitions - 1}"]
