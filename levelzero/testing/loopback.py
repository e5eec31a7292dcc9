"""Free TCP ports on 127.0.0.1 for servers that a process starts as children: the throwaway
PostgreSQL and moto servers, the nodes of a local cluster, test daemons.

A port from `bind(("127.0.0.1", 0))` is free when the probe closes, but it lies in the kernel's
ephemeral range, where any outgoing connection opened meanwhile (by the child servers starting
beside it, their connection pools, a readiness poll) may take it as its local port before the
child binds it; the child then fails with "address already in use". So the port is drawn at
random below the ephemeral range, which `connect` never uses, and checked with a bind; where the
range leaves no room below it, `bind(0)` is the fallback.
"""

from __future__ import annotations

import random
import socket

LOWEST_PORT = 10_000
DRAWS_MAX = 200
DEFAULT_EPHEMERAL_LOW = 32_768
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (Linux's default where unreadable)."""
    try:
        with open(EPHEMERAL_RANGE_FILE, encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_local_port() -> int:
    """A port nothing listens on, outside the range outgoing connections take theirs from."""
    high = ephemeral_low() - 1
    if high > LOWEST_PORT:
        draw = random.SystemRandom()
        for _ in range(DRAWS_MAX):
            port = draw.randint(LOWEST_PORT, high)
            if _bindable(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
