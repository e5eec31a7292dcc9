"""Membership and leadership by leases (actors/cluster.py) over the memory control plane, rounds
driven by hand on one manual clock: three members split the partitions evenly, each led by
exactly one; a paused member's partitions move once its leases expire, and when it wakes it
learns it leads nothing (resigns, never acts on a stale lease); a graceful leave hands over at
once; a join takes its share a bounded number of partitions per round."""

from __future__ import annotations

from collections import Counter

from levelzero.actors.cluster import ClusterMember
from levelzero.storage.memory_cluster import MemoryClusterControl
from levelzero.storage.memory_log import MemoryLogStore

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


async def cluster(names: list[str], moves_max: int = 100):  # noqa: ANN201
    log = MemoryLogStore()
    await log.create_topic("t", PARTITIONS, 1, 0.0)
    clock = Clock()
    control = MemoryClusterControl(log, clock)
    nodes = {name: Node() for name in names}
    members = {
        name: ClusterMember(control, name, f"http://{name}", ttl_s=TTL_S, lead=nodes[name].lead,
                            resign=nodes[name].resign, moves_max=moves_max, clock=clock)
        for name in names
    }
    for member in members.values():
        await control.register_node(member.node_id, member.advertise_url, None, TTL_S)
    return log, clock, control, nodes, members


async def rounds(members, clock, count: int = 2, step: float = TTL_S / 3) -> None:  # noqa: ANN001
    for _ in range(count):
        for member in members:
            await member.round()
        clock.now += step


def exactly_one_leader(nodes: dict[str, Node]) -> Counter:
    owners = Counter(pid for node in nodes.values() for pid in node.led)
    assert set(owners) == set(range(1, PARTITIONS + 1))
    assert set(owners.values()) == {1}
    return Counter({name: len(node.led) for name, node in nodes.items()})


async def test_three_members_split_the_partitions_each_led_once() -> None:
    _, clock, control, nodes, members = await cluster(["a", "b", "c"])
    await rounds(members.values(), clock)
    counts = exactly_one_leader(nodes)
    assert all(10 <= count <= 30 for count in counts.values()), counts
    view = await control.cluster_view()
    assert {l.pid: l.node_id for l in view.leases} == {
        pid: name for name, node in nodes.items() for pid in node.led}
    b_partition = next(iter(nodes["b"].led)) - 1  # pids 1..60 are partitions 0..59 of "t"
    assert members["a"].leader_url("t", b_partition) == "http://b"
    assert members["a"].partitions_known() == {"t": PARTITIONS}


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


async def test_a_graceful_leave_hands_over_without_waiting_for_the_ttl() -> None:
    _, clock, _, nodes, members = await cluster(["a", "b", "c"])
    await rounds(members.values(), clock)
    await members["c"].leave()
    assert nodes["c"].led == set()
    await rounds([members["a"], members["b"]], clock, count=1, step=0.0)  # no time passes
    assert nodes["a"].led | nodes["b"].led == set(range(1, PARTITIONS + 1))
    exactly_one_leader({"a": nodes["a"], "b": nodes["b"]})


async def test_a_join_takes_its_share_a_bounded_number_per_round() -> None:
    log, clock, control, nodes, members = await cluster(["a", "b"], moves_max=3)
    await rounds(members.values(), clock)
    d = Node()
    joining = ClusterMember(control, "d", "http://d", ttl_s=TTL_S, lead=d.lead, resign=d.resign,
                            moves_max=3, clock=clock)
    await control.register_node("d", "http://d", None, TTL_S)
    nodes["d"], members["d"] = d, joining
    await rounds(members.values(), clock, count=1)
    handed = [e for name in ("a", "b") for e in nodes[name].events if e[0] == "resign"]
    assert handed and all(len(pids) <= 3 for _, pids in handed)
    await rounds(members.values(), clock, count=12)
    counts = exactly_one_leader(nodes)
    assert counts["d"] >= 10, counts


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
