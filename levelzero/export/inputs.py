"""The analysis's inputs: export directories, checked before any Spark work.

Every check here is cheap (directory listings, manifests, Parquet footers), so a wrong path or a
foreign file fails in a second with a message naming it, instead of minutes into a Spark job.
Only files of committed exports (sequence number <= the manifest's `last_seq`, not listed as
superseded by compaction) are inputs: a crashed export's leftovers are ignored. Files the
manifest counts on and that are gone (a table's folder deleted, a copy that left some out) are
an error, as a damaged file is: their rows would be missing from every figure, silently.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from . import manifest as manifest_file
from .errors import AnalysisError, ExportError, JavaNotFound
from .filesystems import (
    MANIFEST_BYTES_MAX,
    NO_VALUES,
    Files,
    LocalFiles,
    ParquetFooter,
    is_local,
    join,
    widen,
)
from .locations import local_path
from .manifest import MANIFEST_NAME, Manifest
from .schemas import TABLES, schema_mismatch

LOCAL = LocalFiles()
JAVA_MAJOR_MIN = 17
JAVA_VERSION_TIMEOUT_S = 30.0
JAVA_HINT = (
    "Java 17 (a JRE) is required for the analysis: apt-get install openjdk-17-jre-headless "
    "(or set JAVA_HOME to a Java 17+ installation)"
)


@dataclass(frozen=True, slots=True)
class ExportInput:
    path: str
    manifest: Manifest
    files: dict[str, list[str]]  # table -> committed Parquet files, every one schema-checked
    rows: dict[str, int]  # table -> rows of those files, from their footers (no data read)
    # table -> column -> (min, max) over those files from the footers' statistics, for the
    # 64-bit integer and TIMESTAMP (microseconds) columns: see ParquetFooter.ranges
    ranges: dict[str, dict[str, tuple[int, int] | None]]

    def range_of(self, table: str, column: str) -> tuple[int, int] | None:
        return self.ranges[table].get(column)

    @property
    def file_count(self) -> int:
        return sum(len(files) for files in self.files.values())


def load_inputs(in_dirs: list[str], remote: Files | None = None) -> list[ExportInput]:
    """Each directory, checked: it exists, is an export, and every data file has its table's
    schema. A local path is read directly; a URI of another scheme through `remote` (Hadoop's
    FileSystem in Spark's JVM). Raises AnalysisError naming the first problem."""
    if not in_dirs:
        raise AnalysisError("no input directory given: pass one or more export directories")
    inputs = []
    seen = set()
    files: Files
    for in_dir in in_dirs:
        in_dir = os.fspath(in_dir)
        if is_local(in_dir):
            path, files = os.path.abspath(local_path(in_dir, "input")), LOCAL
        else:
            if remote is None:
                raise AnalysisError(
                    f"input {in_dir}: a URI needs Spark's filesystems (start the session first)"
                )
            path, files = in_dir.rstrip("/"), remote
        if path in seen:
            continue
        seen.add(path)
        inputs.append(_load_one(path, files))
    if not any(found.file_count for found in inputs):
        raise AnalysisError(
            f"the export directories hold no rows yet ({', '.join(i.path for i in inputs)}): "
            "nothing to analyse"
        )
    return inputs


def _load_one(path: str, files: Files) -> ExportInput:
    if not files.exists(path):
        raise AnalysisError(f"input directory {path} does not exist")
    if not files.is_dir(path):
        raise AnalysisError(f"input {path} is not a directory (pass an export directory)")
    if not files.list_names(path):
        raise AnalysisError(f"input directory {path} is empty: run `levelzero export --out {path}` first")
    manifest_path = join(path, MANIFEST_NAME)
    data = files.read_small(manifest_path, MANIFEST_BYTES_MAX)
    if data is None:
        raise AnalysisError(
            f"{path} is not a levelzero export directory (no {MANIFEST_NAME}); pass the "
            "directory `levelzero export --out` wrote"
        )
    try:
        manifest = manifest_file.parse(data, manifest_path)
    except ExportError as error:
        raise AnalysisError(str(error)) from None
    skip = set(manifest.superseded)
    found = {table: _table_files(files, path, table, manifest.last_seq, skip) for table in TABLES}
    rows = {table: sum(footer.rows for footer in footers.values()) for table, footers in found.items()}
    _check_none_missing(path, manifest, rows)
    ranges: dict[str, dict[str, tuple[int, int] | None]] = {}
    for table, footers in found.items():
        columns: dict[str, tuple[int, int] | None] = {}
        for footer in footers.values():
            for column, known in footer.ranges.items():
                columns[column] = widen(columns.get(column, NO_VALUES), known)
        ranges[table] = columns
    return ExportInput(
        path,
        manifest,
        {table: list(paths) for table, paths in found.items()},
        rows,
        ranges,
    )


def _check_none_missing(path: str, manifest: Manifest, rows: dict[str, int]) -> None:
    """The manifest counts the rows each export added to each table (the last
    EXPORT_HISTORY_MAX exports: a lower bound beyond them); fewer rows in the table's committed
    files means files of it are gone. Compaction moves rows between files, never drops them."""
    for table, found in rows.items():
        exported = sum(record.rows.get(table, 0) for record in manifest.exports)
        if found < exported:
            raise AnalysisError(
                f"{join(path, table)} holds {found:,} rows, but the export manifest "
                f"({MANIFEST_NAME}) lists {exported:,} exported: files of it are missing (deleted, "
                "or left out of a copy); put them back, or export the store again into a new "
                "directory (levelzero export --out NEW_DIR) and analyse that one"
            )


def _table_files(
    files: Files, path: str, table: str, last_seq: int, superseded: set[str]
) -> dict[str, ParquetFooter]:
    """The table's committed files, each checked, and each one's footer."""
    table_dir = join(path, table)
    if not (files.exists(table_dir) and files.is_dir(table_dir)):
        return {}
    found = {}
    for partition in files.list_names(table_dir):
        partition_dir = join(table_dir, partition)
        if not (partition.startswith("date=") and files.is_dir(partition_dir)):
            continue
        for name in files.list_names(partition_dir):
            seq = manifest_file.file_seq(name)
            if seq is None or seq > last_seq:
                continue  # not ours, or an export that never committed
            if "/".join((table, partition, name)) in superseded:  # as compact.py names them
                continue  # folded into a later file by compaction
            file_path = join(partition_dir, name)
            found[file_path] = _checked_footer(files, file_path, table)
    return found


def _checked_footer(files: Files, file_path: str, table: str) -> ParquetFooter:
    """The file's footer, once it shows the table's schema."""
    footer = files.parquet_footer(file_path)
    why = schema_mismatch(table, footer.schema)
    if why is not None:
        raise AnalysisError(
            f"{file_path} does not have the {table} schema: {why} (see levelzero/export/SCHEMAS.md)"
        )
    return footer


def check_java() -> str:
    """The java executable Spark will use (JAVA_HOME first, then PATH), if it is Java 17+."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        java = os.path.join(java_home, "bin", "java")
        if not (os.path.isfile(java) and os.access(java, os.X_OK)):
            raise JavaNotFound(f"JAVA_HOME={java_home} has no bin/java. {JAVA_HINT}")
    else:
        found = shutil.which("java")
        if found is None:
            raise JavaNotFound(f"no java on PATH and JAVA_HOME is not set. {JAVA_HINT}")
        java = found
    major = _java_major_version(java)
    if major is not None and major < JAVA_MAJOR_MIN:
        raise JavaNotFound(f"{java} is Java {major}; Spark 4 needs 17 or newer. {JAVA_HINT}")
    return java


def _java_major_version(java: str) -> int | None:
    """The major version `java -version` reports; None when it cannot be told."""
    try:
        done = subprocess.run(  # noqa: S603 - the java the user configured, fixed arguments
            [java, "-version"], capture_output=True, text=True, timeout=JAVA_VERSION_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise JavaNotFound(f"{java} does not run ({error}). {JAVA_HINT}") from None
    for line in (done.stderr + done.stdout).splitlines():
        if "version" in line and '"' in line:
            parts = line.split('"')[1].split(".")  # "17.0.15", "11", "1.8.0_292"
            legacy = parts[0] == "1" and len(parts) > 1
            try:
                return int(parts[1] if legacy else parts[0].split("-")[0])
            except ValueError:
                return None
    return None
