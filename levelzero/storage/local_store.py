"""ObjectStore over a local directory: the embedded default (no S3 needed).

A key is a relative file path under `root_dir` (keys are checked by `keys_check`, so they cannot
escape it). Writes are atomic and durable: the bytes go to a temp file in the target's directory,
are fsynced, renamed over the target with `os.replace`, and the directory is fsynced — a crash
leaves either the old object or the new one, plus at worst a stray temp file that listings
never show. Every blocking call runs in a worker thread so the event loop never waits on disk.
Several stores may share one root (several nodes on one directory, as `levelzero demo --nodes`
runs them): a directory another store makes or removes at the same moment is not an error.

One difference from S3 remains: a key cannot be both an object and a "directory" of other keys
(`a` and `a/b`); such a put is rejected with InvalidInput. levelzero's key layouts never do this.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TypeVar

import anyio.to_thread

from levelzero.core.errors import InvalidInput, LevelZeroError, ObjectNotFound, StorageError
from levelzero.core.names import TEMP_SEGMENT_PREFIX
from levelzero.storage.keys_check import (
    check_delete_batch,
    check_list_limit,
    check_object_key,
    check_range,
    check_range_within,
)
from levelzero.storage.protocols import (
    DELETE_BATCH_KEYS_MAX,
    LIST_PAGE_KEYS_MAX,
    DeleteResult,
    ListPage,
    ObjectInfo,
)

T = TypeVar("T")
_MISSING = (FileNotFoundError, NotADirectoryError)  # no such file, or a path component is a file
# How many times a put makes its directory again when other processes' deletes keep removing it.
DIRECTORY_RACE_RETRIES_MAX = 8


class LocalObjectStore:
    def __init__(self, root_dir: str | os.PathLike[str], *, fsync: bool = True) -> None:
        """`fsync=False` skips every fsync: faster, not crash-safe — for throwaway stores only."""
        self.root_dir = os.path.abspath(os.fspath(root_dir))
        self._fsync = fsync
        # Serialises directory creation (+ temp file creation) against empty-directory removal,
        # so a delete cannot remove the directory a concurrent put is about to write into.
        self._dirs_lock = threading.Lock()
        try:
            os.makedirs(self.root_dir, exist_ok=True)
        except OSError as exc:
            raise InvalidInput(
                f"local object store root {self.root_dir!r} is not a usable directory: {exc}"
            ) from exc

    def __repr__(self) -> str:
        return f"LocalObjectStore({self.root_dir!r})"

    # -- ObjectStore

    async def put(self, key: str, data: bytes | bytearray) -> None:
        check_object_key(key)
        await self._in_thread("put", key, partial(self._put_sync, key, bytes(data)))

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        check_object_key(key)
        check_range(key, offset, length)
        return await self._in_thread("get", key, partial(self._get_sync, key, offset, length))

    async def head(self, key: str) -> ObjectInfo | None:
        check_object_key(key)
        return await self._in_thread("head", key, partial(self._head_sync, key))

    async def list_page(
        self, prefix: str, start_after: str | None = None, limit: int = LIST_PAGE_KEYS_MAX
    ) -> ListPage:
        check_list_limit(limit, LIST_PAGE_KEYS_MAX)
        return await self._in_thread("list", prefix, partial(self._list_sync, prefix, start_after, limit))

    async def delete_many(self, keys: Sequence[str]) -> DeleteResult:
        unique = check_delete_batch(keys, DELETE_BATCH_KEYS_MAX)
        if not unique:
            return DeleteResult(deleted=[], errors={})
        return await self._in_thread("delete_many", None, partial(self._delete_sync, unique))

    async def aclose(self) -> None:
        """Nothing to release: every operation opens and closes its own files."""

    # -- blocking implementations (worker threads)

    def _path(self, key: str) -> str:
        return os.path.join(self.root_dir, key)

    def _put_sync(self, key: str, data: bytes) -> None:
        path = self._path(key)
        parent = os.path.dirname(path)
        fd, tmp_path = self._temp_file_in(parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                if self._fsync:
                    os.fsync(f.fileno())
            os.replace(tmp_path, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp_path)
            raise
        if self._fsync:
            _fsync_dir(parent)

    def _temp_file_in(self, directory: str) -> tuple[int, str]:
        """A new temp file in `directory`, made with its parents if missing.

        Other processes may share the root (several nodes on one directory): a directory one
        of them makes at the same moment is as good as ours, and one that its delete removes
        between our making it and our temp file going in is made again, a bounded number of
        times (each retry means another process emptied the directory in that instant)."""
        for _ in range(DIRECTORY_RACE_RETRIES_MAX):
            with self._dirs_lock:
                try:
                    self._make_dirs(directory)
                    return tempfile.mkstemp(prefix=TEMP_SEGMENT_PREFIX, dir=directory)
                except FileNotFoundError:
                    continue  # another process removed the directory, or a parent, meanwhile
        raise StorageError(
            f"local store {self.root_dir}: directory {directory!r} was removed "
            f"{DIRECTORY_RACE_RETRIES_MAX} times while a put was making it"
        )

    def _make_dirs(self, directory: str) -> None:
        """Create `directory` and missing parents, fsyncing each parent that gained an entry.
        A directory that exists when `mkdir` runs (another process made it) is success; only a
        file in the way is an error (FileExistsError, read as a key clash)."""
        missing: list[str] = []
        while not os.path.isdir(directory):
            if directory == self.root_dir:
                raise StorageError(f"local object store root {self.root_dir!r} is gone")
            missing.append(directory)
            directory = os.path.dirname(directory)
        for directory in reversed(missing):
            try:
                os.mkdir(directory)
            except FileExistsError:
                if not os.path.isdir(directory):
                    raise  # an object's file is in the way
                # Made by another process just now; its parent's fsync may not have run yet,
                # so ours below still makes the entry durable before our object relies on it.
            if self._fsync:
                _fsync_dir(os.path.dirname(directory))

    def _get_sync(self, key: str, offset: int, length: int | None) -> bytes:
        try:
            f = open(self._path(key), "rb")  # noqa: SIM115 - closed below
        except (*_MISSING, IsADirectoryError):
            raise ObjectNotFound(key, f"local store {self.root_dir}") from None
        with f:
            size = os.fstat(f.fileno()).st_size
            check_range_within(key, offset, size)
            wanted = size - offset if length is None else min(length, size - offset)
            f.seek(offset)
            data = f.read(wanted)
        if len(data) != wanted:  # someone truncated the file under us
            raise StorageError(
                f"local store {self.root_dir}: short read of {key!r} "
                f"({len(data)} of {wanted} bytes at offset {offset})"
            )
        return data

    def _head_sync(self, key: str) -> ObjectInfo | None:
        try:
            st = os.stat(self._path(key), follow_symlinks=False)
        except _MISSING:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None  # a directory holding other keys is not an object
        return ObjectInfo(key=key, size=st.st_size, last_modified=st.st_mtime)

    def _list_sync(self, prefix: str, start_after: str | None, limit: int) -> ListPage:
        # Every key starting with `prefix` lies under the directory named by its part up to the
        # last '/'; if that part is not a valid key, no valid key can start with `prefix`.
        slash = prefix.rfind("/")
        dir_prefix = prefix[: slash + 1]
        if dir_prefix:
            try:
                check_object_key(dir_prefix[:-1])
            except InvalidInput:
                return ListPage(objects=[], next_start_after=None)
        objects: list[ObjectInfo] = []
        for key, st in self._walk(dir_prefix, prefix, start_after):
            if len(objects) == limit:
                return ListPage(objects=objects, next_start_after=objects[-1].key)
            objects.append(ObjectInfo(key=key, size=st.st_size, last_modified=st.st_mtime))
        return ListPage(objects=objects, next_start_after=None)

    def _walk(
        self, dir_prefix: str, prefix: str, start_after: str | None
    ) -> Iterator[tuple[str, os.stat_result]]:
        """Objects under the directory of key prefix `dir_prefix` ('' or ending in '/'), in
        key order, filtered by `prefix` and `start_after`, skipping whole subtrees when possible.

        Sorting directory entries by name is not key order: keys under directory `a` start with
        `a/`, and `a-b` or `a.b` sort before `a/...` while `a0` sorts after. So a directory
        sorts as `name + '/'`, a file as `name`; no such sort key is a prefix of another's, so
        this order is exactly the order of the keys beneath them.
        """
        try:
            with os.scandir(os.path.join(self.root_dir, dir_prefix)) as it:
                entries = list(it)
        except _MISSING:
            return
        children: list[tuple[str, os.DirEntry[str], bool]] = []
        for entry in entries:
            if entry.name.startswith(TEMP_SEGMENT_PREFIX):
                continue
            if entry.is_dir(follow_symlinks=False):
                sub = f"{dir_prefix}{entry.name}/"
                if not (sub.startswith(prefix) or prefix.startswith(sub)):
                    continue
                if start_after is not None and sub < start_after and not start_after.startswith(sub):
                    continue  # every key under `sub` sorts before start_after
                children.append((sub, entry, True))
            elif entry.is_file(follow_symlinks=False):
                key = f"{dir_prefix}{entry.name}"
                if not key.startswith(prefix) or (start_after is not None and key <= start_after):
                    continue
                children.append((key, entry, False))
        children.sort(key=lambda child: child[0])
        for name, entry, is_dir in children:
            if is_dir:
                yield from self._walk(name, prefix, start_after)
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # deleted meanwhile
            yield name, st

    def _delete_sync(self, keys: list[str]) -> DeleteResult:
        deleted: list[str] = []
        errors: dict[str, str] = {}
        touched_dirs: set[str] = set()
        for key in keys:
            path = self._path(key)
            try:
                os.unlink(path)
            except _MISSING:
                deleted.append(key)  # already gone: deletes are idempotent
            except OSError as exc:
                if os.path.isdir(path):
                    deleted.append(key)  # a directory of other keys; no object by this name
                else:
                    code = errno.errorcode.get(exc.errno or 0, "OSError")
                    errors[key] = f"{code}: {exc.strerror}"
            else:
                deleted.append(key)
                touched_dirs.add(os.path.dirname(path))
        if self._fsync:
            for directory in touched_dirs:
                with contextlib.suppress(OSError):  # best effort; the deletes happened
                    _fsync_dir(directory)
        self._remove_empty_dirs(touched_dirs)
        return DeleteResult(deleted=deleted, errors=errors)

    def _remove_empty_dirs(self, directories: set[str]) -> None:
        """Best effort: drop directories left empty, deepest first, never the root."""
        with self._dirs_lock:
            for directory in sorted(directories, key=len, reverse=True):
                while directory != self.root_dir and directory.startswith(self.root_dir):
                    try:
                        os.rmdir(directory)
                    except OSError:
                        break  # not empty (or gone)
                    directory = os.path.dirname(directory)

    # -- error mapping

    async def _in_thread(self, op: str, key: str | None, fn: Callable[[], T]) -> T:
        try:
            return await anyio.to_thread.run_sync(fn)
        except LevelZeroError:
            raise
        except (FileExistsError, NotADirectoryError, IsADirectoryError) as exc:
            if op != "put":
                raise StorageError(f"local store: {op} {key!r} failed: {exc}") from exc
            raise InvalidInput(
                f"object key {key!r} clashes with another key in local store {self.root_dir}: "
                "a key cannot be both an object and a prefix directory of other keys "
                f"({exc.strerror})"
            ) from exc
        except OSError as exc:
            if exc.errno == errno.ENAMETOOLONG:
                raise InvalidInput(f"object key {key!r} is too long for the local file system") from exc
            raise StorageError(f"local store {self.root_dir}: {op} {key!r} failed: {exc}") from exc


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
