"""The simulated world: the shipping `Node` over the memory log store and the memory object
store, with producers, readers, epoch bumps, partition creation, seeded faults and crashes.

A crash drops the live `Node` mid-flight: its connection to the log store is cut at once (the
process is gone), while its object-store requests already on the wire still land for a while
(the zombie work: uploads that become orphans, GC deletes decided under an old `M`, L1 copies of
an old term). Then the zombie is cancelled, and a new `Node` starts over the same stores: it
replays every partition, begins a new term, and its epoch cache may start stale (as a node
whose cache lags would). After the workload, a quiet period runs until every L0 object is
collected (invariant 4). Everything runs on the deterministic loop (`loop.py`); every random
draw comes from the seed's one `random.Random`.

With `nodes > 1` the world is a cluster: that many real `Node`s, each with its own epoch cache,
over one memory control plane (`storage/memory_cluster.py`, timed by the virtual clock) and the
same stores. Leadership moves by the shipping `ClusterMember`'s leases. Clients enter at any live
node and follow its `LedElsewhere` to the leader, as the bundled client follows a redirect. Nodes
crash and restart (within their lease or after it), stop gracefully (a hand-over with no lease
wait) and are paused: cut off from the database and the control plane past their lease, so what
they decided before reaches the database after another node took their partitions.
"""

from __future__ import annotations

import asyncio
import random
import zlib
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
import anyio.abc

from levelzero.actors.batcher import BatcherConfig
from levelzero.actors.compactor import CompactorConfig
from levelzero.actors.gc import GcConfig
from levelzero.actors.housekeeper import HousekeeperConfig
from levelzero.actors.intake import ProduceIntake
from levelzero.actors.cluster import ClusterMember
from levelzero.actors.node import ClusterSettings, Node, NodeConfig
from levelzero.actors.partition import PartitionActor
from levelzero.actors.reconciler import ReconcilerConfig
from levelzero.core.cluster import CLOCK_RATE_DRIFT_MAX
from levelzero.core.entries import TermStart
from levelzero.core.errors import (
    LedElsewhere,
    LevelZeroError,
    NotLeader,
    ObjectNotFound,
    OffsetOutOfRange,
    ShuttingDown,
    StaleClusterEpoch,
    StorageError,
    UnknownTopic,
)
from levelzero.core.fence import FenceMode
from levelzero.core.gc import compute_cluster_watermark
from levelzero.core.reconcile_health import RECONCILE_FAILING_RETRY_S
from levelzero.core.keys import parse_l0_key
from levelzero.core.leader import l1_collect_reason
from levelzero.storage.protocols import L1State
from levelzero.core.l0format import Record
from levelzero.storage.memory_cluster import MemoryClusterControl
from levelzero.storage.memory_store import MemoryObjectStore

from .checks import L0_ROOT, Truth, observed_pins
from .compaction import CompactionSim
from .config import SimConfig
from .faults import Gate, Gates, Link, SeededFaults, SimLogStore, SimTxnLogStore, Wire
from .idempotent import IdempotentProducers
from .transactions import TransactionSim, drawn
from .violation import SimulationViolation

# The wall clock of the simulated world: virtual seconds after a fixed instant.
WALL_START_S = 1_700_000_000.0
FETCH_BYTES = 4096
NODE_IDS = "abcdefgh"  # a cluster's node ids, in order
REDIRECTS_MAX = 3  # as the bundled client: hops to the leader a request follows
GC_ROUND_WAIT_S = 1.0  # a creation waits this long at most for a GC round to open
GC_ROUND_STEP_S = 0.005  # ... and enters it up to this far in


# Per-seed rates (scaled by one of `swarm_scales`, 0 turns the fault off) and workload intervals
# (scaled by one of `swarm_mix`).
_SWARMED_RATES = (
    "put_error_p",
    "get_error_p",
    "list_error_p",
    "delete_batch_error_p",
    "delete_key_error_p",
    "slow_put_p",
    "slow_get_p",
    "slow_log_p",
    "control_error_p",
    "control_slow_p",
)
_SWARMED_INTERVALS = ("produce_interval_s", "read_interval_s", "crash_interval_s", "bump_interval_s")

# The control-plane calls of a leadership round (`ClusterMember._round`): an error fails it.
_ROUND_CALLS = frozenset({"renew_node", "renew_leases", "cluster_view", "acquire_leases"})


class RequestTimedOut(LevelZeroError):
    """A simulated client gave up on a node (one that died holds its request forever)."""


@dataclass(eq=False)
class Incarnation:
    """One life of the node: a `Node` and its connection to the log store."""

    number: int
    node: Node
    gate: Gate
    node_id: str | None = None  # in a cluster
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    tg: anyio.abc.TaskGroup | None = None
    alive: bool = True  # False from the crash on (a zombie until its scope is cancelled)
    ended: bool = False
    change: Change | None = None  # None for the first incarnation
    control_gate: Gate = field(default_factory=Gate)
    stopping: bool = False  # a graceful stop began
    kill_after: str | None = None  # a stop killed just after this control-plane call is sent
    intake: ProduceIntake | None = None  # Kafka's produce intake on this node (idempotent producers)
    kafka: Any = None  # the shipping Kafka API on it (`kafka.handlers.Handlers`): transactions' seeds

    def __repr__(self) -> str:
        return f"n{self.number}" if self.node_id is None else f"{self.node_id}{self.number}"

    @property
    def takes_requests(self) -> bool:
        """A client's request may start here: the node runs, no graceful stop began, and its
        task group is not being cancelled (a node whose task failed, as a violation makes it).
        A task started in a task group whose cancellation anyio already delivered to every
        task is never cancelled: its first checkpoint waits for a delivery that does not come,
        and yields at once, forever (on a real loop a CPU spin until the group's last shielded
        task ends; here a livelock: the clock never moves on to end that task)."""
        return (
            self.tg is not None
            and not self.ended
            and not self.stopping
            and not self.scope.cancel_called
            and not self.tg.cancel_scope.cancel_called
        )


@dataclass(eq=False, slots=True)
class Change:
    """A new incarnation taking over every partition: the write stall after it (invariant 6)."""

    at: float
    incarnation: int
    cache_behind: int  # epochs its cache started behind the cluster epoch (0: fresh)
    stall_s: float = 0.0  # the longest a write submitted soon after waited, if it was retried
    writes: int = 0
    rejections: int = 0  # attempts beyond the first, of writes submitted soon after
    writes_over_one_retry: int = 0

    @property
    def stale(self) -> bool:
        return self.cache_behind > 0


@dataclass(slots=True)
class Stats:
    writes_submitted: int = 0
    writes_acked: int = 0
    records_acked: int = 0
    writes_failed: int = 0
    reads: int = 0
    records_read: int = 0
    crashes: int = 0
    graceful_stops: int = 0
    stops_killed: int = 0  # graceful stops killed mid-drain (just after a control-plane call)
    pauses: int = 0
    cuts: int = 0  # a node cut off the control plane alone
    epoch_bumps: int = 0
    topics_created: int = 0
    partitions_created_during_gc: int = 0
    stale_rejections: int = 0
    stale_retries: int = 0
    orphans: int = 0
    objects_uploaded: int = 0
    l1_written: int = 0
    l1_rounds_deferred: int = 0  # partitions a reconciler round copied in a later wave (buffer full)
    gc_rounds: int = 0
    objects_deleted: int = 0
    l0_cache_served: int = 0  # extents the readers' L0 cache sliced from an object it held or loaded
    l0_cache_loads: int = 0  # whole-object GETs it made
    heal_s: float = 0.0  # from the faults' end until every node is up again
    quiet_s: float = 0.0  # from the workload's end until every L0 object is collected
    healed_writes: int = 0
    healed_attempts_max: int = 0
    healed_write_s_max: float = 0.0
    reconcile_wait_s_max: float = 0.0  # the longest a durable record waited for LRO, healed
    collect_wait_s_max: float = 0.0  # the longest an L0 object at or below M waited, healed


class World:
    def __init__(
        self,
        seed: int,
        cfg: SimConfig,
        *,
        mode: FenceMode = FenceMode.WINDOWED,
        mutation: str | None = None,
        nodes: int = 1,
    ) -> None:
        assert 1 <= nodes <= len(NODE_IDS), nodes
        self.seed = seed
        self.nodes = nodes
        self.cfg = cfg
        self.mode = FenceMode(mode)
        self.mutation = mutation
        self.rng = rng = random.Random(seed)
        # Per-seed variation: calm and stormy, fresh and stale, balanced and skewed worlds.
        self.cache_ttl_s = rng.choice(cfg.cache_ttl_s)
        self.epoch_bump_interval_s = rng.choice(cfg.epoch_bump_interval_s)
        self.reconciler_interval_s = rng.choice(cfg.reconciler_interval_s)
        self.housekeeper_interval_s = rng.choice(cfg.housekeeper_interval_s)
        self.newest_write_p = rng.choice(cfg.newest_partition_write_p)
        self.fault_scale = rng.choice(cfg.fault_scales)
        # Drawn from a stream of its own: the world's stream (and every seed's draws) unchanged.
        self.reconciler_age_max_s = random.Random(seed + 0x1A6E).choice(cfg.reconciler_object_age_max_s)
        self.l0_cache_bytes_max = random.Random(seed + 0xCAC4E).choice(cfg.l0_cache_bytes_max)
        self.read_buffer_bytes = random.Random(seed + 0x5EAD).choice(cfg.reconciler_read_buffer_bytes)
        # Swarm testing: each fault's rate and the workload's mix drawn apart, some off.
        swarm = {name: getattr(cfg, name) * rng.choice(cfg.swarm_scales) for name in _SWARMED_RATES}
        swarm |= {name: getattr(cfg, name) * rng.choice(cfg.swarm_mix) for name in _SWARMED_INTERVALS}
        cfg = self.cfg = replace(cfg, **swarm)
        retention = rng.choice(cfg.retentions)  # none, by age, or by bytes
        self.retention_s = retention[1] if retention[0] == "s" else None
        self.retention_bytes = int(retention[1]) if retention[0] == "bytes" else None
        self.trace: deque[str] = deque(maxlen=cfg.trace_lines_max)
        self.digest = 0
        self.stats = Stats()
        self.violation: SimulationViolation | None = None
        self.truth = Truth(self)
        self.idempotent = IdempotentProducers(self)
        self.transactions = TransactionSim(self, drawn(seed, nodes))  # in a share of seeds
        if self.transactions.enabled:
            self.log_store: SimLogStore = SimTxnLogStore(
                rng,
                cfg,
                self._on_durable,
                self.truth.on_l1_delete_started,
                self.transactions.on_transaction,
            )
        else:
            self.log_store = SimLogStore(rng, cfg, self._on_durable, self.truth.on_l1_delete_started)
        self.faults = SeededFaults(rng, cfg, self.fault_scale, self.truth.on_delete, self.truth.on_stored)
        self.objects = MemoryObjectStore(clock=self.wall, sleep=asyncio.sleep, faults=self.faults)
        self.control: MemoryClusterControl | None = None
        self.node_ids: list[str | None] = [None]
        self.lease_ttl_s = 0.0
        if nodes > 1:  # drawn after the single node's draws: a one-node seed stays as it was
            self.lease_ttl_s = rng.choice(cfg.lease_ttl_s)
            self.control = MemoryClusterControl(self.log_store, clock=anyio.current_time)
            self.node_ids = list(NODE_IDS[:nodes])
        self.incarnations: list[Incarnation] = []
        self.control_links: list[Link] = []  # each incarnation's, in a cluster
        self._runs_up: dict[str | None, anyio.Event] = {}  # node id -> set when its next run is up
        self.changes: list[Change] = []
        self.lives: dict[str | None, Incarnation] = {}  # node id -> its live incarnation
        self.phase = "faults"  # then "healing", "healed" (faults stopped, workload on), "quiet"
        self.healed_at: float | None = None
        self.control_slow_in_flight = 0  # control-plane calls a fault is slowing
        self._rounds_at_heal: dict[int, int] = {}  # id(incarnation) -> its reconciler's passes then
        self._reconcile_targets: dict[int, tuple[int, float, float]] = {}  # pid -> (offset, since, bound)
        self._led_since: dict[int, float] = {}  # pid -> when its latest TermStart became durable
        self._eligible_since: dict[str, float] = {}
        self._l0_epochs: dict[str, int] = {}  # parsed once
        self._below_start_since: dict[
            str, float
        ] = {}  # L1 key -> when first seen below start  # L0 key -> when first seen at or below M
        self._gc_round_began = anyio.Event()  # set (and replaced) as any GC round begins
        self.produces_in_flight = 0
        self.records_checked = 0
        self._tg: anyio.abc.TaskGroup | None = None
        self._values = 0
        self.topics_made: set[str] = set()  # topics whose creation returned
        self.compaction = CompactionSim(self)  # a compacted topic in a share of seeds

    # ------------------------------------------------------------------ plumbing

    @staticmethod
    def wall() -> float:
        return WALL_START_S + anyio.current_time()

    @staticmethod
    def now() -> float:
        return anyio.current_time()

    def note(self, text: str) -> None:
        line = f"{anyio.current_time():9.4f} {text}"
        self.trace.append(line)
        self.digest = zlib.crc32(line.encode(), self.digest)

    def _on_durable(self, pid: int, records: list[Any]) -> None:
        if any(isinstance(record.entry, TermStart) for record in records):
            self._led_since[pid] = self.now()
        self.truth.on_durable(pid, records)
        self.idempotent.on_durable(pid, records)
        self.transactions.on_durable(pid, records)

    def fail(self, invariant: str, message: str) -> None:
        """Record the first violation and raise it (whoever catches it, the run reports it)."""
        exc = SimulationViolation(invariant, message)
        if self.violation is None:
            self.violation = exc
            self.note(f"VIOLATION of invariant {invariant}: {message.splitlines()[0]}")
        raise exc

    def expo(self, mean_s: float) -> float:
        return self.rng.expovariate(1.0 / mean_s)

    def partition_name(self, pid: int) -> str:
        row = self.log_store.partitions[pid]
        return f"{row.topic}/{row.partition}"

    @property
    def cluster(self) -> bool:
        return self.control is not None

    def entry(self) -> Incarnation | None:
        """A live node to send a request to (the only one, or one drawn)."""
        lives = [inc for inc in self.lives.values() if inc.takes_requests]
        if len(lives) <= 1:  # no draw: a one-node world's random stream is unchanged
            return lives[0] if lives else None
        return self.rng.choice(lives)

    def owns(self, topic: str) -> bool:
        """A topic a workload of its own writes and checks (a compacted one): the world's
        producers and readers leave it alone."""
        return self.compaction.owns(topic) or self.transactions.owns(topic)

    def leading(self, actor: PartitionActor) -> bool:
        """The actor's term is the partition's durable term: nobody took over since it began.
        Only such a leader's appends can still land (a zombie's are refused by the store)."""
        return actor.term == self.log_store.partitions[actor.row.pid].term

    def live_actors(self) -> list[PartitionActor]:
        """The actors of live nodes whose appends could still land (their term is current)."""
        actors = [a for inc in self.lives.values() for a in inc.node.partitions()]
        if not self.cluster:
            return actors
        return [a for a in actors if self.leading(a)]

    def pid(self, topic: str, partition: int) -> int:
        for pid, row in self.log_store.partitions.items():
            if (row.topic, row.partition) == (topic, partition):
                return pid
        raise AssertionError(f"no partition {topic}/{partition}")

    def node_config(self) -> NodeConfig:
        cfg = self.cfg
        config = NodeConfig(
            fencing_mode=self.mode,
            # Off, tiny (evicting at every load) or large, per seed. A cached object's bytes
            # outlive its delete, so a read served from the cache cannot show a GC that ignored
            # the reader's pin: the check of pins is at every delete (`Truth.on_delete`).
            l0_cache_bytes_max=self.l0_cache_bytes_max,
            epoch_cache_ttl_s=self.cache_ttl_s,
            epoch_bump_interval_s=self.epoch_bump_interval_s,
            snapshot_every_records=cfg.snapshot_every_records,
            log_keep_records=cfg.log_keep_records,
            batcher=BatcherConfig(
                linger_ms=cfg.linger_ms,
                batch_bytes_max=cfg.batch_bytes_max,
                inflight_bytes_max=64 * cfg.batch_bytes_max,
                uploads_max=cfg.uploads_max,
                stale_retries_max=cfg.stale_retries_max,
            ),
            reconciler=ReconcilerConfig(
                interval_s=self.reconciler_interval_s,
                object_bytes_max=1024,
                object_bytes_min=cfg.reconciler_object_bytes_min,
                object_age_max_s=self.reconciler_age_max_s,
                read_buffer_bytes_max=self.read_buffer_bytes,
                copy_deadline_s=cfg.copy_deadline_s,
                # No sweep for stray L1 objects: its LISTs would move every pinned seed
                # (tests/sim/test_mutations.py); tests/actors/test_l1_strays.py covers it.
                l1_stray_sweep_interval_s=0.0,
            ),
            housekeeper=HousekeeperConfig(
                interval_s=self.housekeeper_interval_s,
                idle_after_s=cfg.idle_after_s,
                retention_s=self.retention_s,
                retention_bytes=self.retention_bytes,
                copy_deadline_s=cfg.copy_deadline_s,
            ),
            gc=GcConfig(
                interval_s=cfg.gc_interval_s,
                idle_backoff_max_s=cfg.gc_idle_backoff_max_s,
                grace_s=0.0,  # no grace: the epoch rule alone must keep data safe
                delete_batch_keys_max=cfg.gc_delete_batch_keys_max,
                deletes_in_flight_max=cfg.gc_deletes_in_flight_max,
                throttle_backoff_s=0.1,
                sweep_interval_s=cfg.gc_sweep_interval_s,
            ),
            # No compactor task unless the seed has a compacted topic (`compaction.py`): no
            # change to the schedule of every other seed.
            compactor=CompactorConfig(enabled=False),
        )
        return self.transactions.node_config(self.compaction.node_config(config))

    # ------------------------------------------------------------------ the run

    async def run(self) -> None:
        cfg = self.cfg
        with observed_pins():  # every actor's readers' claims, for the check at every delete
            await self._run(cfg)

    async def _run(self, cfg: SimConfig) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            for node_id in self.node_ids:
                await self.start_incarnation(node_id)
            # The GC runs with an empty board (no partition: its cap E - 1 alone binds), epochs
            # move, and the first topic comes, often while a GC round is open.
            first_after = self.rng.uniform(*cfg.first_topic_after_s)
            self._tg.start_soon(self._bumper, self.now() + first_after)
            await asyncio.sleep(first_after)
            await self._during_gc_round()
            first = self.entry()
            assert first is not None
            await self._create(first, "sim", cfg.initial_partitions)
            end = self.now() + cfg.workload_s  # the fault phase
            await self.compaction.start(tg, end)
            for loop in (
                self._producer,
                self._reader,
                self._creator,
                self._crasher,
                self._bumper,
                self._checker,
                self.idempotent.run,
                self.transactions.run,
            ):
                tg.start_soon(loop, end)
            await anyio.sleep_until(end)
            await self.heal()
            await asyncio.sleep(cfg.healed_s)
            await self.quiet()
            await self.compaction.final_scan()
            await self.transactions.final_scan()
            tg.cancel_scope.cancel()

    async def heal(self) -> None:
        """Faults stop (as in TigerBeetle's VOPR: a fault phase, then a healed one); the
        workload goes on. Once every node is up again (none stopping), unpaused, and every
        dropped incarnation gone, the world is healed: from then on every write must succeed at
        once or after one stale-epoch retry, within `healed_write_s_max` (invariant 6 as a check,
        not a figure)."""
        self.phase = "healing"
        self.faults.enabled = False
        self.log_store.slow_enabled = False
        self.note("faults stop")
        started = self.now()
        while not self.whole():
            if self.now() - started > self.cfg.heal_s_max:
                self.fail("6", f"the world is not whole {self.cfg.heal_s_max}s after the faults stopped")
            await asyncio.sleep(self.cfg.check_interval_s / 5)
        self.phase = "healed"
        self.healed_at = self.now()
        # A reconciler pass under way at the heal may still wait on faults injected before it
        # (a slow GET or PUT of the fault phase); the bound starts with its next pass.
        self._rounds_at_heal = {id(inc): inc.node.reconciler.stats.rounds for inc in self.lives.values()}
        self.stats.heal_s = self.healed_at - started
        self.note("healed: every node up")

    def whole(self) -> bool:
        lives = set(self.lives.values())
        return (
            len(lives) == len(self.node_ids)
            # (A node stopping gracefully still accepts while it leaves the cluster, and a stop
            # may be killed after its `leave_node`: three-node seed 838 was "healed" in between.)
            and all(inc.tg is not None and inc.node.accepting and not inc.stopping for inc in lives)
            and not any(inc.gate.paused or inc.control_gate.paused for inc in lives)
            # (A control-plane call slowed by a fault is a fault still running: three-node seed
            # 2465's node renewal, slowed before the heal, timed out after it and left a topic
            # created meanwhile without a leader for two seconds.)
            and self.control_slow_in_flight == 0
            and all(inc.ended or inc in lives for inc in self.incarnations)
        )

    async def quiet(self) -> None:
        """Workload and faults stop; epochs keep bumping, background work runs, until every
        L0 object is collected (invariant 4) or the bound runs out."""
        self.phase = "quiet"
        self.note("quiet period: the workload stops")
        started = self.now()
        ticks = 0
        while not self.settled():  # looked at often: the period ends as soon as it holds
            if self.now() - started > self.cfg.quiet_s_max:
                self.fail("4", self.explain_leftovers())
            await asyncio.sleep(self.cfg.check_interval_s / 5)
            ticks += 1
            if ticks % 5 == 0:
                self.check()
        self.stats.quiet_s = self.now() - started
        self.records_checked = self.truth.check_readable()
        self.note(f"settled: {self.records_checked} acknowledged records readable")

    def settled(self) -> bool:
        return (
            self.whole()
            and self.produces_in_flight == 0
            and not any(k.startswith(L0_ROOT) for k in self.objects.keys())
            and self.compaction.settled()
            and self.transactions.settled()
        )

    def check(self) -> None:
        for inc in self.lives.values():
            board = inc.node.board.snapshot()
            if self.cluster:  # what a node's board says of partitions it no longer leads is stale
                board = {a.name: board.get(a.name) for a in inc.node.partitions() if self.leading(a)}
            self.truth.check_published(board)
        if self.phase in ("healed", "quiet"):
            self._check_reconciled()
            self._check_collection()
            self._check_retention_collected()
            self.compaction.check_superseded_deleted()

    def _check_retention_collected(self) -> None:
        """Once healed, an L1 object entirely below its partition's start offset (retention:
        `core.leader.l1_collect_reason`) starts being deleted within two housekeeper rounds."""
        if self.retention_s is None and self.retention_bytes is None:
            return  # no start offset moves
        now = self.now()
        bound = 2 * self.housekeeper_interval_s + self.cfg.collect_round_s
        seen = self._below_start_since
        below = set()
        for row in self.log_store.l1.values():
            state = self.truth.shadow.get(row.pid)
            if state is None or row.state != L1State.COPY_FINISHED:
                continue
            reason = l1_collect_reason(
                state,
                self.log_store.partitions[row.pid].term,
                row_term=row.term,
                last_offset=row.last_offset,
                lineage_valid=state.l1_range_valid(row.term, row.base_offset, row.last_offset),
                copy_finished=True,
                delete_started=False,
                stale_copy=False,
            )
            if reason is None or row.last_offset >= state.start_offset:
                continue  # (out of the lineage: collected at the next start-up only)
            below.add(row.key)
            since = seen.setdefault(row.key, now)
            if now - since > bound:
                self.fail(
                    "4",
                    f"L1 object {row.key} of {self.partition_name(row.pid)} ends at {row.last_offset}, below "
                    f"the start offset {state.start_offset}, and is still there {now - since:.2f}s later",
                )
        for key in list(seen):
            if key not in below:
                del seen[key]

    def _check_reconciled(self) -> None:
        """Once healed, every durable record is reconciled (at or below LRO) within a bound
        from the first reconciler pass begun after the heal: two reconciler intervals, the L1
        object's age bound, the copy's time, and the backlog of every partition (a round copies
        them one after another) at a floor of throughput.
        (Each partition has one target at a time, its last offset when first seen behind:
        later writes do not move the goal post.)

        The age bound is waited from the pass that first saw the data on the node that leads
        the partition (`Reconciler._due_for_object`): a new leader waits it afresh. Leadership
        still moves after the heal (a node whose graceful stop or crash began in the fault
        phase comes back, and the balancer gives it its share), so the bound is counted from
        the later of the target and the partition's latest term start. Three-node seed 124 of
        one schedule: the target set at 10.44 s; the leader of term 3 first saw the data at
        11.00 s, due at 15.00 s; at 14.61 s the restarted node took the partition back (term
        4), first saw it at 14.82 s, due at 18.82 s: past 10.44 + 7.62 s though no pass was
        late. Each node comes back at most once after the heal, so the goal post moves a
        bounded number of times."""
        now = self.now()
        cfg = self.cfg
        if any(
            inc.node.reconciler.stats.rounds <= self._rounds_at_heal.get(id(inc), -1)
            for inc in self.lives.values()
        ):
            return  # a pass begun in the fault phase is still running: its slow calls may be too
        # A round copies what every partition had due when it began, partition after partition
        # (in waves when the read buffer fills): a partition's data waits behind the round under
        # way and the others' data in the next (single-node seeds 6960, 7335, 12034: 1-3
        # records of a new partition behind a round of 150-240-record backlogs, 3.6 s long).
        backlog = sum(max(s.high_watermark - 1 - s.lro, 0) for s in self.truth.shadow.values())
        for pid, state in self.truth.shadow.items():
            target = self._reconcile_targets.get(pid)
            led_since = self._led_since.get(pid)
            if target is not None and led_since is not None and led_since > target[1]:
                target = self._reconcile_targets[pid] = (target[0], led_since, target[2])  # a new leader
            if target is not None and state.lro >= target[0]:
                del self._reconcile_targets[pid]
                self.stats.reconcile_wait_s_max = max(self.stats.reconcile_wait_s_max, now - target[1])
                target = None
            if target is None and state.lro < state.high_watermark - 1:
                bound = (
                    2 * self.reconciler_interval_s
                    + self.reconciler_age_max_s  # small data waits to grow into an object
                    + cfg.reconcile_copy_s
                    + backlog / cfg.reconcile_records_per_s  # (its own and the others')
                )
                name = self.partition_name(pid)
                if any(inc.node.reconciler.health.get(name) is not None for inc in self.lives.values()):
                    bound += RECONCILE_FAILING_RETRY_S  # failing (named): retried that often only
                target = self._reconcile_targets[pid] = (state.high_watermark - 1, now, bound)
            if target is not None and now - target[1] > (bound := target[2]):
                self.fail(
                    "6",
                    f"{self.partition_name(pid)}@{target[0]} durable and not reconciled "
                    f"{now - target[1]:.2f}s after the world healed or its leader's term began "
                    f"(LRO {state.lro}, bound {bound:.2f}s)",
                )

    def cluster_board(self) -> dict[str, int | None]:
        """The M(p) the GC rounds read: the control plane's in a cluster, the node's board."""
        if self.control is not None:
            watermarks = self.control.watermarks
            return {self.partition_name(pid): watermarks.get(pid) for pid in self.log_store.partitions}
        inc = self.lives.get(None)
        return inc.node.board.snapshot() if inc is not None else {}

    def _check_collection(self) -> None:
        """Once healed, an L0 object at or below `M` (DESIGN's rule, `core.gc`) is collected
        within a GC round's bound: the longest pause between rounds, and one round."""
        decision = compute_cluster_watermark(self.log_store.cluster_epoch, self.cluster_board())
        now = self.now()
        seen = self._eligible_since
        if decision.m is None:
            seen.clear()
            return
        m = decision.m
        epochs = self._l0_epochs
        for k in self.objects.keys():
            if k not in epochs and k.startswith(L0_ROOT):
                epochs[k] = parse_l0_key(k).epoch
        keys = [k for k in self.objects.keys() if epochs.get(k, m + 1) <= m]
        eligible = set(keys)
        for key in list(seen):
            if key not in eligible:
                del seen[key]
        cfg = self.cfg
        bound = cfg.gc_sweep_interval_s + cfg.gc_idle_backoff_max_s * 1.1 + cfg.collect_round_s
        for key in keys:
            since = seen.setdefault(key, now)
            self.stats.collect_wait_s_max = max(self.stats.collect_wait_s_max, now - since)
            if now - since > bound:
                self.fail("4", f"{key} is at or below M = {m} and still there {now - since:.2f}s later")

    # ------------------------------------------------------------------ incarnations

    async def start_incarnation(self, node_id: str | None = None) -> None:
        assert self._tg is not None
        number = len(self.incarnations) + 1
        gate = Gate()
        log = Link(self.log_store, gate, self.log_store.latency)
        settings = None
        control_gate = Gate()  # cuts the node off the control plane alone
        if self.control is not None:
            assert node_id is not None
            sender: list[Incarnation] = []  # the incarnation, once made
            wire = Wire(
                self._tg,
                lambda call: self._control_sent(sender[0], call),
                lambda: self._held(node_id),
                self._control_landed,
            )
            control = Link(
                self.control, Gates(gate, control_gate), self.control_latency, named=True, wire=wire
            )
            self.control_links.append(control)
            # Its monotonic clock runs at its own rate, within the bound the lease margin covers.
            rate = 1 + self.rng.uniform(-CLOCK_RATE_DRIFT_MAX, CLOCK_RATE_DRIFT_MAX)
            origin = self.now()
            settings = ClusterSettings(
                control,
                node_id,
                f"sim://{node_id}",
                self.lease_ttl_s,
                clock=lambda: origin + (anyio.current_time() - origin) * rate,
            )
        node = Node(
            self.node_config(),
            log,
            self.objects,
            rng=self.rng,
            wall_clock=self.wall,
            cluster=settings,
        )
        self._watch_gc_rounds(node)
        inc = Incarnation(number, node, gate, node_id, control_gate=control_gate, intake=ProduceIntake(node))
        if self.control is not None:
            sender.append(inc)
        self.transactions.on_incarnation(inc)
        self.incarnations.append(inc)
        epoch = self.log_store.cluster_epoch
        behind = self.rng.randint(0, self.cfg.stale_cache_epochs_max) if number > 1 else 0
        if behind and epoch - behind >= 1:
            # As a node whose cache lags would: a fresh-looking cached epoch, `behind` old.
            node.epoch_cache._value = epoch - behind
            node.epoch_cache._fetched_at = self.now()
        if number > 1 and not self.cluster:  # it takes over every partition: the stall after
            inc.change = Change(self.now(), number, behind)
            self.changes.append(inc.change)
        await self._tg.start(self._life, inc)
        if node.member is not None:
            self._check_leads(inc, node.member)
        self.lives[node_id] = inc
        self._runs_up.pop(node_id, anyio.Event()).set()
        if number > 1 and self.rng.random() < self.cfg.late_reconciler_p:
            assert inc.tg is not None
            inc.tg.start_soon(self._late_reconciler, inc, self.rng.uniform(*self.cfg.late_reconciler_s))
        self.compaction.on_incarnation(inc)
        self.note(f"{inc} up: epoch {epoch}, its cache {behind} behind")
        for actor in node.partitions():
            shadow = self.truth.shadow.get(actor.row.pid)
            state = actor.state
            if (
                shadow is not None
                and state.last_applied_log_offset == shadow.last_applied_log_offset
                and state != shadow
            ):
                self.fail(
                    "replay",
                    f"{actor.name} replayed on {inc}: {state!r} != durable {shadow!r}",
                )

    def _check_leads(self, inc: Incarnation, member: ClusterMember) -> None:
        """Every `leads(pid)` that answers yes (the node serves a write or a read on it) must
        fall within the lease the control plane gives this node for pid: a node stops serving
        by its lease deadline, whatever its clock's drift and the control plane's latency."""
        control = self.control
        assert control is not None

        def leads(pid: int) -> bool:
            answer = ClusterMember.leads(member, pid)  # looked up on the class at each call
            # A crashed incarnation (a zombie until it is reaped: work it had begun still runs,
            # as requests on the wire still land) is judged by terms, not leases: its node's
            # next incarnation may already have released what it held (three-node seed 79: a
            # batch queued in the crashed node's Kafka intake asked `leads` after the restart).
            if answer and inc.alive:
                holder, expires = control.leases.get(pid, (None, 0.0))
                if holder != inc.node_id or expires <= self.now():
                    self.fail(
                        "lease",
                        f"{inc} leads {self.partition_name(pid)} at {self.now():.3f}, its lease "
                        + (f"ran out at {expires:.3f}" if holder == inc.node_id else f"is held by {holder}"),
                    )
            return answer

        setattr(member, "leads", leads)  # noqa: B010 - an instance's method, watched

    async def control_latency(self, call: str) -> None:
        """The control plane's latency: often quick, sometimes a good share of a lease TTL, and
        sometimes an error (before the effect) of a leadership round's call, while faults run."""
        cfg = self.cfg
        if self.faults.enabled:
            if call in _ROUND_CALLS and self.rng.random() < cfg.control_error_p * self.fault_scale:
                self.faults.injected += 1
                await asyncio.sleep(self.rng.uniform(*cfg.log_op_s))
                raise StorageError("injected control-plane failure")
            if self.rng.random() < cfg.control_slow_p * self.fault_scale:
                self.faults.injected += 1
                self.control_slow_in_flight += 1
                try:
                    await asyncio.sleep(self.lease_ttl_s * self.rng.uniform(*cfg.control_slow_ttls))
                finally:
                    self.control_slow_in_flight -= 1
                return
        await self.log_store.latency()

    async def _life(
        self, inc: Incarnation, *, task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED
    ) -> None:
        with inc.scope:
            async with anyio.create_task_group() as tg:
                inc.tg = tg
                await tg.start(self._serve, inc)
                task_status.started()
        inc.ended = True
        self.note(f"{inc} ended")

    @staticmethod
    async def _serve(
        inc: Incarnation, *, task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """The node, and its Kafka produce intake for as long as the node runs."""
        assert inc.intake is not None
        async with anyio.create_task_group() as tg:
            await tg.start(inc.intake.run)
            if inc.kafka is not None:
                # As the daemon does: the Kafka API (the transaction coordinator's timeouts and
                # completions) once the node has replayed its partitions.
                async def node(*, task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
                    await inc.node.run(task_status=task_status)
                    tg.cancel_scope.cancel()  # the node stopped (a graceful stop): the rest too

                await tg.start(node)
                await tg.start(inc.kafka.run)
                task_status.started()
                return
            await inc.node.run(task_status=task_status)
            tg.cancel_scope.cancel()  # the node stopped (a graceful stop): its intake too

    async def crash(self, inc: Incarnation) -> None:
        assert self.lives[inc.node_id] is inc
        del self.lives[inc.node_id]
        inc.alive = False
        inc.gate.close()
        self.stats.crashes += 1
        self._absorb(inc)
        zombie_s = self.rng.uniform(*self.cfg.zombie_s)
        self.note(f"{inc} crashes; its requests on the wire land for {zombie_s:.3f}s")
        assert self._tg is not None
        self._tg.start_soon(self._reap, inc, zombie_s)
        restart = self.cfg.cluster_restart_s if self.cluster else self.cfg.restart_s
        await asyncio.sleep(self.rng.uniform(*restart))
        await self.start_incarnation(inc.node_id)

    async def stop_gracefully(self, inc: Incarnation) -> None:
        """`Node.shutdown`, as on SIGTERM: its partitions are handed over (leases released, no
        TTL to wait), then the node starts again after a while (a rolling restart)."""
        assert self.lives[inc.node_id] is inc
        self.note(f"{inc} stops gracefully")
        self.stats.graceful_stops += 1
        inc.stopping = True  # a balancer sends it no new request (its own drain to finish)
        if self.rng.random() < self.cfg.stop_killed_p:
            inc.kill_after = self.rng.choice(("set_draining", "leave_node"))
        await inc.node.shutdown()
        with anyio.move_on_after(self.cfg.drain_s_max):
            while not inc.ended:
                await asyncio.sleep(0.05)
        if not inc.ended:
            self.fail("drain", f"{inc} did not stop within {self.cfg.drain_s_max}s of its shutdown")
        if self.lives.get(inc.node_id) is not inc:
            return  # crashed while draining: the crash restarts it
        del self.lives[inc.node_id]
        inc.alive = False
        self._absorb(inc)
        await asyncio.sleep(self.rng.uniform(*self.cfg.cluster_restart_s))
        await self.start_incarnation(inc.node_id)

    async def _held(self, node_id: str | None) -> None:
        """How long a request of a dead incarnation stays on the wire: half of them until the
        node's next run is up, then up to two lease TTLs more (it has registered and taken
        leases by then: the late request lands on them); the others up to a restart's length."""
        if self.rng.random() < 0.5:
            await self._next_run(node_id).wait()
            await asyncio.sleep(self.rng.uniform(0.0, 2 * self.lease_ttl_s))
        else:
            await asyncio.sleep(self.rng.uniform(*self.cfg.cluster_restart_s))

    def _next_run(self, node_id: str | None) -> anyio.Event:
        """Set when the node's next incarnation is up."""
        return self._runs_up.setdefault(node_id, anyio.Event())

    def _control_landed(self, call: str) -> None:  # noqa: ARG002 - any call may change leases
        """After every change at the control plane (a late request of a dead incarnation
        among them), every live node's leadership is checked against the leases at once, not
        only when it next serves a request."""
        for inc in self.lives.values():
            member = inc.node.member
            if inc.alive and member is not None:
                for pid in sorted(member.leading):
                    member.leads(pid)  # `_check_leads`' watch fails a lead outside its lease

    def _control_sent(self, inc: Incarnation, call: str) -> None:
        """A request of `inc` to the control plane has left: if its stop is to be killed just
        after this call, kill it now (the request is on the wire and lands anyway)."""
        if inc.kill_after == call and self.lives.get(inc.node_id) is inc:
            inc.kill_after = None
            self.stats.stops_killed += 1
            self.note(f"{inc} killed just after it sent {call}")
            assert self._tg is not None
            self._tg.start_soon(self.crash, inc)

    async def pause(self, inc: Incarnation) -> None:
        """Cut the node off from the database and the control plane, past its lease: other
        nodes take its partitions; at the resume what it sent meanwhile arrives (a zombie)."""
        pause_s = self.lease_ttl_s * self.rng.uniform(*self.cfg.pause_ttls)
        self.stats.pauses += 1
        self.note(f"{inc} paused for {pause_s:.3f}s")
        inc.gate.pause()
        await asyncio.sleep(pause_s)
        inc.gate.resume()
        self.note(f"{inc} resumes")

    async def cut(self, inc: Incarnation) -> None:
        """Cut the node off the control plane alone, past its lease: it still reaches the
        database, so it must stop serving by its own lease deadline (another node takes its
        partitions; the database's term check fences its appends)."""
        cut_s = self.lease_ttl_s * self.rng.uniform(*self.cfg.pause_ttls)
        self.stats.cuts += 1
        self.note(f"{inc} cut off the control plane for {cut_s:.3f}s")
        inc.control_gate.pause()
        await asyncio.sleep(cut_s)
        inc.control_gate.resume()
        self.note(f"{inc} reaches the control plane again")

    async def _late_reconciler(self, inc: Incarnation, after_s: float) -> None:
        """A reconciler that read its placeholders under the previous term finishes late: the
        real reconciler code, with the old term, against the new leader (whose conditional
        catch-up must refuse it; the L1 object it wrote is then outside the lineage)."""
        await asyncio.sleep(after_s)
        actors = [a for a in inc.node.partitions() if a.ready.is_set() and a.term > 1]
        actors = [a for a in actors if a.state.has_unreconciled_data]
        if not actors:
            return
        actor = self.rng.choice(actors)
        term = actor.term - 1
        try:
            done = await inc.node.reconciler.reconcile_partition(actor, term=term)
        except LevelZeroError as exc:
            self.note(f"{inc} late reconciler of {actor.name} term {term}: {type(exc).__name__}")
            return
        self.note(f"{inc} late reconciler of {actor.name} term {term}: {'accepted' if done else 'refused'}")

    async def _reap(self, inc: Incarnation, after_s: float) -> None:
        await asyncio.sleep(after_s)
        inc.scope.cancel()

    def _absorb(self, inc: Incarnation) -> None:
        b = inc.node.batcher.stats
        self.stats.stale_rejections += b.stale_rejections
        self.stats.stale_retries += b.stale_retries
        self.stats.orphans += b.orphan_objects
        self.stats.objects_uploaded += b.objects_uploaded
        self.stats.l1_written += inc.node.reconciler.stats.objects_written
        self.stats.l1_rounds_deferred += inc.node.reconciler.stats.partitions_deferred
        gc = inc.node.gc.statistics()
        self.stats.gc_rounds += gc.rounds
        self.stats.objects_deleted += gc.totals.deleted
        cache = inc.node.l0_cache.statistics()
        self.stats.l0_cache_served += cache.hits + cache.shared
        self.stats.l0_cache_loads += cache.loads
        self.compaction.absorb(inc)
        self.transactions.absorb(inc)

    def finish(self) -> None:
        for inc in self.lives.values():
            self._absorb(inc)
        self.lives.clear()

    # ------------------------------------------------------------------ workload

    async def _producer(self, end: float) -> None:  # noqa: ARG002 - the loops' one signature
        cfg = self.cfg
        while True:
            await asyncio.sleep(self.expo(cfg.produce_interval_s))
            if self.phase == "quiet":  # (on through the healed phase)
                return
            inc = self.entry()
            if inc is None or inc.tg is None:
                continue
            targets = [
                (t, p) for t, n in sorted(inc.node.topics().items()) if not self.owns(t) for p in range(n)
            ]
            if not targets:
                continue
            if self.rng.random() < self.newest_write_p:
                topic, partition = targets[-1]
            else:
                topic, partition = self.rng.choice(targets)
            records = [self._record() for _ in range(self.rng.randint(1, cfg.records_per_write_max))]
            self.produces_in_flight += 1
            inc.tg.start_soon(self._produce, inc, topic, partition, records)

    def _record(self) -> Record:
        self._values += 1
        size = self.rng.randint(*self.cfg.value_bytes)
        value: bytes | None = f"v{self.seed}.{self._values}.".encode().ljust(size, b"x")
        # Every fifth keyed record is a null value (a tombstone), the one after next an empty
        # one: both must read back as written, from L0 and L1 (the key tells them apart).
        if self._values % 15 == 0:
            value = None
        elif self._values % 15 == 6:
            value = b""
        return Record(key=None if self._values % 3 else f"k{self._values}".encode(), value=value)

    async def _produce(self, inc: Incarnation, topic: str, partition: int, records: list[Record]) -> None:
        self.stats.writes_submitted += 1
        submitted_at = self.now()
        healed = self.phase == "healed"
        change = inc.change
        if change is not None and submitted_at - change.at > self.cfg.stall_window_s:
            change = None
        try:
            if self.cluster:
                inc, result = await self._routed(inc, topic, partition, "produce", records)
                pid = self.pid(topic, partition)
            else:
                pid = inc.node.partition(topic, partition).row.pid
                result = await inc.node.produce(topic, partition, records)
        except LevelZeroError as exc:
            self.stats.writes_failed += 1
            if change is not None and isinstance(exc, StaleClusterEpoch):
                change.writes += 1
                change.rejections += self.cfg.stale_retries_max + 1
                change.writes_over_one_retry += 1
                change.stall_s = max(change.stall_s, self.now() - submitted_at)
            self.note(f"{inc} produce to {topic}/{partition} failed: {type(exc).__name__}")
            # (A topic whose creation has not returned yet may be unknown to the node asked, as
            # in Kafka: a client learns of a topic from a node's view, before its creator does.)
            creating = isinstance(exc, UnknownTopic) and topic not in self.topics_made
            if healed and not creating:
                self.fail("6", f"a write to {topic}/{partition} submitted once healed failed: {exc!r}")
            return
        finally:
            self.produces_in_flight -= 1
        if healed:
            took = self.now() - submitted_at
            s = self.stats
            s.healed_writes += 1
            s.healed_attempts_max = max(s.healed_attempts_max, result.attempts)
            s.healed_write_s_max = max(s.healed_write_s_max, took)
            bound = self.cfg.healed_write_s_max + 2 * self.lease_ttl_s  # (leaders still moving)
            if result.attempts > 2 or took > bound:
                self.fail(
                    "6",
                    f"a write to {topic}/{partition} submitted once healed took {result.attempts} "
                    f"attempts and {took:.3f}s (at most 2 and {bound}s)",
                )
        self.stats.writes_acked += 1
        self.stats.records_acked += len(records)
        if change is not None:
            change.writes += 1
            change.rejections += result.attempts - 1
            if result.attempts > 2:
                change.writes_over_one_retry += 1
            if result.attempts > 1:
                change.stall_s = max(change.stall_s, self.now() - submitted_at)
        self.note(
            f"{inc} acked {topic}/{partition}@{result.base_offset}..{result.last_offset} "
            f"in {result.object_key[-12:]} after {result.attempts} attempts"
        )
        self.truth.ack(pid, result.base_offset, records, result.object_key)

    async def _routed(
        self, inc: Incarnation, topic: str, partition: int, op: str, *args: object
    ) -> tuple[Incarnation, Any]:
        """`op` sent to `inc`, following `LedElsewhere` to the leader it names (the redirect the
        bundled client follows). Returns the node that answered and its answer."""
        hops = retries = 0
        while True:
            try:
                with anyio.fail_after(self.cfg.request_timeout_s):
                    return inc, await getattr(inc.node, op)(topic, partition, *args)
            except TimeoutError:
                raise RequestTimedOut(f"{op} to {inc} timed out (the node died?)") from None
            except (LedElsewhere, ShuttingDown, UnknownTopic, NotLeader) as exc:
                # UnknownTopic: in a cluster a node learns a topic another node created from its
                # next cluster view (every third of the lease TTL); a client that was told of the
                # topic retries, as a Kafka client does on UNKNOWN_TOPIC_OR_PARTITION. NotLeader:
                # the node's partition was deposed by a newer term (its lease moved while it
                # wrote) and has not resigned yet; retriable, as Kafka's NOT_LEADER_OR_FOLLOWER.
                # A node that never resigns still fails the write once the retries run out.
                if isinstance(exc, (UnknownTopic, NotLeader)) and not self.cluster:
                    raise
                leader = None
                if isinstance(exc, LedElsewhere) and exc.leader_url is not None:
                    leader = self.lives.get(exc.leader_url.removeprefix("sim://"))
                if leader is not None and hops < REDIRECTS_MAX:
                    hops += 1
                    self.note(f"{inc} redirects {op} of {topic}/{partition} to {leader}")
                    inc = leader
                    continue
                # No leader to follow (moving, or one that just died), or a node stopping: a
                # retriable answer. The client retries later, through any node (a balancer).
                if retries == self.cfg.not_leader_retries:
                    raise
                retries += 1
                hops = 0
                await asyncio.sleep(self.cfg.not_leader_retry_s)
                inc = self.entry() or inc

    async def _reader(self, end: float) -> None:  # noqa: ARG002 - the loops' one signature
        while True:
            await asyncio.sleep(self.expo(self.cfg.read_interval_s))
            if self.phase == "quiet":  # (on through the healed phase)
                return
            inc = self.entry()
            if inc is None or inc.tg is None:
                continue
            actors = [a for a in inc.node.partitions() if a.ready.is_set() and not self.owns(a.row.topic)]
            if not actors:
                continue
            actor = self.rng.choice(actors)
            state = actor.state
            if state.high_watermark <= state.start_offset:
                continue
            start, hwm, lro = state.start_offset, state.high_watermark, state.lro
            tail = max(start, lro + 1)
            edges = [o for o in (lro, lro + 1, start, hwm - 1) if start <= o < hwm]
            if start > 0:
                edges.append(start - 1)  # retention dropped it: OffsetOutOfRange
            if self.rng.random() < self.cfg.boundary_read_p:
                offset = self.rng.choice(edges)  # the L0/L1 boundary, the start, the last record
            elif tail < state.high_watermark and self.rng.random() < self.cfg.tail_read_p:
                offset = self.rng.randrange(tail, state.high_watermark)  # a consumer at the tail
            else:
                offset = self.rng.randrange(state.start_offset, state.high_watermark)
            inc.tg.start_soon(self._read, inc, actor, offset)

    async def _read(self, inc: Incarnation, actor: PartitionActor, offset: int) -> None:
        """A fetch at `offset`: it starts there with at least one record, contiguous, each the
        acknowledged one; or it fails for a reason the world explains (an injected fault, the
        node's crash, pause or lost leadership, the start offset moved past `offset`). Any other
        failure, an empty answer or one that starts later is a violation of the read path."""
        self.stats.reads += 1
        pauses = inc.gate.pauses
        lro_before, start_before = actor.state.lro, actor.state.start_offset
        try:
            result = await inc.node.fetch(actor.row.topic, actor.row.partition, offset, FETCH_BYTES)
        except LevelZeroError as exc:
            # In a cluster, a reader on a node that was paused or lost the partition meanwhile
            # pinned nothing the new leader publishes: its read may fail (the client retries).
            kept = inc.alive and (not self.cluster or (inc.gate.pauses == pauses and self.leading(actor)))
            self.note(f"{inc} read {actor.name}@{offset} failed: {type(exc).__name__}")
            why = self._read_failure_explained(exc, offset, kept, start_before)
            if why is not None:
                return
            if isinstance(exc, ObjectNotFound) and exc.key.startswith(L0_ROOT):
                self.fail(
                    "1",
                    f"an L0 reader of {actor.name} at offset {offset} on {inc} lost {exc.key}: "
                    "deleted while the reader held M(p)",
                )
            self.fail(
                "read",
                f"a fetch of {actor.name} at offset {offset} on {inc} failed with no injected "
                f"fault or move to explain it: {type(exc).__name__}: {exc}",
            )
            return
        records = result.records
        if offset < start_before:
            self.fail(
                "read",
                f"a fetch of {actor.name} at {offset}, below its start offset {start_before}, "
                f"answered {len(records)} records ({result.tier})",
            )
        # An L0 read the reconciler overtook (LRO moved past `offset` meanwhile; the log may be
        # truncated under it) answers nothing: the client fetches again, from L1.
        overtaken = not records and lro_before < offset <= actor.state.lro
        if offset < result.high_watermark and not overtaken and (not records or records[0].offset != offset):
            first = records[0].offset if records else None
            self.fail(
                "read",
                f"a fetch of {actor.name} at offset {offset} on {inc} (hwm {result.high_watermark}) "
                f"starts at {first}, next offset {result.next_offset} ({result.tier})",
            )
        for i, fetched in enumerate(records):
            if fetched.offset != offset + i:
                self.fail("read", f"a fetch of {actor.name} at {offset} skips to {fetched.offset}")
            expected = self.truth.expected(actor.row.pid, fetched.offset)
            if expected is not None and expected != (fetched.key, fetched.value):
                self.fail(
                    "3",
                    f"{actor.name}@{fetched.offset} read from {result.tier} is "
                    f"{(fetched.key, fetched.value)!r}, acknowledged {expected!r}",
                )
        self.stats.records_read += len(records)
        self.note(f"{inc} read {actor.name}@{offset}: {len(records)} from {result.tier}")

    def _read_failure_explained(
        self, exc: LevelZeroError, offset: int, kept: bool, start_before: int
    ) -> str | None:
        """Why a read may fail, or None: an injected fault, a node that crashed, paused or no
        longer leads (the client asks again), the start offset past `offset` (retention)."""
        if offset < start_before:  # answered before any I/O: out of range, or led elsewhere
            if isinstance(exc, OffsetOutOfRange) or not kept:
                return "below the start offset"
            if self.cluster and isinstance(exc, (LedElsewhere, ShuttingDown, RequestTimedOut, StorageError)):
                return "moving leadership"
            return None
        if isinstance(exc, StorageError) and self.faults.enabled and "injected" in str(exc):
            return "injected fault"
        if not kept:
            return "the node crashed, paused or lost the partition"
        if isinstance(exc, (LedElsewhere, ShuttingDown, RequestTimedOut, StorageError)) and self.cluster:
            return "moving leadership"  # (a control-plane call given up is a StorageError)
        if isinstance(exc, OffsetOutOfRange) and exc.start_offset > offset:
            return "the start offset is past the offset"
        return None

    async def _creator(self, end: float) -> None:  # noqa: ARG002 - the loops' one signature
        cfg = self.cfg
        created = 0
        while created < cfg.topics_created_max:
            await asyncio.sleep(self.expo(cfg.create_interval_s))
            if self.phase == "quiet":  # (on through the healed phase)
                return
            inc = self.entry()
            if inc is None or inc.tg is None:
                continue
            created += 1
            partitions = self.rng.randint(*cfg.partitions_per_created_topic)
            await self._during_gc_round()
            inc = self.entry()
            if inc is None or inc.tg is None:
                continue
            inc.tg.start_soon(self._create, inc, f"t{created}", partitions)

    async def _during_gc_round(self) -> None:
        """Often, wait (a bounded while) until some node's GC round is open: a partition created
        after its snapshot is what the cap E - 1 protects. (Woken as a round begins, then a
        step of up to `GC_ROUND_STEP_S` into it, as a poll at that period would land; no poll.)"""
        if self.rng.random() >= self.cfg.create_in_gc_round_p:
            return
        with anyio.move_on_after(GC_ROUND_WAIT_S):
            while True:
                if any(inc.node.gc._round_lock.locked() for inc in self.lives.values()):
                    return
                await self._gc_round_began.wait()
                await asyncio.sleep(self.rng.uniform(0.0, GC_ROUND_STEP_S))

    def _watch_gc_rounds(self, node: Node) -> None:
        """Wake `_during_gc_round` as a round of this node's GC begins."""
        run_round = node.gc.run_round

        async def watched(dry_run: bool = False) -> Any:
            self._gc_round_began.set()
            self._gc_round_began = anyio.Event()
            return await run_round(dry_run)

        setattr(node.gc, "run_round", watched)  # noqa: B010 - an instance's method, watched

    async def _create(self, inc: Incarnation, topic: str, partitions: int) -> None:
        during_gc = inc.node.gc._round_lock.locked()
        try:
            await inc.node.create_topic(topic, partitions)
        except LevelZeroError as exc:
            self.note(f"{inc} creating {topic} failed: {exc!r}")
            return
        self.stats.topics_created += 1
        self.topics_made.add(topic)
        if self.phase == "faults" and self.rng.random() < self.cfg.bump_after_create_p:
            await self._bump(inc)
        if during_gc:
            self.stats.partitions_created_during_gc += partitions
        when = " during a GC round" if during_gc else ""
        self.note(f"{inc} created {topic} with {partitions} partitions{when}")

    async def _crasher(self, end: float) -> None:
        cfg = self.cfg
        while True:
            await asyncio.sleep(self.expo(cfg.crash_interval_s))
            if self.now() >= end:
                return
            if not self.cluster:
                inc = self.lives.get(None)
                if inc is not None:
                    await self.crash(inc)
                continue
            # In a cluster, several nodes may be down, stopping or paused at once.
            up = [
                i
                for i in self.lives.values()
                if i.tg is not None and not (i.gate.paused or i.control_gate.paused)
            ]
            if not up:
                continue
            inc = self.rng.choice(up)
            what = self.rng.choices(("crash", "stop", "pause", "cut"), cfg.cluster_fault_weights)[0]
            assert self._tg is not None
            faults = {"crash": self.crash, "stop": self.stop_gracefully, "pause": self.pause, "cut": self.cut}
            self._tg.start_soon(faults[what], inc)

    async def _bumper(self, end: float) -> None:
        while True:
            await asyncio.sleep(self.expo(self.cfg.bump_interval_s))
            if self.now() >= end:
                return
            bursts = 2 if self.rng.random() < self.cfg.bump_burst_p else 1
            for _ in range(bursts):
                inc = self.entry()
                if inc is None or inc.tg is None:
                    break
                inc.tg.start_soon(self._bump, inc)

    async def _bump(self, inc: Incarnation) -> None:
        epoch = await inc.node.epochs.advance()
        self.stats.epoch_bumps += 1
        self.note(f"{inc} cluster epoch -> {epoch} (on demand)")

    async def _checker(self, end: float) -> None:  # noqa: ARG002 - the loops' one signature
        ticks = 0
        while True:
            await asyncio.sleep(self.cfg.check_interval_s)
            self.check()
            ticks += 1
            if ticks % 4 == 0:
                self.records_checked = self.truth.check_readable()
            if self.phase == "quiet":  # (on through the healed phase)
                return

    # ------------------------------------------------------------------ invariant 4

    def explain_leftovers(self) -> str:
        keys = [k for k in self.objects.keys() if k.startswith(L0_ROOT)]
        if self.control is not None:  # what the GC rounds of every node read
            board = {
                self.partition_name(pid): self.control.watermarks.get(pid)
                for pid in self.log_store.partitions
            }
        else:
            inc = self.lives.get(None)
            board = inc.node.board.snapshot() if inc is not None else {}
        decision = compute_cluster_watermark(self.log_store.cluster_epoch, board)
        lines = [
            f"{len(keys)} L0 objects left, epochs {sorted({parse_l0_key(k).epoch for k in keys})[:10]}; "
            f"cluster epoch {self.log_store.cluster_epoch}, M={decision.m} "
            f"holders={decision.holders} blocked={decision.blocked_by}; "
            f"produces in flight {self.produces_in_flight}; "
            f"incarnations not ended {[i for i in self.incarnations if not i.ended]}; "
            f"live {sorted(map(repr, self.lives.values()))}"
        ]
        for pid, state in sorted(self.truth.shadow.items()):
            name = self.partition_name(pid)
            lines.append(
                f"{name}: window {state.applied_window} min_lb {state.min_epoch_lower_bound} "
                f"lro {state.lro} hwm {state.high_watermark} lrlo {state.lrlo} "
                f"window@{state.epoch_window_offset} published {board.get(name)}"
            )
        lines[0:0] = (
            self.compaction.leftovers() + self.transactions.leftovers()
        )  # (first: the L0 line says none is left)
        return "\n  ".join(lines)
