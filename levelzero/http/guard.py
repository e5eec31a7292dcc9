"""The HTTP server's defence against clients that hold connections without using them.

uvicorn's h11 server bounds the size of a request head and how long a kept-alive connection may
sit idle after a response, and beyond `limit_concurrency` it answers every request with a
plain-text 503. It bounds neither how long a request head or body may take to arrive (a first
byte cancels the idle timer for good) nor who holds the connections: one client keeping
`connections_max` connections open, idle, trickling a head or stalling a declared body locked
out everyone else, health checks and authenticated clients included.

Two parts, split the sans-IO way:

- `ConnectionTable` (no I/O, no clock of its own): every admitted connection's peer and phase
  (`HEAD`: waiting for or reading a request head; `BODY`: the head is in, the body is not;
  `APP`: the request is complete and the app is answering) and since when. It decides
  admission: a new connection is admitted while there is room; at `connections_max`, or at the
  peer's `connections_per_peer_max`, it is admitted by evicting a connection that is not
  working (phase `HEAD` or `BODY`; from the peer holding the most connections, the longest
  waiting first), and refused only when every connection is busy in the app.
- `GuardedH11Protocol`: uvicorn's `H11Protocol` that feeds the table and carries out its
  decisions, with a deadline per phase (`header_timeout_s` from a head's first byte, and from
  the connect for a new connection; `body_timeout_s` from the head to the body's end; none
  while the app works, whose own bounds apply). A refused connection still gets an answer: the
  documented JSON 503 with `Retry-After`, and `/healthz` / `/readyz` are served even then.
  uvicorn's own 400 for a malformed request becomes the documented JSON error too, and is the
  request's one answer (the app, already started on its head, answers nothing).

Every close the server makes is counted once, by reason (`CloseReason`): the guard's, uvicorn's
keep-alive expiry, a malformed request's, one the request asked for, an app failure's, shutdown.
No deadline closes a connection holding bytes the loop has not read yet: a late loop (uvloop runs
expired timers before it polls for I/O; a paused process) would otherwise answer a request the
client sent in time with a TCP reset, and the client could not tell whether its POST applied.
The expiry then waits for those bytes to be read: a keep-alive expiry becomes the head's
deadline, a head's or body's deadline closes only if they did not complete what it waited for.
"""

from __future__ import annotations

import asyncio
import enum
import fcntl
import logging
import re
import struct
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import h11
import msgspec
from uvicorn.config import Config as UvicornConfig
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from levelzero.core.throttled_warning import ThrottledWarnings
from levelzero.http.schema import RETRY_AFTER_S, ErrorBody

log = logging.getLogger("levelzero.http")

# A longer request head is answered 400 (`head_too_long`): h11's own bound applies only to a
# head still incomplete after a read, so a longer one arriving whole in one read got through.
REQUEST_HEAD_BYTES_MAX = 16 * 1024
_HEAD_END = re.compile(b"\n\r?\n")  # the blank line ending a head, as h11 finds it
ALWAYS_SERVED_PATHS = frozenset({"/healthz", "/readyz"})  # answered even when refusing


def head_too_long(buffered: bytes, data: bytes) -> bool:
    """Whether the request head that `buffered` (what the parser holds) and then `data` begin
    is over REQUEST_HEAD_BYTES_MAX, its blank line included: its end is not within the bound
    and the bytes in reach the bound (otherwise the rest of the head may still come)."""
    head = buffered + data if buffered else data
    if len(head) < REQUEST_HEAD_BYTES_MAX:
        return False
    return _HEAD_END.search(head, 0, REQUEST_HEAD_BYTES_MAX) is None


class Phase(enum.Enum):
    HEAD = "head"  # waiting for a request head, or reading one
    BODY = "body"  # the head is in, the body is still arriving (or being discarded)
    APP = "app"  # the request is complete; the app is answering


# Eviction order within a peer: a connection waiting for a head costs its client the least.
_EVICTION_RANK = {Phase.HEAD: 0, Phase.BODY: 1}


class CloseReason(enum.Enum):
    """Why the server closed a connection (a client's own close is not counted)."""

    KEEPALIVE_TIMEOUT = "keepalive_timeout"  # idle after a response for keepalive_timeout_s
    HEADER_TIMEOUT = "header_timeout"
    BODY_TIMEOUT = "body_timeout"
    EVICTED = "evicted"  # to make room for a new connection
    REFUSED = "refused"  # answered 503 too_many_connections, or not at all
    MALFORMED_REQUEST = "malformed_request"  # not HTTP: answered 400 malformed_request
    CLOSE_REQUESTED = "close_requested"  # the request said Connection: close (or was HTTP/1.0)
    APP_ERROR = "app_error"  # the app failed: uvicorn's 500, or an answer cut short
    SHUTDOWN = "shutdown"  # the daemon is stopping
    # The client took none of an answer for body_timeout_s (its writes paused, the transport's
    # buffer full): an answer a client never reads held its bytes for good.
    WRITE_TIMEOUT = "write_timeout"


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    connections_max: int
    connections_per_peer_max: int
    header_timeout_s: float
    body_timeout_s: float

    def __post_init__(self) -> None:
        assert self.connections_max >= 1, self
        assert self.connections_per_peer_max >= 1, self
        assert self.header_timeout_s > 0 and self.body_timeout_s > 0, self


@dataclass(frozen=True, slots=True)
class Admission:
    admitted: bool
    evict: int | None = None  # the connection to close first, to make room


@dataclass(slots=True)
class _Entry:
    peer: str
    phase: Phase
    since: float


@dataclass(frozen=True, slots=True)
class GuardStatistics:
    connections: int
    peers: int
    by_phase: dict[str, int]
    closed: dict[str, int]


@dataclass
class ConnectionTable:
    """Who holds which connection, in which phase, since when; decides admission and eviction.
    Connections are named by an integer the caller chooses; time is passed in."""

    limits: ConnectionLimits
    _entries: dict[int, _Entry] = field(default_factory=dict)
    _per_peer: dict[str, int] = field(default_factory=dict)
    closed: dict[CloseReason, int] = field(default_factory=lambda: dict.fromkeys(CloseReason, 0))

    def __len__(self) -> int:
        return len(self._entries)

    def phase(self, conn: int) -> Phase:
        return self._entries[conn].phase

    def admit(self, conn: int, peer: str, now: float) -> Admission:
        """Admit `conn` from `peer` (in phase HEAD), maybe by evicting another connection."""
        assert conn not in self._entries, conn
        peer_count = self._per_peer.get(peer, 0)
        victim: int | None = None
        if peer_count >= self.limits.connections_per_peer_max:
            victim = self._victim(lambda entry: entry.peer == peer)
            if victim is None:
                return Admission(admitted=False)
        elif len(self._entries) >= self.limits.connections_max:
            victim = self._victim(lambda _entry: True)
            if victim is None:
                return Admission(admitted=False)
        self._entries[conn] = _Entry(peer, Phase.HEAD, now)
        self._per_peer[peer] = peer_count + 1
        return Admission(admitted=True, evict=victim)

    def _victim(self, eligible: Callable[[_Entry], bool]) -> int | None:
        """The connection to evict: not busy in the app; from the peer holding the most
        connections; a head-waiting one before a body-waiting one; the longest waiting."""
        best: tuple[int, int, float] | None = None
        victim = None
        for conn, entry in self._entries.items():
            if entry.phase is Phase.APP or not eligible(entry):
                continue
            key = (-self._per_peer[entry.peer], _EVICTION_RANK[entry.phase], entry.since)
            if best is None or key < best:
                best, victim = key, conn
        return victim

    def enter(self, conn: int, phase: Phase, now: float) -> None:
        entry = self._entries[conn]
        if entry.phase is not phase:
            entry.phase, entry.since = phase, now

    def remove(self, conn: int) -> None:
        entry = self._entries.pop(conn, None)
        if entry is None:
            return
        left = self._per_peer[entry.peer] - 1
        assert left >= 0, entry
        if left:
            self._per_peer[entry.peer] = left
        else:
            del self._per_peer[entry.peer]

    def note_closed(self, reason: CloseReason) -> None:
        self.closed[reason] += 1

    def statistics(self) -> GuardStatistics:
        by_phase = dict.fromkeys((p.value for p in Phase), 0)
        for entry in self._entries.values():
            by_phase[entry.phase.value] += 1
        return GuardStatistics(
            connections=len(self._entries),
            peers=len(self._per_peer),
            by_phase=by_phase,
            closed={reason.value: count for reason, count in self.closed.items()},
        )


def phase_of(their_state: object, response_complete: bool | None) -> Phase:
    """The phase of a connection from h11's view of the client and the current response
    (`None`: no request yet on this connection)."""
    if their_state is h11.SEND_BODY:
        return Phase.BODY
    if response_complete is False and their_state is not h11.IDLE:
        return Phase.APP
    return Phase.HEAD


def unread_bytes(transport: asyncio.BaseTransport) -> int:
    """Bytes the kernel holds for this connection that the loop has not read yet (0 when that
    cannot be known)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return 0
    count: int = struct.unpack("i", raw)[0]
    return count


class _CountedTransport:
    """A connection's transport whose `close` tells its protocol first. uvicorn closes from
    several places (its keep-alive timer, the end of an answer the request asked to be the
    last, an app that failed, shutdown), so the close itself is where each is counted."""

    def __init__(self, transport: asyncio.Transport, closing: Callable[[], None]) -> None:
        self._transport = transport
        self._closing = closing
        # The calls of every request, bound once rather than looked up through __getattr__.
        self.write = transport.write
        self.is_closing = transport.is_closing
        self.get_extra_info = transport.get_extra_info
        self.pause_reading = transport.pause_reading
        self.resume_reading = transport.resume_reading

    def close(self) -> None:
        self._closing()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


# The scope key by which the protocol tells the app that it answered the request itself (the
# status it sent): the body turned out not to be HTTP after the app had started on the head.
PROTOCOL_ANSWER_KEY = "levelzero.protocol_answer"

_encoder = msgspec.json.Encoder()


def error_bytes(code: str, message: str) -> bytes:
    """The documented JSON error body (as the API's `ErrorBody`)."""
    return _encoder.encode(ErrorBody(code, message))


def refusing_app(app: Any) -> Any:
    """The ASGI app of a refused connection: health checks go to `app`, everything else gets
    the JSON 503 with `Retry-After`; the connection closes after the answer."""

    async def refused(scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def send_and_close(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        if scope["path"] in ALWAYS_SERVED_PATHS:
            await app(scope, receive, send_and_close)
            return
        await send_unavailable(
            send,
            "too_many_connections",
            "the server is at its connection limit with every connection busy; retry shortly",
        )

    return refused


async def send_unavailable(send: Any, code: str, message: str) -> None:
    """The documented JSON 503 with `Retry-After`, as raw ASGI messages, the connection closed
    after it: the answer of a refused connection, and of a request a forced stop interrupted."""
    body = error_bytes(code, message)
    headers = [
        (b"content-type", b"application/json"),
        (b"retry-after", str(RETRY_AFTER_S).encode()),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class ConnectionGuard:
    """What every connection of one server shares: the table, the limits, the clock."""

    def __init__(self, limits: ConnectionLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.table = ConnectionTable(limits)
        self.clock = clock
        self.protocols: dict[int, GuardedH11Protocol] = {}
        self.refused_open = 0  # refused connections still answering; bounded by connections_max
        self._next_id = 0
        # A line per close the guard makes, at most once an interval per reason (a client
        # opening connections without end would otherwise write a line for each).
        self.close_lines = ThrottledWarnings(log, clock, keys_max=len(CloseReason), level=logging.INFO)

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def protocol_factory(self) -> type[GuardedH11Protocol]:
        """The `http=` class for `uvicorn.Config`: uvicorn builds one per connection."""
        guard = self

        class Protocol(GuardedH11Protocol):
            def __init__(
                self,
                config: UvicornConfig,
                server_state: ServerState,
                app_state: dict[str, Any],
                _loop: asyncio.AbstractEventLoop | None = None,
            ) -> None:
                super().__init__(config, server_state, app_state, _loop)
                self.guard = guard

        return Protocol


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with per-phase deadlines and the guard's admission decisions."""

    guard: ConnectionGuard

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._id = self.guard.new_id()
        self._phase = Phase.HEAD
        self._deadline: asyncio.TimerHandle | None = None
        self._overdue: CloseReason | None = None  # a deadline passed with bytes unread
        self._refused = False
        self._close_reason: CloseReason | None = None  # set by the closes that know theirs
        self._close_noted = False
        self._shutting_down = False
        self._lost = False
        self._write_deadline: asyncio.TimerHandle | None = None
        super().connection_made(_CountedTransport(transport, self._server_closes))  # type: ignore[arg-type]
        guard = self.guard
        peer = self.client[0] if self.client else ""
        admission = guard.table.admit(self._id, peer, guard.clock())
        if admission.evict is not None:
            guard.protocols[admission.evict].close_for(CloseReason.EVICTED)
            assert admission.evict not in guard.protocols, admission.evict
        if admission.admitted:
            guard.protocols[self._id] = self
        elif guard.refused_open >= guard.limits.connections_max:
            self._note_close(CloseReason.REFUSED)
            self.transport.close()  # so many refused at once: no answer, just the close
            return
        else:
            self._note_close(CloseReason.REFUSED)  # its answer's close is this one
            guard.refused_open += 1
            self._refused = True
            self.app = refusing_app(self.app)
        self._arm(self.guard.limits.header_timeout_s, CloseReason.HEADER_TIMEOUT)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True  # uvicorn closes the transport here too: that close is not ours
        self._disarm()
        self._disarm_write()
        if self._refused:
            self._refused = False
            self.guard.refused_open -= 1
        elif self.guard.protocols.pop(self._id, None) is not None:
            self.guard.table.remove(self._id)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._phase is Phase.HEAD and self._deadline is None:
            # The first byte of a head on a kept-alive connection: the head has this long.
            self._arm(self.guard.limits.header_timeout_s, CloseReason.HEADER_TIMEOUT)
        phase = self._phase
        super().data_received(data)
        if self._shutting_down and self.cycle is not None:
            self.cycle.keep_alive = False  # a request read after shutdown began: the last one
        self._sync_phase()
        if self._overdue is not None and self._phase is phase:
            self.close_for(self._overdue)  # what came in late did not finish the head or body

    def handle_events(self) -> None:
        """uvicorn's parsing of what the connection holds, after what came in (`data_received`)
        or after an answer (`on_response_complete`: a pipelined request's head may be whole in
        the buffer already): a request head longer than REQUEST_HEAD_BYTES_MAX is answered 400
        before it is parsed, however the reads brought it."""
        if self.conn.their_state is h11.IDLE and head_too_long(self.conn.trailing_data[0], b""):
            self.send_400_response(f"the request head is over {REQUEST_HEAD_BYTES_MAX} bytes")
            return
        super().handle_events()

    def timeout_keep_alive_handler(self) -> None:
        """uvicorn's keep-alive expiry, unless a request has come in that the loop has not read
        yet: its head then has `header_timeout_s` from now, as if its first byte were read."""
        self.timeout_keep_alive_task = None
        if self.transport.is_closing():
            return
        if unread_bytes(self.transport):
            self._arm(self.guard.limits.header_timeout_s, CloseReason.HEADER_TIMEOUT)
            return
        self._close_reason = CloseReason.KEEPALIVE_TIMEOUT
        super().timeout_keep_alive_handler()

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: an idle connection is closed now, a busy one after its
        answer; and one whose next request is in but unread, after that request's answer."""
        self._shutting_down = True  # closes from now on are shutdown's, now or after the answer
        idle = self.cycle is None or self.cycle.response_complete
        if idle and not self.transport.is_closing() and unread_bytes(self.transport):
            return  # data_received reads it, and marks its answer the last
        super().shutdown()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._sync_phase()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 cannot parse, as the documented JSON error. A body
        that is not HTTP (a bad chunk size) comes after a head the app has started on: unless
        its answer is under way, this 400 is the request's one answer, and the app is told so
        (it sends and counts nothing else)."""
        self._close_reason = CloseReason.MALFORMED_REQUEST
        cycle = self.cycle
        if cycle is not None and not cycle.response_started and not cycle.disconnected:
            cycle.scope[PROTOCOL_ANSWER_KEY] = 400  # type: ignore[literal-required]
            cycle.disconnected = True  # its sends are dropped; its reads end
            cycle.message_event.set()
        body = error_bytes("malformed_request", f"invalid HTTP request: {msg}")
        headers = [
            (b"content-type", b"application/json"),
            (b"connection", b"close"),
            (b"content-length", str(len(body)).encode()),
        ]
        try:
            output = self.conn.send(h11.Response(status_code=400, headers=headers, reason=b"Bad Request"))
            output += self.conn.send(h11.Data(data=body))
            output += self.conn.send(h11.EndOfMessage())
        except h11.LocalProtocolError:  # a response was already under way: only the close
            output = None
        if output:
            self.transport.write(output)
        self.transport.close()

    def close_for(self, reason: CloseReason) -> None:
        """Close at once; the connection leaves the table now, not when the loop reports it
        lost, so its slot is free for the connection that evicted it."""
        self._disarm()
        if self.guard.protocols.pop(self._id, None) is not None:
            self.guard.table.remove(self._id)
        if self.transport.is_closing():
            return
        peer = f"{self.client[0]}:{self.client[1]}" if self.client else "?"
        self.guard.close_lines.warn(
            reason, "closing HTTP connection from %s: %s (phase %s)", peer, reason.value, self._phase.value
        )
        self._close_reason = reason
        self.transport.close()

    # ------------------------------------------------------------------ counting closes

    def _server_closes(self) -> None:
        """Every close of the transport comes here first; the server's own are counted once."""
        if self._lost or self._close_noted or self.transport.is_closing():
            return  # the client's close, or one already counted
        self._note_close(self._close_reason or self._implied_close_reason())

    def _note_close(self, reason: CloseReason) -> None:
        assert not self._close_noted, reason
        self._close_noted = True
        self.guard.table.note_closed(reason)

    def _implied_close_reason(self) -> CloseReason:
        """The reason of a close uvicorn makes at the end of an answer or after an app failure."""
        if self._shutting_down:
            return CloseReason.SHUTDOWN
        scope = self.scope
        if scope is not None and (
            scope["http_version"] == "1.0"
            or any(
                name == b"connection" and b"close" in (token.strip() for token in value.lower().split(b","))
                for name, value in scope["headers"]
            )
        ):
            return CloseReason.CLOSE_REQUESTED
        return CloseReason.APP_ERROR

    # ------------------------------------------------------------------ phases and deadlines

    def _sync_phase(self) -> None:
        if self.transport.is_closing() or self._id not in self.guard.protocols and not self._refused:
            return
        cycle = self.cycle
        phase = phase_of(self.conn.their_state, None if cycle is None else cycle.response_complete)
        if phase is self._phase:
            return
        self._phase = phase
        if not self._refused:
            self.guard.table.enter(self._id, phase, self.guard.clock())
        self._disarm()
        self._overdue = None  # whatever a passed deadline waited for is done
        if phase is Phase.BODY:
            self._arm(self.guard.limits.body_timeout_s, CloseReason.BODY_TIMEOUT)
        # HEAD after a response: uvicorn's keep-alive timer bounds the idle wait, and the
        # head's first byte arms the header deadline (data_received). APP: no deadline.

    def _arm(self, delay_s: float, reason: CloseReason) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(delay_s, self._deadline_passed, delay_s, reason)

    def _deadline_passed(self, delay_s: float, reason: CloseReason) -> None:
        self._deadline = None
        if self._overdue is None and unread_bytes(self.transport):
            # The loop is late: bytes are in that may complete what the deadline waits for.
            # Judge once they are read (data_received), or after one more period at the latest.
            self._arm(delay_s, reason)
            self._overdue = reason
            return
        self.close_for(reason)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    # ------------------------------------------------------------------ answers not taken

    def pause_writing(self) -> None:
        """The transport's buffer is full (the client is not reading): the client has
        `body_timeout_s` to take some of it, or the connection is closed."""
        super().pause_writing()
        self._disarm_write()
        self._write_deadline = self.loop.call_later(self.guard.limits.body_timeout_s, self._write_timed_out)

    def resume_writing(self) -> None:
        self._disarm_write()
        super().resume_writing()

    def _write_timed_out(self) -> None:
        self._write_deadline = None
        self.close_for(CloseReason.WRITE_TIMEOUT)
        self.transport.abort()  # what is buffered goes: a close would wait to send it

    def _disarm_write(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None
