"""`python -m levelzero.cli`: the console script's entry.

Guarded: a worker process (anyio.to_process, multiprocessing's spawn) runs the parent's
`__main__` module again under another name to initialise, and must not run the command."""

import sys

from levelzero.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
