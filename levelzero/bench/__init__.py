"""The benchmark suite: `levelzero bench` / `python -m levelzero.bench` / `make bench`.

Each item measures the system under test beside its floor in the same run (interleaved
rounds, medians) and reports the ratio; see `levelzero.bench.cli` and BENCHMARKS.md.
"""

from .cli import ITEM_NAMES, add_arguments, build_parser, main, run

__all__ = ["ITEM_NAMES", "add_arguments", "build_parser", "main", "run"]
