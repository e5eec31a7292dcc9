"""The driver script for `spark-submit`: `levelzero analyze` under spark-submit's session.

    spark-submit --master spark://host:7077 --conf spark.sql.shuffle.partitions=64 \\
        "$(python -m levelzero.export.submit --path)" --in file:///shared/export \\
        --out file:///shared/report

spark-submit runs this file by path on the driver (where levelzero is installed); the
analysis uses spark-submit's master and settings as they are. Executors need nothing of
levelzero: the jobs are DataFrame expressions, no Python function runs on them.
`python -m levelzero.export.submit --path` prints this file's path.
"""

from __future__ import annotations

import os
import sys

# Run by path, this file's directory is first on sys.path: its modules must not shadow others.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

from levelzero.export.cli import analyze_main  # noqa: E402 - after the sys.path fix above


def main(argv: list[str]) -> int:
    if argv == ["--path"]:
        print(__file__)
        return 0
    return analyze_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
