"""`python -m levelzero.bench` as a worker process's parent: anyio.to_process (the control item's
node processes) runs the parent's `__main__` again, as a path under another name, to initialise
a worker. Its relative import failed there (the item's 3-node figure died with "attempted
relative import"), and it must not run the benchmarks."""

from __future__ import annotations

import runpy
from pathlib import Path

import levelzero.bench


def test_the_bench_module_entry_loads_as_a_path_and_runs_nothing() -> None:
    entry = Path(levelzero.bench.__file__).with_name("__main__.py")
    namespace = runpy.run_path(str(entry), run_name="__mp_main__")  # raised ImportError before
    assert callable(namespace["main"])
