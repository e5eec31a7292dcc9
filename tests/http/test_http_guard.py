"""The connection table's admission and eviction rules, driven synchronously (no sockets)."""

from __future__ import annotations

import h11
import pytest

from levelzero.http.guard import (
    Admission,
    CloseReason,
    ConnectionLimits,
    ConnectionTable,
    Phase,
    phase_of,
)


def table(connections_max: int = 4, per_peer: int = 4) -> ConnectionTable:
    return ConnectionTable(
        ConnectionLimits(connections_max, per_peer, header_timeout_s=1.0, body_timeout_s=1.0)
    )


def test_room_admits_without_eviction() -> None:
    t = table()
    assert [t.admit(n, "a", now=n) for n in range(4)] == [Admission(True)] * 4
    assert len(t) == 4 and t.phase(0) is Phase.HEAD


def test_at_the_limit_the_longest_waiting_head_goes_first_then_a_body_never_an_app() -> None:
    t = table(connections_max=3)
    for conn in range(3):
        t.admit(conn, "a", now=conn)
    t.enter(0, Phase.APP, now=10)
    t.enter(1, Phase.BODY, now=11)
    # conn 2 waits for a head since t=2: the cheapest to lose.
    assert t.admit(3, "b", now=20) == Admission(True, evict=2)
    t.remove(2)
    t.enter(3, Phase.APP, now=21)
    assert t.admit(4, "b", now=22) == Admission(True, evict=1)  # a stalled body next
    t.remove(1)
    t.enter(4, Phase.APP, now=23)
    assert t.admit(5, "c", now=24) == Admission(False)  # all busy in the app: refused
    assert len(t) == 3


def test_the_peer_holding_the_most_connections_loses_one_first() -> None:
    t = table(connections_max=4)
    t.admit(1, "light", now=0)  # the oldest idle connection, but its peer holds only one
    for conn in (2, 3, 4):
        t.admit(conn, "hog", now=conn)
    assert t.admit(5, "new", now=9) == Admission(True, evict=2)


def test_a_peer_at_its_own_limit_evicts_its_own_or_is_refused() -> None:
    t = table(connections_max=10, per_peer=2)
    t.admit(1, "other", now=0)
    t.admit(2, "a", now=1)
    t.admit(3, "a", now=2)
    assert t.admit(4, "a", now=3) == Admission(True, evict=2)  # never "other"'s connection
    t.remove(2)
    t.enter(3, Phase.APP, now=4)
    t.enter(4, Phase.APP, now=5)
    assert t.admit(5, "a", now=6) == Admission(False)
    assert t.admit(6, "b", now=7) == Admission(True)  # another peer still gets in


def test_statistics_count_phases_peers_and_closes() -> None:
    t = table()
    t.admit(1, "a", now=0)
    t.admit(2, "b", now=0)
    t.enter(2, Phase.BODY, now=1)
    t.note_closed(CloseReason.HEADER_TIMEOUT)
    stats = t.statistics()
    assert (stats.connections, stats.peers) == (2, 2)
    assert stats.by_phase == {"head": 1, "body": 1, "app": 0}
    assert stats.closed["header_timeout"] == 1 and stats.closed["evicted"] == 0
    t.remove(1)
    t.remove(1)  # removing twice (evicted, then reported lost) is harmless
    assert t.statistics().peers == 1


@pytest.mark.parametrize(
    ("their_state", "response_complete", "phase"),
    [
        (h11.IDLE, None, Phase.HEAD),  # no request yet
        (h11.SEND_BODY, False, Phase.BODY),
        (h11.SEND_BODY, True, Phase.BODY),  # answered early (413), the body still arriving
        (h11.DONE, False, Phase.APP),
        (h11.MUST_CLOSE, False, Phase.APP),
        (h11.DONE, True, Phase.HEAD),  # answered; the next request is awaited
        (h11.IDLE, True, Phase.HEAD),
    ],
)
def test_phase_follows_h11_and_the_response(
    their_state: object, response_complete: bool | None, phase: Phase
) -> None:
    assert phase_of(their_state, response_complete) is phase
