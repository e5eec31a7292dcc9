"""`levelzero produce` through a daemon that dies or restarts mid-run: each request carries an
idempotency key of its own (the run's random id and the request's number), and the client sends
a request the daemon dropped, refused or answered 503 again with the same key until its timeout,
so the run completes with every record stored once. Without keys it used to stop at the first
request in the dead daemon's hands, naming it.

The first tests script the daemon in process (a transport that answers, drops or refuses each
request in turn); the last kills a real daemon subprocess (SIGKILL) under a run and starts it
again on the same data directory and port."""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import msgspec
import pytest

from daemon_support import DaemonProcess, clean_environ
from levelzero.cli.commands import CommandFailed, _produce
from levelzero.cli.parser import build_parser, settle_client_options
from levelzero.client import ApiError, Client
from levelzero.http.schema import ProduceRequest

URL = "http://daemon.test:8420"
KEY = re.compile(r"levelzero-produce/[0-9a-f]{16}/(\d+)")

Answer = Callable[[httpx.Request], httpx.Response]


def ok(request: httpx.Request) -> httpx.Response:
    count = len(msgspec.json.decode(request.content, type=ProduceRequest).records)
    return httpx.Response(200, json={"base_offset": 0, "last_offset": count - 1, "attempts": 1})


def dropped(request: httpx.Request) -> httpx.Response:
    raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)


def refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("[Errno 111] Connection refused", request=request)


def too_late(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout("timed out", request=request)  # sent; the answer did not come in time


def not_taken(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectTimeout("timed out", request=request)  # nothing sent


def starting(request: httpx.Request) -> httpx.Response:
    body = {"error": "shutting_down", "message": "the daemon is shutting down or not ready"}
    return httpx.Response(503, json=body, headers={"Retry-After": "1"})


class Scripted(httpx.AsyncBaseTransport):
    """A daemon whose answers are scripted in turn (the last one repeated); what it was sent."""

    def __init__(self, answers: list[Answer]) -> None:
        self.answers = answers
        self.sent: list[ProduceRequest] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(msgspec.json.decode(await request.aread(), type=ProduceRequest))
        return self.answers[min(len(self.sent), len(self.answers)) - 1](request)


def produce_args(*argv: str) -> argparse.Namespace:
    args = build_parser().parse_args(["produce", "t", *argv])
    settle_client_options(args)
    return args


async def test_a_resent_request_carries_its_key_and_each_request_its_own() -> None:
    # Request 0 goes through; request 1 is dropped in the daemon's hands, refused while it is
    # down, answered 503 while it starts, then stored; request 2 goes through.
    daemon = Scripted([ok, dropped, refused, starting, ok, ok])
    async with Client(URL, timeout_s=10.0, transport=daemon, wait_for_restart=True) as client:
        await _produce(produce_args("a", "b", "c", "--batch-records", "1", "--json"), client)
    assert [[r.value for r in s.records] for s in daemon.sent] == [
        [b"a"],
        [b"b"],
        [b"b"],
        [b"b"],
        [b"b"],
        [b"c"],
    ]
    keys = [s.idempotency_key for s in daemon.sent]
    matches = [KEY.fullmatch(k or "") for k in keys]
    assert all(matches), keys
    assert [int(m.group(1)) for m in matches if m] == [0, 1, 1, 1, 1, 2]
    assert len(set(keys)) == 3  # one run id: the same key for a resend, another for each request
    other = Scripted([ok])  # a second run: another run id
    async with Client(URL, timeout_s=10.0, transport=other, wait_for_restart=True) as client:
        await _produce(produce_args("a", "--json"), client)
    assert other.sent[0].idempotency_key not in keys


async def test_without_keys_a_dropped_request_stops_the_run_and_is_not_sent_again() -> None:
    daemon = Scripted([ok, dropped, ok])
    async with Client(URL, timeout_s=10.0, transport=daemon, wait_for_restart=True) as client:
        with pytest.raises(CommandFailed) as failed:
            await _produce(produce_args("a", "b", "--batch-records", "1", "--no-idempotency-key"), client)
    assert [s.idempotency_key for s in daemon.sent] == [None, None]
    assert "it may have been carried out, so it was not sent again" in str(failed.value)
    assert "1 record acknowledged before it" in str(failed.value)


async def test_a_request_answered_too_late_says_its_records_may_be_stored_and_what_to_do() -> None:
    # The daemon stored the records but answered after --timeout: the run used to say only
    # "did not answer in time", as if nothing had been stored.
    daemon = Scripted([ok, too_late])
    async with Client(URL, timeout_s=10.0, transport=daemon, wait_for_restart=True) as client:
        with pytest.raises(CommandFailed) as failed:
            await _produce(produce_args("a", "b", "c", "--batch-records", "2", "-p", "3"), client)
    key = daemon.sent[1].idempotency_key
    assert KEY.fullmatch(key or "") and len(daemon.sent) == 2
    assert str(failed.value) == (
        f"levelzero at {URL} did not answer in time; it may have been carried out (timeout); "
        "the outcome is unknown: its 1 record may have been stored; check t/3's high watermark "
        "(levelzero status) or consume it before sending them again: a new levelzero produce "
        "run sends them with new idempotency keys, so they would be stored twice (a client "
        f"sending them again with this request's key, {key}, has them stored once); "
        "2 records acknowledged before it"
    )
    daemon = Scripted([too_late])
    async with Client(URL, timeout_s=10.0, transport=daemon, wait_for_restart=True) as client:
        with pytest.raises(CommandFailed) as failed:
            await _produce(produce_args("a", "b", "--no-idempotency-key"), client)
    assert str(failed.value) == (
        f"levelzero at {URL} did not answer in time; it may have been carried out (timeout); "
        "the outcome is unknown: its 2 records may have been stored, and the request carried no "
        "idempotency key (--no-idempotency-key); check t/0's high watermark (levelzero status) "
        "or consume it before sending them again"
    )


async def test_a_keyed_request_dropped_then_refused_until_the_timeout_may_be_stored() -> None:
    # The first try reached the daemon (dropped: maybe stored); the tries after it were refused.
    daemon = Scripted([ok, dropped, refused])
    async with Client(URL, timeout_s=0.3, transport=daemon, wait_for_restart=True) as client:
        with pytest.raises(CommandFailed) as failed:
            await _produce(produce_args("a", "b", "--batch-records", "1"), client)
    assert len(daemon.sent) > 3
    assert "the outcome is unknown: its 1 record may have been stored" in str(failed.value)


async def test_a_connection_not_taken_in_time_stored_nothing_and_says_no_more() -> None:
    daemon = Scripted([not_taken])
    async with Client(URL, timeout_s=10.0, transport=daemon) as client:
        with pytest.raises(CommandFailed) as failed:
            await _produce(produce_args("a"), client)
        assert str(failed.value) == f"levelzero at {URL} did not answer in time (timeout)"
        with pytest.raises(ApiError) as unknown:
            await client.produce("t", 0, [b"a"])
        assert not unknown.value.outcome_unknown
    async with Client(URL, timeout_s=10.0, transport=httpx.MockTransport(too_late)) as client:
        with pytest.raises(ApiError) as unknown:  # a read changes nothing: no outcome to doubt
            await client.fetch("t", 0)
    assert str(unknown.value) == f"levelzero at {URL} did not answer in time (timeout)"
    assert not unknown.value.outcome_unknown


async def test_a_url_given_that_never_answered_is_not_waited_for() -> None:
    daemon = Scripted([refused])
    async with Client(URL, timeout_s=10.0, transport=daemon, wait_for_restart=True) as client:
        with pytest.raises(ApiError) as failed:
            await client.produce("t", 0, [b"a"], idempotency_key="k")
    assert failed.value.code == "unreachable" and len(daemon.sent) == 1  # likely mistyped: said at once


async def test_a_first_request_dropped_is_sent_again_the_url_took_its_connection() -> None:
    # A drop, unlike a refusal, shows a server at the URL: the run's first request, keyed, is
    # sent again; without a key it is not, and the message says it may have been stored.
    daemon = Scripted([dropped, ok])
    async with Client(URL, timeout_s=10.0, transport=daemon, wait_for_restart=True) as client:
        await _produce(produce_args("a", "--json"), client)
    assert [s.idempotency_key for s in daemon.sent] == [daemon.sent[0].idempotency_key] * 2
    assert daemon.sent[0].idempotency_key is not None
    daemon = Scripted([dropped, ok])
    async with Client(URL, timeout_s=10.0, transport=daemon, wait_for_restart=True) as client:
        with pytest.raises(CommandFailed) as failed:
            await _produce(produce_args("a", "--no-idempotency-key"), client)
    assert len(daemon.sent) == 1
    assert "it may have been carried out, so it was not sent again" in str(failed.value)


async def test_a_restart_is_waited_for_only_until_the_timeout() -> None:
    daemon = Scripted([ok, refused])
    started = time.monotonic()
    async with Client(URL, timeout_s=1.0, transport=daemon, wait_for_restart=True) as client:
        await client.produce("t", 0, [b"a"], idempotency_key="k0")
        with pytest.raises(ApiError) as failed:
            await client.produce("t", 0, [b"b"], idempotency_key="k1")
    assert failed.value.message.startswith(f"cannot reach levelzero at {URL}: ")
    assert failed.value.message.endswith(f"; still so after {len(daemon.sent) - 1} tries in 1 s")
    assert time.monotonic() - started >= 1.0


RECORDS = 30_000
BATCH_RECORDS = 100  # many requests: one is in the daemon's hands when it is killed
KILL_AT_RECORDS = 5_000
DOWN_S = 1.0  # the daemon stays down this long: the run's requests are refused meanwhile
RUN_TIMEOUT_S = 120.0
POLL_S = 0.02


def high_watermark(daemon: DaemonProcess, topic: str, partition: int) -> int:
    with daemon.http() as http:
        answer = http.get(f"/v1/topics/{topic}/partitions/{partition}/records", params={"max_bytes": 1})
    answer.raise_for_status()
    return int(answer.json()["high_watermark"])


def test_produce_survives_a_daemon_killed_and_restarted_mid_run(
    daemon_process: DaemonProcess, tmp_path: Path
) -> None:
    assert daemon_process.cli("topics", "create", "r", "--partitions", "2").returncode == 0
    values = [f"v{i:06d}" for i in range(RECORDS)]
    lines = tmp_path / "lines.txt"
    lines.write_text("".join(f"{v}\n" for v in values))
    with lines.open("rb") as stdin:  # read a batch at a time: the run goes at its requests' pace
        run = subprocess.Popen(
            [sys.executable, "-m", "levelzero.cli", "produce", "r", "-p", "1"]
            + ["--batch-records", str(BATCH_RECORDS), "--json"],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=clean_environ(LEVELZERO_URL=daemon_process.url),
        )
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while high_watermark(daemon_process, "r", 1) < KILL_AT_RECORDS:
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "the run did not reach the kill point"
            time.sleep(POLL_S)
        daemon_process.signal(signal.SIGKILL)
        daemon_process.wait_exit()
        assert run.poll() is None  # mid-run
        time.sleep(DOWN_S)
        daemon_process.start()
        out, err = run.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 0, err.decode()
    summary = json.loads(out.decode().splitlines()[-1])
    assert (summary["records"], summary["first_offset"], summary["last_offset"]) == (RECORDS, 0, RECORDS - 1)
    consumed = daemon_process.cli("consume", "r", "-p", "1", "--json")
    assert consumed.returncode == 0, consumed.stderr
    stored = [json.loads(line)["value"] for line in consumed.stdout.splitlines()]
    assert stored == values  # every record once, in the input's order


async def test_a_request_interrupted_by_a_forced_stop_is_an_outcome_unknown() -> None:
    # A daemon whose stop ran past its time answers the requests it was carrying out 503
    # `interrupted`: a produce may have been stored (a read changes nothing).
    def interrupted(request: httpx.Request) -> httpx.Response:
        body = {"error": "interrupted", "message": "the daemon stopped while this request was in progress"}
        return httpx.Response(503, json=body, headers={"Retry-After": "1"})

    async with Client(URL, timeout_s=10.0, transport=httpx.MockTransport(interrupted)) as client:
        with pytest.raises(ApiError) as produced:
            await client.produce("t", 0, [b"a"])
        with pytest.raises(ApiError) as fetched:
            await client.fetch("t", 0)
    assert (produced.value.status, produced.value.code, produced.value.outcome_unknown) == (
        503,
        "interrupted",
        True,
    )
    assert (fetched.value.code, fetched.value.outcome_unknown) == ("interrupted", False)
