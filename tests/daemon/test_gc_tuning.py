"""`levelzero run` sets the garbage collector's thresholds (daemon/gc_tuning.py); a block can
borrow them (the benchmarks) and gets the previous ones back."""

from __future__ import annotations

import gc
import subprocess
import sys
import tempfile

from levelzero.daemon import gc_tuning


def test_tuned_gc_sets_the_daemons_thresholds_and_restores_the_previous_ones() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        with gc_tuning.tuned_gc():
            assert gc.get_threshold() == gc_tuning.THRESHOLDS
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*before)


def test_the_run_command_tunes_the_collector_before_it_starts() -> None:
    # cmd_run calls tune_gc before its event loop: checked on the function's code, in a fresh
    # process, with anyio.run replaced so that no daemon starts.
    code = (
        "import gc, anyio, sys\n"
        "from levelzero.cli import main as cli\n"
        "seen = []\n"
        "def fake_run(*a, **k):\n"
        "    seen.append(gc.get_threshold()); return True\n"
        "anyio.run = fake_run\n"
        "cli.main(['run', '--data-dir', sys.argv[1]])\n"
        "print(seen[0])\n"
    )
    with tempfile.TemporaryDirectory() as d:
        done = subprocess.run([sys.executable, "-c", code, d], capture_output=True, text=True, timeout=60)
    assert str(gc_tuning.THRESHOLDS) in done.stdout, (done.stdout, done.stderr)
