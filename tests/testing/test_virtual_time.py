"""`in_virtual_time` runs an async test on the deterministic loop: an hour of anyio.sleep takes
no wall time, deadlines are virtual, and fixtures still reach the test."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from levelzero.testing.virtual_time import in_virtual_time


@in_virtual_time
async def test_an_hour_passes_at_once(tmp_path: Path) -> None:
    assert tmp_path.is_dir()  # fixtures are passed through
    wall, virtual = time.monotonic(), anyio.current_time()
    await anyio.sleep(3600)
    assert anyio.current_time() - virtual == pytest.approx(3600)
    assert time.monotonic() - wall < 60  # not waited for: an hour of real time would show


@in_virtual_time
async def test_a_deadline_is_virtual() -> None:
    with anyio.move_on_after(30) as scope:
        await anyio.sleep_forever()
    assert scope.cancelled_caught
    assert anyio.current_time() == pytest.approx(30)
