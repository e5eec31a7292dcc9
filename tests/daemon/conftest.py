"""Fixtures of the daemon tests; the helpers behind them live in tests/daemon_support.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from collections.abc import Mapping
from typing import Any

import pytest

from daemon_support import DaemonProcess


@pytest.fixture
def daemon_process(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A started daemon subprocess on tmp_path/data; killed at teardown if still running."""
    process = DaemonProcess(tmp_path / "data", tmp_path)
    try:
        yield process.start()
    finally:
        process.cleanup()


@pytest.fixture
def make_daemon_process(tmp_path: Path) -> Iterator[Any]:
    """Factory for daemon subprocesses with extra environment (not started)."""
    made: list[DaemonProcess] = []

    def make(env: Mapping[str, str] | None = None, name: str = "data") -> DaemonProcess:
        made.append(DaemonProcess(tmp_path / name, tmp_path, env))
        return made[-1]

    try:
        yield make
    finally:
        for process in made:
            process.cleanup()
