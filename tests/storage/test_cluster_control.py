"""The cluster control plane's contract, on PostgreSQL and in memory alike: node leases by the
control plane's clock, a live node id refused to another advertise URL, rows expired past a
bound forgotten, partition leases taken only when free, expired or already held and
released at once on a hand-over, published M(p) only rising, and a watermark snapshot of every
partition (never-published ones as None) with the cluster epoch."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from levelzero.core.errors import NodeIdTaken, StoreRefused
from levelzero.storage.memory_cluster import MemoryClusterControl
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.postgres.store import PostgresLogStore
from levelzero.storage.protocols import ClusterControl

SHORT_TTL_S = 0.4  # the PostgreSQL backend waits for real expiry: keep it short


class ManualClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class Backend:
    """A control plane plus a way to let a TTL pass (real time for PostgreSQL)."""

    def __init__(self, control: ClusterControl, log: object, clock: ManualClock | None) -> None:
        self.control = control
        self.log = log
        self.clock = clock

    async def pass_time(self, seconds: float) -> None:
        if self.clock is not None:
            self.clock.now += seconds
        else:
            await anyio.sleep(seconds)


@asynccontextmanager
async def backend(kind: str, request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if kind == "memory":
        log = MemoryLogStore()
        clock = ManualClock()
        yield Backend(MemoryClusterControl(log, clock), log, clock)
        return
    dsn = request.getfixturevalue("postgres_dsn")
    async with await PostgresLogStore.open(dsn) as store:
        yield Backend(store, store, None)


@pytest.fixture(params=["memory", "postgres"])
def kind(request: pytest.FixtureRequest) -> str:
    if request.param == "postgres":
        request.getfixturevalue("postgres_dsn")  # created before the test's event loop runs
    return request.param


async def test_node_leases_expire_by_the_control_planes_clock(
    kind: str, request: pytest.FixtureRequest
) -> None:
    async with backend(kind, request) as b:
        c = b.control
        assert isinstance(c, ClusterControl)
        a = await c.register_node("a", "http://a:7070", None, SHORT_TTL_S)
        b_ = await c.register_node("b", "http://b:7070", "b:9092", 60.0)
        assert b_ > a
        view = await c.cluster_view()
        assert [(n.node_id, n.advertise_url, n.kafka_url, n.draining) for n in view.nodes] == [
            ("a", "http://a:7070", None, False),
            ("b", "http://b:7070", "b:9092", False),
        ]
        assert all(n.lease_expires_at > view.now for n in view.nodes)
        assert await c.renew_node("a", a, SHORT_TTL_S)
        await b.pass_time(SHORT_TTL_S + 0.2)
        assert not await c.renew_node("a", a, SHORT_TTL_S)  # expired: register again
        assert await c.renew_node("b", b_, 60.0)
        view = await c.cluster_view()
        assert {n.node_id for n in view.nodes if n.lease_expires_at > view.now} == {"b"}
        assert await c.register_node("a", "http://a2:7070", None, 60.0) > b_  # a restart takes the row back
        await c.set_draining("b", b_)
        view = await c.cluster_view()
        assert [(n.node_id, n.advertise_url, n.draining) for n in view.nodes] == [
            ("a", "http://a2:7070", False),
            ("b", "http://b:7070", True),
        ]
        assert await c.renew_node("ghost", b_, 60.0) is False


async def test_partition_leases_are_taken_only_free_expired_or_own(
    kind: str, request: pytest.FixtureRequest
) -> None:
    async with backend(kind, request) as b:
        c = b.control
        rows = await b.log.create_topic("t", 3, 1, 0.0)
        p0, p1, p2 = (row.pid for row in rows)
        a = await c.register_node("a", "http://a", None, 60.0)
        b_ = await c.register_node("b", "http://b", None, 60.0)
        assert await c.acquire_leases("a", a, [p0, p1], SHORT_TTL_S) == [p0, p1]
        assert await c.acquire_leases("b", b_, [p0, p1, p2], 60.0) == [p2]  # a holds p0 and p1
        assert await c.acquire_leases("a", a, [p0, 999_999], SHORT_TTL_S) == [p0]  # own; unknown pid ignored
        view = await c.cluster_view()
        assert [(lease.topic, lease.partition, lease.node_id) for lease in view.leases] == [
            ("t", 0, "a"),
            ("t", 1, "a"),
            ("t", 2, "b"),
        ]
        assert await c.renew_leases("a", a, SHORT_TTL_S) == [p0, p1]
        await c.release_leases("a", a, [p1])  # a hand-over: b may take it at once
        await c.release_leases("b", b_, [p0])  # not b's: nothing happens
        assert await c.acquire_leases("b", b_, [p0, p1], 60.0) == [p1]
        await b.pass_time(SHORT_TTL_S + 0.2)  # a's lease on p0 expires (a paused, say)
        assert await c.renew_leases("a", a, SHORT_TTL_S) == []  # a zombie learns it holds nothing
        assert await c.acquire_leases("b", b_, [p0], 60.0) == [p0]
        assert await c.renew_leases("b", b_, 60.0) == [p0, p1, p2]
        await c.leave_node("b", b_)  # graceful: everything released, the row gone
        view = await c.cluster_view()
        assert [n.node_id for n in view.nodes] == ["a"]
        assert all(lease.node_id is None for lease in view.leases)
        assert await c.acquire_leases("a", a, [p0, p1, p2], 60.0) == [p0, p1, p2]


async def test_a_late_request_of_a_nodes_previous_incarnation_changes_nothing(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """Node a restarts under its id (a new registration, a new incarnation) while requests its
    previous run sent before it died are still on their way. When they land, each names the
    old incarnation: no draining flag, no lease released, taken or renewed, no row removed or
    renewed for the new run (before: every one of them acted on the new run's row and leases)."""
    async with backend(kind, request) as b:
        c = b.control
        rows = await b.log.create_topic("t", 3, 1, 0.0)
        p0, p1, p2 = (row.pid for row in rows)
        old = await c.register_node("a", "http://a:7070", None, 60.0)
        assert await c.acquire_leases("a", old, [p0, p1], 60.0) == [p0, p1]
        new = await c.register_node("a", "http://a:7070", "a:9092", 60.0)  # the restart (same URL)
        assert new > old
        assert await c.renew_leases("a", new, 60.0) == [p0, p1]  # its previous run's: adopted
        held = {lease.pid: lease.lease_expires_at for lease in (await c.cluster_view()).leases}

        await c.set_draining("a", old)
        await c.release_leases("a", old, [p0])
        assert await c.acquire_leases("a", old, [p2], 60.0) == []
        assert await c.renew_leases("a", old, 60.0) == []
        assert await c.renew_node("a", old, 60.0) is False
        await c.leave_node("a", old)

        view = await c.cluster_view()
        assert [(n.node_id, n.kafka_url, n.draining, n.incarnation) for n in view.nodes] == [
            ("a", "a:9092", False, new)
        ]
        assert [(lease.pid, lease.node_id) for lease in view.leases] == [(p0, "a"), (p1, "a"), (p2, None)]
        assert {lease.pid: lease.lease_expires_at for lease in view.leases} == held  # none renewed
        assert await c.renew_node("a", new, 60.0)
        await c.leave_node("a", new)  # the new run's own requests still act
        assert (await c.cluster_view()).nodes == []


async def test_a_node_id_live_under_another_advertise_url_is_refused_and_a_restart_is_not(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """A second process under a live node id (another advertise URL) is refused and changes
    nothing (before: it took the row, and the two took it from each other every round); a
    restart under the same URL is not, within its previous run's lease; an expired row is
    taken whatever the URL."""
    async with backend(kind, request) as b:
        c = b.control
        first = await c.register_node("a", "http://a:7070", None, SHORT_TTL_S)
        with pytest.raises(NodeIdTaken) as refused:
            await c.register_node("a", "http://a:7071", "a:9093", 60.0)
        assert refused.value.node_id == "a"
        assert refused.value.other_url == "http://a:7070"
        assert refused.value.code == "node_id_taken" and isinstance(refused.value, StoreRefused)
        message = str(refused.value)
        assert "'a'" in message and "http://a:7070" in message and "\n" not in message
        view = await c.cluster_view()
        assert [(n.node_id, n.advertise_url, n.kafka_url, n.incarnation) for n in view.nodes] == [
            ("a", "http://a:7070", None, first)
        ]
        assert await c.renew_node("a", first, SHORT_TTL_S)  # the running node keeps its row

        restarted = await c.register_node("a", "http://a:7070", "a:9092", SHORT_TTL_S)  # same URL
        assert restarted > first
        await b.pass_time(SHORT_TTL_S + 0.2)  # the row expires: another URL may take it now
        moved = await c.register_node("a", "http://a:7071", None, 60.0)
        assert moved > restarted
        view = await c.cluster_view()
        assert [(n.node_id, n.advertise_url, n.incarnation) for n in view.nodes] == [
            ("a", "http://a:7071", moved)
        ]


async def test_nodes_expired_longer_than_the_bound_are_forgotten(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """A crashed node's row (no graceful leave removed it) goes once its lease has been out for
    the bound, with its expired partition leases; live rows and rows expired for less stay; the
    node registers again if it comes back."""
    bound_s = 1.0
    async with backend(kind, request) as b:
        c = b.control
        rows = await b.log.create_topic("t", 2, 1, 0.0)
        p0, p1 = (row.pid for row in rows)
        a = await c.register_node("a", "http://a", None, SHORT_TTL_S)
        b_ = await c.register_node("b", "http://b", None, 60.0)
        assert await c.acquire_leases("a", a, [p0], SHORT_TTL_S) == [p0]
        assert await c.acquire_leases("b", b_, [p1], 60.0) == [p1]
        assert await c.forget_expired_nodes(bound_s) == []  # a is live
        await b.pass_time(SHORT_TTL_S + 0.2)  # a crashed: expired, but not for the bound yet
        assert await c.forget_expired_nodes(bound_s) == []
        assert [n.node_id for n in (await c.cluster_view()).nodes] == ["a", "b"]
        await b.pass_time(bound_s)
        assert await c.forget_expired_nodes(bound_s) == ["a"]
        view = await c.cluster_view()
        assert [n.node_id for n in view.nodes] == ["b"]
        assert [(lease.pid, lease.node_id) for lease in view.leases] == [(p0, None), (p1, "b")]
        assert await c.forget_expired_nodes(bound_s) == []
        assert await c.renew_node("a", a, 60.0) is False  # the crashed run, were it to wake
        back = await c.register_node("a", "http://a", None, 60.0)  # it comes back: registers again
        assert await c.acquire_leases("a", back, [p0], 60.0) == [p0]
        assert [n.node_id for n in (await c.cluster_view()).nodes] == ["a", "b"]


async def test_watermarks_only_rise_and_the_snapshot_names_every_partition(
    kind: str, request: pytest.FixtureRequest
) -> None:
    async with backend(kind, request) as b:
        c = b.control
        assert await c.watermark_snapshot() == (1, {})
        rows = await b.log.create_topic("t", 2, 1, 0.0)
        p0, p1 = (row.pid for row in rows)
        await b.log.set_cluster_epoch(7)
        assert await c.watermark_snapshot() == (7, {"t/0": None, "t/1": None})
        await c.publish_watermarks({p0: 5})
        await c.publish_watermarks({p0: 3, p1: 4})  # p0 never falls back
        assert await c.watermark_snapshot() == (7, {"t/0": 5, "t/1": 4})
        await c.publish_watermarks({p0: 6, 999_999: 9})  # an unknown partition is ignored
        more = await b.log.create_topic("u", 1, 7, 0.0)
        assert more[0].creation_epoch >= 7
        assert await c.watermark_snapshot() == (7, {"t/0": 6, "t/1": 4, "u/0": None})


async def test_a_partition_is_never_created_below_the_stored_cluster_epoch(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """A node whose epoch cache is stale creates a topic: its creation epoch is the stored one,
    so a GC round whose snapshot missed it cannot have an `E` above it."""
    async with backend(kind, request) as b:
        await b.log.set_cluster_epoch(9)
        rows = await b.log.create_topic("late", 2, 4, 0.0)  # the creator believed epoch 4
        assert [row.creation_epoch for row in rows] == [9, 9]
        rows = await b.log.create_topic("ahead", 1, 11, 0.0)  # a node ahead keeps its own
        assert [row.creation_epoch for row in rows] == [11]


async def test_the_first_node_names_the_cluster_and_every_later_one_learns_it(
    kind: str, request: pytest.FixtureRequest
) -> None:
    async with backend(kind, request) as b:
        assert await b.control.cluster_id("first") == "first"
        assert await b.control.cluster_id("second") == "first"
