"""Membership and leadership by leases (actors/cluster.py) over the memory control plane, rounds
driven by hand on one manual clock: three members split the partitions evenly, each led by
exactly one; a paused member's partitions move once its leases expire, and when it wakes it
learns it leads nothing (resigns, never acts on a stale lease); a graceful leave hands over at
once; a join takes its share a bounded number of partitions per round."""

from __future__ import annotations

from collections import Counter

import logging

import anyio
import pytest

from levelzero.actors.cluster import ClusterMember
from levelzero.core.errors import NodeIdTaken, StorageError
from levelzero.storage.memory_cluster import MemoryClusterControl
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.testing.virtual_time import in_virtual_time

TTL_S = 9.0
PARTITIONS = 60


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Node:
    """What `lead` and `resign` would start and stop: here, a record of them."""

    def __init__(self) -> None:
        self.led: set[int] = set()
        self.events: list[tuple[str, tuple[int, ...]]] = []

    async def lead(self, pids: list[int]) -> None:
        assert not self.led & set(pids), "led twice"
        self.led |= set(pids)
        self.events.append(("lead", tuple(pids)))

    async def resign(self, pids: list[int]) -> None:
        assert set(pids) <= self.led, "resigned what it did not lead"
        self.led -= set(pids)
        self.events.append(("resign", tuple(pids)))


async def cluster(names: list[str], moves_max: int = 100, forget_expired_after_s: float = 3600.0):
    log = MemoryLogStore()
    await log.create_topic("t", PARTITIONS, 1, 0.0)
    clock = Clock()
    control = MemoryClusterControl(log, clock)
    nodes = {name: Node() for name in names}
    members = {
        name: ClusterMember(
            control,
            name,
            f"http://{name}",
            ttl_s=TTL_S,
            lead=nodes[name].lead,
            resign=nodes[name].resign,
            moves_max=moves_max,
            clock=clock,
            forget_expired_after_s=forget_expired_after_s,
        )
        for name in names
    }
    for member in members.values():
        await member.register()
    return log, clock, control, nodes, members


async def rounds(members, clock, count: int = 2, step: float = TTL_S / 3) -> None:
    for _ in range(count):
        for member in members:
            await member.round()
        clock.now += step


def exactly_one_leader(nodes: dict[str, Node]) -> Counter:
    owners = Counter(pid for node in nodes.values() for pid in node.led)
    assert set(owners) == set(range(1, PARTITIONS + 1))
    assert set(owners.values()) == {1}
    return Counter({name: len(node.led) for name, node in nodes.items()})


@in_virtual_time
async def test_three_members_split_the_partitions_each_led_once() -> None:
    _, clock, control, nodes, members = await cluster(["a", "b", "c"])
    await rounds(members.values(), clock)
    counts = exactly_one_leader(nodes)
    assert all(10 <= count <= 30 for count in counts.values()), counts
    view = await control.cluster_view()
    assert {lease.pid: lease.node_id for lease in view.leases} == {
        pid: name for name, node in nodes.items() for pid in node.led
    }
    b_partition = next(iter(nodes["b"].led)) - 1  # pids 1..60 are partitions 0..59 of "t"
    assert members["a"].leader_url("t", b_partition) == "http://b"
    assert members["a"].partitions_known() == {"t": PARTITIONS}


@in_virtual_time
async def test_a_paused_member_loses_its_partitions_and_learns_it_on_waking() -> None:
    _, clock, _, nodes, members = await cluster(["a", "b", "c"])
    await rounds(members.values(), clock)
    paused = members["c"]
    had = set(nodes["c"].led)
    assert had
    clock.now += TTL_S  # c is paused: no rounds; its node and partition leases expire
    assert not paused.leads(next(iter(had)))  # its own deadline passed: it acts on none
    await rounds([members["a"], members["b"]], clock)
    assert had <= nodes["a"].led | nodes["b"].led  # taken over
    assert nodes["c"].led == had  # the zombie has not noticed yet
    await paused.round()  # it wakes: the control plane lists none of its leases
    assert nodes["c"].events[-1] == ("resign", tuple(sorted(had)))
    await rounds(members.values(), clock)
    exactly_one_leader(nodes)  # and it gets a fair share back, never a partition led twice


@in_virtual_time
async def test_a_graceful_leave_hands_over_without_waiting_for_the_ttl() -> None:
    _, clock, _, nodes, members = await cluster(["a", "b", "c"])
    await rounds(members.values(), clock)
    await members["c"].leave()
    assert nodes["c"].led == set()
    await rounds([members["a"], members["b"]], clock, count=1, step=0.0)  # no time passes
    assert nodes["a"].led | nodes["b"].led == set(range(1, PARTITIONS + 1))
    exactly_one_leader({"a": nodes["a"], "b": nodes["b"]})


@in_virtual_time
async def test_a_join_takes_its_share_a_bounded_number_per_round() -> None:
    log, clock, control, nodes, members = await cluster(["a", "b"], moves_max=3)
    await rounds(members.values(), clock)
    d = Node()
    joining = ClusterMember(
        control, "d", "http://d", ttl_s=TTL_S, lead=d.lead, resign=d.resign, moves_max=3, clock=clock
    )
    await joining.register()
    nodes["d"], members["d"] = d, joining
    await rounds(members.values(), clock, count=1)
    handed = [e for name in ("a", "b") for e in nodes[name].events if e[0] == "resign"]
    assert handed and all(len(pids) <= 3 for _, pids in handed)
    await rounds(members.values(), clock, count=12)
    counts = exactly_one_leader(nodes)
    assert counts["d"] >= 10, counts


@in_virtual_time
async def test_the_next_round_comes_just_after_another_nodes_lease_runs_out() -> None:
    _, clock, control, nodes, members = await cluster(["a", "b"])
    await rounds(members.values(), clock, count=1, step=0.0)
    a = members["a"]
    assert a._next_round_in_s() == TTL_S / 3  # b's lease has the whole TTL left
    clock.now += TTL_S - 1.0  # b stops renewing (crashed); a's view is read again
    await a.refresh()
    assert abs(a._next_round_in_s() - 1.05) < 1e-9  # b's lease ends in 1 s: a looks right after
    clock.now += 1.05
    await a.round()
    assert nodes["a"].led == set(range(1, PARTITIONS + 1))  # b's partitions, taken at once


@in_virtual_time
async def test_a_second_process_under_a_live_node_id_is_refused_and_a_running_one_stands_by(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another process starting under a live node id (another advertise URL) is refused. One
    that slipped in while the first was paused past its TTL keeps the id: the first, waking,
    logs the conflict once as an error (not every round), leads nothing and does not take the
    row back (before: each took it from the other every round, terms restarting both ways);
    once the other leaves, it registers again and leads its share."""
    caplog.set_level(logging.INFO, logger="levelzero.cluster")
    _, clock, control, nodes, members = await cluster(["a", "b"])
    await rounds(members.values(), clock)
    duplicate = ClusterMember(
        control, "a", "http://a-copy", ttl_s=TTL_S, lead=Node().lead, resign=Node().resign
    )
    with pytest.raises(NodeIdTaken, match="http://a"):
        await duplicate.register()
    assert duplicate.incarnation is None and control.nodes["a"].advertise_url == "http://a"

    a = members["a"]
    await rounds([members["b"]], clock, count=4)  # a paused: its lease runs out
    intruder_node = Node()
    intruder = ClusterMember(
        control,
        "a",
        "http://a-copy",
        ttl_s=TTL_S,
        lead=intruder_node.lead,
        resign=intruder_node.resign,
        clock=clock,
    )
    await intruder.register()
    await rounds([members["b"], intruder], clock)
    assert intruder_node.led
    caplog.clear()
    await rounds([a, members["b"], intruder], clock, count=4)  # a wakes
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "'a' is taken" in errors[0] and "http://a-copy" in errors[0], errors
    assert a.conflict == "http://a-copy" and nodes["a"].led == set()
    assert not any(a.leads(pid) for pid in range(1, PARTITIONS + 1))
    row = control.nodes["a"]
    assert (row.advertise_url, row.incarnation) == ("http://a-copy", intruder.incarnation)
    assert [e for e in intruder_node.events if e[0] == "resign"] == []  # never lost a partition
    exactly_one_leader({"a": intruder_node, "b": nodes["b"]})
    assert a.leader_url("t", next(iter(intruder_node.led)) - 1) == "http://a-copy"

    await intruder.leave()
    caplog.clear()
    await rounds([a, members["b"]], clock, count=3)
    assert a.conflict is None and control.nodes["a"].advertise_url == "http://a"
    assert not [r for r in caplog.records if r.levelno == logging.ERROR]
    exactly_one_leader(nodes)


@in_virtual_time
async def test_a_crashed_nodes_row_is_forgotten_by_the_live_members_after_the_bound() -> None:
    """Node c is killed and never restarted: its row stays (shown expired) until its lease has
    been out for `forget_expired_after_s`, then a live member's round deletes it (before: it
    stayed forever; only a graceful leave removed a row). Its partitions move at the TTL as
    before; c coming back later registers again and takes its share."""
    bound_s = 30.0
    _, clock, control, nodes, members = await cluster(["a", "b", "c"], forget_expired_after_s=bound_s)
    await rounds(members.values(), clock)
    expires = control.nodes["c"].lease_expires_at
    live = [members["a"], members["b"]]
    while clock.now < expires + bound_s - TTL_S / 3:  # c crashed: a and b go on
        await rounds(live, clock, count=1)
        assert "c" in control.nodes
    exactly_one_leader({"a": nodes["a"], "b": nodes["b"]})
    await rounds(live, clock, count=2)
    assert sorted(control.nodes) == ["a", "b"]
    assert all(holder != "c" for holder, _ in control.leases.values())
    assert members["a"].live_nodes() == ["a", "b"]

    back = Node()
    nodes["c"] = back
    members["c"] = ClusterMember(
        control, "c", "http://c", ttl_s=TTL_S, lead=back.lead, resign=back.resign, clock=clock
    )
    await members["c"].register()
    await rounds(members.values(), clock, count=6)
    assert sorted(control.nodes) == ["a", "b", "c"] and back.led
    exactly_one_leader(nodes)


# ---------------------------------------------------------------- found by the cluster simulation


@in_virtual_time
async def test_a_node_restarted_within_its_ttl_leads_the_leases_its_previous_run_held() -> None:
    """The same node id, restarted before its leases ran out: the control plane renews them for
    it, so nobody else takes them. It must lead them (a new term fences its previous run)."""
    _, clock, control, nodes, members = await cluster(["a", "b"])
    await rounds(members.values(), clock)
    had = set(nodes["b"].led)
    assert had
    again = Node()
    restarted = ClusterMember(
        control, "b", "http://b", ttl_s=TTL_S, lead=again.lead, resign=again.resign, clock=clock
    )
    clock.now += 1.0  # well within the TTL
    await restarted.register()
    await restarted.round()
    assert again.led == had  # before: renewed forever and led by nobody
    nodes["b"], members["b"] = again, restarted
    await rounds(members.values(), clock)
    exactly_one_leader(nodes)


@in_virtual_time
async def test_a_lease_granted_too_late_to_use_is_not_acted_on() -> None:
    """An acquire whose answer comes after the lease could have run out (the node was paused
    with it in flight) starts nothing: another node may hold the partition by now."""
    log = MemoryLogStore()
    await log.create_topic("t", 4, 1, 0.0)
    clock = Clock()
    control = MemoryClusterControl(log, clock)
    slow = Node()

    class LateAnswers:
        def __getattr__(self, name: str):
            return getattr(control, name)

        async def acquire_leases(self, node_id: str, incarnation: int, pids, ttl_s: float) -> list[int]:
            taken = await control.acquire_leases(node_id, incarnation, pids, ttl_s)
            clock.now += TTL_S  # the answer arrives a TTL later
            return taken

    member = ClusterMember(
        LateAnswers(), "a", "http://a", ttl_s=TTL_S, lead=slow.lead, resign=slow.resign, clock=clock
    )
    await member.register()
    await member.round()
    assert slow.led == set()
    assert member.leading == set()


@in_virtual_time
async def test_a_partition_given_a_newer_term_elsewhere_is_started_again() -> None:
    """A node holding a lease finds the partition's log at a newer term than its actor's (a
    woken zombie started one on a lease that had run out): every append of its term would be
    refused forever, so it leads the partition again, in a newer term."""
    log, clock, control, nodes, _ = await cluster(["a"])
    terms: dict[int, int] = {}

    async def lead(pids: list[int]) -> None:
        await nodes["a"].lead(pids)
        for pid in pids:  # what the node's actor does: replay, then start a term
            terms[pid] = (await log.begin_term(pid, len(log.logs[pid]), 0)).term

    member = ClusterMember(
        control,
        "a",
        "http://a",
        ttl_s=TTL_S,
        lead=lead,
        resign=nodes["a"].resign,
        term_of=terms.get,
        clock=clock,
    )
    await member.register()
    await member.round()
    assert set(terms) == set(range(1, PARTITIONS + 1))
    assert set(terms.values()) == {1}
    await log.begin_term(7, len(log.logs[7]), 0)  # the zombie's term start: term 2
    clock.now += 1.0
    await member.round()
    assert nodes["a"].events[-2:] == [("resign", (7,)), ("lead", (7,))]
    assert terms[7] == 3 and log.partitions[7].term == 3
    await member.round()
    assert nodes["a"].events[-1] == ("lead", (7,))  # once: its term is current again


@in_virtual_time
async def test_a_round_asked_for_after_leaving_does_not_register_the_node_again() -> None:
    _, clock, control, nodes, members = await cluster(["a", "b"])
    await rounds(members.values(), clock)
    await members["b"].leave()
    await members["b"].round()  # e.g. a topic's creation asking for one while shutting down
    assert "b" not in control.nodes
    assert nodes["b"].led == set()


class Blackholed:
    """The control plane behind a dead connection: once `cut`, every call hangs; the first
    `hang_first` calls of the names in it hang too."""

    def __init__(self, control: MemoryClusterControl, hang_first: dict[str, int] | None = None) -> None:
        self.control = control
        self.cut = False
        self.hang_first = dict(hang_first or {})

    def __getattr__(self, name: str):
        call = getattr(self.control, name)

        async def maybe_hang(*args, **kwargs):
            if self.hang_first.get(name, 0) > 0:
                self.hang_first[name] -= 1
                await anyio.sleep_forever()
            if self.cut:
                await anyio.sleep_forever()
            return await call(*args, **kwargs)

        return maybe_hang


@in_virtual_time
async def test_a_member_whose_control_calls_hang_resigns_once_its_lease_runs_out() -> None:
    """A round stuck on a dead connection (client timeouts of 30-60 s) must not keep the member
    from resigning: each call of a round gives up after half the TTL (virtual time)."""
    ttl_s = 0.4
    log = MemoryLogStore()
    await log.create_topic("t", 4, 1, 0.0)
    control = Blackholed(MemoryClusterControl(log, anyio.current_time))
    node = Node()
    member = ClusterMember(control, "a", "http://a", ttl_s=ttl_s, lead=node.lead, resign=node.resign)
    assert member.call_timeout_s < ttl_s
    async with anyio.create_task_group() as tg:
        await tg.start(member.run)
        with anyio.fail_after(10):
            while len(node.led) < 4:
                await anyio.sleep(0.01)
        control.cut = True
        with anyio.fail_after(10):  # a request served under the lease ends at its deadline
            with member.serving() as request:
                await anyio.sleep_forever()
        assert request.cancelled_caught and not member.lease_valid()
        with anyio.fail_after(10):  # without bounded calls: the round hangs, nothing resigns
            while node.led:
                await anyio.sleep(0.01)
        assert node.events[-1] == ("resign", (1, 2, 3, 4))
        assert not any(member.leads(pid) for pid in range(1, 5))
        tg.cancel_scope.cancel()


@in_virtual_time
async def test_a_member_whose_first_round_gets_no_answer_starts_and_leads_later() -> None:
    log = MemoryLogStore()
    await log.create_topic("t", 4, 1, 0.0)
    control = Blackholed(MemoryClusterControl(log, anyio.current_time), {"cluster_view": 1})
    node = Node()
    member = ClusterMember(control, "a", "http://a", ttl_s=0.4, lead=node.lead, resign=node.resign)
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(10):
            await tg.start(member.run)  # the first round gave up on its view: started anyway
            assert node.led == set()
            while len(node.led) < 4:  # the next rounds take the leases
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()


@in_virtual_time
async def test_late_requests_of_a_nodes_previous_run_change_nothing_for_its_next_run() -> None:
    """Node b dies during a graceful stop with its `set_draining`, a hand-over's
    `release_leases` and its `leave_node` on the wire; it restarts under the same id and
    leads its partitions again; then those requests arrive. They name the dead run's
    incarnation: the new run is not marked draining, keeps its leases and its row, and goes on
    leading its share (before: drained by the others and its leases released under it)."""
    _, clock, control, nodes, members = await cluster(["a", "b"])
    await rounds(members.values(), clock)
    old = members["b"]
    had = set(nodes["b"].led)
    assert had and old.incarnation is not None
    dead_life = old.incarnation
    again = Node()
    restarted = ClusterMember(  # a restart: same advertise URL (another one would be refused)
        control,
        "b",
        "http://b",
        ttl_s=TTL_S,
        lead=again.lead,
        resign=again.resign,
        kafka_url="b:9092",
        clock=clock,
    )
    clock.now += 1.0
    await restarted.register()
    await restarted.round()
    assert again.led == had and restarted.incarnation != dead_life
    nodes["b"], members["b"] = again, restarted

    await control.set_draining("b", dead_life)  # the dead run's requests, arriving late
    await control.release_leases("b", dead_life, sorted(had))
    await control.leave_node("b", dead_life)
    assert await control.acquire_leases("b", dead_life, [1], TTL_S) == []
    assert await control.renew_leases("b", dead_life, TTL_S) == []
    assert not await control.renew_node("b", dead_life, TTL_S)

    row = control.nodes["b"]
    assert (row.kafka_url, row.draining, row.incarnation) == ("b:9092", False, restarted.incarnation)
    assert {pid for pid, (holder, _) in control.leases.items() if holder == "b"} == had
    await rounds(members.values(), clock, count=3)
    assert again.led == had  # nothing handed over, nothing lost
    assert [e for e in again.events if e[0] == "resign"] == []
    exactly_one_leader(nodes)


@in_virtual_time
async def test_a_release_given_up_on_that_lands_later_never_takes_a_lease_the_member_leads() -> None:
    """A hand-over's `release_leases` times out (answered after `call_timeout_s`) but its
    request still lands, after the member's next round adopted those leases again (the other
    node left meanwhile). Before: the late release deleted the leases of two partitions the
    member went on leading (three-node simulation seed 1832). Now the round after a call given
    up on registers again first, and the late release, naming the old incarnation, is void."""
    ttl_s = 0.4
    late_s = 0.3  # past the call timeout (half the TTL), well within the lease
    log = MemoryLogStore()
    await log.create_topic("t", 4, 1, 0.0)
    control = MemoryClusterControl(log, anyio.current_time)
    landed: list[tuple[object, ...]] = []

    async with anyio.create_task_group() as wire:

        class LateRelease:
            """The control plane, whose first `release_leases` lands `late_s` after it is sent."""

            late = 1

            def __getattr__(self, name: str):
                return getattr(control, name)

            async def release_leases(self, *args: object) -> None:
                if self.late == 0:
                    return await control.release_leases(*args)
                self.late -= 1
                done = anyio.Event()

                async def land() -> None:
                    await anyio.sleep(late_s)
                    await control.release_leases(*args)
                    landed.append(args)
                    done.set()

                wire.start_soon(land)
                await done.wait()

        nodes = {name: Node() for name in "ab"}
        a, b = (
            ClusterMember(
                LateRelease(), n, f"http://{n}", ttl_s=ttl_s, lead=nodes[n].lead, resign=nodes[n].resign
            )
            for n in "ab"
        )
        await a.register()
        await a.round()
        assert nodes["a"].led == {1, 2, 3, 4}
        await b.register()
        try:
            await a.round()  # hands b its share over; the release is given up on
        except StorageError:
            pass
        else:
            raise AssertionError("the release should have timed out")
        handed = {1, 2, 3, 4} - nodes["a"].led
        assert handed and not landed
        await b.leave()
        await a.round()  # a alone again: leads what it still holds, the handed-over ones too
        assert nodes["a"].led == {1, 2, 3, 4} and not landed
        await anyio.sleep(late_s)  # the late release lands
        assert landed
        for pid in range(1, 5):
            assert a.leads(pid)
            assert control.leases.get(pid, (None, 0.0))[0] == "a", f"a leads {pid}, whose lease is gone"
        wire.cancel_scope.cancel()


@in_virtual_time
async def test_a_node_that_joins_and_dies_counts_as_two_membership_changes() -> None:
    # The Kafka coordinators compare this count to tell that a group may have been coordinated
    # (and stored anew) elsewhere meanwhile: the live set alone came back to what it was when a
    # node joined and died between two requests, and a stale copy of the group was served.
    _, clock, control, nodes, members = await cluster(["a", "b"])
    await rounds(members.values(), clock)
    a = members["a"]
    assert a.membership_changes == 0
    d = Node()
    joining = ClusterMember(control, "d", "http://d", ttl_s=TTL_S, lead=d.lead, resign=d.resign, clock=clock)
    await joining.register()
    await rounds([a, members["b"], joining], clock, count=1)
    assert a.membership_changes == 1 and "d" in (a.live_nodes() or [])
    await rounds([a, members["b"]], clock, count=5)  # d died: its lease runs out meanwhile
    assert sorted(a.live_nodes() or []) == ["a", "b"]  # the same live set as before it joined
    assert a.membership_changes == 2
