"""The store's side of its writer process (`writer_process.py`): start it with one end of a
socket pair and the lock's descriptor, send it framed batches, read its answers, stop it."""

from __future__ import annotations

import socket
import subprocess
import sys

import anyio
import anyio.abc
import msgspec
from anyio.streams.buffered import BufferedByteReceiveStream

from levelzero.core.errors import StorageError
from levelzero.storage.sqlite import writer_process

WRITER_START_TIMEOUT_S = 30.0  # the writer process opens the file and says so
WRITER_EXIT_TIMEOUT_S = 30.0  # after its socket closed, then it is killed


class WriterProcess:
    """The child that commits staged batches (`writer_process.py`), and the socket to it."""

    def __init__(self, process: anyio.abc.Process, stream: anyio.abc.SocketStream) -> None:
        self._process = process
        self._stream = stream
        self._receive = BufferedByteReceiveStream(stream)

    @classmethod
    async def start(cls, db_path: str, lock_fd: int, synchronous: str, busy_timeout_ms: int) -> WriterProcess:
        ours, theirs = socket.socketpair()
        try:
            process = await anyio.open_process(
                [
                    sys.executable,
                    writer_process.__file__,  # by path: it needs nothing of levelzero
                    f"--socket-fd={theirs.fileno()}",
                    f"--lock-fd={lock_fd}",
                    f"--synchronous={synchronous}",
                    f"--busy-timeout-ms={busy_timeout_ms}",
                    db_path,
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=None,  # its complaints go where ours go (the journal)
                pass_fds=(theirs.fileno(), lock_fd),
                start_new_session=True,  # a terminal's signals are for the daemon
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        try:
            stream = await anyio.abc.SocketStream.from_socket(ours)
        except BaseException:
            ours.close()  # the process sees EOF and ends
            with anyio.CancelScope(shield=True):
                await process.wait()
                await process.aclose()
            raise
        writer = cls(process, stream)
        try:
            with anyio.fail_after(WRITER_START_TIMEOUT_S):
                ready = await writer.receive()
        except BaseException as error:
            with anyio.CancelScope(shield=True):
                await writer.stop()
            if isinstance(error, Exception):
                raise StorageError(
                    f"{db_path}: the log store's writer process did not start ({error!r})"
                ) from error
            raise
        if ready is not None:
            with anyio.CancelScope(shield=True):
                await writer.stop()
            raise StorageError(str(ready))
        return writer

    @property
    def pid(self) -> int:
        return self._process.pid

    async def send(self, message: bytes) -> None:
        """One batch, framed by `writer_process.frame`."""
        await self._stream.send(message)

    async def receive(self) -> str | None:
        """The next answer: None (committed) or the writer's error text."""
        header = await self._receive.receive_exactly(writer_process.FRAME_HEADER.size)
        (size,) = writer_process.FRAME_HEADER.unpack(header)
        answer = msgspec.msgpack.decode(await self._receive.receive_exactly(size))
        if answer is not None and not isinstance(answer, str):
            raise msgspec.DecodeError(f"unexpected answer {answer!r}")
        return answer

    async def stop(self) -> None:
        """Close the socket (the process ends after the transaction at hand) and wait for it."""
        await self._stream.aclose()
        with anyio.move_on_after(WRITER_EXIT_TIMEOUT_S):
            await self._process.wait()
        if self._process.returncode is None:
            self._process.kill()
            await self._process.wait()
        await self._process.aclose()
