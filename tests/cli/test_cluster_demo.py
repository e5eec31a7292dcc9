"""`levelzero demo --nodes 3`: the local cluster demo runs end to end on a throwaway PostgreSQL
(a crash, a rolling restart, every record read back through every node, no L0 object left) and
says so; bad arguments are usage errors."""

from __future__ import annotations

import subprocess
import sys

from daemon_support import clean_environ


def demo(*args: str, timeout_s: float = 300.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "levelzero.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=clean_environ(),
    )


def test_the_three_node_demo_keeps_every_record_through_a_crash_and_a_rolling_restart(
    postgres_dsn: str,
) -> None:
    done = demo("--nodes", "3", "--duration", "12", "--producers", "4")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    out = done.stdout
    assert "levelzero demo --nodes 3: OK" in out
    assert "SIGKILL n3" in out and "every partition took writes again" in out
    assert out.count("stopped gracefully (exit 0) and started again") == 3
    assert "offsets acknowledged twice                   0" in out
    assert "L0 objects left at quiescence                0" in out


def test_demo_arguments_are_checked() -> None:
    for args in (
        ["--nodes", "0"],
        ["--nodes", "9"],
        ["--nodes", "3", "--producers", "0"],
        ["--nodes", "3", "--data-dir", "/tmp/x"],  # noqa: S108 (refused before any use)
    ):
        done = demo(*args, timeout_s=60)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr
