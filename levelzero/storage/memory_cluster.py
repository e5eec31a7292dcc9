"""An in-memory `ClusterControl` over a `MemoryLogStore`, with the PostgreSQL one's rules:
leases timed by one injected clock (the control plane's, not a node's), a node id's live row
never taken by a registration with another advertise URL, rows expired past a bound forgotten,
partition leases taken only when free,
expired or already held, released at once on a hand-over; a node's calls fenced by the
incarnation its last registration got; published `M(p)` only rising; a
watermark snapshot of every partition and the cluster epoch read at one instant. For tests and
the simulation (several real nodes over one control plane, in virtual time).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from msgspec.structs import replace

from levelzero.core.errors import NodeIdTaken
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.protocols import ClusterView, LeaseRow, NodeRow


class MemoryClusterControl:
    def __init__(self, log: MemoryLogStore, clock: Callable[[], float]) -> None:
        self._log = log
        self._clock = clock
        self.nodes: dict[str, NodeRow] = {}
        self.leases: dict[int, tuple[str, float]] = {}  # pid -> (node, expires at)
        self.watermarks: dict[int, int] = {}
        self.identity: str | None = None
        self._incarnations = 0  # the last incarnation given (to any node)

    async def advance_cluster_epoch(self) -> int:
        """The stored epoch plus one (the PostgreSQL store's atomic increment)."""
        self._log.cluster_epoch += 1
        return self._log.cluster_epoch

    # ------------------------------------------------------------------ membership

    async def cluster_id(self, proposed: str) -> str:
        if self.identity is None:
            self.identity = proposed
        return self.identity

    async def register_node(
        self, node_id: str, advertise_url: str, kafka_url: str | None, ttl_s: float
    ) -> int:
        assert ttl_s > 0, ttl_s
        now = self._clock()
        old = self.nodes.get(node_id)
        if old is not None and old.advertise_url != advertise_url and old.lease_expires_at > now:
            raise NodeIdTaken(node_id, old.advertise_url, old.lease_expires_at - now)
        self._incarnations += 1
        self.nodes[node_id] = NodeRow(
            node_id,
            advertise_url,
            kafka_url,
            old.registered_at if old is not None else now,
            now + ttl_s,
            False,
            self._incarnations,
        )
        return self._incarnations

    def _ours(self, node_id: str, incarnation: int) -> NodeRow | None:
        """The node's row, if `incarnation` is its current one."""
        row = self.nodes.get(node_id)
        return row if row is not None and row.incarnation == incarnation else None

    async def renew_node(self, node_id: str, incarnation: int, ttl_s: float) -> bool:
        now = self._clock()
        row = self._ours(node_id, incarnation)
        if row is None or row.lease_expires_at <= now:
            return False
        self.nodes[node_id] = replace(row, lease_expires_at=now + ttl_s)
        return True

    async def set_draining(self, node_id: str, incarnation: int) -> None:
        row = self._ours(node_id, incarnation)
        if row is not None:
            self.nodes[node_id] = replace(row, draining=True)

    async def leave_node(self, node_id: str, incarnation: int) -> None:
        if self._ours(node_id, incarnation) is None:
            return
        await self.release_leases(
            node_id, incarnation, [pid for pid, (n, _) in self.leases.items() if n == node_id]
        )
        self.nodes.pop(node_id, None)

    async def forget_expired_nodes(self, expired_for_s: float) -> list[str]:
        assert expired_for_s > 0, expired_for_s
        now = self._clock()
        forgotten = sorted(n for n, row in self.nodes.items() if row.lease_expires_at <= now - expired_for_s)
        for node_id in forgotten:
            del self.nodes[node_id]
        for pid, (holder, expires) in list(self.leases.items()):
            if holder in forgotten and expires <= now:
                del self.leases[pid]
        return forgotten

    async def cluster_view(self) -> ClusterView:
        now = self._clock()
        leases = []
        for row in await self._log.list_partitions():
            node, expires = self.leases.get(row.pid, (None, 0.0))
            leases.append(LeaseRow(row.pid, row.topic, row.partition, node, expires, row.term))
        nodes = [self.nodes[n] for n in sorted(self.nodes)]
        configs = {topic: dict(c) for topic, c in self._log.configs.items()}
        return ClusterView(now, nodes, leases, configs)

    # ------------------------------------------------------------------ partition leases

    async def acquire_leases(
        self, node_id: str, incarnation: int, pids: Sequence[int], ttl_s: float
    ) -> list[int]:
        assert ttl_s > 0, ttl_s
        now = self._clock()
        taken: list[int] = []
        if self._ours(node_id, incarnation) is None:
            return taken
        for pid in pids:
            if pid not in self._log.partitions:
                continue
            holder, expires = self.leases.get(pid, (None, 0.0))
            if holder is None or holder == node_id or expires <= now:
                self.leases[pid] = (node_id, now + ttl_s)
                taken.append(pid)
        return taken

    async def renew_leases(self, node_id: str, incarnation: int, ttl_s: float) -> list[int]:
        now = self._clock()
        held: list[int] = []
        for pid in [pid for pid in self.leases if pid not in self._log.partitions]:
            del self.leases[pid]  # a deleted topic's partition (PostgreSQL deletes them together)
            self.watermarks.pop(pid, None)
        if self._ours(node_id, incarnation) is None:
            return held
        for pid, (holder, expires) in self.leases.items():
            if holder == node_id and expires > now:
                self.leases[pid] = (node_id, now + ttl_s)
                held.append(pid)
        return sorted(held)

    async def release_leases(self, node_id: str, incarnation: int, pids: Sequence[int]) -> None:
        if self._ours(node_id, incarnation) is None:
            return
        for pid in pids:
            holder, _ = self.leases.get(pid, (None, 0.0))
            if holder == node_id:
                del self.leases[pid]

    # ------------------------------------------------------------------ watermarks

    async def publish_watermarks(self, values: Mapping[int, int]) -> None:
        for pid, value in values.items():
            if pid in self._log.partitions and value > self.watermarks.get(pid, value - 1):
                self.watermarks[pid] = value

    async def watermark_snapshot(self) -> tuple[int, dict[str, int | None]]:
        epoch = self._log.cluster_epoch
        return epoch, {
            f"{row.topic}/{row.partition}": self.watermarks.get(row.pid)
            for row in await self._log.list_partitions()
        }
