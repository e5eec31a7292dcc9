"""The log store's writer process: runs the rows of staged write batches on its own SQLite
connection and commits them, one transaction per batch, in the order they arrive.

Why a process: in the daemon's process, SQLite's thread needs the GIL for every row it binds and
every time a statement returns, and it gets it only when the event loop goes idle; SQLite's work
and the event loop's work then take turns instead of running side by side (BENCHMARKS.md, item
4). Here they run side by side, and the store keeps the next batch on its way while this one is
being committed.

`SqliteLogStore` starts it with one end of a socket pair and the descriptor that holds the
store's `flock`, so the lock is released only when both processes are gone: a store opened after
a crash never races a batch this process is still committing. It stops when the socket closes
(the store closed, or its process died), after the transaction at hand, and after the first
batch that fails: the batches sent behind it were staged on its cursors. It runs in a session
of its own and ignores SIGINT, SIGTERM and SIGHUP: the store decides when writing ends, and a
signal meant for the daemon must not cut a batch the store still waits for.

Frames are a 4-byte little-endian length and a msgpack body:
- writer -> store, once:    null when the connection is open, or the error text;
- store -> writer:          [[sql, [row, ...]], ...]: one batch, one transaction;
- writer -> store, each:    null once committed, or the error text (rolled back; the last).
Imports only the standard library and msgspec, so it starts in tens of milliseconds.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sqlite3
import struct
from typing import Any

import msgspec

FRAME_HEADER = struct.Struct("<I")
FRAME_BYTES_MAX = 1 << 30  # one batch; far above group_commit_max_records of real rows

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list[tuple[str, list[list[Any]]]])


def frame(message: object) -> bytes:
    body = _encoder.encode(message)
    assert len(body) <= FRAME_BYTES_MAX, len(body)
    return FRAME_HEADER.pack(len(body)) + body


def _receive_exactly(sock: socket.socket, size: int) -> bytes | None:
    """`size` bytes, or None if the socket closed first (at a frame boundary or not)."""
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            return None
        got += n
    return bytes(buffer)


def _connect(path: str, synchronous: str, busy_timeout_ms: int) -> sqlite3.Connection:
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    mode = connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if mode.lower() != "wal":
        raise sqlite3.OperationalError(f"journal_mode is {mode}, not wal")
    assert synchronous in ("FULL", "NORMAL"), synchronous
    connection.execute(f"PRAGMA synchronous = {synchronous}")
    return connection


def _commit(connection: sqlite3.Connection, statements: list[tuple[str, list[list[Any]]]]) -> None:
    connection.execute("BEGIN IMMEDIATE")
    try:
        for sql, rows in statements:
            connection.executemany(sql, rows)
        connection.execute("COMMIT")
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise


def serve(sock: socket.socket, path: str, synchronous: str, busy_timeout_ms: int) -> None:
    try:
        connection = _connect(path, synchronous, busy_timeout_ms)
    except sqlite3.Error as error:
        sock.sendall(frame(f"{path}: the writer process cannot open the file: {error}"))
        return
    sock.sendall(frame(None))
    with connection:
        while True:
            header = _receive_exactly(sock, FRAME_HEADER.size)
            if header is None:
                return  # the store is gone: nothing is waiting for an answer any more
            (size,) = FRAME_HEADER.unpack(header)
            body = _receive_exactly(sock, size)
            if body is None:
                return
            try:
                _commit(connection, _decoder.decode(body))
            except (sqlite3.Error, msgspec.DecodeError) as error:
                # And stop: the batches already sent behind this one were staged on its
                # cursors, so running them would leave a gap in a partition's log.
                sock.sendall(frame(f"{type(error).__name__}: {error}"))
                return
            sock.sendall(frame(None))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket-fd", type=int, required=True)
    parser.add_argument("--lock-fd", type=int, required=True)  # held, never used
    parser.add_argument("--synchronous", choices=("FULL", "NORMAL"), required=True)
    parser.add_argument("--busy-timeout-ms", type=int, required=True)
    parser.add_argument("path")
    args = parser.parse_args(argv)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    sock = socket.socket(fileno=args.socket_fd)
    try:
        serve(sock, args.path, args.synchronous, args.busy_timeout_ms)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the store is gone
    finally:
        sock.close()


if __name__ == "__main__":
    main()
