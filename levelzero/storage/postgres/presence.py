"""Who is on a PostgreSQL control plane. Every daemon on it holds a session-level *shared*
advisory lock for as long as it runs (`presence`), and `levelzero recover --from-bucket` takes
the same key *exclusively* for as long as it works: a recover refuses to start while any daemon
runs there, and a daemon refuses to start while a recover runs, whether or not the daemons are
a cluster (a single daemon on PostgreSQL registers no lease that `cluster_view` would show).
On SQLite the store's own file lock does this.

The lock lives as long as its session. A daemon checks its session every PRESENCE_CHECK_S and,
if it was lost (the server restarted, the connection was cut), takes the lock again on a new
one; if a recover holds it by then, the daemon stops (`ControlPlaneInUse`): the control plane
was rewritten under it. Between the loss and the next check a recover could start; a cluster
node is also refused by its live lease (`recover._refuse_live_nodes`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import anyio.abc
import asyncpg

from levelzero.core.errors import StorageError

from .base import CONNECTION_ERRORS, redacted

log = logging.getLogger("levelzero.storage")

# pg_advisory_lock key: "lz-nodes" in ASCII as a bigint (the migration lock is another key).
PRESENCE_LOCK_KEY = int.from_bytes(b"lz-nodes", "big")
PRESENCE_CHECK_S = 2.0  # a daemon checks its session this often
_HOLDERS = (
    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
    " WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1 AND l.objid = $2"
    " AND l.objsubid = 1 AND l.pid <> pg_backend_pid() ORDER BY 1"
)


class ControlPlaneInUse(StorageError):
    """A daemon found a recover on the control plane, or a recover found daemons (a daemon
    exits 1 and is restarted: the recover ends)."""

    code = "control_plane_in_use"


Connect = Callable[[], Awaitable[asyncpg.Connection]]


@contextlib.asynccontextmanager
async def presence(
    tg: anyio.abc.TaskGroup,
    dsn: str,
    *,
    password: str | None,
    connect_timeout_s: float,
    application_name: str,
    exclusive: bool,
) -> AsyncIterator[None]:
    """Hold the presence lock within the block: shared (a daemon: kept across lost sessions by
    a task in `tg`) or exclusive (a recover). Raises `ControlPlaneInUse` if the other kind
    holds it."""
    where = redacted(dsn)

    async def connect() -> asyncpg.Connection:
        return await asyncpg.connect(
            dsn,
            password=password,
            timeout=connect_timeout_s,
            server_settings={"application_name": application_name},
        )

    held = [await _take(connect, where, exclusive)]
    try:
        if exclusive:
            yield
        else:
            scope = anyio.CancelScope()
            tg.start_soon(_keep, held, connect, where, scope)
            try:
                yield
            finally:
                scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await _close(held[0])


async def _take(connect: Connect, where: str, exclusive: bool) -> asyncpg.Connection:
    try:
        connection = await connect()
    except (*CONNECTION_ERRORS, asyncpg.PostgresError) as error:
        raise StorageError(f"{where}: cannot connect: {error!r}") from None
    try:
        function = "pg_try_advisory_lock" if exclusive else "pg_try_advisory_lock_shared"
        if await connection.fetchval(f"SELECT {function}($1)", PRESENCE_LOCK_KEY):
            return connection
        holders = [name for (name,) in await connection.fetch(_HOLDERS, *_split(PRESENCE_LOCK_KEY))]
    except (*CONNECTION_ERRORS, asyncpg.PostgresError) as error:
        await _close(connection)
        raise StorageError(f"{where}: cannot take the presence lock: {error!r}") from None
    await _close(connection)
    named = f" ({', '.join(holders)})" if holders else ""
    if exclusive:
        raise ControlPlaneInUse(f"daemons are running on this control plane{named}: stop every one first")
    raise ControlPlaneInUse(
        f"{where}: `levelzero recover` is running on this control plane{named}: "
        "start the daemon once it has finished"
    )


async def _keep(
    held: list[asyncpg.Connection], connect: Connect, where: str, scope: anyio.CancelScope
) -> None:
    """A daemon's lock across lost sessions, until `scope` is cancelled."""
    with scope:
        lost = False
        while True:
            await anyio.sleep(PRESENCE_CHECK_S)
            if not lost:
                try:
                    with anyio.fail_after(PRESENCE_CHECK_S * 5):
                        await held[0].fetchval("SELECT 1")
                    continue
                except (*CONNECTION_ERRORS, asyncpg.PostgresError) as error:
                    log.warning(
                        "%s: the daemon's presence session was lost (%r): taking it again", where, error
                    )
                    lost = True
                    held[0].terminate()
            try:
                held[0] = await _take(connect, where, exclusive=False)
            except ControlPlaneInUse as refused:
                raise ControlPlaneInUse(
                    f"{refused}; it took the control plane while this daemon's session was lost: stopping"
                ) from None
            except StorageError:
                continue  # the server is not back yet: the next check tries again
            log.info("%s: the daemon's presence lock is held again", where)
            lost = False


async def _close(connection: asyncpg.Connection) -> None:
    """End a session (its locks with it), quietly: a lost one is already gone."""
    try:
        with anyio.fail_after(5):
            await connection.close()
    except Exception:  # noqa: BLE001 - ending a session that may be broken: terminate it
        connection.terminate()


def _split(key: int) -> tuple[int, int]:
    """pg_locks's (classid, objid) of a bigint advisory key."""
    return key >> 32, key & 0xFFFF_FFFF
