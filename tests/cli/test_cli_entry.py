"""`python -m levelzero.cli` as a worker process's parent: anyio.to_process and multiprocessing's
spawn run the parent's `__main__` again under another name to initialise a worker; it must not
run the command (`levelzero bench --only control`, started this way, failed with
BrokenWorkerProcess)."""

from __future__ import annotations

import runpy
from pathlib import Path

import levelzero.cli


def test_the_module_entry_runs_no_command_when_run_under_another_name() -> None:
    entry = Path(levelzero.cli.__file__).with_name("__main__.py")
    namespace = runpy.run_path(str(entry), run_name="__mp_main__")  # raised SystemExit before
    assert callable(namespace["main"])
