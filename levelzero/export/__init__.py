"""Parquet export of a levelzero store and its PySpark analysis (never on the daemon's hot path).

- `export(db_path, out_dir)`: incremental, consistent, read-only export (`export.py`);
  table schemas in `SCHEMAS` (`schemas.py`, documented in `SCHEMAS.md`).
- `analyze(in_dirs, out_dir)`: Spark job writing report.html, plots and result tables
  (`analyze.py`, `report.py`); needs Java 17+. PySpark and matplotlib load only when it runs.
- `export_main(argv)` / `analyze_main(argv)`: the `levelzero export|analyze` commands (`cli.py`).

Importing this package imports nothing: each name loads its module when first used. The Spark
data source (`spark_datasource`) is imported by every Python process Spark starts for it (a
streaming query's source process, each worker); it needs none of the export's or the analysis'
modules (pyarrow, the stores, the drivers), which took seconds of a loaded machine's time
before a streaming query's first micro-batch.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .analyze import AnalysisReport, analyze
    from .cli import analyze_main, export_main
    from .errors import AnalysisError, ExportError, JavaNotFound
    from .export import ExportProgress, ExportReport, db_path_in, export
    from .schemas import SCHEMAS, TABLES

# Each public name -> the module that defines it.
_HOMES = {
    "SCHEMAS": "schemas",
    "TABLES": "schemas",
    "AnalysisError": "errors",
    "AnalysisReport": "analyze",
    "ExportError": "errors",
    "ExportProgress": "export",
    "ExportReport": "export",
    "JavaNotFound": "errors",
    "analyze": "analyze",
    "analyze_main": "cli",
    "db_path_in": "export",
    "export": "export",
    "export_main": "cli",
}
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
assert sorted(__all__) == sorted(_HOMES), "every public name has its module"


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """The functions `export` and `analyze` shadow their same-named modules as package
    attributes, on purpose (`from levelzero.export import export, analyze` gives the functions):
    loading either module, which sets the package's attribute of its name to the module, leaves
    the function there."""

    def __setattr__(self, name: str, value: Any) -> None:
        if _HOMES.get(name) == name and isinstance(value, types.ModuleType):
            vars(self).pop(name, None)  # the function, loaded by __getattr__ when asked for
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
