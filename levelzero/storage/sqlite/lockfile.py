"""The lock file that keeps a second store (in this process or another) off a SQLite file: the
writer's in-memory cursors are only right if nobody else writes it."""

from __future__ import annotations

import fcntl
import os
import time

import anyio

from levelzero.core.errors import StorageError

from .writer_link import WRITER_EXIT_TIMEOUT_S


async def lock_exclusively(db_path: str) -> int:
    """Hold `flock` on `<db>.lock` for the store's lifetime: the writer's in-memory cursors are
    only right if nobody else writes the file. Returns the descriptor that holds the lock.

    The writer process holds the lock too. When the store that opened it died, it may still be
    finishing the transaction at hand: a lock held for a process that no longer exists is
    waited for (up to WRITER_EXIT_TIMEOUT_S), a lock held for a live one is refused at once."""
    lock_path = db_path + ".lock"
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as error:
        raise StorageError(f"{db_path}: cannot create lock file {lock_path}: {error}") from error
    deadline = time.monotonic() + WRITER_EXIT_TIMEOUT_S
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                if not process_is_gone(holder) or time.monotonic() >= deadline:
                    raise StorageError(
                        f"{db_path} is already open by another log store (lock {lock_path} "
                        f"held by process {holder})"
                    ) from None
            except OSError as error:
                raise StorageError(f"{db_path}: cannot lock {lock_path}: {error}") from error
            await anyio.sleep(0.01)  # its writer process is finishing a transaction
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def process_is_gone(pid_text: str) -> bool:
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, someone else's
    return False
