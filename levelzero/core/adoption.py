"""Which L1 objects found in the bucket a partition may adopt (pure; `daemon/recover.py` does
the I/O).

An L1 object describes itself: its key names the topic, partition, offset range and the term of
the leader that wrote it (`keys.py`), and its body is an object of the L0 format with one
extent whose header carries the record count and checksum (`l0format.py`). So after a restore
(the metastore is older than the bucket) or the loss of the control plane (there is no
metastore), the L1 objects can be found again by listing `level_one/{topic}/{partition}/`.

Not every object there is data the partition acknowledged at those offsets:
- a zombie (a leader whose term ended) may upload an object after the next term's leader
  reconciled the same offsets: its catch-up is refused, and a crash can leave the object behind;
- after a restore, the bucket also holds what the lost history reconciled past the backup.

The term lineage settles the first (seed 004: a newer term's record wins over an older term's
late claim, whatever the arrival order): walking terms newest first, an object counts only if
it ends below where every newer term's kept objects begin. The second is settled by the caller,
by comparing the records with the placeholders the restored log acknowledged, and by starting
every adopting term above each term the bucket names, so that after a restore the newer history
always outranks the lost one. Where the restored history has not written yet (the records it
acknowledged above the restored high watermark are still in L0 when the control plane is lost
again), nothing outranks the lost history's objects: a restore leaves a mark in the bucket
(`keys.format_restore_key`) and a rebuild from the bucket alone drops them (`restored_history`).
"""

from __future__ import annotations

from collections.abc import Iterable

from .keys import L1Key


def lineage(keys: Iterable[L1Key]) -> list[L1Key]:
    """The keys of one partition that can belong to its term lineage, in the order to try them:
    by base offset, then newest term, then longest range."""
    by_term: dict[int, list[L1Key]] = {}
    partitions = set()
    for key in keys:
        assert key.base_offset <= key.last_offset, key
        partitions.add((key.topic, key.partition))
        by_term.setdefault(key.term, []).append(key)
    assert len(partitions) <= 1, f"keys of several partitions: {sorted(partitions)}"
    kept: list[L1Key] = []
    floor: int | None = None  # the lowest base offset of a newer term's kept keys
    for term in sorted(by_term, reverse=True):
        ours = [k for k in by_term[term] if floor is None or k.last_offset < floor]
        if ours:
            kept.extend(ours)
            low = min(k.base_offset for k in ours)
            floor = low if floor is None else min(floor, low)
    kept.sort(key=lambda k: (k.base_offset, -k.term, -k.last_offset))
    return kept


def restored_history(keys: Iterable[L1Key], restores: Iterable[tuple[int, int]]) -> list[L1Key]:
    """The keys of one partition that can belong to its history as its restores left it:
    `restores` holds a (term, high watermark) pair for each restore mark of the partition, and
    for each, an object of a term below the mark's whose range reaches its high watermark or
    beyond is dropped. Several marks (several restores) each apply.

    A restore of an older backup (taken at T0, the partition's high watermark H) discards the
    history written after T0; the restored history writes from term T on, and hands out offsets
    H, H+1, ... again. At or above H, an object of a term below T is the discarded history's
    (every one the restored history writes there is of term T or above) and holds other records
    than the restored history acknowledged there: served after a rebuild, they would be wrong
    data where the restored daemon's unreconciled records were (losing those is what a rebuild
    from the bucket alone does; serving others in their place is not). A whole object is dropped,
    not only its part at or above H: it could be adopted only as it is.
    Below H nothing is lost by keeping the rest: there both histories hold the records
    acknowledged before T0 (the discarded one reconciled them as the restored one would), so an
    object of either, of any term, ending below H holds the right records. And the restored
    history's own records below H stay covered by objects kept: the restored control plane's L1
    objects (all at or below its LRO, so ending below H), the lost history's objects the restore
    adopted as they are (ending below H, or they were copied), and the adoption's copies under its
    term (ending below H); what it reconciles after the restore is of term T or above."""
    marks = list(restores)
    assert all(term >= 1 and high_watermark >= 0 for term, high_watermark in marks), marks
    return [
        key
        for key in keys
        if not any(key.term < term and key.last_offset >= high_watermark for term, high_watermark in marks)
    ]


def starting_at(kept: list[L1Key], offset: int) -> list[L1Key]:
    """The kept keys whose range starts at `offset`, best first (`lineage`'s order)."""
    return [k for k in kept if k.base_offset == offset]


def next_start_after(kept: list[L1Key], offset: int) -> int | None:
    """The lowest base offset above `offset` among the kept keys (where data resumes after a
    gap: offsets no L1 object holds, e.g. a range an operator abandoned)."""
    return min((k.base_offset for k in kept if k.base_offset > offset), default=None)


def term_above(keys: Iterable[L1Key], current: int) -> int:
    """The lowest term above `current` and above every term `keys` name: the term an adopting
    step starts, so that anything written from then on outranks every object in the bucket."""
    return max([current, *(k.term for k in keys)]) + 1
