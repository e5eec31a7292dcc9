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
successful renewal, the member acts as leader of nothing, whatever the control plane would say
and whatever its round is doing (the node asks `leads` before it serves a read or a write, so a
node cut off from the control plane stops serving by its own deadline). Every control-plane call
of a round gives up after `call_timeout_s` (half the TTL): a round stuck on a dead connection
(client timeouts of 30-60 s) would otherwise never reach the resign step, which runs after a
failed round. The database fences what matters anyway (appends and term starts are
term-checked). A call given up on may still land later (its request was sent): a release landing
after the node led the partition again would leave it leading with no lease. So the round after
one registers again first: the control plane ignores every call naming the previous incarnation.

Each registration gets an incarnation from the control plane, which every later call about the
node's row and leases names: a request of a previous run of the same node id (sent before that
process died, arriving after this one registered) changes nothing.

A node id is one process's: the control plane refuses a registration while the id's row is live
under another advertise URL (`NodeIdTaken`). At start the refusal ends the process (exit 2: an
operator must give one of them another id); a running member that finds its row taken that way
(the other started while this one was paused past its TTL) logs it once as an error and leads
nothing, trying each round, until that registration lapses: two processes taking the row from
each other every round would each keep losing their leases and restarting their terms.

A crashed node's row (never removed by a graceful `leave`) is deleted by the live members'
rounds once its lease has been out for `forget_expired_after_s`; nothing reads an expired row
(every use of the view takes live nodes only), and a node coming back registers again.

What `lead` and `resign` do is the node's business (start or stop partition actors); this actor
only decides, so it runs the same over PostgreSQL and over the simulation's memory control plane.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TypeVar

import anyio
import anyio.abc

from levelzero.core.cluster import MOVES_PER_ROUND_MAX, LeaseClock, live_nodes, moves
from levelzero.core.errors import LevelZeroError, NodeIdTaken, StorageError
from levelzero.storage.protocols import ClusterControl, ClusterView

log = logging.getLogger("levelzero.cluster")

ROUNDS_PER_TTL = 3
EXPIRY_MARGIN_S = 0.05  # a round this long after another node's lease ran out (clock rounding)
ROUND_GAP_MIN_S = 0.05  # rounds never run back to back
# A control-plane call of a round gives up after this fraction of the TTL: a renewal answered
# later leaves less than (1 - margin - this) of the TTL to use it, and one never answered (a
# blackholed connection) must not keep the round from resigning.
CALL_TIMEOUT_FRACTION = 0.5
DEADLINE_WATCH_STEP_MIN_S = 0.001
# A crashed node's row is deleted once its lease has been out this long: `levelzero cluster`
# shows it "expired" meanwhile, long enough for an operator to notice the crash.
FORGET_EXPIRED_AFTER_S = 3600.0

T = TypeVar("T")

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
        forget_expired_after_s: float = FORGET_EXPIRED_AFTER_S,
    ) -> None:
        assert ttl_s > 0, ttl_s
        assert forget_expired_after_s > 0, forget_expired_after_s
        self.control = control
        self.node_id = node_id
        self.advertise_url = advertise_url
        self.kafka_url = kafka_url
        self.ttl_s = ttl_s
        self.moves_max = moves_max
        self.forget_expired_after_s = forget_expired_after_s
        self._lead = lead
        self._resign = resign
        self._term_of = term_of
        self._clock = clock
        self.lease = LeaseClock(ttl_s)
        self.incarnation: int | None = None  # the control plane's, from the last registration
        self.call_timeout_s = ttl_s * CALL_TIMEOUT_FRACTION
        self.leading: set[int] = set()
        self.view: ClusterView | None = None
        # How many times the set of live nodes changed between two views read here (a join, a
        # lease that ran out, a leave): what a node's Kafka coordinators compare to tell that a
        # group they held may have been coordinated, and stored anew, elsewhere meanwhile, even
        # when the set came back to what it was (`Cluster.placement`).
        self.membership_changes = 0
        self._live: frozenset[str] | None = None
        self.draining = False
        self.left = False
        self.rounds = 0
        self._round_lock = anyio.Lock()
        self._view_read_at = 0.0
        self._serving: set[anyio.CancelScope] = set()  # requests the lease deadline ends
        self._renewed = anyio.Event()  # set (and replaced) at each successful renewal
        # A call that changes the control plane was given up on: it may still land. The next
        # round registers again first (a new incarnation), which voids it.
        self._in_doubt = False
        # The advertise URL of another live process under this node id, once logged (an error
        # once per conflict, not every round); None when this process holds the registration.
        self.conflict: str | None = None

    # ------------------------------------------------------------------ answers

    def leads(self, pid: int) -> bool:
        """Whether this node may serve the partition now: it took the lease and the local
        deadline of its last successful renewal has not passed (whatever a round is doing)."""
        return pid in self.leading and self.lease.valid(self._clock())

    def lease_valid(self) -> bool:
        """Whether the local deadline of the last successful renewal still holds."""
        return self.lease.valid(self._clock())

    @contextlib.contextmanager
    def serving(self) -> Iterator[anyio.CancelScope]:
        """A scope for a request served under the lease: cancelled if the lease's local
        deadline passes first without a renewal (a read waiting on a dead connection to the
        control plane is answered then, not when the connection times out)."""
        with anyio.CancelScope() as scope:
            self._serving.add(scope)
            try:
                yield scope
            finally:
                self._serving.discard(scope)

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

    def lease_holders(self) -> dict[str, str | None]:
        """Every partition of the last view -> the live node holding its lease, or None."""
        return {} if self.view is None else lease_holders(self.view)

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
        await self.register()
        try:
            await self.round()
        except LevelZeroError as exc:  # e.g. a call past `call_timeout_s`: the loop tries again
            log.warning("the first cluster round failed (leading nothing yet): %s", exc)
        task_status.started()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch_deadline)
            await self._rounds()

    async def _rounds(self) -> None:
        while True:
            await anyio.sleep(self._next_round_in_s())
            try:
                await self.round()
            except LevelZeroError as exc:  # the control plane is away: leases run out locally
                log.warning("cluster round failed: %s", exc)
                await self._self_fence()

    async def _watch_deadline(self) -> None:
        """Whatever the rounds are doing: once the lease's local deadline passes without a
        renewal, end the requests served under it (`serving`), then wait for a renewal."""
        while True:
            renewed = self._renewed
            deadline = self.lease.deadline
            left = None if deadline is None else deadline - self._clock()
            if left is not None and left > 0:
                # (At least a millisecond: `left` is on the member's clock, the sleep on the
                # loop's; a member clock slower than the loop's made ever shorter steps that
                # never reached the deadline once they fell below the clock's resolution.)
                await anyio.sleep(max(left, DEADLINE_WATCH_STEP_MIN_S))
                continue
            for scope in list(self._serving):
                scope.cancel()
            await renewed.wait()

    async def register(self) -> None:
        """Register (again): a new incarnation, which the calls about this node's row and its
        leases name from then on (the control plane ignores those naming an older one).
        `NodeIdTaken` when another live process holds the node id: at start the daemon exits."""
        self.incarnation = await self.control.register_node(
            self.node_id, self.advertise_url, self.kafka_url, self.ttl_s
        )

    async def _register_again(self, why: str, level: int = logging.WARNING) -> bool:
        """Register again within a round; False (the round ends) while another live process
        holds the node id: this one resigns everything and stands by, not taking the row back."""
        try:
            await self._call("registering the node", self.register)
        except NodeIdTaken as exc:
            if self.conflict != exc.other_url:
                self.conflict = exc.other_url
                log.error(
                    "node %s: %s; this process leads nothing until that registration lapses",
                    self.node_id,
                    exc,
                )
            await self._give_up(sorted(self.leading))
            self.lease.lost()
            await self.refresh()  # redirects go to the process holding the id
            return False
        if self.conflict is not None:
            log.warning(
                "node %s: registered again: the other process under this id (%s) is gone",
                self.node_id,
                self.conflict,
            )
            self.conflict = None
        else:
            log.log(level, "node %s: %s; registered again", self.node_id, why)
        return True

    @property
    def _life(self) -> int:
        assert self.incarnation is not None, "a call about the node before its registration"
        return self.incarnation

    async def _call(self, what: str, call: Callable[[], Awaitable[T]], *, changes: bool = True) -> T:
        """One control-plane call of a round, given up after `call_timeout_s` (a retriable
        StorageError: the round fails, the lease runs out locally, `_self_fence` resigns). A
        call that `changes` the control plane, given up on, is in doubt until the next round
        registers again."""
        with anyio.move_on_after(self.call_timeout_s):
            return await call()
        if changes:
            self._in_doubt = True
        raise StorageError(f"the control plane did not answer {what} within {self.call_timeout_s:g} s")

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
        c = self.control
        if self._in_doubt:
            # A call of an earlier round was given up on and may still land (three-node
            # simulation seed 1832: a release sent before a hand-over, answered after the
            # timeout, landed after the next round had adopted the lease again). Calls naming
            # the previous incarnation change nothing once this registration is in.
            if not await self._register_again("a control-plane call timed out: voiding it", logging.INFO):
                return
            self._in_doubt = False
        sent_at = self._clock()
        if not await self._call(
            "renewing the node", lambda: c.renew_node(self.node_id, self._life, self.ttl_s)
        ) and not await self._register_again("the control plane forgot this node"):
            return
        held = set(
            await self._call("renewing leases", lambda: c.renew_leases(self.node_id, self._life, self.ttl_s))
        )
        self.lease.renewed(sent_at)
        self._renewed.set()
        self._renewed = anyio.Event()
        lost = sorted(self.leading - held)
        if lost:
            log.warning(
                "node %s: leases of %d partitions expired (a pause?): resigning them", self.node_id, len(lost)
            )
            await self._give_up(lost)
        # Leases this node id holds and this process does not lead: a previous life of the node
        # (restarted within the TTL) took them, or this process's own acquire was answered too
        # late to act on. Lead them now (a new term fences that life); left alone, they would
        # be renewed forever and led by nobody.
        adopted = sorted(held - self.leading)
        if adopted and not self.draining and self.lease.valid(self._clock()):
            log.info(
                "node %s: leading %d partitions whose leases a previous run of this node held",
                self.node_id,
                len(adopted),
            )
            self.leading.update(adopted)
            await self._lead(adopted)
        view = self._viewed(await self._call("reading the cluster view", c.cluster_view, changes=False))
        active, _draining = live_nodes(
            ((n.node_id, n.lease_expires_at, n.draining) for n in view.nodes), view.now
        )
        if self.draining and self.node_id in active:
            active.remove(self.node_id)
        await self._forget_expired(view)
        by_name = {f"{lease.topic}/{lease.partition}": lease for lease in view.leases}
        leaders = lease_holders(view)
        await self._restart_superseded(view)
        planned = moves(self.node_id, active, leaders, moves_max=self.moves_max)
        hand_over = [by_name[name].pid for name in planned.hand_over]
        if hand_over:
            await self._give_up(hand_over)
            await self._call(
                "releasing leases", lambda: c.release_leases(self.node_id, self._life, hand_over)
            )
        wanted = [by_name[name].pid for name in planned.take]
        if wanted and not self.draining:
            sent_at = self._clock()
            granted = await self._call(
                "acquiring leases", lambda: c.acquire_leases(self.node_id, self._life, wanted, self.ttl_s)
            )
            taken = [p for p in granted if p not in self.leading]
            if taken and self._clock() - sent_at >= self.ttl_s - self.lease.margin_s:
                # The answer came too late to act on: the leases may have run out and been
                # taken since. Next round's renewal says whether they are still ours.
                log.warning(
                    "node %s: leases of %d partitions were granted too late to use", self.node_id, len(taken)
                )
            elif taken:
                self.leading.update(taken)
                await self._lead(sorted(taken))

    async def _forget_expired(self, view: ClusterView) -> None:
        """Delete the rows of nodes expired for `forget_expired_after_s` (crashed, never
        restarted), only when the view shows one: no extra call in an ordinary round. Every
        live member may do it; the control plane checks the bound again as it deletes, so a
        node registering again meanwhile keeps its row. (A call given up on and landing late
        deletes only rows still past the bound by the control plane's clock: not in doubt.)"""
        bound = self.forget_expired_after_s
        if not any(n.lease_expires_at <= view.now - bound for n in view.nodes if n.node_id != self.node_id):
            return
        forgotten = await self._call(
            "forgetting expired nodes", lambda: self.control.forget_expired_nodes(bound), changes=False
        )
        if forgotten:
            log.info(
                "node %s: removed nodes %s from the cluster: their leases ran out over %g s ago",
                self.node_id,
                ", ".join(forgotten),
                bound,
            )

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
            log.warning(
                "node %s: %d partitions led here were given a newer term elsewhere: starting them again",
                self.node_id,
                len(superseded),
            )
            await self._resign(superseded)
            await self._lead(superseded)

    async def refresh(self) -> None:
        """Read the cluster view now (a topic another node just created, a leader just moved)."""
        self._viewed(await self._call("reading the cluster view", self.control.cluster_view, changes=False))

    def _viewed(self, view: ClusterView) -> ClusterView:
        """Take `view` as the latest, counting a change of the live nodes."""
        self.view = view
        self._view_read_at = self._clock()
        live = frozenset(n.node_id for n in view.nodes if n.lease_expires_at > view.now)
        if self._live is not None and live != self._live:
            self.membership_changes += 1
        self._live = live
        return view

    async def fresh_view(self, age_max_s: float) -> ClusterView | None:
        """The cluster view, read again first if it is older than `age_max_s`."""
        if self.view is None or self._clock() - self._view_read_at > age_max_s:
            await self.refresh()
        return self.view

    async def leave(self) -> None:
        """A graceful exit: no new partitions, every one resigned (drained by `resign`) and its
        lease released at once, the node's row removed. Once: a second call (a second stop)
        sends nothing (three-node simulation seed 137); and a `leave_node` of this run that
        lands after the node's next run registered names this run's incarnation, which the
        control plane no longer acts on."""
        if self.left:
            return
        self.draining = True
        async with self._round_lock:  # a round under way (a topic's creation) finishes first
            if self.left:
                return
            if self.incarnation is None:  # never registered: no row, no lease
                self.left = True
                self.lease.lost()
                return
            await self.control.set_draining(self.node_id, self._life)
            await self._give_up(sorted(self.leading))
            await self.control.leave_node(self.node_id, self._life)
            self.left = True
            self.lease.lost()

    async def _give_up(self, pids: Sequence[int]) -> None:
        pids = [pid for pid in pids if pid in self.leading]
        self.leading.difference_update(pids)
        if pids:
            await self._resign(list(pids))

    async def _self_fence(self) -> None:
        if self.leading and not self.lease.valid(self._clock()):
            log.warning("node %s: no lease renewal within the TTL: resigning every partition", self.node_id)
            await self._give_up(sorted(self.leading))


def lease_holders(view: ClusterView) -> dict[str, str | None]:
    """ "topic/partition" -> the node holding its lease, if both leases are live by `view.now`."""
    live = {n.node_id for n in view.nodes if n.lease_expires_at > view.now}
    return {
        f"{lease.topic}/{lease.partition}": (
            lease.node_id if lease.node_id in live and lease.lease_expires_at > view.now else None
        )
        for lease in view.leases
    }
