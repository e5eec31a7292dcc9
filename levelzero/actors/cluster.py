"""A node's membership and partition leadership in a cluster, by leases in the control plane.

Each round (every third of the lease TTL, and just after another node's lease runs out) the
member:
1. renews its node lease (registering again if the control plane forgot it) and every partition
   lease it holds; the local lease deadline (`core.cluster.LeaseClock`) moves only on success;
2. resigns, at once, every partition whose lease the control plane no longer lists as its own
   (a paused node waking up — a zombie — learns here that it leads nothing);
3. reads the cluster view and applies `core.cluster.moves`: hands over a bounded number of
   partitions another node should lead (`resign` drains and stops them, then the leases are
   released so the successor need not wait for the TTL), and takes the leaderless partitions it
   is preferred for (`lead` starts them: the new leader's `TermStart` fences the old term).

Between rounds, `leads(pid)` answers from the local lease deadline: once it has passed without a
successful renewal, the member acts as leader of nothing, whatever the control plane would say.
The database fences what matters anyway (appends and term starts are term-checked).

What `lead` and `resign` do is the node's business (start or stop partition actors); this actor
only decides, so it runs the same over PostgreSQL and over the simulation's memory control plane.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import anyio
import anyio.abc

from levelzero.core.cluster import MOVES_PER_ROUND_MAX, LeaseClock, live_nodes, moves
from levelzero.core.errors import LevelZeroError
from levelzero.storage.protocols import ClusterControl, ClusterView

log = logging.getLogger("levelzero.cluster")

ROUNDS_PER_TTL = 3
EXPIRY_MARGIN_S = 0.05  # a round this long after another node's lease ran out (clock rounding)
ROUND_GAP_MIN_S = 0.05  # rounds never run back to back

Callback = Callable[[list[int]], Awaitable[None]]


class ClusterMember:
    def __init__(
        self,
        control: ClusterControl,
        node_id: str,
        advertise_url: str,
        *,
        ttl_s: float,
        lead: Callback,
        resign: Callback,
        kafka_url: str | None = None,
        term_of: Callable[[int], int | None] = lambda _pid: None,
        moves_max: int = MOVES_PER_ROUND_MAX,
        clock: Callable[[], float] = anyio.current_time,
    ) -> None:
        assert ttl_s > 0, ttl_s
        self.control = control
        self.node_id = node_id
        self.advertise_url = advertise_url
        self.kafka_url = kafka_url
        self.ttl_s = ttl_s
        self.moves_max = moves_max
        self._lead = lead
        self._resign = resign
        self._term_of = term_of
        self._clock = clock
        self.lease = LeaseClock(ttl_s)
        self.leading: set[int] = set()
        self.view: ClusterView | None = None
        self.draining = False
        self.left = False
        self.rounds = 0
        self._round_lock = anyio.Lock()
        self._view_read_at = 0.0

    # ------------------------------------------------------------------ answers

    def leads(self, pid: int) -> bool:
        return pid in self.leading and self.lease.valid(self._clock())

    def leader_url(self, topic: str, partition: int) -> str | None:
        """The advertise URL of the node the last view names as the partition's live leader."""
        view = self.view
        if view is None:
            return None
        nodes = {n.node_id: n for n in view.nodes if n.lease_expires_at > view.now}
        for lease in view.leases:
            if (lease.topic, lease.partition) == (topic, partition):
                if lease.node_id in nodes and lease.lease_expires_at > view.now:
                    return nodes[lease.node_id].advertise_url
                return None
        return None

    def live_nodes(self) -> list[str] | None:
        """The live, non-draining node ids of the last view (sorted); None before the first."""
        view = self.view
        if view is None:
            return None
        return live_nodes(((n.node_id, n.lease_expires_at, n.draining) for n in view.nodes), view.now)[0]

    def partitions_known(self) -> dict[str, int]:
        """Every topic of the cluster in the last view, with its partition count."""
        topics: dict[str, int] = {}
        for lease in self.view.leases if self.view is not None else ():
            topics[lease.topic] = max(topics.get(lease.topic, 0), lease.partition + 1)
        return topics

    # ------------------------------------------------------------------ the loop

    async def run(self, *, task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        await self.control.register_node(self.node_id, self.advertise_url, self.kafka_url, self.ttl_s)
        await self.round()
        task_status.started()
        while True:
            await anyio.sleep(self._next_round_in_s())
            try:
                await self.round()
            except LevelZeroError as exc:  # the control plane is away: leases run out locally
                log.warning("cluster round failed: %s", exc)
                await self._self_fence()

    def _next_round_in_s(self) -> float:
        """A third of the TTL, or sooner: just after the next lease of another node runs out
        (by the last view), so a crashed node's partitions are taken as soon as its lease
        allows, not up to a round later."""
        wait = self.ttl_s / ROUNDS_PER_TTL
        view = self.view
        if view is not None:
            for node in view.nodes:
                left = node.lease_expires_at - view.now
                if node.node_id != self.node_id and left > 0:
                    wait = min(wait, left + EXPIRY_MARGIN_S)
        return max(wait - (self._clock() - self._view_read_at), ROUND_GAP_MIN_S)

    async def round(self) -> None:
        """One round (rounds never overlap: a topic's creation may ask for one between)."""
        async with self._round_lock:
            if not self.left:  # a round asked for after `leave` must not register again
                await self._round()

    async def _round(self) -> None:
        self.rounds += 1
        sent_at = self._clock()
        if not await self.control.renew_node(self.node_id, self.ttl_s):
            log.warning("node %s: the control plane forgot this node; registering again", self.node_id)
            await self.control.register_node(self.node_id, self.advertise_url, self.kafka_url, self.ttl_s)
        held = set(await self.control.renew_leases(self.node_id, self.ttl_s))
        self.lease.renewed(sent_at)
        lost = sorted(self.leading - held)
        if lost:
            log.warning("node %s: leases of %d partitions expired (a pause?): resigning them",
                        self.node_id, len(lost))
            await self._give_up(lost)
        # Leases this node id holds and this process does not lead: a previous life of the node
        # (restarted within the TTL) took them, or this process's own acquire was answered too
        # late to act on. Lead them now (a new term fences that life); left alone, they would
        # be renewed forever and led by nobody.
        adopted = sorted(held - self.leading)
        if adopted and not self.draining and self.lease.valid(self._clock()):
            log.info("node %s: leading %d partitions whose leases a previous run of this node "
                     "held", self.node_id, len(adopted))
            self.leading.update(adopted)
            await self._lead(adopted)
        view = self.view = await self.control.cluster_view()
        self._view_read_at = self._clock()
        active, _draining = live_nodes(
            ((n.node_id, n.lease_expires_at, n.draining) for n in view.nodes), view.now
        )
        if self.draining and self.node_id in active:
            active.remove(self.node_id)
        live = set(active) | {n.node_id for n in view.nodes if n.lease_expires_at > view.now}
        by_name = {f"{lease.topic}/{lease.partition}": lease for lease in view.leases}
        leaders = {
            name: (lease.node_id if lease.node_id in live and lease.lease_expires_at > view.now else None)
            for name, lease in by_name.items()
        }
        await self._restart_superseded(view)
        planned = moves(self.node_id, active, leaders, moves_max=self.moves_max)
        hand_over = [by_name[name].pid for name in planned.hand_over]
        if hand_over:
            await self._give_up(hand_over)
            await self.control.release_leases(self.node_id, hand_over)
        wanted = [by_name[name].pid for name in planned.take]
        if wanted and not self.draining:
            sent_at = self._clock()
            taken = [p for p in await self.control.acquire_leases(self.node_id, wanted, self.ttl_s)
                     if p not in self.leading]
            if taken and self._clock() - sent_at >= self.ttl_s - self.lease.margin_s:
                # The answer came too late to act on: the leases may have run out and been
                # taken since. Next round's renewal says whether they are still ours.
                log.warning("node %s: leases of %d partitions were granted too late to use",
                            self.node_id, len(taken))
            elif taken:
                self.leading.update(taken)
                await self._lead(sorted(taken))

    async def _restart_superseded(self, view: ClusterView) -> None:
        """Partitions this node leads whose log has a newer term than its actor's: another node
        started a term on a lease that ran out under it (its grant answered late, or it woke
        from a pause) while this node held the lease. The store refuses every append of the
        old term, so lead them again: replay, then a newer term."""
        superseded = []
        for lease in view.leases:
            if lease.pid in self.leading:
                term = self._term_of(lease.pid)
                if term is not None and lease.term > term:
                    superseded.append(lease.pid)
        if superseded:
            log.warning("node %s: %d partitions led here were given a newer term elsewhere: "
                        "starting them again", self.node_id, len(superseded))
            await self._resign(superseded)
            await self._lead(superseded)

    async def refresh(self) -> None:
        """Read the cluster view now (a topic another node just created, a leader just moved)."""
        self.view = await self.control.cluster_view()
        self._view_read_at = self._clock()

    async def fresh_view(self, age_max_s: float) -> ClusterView | None:
        """The cluster view, read again first if it is older than `age_max_s`."""
        if self.view is None or self._clock() - self._view_read_at > age_max_s:
            await self.refresh()
        return self.view

    async def leave(self) -> None:
        """A graceful exit: no new partitions, every one resigned (drained by `resign`) and its
        lease released at once, the node's row removed."""
        self.draining = True
        async with self._round_lock:  # a round under way (a topic's creation) finishes first
            await self.control.set_draining(self.node_id)
            await self._give_up(sorted(self.leading))
            await self.control.leave_node(self.node_id)
            self.left = True
            self.lease.lost()

    async def _give_up(self, pids: Sequence[int]) -> None:
        pids = [pid for pid in pids if pid in self.leading]
        self.leading.difference_update(pids)
        if pids:
            await self._resign(list(pids))

    async def _self_fence(self) -> None:
        if self.leading and not self.lease.valid(self._clock()):
            log.warning("node %s: no lease renewal within the TTL: resigning every partition",
                        self.node_id)
            await self._give_up(sorted(self.leading))
