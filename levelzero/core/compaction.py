"""Compaction of reconciled L1 data (seed 004), pure: the cleaner-offset map and its lineage
check, which records a compaction keeps, and when a partition is worth compacting.

**The cleaner-offset map.** Each compaction result names, per term, the data offset the
cleaning had reached under that term: `{term: cleaned_to}`. The control plane keeps the map of
the last accepted result and accepts a new one only if it lies within the term lineage
(`cleaner_map_refusal`): it was written under the partition's current term, it carries every
earlier term's entry exactly as accepted (an earlier term's range ended where its last accepted
result put it), and its own term's entry does not go back. A zombie leader's result (an older
term) is refused whatever the arrival order: once a later term has begun, the older term's
range is closed at what was accepted for it — seed 004's table: B's `{0: 100, 1: 155}` stands,
A's late `{0: 123}` is refused before or after it.

**What a compaction keeps.** Offsets never change: a compaction keeps, of the records in the
range it cleans, the latest record per key (a later offset wins), drops the rest, and leaves
gaps where they were (a fetch at a removed offset returns the next record present, as in
Kafka). A tombstone (a null value) is kept until it is older than `delete.retention.ms`, then
dropped. The key map holds a 16-byte BLAKE2b digest per distinct key, at most
`key_map_entries_max` of them (16 MiB of digests and offsets at the default): a range with more
distinct keys is cleaned only up to the record before the first key that did not fit, as Kafka's
cleaner stops where its offset map fills; the next pass goes on from there.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec

from .errors import CorruptData
from .l0format import NO_TIMESTAMP, Record, build_object, checksum, decode_extent, encode_extent, read_header

# Distinct keys one pass maps, at most (a digest and an offset each: ~100 bytes in a dict).
KEY_MAP_ENTRIES_MAX = 100_000
KEY_DIGEST_BYTES = 16


def key_digest(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=KEY_DIGEST_BYTES).digest()


def key_digests(records: Sequence[Record]) -> list[bytes | None]:
    """Each record's key digest (None: no key), computed once for a pass's two steps and once
    per distinct key (a changelog repeats its keys; the cache holds the keys the records
    already hold, and a digest each)."""
    keys = [r.key for r in records]
    cache: dict[bytes | None, bytes | None] = dict.fromkeys(keys)
    blake2b = hashlib.blake2b
    for key in cache:
        if key is not None:
            cache[key] = blake2b(key, digest_size=KEY_DIGEST_BYTES).digest()
    return list(map(cache.__getitem__, keys))


# ---------------------------------------------------------------------- the cleaner-offset map


def cleaner_map_refusal(
    accepted: Mapping[int, int], current_term: int, writer_term: int, claim: Mapping[int, int]
) -> str | None:
    """Why the control plane refuses a compaction result of `writer_term` claiming `claim`,
    given the accepted map and the partition's current term; None: it lies within the lineage
    and becomes the accepted map."""
    assert current_term >= 0 and writer_term >= 0, (current_term, writer_term)
    assert all(t <= current_term for t in accepted), (accepted, current_term)
    if writer_term != current_term:
        return f"written under term {writer_term}, the partition is at term {current_term}: a zombie's result"
    if writer_term not in claim:
        return f"the map {dict(claim)} has no entry for its own term {writer_term}"
    if any(t > writer_term for t in claim):
        return f"the map {dict(claim)} names a term above its writer's {writer_term}"
    terms = sorted(claim)
    if any(claim[a] > claim[b] for a, b in zip(terms, terms[1:], strict=False)):
        return f"the map {dict(claim)} goes back from one term to the next"
    for term, end in accepted.items():
        if term < writer_term and claim.get(term) != end:
            return f"term {term}'s range ended at {end}, the map claims {claim.get(term)}"
    for term in claim:
        if term < writer_term and term not in accepted:
            return f"term {term} never had a result accepted, the map claims {claim[term]}"
    if claim[writer_term] < accepted.get(writer_term, -1):
        done = accepted[writer_term]
        return f"term {writer_term} already cleaned to {done}, the map claims {claim[writer_term]}"
    return None


def extend_cleaner_map(accepted: Mapping[int, int], writer_term: int, cleaned_to: int) -> dict[int, int]:
    """The map a leader of `writer_term` claims after cleaning up to `cleaned_to`: every earlier
    term's accepted entry, carried forward as it is, and its own."""
    assert cleaned_to >= max(accepted.values(), default=-1), (accepted, cleaned_to)
    claim = {t: end for t, end in accepted.items() if t < writer_term}
    claim[writer_term] = cleaned_to
    return claim


def cleaned_to(accepted: Mapping[int, int]) -> int:
    """The offset the cleaning has reached: the newest term's entry (-1: never cleaned)."""
    return accepted[max(accepted)] if accepted else -1


# ---------------------------------------------------------------------- what a pass keeps


@dataclass(frozen=True, slots=True)
class Retained:
    """The records a pass keeps, in offset order, and the offset it cleaned up to."""

    offsets: list[int]
    records: list[Record]
    clean_upto: int  # the last offset the pass decided on (records above it were not looked at)
    removed: int
    tombstones_dropped: int


def clean_limit(
    offsets: Sequence[int],
    records: Sequence[Record],
    written_at_ms: Sequence[int],
    reconciled_upto: int,
    now_ms: int,
    min_lag_ms: int,
    key_map_entries_max: int = KEY_MAP_ENTRIES_MAX,
    digests: Sequence[bytes | None] | None = None,
) -> int:
    """The last offset a pass may clean: at or below the reconciled offset, below the first
    record younger than `min.compaction.lag.ms`, and below the first key the key map cannot
    hold. -1 (or below the range) when nothing may be cleaned."""
    digests = key_digests(records) if digests is None else digests
    assert len(offsets) == len(records) == len(written_at_ms) == len(digests)
    # The common case at a list's speed: nothing young below the reconciled offset and every
    # key fits the map; otherwise the walk below finds where the pass must stop.
    n = bisect.bisect_right(offsets, reconciled_upto)
    young_from = now_ms - min_lag_ms  # a record whose time is above this is too young
    if n:
        times = [r.timestamp_ms for r in records[:n]]
        old = max(times) <= young_from and (NO_TIMESTAMP not in times or max(written_at_ms[:n]) <= young_from)
        if old:
            distinct = set(digests[:n])
            distinct.discard(None)
            if len(distinct) <= key_map_entries_max:
                return offsets[n - 1]
    return _clean_limit_walk(
        offsets, records, written_at_ms, reconciled_upto, young_from, key_map_entries_max, digests
    )


def _clean_limit_walk(
    offsets: Sequence[int],
    records: Sequence[Record],
    written_at_ms: Sequence[int],
    reconciled_upto: int,
    young_from: int,
    key_map_entries_max: int,
    digests: Sequence[bytes | None],
) -> int:
    limit = -1
    seen: set[bytes] = set()
    for offset, record, written, digest in zip(offsets, records, written_at_ms, digests, strict=True):
        time_ms = written if record.timestamp_ms == NO_TIMESTAMP else record.timestamp_ms
        if offset > reconciled_upto or time_ms > young_from:
            break
        if digest is None:
            limit = offset  # written before the topic was compacted: dropped, as Kafka's cleaner does
            continue
        if digest not in seen and len(seen) >= key_map_entries_max:
            break
        seen.add(digest)
        limit = offset
    return limit


def retain(
    offsets: Sequence[int],
    records: Sequence[Record],
    written_at_ms: Sequence[int],
    clean_upto: int,
    now_ms: int,
    delete_retention_ms: int,
    digests: Sequence[bytes | None] | None = None,
) -> Retained:
    """Keep, of the records at or below `clean_upto`, the latest per key (tombstones until
    `delete.retention.ms`), and every record above it. The range's last record always stays
    (as Kafka never cleans its active segment): a compacted object ends on a record, so a
    fetch inside it always finds one."""
    assert len(offsets) == len(records) == len(written_at_ms)
    assert sorted(set(offsets)) == list(offsets), "offsets must rise"
    assert offsets, "a pass cleans at least one record"
    digests = key_digests(records) if digests is None else digests
    assert len(digests) == len(records)
    # The records at or below clean_upto are the first `cut`; of those, the latest index per key
    # (dict keeps the last value given for a key). No key: written before the topic was
    # compacted, dropped as Kafka's cleaner drops it.
    cut = bisect.bisect_right(offsets, clean_upto)
    latest = dict(zip(digests[:cut], range(cut), strict=True))
    latest.pop(None, None)
    last = len(offsets) - 1
    keep: list[int] = []
    tombstones_dropped = 0
    for i in sorted(latest.values()):
        record = records[i]
        expired = record.value is None and i != last
        if expired and now_ms - _record_time(record, written_at_ms[i]) >= delete_retention_ms:
            tombstones_dropped += 1
            continue  # a tombstone past delete.retention.ms
        keep.append(i)
    if cut and last < cut and (not keep or keep[-1] != last):
        keep.append(last)  # the range's last record always stays
    keep.extend(range(cut, len(offsets)))
    kept_offsets = [offsets[i] for i in keep]
    kept = [records[i] for i in keep]
    assert len(kept) <= len(records)
    assert len(kept) <= len(latest) + (len(offsets) - cut) + 1  # + the last
    return Retained(kept_offsets, kept, clean_upto, len(records) - len(kept), tombstones_dropped)


def _record_time(record: Record, written_at_ms: int) -> int:
    """A record's time: its timestamp, or when its L1 object was written if it has none."""
    return written_at_ms if record.timestamp_ms == NO_TIMESTAMP else record.timestamp_ms


# ---------------------------------------------------------------------- when


def dirty_ratio(clean_bytes: int, dirty_bytes: int) -> float:
    """Kafka's cleanable ratio: the bytes not yet cleaned over all bytes of the log's head."""
    assert clean_bytes >= 0 and dirty_bytes >= 0, (clean_bytes, dirty_bytes)
    total = clean_bytes + dirty_bytes
    return dirty_bytes / total if total else 0.0


def compaction_due(
    clean_bytes: int,
    dirty_bytes: int,
    min_cleanable_dirty_ratio: float,
    dirty_age_ms: int = 0,
    max_compaction_lag_ms: int | None = None,
) -> bool:
    """Kafka's rule: a pass is due when the dirty ratio reaches `min.cleanable.dirty.ratio`, or,
    whatever the ratio, when the oldest dirty data (`dirty_age_ms`, from its write to L1) is at
    least `max.compaction.lag.ms` old (None: no such bound)."""
    assert 0.0 <= min_cleanable_dirty_ratio <= 1.0, min_cleanable_dirty_ratio
    assert dirty_age_ms >= 0, dirty_age_ms
    if dirty_bytes <= 0:
        return False
    if max_compaction_lag_ms is not None and dirty_age_ms >= max_compaction_lag_ms:
        return True
    return dirty_ratio(clean_bytes, dirty_bytes) >= min_cleanable_dirty_ratio


# ---------------------------------------------------------------------- runs


def contiguous_runs(offsets: Sequence[int]) -> list[tuple[int, int]]:
    """(first offset, count) of each run of consecutive offsets: a compacted object's layout."""
    runs: list[tuple[int, int]] = []
    for offset in offsets:
        if runs and runs[-1][0] + runs[-1][1] == offset:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            assert not runs or offset > runs[-1][0] + runs[-1][1], (runs[-1], offset)
            runs.append((offset, 1))
    assert sum(n for _, n in runs) == len(offsets)
    return runs


# ---------------------------------------------------------------------- the compacted L1 object

# A compacted L1 object holds two extents: its records (as any L1 object's single extent), then
# its runs, `[[first offset, count], ...]`, so each record's offset is known without storing one
# per record. An object with one extent is a reconciler's: its records are at base, base + 1, ...
_runs_encoder = msgspec.msgpack.Encoder()
_runs_decoder = msgspec.msgpack.Decoder(list[tuple[int, int]])


def build_compacted_object(term: int, pid: int, offsets: Sequence[int], records: Sequence[Record]) -> bytes:
    assert offsets and len(offsets) == len(records), (len(offsets), len(records))
    runs = contiguous_runs(offsets)
    data, _ = build_object(
        term, [(pid, encode_extent(records), len(records)), (pid, _runs_encoder.encode(runs), len(runs))]
    )
    return data


def l1_object_runs(data: bytes, base_offset: int, where: str) -> list[tuple[int, list[Record]]]:
    """(first offset, records at consecutive offsets) of each run of an L1 object, verified."""
    header = read_header(data, where)
    if len(header.extents) not in (1, 2):
        raise CorruptData(f"{where}: {len(header.extents)} extents, an L1 object holds one or two")
    first = header.extents[0]
    raw = data[first.byte_offset : first.byte_offset + first.byte_length]
    records = decode_extent(raw, first.checksum, first.record_count, where)
    if len(header.extents) == 1:
        return [(base_offset, records)]
    second = header.extents[1]
    raw = data[second.byte_offset : second.byte_offset + second.byte_length]
    if checksum(raw) != second.checksum:
        raise CorruptData(f"{where}: the runs' checksum does not match")
    try:
        runs = _runs_decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise CorruptData(f"{where}: undecodable runs: {exc}") from exc
    if len(runs) != second.record_count or sum(n for _, n in runs) != len(records):
        raise CorruptData(f"{where}: the runs do not add up to its {len(records)} records")
    result: list[tuple[int, list[Record]]] = []
    i = 0
    for start, count in runs:
        result.append((start, records[i : i + count]))
        i += count
    return result
