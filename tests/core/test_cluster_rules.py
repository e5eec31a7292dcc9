"""The cluster's pure rules: rendezvous leadership spreads partitions evenly and moves only what
a membership change must move; a round hands over a bounded number; GC prefix shares cover every
prefix exactly once; a lease's local deadline counts from when its renewal was sent."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from levelzero.core.cluster import (
    GC_PREFIXES,
    LeaseClock,
    live_nodes,
    moves,
    preferred_leader,
    prefix_share,
    shares_cover,
)

PARTITIONS = [f"t{t}/{p}" for t in range(10) for p in range(100)]  # 1,000 partitions
node_ids = st.lists(st.text("abcdefgh123", min_size=1, max_size=6), min_size=1, max_size=6, unique=True)


def assignment(nodes: list[str]) -> dict[str, str | None]:
    return {p: preferred_leader(p, nodes) for p in PARTITIONS}


def test_leadership_is_spread_evenly_over_three_nodes() -> None:
    counts = Counter(assignment(["n1", "n2", "n3"]).values())
    assert set(counts) == {"n1", "n2", "n3"}
    assert all(abs(count - 1000 / 3) < 1000 / 3 * 0.15 for count in counts.values()), counts


@settings(max_examples=60, deadline=None)
@given(node_ids, st.text("xyz", min_size=1, max_size=4))
def test_a_join_moves_only_partitions_to_the_new_node(nodes: list[str], joining: str) -> None:
    if joining in nodes:
        return
    before, after = assignment(nodes), assignment([*nodes, joining])
    moved = [p for p in PARTITIONS if before[p] != after[p]]
    assert all(after[p] == joining for p in moved)


@settings(max_examples=60, deadline=None)
@given(node_ids)
def test_a_leave_moves_only_the_leavers_partitions(nodes: list[str]) -> None:
    if len(nodes) < 2:
        return
    leaving = nodes[0]
    before, after = assignment(nodes), assignment(nodes[1:])
    assert all(before[p] == leaving for p in PARTITIONS if before[p] != after[p])


def test_a_round_takes_leaderless_partitions_and_hands_over_a_bounded_number() -> None:
    nodes = ["n1", "n2"]
    wanted = assignment(["n1", "n2", "n3"])
    # n1 and n2 lead everything; n3 joins.
    leaders: dict[str, str | None] = {p: preferred_leader(p, nodes) for p in PARTITIONS}
    n1 = moves("n1", ["n1", "n2", "n3"], leaders, moves_max=8)
    should_go = [p for p in PARTITIONS if leaders[p] == "n1" and wanted[p] == "n3"]
    assert len(should_go) > 8
    assert n1.take == ()
    assert list(n1.hand_over) == sorted(should_go)[:8]
    for p in n1.hand_over:
        leaders[p] = None  # released
    n3 = moves("n3", ["n1", "n2", "n3"], leaders)
    assert n3.take == n1.hand_over  # the preferred node takes a released partition at once
    # A draining node hands over everything it leads, unbounded.
    draining = moves("n2", ["n1", "n3"], leaders, moves_max=1)
    assert len(draining.hand_over) == sum(1 for leader in leaders.values() if leader == "n2")


@settings(max_examples=30, deadline=None)
@given(node_ids)
def test_gc_shares_cover_every_prefix_exactly_once(nodes: list[str]) -> None:
    assert shares_cover(nodes)
    for node in nodes:
        assert set(prefix_share(node, nodes)) <= set(range(GC_PREFIXES))
    assert list(prefix_share("alone", [])) == list(range(GC_PREFIXES))
    assert list(prefix_share("draining", ["a", "b"])) == list(range(GC_PREFIXES))
    shares = [prefix_share(n, ["c", "a", "b"]) for n in ("a", "b", "c")]
    assert shares == [range(0, 333), range(333, 666), range(666, 1000)]


def test_a_lease_is_valid_until_ttl_minus_margin_after_the_renewal_was_sent() -> None:
    clock = LeaseClock(ttl_s=10.0, margin_fraction=0.2)
    assert not clock.valid(0.0)
    clock.renewed(sent_at=100.0)
    assert clock.deadline == 108.0
    assert clock.valid(107.9) and not clock.valid(108.0)
    clock.renewed(sent_at=99.0)  # a late answer to an older renewal never shortens it
    assert clock.deadline == 108.0
    clock.lost()
    assert not clock.valid(100.5)


def test_live_nodes_by_the_control_planes_clock() -> None:
    rows = [("a", 10.0, False), ("b", 5.0, False), ("c", 10.0, True)]
    assert live_nodes(rows, now=6.0) == (["a"], ["c"])
