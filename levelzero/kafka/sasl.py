"""SASL on the Kafka listener: PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512, as Kafka runs them.

SaslHandshake names the mechanism (and lists the ones served); SaslAuthenticate carries the
mechanism's messages: one for PLAIN (`\\0user\\0password`), two round trips for SCRAM (RFC 5802,
RFC 7677; client-first / server-first, then client-final / server-final), as Kafka's
ScramSaslServer exchanges them. Every mechanism takes any user name and the daemon's token as
the password, as the HTTP API takes the token as bearer. The SCRAM messages are scramp's (a
well-kept implementation of the RFCs); the listener keeps only the salted credentials it
derives from the token at start (a random salt per mechanism, Kafka's 4,096 iterations), so a
SCRAM exchange never handles the password itself.

A failed exchange (a wrong password, a malformed message, a SCRAM message out of turn) is
answered SASL_AUTHENTICATION_FAILED (ILLEGAL_SASL_STATE without a handshake) and the listener
then closes the connection, as Kafka does; a warning says so, at most one every 10 s (a
misconfigured client reconnects every few tens of milliseconds), with the count of those held
back (`core.throttled_warning`).

Without a token the listener is what Kafka calls PLAINTEXT: it does not speak SASL. As Kafka's
broker answers there, SaslHandshake and SaslAuthenticate are ILLEGAL_SASL_STATE, whatever the
mechanism (no password is taken, nor refused as a wrong one: the client's setting is what is
wrong).
"""

from __future__ import annotations

import hmac
import logging
import time
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode
from scramp import ScramException, ScramMechanism

from levelzero.core.throttled_warning import ThrottledWarning

log = logging.getLogger("levelzero.kafka")

PLAIN = "PLAIN"
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
MECHANISMS = (PLAIN, *SCRAM_MECHANISMS)
# Kafka's minimum (and its tools' default) iteration count for both SCRAM mechanisms.
SCRAM_ITERATIONS = 4096
NO_SASL = (
    "this Kafka listener does not use SASL (the daemon has no server.token): connect with "
    "security.protocol=PLAINTEXT (or SSL with kafka.tls_cert_file)"
)


@dataclass(frozen=True, slots=True)
class Step:
    """One SaslAuthenticate answer: `done` once the connection is authenticated; an error
    closes the connection after the answer."""

    error: ErrorCode
    message: str | None = None
    auth_bytes: bytes = b""
    done: bool = False


class SaslState:
    """One connection's exchange: the mechanism its handshake named, and a SCRAM exchange
    under way."""

    __slots__ = ("mechanism", "peer", "scram")

    def __init__(self, peer: str = "?") -> None:
        self.peer = peer  # "host:port", as log lines name the connection
        self.mechanism: str | None = None
        self.scram: Any = None  # scramp's ScramServer between client-first and client-final


class SaslAuthenticator:
    """The listener's mechanisms, checking the token; with no token, none (see the module)."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()
        self._scram = {name: ScramMechanism(name) for name in SCRAM_MECHANISMS}
        # (salt, stored key, server key, iterations) per mechanism; none without a token (no
        # SASL is spoken then)
        self._credentials = {
            name: mechanism.make_auth_info(token, iteration_count=SCRAM_ITERATIONS)
            for name, mechanism in self._scram.items()
            if token
        }
        self._failures = ThrottledWarning(log, time.monotonic)

    @property
    def served(self) -> bool:
        """Whether the listener speaks SASL (it has a token)."""
        return bool(self._token)

    def handshake(self, state: SaslState, mechanism: str) -> ErrorCode:
        """SaslHandshake's answer: none when the mechanism is served (then the next
        SaslAuthenticate speaks it)."""
        if not self.served:
            self._failures.warn("kafka: a client at %s asked for SASL/%s; %s", state.peer, mechanism, NO_SASL)
            return ErrorCode.illegal_sasl_state
        if mechanism not in MECHANISMS:
            return ErrorCode.unsupported_sasl_mechanism
        state.mechanism, state.scram = mechanism, None
        return ErrorCode.none

    def authenticate(self, state: SaslState, auth_bytes: bytes) -> Step:
        mechanism = state.mechanism
        if not self.served:
            return Step(ErrorCode.illegal_sasl_state, NO_SASL)
        if mechanism is None:
            return Step(ErrorCode.illegal_sasl_state, "SaslHandshake comes first")
        if mechanism == PLAIN:
            parts = auth_bytes.split(b"\0")
            password = parts[2] if len(parts) == 3 else b""
            if not hmac.compare_digest(password, self._token):
                return self._failed(state, mechanism, "a wrong password")
            return Step(ErrorCode.none, done=True)
        try:
            text = auth_bytes.decode()
            if state.scram is None:  # client-first: answer server-first
                server = self._scram[mechanism].make_server(lambda _user: self._credentials[mechanism])
                server.set_client_first(text)
                state.scram = server
                return Step(ErrorCode.none, auth_bytes=server.get_server_first().encode())
            server, state.scram = state.scram, None  # client-final: verify the proof
            server.set_client_final(text)
            return Step(ErrorCode.none, auth_bytes=server.get_server_final().encode(), done=True)
        except (ScramException, ValueError, KeyError) as exc:
            # scramp's errors, and what malformed input raises in parsing (not UTF-8, a
            # message without the attributes it needs)
            state.scram = None
            return self._failed(state, mechanism, str(exc) or type(exc).__name__)

    def _failed(self, state: SaslState, mechanism: str, why: str) -> Step:
        self._failures.warn(
            "kafka: SASL/%s authentication failed (%s); closing the connection from %s",
            mechanism,
            why,
            state.peer,
        )
        return Step(
            ErrorCode.sasl_authentication_failed,
            f"Authentication failed: invalid credentials with SASL mechanism {mechanism} "
            "(any user name, the daemon's token as password)",
        )
