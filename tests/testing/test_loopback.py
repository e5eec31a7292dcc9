"""Ports for child servers come from below the kernel's ephemeral range (where no outgoing
connection can take them before the child binds them) and are free when handed out."""

from __future__ import annotations

import socket

from levelzero.testing import loopback


def test_a_port_is_free_and_below_the_ephemeral_range() -> None:
    low = loopback.ephemeral_low()
    ports = {loopback.free_local_port() for _ in range(50)}
    assert len(ports) > 40  # drawn at random, not one port over and over
    for port in ports:
        assert loopback.LOWEST_PORT <= port < low
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_handed_out(monkeypatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:  # a port free just now
            probe.bind(("127.0.0.1", 0))  # (busy + 1 may be any other process's on a shared host)
            free = probe.getsockname()[1]
        draws = iter([busy, busy, free])
        monkeypatch.setattr(loopback, "ephemeral_low", lambda: 65_000)
        monkeypatch.setattr(loopback.random.SystemRandom, "randint", lambda self, a, b: next(draws))
        assert loopback.free_local_port() == free


def test_with_no_room_below_the_ephemeral_range_the_kernel_picks(monkeypatch) -> None:
    monkeypatch.setattr(loopback, "ephemeral_low", lambda: 1024)
    port = loopback.free_local_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
