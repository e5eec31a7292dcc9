"""Two real Nodes in cluster mode over one control plane (memory log store, memory object store,
memory ClusterControl), in virtual time (the simulation's loop) with a short lease TTL: the
leases split the partitions, each produce goes to its partition's leader (another node answers
LedElsewhere with the leader's URL), a graceful shutdown hands its partitions over without
waiting for the TTL and the successor begins a new term and serves every acknowledged record; a
crashed node's partitions move once its leases expire; the GC's `M` is taken over every
partition's published M(p) in the control plane, not over the partitions one node leads."""

from __future__ import annotations

import random

from collections.abc import Callable

import anyio
import pytest

from levelzero.actors.batcher import BatcherConfig
from levelzero.actors.gc import GcConfig
from levelzero.actors.housekeeper import HousekeeperConfig
from levelzero.actors.intake import ProduceIntake
from levelzero.actors.node import ClusterSettings, Node, NodeConfig
from levelzero.actors.reconciler import ReconcilerConfig
from levelzero.core.cluster import LeaseClock
from levelzero.core.errors import LedElsewhere, TooLarge
from levelzero.core.gc import compute_cluster_watermark
from levelzero.core.l0format import Record
from levelzero.core.topic_configs import AlterOp
from levelzero.storage.memory_cluster import MemoryClusterControl
from levelzero.actors.gc import cluster_round_id
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.protocols import L1Row, L1State
from levelzero.testing.virtual_time import in_virtual_time

TTL_S = 0.6
TOPIC = "t"
PARTITIONS = 6
WAIT_S = 20.0


def config() -> NodeConfig:
    return NodeConfig(
        epoch_bump_interval_s=None,
        batcher=BatcherConfig(linger_ms=2.0),
        reconciler=ReconcilerConfig(enabled=False),
        housekeeper=HousekeeperConfig(enabled=False),
        gc=GcConfig(enabled=False),
    )


class Cluster:
    def __init__(self) -> None:
        self.log = MemoryLogStore()
        self.objects = MemoryObjectStore()
        self.control = MemoryClusterControl(self.log, anyio.current_time)
        self.nodes: dict[str, Node] = {}
        self.scopes: dict[str, anyio.CancelScope] = {}

    def node(self, name: str) -> Node:
        return Node(
            config(),
            self.log,
            self.objects,
            rng=random.Random(name),
            cluster=ClusterSettings(self.control, name, f"http://{name}", lease_ttl_s=TTL_S),
        )

    async def start(self, tg: anyio.abc.TaskGroup, name: str) -> Node:
        node = self.nodes[name] = self.node(name)
        scope = self.scopes[name] = anyio.CancelScope()

        async def run(*, task_status: anyio.abc.TaskStatus) -> None:
            with scope:
                await node.run(task_status=task_status)

        await tg.start(run)
        return node

    def by_url(self, url: str | None) -> Node | None:
        return None if url is None else self.nodes.get(url.removeprefix("http://"))

    async def produce(self, partition: int, values: list[bytes]) -> int:
        """Through any node, following LedElsewhere to the leader (as clients follow 307)."""
        with anyio.fail_after(WAIT_S):
            while True:
                for node in list(self.nodes.values()):
                    if not node.accepting:
                        continue
                    try:
                        result = await node.produce(TOPIC, partition, [Record(None, v) for v in values])
                        return result.base_offset
                    except LedElsewhere as exc:
                        leader = self.by_url(exc.leader_url)
                        if leader is not None and leader.accepting:
                            try:
                                result = await leader.produce(
                                    TOPIC, partition, [Record(None, v) for v in values]
                                )
                                return result.base_offset
                            except LedElsewhere:
                                pass
                await anyio.sleep(0.05)

    def leaders(self) -> dict[int, list[str]]:
        led: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
        for name, node in self.nodes.items():
            if node.accepting:
                for actor in node.partitions():
                    led[actor.row.partition].append(name)
        return led


async def wait_for(condition: Callable[[], bool], what: str) -> None:
    with anyio.fail_after(WAIT_S, shield=False):
        while not condition():
            await anyio.sleep(0.02)
    assert condition(), what


async def read_all(node: Node, partition: int) -> list[bytes]:
    out, offset = [], 0
    while True:
        fetched = await node.fetch(TOPIC, partition, offset, 1 << 20)
        out.extend(r.value for r in fetched.records)
        if fetched.next_offset >= fetched.high_watermark:
            return out
        offset = fetched.next_offset


@in_virtual_time
async def test_two_nodes_split_hand_over_and_serve_every_acknowledged_record() -> None:
    c = Cluster()
    written: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    async with anyio.create_task_group() as tg:
        a = await c.start(tg, "a")
        b = await c.start(tg, "b")
        await a.create_topic(TOPIC, PARTITIONS)
        await wait_for(lambda: all(len(v) == 1 for v in c.leaders().values()), "one leader each")
        assert {name for names in c.leaders().values() for name in names} == {"a", "b"}
        for round_ in range(3):
            for p in range(PARTITIONS):
                values = [f"{round_}-{p}-{i}".encode() for i in range(3)]
                assert await c.produce(p, values) == len(written[p])
                written[p].extend(values)
        # A request to the node that does not lead a partition names the leader (once its
        # view, read every third of the TTL, shows the lease).
        b_led = next(p for p, names in c.leaders().items() if names == ["b"])
        await wait_for(lambda: a.member.leader_url(TOPIC, b_led) is not None, "a's view names b")
        with pytest.raises(LedElsewhere) as elsewhere:
            await a.produce(TOPIC, b_led, [Record(None, b"x")])
        assert elsewhere.value.leader_url == "http://b"

        # a's GC takes M over every partition's published M(p), b's included.
        async def all_published() -> dict[str, int | None]:
            with anyio.fail_after(WAIT_S):
                while True:
                    _, mps = await c.control.watermark_snapshot()
                    if all(value is not None for value in mps.values()):
                        return mps
                    await anyio.sleep(0.05)

        mps = await all_published()
        assert set(mps) == {f"{TOPIC}/{p}" for p in range(PARTITIONS)}
        assert {actor.name for actor in a.partitions()} < set(mps)
        report = await a.gc.run_round(dry_run=True)
        epoch, mps = await c.control.watermark_snapshot()
        assert report.m == compute_cluster_watermark(epoch, mps).m

        # b leaves gracefully: a leads everything at once (no TTL to wait), in a new term.
        terms_before = {row.pid: row.term for row in await c.log.list_partitions()}
        started = anyio.current_time()
        await b.shutdown()
        await wait_for(lambda: all(v == ["a"] for v in c.leaders().values()), "a leads all")
        assert anyio.current_time() - started < TTL_S * 3
        rows = await c.log.list_partitions()
        assert all(row.term > terms_before[row.pid] for row in rows if row.partition == b_led)
        for p in range(PARTITIONS):
            assert await c.produce(p, [b"after"]) == len(written[p])
            written[p].append(b"after")
            assert await read_all(a, p) == written[p]

        # A crash (no leave): its partitions move once its leases expire.
        b2 = await c.start(tg, "b2")
        await wait_for(lambda: any("b2" in names for names in c.leaders().values()), "b2 takes some")
        moved = [p for p, names in c.leaders().items() if names == ["b2"]]
        c.scopes["b2"].cancel()  # gone mid-flight: no shutdown, no lease released
        b2.accepting = False
        await wait_for(lambda: all(c.leaders()[p] == ["a"] for p in moved), "a takes b2's back")
        for p in moved:
            assert await c.produce(p, [b"after crash"]) == len(written[p])
            written[p].append(b"after crash")
        for p in range(PARTITIONS):
            assert await read_all(a, p) == written[p]

        tg.cancel_scope.cancel()


@in_virtual_time
async def test_a_fetch_that_outlives_the_lease_deadline_is_refused() -> None:
    """A read admitted before the leader's lease deadline and finished after it is not answered:
    a successor may be serving newer records by then."""
    c = Cluster()
    async with anyio.create_task_group() as tg:
        a = await c.start(tg, "a")
        await a.create_topic(TOPIC, 1)
        await wait_for(lambda: c.leaders()[0] == ["a"], "a leads")
        assert await c.produce(0, [b"x"]) == 0
        assert [r.value for r in (await a.fetch(TOPIC, 0, 0, 1 << 20)).records] == [b"x"]
        assert a.member is not None
        reader_fetch = a.reader.fetch

        async def fetch_while_the_lease_runs_out(*args, **kwargs):
            result = await reader_fetch(*args, **kwargs)
            a.member.lease = NeverRenewed(TTL_S)  # its deadline passes while the read is on
            return result

        a.reader.fetch = fetch_while_the_lease_runs_out
        with pytest.raises(LedElsewhere):
            await a.fetch(TOPIC, 0, 0, 1 << 20)
        with pytest.raises(LedElsewhere):  # and no later request is served either
            await a.produce(TOPIC, 0, [Record(None, b"y")])
        tg.cancel_scope.cancel()


class NeverRenewed(LeaseClock):
    """A lease clock whose renewals never count: past its deadline from the start."""

    def renewed(self, sent_at: float) -> None:
        pass


@in_virtual_time
async def test_a_topic_config_changed_on_one_node_is_enforced_by_the_others() -> None:
    """Topic configs live in the control plane and come with every cluster view a node reads,
    so a partition led elsewhere gets the new limit too."""
    c = Cluster()
    async with anyio.create_task_group() as tg:
        a = await c.start(tg, "a")
        b = await c.start(tg, "b")
        await a.create_topic(TOPIC, PARTITIONS, {"retention.ms": "60000"})
        await wait_for(
            lambda: b.topic_configs.retention(TOPIC) == (60.0, None), "b reads the new topic's configs"
        )
        await a.topic_configs.alter(TOPIC, [(AlterOp.SET, "max.message.bytes", "100")])
        await wait_for(lambda: b.topic_configs.policy(TOPIC).max_message_bytes == 100, "b reads the change")
        with pytest.raises(TooLarge, match="max.message.bytes 100"):
            ProduceIntake(b).check_size(TOPIC, [Record(None, b"x" * 100)])
        assert await b.topic_configs.stored(TOPIC) == {"retention.ms": "60000", "max.message.bytes": "100"}
        tg.cancel_scope.cancel()


@in_virtual_time
async def test_an_idempotent_producer_is_known_again_when_its_partition_comes_back() -> None:
    """Leadership of a partition moves from a to b, b stores a producer's batches, b crashes and
    the partition comes back to a (a new term, the same process and intake). The partition's
    state, rebuilt from the log as the term begins, holds b's batches: a retry of b's last batch
    answers the offset b stored it at (not stored twice, not refused), and the producer's next
    batch follows it (not refused as out of order)."""
    c = Cluster()
    producer = 7

    async def send(intake: ProduceIntake, partition: int, sequence: int) -> tuple[int, bool]:
        """(base offset, answered as a repeat) of the producer's one-record batch."""
        value = f"{partition}-{sequence}".encode()
        await intake.prepare_producer(producer, [(TOPIC, partition)])
        identity = (producer, 0, TOPIC, partition, sequence)
        outcome = intake.submit(TOPIC, partition, [Record(None, value)], identity)
        if isinstance(outcome, int):
            return outcome, True
        await outcome.done.wait()
        assert outcome.error is None, outcome.error
        return outcome.base_offset, outcome.stored is not None

    async with anyio.create_task_group() as tg:
        a = await c.start(tg, "a")
        await a.create_topic(TOPIC, PARTITIONS)
        await wait_for(lambda: all(v == ["a"] for v in c.leaders().values()), "a leads all")
        at_a = ProduceIntake(a)
        await tg.start(at_a.run)
        for p in range(PARTITIONS):
            assert await send(at_a, p, 0) == (0, False)

        b = await c.start(tg, "b")
        await wait_for(lambda: any(v == ["b"] for v in c.leaders().values()), "b takes some")
        p = next(p for p, names in c.leaders().items() if names == ["b"])
        at_b = ProduceIntake(b)
        await tg.start(at_b.run)
        for sequence in range(1, 6):
            assert await send(at_b, p, sequence) == (sequence, False)

        c.scopes["b"].cancel()  # b crashes: the partition comes back to a once its lease expires
        b.accepting = False
        await wait_for(lambda: c.leaders()[p] == ["a"], "a leads the partition again")
        assert await send(at_a, p, 5) == (5, True)  # b's last batch, retried: its offset
        assert await send(at_a, p, 6) == (6, False)  # the next one follows it
        assert await read_all(a, p) == [f"{p}-{s}".encode() for s in range(7)]
        tg.cancel_scope.cancel()


@in_virtual_time
async def test_a_node_leading_a_partition_again_resumes_the_deletes_left_unfinished_meanwhile() -> None:
    """a leads a partition (its reconciler's start-up collection runs), b takes it, starts a
    delete and stops before finishing it (the row DELETE_STARTED, the object stored: the retry
    was in b's memory), and the partition comes back to a under a new term: a's next round
    resumes the delete (three-node seed 8695 kept such an object until a restart)."""
    c = Cluster()
    async with anyio.create_task_group() as tg:
        a = await c.start(tg, "a")
        await a.create_topic(TOPIC, PARTITIONS)
        await wait_for(lambda: all(v == ["a"] for v in c.leaders().values()), "a leads all")
        await a.reconciler.run_round()  # the start-up collection of every partition

        b = await c.start(tg, "b")
        await wait_for(lambda: any(v == ["b"] for v in c.leaders().values()), "b takes some")
        p = next(p for p, names in c.leaders().items() if names == ["b"])
        actor = b.partition(TOPIC, p)
        key = f"level_one/{TOPIC}/{p}/{0:020d}-{1:020d}/{actor.term}-" + "d" * 32
        await c.objects.put(key, b"superseded")
        now = a.l1._wall()
        await c.log.l1_insert(
            L1Row(key, actor.row.pid, 0, 1, 1, actor.term, 10, L1State.DELETE_STARTED, now, now)
        )
        await b.shutdown()
        await wait_for(lambda: c.leaders()[p] == ["a"], "a leads the partition again")
        assert a.partition(TOPIC, p).term > actor.term

        await a.reconciler.run_round()
        (row,) = await c.log.l1_list(actor.row.pid)
        assert row.state == L1State.DELETE_FINISHED
        assert key not in c.objects._objects
        tg.cancel_scope.cancel()


@in_virtual_time
async def test_an_idle_node_tends_its_partitions_at_the_cluster_epoch_another_node_raised() -> None:
    """Node a raises the cluster epoch and creates a topic there; b, idle, leads some of its
    partitions. b's housekeeper advanced them to b's copy of the epoch, refreshed only when b
    writes: below a new partition's window, refused (stale_cluster_epoch) every round, and M
    lagging behind for the others. Each round now reads the epoch first."""
    c = Cluster()
    async with anyio.create_task_group() as tg:
        a = await c.start(tg, "a")
        b = await c.start(tg, "b")
        for _ in range(3):
            await a.epochs.advance()
        epoch = a.epochs.current
        assert b.epochs.current < epoch  # b's copy, as b last read it
        await a.create_topic(TOPIC, PARTITIONS)
        await wait_for(
            lambda: len(b.partitions()) > 0 and all(p.ready.is_set() for p in b.partitions()), "b leads"
        )
        errors = b.housekeeper.stats.errors
        await b.housekeeper.run_round(force=True)
        assert b.housekeeper.stats.errors == errors
        assert b.epochs.current == epoch
        assert {p.state.max_applied_epoch for p in b.partitions()} == {epoch}
        tg.cancel_scope.cancel()


@in_virtual_time
async def test_the_gc_round_ids_of_every_node_are_unique() -> None:
    # Every node's rounds go to one gc_rounds table, keyed by round id. Counting from each
    # node's start in milliseconds, two nodes started together made the same ids (a row of one
    # overwrote the other's); from its registration a node counts in its incarnation's range.
    c = Cluster()
    async with anyio.create_task_group() as tg:
        a = await c.start(tg, "a")
        b = await c.start(tg, "b")
        await a.create_topic(TOPIC, PARTITIONS)
        await wait_for(lambda: all(len(v) == 1 for v in c.leaders().values()), "one leader each")
        reports = []
        for _ in range(3):
            for node in (a, b):
                reports.append(await node.gc.run_round(dry_run=True))
        ids = [report.round_id for report in reports]
        assert len(set(ids)) == len(ids), ids
        assert [row.round_id for row in c.log.gc_rounds] == ids
        assert a.member is not None and b.member is not None
        for node, first in ((a, ids[0]), (b, ids[1])):
            assert node.member is not None and node.member.incarnation is not None
            assert first == cluster_round_id(node.member.incarnation, 0)
        assert ids[2] == ids[0] + 1 and ids[3] == ids[1] + 1  # each counts in its own range
        tg.cancel_scope.cancel()
