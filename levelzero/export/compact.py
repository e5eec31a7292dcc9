"""Compaction of an export directory's small files: a long-running export stays a sane number
of files.

Every export adds a file per table per date it has rows for; exported every few minutes, a
day's partition would collect hundreds of small files. After an export has renamed its files
(still invisible: their sequence number is above the manifest's `last_seq`), each date partition
it wrote into has its small files (below `small_file_bytes`, together at most
COMPACT_BYTES_MAX) rewritten into one file of this export's sequence number. The export's own
folded files are removed at once; older committed files it folded are listed in the manifest as
`superseded`, which the manifest's commit makes take effect atomically (readers skip them), and
are deleted after the commit (or by the next export, after a crash).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from . import manifest as manifest_file
from .errors import ExportError
from .filesystems import readable_parquet
from .schemas import SCHEMAS

SMALL_FILE_BYTES = 32 * 1024 * 1024  # a data file below this is folded into its partition's next
COMPACT_BYTES_MAX = 128 * 1024 * 1024  # files read into one compacted file (memory bound)
ROW_GROUP_ROWS = 50_000


@dataclass(slots=True)
class Compaction:
    written: list[str] = field(default_factory=list)  # compacted files, relative to out_dir
    removed: list[str] = field(default_factory=list)  # this export's files folded and removed
    superseded: list[str] = field(default_factory=list)  # committed files folded: the manifest's


def compact(
    out_dir: str,
    new_files: list[str],
    seq: int,
    export_id: str,
    small_file_bytes: int = SMALL_FILE_BYTES,
) -> Compaction:
    """Fold the small files of every date partition `new_files` (relative paths, this export's,
    renamed but not committed) are in. Files superseded before are gone (the export deletes
    them before it starts)."""
    done = Compaction()
    if small_file_bytes <= 0:
        return done
    for partition in sorted({os.path.dirname(path) for path in new_files}):
        _compact_partition(out_dir, partition, seq, export_id, small_file_bytes, done)
    return done


def _compact_partition(
    out_dir: str,
    partition: str,
    seq: int,
    export_id: str,
    small_file_bytes: int,
    done: Compaction,
) -> None:
    table = partition.split(os.sep)[0]
    directory = os.path.join(out_dir, partition)
    group: list[str] = []
    total = 0
    suffix = 0
    for name in sorted(os.listdir(directory)):
        file_seq = manifest_file.file_seq(name)
        relative = os.path.join(partition, name)
        if file_seq is None or file_seq > seq:
            continue
        if file_seq == seq:
            suffix = max(suffix, _suffix(name) + 1)
        size = os.path.getsize(os.path.join(out_dir, relative))
        if size < small_file_bytes and total + size <= COMPACT_BYTES_MAX:
            group.append(relative)
            total += size
    if len(group) < 2:
        return
    data = pa.concat_tables(_read(out_dir, relative) for relative in group).cast(SCHEMAS[table])
    name = f"part-{export_id}-{suffix}.parquet"
    final = os.path.join(directory, name)
    temp = os.path.join(directory, f".{name}.tmp")
    with pq.ParquetWriter(temp, SCHEMAS[table]) as writer:
        writer.write_table(data, row_group_size=ROW_GROUP_ROWS)
    _fsync(temp)
    os.replace(temp, final)
    for relative in group:
        if manifest_file.file_seq(os.path.basename(relative)) == seq:
            os.unlink(os.path.join(out_dir, relative))
            done.removed.append(relative)
        else:
            done.superseded.append(relative)
    manifest_file.fsync_dir(directory)
    done.written.append(os.path.join(partition, name))


def _read(out_dir: str, relative: str) -> pa.Table:
    """A committed data file, whole; a damaged one (overwritten, truncated) is an ExportError
    naming it: every later export would fold it again, so only the user can settle it."""
    path = os.path.join(out_dir, relative)
    what_to_do = (
        f"; {out_dir} holds a damaged export: export into a new directory (levelzero export "
        "--out NEW_DIR), or delete the file to go on without its rows"
    )
    with readable_parquet(path, ExportError, what_to_do):
        return pq.ParquetFile(path).read()


def _suffix(name: str) -> int:
    """The `-<n>` of `part-<seq>-<time>-<n>.parquet` (0 without one)."""
    stem = name[: -len(".parquet")]
    parts = stem.split("-")
    return int(parts[3]) if len(parts) == 4 else 0


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_superseded(out_dir: str, superseded: list[str]) -> None:
    """Delete files the committed manifest no longer counts (gone already is fine)."""
    for relative in superseded:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(out_dir, relative))
