"""GC selection (sans-IO): the cluster watermark `M` and which listed L0 objects may go.

`M = min(E - 1, min over partitions of M(p))`, where `E` is the cluster epoch snapshotted at the
start of the round. The cap protects partitions created after the snapshot: their creation epoch
is >= E, so every object holding their data has epoch >= E > M. A partition with no `M(p)` yet
blocks the round. Inside a prefix keys sort by epoch, so a scan stops at the first epoch > M.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from .errors import InvariantViolation
from .keys import parse_l0_key

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


def compute_cluster_watermark(
    cluster_epoch: int, mps: Mapping[str, int | None], *, cap: bool = True
) -> WatermarkDecision:
    """`M` for one round. `mps` maps partition names to their published `M(p)`.

    `cap=False` exists only for the simulation's mutation testing (it is the bug it must catch).
    """
    assert cluster_epoch >= 1, cluster_epoch
    blocked = tuple(sorted(name for name, mp in mps.items() if mp is None))
    if blocked:
        return WatermarkDecision(cluster_epoch, None, blocked_by=blocked)
    capped = cluster_epoch - 1
    if not mps:
        return WatermarkDecision(cluster_epoch, capped if cap else None, holders=("cap",))
    low = min(mp for mp in mps.values() if mp is not None)
    m = min(low, capped) if cap else low
    holders = [name for name, mp in mps.items() if mp == m]
    if cap and m == capped:
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


@dataclass(slots=True)
class PrefixScan:
    """The outcome of scanning one prefix's listing (in key order) against `M`."""

    deletable: list[ListedObject] = field(default_factory=list)
    too_young: int = 0
    above_m: int = 0
    listed: int = 0
    malformed: list[str] = field(default_factory=list)
    oldest_young_at: float | None = None  # last_modified of the oldest too-young object
    stopped: bool = False  # hit an epoch above M: the rest of the prefix is newer

    def feed(self, obj: ListedObject, m: int | None, now: float, grace_s: float) -> bool:
        """Classify one listed object. Returns False once the prefix needs no more listing."""
        assert not self.stopped, "feed after the scan stopped"
        self.listed += 1
        try:
            epoch = parse_l0_key(obj.key).epoch
        except ValueError:
            self.malformed.append(obj.key)  # never ours to delete; explain reports it
            return True
        verdict = classify(epoch, obj.last_modified, m, now, grace_s)
        if verdict is Verdict.DELETE:
            self.deletable.append(obj)
        elif verdict is Verdict.TOO_YOUNG:
            self.too_young += 1
            if self.oldest_young_at is None or obj.last_modified < self.oldest_young_at:
                self.oldest_young_at = obj.last_modified
        else:
            self.above_m += 1
            self.stopped = True
        return not self.stopped


def scan_prefix(
    objects: Iterable[ListedObject], m: int | None, now: float, grace_s: float
) -> PrefixScan:
    scan = PrefixScan()
    for obj in objects:
        if not scan.feed(obj, m, now, grace_s):
            break
    return scan


def batches(keys: list[str], size: int = DELETE_BATCH_KEYS_MAX) -> list[list[str]]:
    assert 1 <= size <= DELETE_BATCH_KEYS_MAX, size
    return [keys[i : i + size] for i in range(0, len(keys), size)]


def worker_prefixes(worker_index: int, worker_count: int, prefix_count: int = 1000) -> range:
    """The prefixes one of `worker_count` GC workers owns (a contiguous, disjoint share)."""
    assert 0 <= worker_index < worker_count <= prefix_count, (worker_index, worker_count)
    start = prefix_count * worker_index // worker_count
    stop = prefix_count * (worker_index + 1) // worker_count
    return range(start, stop)
