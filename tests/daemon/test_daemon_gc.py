"""The reconciler, housekeeper and GC through the daemon: the GC endpoints (run, dry run, pause,
resume, explain), the status sections (GC, reconciler, housekeeper, L1 lineage), metrics, bad
input answered with 400, the `levelzero gc` commands, and the hooks of the other tools.

The daemons here start their GC paused (`gc.enabled = false`) and, where the test drives it,
without the housekeeper's own loop, so every round the test sees is one it asked for."""

from __future__ import annotations

import importlib.util
import itertools
import logging
import sys
import time
import types
from pathlib import Path

import anyio
import httpx
import pytest
from daemon_support import TOKEN, DaemonProcess, daemon_and_client

from levelzero.core.keys import L0_ROOT
from levelzero.cli import main as cli
from levelzero.client import Client
from levelzero.cli.demo import count_l0_objects

WAIT_S = 15.0

# GC paused, no grace period, a quick reconciler, housekeeping only when asked.
QUIET = {
    "gc__enabled": False,
    "gc__grace_s": 0.0,
    "reconciler__interval_s": 0.05,
    "housekeeper__enabled": False,
}


JSON = {"content-type": "application/json"}


def assert_error(response: httpx.Response, status: int, code: str, fragment: str = "") -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == code, body
    assert fragment in body["message"], body


async def wait_reconciled(client: Client) -> None:
    with anyio.fail_after(WAIT_S):
        while (await client.status()).reconciler.lag_offsets:
            await anyio.sleep(0.02)


async def settle_epochs(client: Client, rounds: int = 2) -> None:
    """Advance the epoch and force the housekeeper, `rounds` times: every fully reconciled
    partition's M(p) passes the epochs written before."""
    for _ in range(rounds):
        await client.advance_epoch()
        await client.run_housekeeper(force=True)


async def read_all(client: Client, topic: str, partition: int) -> tuple[list[bytes], set[str]]:
    """Every value of a partition, and the tiers that served them."""
    values: list[bytes] = []
    tiers: set[str] = set()
    offset = 0
    while True:
        fetched = await client.fetch(topic, partition, offset)
        if not fetched.records:
            return values, tiers
        values += [r.value for r in fetched.records]
        tiers.add(fetched.tier)
        offset = fetched.next_offset


async def l0_keys(store) -> list[str]:
    page = await store.list_page(L0_ROOT)
    assert page.next_start_after is None
    return [o.key for o in page.objects]


# ------------------------------------------------------------------------------ API


async def test_dry_run_lists_then_run_deletes_and_data_is_read_from_l1(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, **QUIET) as (daemon, client):
        store = daemon.node.object_store
        await client.create_topic("t", 2)
        for i in range(3):
            await client.produce("t", 0, [f"a{i}".encode()])
            await client.produce("t", 1, [f"b{i}".encode(), f"c{i}".encode()])
        written = sorted(await l0_keys(store))
        assert len(written) >= 3

        await wait_reconciled(client)
        # Reconciled, but the partitions' windows still hold the epoch the data was written in.
        report = await client.gc_run(dry_run=True)
        assert (report.m, report.eligible, report.would_delete) == (0, 0, [])

        await settle_epochs(client)
        dry = await client.gc_run(dry_run=True)
        assert dry.dry_run and dry.m is not None and dry.m >= 1
        assert sorted(dry.would_delete) == written and dry.eligible == len(written)
        assert dry.deleted == 0 and sorted(await l0_keys(store)) == written

        report = await client.gc_run()
        assert not report.dry_run and report.m == dry.m
        assert report.deleted == len(written) and report.backlog == 0 and report.errors == 0
        assert report.max_deleted_epoch == 1
        assert await l0_keys(store) == [] and await count_l0_objects(store) == 0

        assert await read_all(client, "t", 0) == ([b"a0", b"a1", b"a2"], {"l1"})
        assert await read_all(client, "t", 1) == ([b"b0", b"c0", b"b1", b"c1", b"b2", b"c2"], {"l1"})

        status = await client.status()
        gc = status.gc
        assert gc.paused and gc.m == report.m and gc.epoch_lag == status.cluster_epoch - report.m
        assert (gc.rounds, gc.dry_runs, gc.objects_deleted) == (3, 2, len(written))
        assert gc.bytes_deleted == report.deleted_bytes > 0 and gc.max_deleted_epoch == 1
        assert gc.safety_blocked_rounds == 0 and gc.backlog == 0
        last = gc.last_round
        assert (last.round_id, last.dry_run, last.deleted, last.m) == (
            report.round_id,
            False,
            len(written),
            report.m,
        )
        assert status.housekeeper.epochs_advanced >= 4 and status.housekeeper.catch_ups >= 4
        assert status.reconciler.records_reconciled == 9 and status.reconciler.lag_offsets == 0


async def test_status_shows_l1_lineage_and_reconciler_lag(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, **QUIET) as (_, client):
        await client.create_topic("t", 1)
        await client.create_topic("u", 1)
        for i in range(4):
            await client.produce("t", 0, [f"r{i}".encode(), b"x"])
        await wait_reconciled(client)
        # The lineage is the node's catalog as it last read it: the reconciler reads it again
        # right after its catch-up, which the LRO shows first (the partition actor applies it).
        with anyio.fail_after(WAIT_S):
            while True:
                status = await client.status()
                t0 = next(p for p in status.partitions if p.topic == "t")
                if t0.l1_lineage and t0.l1_lineage[-1].last_offset == t0.lro:
                    break
                await anyio.sleep(0.02)
        assert (t0.high_watermark, t0.lro, t0.reconciler_lag) == (8, 7, 0)
        lineage = t0.l1_lineage
        assert t0.l1_objects == len(lineage) >= 1
        assert lineage[0].base_offset == 0 and lineage[-1].last_offset == 7
        for before, after in itertools.pairwise(lineage):
            assert after.base_offset == before.last_offset + 1  # contiguous, in offset order
        assert all(o.term == t0.term and o.key.startswith("level_one/t/0/") for o in lineage)
        u0 = next(p for p in status.partitions if p.topic == "u")
        assert (u0.l1_objects, u0.l1_lineage, u0.reconciler_lag) == (0, [], 0)


async def test_reconciler_lag_counts_unreconciled_offsets(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, reconciler__enabled=False, gc__enabled=False) as (_, client):
        await client.create_topic("t", 1)
        await client.produce("t", 0, [b"a", b"b", b"c"])
        status = await client.status()
        assert status.partitions[0].reconciler_lag == 3 and status.reconciler.lag_offsets == 3
        assert status.partitions[0].l1_objects == 0
        text = await client.metrics()
        assert 'levelzero_partition_reconciler_lag_offsets{partition="0",topic="t"} 3.0' in text
        assert "levelzero_reconciler_lag_offsets 3.0" in text


async def test_pause_and_resume_report_the_gc_state_and_run_works_while_paused(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, gc__interval_s=60.0) as (daemon, client):
        assert not (await client.status()).gc.paused
        paused = await client.gc_pause()
        assert paused.paused and daemon.node.gc.paused
        assert "levelzero_gc_paused 1.0" in await client.metrics()
        report = await client.gc_run()  # an explicit round runs while paused
        assert report.m == (await client.status()).cluster_epoch - 1  # no partitions: the cap
        assert (await client.status()).gc.rounds >= 1
        resumed = await client.gc_resume()
        assert not resumed.paused and not daemon.node.gc.paused
        assert "levelzero_gc_paused 0.0" in await client.metrics()


async def test_explain_names_the_partition_that_holds_m_back(tmp_path: Path) -> None:
    async with daemon_and_client(
        tmp_path, reconciler__enabled=False, gc__enabled=False, housekeeper__enabled=False
    ) as (daemon, client):
        await client.create_topic("t", 2)
        await client.produce("t", 0, [b"unreconciled"])  # epoch 1; t/1 stays empty
        (key,) = await l0_keys(daemon.node.object_store)
        await settle_epochs(client)  # t/1 moves on; t/0 cannot: its data is not reconciled

        explained = await client.gc_explain(epoch=1)
        assert (explained.m, explained.verdict, explained.epoch) == (0, "above M", 1)
        assert [h.partition for h in explained.holders] == ["t/0"] and explained.holders_total == 1
        (holder,) = explained.holders
        assert (holder.mp, holder.behind, holder.mp_minus_m) == (0, 1, 0)
        assert holder.reason == "unreconciled data (LRO -1, high watermark 1)"

        by_key = await client.gc_explain(key=key)
        assert (by_key.key, by_key.epoch, by_key.verdict, by_key.owned) == (key, 1, "above M", True)
        assert [h.partition for h in by_key.holders] == ["t/0"]
        assert by_key.age_s is not None and by_key.age_s >= 0

        gone = key.rsplit("/", 1)[0] + "/" + "0" * 32  # well formed, not in the store
        assert (await client.gc_explain(key=gone)).verdict == "not found"


async def test_explain_rejects_bad_input_with_400(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, gc__enabled=False) as (_, client):
        http = client._http
        cases = [
            (
                {"key": L0_ROOT + "001/000000000000000001/" + "a" * 32, "epoch": "1"},
                "malformed_request",
                "exactly one",
            ),
            ({}, "malformed_request", "exactly one"),
            ({"key": "not/a/key"}, "malformed_key", "'not/a/key'"),
            ({"key": L0_ROOT + "001/000000000000000000/" + "a" * 32}, "malformed_key", "epoch 0"),
            ({"epoch": "abc"}, "malformed_request", "epoch must be a non-negative integer, not 'abc'"),
            ({"epoch": "-3"}, "malformed_request", "epoch"),
            ({"epoch": "1.5"}, "malformed_request", "epoch"),
            ({"epoch": "0"}, "malformed_request", "epoch must be >= 1"),
            ({"epoch": "1", "keys": "x"}, "malformed_request", "unknown query parameter 'keys'"),
            ([("epoch", "1"), ("epoch", "2")], "malformed_request", "more than once"),
        ]
        for params, code, fragment in cases:
            assert_error(await http.get("/v1/gc/explain", params=params), 400, code, fragment)
        assert_error(await http.post("/v1/gc/explain"), 405, "method_not_allowed")
        assert (await client.gc_explain(epoch=1)).verdict is not None  # still serving


async def test_gc_and_housekeeper_run_bodies_are_validated(tmp_path: Path) -> None:
    # The housekeeper's own loop is off: the one round counted is the one asked for (with the
    # loop on, a busy machine let its first round run before the request: rounds 2).
    async with daemon_and_client(tmp_path, gc__enabled=False, housekeeper__enabled=False) as (_, client):
        http = client._http
        for path, body, fragment in [
            ("/v1/gc/run", b'{"dry_run": "yes"}', "$.dry_run"),
            ("/v1/gc/run", b'{"dryrun": true}', "unknown field `dryrun`"),
            ("/v1/gc/run", b"{", "not valid JSON"),
            ("/v1/housekeeper/run", b'{"force": 1}', "$.force"),
        ]:
            assert_error(
                await http.post(path, content=body, headers=JSON), 400, "malformed_request", fragment
            )
        no_body = await http.post("/v1/gc/run", headers=JSON)
        assert no_body.json()["dry_run"] is False  # no body: defaults
        assert (await http.post("/v1/gc/run", json={"dry_run": True})).json()["dry_run"] is True
        assert (await http.post("/v1/housekeeper/run", headers=JSON)).json()["rounds"] == 1
        assert_error(await http.get("/v1/gc/run"), 405, "method_not_allowed")


async def test_gc_and_housekeeper_endpoints_need_the_token(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, token=TOKEN, server__token=TOKEN, gc__enabled=False) as (
        daemon,
        client,
    ):
        async with httpx.AsyncClient(base_url=daemon.url, trust_env=False) as anonymous:
            for method, path in [
                ("POST", "/v1/gc/run"),
                ("POST", "/v1/gc/pause"),
                ("POST", "/v1/gc/resume"),
                ("GET", "/v1/gc/explain?epoch=1"),
                ("POST", "/v1/housekeeper/run"),
            ]:
                assert_error(await anonymous.request(method, path), 401, "unauthorized")
        assert daemon.node.gc.paused and daemon.node.gc.rounds_finished == 0  # nothing happened
        assert (await client.gc_resume()).paused is False


async def test_metrics_cover_reconciler_housekeeper_and_gc(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, **QUIET) as (daemon, client):
        await client.create_topic("t", 1)
        await client.produce("t", 0, [b"one", b"two"])
        await wait_reconciled(client)
        await settle_epochs(client)
        report = await client.gc_run()
        assert report.deleted == 1
        lines = {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in (await client.metrics()).splitlines()
            if line and not line.startswith("#")
        }
        epoch = (await client.status()).cluster_epoch
        assert lines["levelzero_reconciler_records_reconciled_total"] == 2
        assert lines["levelzero_reconciler_objects_written_total"] >= 1
        assert lines["levelzero_reconciler_lag_offsets"] == 0
        assert lines["levelzero_housekeeper_epochs_advanced_total"] == 2
        assert lines["levelzero_housekeeper_rounds_total"] == 2
        assert lines["levelzero_gc_objects_deleted_total"] == 1
        assert lines["levelzero_gc_bytes_deleted_total"] == report.deleted_bytes
        assert lines["levelzero_gc_rounds_total"] == 1
        assert lines["levelzero_gc_delete_requests_total"] == 1
        assert lines["levelzero_gc_list_requests_total"] >= 1
        assert lines['levelzero_gc_objects_skipped_total{reason="too_young"}'] == 0
        assert lines["levelzero_gc_round_watermark"] == report.m
        assert lines["levelzero_gc_epoch_lag"] == epoch - report.m
        assert lines["levelzero_gc_max_deleted_epoch"] == 1
        assert lines["levelzero_gc_safety_blocked_rounds_total"] == 0
        assert lines["levelzero_gc_backlog_objects"] == 0


# ------------------------------------------------------------------------------ CLI


@pytest.fixture
def gc_daemon(make_daemon_process) -> DaemonProcess:
    daemon = make_daemon_process(
        {
            "LEVELZERO_GC_ENABLED": "false",
            "LEVELZERO_GC_GRACE_S": "0",
            "LEVELZERO_RECONCILER_INTERVAL_S": "0.05",
            "LEVELZERO_RECONCILER_OBJECT_AGE_MAX_S": "0",  # reconciled on the next pass
            "LEVELZERO_HOUSEKEEPER_ENABLED": "false",
            "LEVELZERO_NODE_EPOCH_BUMP_INTERVAL_S": "0",
        }
    )
    return daemon.start()


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_gc_commands(gc_daemon: DaemonProcess, capsys) -> None:
    url = ("--url", gc_daemon.url)
    assert run_cli(capsys, "topics", "create", "t", "--partitions", "2", *url)[0] == 0
    assert run_cli(capsys, "produce", "t", "-p", "0", "a", "b", *url)[0] == 0
    assert run_cli(capsys, "produce", "t", "-p", "1", "c", *url)[0] == 0
    with gc_daemon.http() as http:
        deadline = time.monotonic() + WAIT_S
        while http.get("/v1/status").json()["reconciler"]["lag_offsets"]:
            assert time.monotonic() < deadline, "the reconciler did not catch up"
            time.sleep(0.02)

        code, out, _ = run_cli(capsys, "gc", "explain", "--epoch", "1", *url)
        assert code == 0
        assert "verdict: above M: epoch 1 is above M = 0" in out
        assert "held back by 3" in out
        table = out[out.index("PARTITION") :].splitlines()
        assert table[0].split() == ["PARTITION", "M(p)", "M(p)-M", "BEHIND", "WHY"]
        rows = {line.split()[0]: line for line in table[1:]}
        assert set(rows) == {"t/0", "t/1", "cap"}
        assert rows["t/0"].split()[1:4] == ["0", "0", "1"]
        assert "idle: waiting for the housekeeper" in rows["t/0"]
        assert "capped at cluster epoch - 1" in rows["cap"]

        for _ in range(2):
            assert run_cli(capsys, "epoch", "advance", *url)[0] == 0
            assert http.post("/v1/housekeeper/run", json={"force": True}).status_code == 200

    code, out, _ = run_cli(capsys, "gc", "dry-run", *url)
    assert code == 0
    assert out.startswith("gc dry run #")
    assert "would delete 2 objects" in out
    assert sum(1 for line in out.splitlines() if line.strip().startswith(L0_ROOT)) == 2

    code, out, _ = run_cli(capsys, "gc", "run", *url)
    assert code == 0 and "deleted 2 objects" in out and "backlog 0" in out

    code, out, _ = run_cli(capsys, "gc", "pause", *url)
    assert code == 0 and out.startswith("gc paused")
    code, out, _ = run_cli(capsys, "status", *url)
    assert code == 0 and "GC: PAUSED, M " in out and "deleted 2 objects" in out
    assert "reconciler: " in out and "housekeeper: epochs advanced 4" in out
    code, out, _ = run_cli(capsys, "gc", "resume", *url)
    assert code == 0 and out.startswith("gc resumed")
    assert "GC: running" in run_cli(capsys, "status", *url)[1]

    code, out, err = run_cli(capsys, "gc", "explain", "--key", "nope", *url)
    assert code == 1 and out == ""
    assert "not an L0 key: 'nope'" in err and "malformed_key, HTTP 400" in err
    code, out, _ = run_cli(capsys, "gc", "explain", "--epoch", "1", "--json", *url)
    assert code == 0 and '"verdict": "deletable"' in out


def test_cli_refuses_a_topic_name_no_store_can_hold_before_any_request(capsys) -> None:
    for name in (".", "..", ".lz-tmp-x", "a/b"):
        with pytest.raises(SystemExit) as caught:  # no --url: nothing is asked of a server
            cli.main(["topics", "create", name])
        assert caught.value.code == 2, name
        assert f"topic name {name!r}" in capsys.readouterr().err


def test_cli_gc_usage_errors_exit_2(capsys) -> None:
    for args in (
        ["gc", "explain"],
        ["gc", "explain", "--key", "k", "--epoch", "1"],
        ["gc", "explain", "--epoch", "x"],
        ["gc", "explain", "--epoch", "0"],
        ["gc"],
    ):
        with pytest.raises(SystemExit) as caught:
            cli.main(args)
        assert caught.value.code == 2, args
    assert "--epoch" in capsys.readouterr().err


# ------------------------------------------------------------------------------ tool hooks


@pytest.mark.parametrize(
    ("command", "module", "function"),
    [
        ("sim", "levelzero.sim.cli", "main"),
        ("export", "levelzero.export.cli", "export_main"),
        ("analyze", "levelzero.export.cli", "analyze_main"),
    ],
)
def test_tools_get_their_arguments_untouched(monkeypatch, command: str, module: str, function: str) -> None:
    seen: list[list[str]] = []
    fake = types.ModuleType(module)
    setattr(fake, function, lambda argv: seen.append(argv) or 7)
    monkeypatch.setitem(sys.modules, module, fake)
    argv = ["--seeds", "3", "positional", "-h", "--mode=strict"]
    assert cli.main([command, *argv]) == 7
    assert seen == [argv]


def test_a_missing_tool_is_a_one_line_error(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "levelzero.sim.cli", None)  # import raises ImportError
    assert cli.main(["sim", "--seeds", "1"]) == 1
    assert "levelzero: sim: not available in this installation" in capsys.readouterr().err
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert cli.main(["bench"]) == 1
    assert "levelzero: bench: the benchmark suite" in capsys.readouterr().err


def test_help_lists_every_command(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for command in ("gc", "sim", "export", "analyze", "bench", "status", "demo"):
        assert f"    {command} " in out


@pytest.mark.parametrize("component", ["reconciler", "housekeeper"])
async def test_a_daemon_started_without_the_reconciler_or_housekeeper_warns_that_l0_accumulates(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, component: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="levelzero.daemon"):
        async with daemon_and_client(tmp_path, **{f"{component}__enabled": False}):
            pass
    [warning] = [r.getMessage() for r in caplog.records if "disabled by configuration" in r.getMessage()]
    assert warning.startswith(f"the {component} is disabled by configuration ({component}.enabled = false)")
    assert warning.endswith("so the GC's M stays held and L0 objects accumulate in the object store")


async def test_a_daemon_with_every_component_enabled_does_not_warn_about_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="levelzero.daemon"):
        async with daemon_and_client(tmp_path):
            pass
    assert not [r for r in caplog.records if "disabled by configuration" in r.getMessage()]
