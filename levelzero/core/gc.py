"""GC selection (sans-IO): the cluster watermark `M` and which listed L0 objects may go.

`M = min(E - 1, min over partitions of M(p))`, where `E` is the cluster epoch snapshotted at the
start of the round. The cap protects partitions created after the snapshot: their creation epoch
is >= E, so every object holding their data has epoch >= E > M. A partition with no `M(p)` yet
blocks the round. Inside a prefix keys sort by epoch, so a scan stops at the first epoch > M.

Everything the GC actor decides lives here too: the range scan it lists with, when the next
round runs (`GcPacer`), what counts as throttling, and explain (why a key is or is not deleted,
which partitions hold M back and why). The actor only lists, deletes, sleeps and records.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from .errors import InvariantViolation
from .keys import L0_ROOT, PREFIX_COUNT, parse_l0_key

DELETE_BATCH_KEYS_MAX = 1000


@dataclass(frozen=True, slots=True)
class WatermarkDecision:
    cluster_epoch: int
    m: int | None  # None: no deletes this round
    blocked_by: tuple[str, ...] = ()  # partitions without an M(p) yet
    holders: tuple[str, ...] = ()  # partitions whose M(p) equals M ("cap" when E - 1 binds)

    @property
    def blocked(self) -> bool:
        return self.m is None


def compute_cluster_watermark(cluster_epoch: int, mps: Mapping[str, int | None]) -> WatermarkDecision:
    """`M` for one round. `mps` maps partition names to their published `M(p)`: any partition
    without one blocks the round; `M` is their minimum, capped at `E - 1` (a partition created
    after the snapshot has creation epoch >= E, and so have the objects holding its data)."""
    assert cluster_epoch >= 1, cluster_epoch
    blocked = tuple(sorted(name for name, mp in mps.items() if mp is None))
    if blocked:
        return WatermarkDecision(cluster_epoch, None, blocked_by=blocked)
    capped = cluster_epoch - 1
    if not mps:
        return WatermarkDecision(cluster_epoch, capped, holders=("cap",))
    low = min(mp for mp in mps.values() if mp is not None)
    m = min(low, capped)
    holders = [name for name, mp in mps.items() if mp == m]
    if m == capped:
        holders.append("cap")
    return WatermarkDecision(cluster_epoch, m, holders=tuple(sorted(holders)))


class MonotoneWatermark:
    """Remembers the highest `M` a GC has acted on and asserts it never decreases."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: int | None = None

    def observe(self, m: int | None) -> None:
        if m is None:
            return
        if self.value is not None and m < self.value:
            raise InvariantViolation(f"M fell from {self.value} to {m}")
        self.value = m


class ListedObject(Protocol):
    @property
    def key(self) -> str: ...

    @property
    def size(self) -> int: ...

    @property
    def last_modified(self) -> float: ...


class Verdict(enum.StrEnum):
    DELETE = "delete"
    TOO_YOUNG = "too_young"
    ABOVE_M = "above_m"


def classify(epoch: int, last_modified: float, m: int | None, now: float, grace_s: float) -> Verdict:
    if m is None or epoch > m:
        return Verdict.ABOVE_M
    if now - last_modified < grace_s:
        return Verdict.TOO_YOUNG
    return Verdict.DELETE


def batches(keys: list[str], size: int = DELETE_BATCH_KEYS_MAX) -> list[list[str]]:
    assert 1 <= size <= DELETE_BATCH_KEYS_MAX, size
    return [keys[i : i + size] for i in range(0, len(keys), size)]


def worker_prefixes(worker_index: int, worker_count: int, prefix_count: int = 1000) -> range:
    """The prefixes one of `worker_count` GC workers owns (a contiguous, disjoint share)."""
    assert 0 <= worker_index < worker_count <= prefix_count, (worker_index, worker_count)
    start = prefix_count * worker_index // worker_count
    stop = prefix_count * (worker_index + 1) // worker_count
    return range(start, stop)


# ---------------------------------------------------------------- scanning a range of prefixes

RANGE_END_CHAR = chr(ord("/") + 1)  # "0": `.../PPP0` sorts after every key under `.../PPP/`
MALFORMED_SAMPLE_MAX = 100


class Eligible(msgspec.Struct, frozen=True):
    """An L0 object (listed, or read from the catalog) the round may delete. A struct: a round
    makes one per key, and a frozen dataclass took six times as long to build."""

    key: str
    size: int
    epoch: int


def split_prefixes(prefixes: range, parts: int) -> list[range]:
    """Cut a worker's prefixes into at most `parts` contiguous, disjoint, non-empty ranges."""
    assert prefixes.step == 1 and len(prefixes) >= 1, prefixes
    assert parts >= 1, parts
    parts = min(parts, len(prefixes))
    n, start = len(prefixes), prefixes.start
    return [range(start + n * i // parts, start + n * (i + 1) // parts) for i in range(parts)]


GROUP_PREFIXES = 100  # one listing covers the prefixes sharing a first digit


@dataclass(slots=True)
class RangeScan:
    """Scans the L0 keys of a contiguous range of prefixes, in key order, page by page.

    A prefix ends at its first epoch above M (the rest of it is newer); one listing covers
    up to 100 prefixes (those sharing their first digit: list prefix `level_zero/data/D`): an
    empty prefix costs nothing, and a prefix that hit an epoch above M is skipped by restarting
    the listing after its last possible key. A sparse keyspace costs about ten list requests per
    round instead of a thousand. (A listing per digit, not one over the whole root, keeps each
    request narrow: servers that filter or walk by prefix, MinIO and moto, answer faster.)

    Drive it with `request()` (the `(prefix, start_after)` to list next) and `feed(page)` until
    `done`. It never yields an object with epoch > M or younger than the grace period.
    """

    prefixes: range
    m: int
    now: float
    grace_s: float
    listed: int = 0
    too_young: int = 0
    above_m: int = 0  # prefixes that stopped at an epoch above M
    malformed: int = 0
    malformed_sample: list[str] = field(default_factory=list)
    oldest_young_at: float | None = None
    pages: int = 0
    done: bool = False
    _group: int = 0  # the first digit of the prefixes being listed
    _cursor: str = ""
    _end: str | None = None
    _stopped_prefix: int | None = None

    def __post_init__(self) -> None:
        assert self.prefixes.step == 1 and len(self.prefixes) >= 1, self.prefixes
        assert self.prefixes.start >= 0 and self.prefixes.stop <= PREFIX_COUNT, self.prefixes
        self._end = None if self.prefixes.stop == PREFIX_COUNT else f"{L0_ROOT}{self.prefixes.stop:03d}"
        self._enter_group(self.prefixes.start)

    def _enter_group(self, prefix: int) -> None:
        """List from the start of `prefix` (every key of prefix PPP sorts after
        "level_zero/data/PPP"), or finish when the range has no more prefixes."""
        if prefix >= self.prefixes.stop:
            self.done = True
            return
        self._group = prefix // GROUP_PREFIXES
        self._cursor = f"{L0_ROOT}{prefix:03d}"

    def request(self) -> tuple[str, str]:
        """The `(prefix, start_after)` of the next list request."""
        assert not self.done, "request after the scan is done"
        return f"{L0_ROOT}{self._group}", self._cursor

    def feed(self, objects: Sequence[ListedObject], complete: bool) -> list[Eligible]:
        """Take one page (in key order) of the last request; `complete`: the store has nothing
        after it under the request's prefix. Returns the page's deletable objects."""
        assert not self.done, "feed after the scan is done"
        assert objects or complete, "an empty page must end the listing"
        self.pages += 1
        out: list[Eligible] = []
        for obj in objects:
            key = obj.key
            assert key > self._cursor, (key, self._cursor)  # the store lists in key order
            if self._end is not None and key >= self._end:
                self.done = True
                return out
            try:
                parsed = parse_l0_key(key)
            except ValueError:
                self.listed += 1
                self.malformed += 1
                if len(self.malformed_sample) < MALFORMED_SAMPLE_MAX:
                    self.malformed_sample.append(key)  # never ours to delete; explain reports it
                continue
            if parsed.prefix == self._stopped_prefix:
                continue  # the rest of a prefix already past M
            self.listed += 1
            verdict = classify(parsed.epoch, obj.last_modified, self.m, self.now, self.grace_s)
            if verdict is Verdict.DELETE:
                out.append(Eligible(key, obj.size, parsed.epoch))
            elif verdict is Verdict.TOO_YOUNG:
                self.too_young += 1
                if self.oldest_young_at is None or obj.last_modified < self.oldest_young_at:
                    self.oldest_young_at = obj.last_modified
            else:
                self.above_m += 1
                self._stopped_prefix = parsed.prefix
        next_group = (self._group + 1) * GROUP_PREFIXES
        if complete:
            self._enter_group(next_group)
            return out
        self._cursor = objects[-1].key
        stopped = self._stopped_prefix
        if stopped is not None and self._cursor.startswith(f"{L0_ROOT}{stopped:03d}/"):
            if stopped + 1 == next_group:
                self._enter_group(next_group)  # the group's last prefix is past M
            else:
                self._cursor = f"{L0_ROOT}{stopped:03d}{RANGE_END_CHAR}"
                if self._end is not None and self._cursor >= self._end:
                    self.done = True
        return out


# ---------------------------------------------------------------- throttling

_THROTTLE_MARKERS = (
    "slowdown",
    "slow down",
    "http 503",
    "(http 503)",
    "503 service unavailable",
    "toomanyrequests",
    "requestlimitexceeded",
    "throttl",
)


def is_throttling(message: str) -> bool:
    """Whether a store error text says "slow down" (S3 SlowDown / 503, throttling codes)."""
    text = message.lower()
    return any(marker in text for marker in _THROTTLE_MARKERS)


# ---------------------------------------------------------------- pacing


class PaceReason(enum.StrEnum):
    PROGRESS = "progress"  # deleted something: come back after the interval
    BACKLOG = "backlog"  # eligible objects are left (errors, throttling): after the interval
    IDLE = "idle"  # nothing eligible (or blocked, or failed): back off
    YOUNG = "young"  # objects are waiting out the grace period: wake when the oldest is old


@dataclass(frozen=True, slots=True)
class Pace:
    delay_s: float
    reason: PaceReason


YOUNG_WAKE_MIN_S = 0.05  # never spin on an object the clock says is just about old enough


class GcPacer:
    """When the next GC round runs (sans-IO; the actor sleeps, this decides).

    After progress the next round comes after `interval_s`; with nothing eligible the wait
    doubles up to `idle_backoff_max_s`; an object waiting out the grace period caps the wait at
    the moment it becomes old enough. Every wait is jittered by +-`jitter_fraction`, so GC
    instances started together drift apart.
    """

    __slots__ = ("interval_s", "idle_backoff_max_s", "grace_s", "jitter_fraction", "idle_backoff_s")

    def __init__(
        self, interval_s: float, idle_backoff_max_s: float, grace_s: float, jitter_fraction: float
    ) -> None:
        assert 0 < interval_s <= idle_backoff_max_s, (interval_s, idle_backoff_max_s)
        assert grace_s >= 0 and 0 <= jitter_fraction < 1, (grace_s, jitter_fraction)
        self.interval_s = interval_s
        self.idle_backoff_max_s = idle_backoff_max_s
        self.grace_s = grace_s
        self.jitter_fraction = jitter_fraction
        self.idle_backoff_s = interval_s  # the wait of the next idle round

    def first(self, jitter_unit: float) -> Pace:
        return Pace(self._jitter(self.interval_s, jitter_unit), PaceReason.PROGRESS)

    def after_round(
        self,
        *,
        deleted: int,
        backlog: int,
        failed: bool,
        oldest_young_at: float | None,
        now: float,
        jitter_unit: float,
    ) -> Pace:
        """`jitter_unit` is uniform in [-1, 1] (the caller's seeded rng)."""
        assert -1.0 <= jitter_unit <= 1.0, jitter_unit
        assert deleted >= 0 and backlog >= 0, (deleted, backlog)
        if not failed and (deleted > 0 or backlog > 0):
            self.idle_backoff_s = self.interval_s
            delay_s = self.interval_s
            reason = PaceReason.PROGRESS if deleted > 0 else PaceReason.BACKLOG
        else:
            delay_s = self.idle_backoff_s
            self.idle_backoff_s = min(self.idle_backoff_s * 2, self.idle_backoff_max_s)
            reason = PaceReason.IDLE
        delay_s = self._jitter(delay_s, jitter_unit)
        if oldest_young_at is not None:
            young_s = max(oldest_young_at + self.grace_s - now, YOUNG_WAKE_MIN_S)
            if young_s < delay_s:
                delay_s, reason = young_s, PaceReason.YOUNG
        assert delay_s > 0, delay_s
        return Pace(delay_s, reason)

    def _jitter(self, delay_s: float, jitter_unit: float) -> float:
        return delay_s * (1 + self.jitter_fraction * jitter_unit)


BLOCKED_WARNING_ROUNDS = 10  # a GC blocked this many rounds in a row is worth a warning,
BLOCKED_WARNING_S = 300.0  # ... or blocked this long, whichever comes first


class BlockedChange(enum.StrEnum):
    STAYS_BLOCKED = "stays_blocked"  # blocked long enough to say so (said once a spell)
    UNBLOCKED = "unblocked"  # a spell that was said is over


class BlockedWatch:
    """When the GC's being blocked (no `M`: a partition has no `M(p)`) is worth a warning
    (sans-IO; the actor logs). A round or two without `M` is normal (a partition just created,
    a node starting); a spell of `BLOCKED_WARNING_ROUNDS` rounds or `BLOCKED_WARNING_S` seconds
    is said once, and its end once."""

    __slots__ = ("rounds", "since", "said")

    def __init__(self) -> None:
        self.rounds = 0  # rounds blocked in a row
        self.since: float | None = None  # when the first of them ran
        self.said = False

    def observe(self, blocked: bool, now: float) -> BlockedChange | None:
        if not blocked:
            said = self.said
            self.rounds, self.since, self.said = 0, None, False
            return BlockedChange.UNBLOCKED if said else None
        self.rounds += 1
        if self.since is None:
            self.since = now
        long_enough = self.rounds >= BLOCKED_WARNING_ROUNDS or now - self.since >= BLOCKED_WARNING_S
        if long_enough and not self.said:
            self.said = True
            return BlockedChange.STAYS_BLOCKED
        return None

    def blocked_for_s(self, now: float) -> float:
        return 0.0 if self.since is None else max(now - self.since, 0.0)


# ---------------------------------------------------------------- explain


class ExplainVerdict(enum.StrEnum):
    DELETABLE = "deletable"
    ABOVE_M = "above M"
    BLOCKED = "blocked"  # no M this round: some partition has no M(p) yet
    TOO_YOUNG = "too young"
    MALFORMED = "malformed key"
    NOT_FOUND = "not found"


CAP_HOLDER = "cap"
HOLDERS_SHOWN_MAX = 50


@dataclass(frozen=True, slots=True)
class PartitionFacts:
    """What explain needs to know about one partition (the actor copies it from its view)."""

    name: str
    state_mp: int | None  # M(p) of the state machine, before reader pins
    pinned_mp: int | None  # the lowest reader pin, when it holds the published M(p) lower
    lro: int
    high_watermark: int
    max_applied_epoch: int | None
    reconcile_failing: str | None = None  # `ReconcileFailing.describe()` while it is failing
    reconcile_failing_since: float | None = None  # and its `since` (wall time)


NO_LIVE_LEADER = ""  # in `leaders`: the partition has no live leader (it is moving)


def hold_reason(mp: int | None, facts: PartitionFacts | None, leader: str | None = None) -> str:
    """Why a partition's published `M(p)` is where it is. Without `facts` (another node leads
    it, in a cluster), where it is led: `leader` is that node's id, NO_LIVE_LEADER, or None
    when nobody knows (a single node without the partition's actor)."""
    elsewhere = None
    if facts is None:
        if leader is None:
            elsewhere = "no local view of the partition"
        elif leader == NO_LIVE_LEADER:
            elsewhere = "no live leader (moving): its next leader publishes its M(p)"
        else:
            elsewhere = f"led by node {leader} (its explain says why)"
    if mp is None or (facts is not None and facts.state_mp is None):
        return "no epoch yet" if elsewhere is None or leader is None else f"no epoch yet; {elsewhere}"
    if elsewhere is not None:
        return elsewhere
    assert facts is not None
    if facts.pinned_mp is not None:
        return f"pinned by an L0 reader (at {facts.pinned_mp}; unpinned M(p) is {facts.state_mp})"
    if facts.lro + 1 < facts.high_watermark:
        unreconciled = f"unreconciled data (LRO {facts.lro}, high watermark {facts.high_watermark})"
        if facts.reconcile_failing is not None:
            return f"{unreconciled}; {facts.reconcile_failing}"
        return unreconciled
    return "idle: waiting for the housekeeper to advance its epoch"


class Holder(msgspec.Struct, frozen=True):
    """One partition (or the cap) that holds M, or an asked-about epoch, back."""

    partition: str  # a partition name, or "cap"
    mp: int | None  # its published M(p) (for the cap: E - 1)
    reason: str
    mp_minus_m: int | None  # M(p) - M: how far above M it is (0 for a holder of M)
    behind: int | None  # asked epoch - M(p): how far M(p) must rise for the epoch to go
    # While its reconciliation fails: since when (wall time), also in `reason` as a UTC time.
    reconcile_failing_since: float | None = None


class Explanation(msgspec.Struct, frozen=True):
    cluster_epoch: int
    m: int | None
    verdict: str | None  # an ExplainVerdict; None when neither a key nor an epoch was asked
    detail: str
    key: str | None = None
    epoch: int | None = None
    age_s: float | None = None
    owned: bool | None = None  # whether this GC worker's prefixes include the key's
    blocked_by: list[str] = []
    holders: list[Holder] = []
    holders_total: int = 0


def explain(
    decision: WatermarkDecision,
    mps: Mapping[str, int | None],
    facts: Mapping[str, PartitionFacts],
    *,
    key: str | None = None,
    epoch: int | None = None,
    obj: ListedObject | None = None,
    now: float = 0.0,
    grace_s: float = 0.0,
    prefixes: range | None = None,
    leaders: Mapping[str, str] | None = None,
) -> Explanation:
    """Why a key (or any object of an epoch) is or is not deleted, and what holds M back.

    `obj` is the key's listing entry (None: not in the store); ignored without a key.
    `leaders`: in a cluster, partition -> the node leading it (or NO_LIVE_LEADER), for the
    holders without `facts`.
    """
    assert key is None or epoch is None, "ask about a key or an epoch, not both"
    m, cluster_epoch = decision.m, decision.cluster_epoch
    owned: bool | None = None
    age_s: float | None = None
    if key is not None:
        try:
            parsed = parse_l0_key(key)
        except ValueError as exc:
            return Explanation(
                cluster_epoch,
                m,
                ExplainVerdict.MALFORMED,
                f"{exc}; the GC never deletes it",
                key=key,
                blocked_by=list(decision.blocked_by),
            )
        epoch = parsed.epoch
        owned = None if prefixes is None else parsed.prefix in prefixes
        if obj is not None:
            age_s = now - obj.last_modified
    verdict, detail = _verdict(decision, key, epoch, obj, age_s, grace_s)
    holders = _holders(decision, mps, facts, epoch, leaders or {})
    return Explanation(
        cluster_epoch,
        m,
        verdict,
        detail,
        key=key,
        epoch=epoch,
        age_s=age_s,
        owned=owned,
        blocked_by=list(decision.blocked_by),
        holders=holders[:HOLDERS_SHOWN_MAX],
        holders_total=len(holders),
    )


def _verdict(
    decision: WatermarkDecision,
    key: str | None,
    epoch: int | None,
    obj: ListedObject | None,
    age_s: float | None,
    grace_s: float,
) -> tuple[ExplainVerdict | None, str]:
    m = decision.m
    if m is None:
        why = f"no deletes: {', '.join(decision.blocked_by)} without an M(p) yet"
        return (None if epoch is None else ExplainVerdict.BLOCKED), why
    if epoch is None:
        held = ", ".join(decision.holders)
        return None, f"M = {m} (cluster epoch {decision.cluster_epoch}), held by {held}"
    if key is not None and obj is None:
        state = "at or below" if epoch <= m else "above"
        why = f"no such object (already deleted?); epoch {epoch} is {state} M = {m}"
        return ExplainVerdict.NOT_FOUND, why
    if epoch > decision.cluster_epoch:
        # (no object can have it: every write's epoch is at most the cluster epoch)
        return ExplainVerdict.ABOVE_M, (
            f"epoch {epoch} is above the cluster epoch {decision.cluster_epoch}: no object has it "
            f"yet (M = {m})"
        )
    if epoch > m:
        return ExplainVerdict.ABOVE_M, f"epoch {epoch} is above M = {m}"
    if key is None:  # (the objects of the epoch are not listed: some may be gone already)
        return ExplainVerdict.DELETABLE, (
            f"epoch {epoch} <= M = {m}: every object of it is deletable, and a GC round deletes "
            f"those still in the bucket (past the grace of {grace_s:g} s)"
        )
    if age_s is not None and age_s < grace_s:
        return (
            ExplainVerdict.TOO_YOUNG,
            f"epoch {epoch} <= M = {m}, but the object is {age_s:.1f} s old "
            f"(grace {grace_s:g} s): deletable in {grace_s - age_s:.1f} s",
        )
    return ExplainVerdict.DELETABLE, f"epoch {epoch} <= M = {m}: the next round deletes it"


def _failing_since(mp: int | None, facts: PartitionFacts | None) -> float | None:
    """`reconcile_failing_since` when `hold_reason` names the failing reconciliation."""
    if mp is None or facts is None or facts.reconcile_failing is None:
        return None
    return facts.reconcile_failing_since if facts.reconcile_failing in hold_reason(mp, facts) else None


def _holders(
    decision: WatermarkDecision,
    mps: Mapping[str, int | None],
    facts: Mapping[str, PartitionFacts],
    epoch: int | None,
    leaders: Mapping[str, str],
) -> list[Holder]:
    """With an epoch: what keeps M below it. Without: what M equals (and the blockers)."""
    m, capped = decision.m, decision.cluster_epoch - 1

    def holds(mp: int | None) -> bool:
        if mp is None:
            return True
        return mp < epoch if epoch is not None else mp == m

    out = [
        Holder(
            name,
            mp,
            hold_reason(mp, facts.get(name), leaders.get(name)),
            None if mp is None or m is None else mp - m,
            None if mp is None or epoch is None else epoch - mp,
            _failing_since(mp, facts.get(name)),
        )
        for name, mp in mps.items()
        if holds(mp)
    ]
    out.sort(key=lambda h: (h.mp is not None, h.mp or 0, h.partition))
    if (epoch is not None and epoch > capped) or (epoch is None and m is not None and m == capped):
        out.append(
            Holder(
                CAP_HOLDER,
                capped,
                f"capped at cluster epoch - 1 (cluster epoch {decision.cluster_epoch})",
                None if m is None else capped - m,
                None if epoch is None else epoch - capped,
            )
        )
    return out
