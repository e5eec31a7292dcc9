"""`python -m levelzero.bench [--quick] [--only ITEM]`.

Guarded, with an absolute import, as `python -m levelzero.cli` is: a worker process
(anyio.to_process, which the control item's node processes use) runs the parent's `__main__`
module again as a path under another name to initialise; a relative import fails there, and
the worker must not run the benchmarks."""

import sys

from levelzero.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
