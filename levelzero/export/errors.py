"""Operating errors of the export and the analysis: each says what is wrong and what to do."""

from __future__ import annotations

from levelzero.core.errors import LevelZeroError


class ExportError(LevelZeroError):
    """The export cannot run: missing or foreign database, unusable output directory."""

    code = "export_error"


class AnalysisError(LevelZeroError):
    """The analysis cannot run: missing, empty or malformed input, or Spark failed."""

    code = "analysis_error"


class JavaNotFound(AnalysisError):
    """Spark needs a Java runtime, and there is none (or too old a one)."""

    code = "java_not_found"
