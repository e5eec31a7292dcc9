"""`python -m levelzero.sim --seeds N [--seed S] [--mutate] [--mode windowed|strict]`."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
