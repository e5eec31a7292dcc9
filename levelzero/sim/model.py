"""The simulation's model objects: nodes, partitions, requests, jobs, rounds and counters.

Plain mutable records; the behaviour lives in `leader.py` (a partition leader) and in the
`World` and its parts (`batcher.py`, `housekeeper.py`, `reconciler.py`, `readers.py`,
`gc_worker.py`), which mirror the actors of `levelzero/actors` one by one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from levelzero.core.entries import AdvanceEpoch, LogRecord, Placeholder
from levelzero.core.gc import MonotoneWatermark
from levelzero.core.keys import parse_l0_key
from levelzero.core.l0format import ExtentHeader, Record
from levelzero.core.state import PartitionState

from .stores import L1Row, PartitionLog

if TYPE_CHECKING:
    from .leader import Leader

Reply = Callable[[LogRecord | None, Exception | None], None]

MUTATIONS: dict[str, str] = {
    "lower_bound_follows_max": "min_epoch_lower_bound follows max_applied_epoch on catch-up",
    "admit_below_window": "the fence admits epochs below the window",
    "gc_ignores_cap": "the GC ignores the creation-epoch cap (M not capped at E - 1)",
}


def short(key: str) -> str:
    """A readable handle for a key in the trace: prefix/epoch/first uuid digits."""
    if key.startswith("level_zero/"):
        k = parse_l0_key(key)
        return f"L0:{k.prefix}/{k.epoch}/{k.uuid[:6]}"
    return "L1:" + key.rsplit("/", 2)[-2] + "/" + key.rsplit("/", 1)[-1][:10]


@dataclass(eq=False, slots=True)
class Partition:
    """Cluster-level facts of one partition: its durable log and who leads it."""

    pid: int
    name: str
    creation_epoch: int
    log: PartitionLog
    shadow: PartitionState  # every durable record applied: the ground truth
    leader_node: Node | None = None


@dataclass(eq=False, slots=True)
class Change:
    """One leadership change, for the stall measurement (invariant 6)."""

    at: float
    pid: int
    term: int
    node: int
    cache_behind: int  # epochs the new leader's cache lags the service (0: none, or expired)
    stale: bool  # the new leader's cache (still fresh) is below the partition's max applied epoch
    stall_s: float = 0.0
    writes: int = 0
    rejections: int = 0
    writes_over_one_retry: int = 0
    writes_failed: int = 0


@dataclass(eq=False, slots=True)
class Request:
    rid: int
    pid: int
    leader: Leader
    records: list[Record]
    size: int
    submitted_at: float
    change: Change | None
    attempts: int = 0
    rejections: int = 0
    first_attempt_at: float = 0.0
    attempt_at: float = 0.0


@dataclass(eq=False, slots=True)
class Attempt:
    """One uploaded L0 object and the fencing of its extents."""

    node: Node
    key: str
    epoch: int
    by_pid: dict[int, list[Request]]
    headers: list[ExtentHeader]
    outstanding: int = 0
    rejected_everything: bool = True
    retry: list[Request] = field(default_factory=list)


@dataclass(eq=False, slots=True)
class WriteMsg:
    epoch: int
    entry: Placeholder | AdvanceEpoch
    reply: Reply


@dataclass(eq=False, slots=True)
class L0Read:
    rid: int
    leader: Leader
    pin: int
    offset: int
    placeholders: list[LogRecord]
    keys: frozenset[str]


@dataclass(eq=False, slots=True)
class ReconcileJob:
    leader: Leader
    term: int
    pin: int | None
    placeholders: list[LogRecord]
    keys: frozenset[str]
    row: L1Row | None = None


@dataclass(eq=False, slots=True)
class GcRound:
    node: Node
    names: list[str]
    cluster_epoch: int
    started_at: float
    m: int | None = None  # decided in step 2


class Node:
    """One levelzero process: its epoch cache, batcher, leaders and background workers."""

    def __init__(self, nid: int) -> None:
        self.id = nid
        self.alive = True
        self.incarnation = 0
        self.cache_value: int | None = None
        self.cache_fetched_at = -math.inf
        self.leaders: dict[int, Leader] = {}
        self.batch: list[Request] = []
        self.batch_bytes = 0
        self.batch_gen = 0
        self.requests_in_flight = 0
        self.gc_round: GcRound | None = None
        self.gc_watermark = MonotoneWatermark()  # the checker's memory: survives crashes

    def __repr__(self) -> str:
        return f"n{self.id}"


@dataclass(slots=True)
class Stats:
    writes_submitted: int = 0
    writes_acked: int = 0
    records_acked: int = 0
    writes_failed: int = 0
    writes_unavailable: int = 0
    stale_rejections: int = 0
    stale_retries: int = 0
    not_leader: int = 0
    objects_written: int = 0
    orphans: int = 0
    objects_deleted: int = 0
    l1_written: int = 0
    l1_deleted: int = 0
    catch_ups: int = 0
    catch_ups_rejected: int = 0
    housekeeper_advances: int = 0
    housekeeper_catch_ups: int = 0
    leadership_changes: int = 0
    crashes: int = 0
    epoch_bumps: int = 0
    gc_rounds: int = 0
    gc_rounds_blocked: int = 0
    gc_delete_errors: int = 0
    partitions_created: int = 0
    partitions_created_during_gc: int = 0
    l0_reads: int = 0
    l1_reads: int = 0
    faults: int = 0
