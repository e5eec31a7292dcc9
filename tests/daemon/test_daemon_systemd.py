"""The systemd unit passes `systemd-analyze verify`, keeps its promises (notify, watchdog,
hardening), and the notify client speaks the protocol (abstract sockets, watchdog ownership)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import anyio
import pytest

from levelzero.daemon.systemd import Notifier, watchdog_interval_s

UNIT = Path(__file__).resolve().parents[2] / "levelzero" / "deploy" / "levelzero.service"


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def unit_as_installed_here(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at this environment's `levelzero` (the only one that
    exists on a test machine; /opt/levelzero is what packaging/install.sh creates)."""
    program = Path(sys.executable).parent / "levelzero"
    assert program.exists(), program
    text = UNIT.read_text().replace("ExecStart=/opt/levelzero/bin/levelzero ", f"ExecStart={program} ")
    assert str(program) in text
    path = tmp_path / "levelzero.service"
    path.write_text(text)
    return path


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_unit_passes_systemd_analyze_verify_and_security(tmp_path: Path) -> None:
    unit = unit_as_installed_here(tmp_path)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and result.stdout == ""
    security = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--threshold=20", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert security.returncode == 0, security.stdout + security.stderr
    assert "Overall exposure level for levelzero.service: 1." in security.stdout


def test_unit_declares_notify_watchdog_user_and_hardening() -> None:
    s = unit_settings()
    expected = {
        "Type": "notify",
        "NotifyAccess": "main",
        "WatchdogSec": "30",
        "Restart": "on-failure",
        "StateDirectory": "levelzero",
        "DynamicUser": "yes",
        "KillSignal": "SIGTERM",
        "EnvironmentFile": "-/etc/levelzero/levelzero.env",
        "ProtectSystem": "strict",
        "NoNewPrivileges": "yes",
        "PrivateTmp": "yes",
        "ProtectHome": "yes",
        "CapabilityBoundingSet": "",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
        "ProtectKernelTunables": "yes",
        "ReadWritePaths": "/var/lib/levelzero",
        "RestartPreventExitStatus": "2",
    }
    for key, value in expected.items():
        assert value in s.get(key, []), (key, s.get(key))
    assert "@system-service" in s["SystemCallFilter"]
    [exec_start] = s["ExecStart"]
    # The program is the /opt/levelzero venv's (packaging/install.sh); the TOML alone names the
    # data directory: no flag overrides it behind the operator's back.
    assert exec_start == "/opt/levelzero/bin/levelzero run --config /etc/levelzero/levelzero.toml"
    assert s["LogsDirectory"] == ["levelzero"] and s["StateDirectory"] == ["levelzero"]
    # Replay extends the start timeout itself (EXTEND_TIMEOUT_USEC): the unit's own stays short.
    assert int(s["TimeoutStartSec"][0]) <= 120
    # The daemon must finish its own bounded shutdown (30 s by default) before systemd kills it.
    assert int(s["TimeoutStopSec"][0]) > 30


def test_without_notify_socket_everything_is_a_no_op() -> None:
    notifier = Notifier(environ={})
    assert not notifier.enabled
    assert notifier.ready("x") is False and notifier.watchdog() is False and notifier.sent == 0


def test_watchdog_interval_is_half_the_timeout_and_only_for_our_pid() -> None:
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000"}, pid=5) == 15.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": "5"}, pid=5) == 0.1
    assert watchdog_interval_s({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": "6"}, pid=5) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "0"}, pid=5) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "junk"}, pid=5) is None
    assert watchdog_interval_s({}, pid=5) is None


def receive_all(sock: socket.socket) -> list[str]:
    out = []
    sock.setblocking(False)
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


def test_messages_reach_an_abstract_socket() -> None:
    name = f"levelzero-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        notifier = Notifier(environ={"NOTIFY_SOCKET": f"@{name}"})
        assert notifier.ready("serving") and notifier.status("busy") and notifier.stopping()
        notifier.close()
        assert receive_all(sock) == [
            f"READY=1\nSTATUS=serving\nMAINPID={os.getpid()}",
            "STATUS=busy",
            "STOPPING=1\nSTATUS=stopping",
        ]


def test_messages_reach_a_path_socket(tmp_path: Path) -> None:
    path = tmp_path / "n.sock"
    if len(str(path)) >= 100:
        pytest.skip(f"temp path too long for a unix socket: {path}")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        notifier = Notifier(environ={"NOTIFY_SOCKET": str(path)})
        assert notifier.watchdog()
        assert receive_all(sock) == ["WATCHDOG=1"]


def test_a_missing_socket_is_logged_once_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    notifier = Notifier(environ={"NOTIFY_SOCKET": f"@levelzero-nobody-{uuid.uuid4().hex}"})
    assert notifier.ready("x") is False and notifier.watchdog() is False
    assert caplog.text.count("cannot notify systemd") == 1


async def test_start_timeout_is_extended_until_cancelled() -> None:
    name = f"levelzero-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        notifier = Notifier(environ={"NOTIFY_SOCKET": f"@{name}"})
        async with anyio.create_task_group() as tg:
            await tg.start(notifier.extend_start_timeout, 0.01, 5.0)
            with anyio.fail_after(10):
                while notifier.sent < 2:
                    await anyio.sleep(0.005)
            tg.cancel_scope.cancel()
        assert receive_all(sock)[:2] == ["EXTEND_TIMEOUT_USEC=5000000"] * 2


async def test_watchdog_task_pings_until_cancelled() -> None:
    name = f"levelzero-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        notifier = Notifier(environ={"NOTIFY_SOCKET": f"@{name}", "WATCHDOG_USEC": "20000"})
        async with anyio.create_task_group() as tg:
            await tg.start(notifier.run_watchdog)
            with anyio.fail_after(10):
                while notifier.sent < 3:
                    await anyio.sleep(0.005)
            tg.cancel_scope.cancel()
        assert receive_all(sock)[:3] == ["WATCHDOG=1"] * 3
