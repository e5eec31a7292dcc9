"""A leader that crashed is still redirected to by the other nodes until its lease expires. The
client used to fail at once there, naming the healthy node it was given rather than the dead
one; now it names the node it could not reach and how it got there, and asks the node it was
given again (never the dead one) until the partition has a leader or its timeout passes. It
sends a produce again only where that cannot store it twice: the dead node took no connection,
or the produce carries an idempotency key.

The node asked is an in-process app that answers a script (307 to a dead node, 503, 200); the
dead node is a real loopback port nothing listens on, or a listener that drops each request."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import httpx
import msgspec
import pytest
from anyio.abc import SocketStream
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.applications import Starlette

from daemon_support import free_port
from levelzero.client import ApiError, Client
from levelzero.http.schema import ProduceRequest

ASKED = "http://node-a.test:8420"
RECORDS = "/v1/topics/h/partitions/0/records"
ACK = {"base_offset": 7, "last_offset": 8, "attempts": 1}
FETCHED = {"records": [], "next_offset": 0, "high_watermark": 0, "start_offset": 0, "tier": "none"}


class Node:
    """The node asked: its answers in turn (the last one repeated), and what it was sent."""

    def __init__(self, answers: list[Callable[[], Response]]) -> None:
        self.answers = answers
        self.bodies: list[bytes] = []

    def app(self) -> Starlette:
        async def records(request: Request) -> Response:
            self.bodies.append(await request.body())
            return self.answers[min(len(self.bodies), len(self.answers)) - 1]()

        return Starlette(routes=[Route(RECORDS, records, methods=["GET", "POST"])])

    @property
    def requests(self) -> int:
        return len(self.bodies)


class Routed(httpx.AsyncBaseTransport):
    """The node asked in process; every other URL (the redirect targets) over real sockets."""

    def __init__(self, node: Node) -> None:
        self._asked = httpx.ASGITransport(app=node.app())
        self._network = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host == httpx.URL(ASKED).host:
            return await self._asked.handle_async_request(request)
        return await self._network.handle_async_request(request)

    async def aclose(self) -> None:
        await self._network.aclose()


def redirect(to: str) -> Callable[[], Response]:
    return lambda: Response(status_code=307, headers={"Location": to + RECORDS})


def not_leader() -> Response:
    return JSONResponse(
        {"error": "not_leader", "message": "no node leads h/0 yet"}, 503, {"Retry-After": "1"}
    )


def ok(body: dict) -> Callable[[], Response]:
    return lambda: JSONResponse(body)


@asynccontextmanager
async def dropping_node() -> AsyncIterator[str]:
    """The URL of a node that takes each request and closes the connection unanswered (one
    that died with the request in hand)."""

    async def drop(stream: SocketStream) -> None:
        async with stream:
            await stream.receive()

    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)  # noqa: S610 (anyio's, not Django's)
        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, drop)
            yield f"http://127.0.0.1:{port}"
            tg.cancel_scope.cancel()


def client(node: Node, timeout_s: float = 10.0) -> Client:
    return Client(ASKED, timeout_s=timeout_s, transport=Routed(node))


async def test_a_redirect_to_a_dead_leader_is_retried_at_the_url_given_until_a_leader_answers() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    node = Node([redirect(dead), redirect(dead), not_leader, redirect(dead), ok(ACK)])
    started = time.monotonic()
    async with client(node) as c:
        ack = await c.produce("h", 0, [b"a", b"b"])  # no idempotency key: refused connections only
    assert (ack.base_offset, ack.last_offset) == (7, 8)
    # Each try went to the node asked, the same produce each time; pauses of 0.05, 0.1, 0.2, 0.4 s.
    assert node.requests == 5
    assert {msgspec.json.decode(b, type=ProduceRequest).records[1].value for b in node.bodies} == {b"b"}
    assert 0.7 < time.monotonic() - started < 5


async def test_the_error_names_the_dead_redirect_target_and_the_url_asked_after_the_timeout() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    node = Node([redirect(dead)])
    started = time.monotonic()
    async with client(node, timeout_s=1.0) as c:
        with pytest.raises(ApiError) as failed:
            await c.produce("h", 0, [b"a"])
    elapsed = time.monotonic() - started
    assert failed.value.code == "unreachable"
    message = failed.value.message
    assert message.startswith(f"cannot reach levelzero at {dead} (redirected there by {ASKED}): ")
    assert message.endswith(f"; still so after {node.requests} tries in 1 s")
    assert node.requests >= 3 and 1.0 <= elapsed < 2.5


async def test_a_produce_the_dead_leader_may_have_received_is_sent_again_only_with_an_idempotency_key() -> (
    None
):
    node = Node([])
    async with dropping_node() as dropping, client(node) as c:
        node.answers = [redirect(dropping), ok(ACK)]
        with pytest.raises(ApiError) as failed:
            await c.produce("h", 0, [b"a"])  # perhaps stored: not sent again
        assert node.requests == 1
        assert failed.value.code == "unreachable"
        message = failed.value.message
        assert message.startswith(
            f"cannot reach levelzero at {dropping} (redirected there by {ASKED}): Server disconnected"
        )
        assert message.endswith("; it may have been carried out there, so it was not sent again")
        node.bodies.clear()
        ack = await c.produce("h", 0, [b"a"], idempotency_key="job/1")  # stored once however sent
        assert (ack.base_offset, node.requests) == (7, 2)
        node.bodies.clear()
        node.answers = [redirect(dropping), ok(FETCHED)]
        assert (await c.fetch("h", 0, 0)).tier == "none"  # a read: sent again
        assert node.requests == 2


async def test_the_url_given_is_not_retried_when_it_cannot_be_reached() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    async with Client(url, timeout_s=10.0) as c:
        with pytest.raises(ApiError) as failed:
            await c.fetch("h", 0, 0)
    assert failed.value.message.startswith(f"cannot reach levelzero at {url}: ")
    assert "redirected" not in failed.value.message and time.monotonic() - started < 2
