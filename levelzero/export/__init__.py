"""Parquet export of a levelzero store and its PySpark analysis (never on the daemon's hot path).

- `export(db_path, out_dir)`: incremental, consistent, read-only export (`export.py`);
  table schemas in `SCHEMAS` (`schemas.py`, documented in `SCHEMAS.md`).
- `analyze(in_dirs, out_dir)`: Spark job writing report.html, plots and result tables
  (`analyze.py`, `report.py`); needs Java 17+. PySpark and matplotlib load only when it runs.
- `export_main(argv)` / `analyze_main(argv)`: the `levelzero export|analyze` commands (`cli.py`).

Importing this package imports pyarrow (the export and the schemas need it), nothing heavier.
"""

from __future__ import annotations

# The functions shadow their same-named modules as package attributes, on purpose:
# `from levelzero.export import export, analyze` gives the functions.
from .analyze import AnalysisReport, analyze
from .cli import analyze_main, export_main
from .errors import AnalysisError, ExportError, JavaNotFound
from .export import ExportProgress, ExportReport, db_path_in, export
from .schemas import SCHEMAS, TABLES

__all__ = [
    "SCHEMAS",
    "TABLES",
    "AnalysisError",
    "AnalysisReport",
    "ExportError",
    "ExportProgress",
    "ExportReport",
    "JavaNotFound",
    "analyze",
    "analyze_main",
    "db_path_in",
    "export",
    "export_main",
]
