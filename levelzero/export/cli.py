"""`levelzero export` and `levelzero analyze`: argument parsing, progress and exit codes.

    levelzero export (--data-dir DIR | --db FILE) --out DIR [--quiet]
    levelzero export (--data-dir DIR | --config FILE) --out DIR --records TOPIC
    levelzero analyze --in DIR [--in DIR ...] --out REPORT_DIR [--master URL]
                      [--conf KEY=VALUE ...] [--bucket-s S]

The export's DIR is a local path or file:// URI; the analysis's may be any URI Spark has a
filesystem for (s3a:// with hadoop-aws, hdfs://, ...). Under spark-submit, run `submit.py`
(same arguments).

Both return an exit code instead of exiting: 0 done, 1 failed (one line on stderr, no
traceback), 2 bad usage, 130 interrupted. The `levelzero` command forwards its arguments here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from levelzero.core.errors import LevelZeroError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
PROGRESS_INTERVAL_S = 1.0


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace | int:
    try:
        return parser.parse_args(list(argv))
    except SystemExit as exit_:  # --help (0) or a usage error (2, message already printed)
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE


def _fail(prog: str, message: str) -> int:
    print(f"{prog}: {message}", file=sys.stderr)
    return EXIT_FAILED


class _ProgressPrinter:
    """One stderr line per table when it is done, and at most one a second while it runs."""

    def __init__(self, prog: str) -> None:
        self._prog = prog
        self._last_at = time.monotonic()

    def __call__(self, progress) -> None:  # noqa: ANN001 - ExportProgress
        now = time.monotonic()
        if progress.done or now - self._last_at >= PROGRESS_INTERVAL_S:
            self._last_at = now
            state = "done" if progress.done else "..."
            line = f"{self._prog}: {progress.table}: {progress.rows:,} rows {state}"
            print(line, file=sys.stderr)


def export_main(argv: Sequence[str]) -> int:
    prog = "levelzero export"
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Export a levelzero store to date-partitioned Parquet, adding only rows "
        "not exported before. Safe while the daemon runs (read-only, no lock).",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data-dir", metavar="DIR", help="the daemon's data directory")
    source.add_argument("--db", metavar="FILE", help="the store's SQLite file (levelzero.db)")
    source.add_argument(
        "--config",
        metavar="FILE",
        help="the daemon's TOML file (with its LEVELZERO_* environment): its control plane, and "
        "for --records its object store (local or S3)",
    )
    source.add_argument(
        "--dsn",
        metavar="DSN",
        help="a PostgreSQL control plane, postgresql://USER@HOST:PORT/DB (no password in it: "
        "LEVELZERO_CONTROL_PASSWORD or PGPASSWORD)",
    )
    parser.add_argument("--out", metavar="DIR", required=True, help="export directory")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.add_argument(
        "--records",
        metavar="TOPIC",
        help="write TOPIC's records (from L1 and L0 objects) to OUT/records/TOPIC.parquet "
        "instead of the tables (needs --data-dir or --config)",
    )
    args = _parse(parser, argv)
    if isinstance(args, int):
        return args
    if args.records is not None:
        return _export_records(prog, args)

    from .errors import ExportError
    from .export import db_path_in, export  # pyarrow only when exporting
    from .locations import local_path

    db_path = db_path_in(args.data_dir) if args.data_dir else args.dsn or args.db
    if args.dsn and not args.dsn.startswith(("postgresql://", "postgres://")):
        return _fail(prog, "--dsn must start with postgresql://")
    password = os.environ.get("LEVELZERO_CONTROL_PASSWORD") or None
    try:
        if args.config:
            from .spark_source import store_config

            config = store_config(config_path=args.config)
            if config.control.kind == "postgres":
                db_path, password = config.control.dsn, config.control.read_password()
            else:
                db_path = config.storage.db_path
        out = local_path(args.out, "output directory", ExportError)
        report = export(
            db_path, out, progress=None if args.quiet else _ProgressPrinter(prog), password=password
        )
    except LevelZeroError as error:
        return _fail(prog, str(error))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    print(report.summary())
    for warning in report.warnings:
        print(f"{prog}: warning: {warning}", file=sys.stderr)
    return EXIT_OK


def _export_records(prog: str, args: argparse.Namespace) -> int:
    if not (args.data_dir or args.config):
        print(
            f"{prog}: error: --records needs --data-dir or --config (where the objects are)", file=sys.stderr
        )
        return EXIT_USAGE
    from .errors import ExportError
    from .locations import local_path
    from .records import export_records
    from .spark_source import store_config

    try:
        out = local_path(args.out, "output directory", ExportError)
        report = export_records(store_config(args.data_dir, args.config), out, args.records)
    except LevelZeroError as error:
        return _fail(prog, str(error))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    print(report.summary())
    return EXIT_OK


def analyze_main(argv: Sequence[str]) -> int:
    prog = "levelzero analyze"
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Analyse export directories with PySpark: GC lag, storage amplification, "
        "watermarks, fence rejections, reconciler lag, throughput. Writes report.html, plots/ "
        "and tables/ (Parquet and CSV) into the report directory. Needs Java 17+.",
    )
    parser.add_argument(
        "--in",
        dest="in_dirs",
        metavar="DIR",
        action="append",
        required=True,
        help="an export directory (repeat for several; overlapping rows are deduplicated)",
    )
    parser.add_argument("--out", metavar="REPORT_DIR", required=True, help="report directory")
    parser.add_argument(
        "--master",
        default=None,
        help="Spark master (default: spark-submit's, else local[*]); an active session is used as it is",
    )
    parser.add_argument(
        "--conf",
        dest="conf",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="a Spark setting, as spark-submit's --conf (repeat for several)",
    )
    parser.add_argument(
        "--bucket-s",
        type=float,
        default=None,
        metavar="S",
        help="time bucket in seconds (default: chosen from the time span)",
    )
    args = _parse(parser, argv)
    if isinstance(args, int):
        return args

    conf = {}
    for setting in args.conf:
        key, equals, value = setting.partition("=")
        if not (equals and key.strip()):
            print(f"{prog}: error: --conf takes KEY=VALUE, not {setting!r}", file=sys.stderr)
            return EXIT_USAGE
        conf[key.strip()] = value

    from .analyze import analyze

    try:
        report = analyze(args.in_dirs, args.out, args.master, bucket_s=args.bucket_s, conf=conf)
    except LevelZeroError as error:
        return _fail(prog, str(error))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    print(report.summary())
    return EXIT_OK
