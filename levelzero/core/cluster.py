"""The cluster's pure rules, sans-IO: who should lead each partition, which node's GC scans which
key prefixes, and when a node must stop acting on a lease.

- `preferred_leader`: rendezvous (highest-random-weight) hashing of a partition over the live,
  non-draining nodes. Every node computes the same answer from the same membership; a node
  joining takes about 1/N of the partitions, a node leaving gives away only its own, and nothing
  else moves.
- `moves`: the partitions a node should take and hand over in one round, towards the preferred
  assignment, at most `moves_max` hand-overs a round (a join is absorbed gradually); a
  partition without a live leader is taken at once by its preferred node (there is nobody to
  wait for).
- `prefix_share`: the GC key prefixes a node scans, a contiguous share by its place among the
  live nodes. During a membership change two nodes may scan one prefix (deletes are idempotent)
  or, for a round, none; once the views agree every prefix has one owner again, so nothing is
  skipped for longer than a change takes.
- `LeaseClock`: a leader's local deadline. A lease is renewed with the control plane's clock;
  the node, whose clock may differ, counts from the moment it SENT the renewal by its own
  monotonic clock, minus a margin for clock rate drift: the control plane cannot have expired the
  lease before then.

The database fences what matters (appends and term starts are term-checked); these rules keep
the cluster from needing it often.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .gc import worker_prefixes

MOVES_PER_ROUND_MAX = 8  # hand-overs one node starts per round (a join is absorbed gradually)
LEASE_MARGIN_FRACTION = 0.2  # of the TTL: the local deadline ends this much before the lease
# How far a node's monotonic clock may run slow or fast against the control plane's (a rate): a
# local deadline of (1 - LEASE_MARGIN_FRACTION) TTL on a clock this slow still ends before the
# lease does (0.8 / 0.9 < 1), with room for the renewal's own latency.
CLOCK_RATE_DRIFT_MAX = 0.1
GC_PREFIXES = 1000


def _weight(node_id: str, item: str) -> int:
    digest = hashlib.blake2b(f"{node_id}\0{item}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def preferred_leader(partition: str, nodes: Sequence[str]) -> str | None:
    """The node that should lead `partition` among `nodes` (live, non-draining); None if none."""
    if not nodes:
        return None
    return max(nodes, key=lambda node: (_weight(node, partition), node))


@dataclass(frozen=True, slots=True)
class Moves:
    take: tuple[str, ...]  # partitions to acquire (free, expired, or released to us)
    hand_over: tuple[str, ...]  # partitions we lead and should release, drained first


def moves(
    me: str,
    nodes: Sequence[str],
    leaders: Mapping[str, str | None],
    *,
    moves_max: int = MOVES_PER_ROUND_MAX,
) -> Moves:
    """One round of `me`'s rebalancing. `nodes`: live, non-draining node ids (`me` among them
    unless it is draining); `leaders`: every partition -> the live node holding its lease, or
    None. A draining `me` hands over everything it leads, unbounded (a shutdown does not wait)."""
    assert moves_max >= 1, moves_max
    mine = sorted(p for p, leader in leaders.items() if leader == me)
    if me not in nodes:
        return Moves((), tuple(mine))
    take = sorted(p for p, leader in leaders.items() if leader is None and preferred_leader(p, nodes) == me)
    hand_over = [p for p in mine if preferred_leader(p, nodes) != me]
    return Moves(tuple(take), tuple(hand_over[:moves_max]))


def prefix_share(me: str, nodes: Sequence[str], prefixes: int = GC_PREFIXES) -> range:
    """The key prefixes `me`'s GC scans: a contiguous share by `me`'s place among the sorted
    live nodes (listings stay contiguous). With no membership known, or `me` not among them
    (draining), every prefix: scanning too much is only slower, never unsafe."""
    assert prefixes >= 1, prefixes
    ordered = sorted(set(nodes))
    if me not in ordered:
        return range(prefixes)
    return worker_prefixes(ordered.index(me), len(ordered), prefixes)


def shares_cover(nodes: Sequence[str], prefixes: int = GC_PREFIXES) -> bool:
    """Every prefix has exactly one owner among `nodes` (a property the tests check)."""
    owned: list[int] = []
    for node in nodes:
        owned.extend(prefix_share(node, nodes, prefixes))
    return sorted(owned) == list(range(prefixes))


class LeaseClock:
    """A leader's local view of its lease: valid until the local deadline, counted from when
    the successful renewal was sent."""

    __slots__ = ("ttl_s", "margin_s", "_deadline")

    def __init__(self, ttl_s: float, margin_fraction: float = LEASE_MARGIN_FRACTION) -> None:
        assert ttl_s > 0, ttl_s
        assert 0 <= margin_fraction < 1, margin_fraction
        self.ttl_s = ttl_s
        self.margin_s = ttl_s * margin_fraction
        self._deadline: float | None = None

    def renewed(self, sent_at: float) -> None:
        """A renewal sent at local monotonic time `sent_at` succeeded."""
        deadline = sent_at + self.ttl_s - self.margin_s
        if self._deadline is None or deadline > self._deadline:
            self._deadline = deadline

    def valid(self, now: float) -> bool:
        return self._deadline is not None and now < self._deadline

    def lost(self) -> None:
        """The control plane said the lease is gone: invalid at once."""
        self._deadline = None

    @property
    def deadline(self) -> float | None:
        return self._deadline


def live_nodes(rows: Iterable[tuple[str, float, bool]], now: float) -> tuple[list[str], list[str]]:
    """(live non-draining, live draining) node ids from (id, lease_expires_at, draining) rows,
    by the control plane's `now`; sorted."""
    active: list[str] = []
    draining: list[str] = []
    for node_id, expires_at, is_draining in rows:
        if now < expires_at:
            (draining if is_draining else active).append(node_id)
    return sorted(active), sorted(draining)
