"""`levelzero backup DEST` and `levelzero restore BACKUP`: the data directory's log store, copied
consistently while the daemon runs, and put back while it does not.

A backup is a directory: `levelzero.db` (SQLite's online backup API, one read transaction, so
a consistent snapshot even while the daemon commits: WAL lets the writer go on), `cluster-id`
(the object store's ownership marker names it: without it a restored daemon is refused by its
own bucket) and `backup.json` (what was copied, when, by which version). It does not contain the
objects: L0 and L1 objects live in the bucket (or `data_dir/objects` for `storage.kind =
"local"`, which must be copied with the file system's own tools, after the database).

Restoring refuses while a daemon holds the store's lock, keeps the replaced database beside
it (`levelzero.db.replaced-<time>`), and removes the old write-ahead log so SQLite cannot
replay it over the restored file. docs/backup-restore.md ("What an older backup
means") says what an older backup means for the GC and for records written since.

A restore is not over when the file is in place: `levelzero restore` then adopts the bucket's
L1 objects (`daemon/recover.py`). Until it has, the data directory holds `levelzero.restoring`
(written before the database is replaced, removed once the adoption is done), and the daemon
refuses to start on it (`refuse_unfinished_restore`): a restored store without its adoption
serves 500s where the bucket holds the data. Running the same restore again completes it.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import shutil
import sqlite3
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from levelzero.core.errors import StoreRefused, directory_problem
from levelzero.daemon.buildinfo import version
from levelzero.daemon.ownership import CLUSTER_ID_FILE
from levelzero.storage.sqlite.readonly import ReadOnlyOpenError, connect_read_only

BACKUP_FORMAT = 1
DB_FILE = "levelzero.db"
MANIFEST_FILE = "backup.json"
# The log store holds `flock` on this file while it is open (storage/sqlite/lockfile.py).
LOCK_SUFFIX = ".lock"
SQLITE_SIDE_FILES = ("-wal", "-shm")
# In the data directory while a restore has not finished (its adoption included).
RESTORE_MARKER = "levelzero.restoring"


class BackupError(Exception):
    """One line for the operator."""


class BackupRefused(BackupError):
    """What only the operator can change (a path, the configuration): exit status 2."""


@dataclass(frozen=True)
class BackupSummary:
    directory: Path
    manifest: dict[str, object]


def _store_facts(connection: sqlite3.Connection) -> dict[str, object]:
    ((schema,),) = connection.execute("PRAGMA user_version").fetchall()
    epoch = connection.execute("SELECT epoch FROM cluster_epoch WHERE id = 1").fetchall()
    ((partitions,),) = connection.execute("SELECT count(*) FROM partitions").fetchall()
    return {"schema_version": schema, "cluster_epoch": epoch[0][0] if epoch else 1, "partitions": partitions}


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def backup(data_dir: str, destination: str) -> BackupSummary:
    """Copy the log store of `data_dir` (running or not) into the new directory `destination`."""
    source = Path(data_dir) / DB_FILE
    if not source.is_file():
        raise BackupError(f"no log store at {source} (storage.data_dir = {data_dir!r})")
    target = Path(destination)
    try:
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise BackupError(f"{target} exists and is not an empty directory")
    except OSError as exc:
        raise BackupRefused(f"backup destination {target}: {exc.strerror or exc}") from None
    cluster_id_path = Path(data_dir) / CLUSTER_ID_FILE
    if not cluster_id_path.is_file():
        raise BackupError(f"{cluster_id_path} is missing: not a data directory a daemon has run on")
    # The copy is as private as what it copies (the store holds topic and group names,
    # offsets, object keys): its files take the store's mode, a new directory the data
    # directory's (with the umask's 022 they were 0644 beside a 0600 store).
    file_mode = stat.S_IMODE(source.stat().st_mode) & 0o666
    try:
        if not target.exists():
            target.mkdir(parents=True, mode=stat.S_IMODE(Path(data_dir).stat().st_mode))
        os.close(os.open(target / DB_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, file_mode))
        os.chmod(target / DB_FILE, file_mode)  # (the umask applies to os.open's mode)
    except OSError as exc:
        raise BackupRefused(f"backup destination: {directory_problem(target, exc)}") from None
    started = time.time()
    try:
        src = connect_read_only(source, timeout=30)  # read-only directories too
        try:
            dst = sqlite3.connect(target / DB_FILE)
        except BaseException:
            src.close()
            raise
        try:
            src.backup(dst)  # every page in one step: one read transaction, one snapshot
            dst.execute("PRAGMA journal_mode = DELETE")  # a single self-contained file
            ((check,),) = dst.execute("PRAGMA integrity_check").fetchall()
            if check != "ok":
                raise BackupError(f"the copy failed SQLite's integrity check: {check}")
            facts = _store_facts(dst)
        finally:
            dst.close()
            src.close()
    except ReadOnlyOpenError as exc:
        raise BackupError(str(exc)) from None
    except sqlite3.Error as exc:
        raise BackupError(f"cannot back up {source}: {exc}") from None
    try:
        return _finish_backup(target, source, cluster_id_path, started, facts, file_mode)
    except OSError as exc:
        raise BackupError(f"cannot write the backup to {target}: {exc.strerror or exc}") from None


def _finish_backup(
    target: Path,
    source: Path,
    cluster_id_path: Path,
    started: float,
    facts: dict[str, object],
    file_mode: int,
) -> BackupSummary:
    shutil.copyfile(cluster_id_path, target / CLUSTER_ID_FILE)
    manifest: dict[str, object] = {
        "format": BACKUP_FORMAT,
        "levelzero_version": version(),
        "taken_at": datetime.datetime.fromtimestamp(started, datetime.UTC).isoformat(timespec="seconds"),
        "taken_at_s": started,
        "source": str(source.resolve()),
        "cluster_id": cluster_id_path.read_text(encoding="ascii").strip(),
        **facts,
        "contains": [DB_FILE, CLUSTER_ID_FILE],
        "not_contained": "L0 and L1 objects: they live in the object store",
    }
    (target / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    for name in (DB_FILE, CLUSTER_ID_FILE, MANIFEST_FILE):
        os.chmod(target / name, file_mode)
        _fsync_file(target / name)
    _fsync_file(target)
    return BackupSummary(target, manifest)


def _refuse_if_open(db_path: Path) -> int:
    """Take the store's lock (as a log store would) or refuse: a daemon is running on it."""
    fd = os.open(str(db_path) + LOCK_SUFFIX, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise BackupError(
            f"{db_path} is open by a running daemon: stop it first (systemctl stop levelzero)"
        ) from None
    return fd


def restore(
    backup_dir: str, data_dir: str, *, check_cluster: Callable[[str], None] | None = None
) -> BackupSummary:
    """Put the backup in `backup_dir` in place as the log store of `data_dir` (daemon stopped).
    `check_cluster(cluster_id)` runs on the backup's cluster id once the backup is checked and
    the data directory exists, before anything is written in it (it raises BackupError to refuse)."""
    source = Path(backup_dir)
    try:
        manifest = json.loads((source / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BackupError(f"{source} is not a levelzero backup ({MANIFEST_FILE}: {exc})") from None
    if manifest.get("format") != BACKUP_FORMAT:
        raise BackupError(f"{source}: backup format {manifest.get('format')!r} is not {BACKUP_FORMAT}")
    try:
        with sqlite3.connect(f"file:{source / DB_FILE}?mode=ro", uri=True) as check:
            ((ok,),) = check.execute("PRAGMA integrity_check").fetchall()
    except sqlite3.Error as exc:
        raise BackupError(f"{source / DB_FILE}: {exc}") from None
    if ok != "ok":
        raise BackupError(f"{source / DB_FILE} failed SQLite's integrity check: {ok}")
    try:
        cluster_id = (source / CLUSTER_ID_FILE).read_text(encoding="ascii").strip()
    except (OSError, ValueError) as exc:
        raise BackupError(f"{source} is not a levelzero backup ({CLUSTER_ID_FILE}: {exc})") from None
    target = Path(data_dir)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BackupRefused(f"storage.data_dir: {directory_problem(target, exc)}") from None
    if check_cluster is not None:  # the data directory may be new: nothing in it yet
        check_cluster(cluster_id)
    db_path = target / DB_FILE
    lock_fd = _refuse_if_open(db_path)
    try:
        marker = target / RESTORE_MARKER
        _write_marker(marker, source, manifest)
        if db_path.exists():
            # Kept, never deleted, whatever it is: the store the restore replaces, or (a restore
            # run again after a kill) what that one left, which may still be the store it was
            # about to replace if it was killed before this rename. A name of its own each.
            db_path.rename(
                _unused(target, f"{DB_FILE}.replaced-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}")
            )
        for suffix in SQLITE_SIDE_FILES:  # the old WAL must never be replayed over the backup
            Path(str(db_path) + suffix).unlink(missing_ok=True)
        staged = target / f"{DB_FILE}.restoring"
        shutil.copyfile(source / DB_FILE, staged)
        _fsync_file(staged)
        staged.rename(db_path)
        shutil.copyfile(source / CLUSTER_ID_FILE, target / CLUSTER_ID_FILE)
        _fsync_file(target / CLUSTER_ID_FILE)
        _fsync_file(target)
    finally:
        os.close(lock_fd)
    return BackupSummary(target, manifest)


def _unused(directory: Path, name: str) -> Path:
    """`directory / name`, or with `.2`, `.3`, ... added if that is taken (a rename would
    replace it)."""
    path, n = directory / name, 1
    while path.exists():
        n += 1
        path = directory / f"{name}.{n}"
    return path


def _write_marker(marker: Path, source: Path, manifest: dict[str, object]) -> None:
    """Say, durably and before the database is replaced, which restore is under way."""
    body = {"backup": str(source.resolve()), "taken_at": manifest.get("taken_at"), "started_at": time.time()}
    staged = marker.with_name(RESTORE_MARKER + ".new")
    staged.write_text(json.dumps(body) + "\n", encoding="utf-8")
    _fsync_file(staged)
    staged.replace(marker)
    _fsync_file(marker.parent)


def finish_restore(data_dir: str) -> None:
    """The restore, adoption included, is done: the daemon may start on the data directory."""
    target = Path(data_dir)
    (target / RESTORE_MARKER).unlink(missing_ok=True)
    _fsync_file(target)


def refuse_unfinished_restore(data_dir: str) -> None:
    """At start-up: refuse a data directory whose restore did not finish (killed, or its
    adoption failed), naming the command that completes it."""
    marker = Path(data_dir) / RESTORE_MARKER
    if not marker.exists():
        return
    try:
        backup_dir = json.loads(marker.read_text(encoding="utf-8"))["backup"]
    except (OSError, ValueError, KeyError, TypeError):
        backup_dir = "BACKUP"
    raise StoreRefused(
        f"a restore into {data_dir} did not finish ({marker} is there): run "
        f"`levelzero restore {backup_dir} --config …` again (the same command, this daemon's "
        "configuration) before starting the daemon"
    )


def backup_taken_at(manifest: dict[str, object]) -> float | None:
    """When the backup was taken, at the latest (a backup of an earlier release kept whole
    seconds only: the next second is an upper bound)."""
    exact = manifest.get("taken_at_s")
    if isinstance(exact, (int, float)):
        return float(exact)
    try:
        return datetime.datetime.fromisoformat(str(manifest.get("taken_at"))).timestamp() + 1.0
    except ValueError:
        return None
