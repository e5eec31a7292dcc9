"""On PostgreSQL, a daemon and `levelzero recover --from-bucket` keep each other out (the
presence lock, storage/postgres/presence.py), whether or not the daemon is in a cluster: a
recover refused while a daemon runs (naming it), a daemon refused while a recover runs, and a
daemon whose session was lost stops if a recover took the control plane meanwhile, or takes
its lock again if none did."""

from __future__ import annotations

from pathlib import Path

import anyio
import asyncpg
import pytest
from daemon_support import daemon_and_client, daemon_config, postgres_control, postgres_overrides

from levelzero.cli.main import main
from levelzero.daemon.service import running_daemon
from levelzero.storage.postgres.presence import PRESENCE_CHECK_S, PRESENCE_LOCK_KEY, ControlPlaneInUse

WAIT_S = 30.0
HOLDERS = (
    "SELECT l.pid, l.mode, a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
    " WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1 AND l.objid = $2 AND l.objsubid = 1"
)


async def holders(dsn: str) -> list[tuple[int, str, str]]:
    connection = await asyncpg.connect(dsn)
    try:
        rows = await connection.fetch(HOLDERS, PRESENCE_LOCK_KEY >> 32, PRESENCE_LOCK_KEY & 0xFFFF_FFFF)
    finally:
        await connection.close()
    return [(r["pid"], r["mode"], r["application_name"]) for r in rows]


async def test_a_recover_is_refused_while_a_daemon_not_in_a_cluster_runs(
    tmp_path: Path, postgres_dsn: str, monkeypatch, capsys
) -> None:
    for name, value in postgres_control(postgres_dsn).items():
        monkeypatch.setenv(name, value)
    data = tmp_path / "data"
    settings = {**postgres_overrides(postgres_dsn), "cluster__node_id": "n1"}
    async with daemon_and_client(data, **settings) as (_, client):
        await client.create_topic("t", 1)
        ((_, mode, name),) = await holders(postgres_dsn)
        assert (mode, name) == ("ShareLock", "levelzero n1")
        capsys.readouterr()
        code = await anyio.to_thread.run_sync(main, ["recover", "--from-bucket", "--data-dir", str(data)])
        err = capsys.readouterr().err
        assert code == 1
        assert "daemons are running on this control plane (levelzero n1): stop every one first" in err, err
        assert "Traceback" not in err
        assert [t.name for t in await client.list_topics()] == ["t"]  # nothing was touched
    assert await holders(postgres_dsn) == []  # released with the daemon
    # With the daemon stopped, the recover runs (an intact control plane: nothing to adopt).
    assert await anyio.to_thread.run_sync(main, ["recover", "--from-bucket", "--data-dir", str(data)]) == 0


async def test_a_daemon_does_not_start_while_a_recover_holds_the_control_plane(
    tmp_path: Path, postgres_dsn: str
) -> None:
    config = daemon_config(tmp_path / "data", **postgres_overrides(postgres_dsn))
    recovering = await recover_session(postgres_dsn)
    try:
        assert await recovering.fetchval("SELECT pg_try_advisory_lock($1)", PRESENCE_LOCK_KEY)
        with pytest.raises(BaseException) as caught:  # noqa: PT011 - the group the daemon raises
            async with running_daemon(config):
                pytest.fail("the daemon started while a recover held the control plane")
        (refusal,) = _leaves(caught.value)
        assert isinstance(refusal, ControlPlaneInUse)
        assert "`levelzero recover` is running on this control plane (levelzero recover)" in str(refusal)
        assert "start the daemon once it has finished" in str(refusal)
    finally:
        await recovering.close()
    async with running_daemon(config):  # and once the recover has ended, it starts
        assert [mode for _, mode, _ in await holders(postgres_dsn)] == ["ShareLock"]


async def test_a_daemon_takes_its_lock_again_after_its_session_is_lost(
    tmp_path: Path, postgres_dsn: str
) -> None:
    config = daemon_config(tmp_path / "data", **postgres_overrides(postgres_dsn))
    async with running_daemon(config):
        ((first, _, _),) = await holders(postgres_dsn)
        await _terminate(postgres_dsn, first)
        with anyio.fail_after(WAIT_S):
            while not (now := await holders(postgres_dsn)) or now[0][0] == first:
                await anyio.sleep(PRESENCE_CHECK_S / 4)
        assert [mode for _, mode, _ in now] == ["ShareLock"]


async def test_a_daemon_stops_if_a_recover_took_the_control_plane_while_its_session_was_lost(
    tmp_path: Path, postgres_dsn: str
) -> None:
    config = daemon_config(tmp_path / "data", **postgres_overrides(postgres_dsn))
    recovering = await recover_session(postgres_dsn)
    try:

        async def lose_the_session_to_a_recover() -> None:
            async with running_daemon(config):
                ((daemon, _, _),) = await holders(postgres_dsn)
                await _terminate(postgres_dsn, daemon)
                # The recover takes the lock as soon as the daemon's session is gone ...
                with anyio.fail_after(WAIT_S):
                    while not await recovering.fetchval("SELECT pg_try_advisory_lock($1)", PRESENCE_LOCK_KEY):
                        await anyio.sleep(0.01)
                # ... and the daemon, finding it held at its next check, stops.
                with anyio.fail_after(WAIT_S):
                    await anyio.sleep_forever()

        with pytest.raises(BaseException) as caught:  # noqa: PT011 - the group the daemon raises
            await lose_the_session_to_a_recover()
        (refusal,) = _leaves(caught.value)
        assert isinstance(refusal, ControlPlaneInUse), repr(refusal)
        assert "took the control plane while this daemon's session was lost: stopping" in str(refusal)
    finally:
        await recovering.close()


async def recover_session(dsn: str) -> asyncpg.Connection:
    """A session named as `levelzero recover` names its own."""
    return await asyncpg.connect(dsn, server_settings={"application_name": "levelzero recover"})


async def _terminate(dsn: str, pid: int) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        assert await connection.fetchval("SELECT pg_terminate_backend($1)", pid)
    finally:
        await connection.close()


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]
