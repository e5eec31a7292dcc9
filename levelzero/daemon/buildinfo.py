"""What is running: the installed distribution's version and the interpreter it runs on.

Read once from the package metadata (the same number `pip show levelzero` prints), so the
CLI's `--version`, the start-up log line and the `levelzero_build_info` metric always agree.
"""

from __future__ import annotations

import functools
import platform
from importlib import metadata

DISTRIBUTION = "levelzero"
UNKNOWN_VERSION = "0+unknown"  # running from a source tree that was never installed


@functools.cache
def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return UNKNOWN_VERSION


def build_labels() -> dict[str, str]:
    """The labels of `levelzero_build_info`."""
    return {
        "version": version(),
        "python_version": platform.python_version(),
        "python_implementation": platform.python_implementation(),
    }
