"""LocalObjectStore beyond the shared contract: atomic writes, temp files, directories."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from levelzero.core.errors import InvalidInput, StorageError
from levelzero.core.names import TEMP_SEGMENT_PREFIX
from levelzero.storage.local_store import LocalObjectStore


def files_under(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())


async def test_objects_are_plain_files_under_the_root_without_temp_files(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    await store.put("level_zero/data/001/000000000000000002/abc", b"payload")
    await store.put("level_zero/data/001/000000000000000002/abc", b"payload, again")
    await store.put("x", b"")
    assert files_under(tmp_path) == ["level_zero/data/001/000000000000000002/abc", "x"]
    stored = tmp_path / "level_zero/data/001/000000000000000002/abc"
    assert stored.read_bytes() == b"payload, again"


async def test_a_crashed_writes_temp_file_is_invisible(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    await store.put("dir/real", b"x")
    # What a crash between "write temp file" and "rename" leaves behind:
    (tmp_path / "dir" / f"{TEMP_SEGMENT_PREFIX}k2j3h4").write_bytes(b"half a wri")
    (tmp_path / f"{TEMP_SEGMENT_PREFIX}top").write_bytes(b"half")
    assert [obj.key for obj in (await store.list_page("")).objects] == ["dir/real"]
    assert [obj.key for obj in (await store.list_page("dir/")).objects] == ["dir/real"]
    assert [obj.key for obj in (await store.list_page("dir/.lz")).objects] == []
    with pytest.raises(InvalidInput):
        await store.head(f"dir/{TEMP_SEGMENT_PREFIX}k2j3h4")


async def test_failed_write_keeps_the_old_object_and_removes_its_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalObjectStore(tmp_path)
    await store.put("dir/obj", b"old")

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "injected I/O error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(StorageError, match="injected I/O error"):
        await store.put("dir/obj", b"new bytes that never land")
    monkeypatch.undo()

    assert await store.get("dir/obj") == b"old"
    assert files_under(tmp_path) == ["dir/obj"]


async def test_failed_rename_leaves_no_trace_of_a_new_object(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalObjectStore(tmp_path)

    def failing_replace(src: str, dst: str) -> None:
        raise OSError(errno.ENOSPC, "injected: no space left")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(StorageError, match="no space left"):
        await store.put("dir/new", b"x")
    monkeypatch.undo()

    assert await store.head("dir/new") is None
    assert files_under(tmp_path) == []


async def test_blocking_file_io_runs_in_a_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalObjectStore(tmp_path)
    threads: list[threading.Thread] = []
    real_replace = os.replace

    def recording_replace(src: str, dst: str) -> None:
        threads.append(threading.current_thread())
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", recording_replace)
    await store.put("k", b"v")
    assert threads and threads[0] is not threading.current_thread()


async def test_a_key_cannot_be_both_an_object_and_a_directory(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    await store.put("a", b"file")
    with pytest.raises(InvalidInput, match="'a/b'"):
        await store.put("a/b", b"x")
    with pytest.raises(InvalidInput, match="'a/b/c'"):
        await store.put("a/b/c", b"x")
    await store.put("d/e", b"x")
    with pytest.raises(InvalidInput, match="'d'"):
        await store.put("d", b"x")
    assert await store.get("a") == b"file"
    assert files_under(tmp_path) == ["a", "d/e"]


async def test_deletes_remove_emptied_directories_but_not_the_root(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    store = LocalObjectStore(root)
    await store.put("x/y/z/1", b"1")
    await store.put("x/keep", b"k")
    await store.delete_many(["x/y/z/1"])
    assert sorted(p.name for p in root.iterdir()) == ["x"]
    assert sorted(p.name for p in (root / "x").iterdir()) == ["keep"]
    await store.delete_many(["x/keep"])
    assert root.is_dir() and list(root.iterdir()) == []
    # A put into a directory that a delete just removed still works.
    await store.put("x/y/z/2", b"2")
    assert await store.get("x/y/z/2") == b"2"


async def test_delete_of_a_directory_name_is_a_delete_of_a_missing_object(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    await store.put("p/q", b"x")
    result = await store.delete_many(["p"])
    assert (result.deleted, result.errors) == (["p"], {})
    assert await store.get("p/q") == b"x"


async def test_objects_survive_reopening_the_directory(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    await store.put("a/b", b"durable")
    await store.aclose()
    reopened = LocalObjectStore(tmp_path)
    assert await reopened.get("a/b") == b"durable"
    assert [obj.key for obj in (await reopened.list_page("a/")).objects] == ["a/b"]


async def test_prefixes_no_valid_key_can_have_list_nothing(tmp_path: Path) -> None:
    (tmp_path / "inside").mkdir()
    store = LocalObjectStore(tmp_path / "inside")
    await store.put("k", b"x")
    (tmp_path / "outside").write_bytes(b"secret")
    for prefix in ("../", "../o", "/", "/k", "a//", "./"):
        assert (await store.list_page(prefix)).objects == [], prefix


def test_root_that_is_a_file_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(InvalidInput, match="not a usable directory"):
        LocalObjectStore(tmp_path / "file")
