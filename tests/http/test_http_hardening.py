"""The HTTP server against clients that misbehave: ones that go away mid-body, that lean on
redirects or on a web page's form posts, that hold every connection (a bounded slowloris), that
send what is not HTTP; and every error answer is the documented JSON. Real uvicorn on a free
loopback port, raw sockets where a well-behaved client library would not misbehave."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from starlette.routing import Route

from levelzero.cli.demo import UploadGate
from levelzero.daemon.logs import configure_logging
from levelzero.daemon.service import Daemon
from levelzero.http.app import build_app
from levelzero.http.guard import REQUEST_HEAD_BYTES_MAX, CloseReason, GuardedH11Protocol

from daemon_support import TOKEN, daemon_and_client

RECORDS = "/v1/topics/t/partitions/0/records"
WAIT_S = 10.0
AUTH = f"Authorization: Bearer {TOKEN}\r\n"
CHUNKS_MAX = 500  # the endless body's writer stops after this many chunks, closed or not


def assert_error(response, status: int, code: str, fragment: str = "") -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error", "message"}
    assert body["error"] == code, body
    assert fragment in body["message"], body


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def test_a_client_gone_mid_body_is_499_not_a_logged_500(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "levelzero.api")
    async with daemon_and_client(tmp_path) as (daemon, client):
        await client.create_topic("t", 1)
        assert daemon.url is not None
        stream = await anyio.connect_tcp("127.0.0.1", port_of(daemon.url))
        await stream.send(
            f"POST {RECORDS} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            'Content-Length: 1000\r\n\r\n{"records": ['.encode()
        )
        await stream.aclose()
        route = '{code="499",route="/v1/topics/{topic}/partitions/{partition}/records"} 1.0'
        with anyio.fail_after(WAIT_S):
            while route not in (text := await client.metrics()):
                await anyio.sleep(0.01)
        assert 'code="500"' not in text
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors == [], [r.getMessage() for r in errors]
        assert any("closed the connection" in r.getMessage() for r in caplog.records)
        assert (await client.produce("t", 0, [b"still serving"])).base_offset == 0


async def test_a_trailing_slash_is_a_404_without_a_location(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path) as (_, client):
        http = client._http
        for path in ("/v1/topics/", "/v1/status/", "/healthz/"):
            response = await http.get(path, headers={"Host": "evil.example"})
            assert_error(response, 404, "not_found", f"no trailing slash: {path.rstrip('/')}")
            assert "location" not in response.headers


async def test_posts_must_say_they_are_json(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path) as (_, client):
        http = client._http
        body = b'{"name": "t", "partitions": 1}'
        for content_type in (
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
        ):
            response = await http.post("/v1/topics", content=body, headers={"Content-Type": content_type})
            assert_error(response, 415, "unsupported_media_type", "POST needs Content-Type: application/json")
        assert_error(await http.post("/v1/topics", content=body), 415, "unsupported_media_type", "got none")
        for path in ("/v1/epoch/advance", "/v1/gc/pause", "/v1/gc/run", "/v1/housekeeper/run"):
            assert_error(await http.post(path), 415, "unsupported_media_type")
        assert await client.list_topics() == []  # nothing was created
        assert (await client.status()).gc.paused is False
        created = await http.post(
            "/v1/topics", content=body, headers={"Content-Type": "Application/JSON; charset=utf-8"}
        )
        assert created.status_code == 201, created.text
        epoch = (await client.status()).cluster_epoch
        assert await client.advance_epoch() == epoch + 1  # the bundled client says it is JSON


async def connect(port: int, first: bytes = b"") -> anyio.abc.SocketStream:
    stream = await anyio.connect_tcp("127.0.0.1", port)
    if first:
        await stream.send(first)
    return stream


async def read_until_closed(stream: anyio.abc.SocketStream) -> bytes:
    """What the server sends before it closes the connection (bounded by the caller)."""
    received = b""
    while True:
        try:
            received += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
            return received


def metric(text: str, name: str) -> float:
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " ")]
    assert len(values) == 1, (name, values)
    return values[0]


async def test_one_client_cannot_lock_the_server(tmp_path: Path) -> None:
    """A bounded slowloris: every one of `connections_max` connections held idle, trickling a
    head, stalling a declared body or sending an endless chunked body. Health checks and an
    authenticated client are still served, and every one of those connections is closed."""
    async with daemon_and_client(
        tmp_path,
        token=TOKEN,
        server__token=TOKEN,
        server__connections_max=8,
        server__connections_per_peer_max=8,
        server__header_timeout_s=0.5,
        server__body_timeout_s=0.5,
    ) as (daemon, client):
        assert daemon.url is not None and daemon.connection_guard is not None
        port = port_of(daemon.url)
        post = f"POST /v1/topics HTTP/1.1\r\nHost: x\r\n{AUTH}Content-Type: application/json\r\n"
        attackers = [await connect(port) for _ in range(3)]  # idle: not a byte
        attackers += [
            await connect(port, b"GET /v1/topics HTTP/1.1\r\nHost: x\r\nX-Slow: a") for _ in range(2)
        ]
        attackers += [await connect(port, f"{post}Content-Length: 100\r\n\r\n{{".encode()) for _ in range(2)]
        endless = await connect(port, f"{post}Transfer-Encoding: chunked\r\n\r\n".encode())
        attackers.append(endless)
        # The server accepts in order: every slot is taken before the next connection is seen.

        async def send_forever() -> None:
            for _ in range(CHUNKS_MAX):
                try:
                    await endless.send(b"1\r\n \r\n")
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionResetError):
                    return
                await anyio.sleep(0.02)

        async with anyio.create_task_group() as tg:
            tg.start_soon(send_forever)
            async with httpx.AsyncClient(base_url=daemon.url, trust_env=False) as anonymous:
                assert (await anonymous.get("/healthz")).json() == {"status": "ok"}
            await client.create_topic("t", 1)
            assert (await client.produce("t", 0, [b"served"])).base_offset == 0
            assert [r.value for r in (await client.fetch("t", 0, 0)).records] == [b"served"]
            for stream in attackers:  # each one is closed, by a deadline or to make room
                with anyio.fail_after(WAIT_S):
                    answer = await read_until_closed(stream)
                assert answer == b"", answer
                await stream.aclose()
        text = await client.metrics()
        closed = sum(
            metric(text, f'levelzero_http_connections_closed_total{{reason="{reason}"}}')
            for reason in ("header_timeout", "body_timeout", "evicted")
        )
        assert closed >= 8
        # The three whose bodies never came were their clients' doing: 499, never 500.
        assert metric(text, 'levelzero_http_requests_total{code="499",route="/v1/topics"}') == 3.0
        assert 'code="500"' not in text


async def test_at_the_limit_with_every_connection_busy_it_is_a_json_503_but_healthz_answers(
    tmp_path: Path,
) -> None:
    gates: list[UploadGate] = []

    def wrap(store):
        gates.append(UploadGate(store))
        return gates[-1]

    async with daemon_and_client(tmp_path, wrap_object_store=wrap, server__connections_max=1) as (
        daemon,
        client,
    ):
        await client.create_topic("t", 1)
        gates[0].arm(daemon.node.partition("t", 0).row.pid)
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.produce, "t", 0, [b"held"])
            await gates[0].arrived.wait()  # the only connection is busy in the app
            async with httpx.AsyncClient(base_url=daemon.url, trust_env=False) as other:
                refused = await other.get("/v1/topics")
                assert_error(refused, 503, "too_many_connections", "connection limit")
                assert refused.headers["retry-after"] == "1"
                assert (await other.get("/healthz")).json() == {"status": "ok"}
                assert (await other.get("/readyz")).json() == {"status": "ready"}
            gates[0].release()
        assert (await client.fetch("t", 0, 0)).records[0].value == b"held"


async def test_requests_h11_cannot_parse_get_the_json_400(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path) as (daemon, client):
        assert daemon.url is not None
        port = port_of(daemon.url)
        for request in (
            b"NOT HTTP AT ALL\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000,
        ):  # never ends
            stream = await connect(port, request)
            with anyio.fail_after(WAIT_S):
                answer = await read_until_closed(stream)
            await stream.aclose()
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 400 "), answer
            assert b"content-type: application/json" in head.lower()
            assert msgspec_json(body)["error"] == "malformed_request"
        assert await client.list_topics() == []  # still serving


async def test_a_request_head_over_its_bound_is_a_400_however_it_arrives(tmp_path: Path) -> None:
    # h11's own bound applies only to a head still incomplete after a read: a longer head
    # arriving whole in one read was served. The bound is the head's, its blank line included,
    # whatever the reads that bring it.
    async with daemon_and_client(tmp_path) as (daemon, client):
        assert daemon.url is not None
        port = port_of(daemon.url)

        def head_of(length: int) -> bytes:
            start = f"GET /v1/topics HTTP/1.1\r\nHost: 127.0.0.1\r\n{AUTH}Connection: close\r\nX-Pad: "
            padding = length - len(start) - len("\r\n\r\n")
            head = start.encode() + b"a" * padding + b"\r\n\r\n"
            assert len(head) == length
            return head

        bound = REQUEST_HEAD_BYTES_MAX
        for length, status in ((bound, 200), (bound + 1, 400), (60_000, 400)):
            for whole in (True, False):
                stream = await connect(port)
                head = head_of(length)
                if whole:
                    await stream.send(head)
                else:  # in two reads: the parser holds the first part when the rest comes
                    await stream.send(head[: length // 2])
                    await anyio.sleep(0.05)
                    await stream.send(head[length // 2 :])
                with anyio.fail_after(WAIT_S):
                    answer = await read_until_closed(stream)
                await stream.aclose()
                top, _, body = answer.partition(b"\r\n\r\n")
                assert top.startswith(f"HTTP/1.1 {status} ".encode()), (length, whole, answer[:200])
                if status == 400:
                    assert msgspec_json(body)["error"] == "malformed_request"
                    assert f"over {REQUEST_HEAD_BYTES_MAX} bytes" in msgspec_json(body)["message"]
        # Pipelined behind a request answered first: the second head is whole in the parser's
        # buffer when the first answer completes, and no read brings it.
        small = f"GET /v1/topics HTTP/1.1\r\nHost: 127.0.0.1\r\n{AUTH}\r\n".encode()
        stream = await connect(port, small + head_of(bound + 1))
        with anyio.fail_after(WAIT_S):
            answer = await read_until_closed(stream)
        await stream.aclose()
        first, _, rest = answer.partition(b"HTTP/1.1 400 ")
        assert first.startswith(b"HTTP/1.1 200 ") and rest, answer[:400]
        assert f"over {bound} bytes".encode() in rest
        assert await client.list_topics() == []  # still serving


def msgspec_json(body: bytes) -> dict:
    return json.loads(body)


async def test_an_exception_no_route_caught_is_still_the_json_500(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path) as (daemon, _):
        assert daemon.node is not None and daemon.metrics is not None
        app = build_app(daemon.node, daemon.metrics)

        async def escapes(request):
            raise RuntimeError("escaped")

        app.router.routes.append(Route("/escapes", escapes))
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://daemon") as http:
            assert_error(await http.get("/escapes"), 500, "internal_error", "internal error")


# -- closes: never one with a request unread, every one counted, one answer per request

HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


def receive_answer(sock: socket.socket) -> bytes:
    """One answer with a Content-Length body, read from a blocking socket (in a thread)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


async def protocol_of(daemon: Daemon, port: int) -> GuardedH11Protocol:
    """The server's protocol of the client on local `port`, once the server has accepted it."""
    assert daemon.connection_guard is not None
    with anyio.fail_after(WAIT_S):
        while True:
            for protocol in daemon.connection_guard.protocols.values():
                if protocol.client is not None and protocol.client[1] == port:
                    return protocol
            await anyio.sleep(0.001)


def send_while_the_loop_is_late(deadline: float, sock: socket.socket, data: bytes) -> None:
    """Make the loop late across `deadline` (a time of its clock), then send `data` in the same
    loop iteration as the deadline's own callback, before it: the deadline passes with the
    request in the socket, unread. This is what a paused process or uvloop (which runs expired
    timers before it polls) does when a request arrives just before the deadline."""
    loop = asyncio.get_running_loop()
    loop.call_at(deadline - 0.05, time.sleep, 0.1)  # the loop polls for I/O before this, not after
    loop.call_at(deadline - 0.01, sock.sendall, data)


async def test_a_request_sent_as_keepalive_expires_is_answered_not_reset(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, server__keepalive_timeout_s=2.0) as (daemon, _):
        assert daemon.url is not None and daemon.connection_guard is not None
        with socket.create_connection(("127.0.0.1", port_of(daemon.url))) as sock:
            sock.settimeout(WAIT_S)
            sock.sendall(HEALTHZ)
            assert (await anyio.to_thread.run_sync(receive_answer, sock)).startswith(b"HTTP/1.1 200 ")
            protocol = await protocol_of(daemon, sock.getsockname()[1])
            with anyio.fail_after(WAIT_S):
                while protocol.timeout_keep_alive_task is None:  # armed as the answer ends
                    await anyio.sleep(0.001)
            send_while_the_loop_is_late(protocol.timeout_keep_alive_task.when(), sock, HEALTHZ)
            answer = await anyio.to_thread.run_sync(receive_answer, sock)  # no reset
            assert answer.startswith(b"HTTP/1.1 200 "), answer
            assert answer.endswith(b'{"status":"ok"}')
        assert daemon.connection_guard.table.closed[CloseReason.KEEPALIVE_TIMEOUT] == 0


async def test_a_head_sent_as_its_deadline_passes_is_answered_not_reset(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, server__header_timeout_s=2.0) as (daemon, _):
        assert daemon.url is not None and daemon.connection_guard is not None
        with socket.create_connection(("127.0.0.1", port_of(daemon.url))) as sock:
            sock.settimeout(WAIT_S)
            # A new connection's head has its deadline from the connect.
            protocol = await protocol_of(daemon, sock.getsockname()[1])
            assert protocol._deadline is not None
            send_while_the_loop_is_late(protocol._deadline.when(), sock, HEALTHZ)
            answer = await anyio.to_thread.run_sync(receive_answer, sock)
            assert answer.startswith(b"HTTP/1.1 200 "), answer
        assert daemon.connection_guard.table.closed[CloseReason.HEADER_TIMEOUT] == 0


async def test_every_close_the_server_makes_is_counted_once_by_reason(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, server__keepalive_timeout_s=0.3) as (daemon, client):
        assert daemon.url is not None and daemon.connection_guard is not None
        port = port_of(daemon.url)
        exchanges = [
            (HEALTHZ, b"HTTP/1.1 200 "),  # kept alive, then idle past keepalive_timeout_s
            (b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", b"HTTP/1.1 200 "),
            (b"GET /healthz HTTP/1.0\r\n\r\n", b"HTTP/1.1 200 "),
            (b"NOT HTTP AT ALL\r\n\r\n", b"HTTP/1.1 400 "),
        ]
        for request, status_line in exchanges:
            stream = await connect(port, request)
            with anyio.fail_after(WAIT_S):
                answer = await read_until_closed(stream)  # the server closes each one
            await stream.aclose()
            assert answer.startswith(status_line) and answer.count(b"HTTP/1.") == 1, answer
        stream = await connect(port, HEALTHZ)  # the client closes this one: not counted
        assert (await stream.receive()).startswith(b"HTTP/1.1 200 ")
        await stream.aclose()
        closed = daemon.connection_guard.table.statistics().closed
        assert {reason: count for reason, count in closed.items() if count} == {
            "keepalive_timeout": 1,
            "close_requested": 2,
            "malformed_request": 1,
        }
        reasons = {
            line.split('reason="')[1].split('"')[0]
            for line in (await client.metrics()).splitlines()
            if line.startswith("levelzero_http_connections_closed_total{")
        }
        assert reasons == {reason.value for reason in CloseReason}
        waiting = await connect(port, b"GET /healthz HTTP/1.1\r\n")  # half a head at shutdown
    await waiting.aclose()
    assert daemon.connection_guard.table.closed[CloseReason.SHUTDOWN] == 1


MALFORMED_CHUNK = b"zz\r\nhello\r\n0\r\n\r\n"
CHUNKED_POST = b"POST /v1/topics HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"


def app_took_the_body_so_far(protocol: GuardedH11Protocol) -> bool:
    """The app is reading the request's body and has taken every byte that came."""
    cycle = protocol.cycle
    return cycle is not None and not cycle.body and not cycle.message_event.is_set()


@pytest.mark.parametrize("when", ["with_the_head", "after_the_415", "while_the_app_reads"])
async def test_a_malformed_chunked_body_gets_one_answer_one_count_and_no_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, when: str
) -> None:
    """A POST whose chunked body is not HTTP (`zz` as a chunk size). Without Content-Type, in
    one packet with its head: the server's 400 is the answer, and the app, started on the head,
    answers and counts nothing else; sent after the app's 415: the 415 is, and the connection
    closes. With Content-Type, while the app reads the body: the 400 again (counted as that, not
    as a client gone, 499). Each time one answer, one count, no traceback."""
    caplog.set_level(logging.INFO)
    async with daemon_and_client(tmp_path) as (daemon, client):
        assert daemon.url is not None and daemon.connection_guard is not None
        port = port_of(daemon.url)
        with anyio.fail_after(WAIT_S):
            if when == "with_the_head":
                stream = await connect(port, CHUNKED_POST + b"\r\n" + MALFORMED_CHUNK)
                answer = b""
            elif when == "after_the_415":
                stream = await connect(port, CHUNKED_POST + b"\r\n")
                answer = b""
                while b'"}' not in answer:  # the whole 415, before the body is sent
                    answer += await stream.receive()
                await stream.send(MALFORMED_CHUNK)
            else:
                stream = await connect(
                    port, CHUNKED_POST + b'Content-Type: application/json\r\n\r\n5\r\n{"nam\r\n'
                )
                port = stream.extra(anyio.abc.SocketAttribute.local_port)  # noqa: S610 (anyio's, not Django's)
                protocol = await protocol_of(daemon, port)
                while not app_took_the_body_so_far(protocol):
                    await anyio.sleep(0.001)
                await stream.send(MALFORMED_CHUNK)
                answer = b""
            answer += await read_until_closed(stream)
        await stream.aclose()
        status, code = (b"400", "malformed_request")
        if when == "after_the_415":
            status, code = (b"415", "unsupported_media_type")
        assert answer.startswith(b"HTTP/1.1 " + status + b" ") and answer.count(b"HTTP/1.") == 1, answer
        assert msgspec_json(answer.partition(b"\r\n\r\n")[2])["error"] == code
        counted = f'levelzero_http_requests_total{{code="{status.decode()}",route="/v1/topics"}}'
        with anyio.fail_after(WAIT_S):
            while f"{counted} 1.0" not in (text := await client.metrics()):
                await anyio.sleep(0.01)
        counts = [line for line in text.splitlines() if line.startswith("levelzero_http_requests_total{")]
        assert counts == [f"{counted} 1.0"]
        assert daemon.connection_guard.table.closed[CloseReason.MALFORMED_REQUEST] == 1
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert errors == [], [r.getMessage() for r in errors]


async def test_a_request_in_but_unread_as_shutdown_begins_is_answered_then_closed(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path) as (daemon, _):
        assert daemon.url is not None and daemon.connection_guard is not None
        with socket.create_connection(("127.0.0.1", port_of(daemon.url))) as sock:
            sock.settimeout(WAIT_S)
            sock.sendall(HEALTHZ)
            assert (await anyio.to_thread.run_sync(receive_answer, sock)).startswith(b"HTTP/1.1 200 ")
            protocol = await protocol_of(daemon, sock.getsockname()[1])
            sock.sendall(HEALTHZ)  # in the server's socket before the loop runs again
            protocol.shutdown()  # what uvicorn does to every connection when the server stops
            answer = await anyio.to_thread.run_sync(receive_answer, sock)
            assert answer.startswith(b"HTTP/1.1 200 "), answer
            assert await anyio.to_thread.run_sync(sock.recv, 1) == b""  # then closed, not reset
        assert daemon.connection_guard.table.closed[CloseReason.SHUTDOWN] == 1


def failing_app(after_start: bool) -> Any:
    """An ASGI app that fails, before its answer or in the middle of it."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if after_start:
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"10")]}
            )
            await send({"type": "http.response.body", "body": b"half", "more_body": True})
        raise RuntimeError("the app failed")

    return app


async def test_a_close_after_an_app_failure_is_counted_as_app_error(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path) as (daemon, _):
        assert daemon.url is not None and daemon.connection_guard is not None
        answers = []
        for after_start in (False, True):
            stream = await connect(port_of(daemon.url))
            port = stream.extra(anyio.abc.SocketAttribute.local_port)  # noqa: S610 (anyio's, not Django's)
            protocol = await protocol_of(daemon, port)
            protocol.app = failing_app(after_start)  # this connection's requests only
            await stream.send(HEALTHZ)
            with anyio.fail_after(WAIT_S):
                answers.append((await read_until_closed(stream)).split(b"\r\n", 1)[0])
            await stream.aclose()
        assert answers == [b"HTTP/1.1 500 Internal Server Error", b"HTTP/1.1 200 OK"]
        closed = daemon.connection_guard.table.statistics().closed
        assert {reason: count for reason, count in closed.items() if count} == {"app_error": 2}


async def test_without_a_token_only_requests_to_a_loopback_name_are_served(tmp_path: Path) -> None:
    """DNS rebinding: a page whose name resolves to 127.0.0.1 is same-origin to the browser,
    and sends JSON with its own name as Host. Without a token the daemon served it (a 201
    topic, a 200 delete): now a 403 naming the host; loopback names are served, and with a
    token (which a page does not have) any name is."""
    async with daemon_and_client(tmp_path) as (daemon, client):
        http = client._http
        rebound = {"Host": "attacker.example:8420", "Origin": "http://attacker.example:8420"}
        response = await http.post("/v1/topics", json={"name": "rebound", "partitions": 1}, headers=rebound)
        assert_error(response, 403, "forbidden_host", "Host 'attacker.example' is not a loopback name")
        assert_error(await http.get("/v1/topics", headers=rebound), 403, "forbidden_host")
        for host in ("127.0.0.1:1", "localhost", "[::1]:8420", "127.1.2.3", "a.localhost:9"):
            response = await http.get("/v1/topics", headers={"Host": host})
            assert response.status_code == 200, (host, response.text)
        assert (await http.get("/healthz", headers=rebound)).status_code == 200
        assert [t.name for t in await client.list_topics()] == []


async def test_a_request_with_both_content_length_and_transfer_encoding_is_refused_and_closed(
    tmp_path: Path,
) -> None:
    """Content-Length and Transfer-Encoding together (RFC 9112 6.3: refuse, or read it chunked
    and close after): it was read chunked and the request pipelined after it served, which a
    proxy reading Content-Length would never have seen (request smuggling). Now a 400 and the
    connection closed: the request after it is not served."""
    async with daemon_and_client(tmp_path) as (daemon, client):
        assert daemon.url is not None
        smuggled = b"POST /v1/topics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        body = b'{"name": "smuggled", "partitions": 1}'
        smuggled += b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        first = (
            b"POST /v1/topics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        )
        with anyio.fail_after(WAIT_S):
            stream = await connect(port_of(daemon.url), first + smuggled)
            answer = await read_until_closed(stream)
        assert answer.startswith(b"HTTP/1.1 400 ") and b"both Content-Length and Transfer-Encoding" in answer
        assert answer.count(b"HTTP/1.1 ") == 1, answer
        assert [t.name for t in await client.list_topics()] == []


@pytest.fixture
def daemon_logging(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """The daemon's logging (`configure_logging`, to a buffer), caplog still capturing; the
    root logger's handlers and level put back after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    configure_logging("info", stream=io.StringIO())
    root.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)


def peer_of(stream: anyio.abc.SocketStream) -> str:
    return f"127.0.0.1:{stream.extra(anyio.abc.SocketAttribute.local_port)}"  # noqa: S610 - anyio's


async def test_garbage_requests_and_evictions_are_logged_once_an_interval(
    tmp_path: Path, daemon_logging: pytest.LogCaptureFixture
) -> None:
    """50 requests that are not HTTP wrote 50 lines of uvicorn's own warning, and 50
    connections evicting each other 48 lines: now one each an interval, the eviction naming
    its peer, and a close for another reason (a head's deadline) still gets its own line."""
    caplog = daemon_logging
    async with daemon_and_client(
        tmp_path, server__connections_per_peer_max=2, server__header_timeout_s=0.5
    ) as (daemon, client):
        assert daemon.url is not None
        port = port_of(daemon.url)
        for _ in range(50):
            stream = await connect(port, b"NOT HTTP AT ALL\r\n\r\n")
            with anyio.fail_after(WAIT_S):
                assert (await read_until_closed(stream)).startswith(b"HTTP/1.1 400 ")
            await stream.aclose()
        invalid = [r for r in caplog.records if r.getMessage().startswith("Invalid HTTP request received.")]
        assert 1 <= len(invalid) <= 2, [r.getMessage() for r in invalid]
        assert invalid[0].name == "uvicorn.error"

        held = []
        for _ in range(50):  # each new idle connection evicts the oldest of this peer's
            held.append(await connect(port))
            await anyio.sleep(0.005)
        peers = [peer_of(stream) for stream in held]
        with anyio.fail_after(WAIT_S):
            for stream in held:
                assert await read_until_closed(stream) == b""
                await stream.aclose()
        text = await client.metrics()
        assert metric(text, 'levelzero_http_connections_closed_total{reason="evicted"}') >= 40
        evicted = [r.getMessage() for r in caplog.records if ": evicted (phase" in r.getMessage()]
        assert 1 <= len(evicted) <= 2, evicted
        assert evicted[0] == f"closing HTTP connection from {peers[0]}: evicted (phase head)"
        timed_out = [r.getMessage() for r in caplog.records if ": header_timeout (phase" in r.getMessage()]
        assert len(timed_out) == 1, timed_out
        assert timed_out[0] in [
            f"closing HTTP connection from {p}: header_timeout (phase head)" for p in peers
        ]


async def test_an_answer_the_client_never_reads_is_dropped_after_the_body_timeout(tmp_path: Path) -> None:
    """A client that asks for a large fetch and never reads held its answer for good (100
    connections: 2.3 GB, still held after 75 s): no deadline watched a request being answered.
    A client that takes none of the answer for `server.body_timeout_s` is closed and its buffered
    bytes dropped (`write_timeout`)."""
    async with daemon_and_client(tmp_path, server__body_timeout_s=1.0) as (daemon, client):
        assert daemon.url is not None and daemon.connection_guard is not None
        await client.create_topic("big", 1)
        for _ in range(8):
            await client.produce("big", 0, [(None, b"v" * 1024 * 1024)])
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            await anyio.to_thread.run_sync(sock.connect, ("127.0.0.1", port_of(daemon.url)))
            path = "/v1/topics/big/partitions/0/records?offset=0&max_bytes=16777216"
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            with anyio.fail_after(30):
                while not daemon.connection_guard.table.closed[CloseReason.WRITE_TIMEOUT]:
                    await anyio.sleep(0.1)
        finally:
            sock.close()


async def test_request_bodies_are_bounded_across_requests(tmp_path: Path) -> None:
    """Each request's body was bounded (body_bytes_max), not their sum: 500 connections sending
    8 MiB bodies slowly held 4.7 GB. Every request with a body reserves it (its Content-Length)
    before it is read, within server.inflight_body_bytes_max; the next waits for room."""
    mib = 1024 * 1024
    async with daemon_and_client(
        tmp_path, server__body_bytes_max=mib, server__inflight_body_bytes_max=2 * mib
    ) as (daemon, _):
        assert daemon.url is not None
        port = port_of(daemon.url)
        head = (
            b"POST /v1/topics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % mib
        )
        streams = [await connect(port, head + b"{") for _ in range(3)]
        try:
            budget = daemon.body_budget
            with anyio.fail_after(WAIT_S):
                while budget.used < 2 * mib or not budget._waiters:
                    await anyio.sleep(0.05)
            assert budget.used == 2 * mib and len(budget._waiters) == 1  # the third waits
            await streams[0].send(b" " * (mib - 2) + b"}")  # the first body, whole: answered
            with anyio.fail_after(WAIT_S):
                answer = await streams[0].receive()
            assert answer.startswith(b"HTTP/1.1 400 "), answer  # (no topic name)
            with anyio.fail_after(WAIT_S):
                while budget._waiters:  # its room went to the third
                    await anyio.sleep(0.05)
            assert budget.used == 2 * mib
        finally:
            for stream in streams:
                await stream.aclose()
