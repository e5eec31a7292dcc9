"""The cluster's control plane: nodes, their leases on partitions, the cluster view."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import asyncpg

from levelzero.core.errors import NodeIdTaken
from levelzero.storage.protocols import ClusterView, LeaseRow, NodeRow
from .base import PostgresBase, _NOW


class ClusterRole(PostgresBase):
    # ------------------------------------------------------------------ the cluster
    # Every lease time is the database's clock (`_NOW`), never a node's: nodes whose clocks
    # differ still agree on who holds what.

    async def cluster_id(self, proposed: str) -> str:
        async def work(connection: asyncpg.Connection) -> str:
            await connection.execute(
                "INSERT INTO cluster_identity (id, cluster_id) VALUES (1, $1) ON CONFLICT (id) DO NOTHING",
                proposed,
            )
            return await connection.fetchval("SELECT cluster_id FROM cluster_identity WHERE id = 1")

        async def resolve(connection: asyncpg.Connection) -> str:
            return await connection.fetchval("SELECT cluster_id FROM cluster_identity WHERE id = 1")

        return str(await self._transact("reading the cluster id", work, resolve))

    async def replace_cluster_id(self, cluster_id: str) -> None:
        """`levelzero recover --from-bucket` on a database that holds no partition: the id a
        refused start made there gives way to the bucket's owner."""

        async def work(connection: asyncpg.Connection) -> None:
            await connection.execute(
                "INSERT INTO cluster_identity (id, cluster_id) VALUES (1, $1)"
                " ON CONFLICT (id) DO UPDATE SET cluster_id = excluded.cluster_id",
                cluster_id,
            )

        await self._transact("replacing the cluster id", work)

    async def register_node(
        self, node_id: str, advertise_url: str, kafka_url: str | None, ttl_s: float
    ) -> int:
        assert ttl_s > 0, ttl_s

        async def work(connection: asyncpg.Connection) -> int:
            # One statement: the row is taken only if it is this node's (same advertise URL: a
            # restart) or its lease ran out; two nodes registering at once are ordered by it.
            incarnation = await connection.fetchval(
                "INSERT INTO cluster_nodes (node_id, advertise_url, kafka_url, registered_at,"
                f" lease_expires_at, draining, incarnation) VALUES ($1, $2, $3, {_NOW}, {_NOW} + $4,"
                " false, nextval('cluster_node_incarnations'))"
                " ON CONFLICT (node_id) DO UPDATE SET advertise_url = excluded.advertise_url,"
                " kafka_url = excluded.kafka_url, lease_expires_at = excluded.lease_expires_at,"
                " draining = false, incarnation = excluded.incarnation"
                " WHERE cluster_nodes.advertise_url = excluded.advertise_url"
                f" OR cluster_nodes.lease_expires_at <= {_NOW} RETURNING incarnation",
                node_id,
                advertise_url,
                kafka_url,
                ttl_s,
            )
            if incarnation is None:
                other = await connection.fetchrow(
                    f"SELECT advertise_url, lease_expires_at - {_NOW} AS left_s FROM cluster_nodes"
                    " WHERE node_id = $1",
                    node_id,
                )
                if other is None:  # gone meanwhile (the other process left): the id is free
                    return await work(connection)
                raise NodeIdTaken(node_id, other["advertise_url"], float(other["left_s"]))
            return int(incarnation)

        async def resolve(connection: asyncpg.Connection) -> int:
            return int(
                await connection.fetchval("SELECT incarnation FROM cluster_nodes WHERE node_id = $1", node_id)
            )

        return int(await self._transact(f"registering node {node_id}", work, resolve))

    @staticmethod
    async def _ours(connection: asyncpg.Connection, node_id: str, incarnation: int) -> bool:
        """Whether `incarnation` is the node's current one; the row stays so (share-locked)
        until the transaction ends: a registration meanwhile waits, and is ordered after."""
        row = await connection.fetchrow(
            "SELECT 1 FROM cluster_nodes WHERE node_id = $1 AND incarnation = $2 FOR SHARE",
            node_id,
            incarnation,
        )
        return row is not None

    async def renew_node(self, node_id: str, incarnation: int, ttl_s: float) -> bool:
        async def work(connection: asyncpg.Connection) -> bool:
            row = await connection.fetchrow(
                f"UPDATE cluster_nodes SET lease_expires_at = {_NOW} + $2"
                f" WHERE node_id = $1 AND incarnation = $3 AND lease_expires_at > {_NOW} RETURNING node_id",
                node_id,
                ttl_s,
                incarnation,
            )
            return row is not None

        async def resolve(connection: asyncpg.Connection) -> bool:
            return (
                await connection.fetchval(
                    f"SELECT lease_expires_at > {_NOW} FROM cluster_nodes"
                    " WHERE node_id = $1 AND incarnation = $2",
                    node_id,
                    incarnation,
                )
                is True
            )

        return bool(await self._transact(f"renewing node {node_id}", work, resolve))

    async def set_draining(self, node_id: str, incarnation: int) -> None:
        async def work(connection: asyncpg.Connection) -> None:
            await connection.execute(
                "UPDATE cluster_nodes SET draining = true WHERE node_id = $1 AND incarnation = $2",
                node_id,
                incarnation,
            )

        await self._transact(f"draining node {node_id}", work)

    async def leave_node(self, node_id: str, incarnation: int) -> None:
        async def work(connection: asyncpg.Connection) -> None:
            if not await self._ours(connection, node_id, incarnation):
                return
            await connection.execute(
                "UPDATE partition_leases SET node_id = NULL, lease_expires_at = 0 WHERE node_id = $1",
                node_id,
            )
            await connection.execute(
                "DELETE FROM cluster_nodes WHERE node_id = $1 AND incarnation = $2", node_id, incarnation
            )

        await self._transact(f"node {node_id} leaving", work)

    async def forget_expired_nodes(self, expired_for_s: float) -> list[str]:
        async def work(connection: asyncpg.Connection) -> list[str]:
            # The bound is checked in the DELETE itself: a node registering again meanwhile
            # (its lease renewed) keeps its row.
            rows = await connection.fetch(
                f"DELETE FROM cluster_nodes WHERE lease_expires_at <= {_NOW} - $1 RETURNING node_id",
                expired_for_s,
            )
            forgotten = sorted(row["node_id"] for row in rows)
            if forgotten:
                await connection.execute(
                    "UPDATE partition_leases SET node_id = NULL, lease_expires_at = 0"
                    f" WHERE node_id = ANY($1::text[]) AND lease_expires_at <= {_NOW}",
                    forgotten,
                )
            return forgotten

        assert expired_for_s > 0, expired_for_s
        return list(await self._transact("forgetting expired nodes", work))

    async def cluster_view(self) -> ClusterView:
        async def attempt() -> ClusterView:
            async with (
                self._pool.acquire() as connection,
                connection.transaction(isolation="repeatable_read", readonly=True),
            ):
                now = await connection.fetchval(f"SELECT {_NOW}")
                nodes = await connection.fetch(
                    "SELECT node_id, advertise_url, kafka_url, registered_at, lease_expires_at,"
                    " draining, incarnation FROM cluster_nodes ORDER BY node_id"
                )
                leases = await connection.fetch(
                    "SELECT p.pid, p.topic, p.partition, l.node_id,"
                    " COALESCE(l.lease_expires_at, 0), p.term FROM partitions p"
                    " LEFT JOIN partition_leases l ON l.pid = p.pid ORDER BY p.pid"
                )
                config_rows = await connection.fetch(
                    "SELECT topic, name, value FROM topic_configs ORDER BY topic, name"
                )
            configs: dict[str, dict[str, str]] = {}
            for topic, name, value in config_rows:
                configs.setdefault(topic, {})[name] = value
            return ClusterView(
                float(now), [NodeRow(*row) for row in nodes], [LeaseRow(*row) for row in leases], configs
            )

        self._check_open()
        return await self._retrying(attempt, "reading the cluster view")

    async def _held(
        self, connection: asyncpg.Connection, node_id: str, incarnation: int, pids: Sequence[int] | None
    ) -> list[int]:
        if not await self._ours(connection, node_id, incarnation):
            return []
        rows = await connection.fetch(
            f"SELECT pid FROM partition_leases WHERE node_id = $1 AND lease_expires_at > {_NOW}"
            " AND ($2::bigint[] IS NULL OR pid = ANY($2::bigint[])) ORDER BY pid",
            node_id,
            None if pids is None else list(pids),
        )
        return [row["pid"] for row in rows]

    async def acquire_leases(
        self, node_id: str, incarnation: int, pids: Sequence[int], ttl_s: float
    ) -> list[int]:
        assert ttl_s > 0, ttl_s
        if not pids:
            return []
        wanted = sorted(set(pids))

        async def work(connection: asyncpg.Connection) -> list[int]:
            if not await self._ours(connection, node_id, incarnation):
                return []
            # A row per partition first (existing ones untouched), then take those free,
            # expired or ours, in pid order (concurrent acquirers never deadlock).
            await connection.execute(
                "INSERT INTO partition_leases (pid, node_id, lease_expires_at)"
                " SELECT pid, NULL, 0 FROM partitions WHERE pid = ANY($1::bigint[])"
                " ON CONFLICT (pid) DO NOTHING",
                wanted,
            )
            rows = await connection.fetch(
                f"UPDATE partition_leases SET node_id = $1, lease_expires_at = {_NOW} + $3"
                " WHERE pid IN (SELECT pid FROM partition_leases WHERE pid = ANY($2::bigint[])"
                f" AND (node_id IS NULL OR node_id = $1 OR lease_expires_at <= {_NOW})"
                " ORDER BY pid FOR UPDATE) RETURNING pid",
                node_id,
                wanted,
                ttl_s,
            )
            return sorted(row["pid"] for row in rows)

        async def resolve(connection: asyncpg.Connection) -> list[int]:
            return await self._held(connection, node_id, incarnation, wanted)

        return await self._transact(f"node {node_id} acquiring leases", work, resolve)

    async def renew_leases(self, node_id: str, incarnation: int, ttl_s: float) -> list[int]:
        async def work(connection: asyncpg.Connection) -> list[int]:
            if not await self._ours(connection, node_id, incarnation):
                return []
            rows = await connection.fetch(
                f"UPDATE partition_leases SET lease_expires_at = {_NOW} + $2"
                f" WHERE node_id = $1 AND lease_expires_at > {_NOW} RETURNING pid",
                node_id,
                ttl_s,
            )
            return sorted(row["pid"] for row in rows)

        async def resolve(connection: asyncpg.Connection) -> list[int]:
            return await self._held(connection, node_id, incarnation, None)

        return await self._transact(f"node {node_id} renewing leases", work, resolve)

    async def release_leases(self, node_id: str, incarnation: int, pids: Sequence[int]) -> None:
        if not pids:
            return

        async def work(connection: asyncpg.Connection) -> None:
            if not await self._ours(connection, node_id, incarnation):
                return
            await connection.execute(
                "UPDATE partition_leases SET node_id = NULL, lease_expires_at = 0"
                " WHERE node_id = $1 AND pid = ANY($2::bigint[])",
                node_id,
                sorted(set(pids)),
            )

        await self._transact(f"node {node_id} releasing leases", work)

    async def publish_watermarks(self, values: Mapping[int, int]) -> None:
        if not values:
            return
        pids, mps = zip(*sorted(values.items()), strict=True)

        async def work(connection: asyncpg.Connection) -> None:
            await connection.execute(
                "INSERT INTO partition_watermarks (pid, mp, published_at)"
                f" SELECT v.pid, v.mp, {_NOW} FROM unnest($1::bigint[], $2::bigint[]) AS v (pid, mp)"
                " JOIN partitions p ON p.pid = v.pid"
                " ON CONFLICT (pid) DO UPDATE SET mp = GREATEST(partition_watermarks.mp, excluded.mp),"
                " published_at = excluded.published_at",
                list(pids),
                list(mps),
            )

        await self._transact("publishing watermarks", work)

    async def watermark_snapshot(self) -> tuple[int, dict[str, int | None]]:
        async def attempt() -> tuple[int, dict[str, int | None]]:
            async with (
                self._pool.acquire() as connection,
                connection.transaction(isolation="repeatable_read", readonly=True),
            ):
                epoch = await connection.fetchval(
                    "SELECT COALESCE((SELECT epoch FROM cluster_epoch WHERE id = 1), 1)"
                )
                rows = await connection.fetch(
                    "SELECT p.topic, p.partition, w.mp FROM partitions p"
                    " LEFT JOIN partition_watermarks w ON w.pid = p.pid ORDER BY p.pid"
                )
            return int(epoch), {f"{r['topic']}/{r['partition']}": r["mp"] for r in rows}

        self._check_open()
        return await self._retrying(attempt, "reading the watermark snapshot")
