"""LocalObjectStore beyond the shared contract: atomic writes, temp files, directories."""

from __future__ import annotations

import errno
import multiprocessing
import os
import tempfile
import threading
from multiprocessing.synchronize import Barrier
from pathlib import Path

import anyio
import pytest

from levelzero.core.errors import InvalidInput, StorageError
from levelzero.core.names import TEMP_SEGMENT_PREFIX
from levelzero.storage.local_store import DIRECTORY_RACE_RETRIES_MAX, LocalObjectStore


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


# -- several stores on one root (several nodes on one directory)

RACE_ROUNDS = 60


def race_key(round_: int, writer: str) -> str:
    """Every writer's key of a round lies in the same new directories, three levels deep."""
    return f"race/{round_:03d}/a/b/{writer}"


def put_race_keys(root: str, writer: str, start: Barrier | None) -> None:
    """One writer's puts, each round's after every writer is ready (a process's target)."""
    store = LocalObjectStore(root, fsync=False)

    async def put_all() -> None:
        for round_ in range(RACE_ROUNDS):
            if start is not None:
                start.wait()
            await store.put(race_key(round_, writer), f"{round_}:{writer}".encode())

    anyio.run(put_all)


async def assert_race_keys_read_back(root: Path, writers: list[str]) -> None:
    store = LocalObjectStore(root)
    for round_ in range(RACE_ROUNDS):
        for writer in writers:
            assert await store.get(race_key(round_, writer)) == f"{round_}:{writer}".encode()
    listed = [obj.key for obj in (await store.list_page("race/")).objects]
    assert listed == sorted(race_key(r, w) for r in range(RACE_ROUNDS) for w in writers)
    # Only a real file in the way is a clash.
    with pytest.raises(InvalidInput, match="clashes"):
        await store.put("race/000/a", b"a directory of other keys")
    with pytest.raises(InvalidInput, match="clashes"):
        await store.put(race_key(0, writers[0]) + "/below", b"an object is in the way")


async def test_sibling_keys_put_at_once_from_many_threads_all_land(tmp_path: Path) -> None:
    writers = [f"t{i:02d}" for i in range(16)]
    stores = {writer: LocalObjectStore(tmp_path, fsync=False) for writer in writers}
    for round_ in range(RACE_ROUNDS):
        async with anyio.create_task_group() as tg:  # each put in a worker thread of its own
            for writer, store in stores.items():
                tg.start_soon(store.put, race_key(round_, writer), f"{round_}:{writer}".encode())
    await assert_race_keys_read_back(tmp_path, writers)


async def test_sibling_keys_put_at_once_from_several_processes_all_land(tmp_path: Path) -> None:
    writers = [f"p{i}" for i in range(4)]
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(len(writers), timeout=60)
    processes = [
        context.Process(target=put_race_keys, args=(str(tmp_path), writer, start)) for writer in writers
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
    assert [process.exitcode for process in processes] == [0] * len(writers)
    await assert_race_keys_read_back(tmp_path, writers)


async def test_a_directory_another_process_makes_first_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race, made certain: each directory appears between the check and the mkdir."""
    store = LocalObjectStore(tmp_path)
    real_mkdir = os.mkdir

    def mkdir_after_another(path: str, *args: object, **kwargs: object) -> None:
        real_mkdir(path)  # the other process wins
        real_mkdir(path)  # FileExistsError for us

    monkeypatch.setattr(os, "mkdir", mkdir_after_another)
    await store.put("x/y/z", b"ours")
    monkeypatch.undo()
    assert await store.get("x/y/z") == b"ours"
    assert files_under(tmp_path) == ["x/y/z"]


async def test_a_directory_another_process_removes_meanwhile_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process's delete empties and removes the directory after it was made, before
    the temp file goes in; the put makes it again, and gives up after a bound."""
    store = LocalObjectStore(tmp_path)
    real_mkstemp = tempfile.mkstemp
    removals = 0

    def mkstemp_after_removal(*args: object, dir: str, **kwargs: object) -> tuple[int, str]:
        nonlocal removals
        if removals < removals_wanted:
            removals += 1
            os.rmdir(dir)
            os.rmdir(os.path.dirname(dir))
        return real_mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp_after_removal)
    removals_wanted = DIRECTORY_RACE_RETRIES_MAX - 1
    await store.put("m/n/o", b"made again")
    assert removals == DIRECTORY_RACE_RETRIES_MAX - 1
    assert await store.get("m/n/o") == b"made again"

    removals, removals_wanted = 0, DIRECTORY_RACE_RETRIES_MAX
    with pytest.raises(StorageError, match=f"removed {DIRECTORY_RACE_RETRIES_MAX} times"):
        await store.put("q/r/s", b"never lands")
    assert files_under(tmp_path) == ["m/n/o"]
