"""The wider sweeps folded into levelzero/bench run as modules (no script path tricks)."""

from __future__ import annotations

import subprocess
import sys


def test_log_store_sweep_prints_a_row_per_batch_size() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "levelzero.bench.sweep_log_store",
            "--seconds",
            "0.05",
            "--rounds",
            "1",
            "--appenders",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    rows = [line for line in done.stdout.splitlines() if "|" in line and line.split("|")[0].strip().isdigit()]
    assert [int(row.split("|")[0]) for row in rows] == [1, 10, 100]
    for row in rows:
        raw = int(row.split("|")[1].strip().replace(",", ""))
        assert raw > 0


def test_every_sweep_answers_help() -> None:
    for name in ("sweep_actors", "sweep_gc", "sweep_log_store"):
        done = subprocess.run(
            [sys.executable, "-m", f"levelzero.bench.{name}", "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert done.stdout.startswith("usage:")
