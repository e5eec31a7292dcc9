"""The Kafka listener: TCP connections speaking Kafka's framed request/response protocol.

Each connection is a task group of its own: a reader takes size-prefixed frames (at most
`frame_bytes_max`, and at most UNAUTHENTICATED_FRAME_BYTES_MAX before SASL authentication; a
bigger one closes the connection before its body is read), a task per request runs its handler,
and a writer sends the responses in request order, as Kafka clients require. At most
`IN_FLIGHT_MAX` requests of a connection are under way; the reader waits for the writer beyond
that. A produce is answered once its records are durable, a batch window and an upload later
(~0.5 s): a connection serves at most IN_FLIGHT_MAX such requests a window, and a client that
pipelines more (librdkafka without idempotence has no bound of its own, and with a small
`linger.ms` sends a request per few messages) had its requests wait in the socket, its latency
growing without end (128 served ~256 requests/s; its retries after `request.timeout.ms` stored
records twice). Any other request waits until the answer before it is written, as a Kafka
broker serves a connection one request at a time: a fetch's answer (up to
FETCH_RESPONSE_BYTES_MAX) is built only once the client has taken the one before, so a client
that pipelines fetches and never reads holds one answer, not thousands (128 of 64 MiB each held
gigabytes). An answer the client does not take within `idle_timeout_s` closes the connection.

Request bytes are bounded as they arrive, never as they are announced: a frame's body is read
in chunks of at most FRAME_CHUNK_BYTES, each taken, once it is in, first from the connection's own budget
(`frame_bytes_max`: one connection never holds more) and then from one listener-wide budget
(`inflight_bytes_max`), and given back once the response is sent. A length prefix alone holds
nothing, so a few connections announcing huge frames block nobody. Deadlines close connections
that hold a reader without progress: a frame's body must arrive within `frame_timeout_s` of its
length prefix; a connection not yet authenticated (or, without SASL, one that has not yet sent a
request) must send its next frame within `header_timeout_s`; an idle one lives
`idle_timeout_s` (Kafka's connections.max.idle.ms). Fetch responses are bounded by
FETCH_RESPONSE_BYTES_MAX each.
Produce requests of one connection queue their records on the partitions' lanes in the order
they were sent (each waits until the one before it has queued, not until it is stored), and a
lane stores its queue in order, so records a client sends in order are stored in order.

A frame that does not parse, an unknown API key or version, or a handler failing with anything
but an operating error closes the connection (what a Kafka broker does), with a log line; it never
reaches the rest of the daemon. The lines of closes a client can cause at will (bad frames, silence,
failed TLS handshakes, requests before authentication) name the peer and are throttled per
reason (`ThrottledWarnings`): anyone who can connect could otherwise grow the log without end.
ApiVersions at a version above ours is answered with UNSUPPORTED_VERSION and our versions (v0
layout), as Kafka clients expect.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import anyio
import anyio.abc
from anyio import aclose_forcefully
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.tls import TLSListener
from kio.schema.errors import ErrorCode

from levelzero.actors.batcher import _ByteBudget as ByteBudget  # the one byte budget we have
from levelzero.core.throttled_warning import ThrottledBugs, ThrottledWarnings
from levelzero.kafka.handlers import Handlers
from levelzero.kafka.metrics import ApiStats, RequestStats
from levelzero.kafka.protocol import (
    API_VERSIONS_KEY,
    SIZE_PREFIX,
    BadRequest,
    UnansweredFailure,
    Request,
    api_versions_response,
    encode_response,
    is_supported,
    make,
    parse_prefix,
    parse_request,
)
from levelzero.kafka.sasl import MECHANISMS, SaslAuthenticator, SaslState

log = logging.getLogger("levelzero.kafka")

IN_FLIGHT_MAX = 4096
# Each request under way counts at least this many bytes in the budgets below, however small its
# frame: the listener-wide budget bounds the requests under way on every connection together
# (`inflight_bytes_max` / this: 65,536 at the default), each holding a task and its answer.
REQUEST_BYTES_MIN = 4096
PRODUCE_KEY = 0
# A frame's body is read, and its bytes taken from the budgets, this much at a time.
FRAME_CHUNK_BYTES = 64 * 1024
# The largest frame of a connection that has not authenticated yet (Kafka's SASL server bounds
# its receive size the same: 512 KiB).
UNAUTHENTICATED_FRAME_BYTES_MAX = 512 * 1024
# After a failed authentication the answer goes out at once and the connection is closed this
# much later (Kafka's connection.failed.authentication.delay.ms, 100 ms by default): a client
# that reads the answer and the end of the stream in one wake-up may drop the answer
# (kafka-python 3.0 then sees only "socket disconnected" and never the failure's cause).
FAILED_AUTHENTICATION_CLOSE_DELAY_S = 0.1


@dataclass(frozen=True, slots=True)
class ListenerSettings:
    frame_bytes_max: int = 100 * 1024 * 1024
    connections_max: int = 1024
    inflight_bytes_max: int = 256 * 1024 * 1024
    # Non-empty: every connection authenticates first with SASL (PLAIN or SCRAM-SHA-256/512),
    # this token as password.
    token: str = ""
    # How long a connection may stay silent between requests (Kafka's connections.max.idle.ms).
    idle_timeout_s: float = 600.0
    # Before authentication (without SASL: before its first request) the next frame must begin
    # within this, so connections that never speak do not pile up.
    header_timeout_s: float = 10.0
    # A frame's body must arrive within this after its length prefix.
    frame_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        assert 0 < self.frame_bytes_max <= self.inflight_bytes_max
        assert self.header_timeout_s > 0 and self.idle_timeout_s > 0 and self.frame_timeout_s > 0


# What a peer that went away looks like, at a read or a write.
_GONE = (
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
    anyio.IncompleteRead,
    ConnectionError,
)


class Close(Enum):
    """Why the listener closed a connection (a client's own close is not one), each counted in
    `ListenerStats.closed`. The lines of those a client could cause at will are logged at most
    once an interval per reason (`ThrottledWarnings`), with the count held back."""

    CONNECTIONS_MAX = "connections_max"
    EVICTED = "evicted"  # an idle one, closed at connections_max for a new connection
    IDLE = "idle"
    FRAME_SIZE = "frame_size"
    SLOW_FRAME = "slow_frame"
    MALFORMED = "malformed"
    BEFORE_AUTHENTICATION = "before_authentication"
    UNANSWERED = "unanswered"
    TLS_HANDSHAKE = "tls_handshake"
    AUTHENTICATION_FAILED = "authentication_failed"  # answered, then closed
    ERROR = "error"  # a handler failed on a bug (its traceback is logged)


def close_lines(level: int = logging.WARNING) -> ThrottledWarnings:
    return ThrottledWarnings(log, time.monotonic, keys_max=len(Close), level=level)


class _BeforeAuthentication(BadRequest):
    """A request other than ApiVersions or SASL's before the connection authenticated."""


@dataclass(slots=True)
class _Slot:
    done: anyio.Event = field(default_factory=anyio.Event)
    response: bytes | None = None
    close: bool = False
    close_after_response: bool = False
    close_delay_s: float = 0.0  # after the response, before closing (close_after_response)
    budget_bytes: int = 0  # taken from both the connection's and the listener's budget
    connection_budget: ByteBudget | None = None
    submitted: anyio.Event = field(default_factory=anyio.Event)  # produce: records queued
    written: anyio.Event = field(default_factory=anyio.Event)  # its answer sent (or none due)
    read_at: float = 0.0  # time.perf_counter() once the frame was in
    api: ApiStats | None = None  # its API's counters, once the request is known to be one


SASL_HANDSHAKE_KEY = 17
SASL_AUTHENTICATE_KEY = 36
BEFORE_AUTHENTICATION = frozenset({API_VERSIONS_KEY, SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY})


@dataclass(eq=False, slots=True)
class _Open:
    """An open connection as admission sees it: whose, and whether it is idle (waiting for
    its next frame with no request under way, since when)."""

    host: str
    scope: anyio.CancelScope
    in_flight: int = 0  # requests read, their answers not yet written
    reading_head: bool = False  # the reader waits for the next frame's length prefix
    waiting_since: float | None = None  # idle since (reading_head with nothing in flight)

    def waiting(self, reading_head: bool) -> None:
        self.reading_head = reading_head
        self.waiting_since = time.monotonic() if reading_head and not self.in_flight else None

    def answered(self) -> None:
        self.in_flight -= 1
        if not self.in_flight and self.reading_head:
            self.waiting_since = time.monotonic()


@dataclass(slots=True)
class _Session:
    """One connection's SASL state."""

    sasl: SaslState = field(default_factory=SaslState)
    authenticated: bool = False
    requests: int = 0  # frames read so far
    client_host: str = ""  # "/address", as Kafka names a member's host
    peer: str = "?"  # "host:port", as log lines name the connection


@dataclass(slots=True)
class ListenerStats:
    connections: int = 0
    connections_open: int = 0
    requests: int = 0
    closed_bad_frames: int = 0
    closed_unanswered_failures: int = 0  # a produce with acks=0 failed (as Kafka closes it)
    closed_idle: int = 0  # silent past idle_timeout_s, or past header_timeout_s before speaking
    closed_slow_frames: int = 0  # a frame's body not in within frame_timeout_s
    errors: int = 0
    authentications_failed: int = 0
    closed: dict[Close, int] = field(default_factory=lambda: dict.fromkeys(Close, 0))

    def close(self, reason: Close) -> None:
        self.closed[reason] += 1


class KafkaListener:
    def __init__(self, handlers: Handlers, settings: ListenerSettings) -> None:
        self.handlers = handlers
        self.settings = settings
        self.stats = ListenerStats()
        self.requests = RequestStats()
        # A request failing on a bug is sent again at once by the client, for ever: its
        # traceback at most once an interval per kind of error (`stats.errors` counts them all).
        self._bugs = ThrottledBugs(log, time.monotonic, keys_max=64)
        self._closes = close_lines()
        self._quiet_closes = close_lines(logging.INFO)
        self.budget = ByteBudget(settings.inflight_bytes_max)
        self.sasl = SaslAuthenticator(settings.token)
        self._open: set[_Open] = set()

    async def serve(
        self, listener: anyio.abc.Listener, *, task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED
    ) -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(self.handlers.run)
            task_status.started()
            await listener.serve(self._connection)

    async def _connection(self, stream: anyio.abc.ByteStream) -> None:
        self.stats.connections += 1
        if self.stats.connections_open >= self.settings.connections_max and not self._evict_one():
            self.stats.close(Close.CONNECTIONS_MAX)
            self._closes.warn(
                Close.CONNECTIONS_MAX,
                "kafka: connections_max %d reached, none of them idle; closing a new connection from %s",
                self.settings.connections_max,
                _peer(stream),
            )
            await stream.aclose()
            return
        self.stats.connections_open += 1
        opened = _Open(_client_host(stream), anyio.CancelScope())
        self._open.add(opened)
        try:
            with opened.scope:
                async with stream:
                    await self._run_connection(stream, opened)
        except _GONE:
            pass
        finally:
            self._open.discard(opened)
            self.stats.connections_open -= 1

    def _evict_one(self) -> bool:
        """At connections_max, close an idle connection (waiting for its next frame with no
        request under way) for a new one: of the client address holding the most, the one idle
        longest. One client holding every connection idle (a request each, then silence: the
        idle timeout is 10 minutes) shut every other client out. False if none is idle."""
        idle = [o for o in self._open if o.waiting_since is not None and not o.scope.cancel_called]
        if not idle:
            return False
        held: dict[str, int] = {}
        for o in self._open:
            held[o.host] = held.get(o.host, 0) + 1
        victim = min(idle, key=lambda o: (-held[o.host], o.waiting_since))
        victim.scope.cancel()
        self._open.discard(victim)
        self.stats.close(Close.EVICTED)
        self._quiet_closes.warn(
            Close.EVICTED,
            "kafka: connections_max %d reached; closing an idle connection of %s for a new one",
            self.settings.connections_max,
            victim.host or "?",
        )
        return True

    async def _run_connection(self, stream: anyio.abc.ByteStream, opened: _Open) -> None:
        reader = BufferedByteReceiveStream(stream)
        send, receive = anyio.create_memory_object_stream[_Slot](IN_FLIGHT_MAX)
        holding: list[_Slot] = []  # slots whose bytes may still be held: released at the end
        peer = _peer(stream)
        session = _Session(
            sasl=SaslState(peer),
            authenticated=not self.settings.token,
            client_host=_client_host(stream),
            peer=peer,
        )
        budget = ByteBudget(self.settings.frame_bytes_max)
        try:
            await self._connection_tasks(stream, reader, send, receive, holding, session, budget, opened)
        finally:
            for slot in holding:
                self._release(slot)

    async def _connection_tasks(
        self,
        stream: anyio.abc.ByteStream,
        reader: BufferedByteReceiveStream,
        send: anyio.abc.ObjectSendStream[_Slot],
        receive: anyio.abc.ObjectReceiveStream[_Slot],
        holding: list[_Slot],
        session: _Session,
        budget: ByteBudget,
        opened: _Open,
    ) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._writer, stream, receive, tg.cancel_scope, opened)
            last_produce: anyio.Event | None = None
            last: _Slot | None = None
            async with send:
                while True:
                    slot = _Slot(connection_budget=budget)
                    holding[:] = [s for s in holding if s.budget_bytes]
                    holding.append(slot)
                    frame = await self._read_frame(reader, slot, session, opened)
                    if frame is None:
                        break
                    slot.read_at = time.perf_counter()
                    opened.in_flight += 1
                    await send.send(slot)
                    before = None
                    if len(frame) >= 2 and int.from_bytes(frame[:2], "big", signed=True) == PRODUCE_KEY:
                        before, last_produce = last_produce, slot.submitted
                        turn = None
                    else:  # one at a time, as a Kafka broker serves them
                        turn = None if last is None else last.written
                    last = slot
                    tg.start_soon(self._serve_request, frame, slot, before, session, turn)

    async def _read_frame(
        self, reader: BufferedByteReceiveStream, slot: _Slot, session: _Session, opened: _Open | None = None
    ) -> bytes | None:
        """The next frame, or None when the connection is to be closed (gone, too big, too slow)."""
        settings = self.settings
        speaking = session.authenticated and session.requests > 0
        wait_s = settings.idle_timeout_s if speaking else settings.header_timeout_s
        head = None
        if opened is not None:
            opened.waiting(True)
        with anyio.move_on_after(wait_s):
            try:
                head = await reader.receive_exactly(SIZE_PREFIX.size)
            except _GONE:
                return None
            finally:
                if opened is not None:
                    opened.waiting(False)
        if head is None:
            self.stats.closed_idle += 1
            self.stats.close(Close.IDLE)
            self._quiet_closes.warn(
                Close.IDLE, "kafka: closing a connection from %s silent for %.0f s", session.peer, wait_s
            )
            return None
        (size,) = SIZE_PREFIX.unpack(head)
        limit = (
            settings.frame_bytes_max
            if session.authenticated
            else min(settings.frame_bytes_max, UNAUTHENTICATED_FRAME_BYTES_MAX)
        )
        if not 0 < size <= limit:
            self.stats.closed_bad_frames += 1
            self.stats.close(Close.FRAME_SIZE)
            self._closes.warn(
                Close.FRAME_SIZE,
                "kafka: closing a connection from %s that sent a frame of %d bytes (at most %d%s)",
                session.peer,
                size,
                limit,
                "" if session.authenticated else " before authentication",
            )
            return None
        session.requests += 1
        with anyio.move_on_after(settings.frame_timeout_s):
            try:
                return await self._read_body(reader, slot, size)
            except _GONE:
                self._release(slot)
                return None
            except BaseException:
                self._release(slot)
                raise
        self._release(slot)
        self.stats.closed_slow_frames += 1
        self.stats.close(Close.SLOW_FRAME)
        self._closes.warn(
            Close.SLOW_FRAME,
            "kafka: closing a connection from %s whose %d-byte frame did not arrive within %.0f s",
            session.peer,
            size,
            settings.frame_timeout_s,
        )
        return None

    async def _read_body(self, reader: BufferedByteReceiveStream, slot: _Slot, size: int) -> bytes:
        """`size` bytes, each chunk's bytes taken from the budgets as it arrives (a reader waiting
        for budget holds at most one chunk beyond it)."""
        assert slot.connection_budget is not None
        chunks: list[bytes] = []
        read = 0
        while read < size:
            chunk = await reader.receive(min(FRAME_CHUNK_BYTES, size - read))
            await self._take(slot, len(chunk))
            chunks.append(chunk)
            read += len(chunk)
        weight = min(REQUEST_BYTES_MIN, slot.connection_budget.limit, self.budget.limit)
        if (short := weight - slot.budget_bytes) > 0:  # a small request's weight
            await self._take(slot, short)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _take(self, slot: _Slot, n: int) -> None:
        """`n` more bytes for `slot`, from its connection's budget, then the listener's."""
        assert slot.connection_budget is not None
        await slot.connection_budget.acquire(n)
        try:
            await self.budget.acquire(n)
        except BaseException:
            slot.connection_budget.release(n)
            raise
        slot.budget_bytes += n

    def _release(self, slot: _Slot) -> None:
        if slot.budget_bytes:
            self.budget.release(slot.budget_bytes)
            assert slot.connection_budget is not None
            slot.connection_budget.release(slot.budget_bytes)
            slot.budget_bytes = 0

    async def _writer(
        self,
        stream: anyio.abc.ByteStream,
        receive: anyio.abc.ObjectReceiveStream[_Slot],
        scope: anyio.CancelScope,
        opened: _Open | None = None,
    ) -> None:
        async with receive:
            try:
                async for slot in receive:
                    try:
                        await slot.done.wait()
                        if slot.close:
                            break
                        if slot.api is not None:  # its turn to be written: answered
                            slot.api.observe(time.perf_counter() - slot.read_at)
                        if slot.response is not None and not await self._send(stream, slot.response):
                            break
                        if slot.close_after_response:
                            await anyio.sleep(slot.close_delay_s)
                            break
                    finally:
                        self._release(slot)
                        slot.written.set()
                        if opened is not None:
                            opened.answered()
            finally:
                scope.cancel()  # the reader may be waiting for a frame that is not coming

    async def _send(self, stream: anyio.abc.ByteStream, response: bytes) -> bool:
        """Send an answer; False if the connection is to be closed (gone, or the client took
        none of it within `idle_timeout_s`)."""
        with anyio.move_on_after(self.settings.idle_timeout_s):
            try:
                await stream.send(response)
            except _GONE:
                return False
            return True
        self.stats.closed_idle += 1
        self.stats.close(Close.IDLE)
        self._quiet_closes.warn(
            Close.IDLE,
            "kafka: closing a connection that took no answer of %d bytes within %.0f s",
            len(response),
            self.settings.idle_timeout_s,
        )
        return False

    async def _serve_request(
        self,
        frame: bytes,
        slot: _Slot,
        before: anyio.Event | None,
        session: _Session,
        turn: anyio.Event | None = None,
    ) -> None:
        try:
            if turn is not None:
                await turn.wait()
            slot.response = await self._respond(frame, before, slot.submitted, session, slot)
        except BadRequest as exc:
            self.stats.closed_bad_frames += 1
            reason = (
                Close.BEFORE_AUTHENTICATION if isinstance(exc, _BeforeAuthentication) else Close.MALFORMED
            )
            self.stats.close(reason)
            self._closes.warn(reason, "kafka: closing a connection from %s: %s", session.peer, exc)
            slot.close = True
        except UnansweredFailure as exc:
            self.stats.closed_unanswered_failures += 1
            self.stats.close(Close.UNANSWERED)
            self._quiet_closes.warn(
                Close.UNANSWERED, "kafka: closing a connection from %s: %s", session.peer, exc
            )
            slot.close = True
        except AssertionError as exc:
            self.stats.errors += 1
            self.stats.close(Close.ERROR)
            self._bugs.failed(exc, None, "BUG: invariant violated while serving a kafka request")
            slot.close = True
        except Exception as exc:  # noqa: BLE001 - logged (throttled), the connection closed
            self.stats.errors += 1
            self.stats.close(Close.ERROR)
            self._bugs.failed(exc, None, "kafka: unexpected error serving a request; closing the connection")
            slot.close = True
        finally:
            slot.submitted.set()  # whatever happened, the next produce may go
            slot.done.set()

    async def _respond(
        self,
        frame: bytes,
        after: anyio.Event | None,
        submitted: anyio.Event,
        session: _Session,
        slot: _Slot,
    ) -> bytes | None:
        self.stats.requests += 1
        api_key, api_version, correlation_id = parse_prefix(frame)
        slot.api = api = self.requests.api(api_key)
        api.requests += 1
        if api_key == API_VERSIONS_KEY and not is_supported(api_key, api_version):
            refusal = api_versions_response(0, ErrorCode.unsupported_version)
            api.count_errors(refusal)
            return encode_response(correlation_id, refusal)
        if not session.authenticated and api_key not in BEFORE_AUTHENTICATION:
            self.stats.authentications_failed += 1
            raise _BeforeAuthentication(
                f"api key {api_key} before SASL authentication (the listener requires SASL)"
            )
        request = dataclasses.replace(parse_request(frame), client_host=session.client_host)
        if api_key in (SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY):
            response = self._sasl(request, session, slot)
        else:
            response = await self.handlers.handle(request, after, submitted)
        if response is None:
            return None
        api.count_errors(response)
        return encode_response(request.correlation_id, response)

    def _sasl(self, request: Request, session: _Session, slot: _Slot) -> Any:
        """SaslHandshake and SaslAuthenticate (`sasl.py`: PLAIN, SCRAM-SHA-256/512; any user,
        the token as password). A failed authentication is answered, then the connection closed."""
        m = request.response_module
        body = request.body
        if request.api_key == SASL_HANDSHAKE_KEY:
            return make(
                m.SaslHandshakeResponse,
                mechanisms=MECHANISMS if self.sasl.served else (),
                error_code=self.sasl.handshake(session.sasl, body.mechanism),
            )
        step = self.sasl.authenticate(session.sasl, bytes(body.auth_bytes))
        if step.error != ErrorCode.none and self.sasl.served:  # (without SASL: answered, as Kafka)
            if step.error == ErrorCode.sasl_authentication_failed:
                self.stats.authentications_failed += 1
            self.stats.close(Close.AUTHENTICATION_FAILED)
            slot.close_after_response = True
            slot.close_delay_s = FAILED_AUTHENTICATION_CLOSE_DELAY_S
        elif step.done:
            session.authenticated = True
        return make(
            m.SaslAuthenticateResponse,
            error_code=step.error,
            error_message=step.message,
            auth_bytes=step.auth_bytes,
            session_lifetime=0,
        )


def _remote_address(stream: anyio.abc.AnyByteStream) -> tuple[Any, ...] | None:
    try:
        address = stream.extra(anyio.abc.SocketAttribute.remote_address)  # noqa: S610 - anyio's, not Django's
    except anyio.TypedAttributeLookupError:
        return None
    return address if isinstance(address, tuple) else None


def _client_host(stream: anyio.abc.ByteStream) -> str:
    address = _remote_address(stream)
    return "" if address is None else f"/{address[0]}"


def _peer(stream: anyio.abc.AnyByteStream) -> str:
    """The connection's peer as log lines name it: "host:port" ("?" when unknown)."""
    address = _remote_address(stream)
    return "?" if address is None else f"{address[0]}:{address[1]}"


@dataclass(eq=False)
class KafkaTLSListener(TLSListener):
    """anyio's TLS listener, a failed handshake (a plaintext client, an unknown CA, no client
    certificate) logged as one warning line naming the peer rather than an error with a
    traceback, at most once an interval (with the count held back)."""

    handshake_failures: ThrottledWarnings = field(default_factory=close_lines)
    stats: ListenerStats = field(default_factory=ListenerStats)  # the listener's, to count closes

    async def handle_handshake_error(  # type: ignore[override]  # anyio's is static; called on self
        self, exc: BaseException, stream: anyio.abc.AnyByteStream
    ) -> None:
        if not isinstance(exc, Exception) or isinstance(exc, anyio.get_cancelled_exc_class()):
            await TLSListener.handle_handshake_error(exc, stream)
            return
        peer = _peer(stream)
        await aclose_forcefully(stream)
        self.stats.close(Close.TLS_HANDSHAKE)
        self.handshake_failures.warn(
            Close.TLS_HANDSHAKE, "kafka: TLS handshake failed; closing the connection from %s: %s", peer, exc
        )
