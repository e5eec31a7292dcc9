"""The simulated cluster: nodes, partition leaders, batchers, reconcilers, housekeepers, GC
workers, readers, an epoch service and a fault injector, all driven by one scheduler and one
`random.Random`.

Only the *core* is real: `PartitionState` (replayed from snapshot + log, applied in log order),
`Fence` (try_fence / BecomeUpdater / drained / complete_slide / release), `ReaderPins`, the GC
selection (`compute_cluster_watermark`, `scan_prefix`, `batches`), keys and the L0 format. What
the actors do around them (mailboxes, the appender, awaiting replies) is modelled as events,
mirroring `levelzero/actors/*` step by step; every await of an actor becomes "schedule the rest
later", which is where delays, reordering, crashes and zombies get in.

Ownership: events that belong to a node carry its incarnation and are dropped once it crashed,
so a crash loses exactly the node's memory (leaders, batches, in-flight jobs, GC rounds) while
the durable logs, the object store and the L1 metastore survive.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from levelzero.core.entries import LogRecord
from levelzero.core.fence import FenceMode
from levelzero.core.gc import compute_cluster_watermark
from levelzero.core.keys import parse_l0_key
from levelzero.core.state import PartitionState

from .batcher import BatcherMixin
from .checks import Truth, apply_checked
from .config import Range, SimConfig
from .gc_worker import GcMixin
from .housekeeper import HousekeeperMixin
from .leader import Leader
from .model import MUTATIONS, Change, Node, Partition, Stats
from .readers import ReadersMixin
from .reconciler import ReconcilerMixin
from .scheduler import Scheduler
from .stores import L1Metastore, PartitionLog, SimObjectStore, WatermarkBoard
from .violation import SimulationViolation

__all__ = ["MUTATIONS", "World"]


class World(BatcherMixin, HousekeeperMixin, ReconcilerMixin, ReadersMixin, GcMixin):
    """One seed's cluster. `start()` schedules the workload; the runner steps the scheduler."""

    def __init__(
        self,
        seed: int,
        cfg: SimConfig,
        *,
        mode: FenceMode = FenceMode.WINDOWED,
        mutation: str | None = None,
    ) -> None:
        if mutation is not None and mutation not in MUTATIONS:
            raise ValueError(f"unknown mutation {mutation!r}; one of {', '.join(MUTATIONS)}")
        self.seed = seed
        self.mode = FenceMode(mode)
        self.mutation = mutation
        self.rng = random.Random(seed)
        if cfg.vary_per_seed:
            cfg = replace(
                cfg,
                cache_ttl_s=cfg.cache_ttl_s * self.rng.choice((0.4, 1.0, 2.0)),
                epoch_bump_interval_s=cfg.epoch_bump_interval_s * self.rng.choice((0.5, 1.0, 2.0)),
                reconciler_interval_s=cfg.reconciler_interval_s * self.rng.choice((0.5, 1.0, 2.5)),
                newest_partition_write_p=self.rng.choice((0.0, 0.3, 0.6)),
            )
        self.cfg = cfg
        self.sched = Scheduler()
        self.stats = Stats()
        self.epoch = 1
        self.nodes = [Node(i) for i in range(cfg.nodes)]
        self.parts: dict[int, Partition] = {}
        self.next_pid = 0
        self.store = SimObjectStore()
        self.l1 = L1Metastore()
        self.board = WatermarkBoard()
        self.truth = Truth(self)
        self.changes: list[Change] = []
        self.phase = "workload"
        self.faulty = True
        # Per-seed fault intensity: some seeds are calm, some are storms.
        self.fault_scale = self.rng.choice((0.5, 1.0, 1.0, 2.0))
        self._next_id = 0

    # ------------------------------------------------------------------ plumbing

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def note(self, text: str) -> None:
        self.sched.note(text)

    def after(self, delay_s: float, label: str, fn: Callable[..., Any], *args: Any) -> None:
        self.sched.after(delay_s, label, fn, *args)

    def node_after(
        self, node: Node, delay_s: float, label: str, fn: Callable[..., Any], *args: Any
    ) -> None:
        """An event of `node`'s current life: dropped if the node crashed meanwhile."""
        self.sched.after(
            delay_s, f"n{node.id} {label}", self._node_event, node, node.incarnation, fn, args
        )

    @staticmethod
    def _node_event(node: Node, incarnation: int, fn: Callable[..., Any], args: tuple) -> None:
        if node.alive and node.incarnation == incarnation:
            fn(*args)

    def uniform(self, r: Range) -> float:
        return self.rng.uniform(r[0], r[1])

    def delay(self, normal: Range, slow_p: float = 0.0, slow: Range | None = None) -> float:
        if slow is not None and self.faulty and self.rng.random() < slow_p:
            return self.uniform(slow)
        return self.uniform(normal)

    def chance(self, p: float) -> bool:
        """A fault: only while faults are on, scaled by the seed's intensity."""
        if not self.faulty:
            return False
        if self.rng.random() < p * self.fault_scale:
            self.stats.faults += 1
            return True
        return False

    def message_delay(self) -> float:
        return self.delay(self.cfg.message_s, self.cfg.late_message_p, self.cfg.late_message_s)

    def expo(self, mean_s: float) -> float:
        return self.rng.expovariate(1.0 / mean_s)

    def new_state(self, creation_epoch: int) -> PartitionState:
        state = PartitionState(creation_epoch)
        self._mutate(state)
        return state

    def _mutate(self, state: PartitionState) -> PartitionState:
        if self.mutation == "lower_bound_follows_max":
            state._mutate_lower_bound_follows_max = True
        return state

    def current_leader(self, part: Partition) -> Leader | None:
        node = part.leader_node
        if node is None or not node.alive:
            return None
        rt = node.leaders.get(part.pid)
        return rt if rt is not None and rt.current else None

    # ------------------------------------------------------------------ start

    def start(self) -> None:
        for _ in range(self.cfg.initial_partitions):
            pid, name = self._register_partition()
            self._create_partition(pid, name)
        for node in self.nodes:
            self._start_node_timers(node)
        self.after(self.expo(self.cfg.epoch_bump_interval_s), "epoch bump", self._epoch_tick)
        self.after(self.expo(self.cfg.produce_interval_s), "produce", self._produce_tick)
        self.after(self.expo(self.cfg.read_interval_s), "read", self._read_tick)
        self.after(self.expo(self.cfg.create_interval_s), "create", self._create_tick)
        self.after(self.expo(self.cfg.crash_interval_s), "crash", self._crash_tick)
        self.after(self.expo(self.cfg.move_interval_s), "move leader", self._move_tick)

    def _start_node_timers(self, node: Node) -> None:
        cfg = self.cfg
        self.node_after(
            node,
            self.rng.uniform(0, cfg.housekeeper_interval_s),
            "housekeeper",
            self._housekeeper_tick,
            node,
        )
        self.node_after(
            node,
            self.rng.uniform(0, cfg.reconciler_interval_s),
            "reconciler",
            self._reconciler_tick,
            node,
        )
        self.node_after(node, self.rng.uniform(0, cfg.gc_interval_s), "gc", self._gc_tick, node)

    def begin_quiet(self) -> None:
        """Writes, reads, creations and faults stop; epochs keep bumping, background work runs."""
        self.phase = "quiet"
        self.faulty = False
        self.note("quiet period: workload and faults stop")

    @property
    def settled(self) -> bool:
        """Quiet and done: no L0 object left and no write in flight anywhere."""
        return (
            self.store.l0_count == 0
            and all(n.alive for n in self.nodes)
            and all(n.requests_in_flight == 0 and not n.batch for n in self.nodes)
        )

    # ------------------------------------------------------------------ epochs

    def _epoch_tick(self) -> None:
        self._bump("timer")
        if self.rng.random() < self.cfg.epoch_burst_p:
            self.after(
                self.rng.uniform(0.0, 0.2), "epoch bump (on demand)", self._bump, "on demand"
            )
        self.after(self.expo(self.cfg.epoch_bump_interval_s), "epoch bump", self._epoch_tick)

    def _bump(self, why: str) -> None:
        self.epoch += 1
        self.stats.epoch_bumps += 1
        self.note(f"cluster epoch -> {self.epoch} ({why})")

    def cache_get(self, node: Node) -> int:
        """The node's cached epoch; refreshed only when expired (or invalidated)."""
        if (
            node.cache_value is None
            or self.sched.now - node.cache_fetched_at >= self.cfg.cache_ttl_s
        ):
            node.cache_value = (
                self.epoch if node.cache_value is None else max(node.cache_value, self.epoch)
            )
            node.cache_fetched_at = self.sched.now
        return node.cache_value

    def cache_behind(self, node: Node) -> int:
        fresh = (
            node.cache_value is not None
            and self.sched.now - node.cache_fetched_at < self.cfg.cache_ttl_s
        )
        return self.epoch - node.cache_value if fresh and node.cache_value is not None else 0

    @staticmethod
    def cache_invalidate_below(node: Node, epoch: int) -> None:
        if node.cache_value is None or node.cache_value < epoch:
            node.cache_fetched_at = -math.inf

    # ------------------------------------------------------------------ partitions and leaders

    def _register_partition(self) -> tuple[int, str]:
        pid = self.next_pid
        self.next_pid += 1
        name = f"{self.cfg.topic}/{pid}"
        self.board.register(name)  # before the creation epoch is chosen (node.py)
        return pid, name

    def _create_partition(self, pid: int, name: str) -> None:
        creation_epoch = self.epoch
        shadow = self.new_state(creation_epoch)
        part = Partition(pid, name, creation_epoch, PartitionLog(name), shadow)
        self.parts[pid] = part
        self.stats.partitions_created += 1
        if any(n.gc_round is not None for n in self.nodes):
            self.stats.partitions_created_during_gc += 1
        self.note(f"created {name} with creation epoch {creation_epoch}")
        self._elect(part)

    def _create_tick(self) -> None:
        if self.phase != "workload":
            return
        if self.next_pid < self.cfg.initial_partitions + self.cfg.partitions_created_max:
            pid, name = self._register_partition()
            self.after(
                self.uniform(self.cfg.create_gap_s),
                f"create {name}",
                self._create_partition,
                pid,
                name,
            )
        self.after(self.expo(self.cfg.create_interval_s), "create", self._create_tick)

    def _elect(self, part: Partition) -> None:
        if part.leader_node is not None:
            return
        alive = [n for n in self.nodes if n.alive]
        if not alive:
            self.after(0.5, f"elect {part.name}", self._elect, part)
            return
        self.become_leader(part, self.rng.choice(alive))

    def become_leader(self, part: Partition, node: Node) -> Leader:
        """Replay snapshot + log, begin a new term, publish (PartitionActor.recover)."""
        old = node.leaders.get(part.pid)
        if old is not None:
            old.notice_deposed()
        snapshot = part.log.snapshot
        if snapshot is not None:
            state = self._mutate(PartitionState.decode_snapshot(snapshot[1]))
            assert state.last_applied_log_offset == snapshot[0]
        else:
            state = self.new_state(part.creation_epoch)
        for record in part.log.records[state.next_log_offset :]:
            apply_checked(state, record, f"replay of {part.name} on n{node.id}")
        record = part.log.begin_term(state.high_watermark)
        self.on_durable(part, [record])
        apply_checked(state, record, f"replay of {part.name} on n{node.id}")
        if state != part.shadow:
            raise SimulationViolation(
                "replay",
                f"{part.name} replayed on n{node.id}: {state!r} != durable {part.shadow!r}",
            )
        rt = Leader(self, part, node, state)
        behind = self.cache_behind(node)
        stale = (
            behind > 0
            and state.max_applied_epoch is not None
            and self.epoch - behind < state.max_applied_epoch
        )
        if rt.term > 1:  # a change of leadership, not a new partition's first leader
            rt.change = Change(self.sched.now, part.pid, rt.term, node.id, behind, stale)
            self.changes.append(rt.change)
            self.stats.leadership_changes += 1
        node.leaders[part.pid] = rt
        part.leader_node = node
        self.note(
            f"{rt} leads (cache behind by {behind}{', stale for the partition' if stale else ''})"
        )
        rt.publish()
        return rt

    def _move_tick(self) -> None:
        if self.phase != "workload":
            return
        self.after(self.expo(self.cfg.move_interval_s), "move leader", self._move_tick)
        led = [p for p in self.parts.values() if p.leader_node is not None and p.leader_node.alive]
        if not led:
            return
        part = self.rng.choice(led)
        old_node = part.leader_node
        assert old_node is not None
        others = [n for n in self.nodes if n.alive and n is not old_node]
        if not others:
            return
        old = old_node.leaders.get(part.pid)
        self.become_leader(part, self.rng.choice(others))
        if old is not None:
            # The old leader is a zombie until it hears about it (or its next append fails).
            self.node_after(
                old_node,
                self.uniform(self.cfg.zombie_notice_s),
                f"notice {old} deposed",
                old.notice_deposed,
            )

    def _crash_tick(self) -> None:
        if self.phase != "workload":
            return
        self.after(self.expo(self.cfg.crash_interval_s), "crash", self._crash_tick)
        alive = [n for n in self.nodes if n.alive]
        if alive:
            self.crash(self.rng.choice(alive))

    def crash(self, node: Node) -> None:
        self.stats.crashes += 1
        self.note(
            f"n{node.id} crashes: {len(node.leaders)} leaders, {node.requests_in_flight} writes lost"
        )
        node.alive = False
        node.incarnation += 1
        node.leaders = {}
        node.batch, node.batch_bytes, node.requests_in_flight = [], 0, 0
        node.gc_round = None
        node.cache_value, node.cache_fetched_at = None, -math.inf
        for part in self.parts.values():
            if part.leader_node is node:
                part.leader_node = None
                self.after(
                    self.uniform(self.cfg.election_s), f"elect {part.name}", self._elect, part
                )
        self.after(self.uniform(self.cfg.restart_s), f"restart n{node.id}", self._restart, node)

    def _restart(self, node: Node) -> None:
        node.alive = True
        self._start_node_timers(node)

    # ------------------------------------------------------------------ durable effects

    def on_durable(self, part: Partition, batch: list[LogRecord]) -> None:
        self.truth.on_durable(part, batch)

    # ------------------------------------------------------------------ explain (invariant 4)

    def explain_leftovers(self) -> str:
        mps = {name: self.board.get(name) for name in self.board.names()}
        decision = compute_cluster_watermark(self.epoch, mps)
        keys = self.store.l0_keys()
        lines = [
            f"{len(keys)} L0 objects left, epochs "
            f"{sorted({parse_l0_key(k).epoch for k in keys})[:10]}; cluster epoch {self.epoch}, "
            f"M={decision.m} holders={decision.holders} blocked={decision.blocked_by}"
        ]
        for part in self.parts.values():
            s = part.shadow
            lines.append(
                f"{part.name}: leader {part.leader_node} window {s.applied_window} "
                f"min_lb {s.min_epoch_lower_bound} lro {s.lro} hwm {s.high_watermark} lrlo {s.lrlo} window@{s.epoch_window_offset} "
                f"published {self.board.get(part.name)}"
            )
        for node in self.nodes:
            lines.append(
                f"n{node.id}: alive {node.alive} in flight {node.requests_in_flight} batch {len(node.batch)}"
            )
        return "\n  ".join(lines)
