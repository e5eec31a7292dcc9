"""systemd's notify protocol, with no dependency: one datagram per message to $NOTIFY_SOCKET.

`Type=notify` units learn from us when start-up is complete (`READY=1`, sent only once the HTTP
listener serves), what we are doing (`STATUS=`), that we are stopping (`STOPPING=1`), and that the
event loop is alive (`WATCHDOG=1`, every `WATCHDOG_USEC / 2`). The watchdog pings come from a task
on the event loop on purpose: a loop that is stuck stops pinging, and systemd restarts us.

Outside systemd (no NOTIFY_SOCKET) every call is a cheap no-op, so the daemon code never asks
"am I under systemd?".
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

import anyio
import anyio.abc

log = logging.getLogger("levelzero.systemd")

WATCHDOG_INTERVAL_MIN_S = 0.01  # a tiny WATCHDOG_USEC must not turn into a busy loop
# While start-up replays the partition logs, every START_EXTEND_INTERVAL_S the daemon asks
# systemd for START_EXTEND_BY_S more (EXTEND_TIMEOUT_USEC): a long replay outlives the unit's
# TimeoutStartSec, a stuck event loop stops asking and is killed within START_EXTEND_BY_S.
START_EXTEND_INTERVAL_S = 10.0
START_EXTEND_BY_S = 30.0


def _socket_address(raw: str) -> str | bytes:
    """`@name` is an abstract-namespace socket: a leading NUL byte on Linux."""
    if raw.startswith("@"):
        return b"\0" + raw[1:].encode()
    return raw


def watchdog_interval_s(environ: Mapping[str, str], pid: int) -> float | None:
    """Half the watchdog timeout systemd gave us, or None when no watchdog is meant for us."""
    usec = environ.get("WATCHDOG_USEC", "")
    watchdog_pid = environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if watchdog_pid and (not watchdog_pid.isdigit() or int(watchdog_pid) != pid):
        return None  # the watchdog belongs to another process (our parent, say)
    return max(int(usec) / 1_000_000 / 2, WATCHDOG_INTERVAL_MIN_S)


class Notifier:
    """Sends sd_notify messages; a no-op without $NOTIFY_SOCKET. Never raises on send."""

    def __init__(self, environ: Mapping[str, str] | None = None, pid: int | None = None) -> None:
        env = os.environ if environ is None else environ
        raw = env.get("NOTIFY_SOCKET", "")
        self._address: str | bytes | None = _socket_address(raw) if raw else None
        self.watchdog_interval_s = watchdog_interval_s(env, os.getpid() if pid is None else pid)
        self._socket: socket.socket | None = None
        self._warned = False
        self.sent = 0

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, *lines: str) -> bool:
        """Send one message made of `KEY=value` lines. Returns whether it was sent."""
        if self._address is None:
            return False
        assert lines and all("\n" not in line and "=" in line for line in lines), lines
        try:
            if self._socket is None:
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._socket.setblocking(False)
            self._socket.sendto("\n".join(lines).encode(), self._address)
        except OSError as exc:
            if not self._warned:  # once: a broken notify socket must not flood the log
                self._warned = True
                log.warning("cannot notify systemd at $NOTIFY_SOCKET: %s", exc)
            return False
        self.sent += 1
        return True

    def ready(self, status: str) -> bool:
        return self.notify("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def status(self, status: str) -> bool:
        return self.notify(f"STATUS={status}")

    def stopping(self, status: str = "stopping") -> bool:
        return self.notify("STOPPING=1", f"STATUS={status}")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def extend_timeout(self, seconds: float) -> bool:
        """The current start-up (or stop) may take `seconds` more from now."""
        assert seconds > 0, seconds
        return self.notify(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}")

    async def extend_start_timeout(
        self,
        interval_s: float = START_EXTEND_INTERVAL_S,
        extend_by_s: float = START_EXTEND_BY_S,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Extend the start timeout at once and then every `interval_s` until cancelled."""
        assert 0 < interval_s < extend_by_s, (interval_s, extend_by_s)
        task_status.started()
        if not self.enabled:
            return
        while True:
            self.extend_timeout(extend_by_s)
            await anyio.sleep(interval_s)

    async def run_watchdog(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Ping every WATCHDOG_USEC / 2 until cancelled; returns at once without a watchdog."""
        task_status.started()
        if not self.enabled or self.watchdog_interval_s is None:
            return
        while True:
            self.watchdog()
            await anyio.sleep(self.watchdog_interval_s)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
