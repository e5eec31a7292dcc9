"""Where the export writes (local paths, or `file://` URIs) and how the analysis names a
location to Spark.

The export writes its Parquet files and manifest with this process's own calls, so its
`--out` is local: rather than write a local directory literally named `s3a:`, another scheme is
refused up front with what to do. The analysis reads and writes any URI Spark has a
filesystem for (`filesystems.py`).
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

from levelzero.core.errors import LevelZeroError

from .errors import AnalysisError
from .filesystems import is_local


def local_path(location: str, what: str, error: type[LevelZeroError] = AnalysisError) -> str:
    """`location` as a local path: a path, or a `file://` URI. Any other scheme (`s3a://`,
    `hdfs://`, ...) is refused with what to do: the inputs' manifests and footers are checked
    and report.html and the plots are written by this process, on the local filesystem (and
    the export writes with pyarrow and its own manifest, there too)."""
    location = os.fspath(location)
    parsed = urlsplit(location)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise error(f"{what} {location}: a file:// URI names no host (file:///path)")
        return unquote(parsed.path)
    if len(parsed.scheme) > 1 and location.startswith(f"{parsed.scheme}://"):
        raise error(
            f"{what} {location}: {parsed.scheme}:// is not supported; exports and reports live "
            "on a filesystem every Spark process sees at the same local path (a path or "
            "file:///path; on a cluster, a shared mount): copy to and from "
            f"{parsed.scheme}:// with its own tools (hadoop fs -get/-put, aws s3 sync)"
        )
    return location


def spark_uri(location: str) -> str:
    """What Spark reads or writes for `location`: a URI as it is, a local path as `file://`."""
    return file_uri(local_path(location, "location")) if is_local(location) else location


def file_uri(path: str) -> str:
    """A local path as the `file://` URI Spark reads and writes whatever its default
    filesystem (`fs.defaultFS` may be HDFS on a cluster)."""
    return "file://" + os.path.abspath(path)
