"""The export manifest `OUT/_levelzero_export.json`: what has been exported from which store.

It is the commit point of an export: data files are written under temporary names, renamed,
and only then the manifest is replaced (atomically). Files of an export whose sequence number is
above the manifest's `last_seq` belong to an export that never committed; the next export
removes them and the analysis ignores them.

Watermarks (per table, see `schemas.TableSpec.incremental`):
- `log_offsets`: per partition id, the last log offset accounted for;
- `state_samples_rowid`, `fence_events_rowid`, `l0_rowid`, `l1_rowid`: last rowid exported;
- `l0_open`: rowid runs of L0 objects still live at the last export (their deletion is next);
- `l1_open`: rowid runs of L1 objects not DELETE_FINISHED, with the state rank exported;
- `gc_finished_at` / `gc_at_finished`: the latest exported round end and the rounds ending then.
`superseded` lists committed files compaction folded into a later one (`compact.py`): readers
skip them; they are deleted after the commit. Runs are `[first_rowid, last_rowid, rank]`;
consecutive rows of one rank share a run, so a healthy store (deletes roughly in creation order)
keeps the lists short.
"""

from __future__ import annotations

import os
import re

import msgspec

from .errors import ExportError
from .schemas import FORMAT_VERSION

MANIFEST_NAME = "_levelzero_export.json"
EXPORT_HISTORY_MAX = 100  # exports listed in the manifest (the sequence number counts them all)
FILE_NAME_RE = re.compile(r"^part-(\d{6,})-\d{8}T\d{6}Z(?:-\d+)?\.parquet$")


class ExportRecord(msgspec.Struct, frozen=True):
    export_id: str
    started_at: float
    finished_at: float
    cluster_epoch: int
    rows: dict[str, int]


class Watermarks(msgspec.Struct):
    log_offsets: dict[int, int] = {}
    state_samples_rowid: int = 0
    fence_events_rowid: int = 0
    l0_rowid: int = 0
    l0_open: list[tuple[int, int, int]] = []
    l1_rowid: int = 0
    l1_open: list[tuple[int, int, int]] = []
    gc_finished_at: float | None = None
    gc_at_finished: list[tuple[int, float]] = []
    # PostgreSQL: rows of transactions below this id are exported (postgres_source.NEW_ROWS)
    xid_horizon: int = 0


class Manifest(msgspec.Struct):
    format: str = "levelzero-export"
    version: int = FORMAT_VERSION
    source_db: str | None = None
    fingerprint: str | None = None  # identifies the source store (its first partition)
    last_seq: int = 0
    exports: list[ExportRecord] = []
    watermarks: Watermarks = msgspec.field(default_factory=Watermarks)
    # Committed data files folded into a later one (compact.py): not part of the export; the
    # export deletes them after committing (or the next one does, after a crash).
    superseded: list[str] = []


_decoder = msgspec.json.Decoder(Manifest)
_encoder = msgspec.json.Encoder()


def file_seq(name: str) -> int | None:
    """The export sequence number in a data file's name; None for a name that is not ours."""
    match = FILE_NAME_RE.match(name)
    return int(match.group(1)) if match else None


def load(out_dir: str) -> Manifest | None:
    """The manifest of `out_dir`; None when there is none yet."""
    path = os.path.join(out_dir, MANIFEST_NAME)
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ExportError(f"cannot read {path}: {error.strerror}") from None
    return parse(data, path)


def parse(data: bytes, path: str) -> Manifest:
    """The manifest in `data`, read from `path` (named in errors)."""
    try:
        manifest = _decoder.decode(data)
    except msgspec.DecodeError as error:
        raise ExportError(f"{path} is not a levelzero export manifest: {error}") from None
    if manifest.format != "levelzero-export":
        raise ExportError(f"{path} is not a levelzero export manifest (format {manifest.format!r})")
    if manifest.version != FORMAT_VERSION:
        raise ExportError(
            f"{path} has export format version {manifest.version}; this levelzero reads and "
            f"writes version {FORMAT_VERSION}: export again into a new directory "
            "(levelzero export --out NEW_DIR) and analyse that one"
        )
    return manifest


def save(out_dir: str, manifest: Manifest) -> None:
    """Replace the manifest atomically and durably (the export's commit point)."""
    path = os.path.join(out_dir, MANIFEST_NAME)
    temp = path + ".tmp"
    with open(temp, "wb") as file:
        file.write(msgspec.json.format(_encoder.encode(manifest), indent=1))
        file.flush()
        os.fsync(file.fileno())
    os.replace(temp, path)
    fsync_dir(out_dir)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RowRuns:
    """Builds rowid runs `(first, last, rank)` from rows appended in rowid order."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, int, int]] = []

    def append(self, rowid: int, rank: int) -> None:
        if self.runs:
            first, last, last_rank = self.runs[-1]
            assert rowid > last, (rowid, last)
            if rowid == last + 1 and rank == last_rank:
                self.runs[-1] = (first, rowid, rank)
                return
        self.runs.append((rowid, rowid, rank))
