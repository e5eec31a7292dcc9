"""Compaction in the simulated world (issue 34): a compacted topic's workload and its checks.

In a share of seeds (swarm style, drawn from a stream of its own so that every other seed runs
exactly as before) the world creates a compacted topic (`cleanup.policy=compact`) with a short
`min.compaction.lag.ms` and `delete.retention.ms`, so that the shipping compactor's passes
happen within the seed, under the crashes, pauses, leadership moves and faults of the rest of
the world. Its producers write keys from a small key space, some values null (tombstones).
After a takeover, a compactor of the previous term sometimes finishes late (the zombie leader
of seed 004: the real `Compactor.compact_partition` with the old term); in a cluster, a node
paused past its lease mid-pass is one too.

The rules, one each:

- **latest** — a scan (fetches from the start offset to the high watermark, through the
  shipping read path) finds, for every key, the latest acknowledged record (acknowledged
  before the scan began), or a later one; a tombstone may be missing only once it is older
  than `delete.retention.ms` (or if a write of a tombstone of that key failed: it may have
  landed). Every record read at an acknowledged offset is the acknowledged one.
- **resurrect** — no key comes back after its tombstone was removed: a scan that finds a
  key's older record while its newer tombstone is gone.
- **zombie** — no compaction result is applied unless written under the partition's term at
  the moment the store accepts it (checked at each accepted `l1_compaction_commit`).
- **4** (the leak check) — after the quiet period, no object a compaction superseded, nor a
  refused result's object, is left in the store (rows DELETE_STARTED or DELETE_FINISHED), and
  no stored L1 object of a compacted partition lacks a row. Once healed, the objects a result
  accepted since superseded are gone within `superseded_delete_s` of its commit: the
  compactor deletes them itself, not the leader's later check of abandoned deletes (which
  finishes, past the copy deadline, what a stopped node left).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import anyio
import anyio.abc

from levelzero.actors.compactor import CompactorConfig
from levelzero.actors.node import Node, NodeConfig
from levelzero.actors.partition import PartitionActor
from levelzero.core.errors import LevelZeroError, TopicExists
from levelzero.core.keys import l1_partition_prefix
from levelzero.core.l0format import Record
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.protocols import CompactionCommit, L1State

from .faults import SimLogStore


class Incarnation(Protocol):
    """What the compaction workload uses of a node's incarnation (`world.Incarnation`): named
    here so that this module does not import the world that imports it."""

    number: int
    node: Node
    gate: Any  # faults.Gate: `pauses`
    tg: anyio.abc.TaskGroup | None
    alive: bool
    ended: bool
    stopping: bool


class World(Protocol):
    """What the compaction workload uses of the world (`world.World`)."""

    seed: int
    cfg: Any  # runner.SimConfig: `compaction_share`, `superseded_delete_s`
    phase: str
    healed_at: float | None
    produces_in_flight: int
    log_store: SimLogStore
    objects: MemoryObjectStore

    @property
    def cluster(self) -> bool: ...

    @property
    def lives(self) -> Mapping[str | None, Any]: ...  # node id -> its live `Incarnation`

    def entry(self) -> Any: ...  # a live `Incarnation` a client enters at, or None

    def leading(self, actor: PartitionActor) -> bool: ...

    def pid(self, topic: str, partition: int) -> int: ...

    def partition_name(self, pid: int) -> str: ...

    def wall(self) -> float: ...

    @staticmethod
    def now() -> float: ...

    def note(self, text: str) -> None: ...

    def fail(self, invariant: str, message: str) -> None: ...

    async def _routed(
        self, inc: Any, topic: str, partition: int, op: str, *args: object
    ) -> tuple[Any, Any]: ...

    def _read_failure_explained(
        self, exc: LevelZeroError, offset: int, kept: bool, start_before: int
    ) -> str | None: ...


TOPIC = "compacted"
FETCH_BYTES = 4096
CREATE_WAIT_S = 5.0  # a creation served in a node's task group, waited for at most
SCAN_FETCHES_MAX = 500  # a scan gives up (unchecked) after this many fetches
EMPTY_FETCHES_MAX = 5  # ... or after this many empty answers in a row (an overtaken L0 read)


@dataclass(frozen=True, slots=True)
class CompactionDraw:
    """What one seed draws for compaction (from its own stream)."""

    enabled: bool
    partitions: int = 1
    keys: int = 4
    tombstone_p: float = 0.2
    produce_interval_s: float = 0.08
    scan_interval_s: float = 0.5
    compactor_interval_s: float = 0.5
    object_bytes_max: int = 64 * 1024 * 1024
    configs: dict[str, str] = field(default_factory=dict)
    late_compactor_p: float = 0.0
    late_compactor_tries: int = 3
    # The scans' fetch size (not the final one's): small ones end fetches inside compacted
    # objects, at their gaps (a fetch ending at a gap failed an assertion, unseen at 4096).
    scan_fetch_bytes: int = FETCH_BYTES


def draw(seed: int, share: float) -> CompactionDraw:
    rng = random.Random(f"compaction-{seed}")
    if rng.random() >= share:
        return CompactionDraw(enabled=False)
    configs = {
        "cleanup.policy": "compact",
        "min.compaction.lag.ms": str(rng.choice((0, 0, 200, 1000))),
        "delete.retention.ms": str(rng.choice((300, 1000, 2500))),
        "min.cleanable.dirty.ratio": str(rng.choice((0.05, 0.2, 0.5))),
    }
    if rng.random() < 0.3:
        configs["max.compaction.lag.ms"] = str(rng.choice((500, 2000)))
    return CompactionDraw(
        enabled=True,
        partitions=rng.choice((1, 1, 2)),
        keys=rng.choice((2, 4, 8, 20)),
        tombstone_p=rng.choice((0.1, 0.25, 0.5)),
        produce_interval_s=rng.choice((0.04, 0.08, 0.2)),
        scan_interval_s=rng.choice((0.25, 0.5, 1.0)),
        compactor_interval_s=rng.choice((0.2, 0.5, 1.5)),
        # Small: a pass reads the objects from the start up to this (at least one), so some
        # passes clean a prefix only and the next goes on.
        object_bytes_max=rng.choice((1024, 4096, 64 * 1024 * 1024)),
        configs=configs,
        late_compactor_p=0.7,
        scan_fetch_bytes=rng.choice((FETCH_BYTES, FETCH_BYTES, 24, 8)),  # drawn last: the rest as before
    )


def with_compactor(config: NodeConfig, interval_s: float, object_bytes_max: int) -> NodeConfig:
    """`config` with the compactor's task on (every `interval_s`, reading up to
    `object_bytes_max` a pass), as a seed with a compacted topic runs it."""
    return replace(
        config,
        compactor=CompactorConfig(interval_s=interval_s, object_bytes_max=object_bytes_max),
        # a superseded object whose delete failed is retried within the quiet period
        reconciler=replace(config.reconciler, delete_retry_first_s=0.2, delete_retry_max_s=4.0),
    )


class Topics(Protocol):
    """What creating a compacted topic and its leak check use of the world (`world.World`)."""

    log_store: SimLogStore
    objects: MemoryObjectStore

    def entry(self) -> Any: ...

    def note(self, text: str) -> None: ...


async def create_topic(
    world: Topics, topic: str, partitions: int, configs: dict[str, str], *, in_node: bool = False
) -> bool:
    """Create a topic with `configs` through a live node, a few tries (a node may be down a
    while); True once created. `in_node`: each try runs in the node's task group, as a request
    it serves (a crash ends it with the process, the caller waits a bounded while); else the
    caller awaits the node's call itself."""
    for _ in range(20):
        inc = world.entry()
        if inc is not None and inc.tg is not None:
            try:
                if in_node:
                    if await _create_in(inc, topic, partitions, configs):
                        break
                else:
                    await inc.node.create_topic(topic, partitions, configs)
                    break
            except TopicExists:  # an earlier try failed after its effect
                break
            except LevelZeroError as exc:
                world.note(f"{inc} creating {topic} failed: {type(exc).__name__}")
        await asyncio.sleep(0.2)
    else:
        return False
    world.note(f"created {topic} with {partitions} partitions, {configs}")
    return True


async def _create_in(inc: Any, topic: str, partitions: int, configs: dict[str, str]) -> bool:
    """One creation, served in the node's task group; True if it returned, raised as it raised,
    False if it did not end within a few seconds or ended with the node."""
    outcome: list[LevelZeroError | None] = []
    done = anyio.Event()

    async def create() -> None:
        try:
            await inc.node.create_topic(topic, partitions, configs)
            outcome.append(None)
        except LevelZeroError as exc:
            outcome.append(exc)
        finally:
            done.set()

    inc.tg.start_soon(create)
    with anyio.move_on_after(CREATE_WAIT_S):
        await done.wait()
    if not outcome:
        return False
    if outcome[0] is not None:
        raise outcome[0]
    return True


def leaked_l1(world: Topics, topic: str, partitions: int) -> list[str]:
    """Stored L1 objects of a compacted topic's partitions that no live row keeps (superseded
    by a compaction, or a refused result's, and not deleted)."""
    rows = world.log_store.l1
    prefixes = tuple(l1_partition_prefix(topic, p) for p in range(partitions))
    left = []
    for key in world.objects.keys():  # noqa: SIM118 - the store's own listing
        if not key.startswith(prefixes):
            continue
        row = rows.get(key)
        if row is None or row.state in (L1State.DELETE_STARTED, L1State.DELETE_FINISHED):
            left.append(f"{key} ({'no row' if row is None else row.state})")
    return left


@dataclass(slots=True)
class CompactionStats:
    writes_acked: int = 0
    writes_failed: int = 0
    scans: int = 0
    scans_checked: int = 0  # completed on a node that led throughout: their rules evaluated
    keys_checked: int = 0
    passes: int = 0  # accepted compaction results
    refused: int = 0  # refused ones (zombies, late compactors)
    late_compactors: int = 0
    interrupted: int = 0  # passes under way when their node crashed or stopped
    superseded: int = 0  # objects accepted results superseded


@dataclass(slots=True)
class Latest:
    offset: int
    value: bytes | None
    timestamp_ms: int


class CompactionSim:
    """The compacted topic of one seed: its workload, its ground truth and its rules."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.draw = draw(world.seed, world.cfg.compaction_share)
        self.enabled = self.draw.enabled
        self.rng = random.Random(f"compaction-workload-{world.seed}")
        self.stats = CompactionStats()
        self.retention_ms = int(self.draw.configs.get("delete.retention.ms", "0"))
        # pid -> offset -> (key, value) acknowledged; pid -> key -> its latest acknowledged
        self.acked: dict[int, dict[int, tuple[bytes | None, bytes | None]]] = {}
        self.latest: dict[int, dict[bytes, Latest]] = {}
        # (pid, key) of tombstones whose write failed (they may have landed, unacknowledged)
        # or is still under way (durable, its reply held up by a pause)
        self.doubtful_tombstones: set[tuple[int, bytes]] = set()
        self.tombstones_in_flight: Counter[tuple[int, bytes]] = Counter()
        self._passes_under_way: Counter[int] = Counter()  # incarnation number -> passes running
        self.pids: set[int] = set()
        self.accepted: Counter[int] = Counter()  # pid -> compaction results accepted
        # key -> when the result that superseded it was accepted (while still stored)
        self.superseded_at: dict[str, float] = {}
        self.topic_created = False
        self._values = 0
        if self.enabled:
            self._watch_commits()

    # ------------------------------------------------------------------ hooks of the world

    def owns(self, topic: str) -> bool:
        """The compacted topic: the world's own producers and readers leave it alone (its
        records need keys, its reads have gaps)."""
        return self.enabled and topic == TOPIC

    def node_config(self, config: NodeConfig) -> NodeConfig:
        if not self.enabled:
            return config  # no compactor task: every other seed's schedule unchanged
        return with_compactor(config, self.draw.compactor_interval_s, self.draw.object_bytes_max)

    async def start(self, tg: anyio.abc.TaskGroup, end: float) -> None:
        """Create the compacted topic and start its producer and scanner."""
        if not self.enabled:
            return
        world = self.world
        self.topic_created = await create_topic(world, TOPIC, self.draw.partitions, self.draw.configs)
        if not self.topic_created:
            return
        for pid, row in world.log_store.partitions.items():
            if row.topic == TOPIC:
                self.pids.add(pid)
        tg.start_soon(self._producer, end)
        tg.start_soon(self._scanner, end)

    def on_incarnation(self, inc: Incarnation) -> None:
        """Its compactor's passes are counted while under way (a crash mid-pass is counted);
        after a takeover, a compactor of the previous term sometimes finishes late."""
        if not self.enabled:
            return
        self._count_passes(inc)
        if inc.number == 1 or self.rng.random() >= self.draw.late_compactor_p:
            return
        assert inc.tg is not None
        inc.tg.start_soon(self._late_compactor, inc)

    def _count_passes(self, inc: Incarnation) -> None:
        compactor = inc.node.compactor
        compact = compactor.compact_partition  # the bound method of the shipping class
        under_way = self._passes_under_way

        async def counted(actor: PartitionActor, term: int | None = None) -> bool:
            under_way[inc.number] += 1
            try:
                return await compact(actor, term)
            finally:
                under_way[inc.number] -= 1

        setattr(compactor, "compact_partition", counted)  # noqa: B010 - the instance's, counted

    def absorb(self, inc: Incarnation) -> None:
        if not self.enabled:
            return
        stats = inc.node.compactor.stats
        self.stats.passes += stats.passes
        self.stats.refused += stats.refused
        if not inc.alive and self._passes_under_way[inc.number] > 0:
            self.stats.interrupted += 1

    def settled(self) -> bool:
        return not self.enabled or not self._leftovers()

    def leftovers(self) -> list[str]:
        left = self._leftovers() if self.enabled else []
        return [f"{len(left)} L1 objects of compacted partitions leaked: {left[:5]}"] if left else []

    async def final_scan(self) -> None:
        """Once settled: every partition scanned through its leader, every rule evaluated."""
        if not self.topic_created:
            return
        for pid in sorted(self.pids):
            for _ in range(10):  # the leader may still be moving in: a few tries
                if await self._scan_partition(pid, final=True):
                    break
                await asyncio.sleep(0.5)
            else:
                self.world.fail("latest", f"{self.world.partition_name(pid)}: no scan completed at the end")

    # ------------------------------------------------------------------ the rules

    def _watch_commits(self) -> None:
        """The zombie rule, at the store's compare-and-set: an accepted result was written under
        the partition's term at that moment (nothing else runs between the store's decision and
        this check: it follows the call's return)."""
        store = self.world.log_store
        original: Callable[..., Any] = store.l1_compaction_commit

        async def commit(c: CompactionCommit, now: float) -> str | None:
            refusal = await original(c, now)
            row = store.partitions.get(c.pid)
            name = self.world.partition_name(c.pid)
            if refusal is not None:
                self.world.note(f"compaction of {name} by term {c.writer_term} refused: {refusal[:80]}")
                return refusal
            self.world.note(
                f"compaction of {name} by term {c.writer_term} accepted: {dict(c.cleaner_offsets)}"
            )
            if row is not None and row.term != c.writer_term:
                self.world.fail(
                    "zombie",
                    f"{name}: a compaction result written under term {c.writer_term} was applied at "
                    f"term {row.term} (map {dict(c.cleaner_offsets)})",
                )
            self.accepted[c.pid] += 1
            self.stats.superseded += len(c.superseded_keys)
            now = self.world.now()
            for key in c.superseded_keys:
                self.superseded_at.setdefault(key, now)
            return refusal

        setattr(store, "l1_compaction_commit", commit)  # noqa: B010 - the instance's, watched

    def check_superseded_deleted(self) -> None:
        """Once healed: the objects a result accepted since superseded are gone within
        `superseded_delete_s` of its commit."""
        healed_at = self.world.healed_at
        if not self.superseded_at or healed_at is None:
            return
        now = self.world.now()
        bound = self.world.cfg.superseded_delete_s
        stored = self.world.objects._objects  # (the store's own map: a lookup, not a listing)
        for key, at in list(self.superseded_at.items()):
            if key not in stored:
                del self.superseded_at[key]
            elif at >= healed_at and now - at > bound:
                self.world.fail(
                    "4",
                    f"{key}: superseded by a compaction result accepted at {at:.4f} (healed), still "
                    f"stored {now - at:.2f}s later (bound {bound}s)",
                )

    def _leftovers(self) -> list[str]:
        """Stored L1 objects of compacted partitions that no live row keeps."""
        return leaked_l1(self.world, TOPIC, self.draw.partitions)

    def _check_record(
        self, pid: int, offset: int, key: bytes | None, value: bytes | None, where: str
    ) -> None:
        expected = self.acked.get(pid, {}).get(offset)
        if expected is not None and expected != (key, value):
            self.world.fail(
                "3",
                f"{self.world.partition_name(pid)}@{offset} read from {where} is {(key, value)!r}, "
                f"acknowledged {expected!r}",
            )

    def _expired_tombstone_after(self, pid: int, key: bytes, offset: int, end_ms: int) -> bool:
        """The key's latest acknowledged record now is a tombstone after `offset`, older than
        delete.retention.ms at `end_ms`."""
        now = self.latest.get(pid, {}).get(key)
        return (
            now is not None
            and now.value is None
            and now.offset > offset
            and now.timestamp_ms + self.retention_ms <= end_ms + 1
        )

    def _superseded_beyond(self, pid: int, key: bytes, offset: int, end_offset: int) -> bool:
        """The key's latest acknowledged record now is after `offset`, where the scan did not
        read (at or past `end_offset`)."""
        now = self.latest.get(pid, {}).get(key)
        return now is not None and now.offset > offset and now.offset >= end_offset

    def _evaluate(
        self,
        pid: int,
        snapshot: dict[bytes, Latest],
        seen: dict[bytes, tuple[int, bytes | None]],
        end_ms: int,
        atomic: bool,
        end_offset: int,
    ) -> None:
        """`atomic`: no compaction was accepted while the scan ran (one that was may have
        dropped a tombstone the scan had not reached, after it read the key's older record
        from the objects it superseded: as a Kafka consumer slower than delete.retention.ms).
        `end_offset`: where the scan stopped (the high watermark its last fetch answered)."""
        name = self.world.partition_name(pid)
        for key, latest in snapshot.items():
            self.stats.keys_checked += 1
            got = seen.get(key)
            if got is not None and got[0] >= latest.offset:
                continue
            # A tombstone older than delete.retention.ms may be gone (the compactor's clock read
            # before its commit, which came before this scan's end).
            expired = latest.value is None and latest.timestamp_ms + self.retention_ms <= end_ms + 1
            if not atomic and self._expired_tombstone_after(pid, key, latest.offset, end_ms):
                # A compaction during the scan removed a later tombstone of the key, expired by
                # then, with every record before it; the scan read the key's older record from
                # the objects it superseded (seed 27: a consumer slower than
                # delete.retention.ms, as in Kafka).
                continue
            if not atomic and self._superseded_beyond(pid, key, latest.offset, end_offset):
                # A compaction during the scan removed the key's record, superseded by a later
                # one acknowledged since the scan began, past where the scan stopped (three-node
                # seed 17136: a fetch begun at offset 0 and high watermark 31, slowed for 3 s,
                # read the result of a compaction through 39, where k6's record at 25 had given
                # way to the one at 34). As in Kafka: a consumer behind the cleaner's point
                # skips a key's superseded records and meets the later one as it reads on.
                continue
            if got is None:
                doubt = (pid, key) in self.doubtful_tombstones or self.tombstones_in_flight[(pid, key)] > 0
                if expired or doubt:
                    continue
                what = "tombstone" if latest.value is None else "value"
                self.world.fail(
                    "latest",
                    f"{name}: key {key!r} has no record, its latest acknowledged {what} is at "
                    f"{latest.offset} (written at {latest.timestamp_ms} ms, scan ended {end_ms} ms, "
                    f"delete.retention.ms {self.retention_ms})",
                )
            elif expired:
                if not atomic:
                    continue
                self.world.fail(
                    "resurrect",
                    f"{name}: key {key!r} came back: its record at {got[0]} reads after its tombstone "
                    f"at {latest.offset} was removed",
                )
            else:
                self.world.fail(
                    "latest",
                    f"{name}: key {key!r} reads its record at {got[0]}, its latest acknowledged is at "
                    f"{latest.offset} ({latest.value!r})",
                )

    # ------------------------------------------------------------------ the workload

    def _record(self) -> Record:
        self._values += 1
        key = f"k{self.rng.randrange(self.draw.keys)}".encode()
        value = None if self.rng.random() < self.draw.tombstone_p else f"c{self._values}".encode()
        return Record(key=key, value=value, timestamp_ms=round(self.world.wall() * 1000))

    async def _producer(self, end: float) -> None:  # noqa: ARG002 - the loops' one signature
        world = self.world
        while True:
            await asyncio.sleep(self.rng.expovariate(1.0 / self.draw.produce_interval_s))
            if world.phase == "quiet":
                return
            inc = world.entry()
            if inc is None or inc.tg is None:
                continue
            partition = self.rng.randrange(self.draw.partitions)
            records = [self._record() for _ in range(self.rng.randint(1, 3))]
            world.produces_in_flight += 1
            inc.tg.start_soon(self._produce, inc, partition, records)

    async def _produce(self, inc: Incarnation, partition: int, records: list[Record]) -> None:
        world = self.world
        pid = world.pid(TOPIC, partition)
        tombstones = [(pid, r.key) for r in records if r.value is None and r.key is not None]
        self.tombstones_in_flight.update(tombstones)
        try:
            if world.cluster:
                inc, result = await world._routed(inc, TOPIC, partition, "produce", records)
            else:
                result = await inc.node.produce(TOPIC, partition, records)
        except LevelZeroError as exc:
            self.stats.writes_failed += 1
            self.doubtful_tombstones.update(tombstones)
            world.note(f"{inc} produce to {TOPIC}/{partition} failed: {type(exc).__name__}")
            return
        except BaseException:
            # Cancelled with the incarnation the client entered at (its crash or stop): the
            # client never learns the outcome, and the records, handed on to the leader's
            # batcher, may still land, after records acknowledged later (three-node seeds 391
            # and 722: a tombstone landed after the key's later value, and the compactor
            # rightly removed both). As a failed write: its tombstones are in doubt.
            self.doubtful_tombstones.update(tombstones)
            world.note(f"{inc} produce to {TOPIC}/{partition} cancelled")
            raise
        finally:
            world.produces_in_flight -= 1
            self.tombstones_in_flight.subtract(tombstones)
        self.stats.writes_acked += 1
        acked = self.acked.setdefault(pid, {})
        latest = self.latest.setdefault(pid, {})
        for i, r in enumerate(records):
            offset = result.base_offset + i
            if offset in acked:
                world.fail("3", f"{TOPIC}/{partition}@{offset} acknowledged twice")
            acked[offset] = (r.key, r.value)
            assert r.key is not None
            before = latest.get(r.key)
            if before is None or before.offset < offset:
                latest[r.key] = Latest(offset, r.value, r.timestamp_ms)
        world.note(f"{inc} acked {TOPIC}/{partition}@{result.base_offset}..{result.last_offset}")

    async def _scanner(self, end: float) -> None:  # noqa: ARG002 - the loops' one signature
        world = self.world
        while True:
            await asyncio.sleep(self.rng.expovariate(1.0 / self.draw.scan_interval_s))
            if world.phase == "quiet":
                return
            pid = self.rng.choice(sorted(self.pids))
            await self._scan_partition(pid, final=False)

    def _leader_of(self, pid: int) -> tuple[Incarnation, PartitionActor] | None:
        world = self.world
        for inc in world.lives.values():
            if inc.tg is None or inc.ended or inc.stopping:
                continue
            for actor in inc.node.partitions():
                if actor.row.pid == pid and actor.ready.is_set() and world.leading(actor):
                    return inc, actor
        return None

    async def _scan_partition(self, pid: int, *, final: bool) -> bool:
        """Read the partition from its start offset to its high watermark through the node that
        leads it; if that node led it throughout, evaluate the rules. True if evaluated."""
        world = self.world
        found = self._leader_of(pid)
        if found is None:
            return False
        inc, actor = found
        self.stats.scans += 1
        pauses = inc.gate.pauses
        snapshot = {k: replace(v) for k, v in self.latest.get(pid, {}).items()}
        accepted = self.accepted[pid]
        # The node serves the lineage its catalog last read: a compaction the store accepted
        # shows there only once the catalog reads again (the compactor's refresh after its
        # commit). A scan begun in between may read a superseded object first and the result
        # after: as one during which the compaction was accepted (three-node seeds 751 and 838,
        # once the reconciler's schedule moved: k18's record at 78 from the superseded object,
        # its expired tombstone at 235 gone from the result).
        stored = self.world.log_store.l1
        behind = any(
            key not in stored or stored[key].state != L1State.COPY_FINISHED
            for key in (str(entry["key"]) for entry in inc.node.l1.lineage(actor))
        )
        start_before = actor.state.start_offset
        offset = start_before
        seen: dict[bytes, tuple[int, bytes | None]] = {}
        empty = 0
        topic, partition = actor.row.topic, actor.row.partition
        for _ in range(SCAN_FETCHES_MAX):
            try:
                fetch_bytes = FETCH_BYTES if final else self.draw.scan_fetch_bytes
                result = await inc.node.fetch(topic, partition, offset, fetch_bytes)
            except LevelZeroError as exc:
                kept = inc.alive and inc.gate.pauses == pauses and world.leading(actor)
                world.note(f"{inc} scan of {actor.name}@{offset} failed: {type(exc).__name__}")
                if world._read_failure_explained(exc, offset, kept, start_before) is not None:
                    return False
                world.fail(
                    "read",
                    f"a fetch of compacted {actor.name} at offset {offset} on {inc} failed with no "
                    f"injected fault or move to explain it: {type(exc).__name__}: {exc}",
                )
            records = result.records
            if not records:
                if offset >= result.high_watermark:
                    break
                empty += 1  # an L0 read the reconciler overtook: fetched again, from L1
                if empty > EMPTY_FETCHES_MAX:
                    return False
                continue
            empty = 0
            previous = offset - 1
            for r in records:
                if r.offset <= previous:
                    world.fail(
                        "read",
                        f"a fetch of compacted {actor.name} at {offset} answers offset {r.offset} "
                        f"after {previous} ({result.tier})",
                    )
                previous = r.offset
                self._check_record(pid, r.offset, r.key, r.value, result.tier)
                if r.key is not None:
                    seen[r.key] = (r.offset, r.value)
            offset = result.next_offset
            if offset >= result.high_watermark:
                break
        else:
            return False
        if not (inc.alive and inc.gate.pauses == pauses and world.leading(actor)):
            return False  # a node that lost the partition meanwhile may have served stale data
        end_ms = round(world.wall() * 1000)
        atomic = self.accepted[pid] == accepted and not behind
        self._evaluate(pid, snapshot, seen, end_ms, atomic, offset)
        self.stats.scans_checked += 1
        world.note(
            f"{inc} scanned {actor.name} to {offset}: {len(seen)} keys" + (" (final)" if final else "")
        )
        return True

    async def _late_compactor(self, inc: Incarnation) -> None:
        """The real compactor, with the previous term, against the new leader's stores: its
        result must be refused (a zombie leader's pending compaction, seed 004)."""
        for _ in range(self.draw.late_compactor_tries):
            await asyncio.sleep(self.rng.uniform(0.1, 1.5))
            actors = [
                a for a in inc.node.partitions() if a.ready.is_set() and a.term > 1 and a.row.topic == TOPIC
            ]
            if not actors:
                continue
            actor = self.rng.choice(actors)
            term = actor.term - 1
            self.stats.late_compactors += 1
            try:
                done = await inc.node.compactor.compact_partition(actor, term=term)
            except LevelZeroError as exc:
                world_note = f"{inc} late compactor of {actor.name} term {term}: {type(exc).__name__}"
                self.world.note(world_note)
                continue
            self.world.note(
                f"{inc} late compactor of {actor.name} term {term}: {'accepted' if done else 'not applied'}"
            )
