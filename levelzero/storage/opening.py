"""Opening the stores a configuration names: the object store (local directory or S3, under the
configured key prefix) and the control plane (SQLite or PostgreSQL). The daemon and the export
both open their stores here, so neither reaches into the other.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import anyio.abc

from levelzero.storage.local_store import LocalObjectStore
from levelzero.storage.postgres.presence import presence
from levelzero.storage.postgres.store import PostgresLogStore
from levelzero.storage.prefixed_store import PrefixedObjectStore
from levelzero.storage.protocols import ObjectStore
from levelzero.storage.sqlite import SqliteLogStore

if TYPE_CHECKING:
    from levelzero.config import Config


async def open_object_store(config: Config) -> ObjectStore:
    """The object store `[storage]` and `[s3]` name, under `s3.key_prefix` when set."""
    store = await _open_base_store(config)
    if config.storage.kind == "s3" and config.s3.key_prefix:
        store = PrefixedObjectStore(store, config.s3.key_prefix)
    return store


async def _open_base_store(config: Config) -> ObjectStore:
    if config.storage.kind == "local":
        return LocalObjectStore(config.storage.objects_dir, fsync=config.storage.local_fsync)
    from levelzero.storage.s3_store import S3Config, S3ObjectStore  # noqa: PLC0415 - aiobotocore: only for S3

    s3 = config.s3
    return await S3ObjectStore.open(
        S3Config(
            bucket=s3.bucket,
            endpoint_url=s3.endpoint or None,
            region=s3.region,
            path_style=s3.path_style,
            access_key=s3.access_key or None,
            secret_key=s3.secret_key or None,
            session_token=s3.session_token or None,
            concurrency=s3.concurrency,
            max_attempts=s3.max_attempts,
            connect_timeout_s=s3.connect_timeout_s,
            read_timeout_s=s3.read_timeout_s,
            create_bucket=s3.create_bucket,
        )
    )


ControlStore = SqliteLogStore | PostgresLogStore


async def open_control_store(
    tg: anyio.abc.TaskGroup, config: Config, *, application_name: str = "levelzero"
) -> ControlStore:
    """The control plane `[control]` names, its writer running in `tg`; on PostgreSQL its
    sessions carry `application_name` (pg_stat_activity names the node by it)."""
    control = config.control
    if control.kind == "postgres":
        return await PostgresLogStore.open_in(
            tg,
            control.dsn,
            password=control.read_password(),
            pool_max=control.pool_max,
            writers=control.writers,
            connect_timeout_s=control.connect_timeout_s,
            reconnect_timeout_s=control.reconnect_timeout_s,
            # A paused node's open transaction holds its partitions' rows no longer than its
            # leases on them last (docs/cluster.md).
            idle_in_transaction_timeout_s=config.cluster.lease_ttl_s,
            application_name=application_name,
        )
    return await SqliteLogStore.open_in(
        tg, config.storage.db_path, synchronous=config.storage.sqlite_synchronous
    )


@contextlib.asynccontextmanager
async def control_plane_presence(
    tg: anyio.abc.TaskGroup, config: Config, *, application_name: str, exclusive: bool
) -> AsyncIterator[None]:
    """On PostgreSQL, the presence lock within the block: shared for a daemon (its keeper in
    `tg`), exclusive for `levelzero recover` (storage/postgres/presence.py). SQLite: nothing to
    take, the store's file lock keeps a second process out."""
    control = config.control
    if control.kind != "postgres":
        yield
        return
    async with presence(
        tg,
        control.dsn,
        password=control.read_password(),
        connect_timeout_s=control.connect_timeout_s,
        application_name=application_name,
        exclusive=exclusive,
    ):
        yield
