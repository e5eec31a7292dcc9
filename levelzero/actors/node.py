"""A node: the actors of one levelzero process, wired to storage through protocols.

`Node.run` is the one task group of the actors: epoch service, one actor per partition, the
batcher (and, in later layers, reconciler, housekeeper and GC). The daemon opens concrete stores
and hands them in; tests hand in memory or SQLite stores directly.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import random
from typing import TypeVar
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from types import MappingProxyType
from dataclasses import dataclass, field

import anyio

from levelzero.core.activity import ActivityBoard
from levelzero.core.cluster import prefix_share
from levelzero.core.entries import AbandonUnreconciled, ProducerSpan
from levelzero.core.reconcile_health import Abandoned, ReconcileFailing
from levelzero.core.errors import (
    InternalTopicName,
    InvalidInput,
    LedElsewhere,
    LevelZeroError,
    MalformedKey,
    NotLeader,
    ObjectNotFound,
    OffsetOutOfRange,
    PolicyViolation,
    ShuttingDown,
    StorageError,
    TopicExists,
    TopicNameCollides,
    UnknownPartition,
    UnknownTopic,
)
from levelzero.core.fence import FenceMode
from levelzero.core.gc import NO_LIVE_LEADER
from levelzero.core.keys import (
    PREFIX_COUNT,
    TopicRecord,
    decode_topic_record,
    encode_topic_record,
    format_end_key,
    partition_ends_prefix,
    topic_ends_prefix,
    topic_restores_prefix,
    topic_record_key,
)
from levelzero.core.names import INTERNAL_TOPICS, colliding_topic, topic_name_problem, unstorable_topic_advice
from levelzero.core.l0format import Record
from levelzero.core.leader import WatermarkBoard
from levelzero.core.topic_configs import BrokerConfigs
from levelzero.storage.protocols import (
    DELETE_BATCH_KEYS_MAX,
    ClusterControl,
    LogStore,
    ObjectStore,
    PartitionRow,
    iter_objects,
)

from .appender import Appender
from .batcher import Batcher, BatcherConfig, ProduceResult
from .cluster import FORGET_EXPIRED_AFTER_S, ClusterMember
from .epochs import EpochCache, EpochService, SharedEpoch
from .gc import GcActor, GcConfig
from .housekeeper import Housekeeper, HousekeeperConfig
from .l1 import START_MOVED_BY_DELETE_RECORDS, L1Catalog
from .partition import PartitionActor, PartitionView
from .l0_cache import L0ObjectCache, l0_object_bytes_bound
from .reader import UNFRAMED, FetchResult, Framing, Reader
from .compactor import Compactor, CompactorConfig
from .reconciler import Reconciler, ReconcilerConfig
from .topic_configs import TopicConfigs

log = logging.getLogger("levelzero.node")
_T = TypeVar("_T")

# A new topic's configs: name -> value, or (name, value) pairs as a request lists them.
TopicConfigsGiven = Mapping[str, str | None] | Sequence[tuple[str, str | None]] | None

PARTITIONS_PER_TOPIC_MAX = 4096
PARTITIONS_MAX = 65_536
# Start-up replays this many partitions at once: their reads and `TermStart` appends share the
# log store's group commits instead of paying a commit each, one after another.
STARTUP_PARTITIONS_IN_FLIGHT_MAX = 256
PARTITION_STOP_TIMEOUT_S = 10.0  # a partition actor stopping: its appends in flight finish first
# The periodic tasks that look only at partitions whose state moved (core.activity).
ACTIVITY_CONSUMERS = ("housekeeper", "samples", "reconciler")


# Bounds of an abandon-unreconciled request's audit fields.
OPERATOR_CHARS_MAX = 200
REASON_CHARS_MAX = 1000


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """A node of a cluster: it leads the partitions its leases give it (actors/cluster.py),
    publishes their M(p) to the control plane, and its GC takes `M` over every partition's
    published M(p) there. Without these settings a node leads every partition of its store."""

    control: ClusterControl
    node_id: str
    advertise_url: str
    lease_ttl_s: float = 10.0
    kafka_url: str | None = None
    forget_expired_after_s: float = FORGET_EXPIRED_AFTER_S  # a crashed node's row is deleted then
    # The member's monotonic clock (None: the event loop's); the simulation drifts it.
    clock: Callable[[], float] | None = None


@dataclass(frozen=True, slots=True)
class NodeConfig:
    fencing_mode: FenceMode = FenceMode.WINDOWED
    epoch_cache_ttl_s: float = 5.0
    epoch_bump_interval_s: float | None = 60.0
    snapshot_every_records: int = 1_000
    log_keep_records: int = 10_000
    # L0 objects held for readers (l0_cache.py): one GET per object for all its partitions' reads.
    # 128 MiB: a catch-up of 64 partitions at 1 MiB a fetch thrashed 64 MiB (BENCHMARKS.md, "The
    # L0 cache's size"); a tailing reader holds only the few newest objects whatever the bound.
    l0_cache_bytes_max: int = 128 * 1024 * 1024
    batcher: BatcherConfig = field(default_factory=BatcherConfig)
    reconciler: ReconcilerConfig = field(default_factory=ReconcilerConfig)
    housekeeper: HousekeeperConfig = field(default_factory=HousekeeperConfig)
    compactor: CompactorConfig = field(default_factory=CompactorConfig)
    gc: GcConfig = field(default_factory=GcConfig)


class Node:
    def __init__(
        self,
        config: NodeConfig,
        log_store: LogStore,
        object_store: ObjectStore,
        *,
        rng: random.Random | None = None,
        wall_clock: Callable[[], float] | None = None,
        cluster: ClusterSettings | None = None,
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.member: ClusterMember | None = None
        self.log_store = log_store
        self.object_store = object_store
        self._wall = wall_clock or time.time
        shared = None
        if cluster is not None:
            shared = SharedEpoch(cluster.control.advance_cluster_epoch, self._bumps_epochs)
        self.epochs = EpochService(log_store, config.epoch_bump_interval_s, shared=shared)
        self.epoch_cache = EpochCache(self.epochs.get, config.epoch_cache_ttl_s)
        self.board = WatermarkBoard()
        # Writes every partition's reserved records, many partitions per log-store call.
        self.appender = Appender(log_store)
        self.activity = ActivityBoard(ACTIVITY_CONSUMERS)
        self._partitions: dict[tuple[str, int], PartitionActor] = {}
        self._by_name: dict[str, PartitionActor] = {}
        self._by_pid: dict[int, PartitionActor] = {}
        self.batcher = Batcher(
            object_store, log_store, self.epoch_cache, config.batcher, rng=rng, wall_clock=self._wall
        )
        self.l0_cache = L0ObjectCache(
            object_store,
            config.l0_cache_bytes_max,
            object_bytes_max=l0_object_bytes_bound(config.batcher.batch_bytes_max),
        )
        self.reader = Reader(log_store, self.l0_cache)
        self.l1 = L1Catalog(
            object_store,
            log_store,
            self._wall,
            delete_retry_first_s=config.reconciler.delete_retry_first_s,
            delete_retry_max_s=config.reconciler.delete_retry_max_s,
        )
        self.reader.l1 = self.l1
        self.reconciler = Reconciler(
            config.reconciler,
            object_store,
            log_store,
            self.l1,
            self.partitions,
            wall_clock=self._wall,
            rng=rng,
            activity=self.activity,
            index=self.partitions_by_name,
            strays_held=lambda: self.gc.paused,  # a paused GC deletes nothing (docs/backup-restore.md)
        )
        self._topics: dict[str, int] = {}
        # Called with a topic's name once this node deleted it (the store forgot it): what the
        # front ends keep per partition name goes with it.
        self.topic_deleted: list[Callable[[str], None]] = []
        # Called with a partition's (topic, partition) once this node handed it over (a cluster):
        # what the front ends keep of it may change elsewhere until it comes back.
        self.partition_left: list[Callable[[str, int], None]] = []
        # Each topic's configs (Kafka's topic configs): retention, max.message.bytes.
        keeper = config.housekeeper
        self.topic_configs = TopicConfigs(
            log_store,
            BrokerConfigs(
                broker_id=0,
                retention_ms=-1 if keeper.retention_s is None else round(keeper.retention_s * 1000),
                retention_bytes=-1 if keeper.retention_bytes is None else keeper.retention_bytes,
                message_max_bytes=config.batcher.batch_bytes_max,
            ),
            self.topics,
            self._wall,
        )
        self.topic_configs.on_change = self._configs_changed
        self.housekeeper = Housekeeper(
            config.housekeeper,
            self.epochs,
            self.l1,
            self.partitions,
            log_store,
            wall_clock=self._wall,
            activity=self.activity,
            index=self.partitions_by_name,
            retention=self.topic_configs,
        )
        self.housekeeper.start_moved = self.partition_emptied
        self.compactor = Compactor(
            config.compactor,
            object_store,
            log_store,
            self.l1,
            self.partitions,
            self.topic_configs.policy,
            wall_clock=self._wall,
            rng=rng,
        )
        self.gc = GcActor(
            config.gc,
            object_store,
            log_store,
            cluster_epoch=lambda: self.epochs.current,
            board=self.board,
            views=self.views,
            reconcile_failing=self._reconcile_failing,
            clock=self._wall,
            rng=rng,
            watermarks=cluster.control.watermark_snapshot if cluster is not None else None,
            share=self._gc_share if cluster is not None else None,
            leaders=self.partition_leaders if cluster is not None else None,
            collect_deleted=functools.partial(self.l1.collect_deleted, log_store),
            incarnation=self._first_incarnation if cluster is not None else None,
            released=self.l0_cache.release_through,  # collected objects leave the readers' cache
        )
        # Topics an older levelzero accepted and today's name rule refuses: topic -> the problem.
        # They open read-only (no produce) so the daemon starts and says what to do.
        self.unstorable_topics: dict[str, str] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._create_lock = anyio.Lock()
        self.accepting = False
        self.drain_timeout_s = 30.0
        self.reads_objects_missing = 0  # reads that failed: an object they need is not stored
        # Why writes (produces, topic changes) are refused while the node otherwise serves
        # (the object store claimed by another cluster: `daemon/ownership.py MarkerWatch`)
        self.writes_refused: str | None = None

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        await self.epochs.load()
        async with anyio.create_task_group() as tg:
            self._tg = tg
            await tg.start(self.appender.run)
            await self.topic_configs.load()
            rows = await self.log_store.list_partitions()
            for row in rows:
                self._check_stored_topic_name(row.topic)
            if self.cluster is None:
                await self._start_partitions(rows)
            else:  # known, not led: the leases say which to start
                for row in rows:
                    self._topics[row.topic] = max(self._topics.get(row.topic, 0), row.partition + 1)
            await tg.start(self.batcher.run)
            await tg.start(self.epochs.run)
            if self.config.reconciler.enabled:
                await tg.start(self.reconciler.run)
            if self.config.housekeeper.enabled:
                await tg.start(self.housekeeper.run)
            if self.config.compactor.enabled:
                await tg.start(self.compactor.run)
            await tg.start(self.gc.run)  # GcConfig.enabled=False starts it paused
            if self.cluster is not None:
                c = self.cluster
                self.member = ClusterMember(
                    c.control,
                    c.node_id,
                    c.advertise_url,
                    ttl_s=c.lease_ttl_s,
                    lead=self._lead,
                    resign=self._resign,
                    kafka_url=c.kafka_url,
                    term_of=self._term_of,
                    clock=c.clock or anyio.current_time,
                    forget_expired_after_s=c.forget_expired_after_s,
                )
                member = self.member
                self.topic_configs.follow_views(lambda: member.view)
                await tg.start(self.member.run)
                tg.start_soon(self._publish_watermarks, c)
            self.accepting = True
            log.info("node ready: %d partitions, cluster epoch %d", len(rows), self.epochs.current)
            task_status.started()

    async def shutdown(self) -> None:
        """Stop accepting, drain in-flight produces, stop partitions, end `run`. In a cluster,
        the partitions are handed over first (leases released at once: no TTL to wait)."""
        if self.member is not None:
            with anyio.move_on_after(self.drain_timeout_s):
                try:
                    await self.member.leave()
                except LevelZeroError as exc:
                    log.warning("leaving the cluster failed (leases will expire): %s", exc)
        self.accepting = False
        await self.batcher.close()
        # The batcher's run ends once its uploads (and their fences) are done.
        with anyio.move_on_after(self.drain_timeout_s):
            await self.batcher.finished.wait()
        for actor in list(self._partitions.values()):
            with anyio.move_on_after(PARTITION_STOP_TIMEOUT_S):
                await actor.stop()
        assert self._tg is not None
        self._tg.cancel_scope.cancel()

    # ------------------------------------------------------------------ topics

    def _check_stored_topic_name(self, topic: str) -> None:
        problem = topic_name_problem(topic)
        if problem is None or topic in self.unstorable_topics:
            return
        self.unstorable_topics[topic] = problem
        log.error("%s", unstorable_topic_advice(topic, problem), extra={"topic": topic})

    async def _start_partitions(self, rows: Sequence[PartitionRow]) -> None:
        """Replay and start `rows`' partitions, up to STARTUP_PARTITIONS_IN_FLIGHT_MAX at once
        (one after another, 10,000 partitions paid 10,000 commits of their `TermStart`s).
        Registered in `rows`' order, whichever finishes first."""
        assert self._tg is not None
        actors = [self._new_partition(row) for row in rows]
        limiter = anyio.CapacityLimiter(STARTUP_PARTITIONS_IN_FLIGHT_MAX)
        tg = self._tg

        started: list[PartitionActor] = []

        async def start(actor: PartitionActor) -> None:
            async with limiter:
                await tg.start(actor.run)
                started.append(actor)

        try:
            async with anyio.create_task_group() as starting:
                for actor in actors:
                    starting.start_soon(start, actor)
        except BaseException:
            # A partition that could not start (its log store failing as it began its term), or
            # the caller cancelled: none is served, and those that started stop. Left running
            # unregistered, nothing reached them, and the partition's next start ran a second
            # actor beside them.
            with anyio.CancelScope(shield=True):
                for actor in started:
                    with anyio.move_on_after(PARTITION_STOP_TIMEOUT_S):
                        await actor.stop()
            raise
        for actor in actors:
            self._register(actor)

    async def _start_created(self, rows: Sequence[PartitionRow]) -> None:
        """`_start_partitions` for partitions a request just created, or must serve again (a
        single node). One that cannot start (the log store failing as it begins its term) raises
        the store's error,
        as every other call does: a task group's was an HTTP 500 and a traceback, where a
        failing store is a 503 (a bug stays a group). The partitions are in the store but not
        served until the daemon restarts, as after any failed log-store write: a SQLite store
        that failed a write stops the daemon (`StoreNeedsRestart`). (Partitions a lease brings
        are started by `_lead`, whose group still ends the node: a restart takes the leases
        again, where a round that failed would keep leases it serves no partition of.)"""
        try:
            await self._start_partitions(rows)
        except BaseExceptionGroup as group:
            raise _one_error(group) from None

    # ------------------------------------------------------------------ the cluster

    def _first_incarnation(self) -> int | None:
        """The incarnation of this node's registration (None before the first): the GC's round
        ids count in its range (`actors/gc.py cluster_round_id`)."""
        return self.member.incarnation if self.member is not None else None

    async def _lead(self, pids: list[int]) -> None:
        """Leases were taken: replay these partitions and begin a term in each (the term start
        fences a previous leader's appends in the store)."""
        wanted = set(pids)
        rows = [row for row in await self.log_store.list_partitions() if row.pid in wanted]
        for row in rows:
            self._check_stored_topic_name(row.topic)
            self.board.register(f"{row.topic}/{row.partition}")
        await self._start_partitions(rows)
        log.info("leading %d more partitions", len(rows), extra={"partitions": len(self._partitions)})

    async def _resign(self, pids: list[int]) -> None:
        """Hand these partitions over: new requests are told the leader, appends in flight
        finish (or are refused by the store once a successor's term starts), actors stop."""
        gone = set(pids)
        actors = [a for a in self._partitions.values() if a.row.pid in gone]
        for actor in actors:
            del self._partitions[(actor.row.topic, actor.row.partition)]
            del self._by_name[actor.name]
            del self._by_pid[actor.row.pid]
        for actor in actors:
            with anyio.move_on_after(PARTITION_STOP_TIMEOUT_S):
                await actor.stop()
            self.board.forget(actor.name)  # its successor publishes its M(p)
            for forget in self.partition_left:
                forget(actor.row.topic, actor.row.partition)
        if actors:
            log.info("handed over %d partitions", len(actors), extra={"partitions": len(self._partitions)})

    def _term_of(self, pid: int) -> int | None:
        """The term of the partition's actor here, once it has started one."""
        actor = self._by_pid.get(pid)
        return actor.term if actor is not None and actor.ready.is_set() else None

    def _bumps_epochs(self) -> bool:
        """In a cluster, the epoch timer of one node bumps: the first live node by id."""
        member = self.member
        live = member.live_nodes() if member is not None else None
        if member is None or not live:
            return False
        return live[0] == member.node_id

    def _gc_share(self) -> range:
        """The key prefixes this node's GC lists and deletes in: its share among the live
        nodes of the last cluster view (every prefix until there is one)."""
        member = self.member
        live = member.live_nodes() if member is not None else None
        if member is None or live is None:
            return range(PREFIX_COUNT)
        return prefix_share(member.node_id, live, PREFIX_COUNT)

    def partition_leaders(self) -> dict[str, str]:
        """In a cluster, every partition -> the node leading it by the last cluster view, or
        NO_LIVE_LEADER; alone, empty (status and explain say where a holder of M is led)."""
        holders = self.member.lease_holders() if self.member is not None else {}
        return {name: node or NO_LIVE_LEADER for name, node in holders.items()}

    async def _publish_watermarks(self, cluster: ClusterSettings) -> None:
        """The M(p) of the partitions led here, to the control plane (only rising there), then
        `M` read back as the GC computes it (what status and metrics show), every third of the
        lease TTL: other nodes' GC rounds read them. Each call gives up after that long."""
        interval_s = cluster.lease_ttl_s / 3
        while True:
            values = {}
            for actor in list(self._partitions.values()):
                value = self.board.get(actor.name)
                if value is not None:
                    values[actor.row.pid] = value
            for what, call in (
                ("publishing watermarks", functools.partial(cluster.control.publish_watermarks, values)),
                ("reading the cluster watermark", self.gc.read_watermark),
            ):
                with anyio.move_on_after(interval_s) as scope:
                    try:
                        await call()
                    except LevelZeroError as exc:
                        log.warning("%s failed: %s", what, exc)
                if scope.cancelled_caught:
                    log.warning("%s got no answer within %.1f s", what, interval_s)
            await anyio.sleep(interval_s)

    def _new_partition(self, row: PartitionRow) -> PartitionActor:
        return PartitionActor(
            row,
            self.log_store,
            self.board,
            fencing_mode=self.config.fencing_mode,
            snapshot_every_records=self.config.snapshot_every_records,
            log_keep_records=self.config.log_keep_records,
            activity=self.activity,
            wall_clock=self._wall,
            appender=self.appender,
        )

    def _register(self, actor: PartitionActor) -> None:
        row = actor.row
        self._partitions[(row.topic, row.partition)] = actor
        self._by_name[actor.name] = actor
        self._by_pid[row.pid] = actor
        self._topics[row.topic] = max(self._topics.get(row.topic, 0), row.partition + 1)

    def check_new_topic(
        self, name: str, partitions: int, configs: TopicConfigsGiven = None
    ) -> dict[str, str]:
        """Whether `create_topic` would take these (raises as it would, but for a topic that
        exists); the configs as they would be stored."""
        problem = topic_name_problem(name)
        if problem is not None:
            shown = repr(name[:64]) + ("..." if len(name) > 64 else "") if isinstance(name, str) else "given"
            raise InvalidInput(f"topic name {shown} {problem}")
        if name in INTERNAL_TOPICS:
            raise InternalTopicName(name)
        self._check_no_collision(name)
        if not isinstance(partitions, int) or not 1 <= partitions <= PARTITIONS_PER_TOPIC_MAX:
            raise InvalidInput(f"partitions must be an integer in 1..{PARTITIONS_PER_TOPIC_MAX}")
        if len(self._partitions) + partitions > PARTITIONS_MAX:
            raise InvalidInput(f"a node holds at most {PARTITIONS_MAX} partitions")
        if configs is None:
            configs = ()
        return self.topic_configs.check_new(configs.items() if isinstance(configs, Mapping) else configs)

    def _check_no_collision(self, name: str) -> None:
        existing = colliding_topic(name, self.topics())
        if existing is not None:
            raise TopicNameCollides(name, existing)

    async def create_topic(
        self, name: str, partitions: int, configs: TopicConfigsGiven = None
    ) -> list[PartitionRow]:
        """A new topic of `partitions` partitions with its topic configs (InvalidConfig for one
        that is unknown, malformed or not enforced: nothing is created)."""
        checked = self.check_new_topic(name, partitions, configs)
        self._check_accepting()
        async with self._create_lock:
            if self.member is not None:
                await self.member.refresh()  # a topic of this name deleted elsewhere is gone
            if name in self.topics():  # (the store refuses one another node made meanwhile)
                raise TopicExists(f"topic {name!r} exists")
            self._check_no_collision(name)  # again: one may have been made meanwhile
            # Register on the watermark board *before* choosing the creation epoch: a GC round
            # that snapshots the partition set from now on sees the new partitions (without an
            # M(p) they block it), and one that snapshotted earlier has E <= creation epoch, so
            # its cap E - 1 keeps every object of the new partitions. In a cluster the GC reads
            # the control plane's partition set, and the board holds what this node leads.
            with self._on_board(name, range(partitions)):
                rows = await self.log_store.create_topic(
                    name, partitions, self.epochs.current, self._wall(), checked
                )
                self.topic_configs.created(name, checked)
                if self.member is not None:  # the leases decide who leads them
                    self._topics[name] = partitions
                else:
                    # As start-up does, many at once: their `TermStart`s share group commits (one
                    # after another, 4,096 partitions took 4,096 commits).
                    await self._start_created(rows)
        if self.member is not None:
            await self.member.round()  # take the new partitions this node is preferred for
        await self._record_topic(name, partitions, fresh=True)
        log.info("created topic", extra={"topic": name, "partitions": partitions})
        return rows

    @contextlib.contextmanager
    def _on_board(self, topic: str, partitions: range) -> Iterator[None]:
        """New partitions of `topic` on the watermark board while they are created (a single
        node; in a cluster the GC reads the control plane's partition set). A creation that
        fails takes them off again: the store made none of them, or they did not start (not
        served until a restart, they hold no object); with no M(p) they blocked every GC round
        until a restart."""
        names = [f"{topic}/{p}" for p in partitions] if self.member is None else []
        for registered in names:
            self.board.register(registered)
        try:
            yield
        except BaseException:
            for registered in names:
                if registered not in self._by_name:  # (never one served: its M(p) holds M)
                    self.board.forget(registered)
            raise

    async def delete_topic(self, name: str) -> list[PartitionRow]:
        """Delete a topic: it leaves the partition set at once (reads and writes get
        unknown_topic; in a cluster, its leaders resign at their next round and are refused by
        the store until then), and a topic of the same name made later starts empty. Its L0
        data needs nothing more: the partitions no longer hold `M` back, so the GC collects
        every object by epoch as `M` rises. Its L1 objects are collected by the GC's rounds
        (`L1Catalog.collect_deleted`), crash-safe. Returns the deleted partitions."""
        self._check_accepting()
        async with self._create_lock:
            if self.member is not None:
                await self.member.refresh()
            if name not in self.topics():
                raise UnknownTopic(name)
            await self._forget_topic_record(name)
            actors = [a for a in self._partitions.values() if a.row.topic == name]
            for actor in actors:  # no new requests; appends in flight finish first
                del self._partitions[(actor.row.topic, actor.row.partition)]
                del self._by_name[actor.name]
                del self._by_pid[actor.row.pid]
            for actor in actors:
                with anyio.move_on_after(PARTITION_STOP_TIMEOUT_S):
                    await actor.stop()
            try:
                rows = await self.log_store.delete_topic(name, self._wall())
            except LevelZeroError:
                if self.member is None:  # still there: serve it again
                    await self._start_created([a.row for a in actors])
                raise
            # Off the board only now: until the store forgot them, their last M(p) held M.
            for actor in actors:
                self.board.forget(actor.name)
                self.reconciler.health.forget(actor.name)
            self._topics.pop(name, None)
            self.topic_configs.deleted(name)
            for forget in self.topic_deleted:
                forget(name)
        if self.member is not None:
            await self.member.round()  # resign the leases gone with the topic, if any were ours
        log.info("deleted topic", extra={"topic": name, "partitions": len(rows)})
        return rows

    async def create_partitions(self, name: str, count: int, *, validate_only: bool = False) -> int:
        """Grow a topic to `count` partitions (never fewer: invalid_input); the count before.
        The new partitions are made as a new topic's are (on the board before their creation
        epoch is chosen, so the GC's cap protects them)."""
        self._check_accepting()
        if not isinstance(count, int) or not 1 <= count <= PARTITIONS_PER_TOPIC_MAX:
            raise InvalidInput(f"partitions must be an integer in 1..{PARTITIONS_PER_TOPIC_MAX}")
        async with self._create_lock:
            if self.member is not None:
                await self.member.refresh()
            current = self.topics().get(name)
            if current is None:
                raise UnknownTopic(name)
            if count <= current:
                raise InvalidInput(
                    f"topic {name!r} has {current} partitions; partitions can only be added "
                    f"({count} <= {current})"
                )
            if len(self._partitions) + count - current > PARTITIONS_MAX:
                raise InvalidInput(f"a node holds at most {PARTITIONS_MAX} partitions")
            if validate_only:
                return current
            with self._on_board(name, range(current, count)):
                rows = await self.log_store.add_partitions(name, count, self.epochs.current, self._wall())
                if self.member is not None:
                    self._topics[name] = count
                else:
                    await self._start_created(rows)
        if self.member is not None:
            await self.member.round()
        await self._record_topic(name, count)
        log.info("added partitions", extra={"topic": name, "partitions": count, "before": current})
        return current

    async def delete_records(self, topic: str, partition: int, offset: int) -> int:
        """Kafka's DeleteRecords: move the partition's start offset up to `offset` (-1: the
        high watermark), as retention does (`SetStartOffset`), then collect the L1 objects
        wholly below it. Returns the start offset (Kafka's low watermark). An offset above
        the high watermark is offset_out_of_range; one at or below the start changes nothing.

        Held, as retention is, at the first offset of a Kafka transaction still open in the
        partition (`Housekeeper.start_offset_held`): a restart completing a prepared
        transaction looks for its marker from there, and with the marker removed it could
        not tell the next transaction's records from its own. Kafka's broker moves its log
        start offset past an open transaction (its producer state, not the log, says where
        the transaction is); the low watermark answered says where the log starts."""
        self._check_accepting()
        actor = await self.led_partition(topic, partition)
        if not self.topic_configs.policy(topic).deletes:
            raise PolicyViolation(
                f"records of partition {topic}/{partition} can not be deleted: its cleanup.policy "
                "has no 'delete'"
            )
        high_watermark = actor.state.high_watermark
        if offset == -1:
            offset = high_watermark
        if not 0 <= offset <= high_watermark:  # (the high watermark itself is allowed)
            raise OffsetOutOfRange(offset, actor.state.start_offset, high_watermark + 1)
        requested, offset = offset, await self.housekeeper.start_offset_held(actor, offset)
        if offset < requested:
            log.info(
                "records deleted up to an open transaction's first offset",
                extra={"partition": actor.name, "start_offset": offset, "requested": requested},
            )
        before = actor.state.start_offset
        if offset > before:
            await actor.set_start_offset(offset, actor.term)
            self.l1.note_start_moved(actor, before, offset, START_MOVED_BY_DELETE_RECORDS)
            log.info("records deleted", extra={"partition": actor.name, "start_offset": offset})
            await self.partition_emptied(actor)
            try:
                await self.l1.collect(actor, self.config.reconciler.copy_deadline_s)
            except LevelZeroError as exc:  # the housekeeper's and the reconciler's rounds retry
                log.warning("collecting L1 objects below %s's new start offset failed: %s", actor.name, exc)
        return actor.state.start_offset

    async def _configs_changed(self, name: str) -> None:
        """The topic's configs changed through this node: its bucket record says so too."""
        partitions = self.topics().get(name)
        if partitions is not None:
            await self._record_topic(name, partitions)

    async def _forget_topic_record(self, name: str) -> None:
        """Remove the topic's record from the bucket before the topic goes (a topic of the same
        name made after the deletion writes its own). Best effort, as `_record_topic`."""
        try:
            await self.object_store.delete_many([topic_record_key(name)])
        except LevelZeroError as exc:
            log.warning("could not remove topic %s's record from the object store: %s", name, exc)
        await self._forget_ends(name)

    async def partition_emptied(self, actor: PartitionActor) -> None:
        """Retention or DeleteRecords moved the partition's start offset to its high watermark:
        no record is left, and its L1 objects, which say where its log ended, go. A key in the
        bucket keeps the end (`format_end_key`; the lower ones it replaces are deleted after),
        so a recovery from the bucket goes on from there rather than hand out its offsets
        again. Best effort, as `_record_topic`."""
        state = actor.state
        if not state.start_offset >= state.high_watermark > 0:
            return
        topic, partition = actor.row.topic, actor.row.partition
        key = format_end_key(topic, partition, state.high_watermark)
        try:
            await self.object_store.put(key, b"")
            lower = [
                info.key
                async for info in iter_objects(self.object_store, partition_ends_prefix(topic, partition))
                if info.key < key
            ]
            if lower:
                await self.object_store.delete_many(lower)
        except LevelZeroError as exc:
            log.warning(
                "could not record where partition %s ended in the object store (a recovery from "
                "the bucket would start it at offset 0): %s",
                actor.name,
                exc,
            )

    async def _forget_ends(self, topic: str) -> None:
        """Delete the partition ends and the restore marks kept for `topic`, which is being
        deleted (a topic made again with its name starts from nothing). Best effort, as the
        record's removal: an end left by a failed delete could only start a partition of the new
        topic that has no L1 object further on in a recovery, never at an offset handed out
        before; a restore mark left names the deleted topic's record (`keys.RestoreMark`), and a
        recovery from the bucket alone ignores it for a topic made again (one of an earlier
        release, or of a topic that had no record, could make it drop the new topic's L1
        objects of low terms at its offsets: lose them, never serve others)."""
        for what, prefix in (
            ("partition ends", topic_ends_prefix(topic)),
            ("restore marks", topic_restores_prefix(topic)),
        ):
            try:
                keys = [info.key async for info in iter_objects(self.object_store, prefix)]
                for start in range(0, len(keys), DELETE_BATCH_KEYS_MAX):
                    await self.object_store.delete_many(keys[start : start + DELETE_BATCH_KEYS_MAX])
            except LevelZeroError as exc:
                log.warning("could not remove topic %s's %s from the object store: %s", topic, what, exc)

    async def _record_topic(self, name: str, partitions: int, *, fresh: bool = False) -> None:
        """Keep the topic's partition count and configs in the bucket too: `levelzero recover
        --from-bucket` rebuilds a lost control plane from it (a topic without a record is
        derived from its L1 keys, without configs). The partitions' ends kept in the record
        (one release wrote them there) stay; `fresh`: a new topic's record.
        Best effort: the control plane, which has the topic, is the truth."""
        key = topic_record_key(name)
        created_at, kept = self._wall(), {}
        try:
            if not fresh:
                with contextlib.suppress(ObjectNotFound, MalformedKey):  # none, or not ours: rewritten
                    old = decode_topic_record(key, await self.object_store.get(key))
                    created_at, kept = old.created_at, dict(old.ends)
            configs = self.topic_configs.configs_of(name)
            record = TopicRecord(
                name, partitions, created_at, configs, {p: e for p, e in kept.items() if p < partitions}
            )
            await self.object_store.put(key, encode_topic_record(record))
        except LevelZeroError as exc:
            log.warning(
                "could not record topic %s in the object store (recovery from the bucket "
                "derives it from its L1 objects): %s",
                name,
                exc,
            )

    def topics(self) -> dict[str, int]:
        """Topic -> partition count. In a cluster, the last cluster view's (a topic another
        node deleted is gone once the view is read again); before the first view, the store's
        at start-up and those made here."""
        if self.member is None:
            return dict(self._topics)
        if self.member.view is not None:
            return self.member.partitions_known()
        return dict(self._topics)

    def partition(self, topic: str, partition: int) -> PartitionActor:
        """The partition's actor, if this node serves it now. In a cluster, only while the
        local deadline of its lease holds (`ClusterMember.leads`): a node cut off from the
        control plane stops serving reads and writes by then, whatever its rounds are doing
        (the successor may be serving newer records already)."""
        actor = self._partitions.get((topic, partition))
        if actor is not None and self.member is not None and not self.member.leads(actor.row.pid):
            actor = None
        if actor is None:
            topics = self.topics()
            if topic not in topics:
                raise UnknownTopic(topic)
            if self.member is not None and 0 <= partition < topics[topic]:
                url = self.member.leader_url(topic, partition)
                if url == self.member.advertise_url:
                    url = None  # its lease is ours and its actor is starting: retry shortly
                raise LedElsewhere(topic, partition, url)
            raise UnknownPartition(topic, partition)
        return actor

    def partitions(self) -> list[PartitionActor]:
        return list(self._partitions.values())

    def partitions_by_name(self) -> Mapping[str, PartitionActor]:
        """The partitions led here by name (a live read-only view, not a copy)."""
        return MappingProxyType(self._by_name)

    # ------------------------------------------------------------------ data

    def _check_accepting(self) -> None:
        if not self.accepting:
            raise ShuttingDown("the node is not accepting requests")
        if self.writes_refused is not None:
            raise StorageError(self.writes_refused)

    async def produce(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        producers: Sequence[ProducerSpan] = (),
        term: int | None = None,
        linger_s: float | None = None,
    ) -> ProduceResult:
        """`term`: the partition's term here the caller checked the records against (the
        intake's idempotent batches): under another term they are refused (NotLeader).
        `linger_s`: the batch window cut this long after the records arrive, if sooner."""
        self._check_accepting()
        actor = self._partitions.get((topic, partition))  # led here: no coroutine to look it up
        if actor is None or (self.member is not None and not self.member.leads(actor.row.pid)):
            actor = await self.led_partition(topic, partition)
        if term is not None and actor.term != term:
            raise NotLeader(actor.name, term, actor.term)
        problem = self.unstorable_topics.get(topic)
        if problem is not None:
            raise InvalidInput(
                f"topic {topic!r} takes no new records: its name {problem} (levelzero status says what to do)"
            )
        try:
            return await self.batcher.produce(actor, records, producers, linger_s)
        except ShuttingDown:
            if self.accepting and self._partitions.get((topic, partition)) is not actor:
                # The partition stopped under the request while this node goes on: its topic
                # was deleted (or its leadership moved). Said as such (unknown topic, led
                # elsewhere), not as a node shutting down, which clients retry here.
                self.partition(topic, partition)
            raise

    async def fetch(
        self, topic: str, partition: int, offset: int, max_bytes: int, framing: Framing = UNFRAMED
    ) -> FetchResult:
        read = functools.partial(self.reader.fetch, offset=offset, max_bytes=max_bytes, framing=framing)
        return await self._led_read(topic, partition, read)

    async def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> tuple[int, int]:
        """Kafka's ListOffsets by time (`Reader.offset_for_time`), served by the leader as a
        fetch is: (offset, timestamp) of the first record at or after `timestamp_ms`, or
        (-1, -1)."""
        read = functools.partial(self.reader.offset_for_time, timestamp_ms=timestamp_ms)
        return await self._led_read(topic, partition, read)

    async def retained_bytes(self, topic: str, partition: int) -> int:
        """The partition's size in the object store (`Reader.retained_bytes`: Kafka's log size,
        DescribeLogDirs), served by the leader."""
        return await self._led_read(topic, partition, self.reader.retained_bytes)

    async def max_timestamp(self, topic: str, partition: int) -> tuple[int, int]:
        """Kafka's ListOffsets for the largest timestamp (`Reader.max_timestamp`), served by
        the leader as a fetch is: (offset, timestamp), or (-1, -1)."""
        return await self._led_read(topic, partition, self.reader.max_timestamp)

    async def _led_read(
        self, topic: str, partition: int, read: Callable[[PartitionActor], Awaitable[_T]]
    ) -> _T:
        """`read` of the partition's actor, served only while this node leads it."""
        actor = await self.led_partition(topic, partition)
        try:
            if self.member is None:
                return await read(actor)
            with self.member.serving():
                result = await read(actor)
                if self.member.leads(actor.row.pid):
                    return result
        except ObjectNotFound:
            # Not a race the reader rides out (it reads the lineage again): records it must
            # serve are gone from the store (`levelzero_reads_objects_missing_total`).
            self.reads_objects_missing += 1
            raise
        # The lease's deadline passed while reading (the read may be waiting on a dead
        # connection to the control plane): a successor may have newer records.
        self.partition(topic, partition)  # raises LedElsewhere, naming the leader if known
        raise LedElsewhere(topic, partition, None)  # renewed just now: the client asks again

    async def led_partition(self, topic: str, partition: int) -> PartitionActor:
        """The partition's actor here; in a cluster, a miss reads the cluster view again first
        (a topic another node just created, a leader that just moved) before it is answered."""
        try:
            return self.partition(topic, partition)
        except (UnknownTopic, UnknownPartition, LedElsewhere):
            if self.member is None:
                raise
        if self.member.lease_valid():
            await self.member.refresh()
        # else: this node's own lease ran out without a renewal, so the control plane is out of
        # reach (or was, a moment ago): the last view answers, at once, rather than a request
        # that waits for a dead connection.
        return self.partition(topic, partition)

    # ------------------------------------------------------------------ operator escape hatch

    async def abandon_unreconciled(
        self, topic: str, partition: int, *, operator: str, reason: str
    ) -> Abandoned:
        """Give up a failing partition's unreconciled data offsets for good, so its `M(p)` (and
        the cluster's `M`) can rise again. Refused unless its reconciliation is failing (a
        named condition): a healthy partition's unreconciled data is on its way to L1."""
        self._check_accepting()
        actor = self.partition(topic, partition)
        limits = (("operator", operator, OPERATOR_CHARS_MAX), ("reason", reason, REASON_CHARS_MAX))
        for name, text, limit in limits:
            if not isinstance(text, str) or not text.strip() or len(text) > limit:
                raise InvalidInput(f"{name} must be 1-{limit} characters naming who and why")
        failing = self.reconciler.health.get(actor.name)
        if failing is None:
            raise InvalidInput(
                f"{actor.name}: its reconciliation is not failing, so its unreconciled data is "
                "on its way to L1; nothing is abandoned (status shows failing partitions)"
            )
        state = actor.state
        if not state.has_unreconciled_data:
            raise InvalidInput(f"{actor.name}: nothing is unreconciled; nothing is abandoned")
        entry = AbandonUnreconciled(
            upto=state.high_watermark - 1,
            lrlo=state.last_applied_log_offset,
            operator=operator,
            reason=reason,
            at=self._wall(),
        )
        lro_before, mp_before, ranges_before = state.lro, state.mp, len(state.abandoned)
        record = await actor.abandon_unreconciled(entry, actor.term)
        if len(actor.state.abandoned) > ranges_before:
            first, last = actor.state.abandoned[-1]
        else:  # a catch-up landed between the ask and the append: nothing was given up
            first, last = lro_before + 1, lro_before
        self.reconciler.health.forget(actor.name)
        abandoned = Abandoned(
            partition=actor.name,
            first_offset=first,
            last_offset=last,
            log_offset=record.log_offset,
            term=record.term,
            operator=operator,
            reason=reason,
            at=entry.at,
            failing_since=failing.since,
            last_error=failing.last_error,
            mp_before=mp_before,
            mp_after=actor.state.mp,
        )
        # The audit event: one line, every field, at WARNING so it is never filtered away.
        log.warning(
            "AUDIT abandon-unreconciled %s: data offsets %d..%d given up by %r (reason: %r) at "
            "log offset %d, term %d; they are no longer readable; M(p) %s -> %s",
            actor.name,
            first,
            last,
            operator,
            reason,
            record.log_offset,
            record.term,
            mp_before,
            actor.state.mp,
            extra={
                "audit": "abandon_unreconciled",
                "partition": actor.name,
                "first_offset": first,
                "last_offset": last,
                "operator": operator,
                "reason": reason,
                "log_offset": record.log_offset,
            },
        )
        return abandoned

    def _reconcile_failing(self, partition: str) -> ReconcileFailing | None:
        return self.reconciler.health.get(partition)

    def views(self) -> list[PartitionView]:
        return [actor.view() for actor in self._partitions.values()]


def _one_error(group: BaseExceptionGroup) -> BaseException:
    """A task group's failure as one error when every error in it is levelzero's (the first),
    else the group itself."""
    levelzero, others = group.split(LevelZeroError)
    if levelzero is None or others is not None:
        return group
    first: BaseException = levelzero
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    return first
