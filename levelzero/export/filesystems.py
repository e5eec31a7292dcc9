"""The filesystems the analysis reads its inputs from and writes its report to.

A local path (or `file://` URI) is read and written with this process's own calls, before
Spark starts. Any other URI (`s3a://`, `hdfs://`, `viewfs://`, ...) goes through Hadoop's
FileSystem API in Spark's JVM, the one Spark's own reads and writes use, so the driver sees
exactly what the executors see with the same configuration (`--conf spark.hadoop.*`,
credentials providers, the classpath). The driver's checks touch only directory listings, the
manifest and Parquet footers; what the driver writes itself (result tables, CSV, plots,
report.html) is written to a local staging directory and copied up through the same
FileSystem once complete.

A scheme Spark has no FileSystem for is one line naming what to add: for `s3a://`, the
`hadoop-aws` package of the Hadoop version Spark ships with.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple, Protocol
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq

from levelzero.core.errors import LevelZeroError

from .errors import AnalysisError

PARQUET_MAGIC = b"PAR1"
PARQUET_TAIL = struct.Struct("<I4s")  # footer length, magic
FOOTER_BYTES_MAX = 64 * 1024 * 1024  # a footer beyond this is not one of ours
MANIFEST_BYTES_MAX = 64 * 1024 * 1024


MICROS_PER_UNIT = {"ms": 1_000, "us": 1}  # TIMESTAMP units whose statistics are read as micros
NO_VALUES = (2**63, -(2**63))  # the range of no values: lo > hi, the identity of widening


class ParquetFooter(NamedTuple):
    """What a Parquet file's footer says without reading its data: the schema, the rows, and
    each 64-bit integer and TIMESTAMP column's range from the row groups' statistics."""

    schema: pa.Schema
    rows: int
    # column -> (min, max) of its non-null values, TIMESTAMPs in microseconds since the epoch
    # (NO_VALUES: none in the file); None when the statistics cannot tell (missing in a row
    # group, a TIMESTAMP of another unit or storage).
    ranges: dict[str, tuple[int, int] | None]


def widen(a: tuple[int, int] | None, b: tuple[int, int] | None) -> tuple[int, int] | None:
    """The range covering both (None, unknown, if either is)."""
    if a is None or b is None:
        return None
    return min(a[0], b[0]), max(a[1], b[1])


def _ranges(parquet: pq.ParquetFile) -> dict[str, tuple[int, int] | None]:
    ranges: dict[str, tuple[int, int] | None] = {}
    scales: dict[str, int] = {}
    for field in parquet.schema_arrow:
        if pa.types.is_int64(field.type):
            ranges[field.name], scales[field.name] = NO_VALUES, 1
        elif pa.types.is_timestamp(field.type):
            scale = MICROS_PER_UNIT.get(field.type.unit)
            ranges[field.name] = None if scale is None else NO_VALUES
            if scale is not None:
                scales[field.name] = scale
    metadata = parquet.metadata
    for group_index in range(metadata.num_row_groups):
        group = metadata.row_group(group_index)
        for column_index in range(group.num_columns):
            column = group.column(column_index)
            name = column.path_in_schema
            known = ranges.get(name)
            if known is None:
                continue
            stats = column.statistics
            if column.physical_type != "INT64" or stats is None:
                ranges[name] = None
            elif stats.has_min_max:
                scale = scales[name]
                ranges[name] = widen(known, (int(stats.min_raw) * scale, int(stats.max_raw) * scale))
            elif not (stats.has_null_count and stats.null_count >= group.num_rows):
                ranges[name] = None  # values without statistics
    return ranges


@contextmanager
def readable_parquet(path: str, error: type[LevelZeroError], what_to_do: str = "") -> Iterator[None]:
    """Reads of the Parquet file `path` inside: a file that is not Parquet (damaged, truncated,
    overwritten) is one line of `error` naming it, and `what_to_do` after it, not pyarrow's
    traceback. The analysis's input checks and the export's compaction both read through it."""
    try:
        yield
    except (pa.ArrowException, OSError) as problem:
        why = (str(problem).strip().splitlines() or [type(problem).__name__])[0].rstrip(".")
        raise error(f"{path} is not a readable Parquet file: {why}{what_to_do}") from None


def _footer(source: Any, path: str) -> ParquetFooter:
    with readable_parquet(path, AnalysisError):
        parquet = pq.ParquetFile(source)
        return ParquetFooter(parquet.schema_arrow, parquet.metadata.num_rows, _ranges(parquet))


def is_local(location: str) -> bool:
    """A local path or a `file://` URI (read and written by this process directly)."""
    location = os.fspath(location)
    parsed = urlsplit(location)
    return parsed.scheme in ("", "file") or not location.startswith(f"{parsed.scheme}://")


def scheme(location: str) -> str:
    return urlsplit(location).scheme


def join(location: str, *names: str) -> str:
    """`location` / names, for local paths and URIs alike."""
    if is_local(location):
        return os.path.join(location, *names)
    return "/".join([location.rstrip("/"), *names])


class Files(Protocol):
    """What the input checks need of a filesystem."""

    def exists(self, path: str) -> bool: ...

    def is_dir(self, path: str) -> bool: ...

    def list_names(self, path: str) -> list[str]: ...

    def read_small(self, path: str, limit: int) -> bytes | None:
        """The whole file (None when it does not exist); refused beyond `limit` bytes."""
        ...

    def parquet_footer(self, path: str) -> ParquetFooter: ...


class LocalFiles:
    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def list_names(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def read_small(self, path: str, limit: int) -> bytes | None:
        try:
            with open(path, "rb") as file:
                data = file.read(limit + 1)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise AnalysisError(f"cannot read {path}: {error.strerror}") from None
        if len(data) > limit:
            raise AnalysisError(f"{path} is larger than {limit} bytes: not a levelzero file")
        return data

    def parquet_footer(self, path: str) -> ParquetFooter:
        return _footer(path, path)


class HadoopFiles:
    """Hadoop's FileSystem API through the Spark session's JVM gateway (py4j)."""

    def __init__(self, spark: Any) -> None:
        # py4j reaches the JVM's classes only through the session's private handles.
        self._jvm = spark._jvm  # noqa: SLF001
        self._conf = spark._jsc.hadoopConfiguration()  # noqa: SLF001

    # ------------------------------------------------------------------ plumbing

    def _path(self, location: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(location)

    def _fs(self, location: str) -> Any:
        return self._call(location, lambda: self._path(location).getFileSystem(self._conf))

    def _call(self, location: str, work: Any) -> Any:
        from py4j.protocol import Py4JJavaError

        try:
            return work()
        except Py4JJavaError as error:
            raise AnalysisError(self._explain(location, error)) from None

    def _explain(self, location: str, error: Any) -> str:
        java = error.java_exception
        kind = java.getClass().getName()
        message = str(java.getMessage() or "").splitlines()[0] if java.getMessage() else ""
        # No class registered for the scheme, or one registered (core-default.xml names
        # S3AFileSystem for s3a) whose jar is not on the classpath.
        missing_class = "ClassNotFoundException" in message and "FileSystem" in message
        if kind.endswith("UnsupportedFileSystemException") or missing_class:
            name = scheme(location)
            version = self._jvm.org.apache.hadoop.util.VersionInfo.getVersion()
            if name in ("s3a", "s3", "s3n"):
                return (
                    f"{location}: Spark has no filesystem for {name}:// on its classpath; add "
                    f"the hadoop-aws package of its Hadoop version: spark-submit --packages "
                    f"org.apache.hadoop:hadoop-aws:{version} (or --conf "
                    f"spark.jars.packages=org.apache.hadoop:hadoop-aws:{version})"
                )
            return (
                f"{location}: Spark has no filesystem for {name}:// on its classpath (Hadoop "
                f"{version}); add the package that provides it with --packages"
            )
        return f"{location}: {kind.rsplit('.', 1)[-1]}: {message}"

    # ------------------------------------------------------------------ Files

    def exists(self, path: str) -> bool:
        fs = self._fs(path)
        return bool(self._call(path, lambda: fs.exists(self._path(path))))

    def is_dir(self, path: str) -> bool:
        fs = self._fs(path)
        return bool(self._call(path, lambda: fs.getFileStatus(self._path(path)).isDirectory()))

    def list_names(self, path: str) -> list[str]:
        fs = self._fs(path)
        statuses = self._call(path, lambda: fs.listStatus(self._path(path)))
        return sorted(str(status.getPath().getName()) for status in statuses)

    def _read(self, path: str, position: int, length: int) -> bytes:
        fs = self._fs(path)

        def read() -> bytes:
            stream = fs.open(self._path(path))
            try:
                stream.seek(position)
                return bytes(self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream, length))
            finally:
                stream.close()

        return self._call(path, read)

    def _size(self, path: str) -> int:
        fs = self._fs(path)
        return int(self._call(path, lambda: fs.getFileStatus(self._path(path)).getLen()))

    def read_small(self, path: str, limit: int) -> bytes | None:
        if not self.exists(path):
            return None
        size = self._size(path)
        if size > limit:
            raise AnalysisError(f"{path} is larger than {limit} bytes: not a levelzero file")
        return self._read(path, 0, size)

    def parquet_footer(self, path: str) -> ParquetFooter:
        """The file's footer (schema, rows), reading only the footer (not the data)."""
        size = self._size(path)
        if size < len(PARQUET_MAGIC) + PARQUET_TAIL.size:
            raise AnalysisError(f"{path} is not a readable Parquet file: {size} bytes")
        tail = self._read(path, size - PARQUET_TAIL.size, PARQUET_TAIL.size)
        footer_length, magic = PARQUET_TAIL.unpack(tail)
        if magic != PARQUET_MAGIC or footer_length > min(FOOTER_BYTES_MAX, size - 12):
            raise AnalysisError(f"{path} is not a readable Parquet file: no Parquet footer")
        footer = self._read(path, size - PARQUET_TAIL.size - footer_length, footer_length)
        # The footer's metadata does not depend on where the data pages are: a buffer of the
        # magic, the footer and its tail reads as the file's schema.
        shell = PARQUET_MAGIC + footer + PARQUET_TAIL.pack(footer_length, PARQUET_MAGIC)
        return _footer(pa.BufferReader(shell), path)

    # ------------------------------------------------------------------ writing

    def make_dirs(self, path: str) -> None:
        fs = self._fs(path)
        self._call(path, lambda: fs.mkdirs(self._path(path)))

    def upload_dir(self, local_dir: str, target: str) -> None:
        """Copy every file under `local_dir` into `target` (a directory URI), replacing files of
        the same name; what is in `target` and not in `local_dir` stays."""
        fs = self._fs(target)
        for root, _dirs, names in os.walk(local_dir):
            relative = os.path.relpath(root, local_dir)
            where = target if relative == "." else join(target, *relative.split(os.sep))
            for name in sorted(names):
                source = self._jvm.org.apache.hadoop.fs.Path("file://" + os.path.join(root, name))
                destination = self._path(join(where, name))
                self._call(target, lambda s=source, d=destination: fs.copyFromLocalFile(False, True, s, d))
