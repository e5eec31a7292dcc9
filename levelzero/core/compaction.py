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
dropped. The key map holds an index per distinct key, at most `key_map_entries_max` of them,
keyed by the key bytes the pass decoded already (no copy, and no hash that could collide): a
range with more distinct keys is cleaned only up to the record before the first key that did
not fit, as Kafka's cleaner stops where its offset map fills; the next pass goes on from there.

**Decoding only what the rule needs.** A pass reads up to `object_bytes_max` of L1 records and
keeps a few of them (a changelog repeats its keys). Decoding every record whole was most of its
cost, and the rule needs less: each record's key, and its bytes if it is kept. So a pass scans
each object in msgspec's C decoder into its keys alone (a struct of one field: msgspec skips
the fields after it, never building a value), and splits an object into its records' encoded
bytes (`msgspec.Raw`, views into the object) only if it holds a record that may stay. Only
those records (the latest per key, and those above the clean limit) are decoded whole, for the
tombstone rule and the new object's newest timestamp; the new object's extent is their encoded
bytes joined (`extent_of_encoded`): the same bytes re-encoding them would give. A record's
time (for `min.compaction.lag.ms`) is read from its object's row when the row's newest
timestamp and write time already put every record past the lag (`known_old`); only otherwise
are the timestamps decoded.

**Transactions** (as Kafka's cleaner treats them). A pass cleans only below the partition's last
stable offset: a record of an open transaction may still be aborted, so it never supersedes an
earlier record of its key. A record of an aborted transaction is dropped and supersedes nothing
(`PassInput.apply_transactions`): the record of its key that read_committed sees stays. A commit marker
is dropped (a read_committed consumer needs only the aborted list and the abort markers); an
abort marker stays, as a consumer stops skipping its producer's records at it. The cleaned
range's last record stays whatever it is (Kafka's cleaner retains its round's last batch): the
range ends below the last stable offset, and a read_committed consumer whose position is below
it must find a record there to reach it (`retain`). Only
the objects whose bytes hold the reserved header's name are decoded for it (one substring
search each; the usual object holds none).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

import msgspec

from .errors import CorruptData
from .l0format import (
    NO_TIMESTAMP,
    Record,
    build_object,
    checksum,
    decode_extent,
    extent_of_encoded,
    read_header,
)
from .txn_marks import KIND_ABORT, KIND_DATA, TXN_HEADER, txn_kind

# Distinct keys one pass maps, at most (an entry of a dict each, ~100 bytes, the key being the
# record's own key bytes).
KEY_MAP_ENTRIES_MAX = 100_000


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
    extent: bytes  # the kept records as one extent: their encoded bytes, sliced from the input
    clean_upto: int  # the last offset the pass decided on (records above it were not looked at)
    removed: int
    tombstones_dropped: int


def known_old(objects: Sequence[tuple[int | None, int]], young_from_ms: int) -> bool:
    """Is every record of `objects` — each `(its records' newest timestamp, None: unknown; its
    write time in ms)` — at or before `young_from_ms`? A record's time is its timestamp, or its
    object's write time when it has none: both bounds at or before it put every record there.
    True lets a pass skip decoding timestamps; False says only "look at the records"."""
    return all(
        newest is not None and newest <= young_from_ms and written <= young_from_ms
        for newest, written in objects
    )


def last_index_per_key(keys: Sequence[bytes | None]) -> dict[bytes | None, int]:
    """The index of each key's last record (None: the keyless records' last), in one C-level
    sweep: a dict keeps the last value given for a key. Computed once for both steps of a pass
    (`clean_limit`, `retain`) when it cleans its whole input, the usual case."""
    return dict(zip(keys, range(len(keys)), strict=True))


def clean_limit(
    offsets: Sequence[int],
    keys: Sequence[bytes | None],
    timestamps_ms: Sequence[int] | None,
    written_at_ms: Sequence[int],
    reconciled_upto: int,
    now_ms: int,
    min_lag_ms: int,
    key_map_entries_max: int = KEY_MAP_ENTRIES_MAX,
    latest: Mapping[bytes | None, int] | None = None,
) -> int:
    """The last offset a pass may clean: at or below the reconciled offset, below the first
    record younger than `min.compaction.lag.ms`, and below the first key the key map cannot
    hold. -1 (or below the range) when nothing may be cleaned. `timestamps_ms`: each record's
    own (NO_TIMESTAMP: none, its object's write time counts); None when the caller knows every
    record is older than the lag already (`known_old`), and not looked at with no lag.
    `latest`: `last_index_per_key(keys)`, if the caller has it."""
    assert len(offsets) == len(keys) == len(written_at_ms), (len(offsets), len(keys), len(written_at_ms))
    assert timestamps_ms is None or len(timestamps_ms) == len(offsets)
    assert min_lag_ms >= 0, min_lag_ms
    if min_lag_ms == 0:
        # No lag, no look at the records' times, as Kafka's cleaner (`cleanableOffsets` checks
        # timestamps only for a positive lag): a record stamped in the future (a producer's
        # clock ahead, event time) is cleanable like any other.
        timestamps_ms = None
    # The common case at a list's speed: nothing young below the reconciled offset and every
    # key fits the map; otherwise the walk below finds where the pass must stop.
    n = bisect.bisect_right(offsets, reconciled_upto)
    young_from = now_ms - min_lag_ms  # a record whose time is above this is too young
    if n:
        if timestamps_ms is None:
            old = True
        else:
            times = timestamps_ms[:n]
            old = max(times) <= young_from and (
                NO_TIMESTAMP not in times or max(written_at_ms[:n]) <= young_from
            )
        if old:
            if latest is not None and n == len(keys):
                distinct = len(latest) - (None in latest)
            else:
                distinct = len(set(keys[:n]) - {None})
            if distinct <= key_map_entries_max:
                return offsets[n - 1]
    return _clean_limit_walk(
        offsets, keys, timestamps_ms, written_at_ms, reconciled_upto, young_from, key_map_entries_max
    )


def _clean_limit_walk(
    offsets: Sequence[int],
    keys: Sequence[bytes | None],
    timestamps_ms: Sequence[int] | None,
    written_at_ms: Sequence[int],
    reconciled_upto: int,
    young_from: int,
    key_map_entries_max: int,
) -> int:
    limit = -1
    seen: set[bytes] = set()
    times = [NO_TIMESTAMP] * len(offsets) if timestamps_ms is None else timestamps_ms
    for offset, key, timestamp, written in zip(offsets, keys, times, written_at_ms, strict=True):
        time_ms = written if timestamp == NO_TIMESTAMP else timestamp
        if offset > reconciled_upto or (timestamps_ms is not None and time_ms > young_from):
            break
        if key is None:
            limit = offset  # written before the topic was compacted: dropped, as Kafka's cleaner does
            continue
        if key not in seen and len(seen) >= key_map_entries_max:
            break
        seen.add(key)
        limit = offset
    return limit


# The encoded bytes of the records at some indices of a pass's input (rising): `PassInput.encoded`.
EncodedOf = Callable[[Sequence[int]], Sequence[bytes | msgspec.Raw]]


def retain(
    offsets: Sequence[int],
    keys: Sequence[bytes | None],
    written_at_ms: Sequence[int],
    clean_upto: int,
    now_ms: int,
    delete_retention_ms: int,
    encoded_of: EncodedOf,
    latest: Mapping[bytes | None, int] | None = None,
) -> Retained:
    """Keep, of the records at or below `clean_upto`, the latest per key (tombstones until
    `delete.retention.ms`), and every record above it. The range's last record always stays
    (as Kafka never cleans its active segment): a compacted object ends on a record, so a
    fetch inside it always finds one. So does the last record at or below `clean_upto`, the
    cleaned range's (as Kafka's cleaner retains its cleaning round's last batch): a pass
    cleans below the last stable offset, and a read_committed fetch at an offset below it
    must find a record below it, since the records above it (an open transaction's) are
    not returned; without it a commit marker cleaned away just below an open transaction
    leaves a consumer short of the last stable offset until the transaction ends.
    `encoded_of`: the records' msgpack bytes, asked only for the ones that may stay; offsets
    rise (`PassInput` asserts it as it grows). `latest`: `last_index_per_key(keys)`, if the
    caller has it."""
    assert len(offsets) == len(keys) == len(written_at_ms)
    assert offsets, "a pass cleans at least one record"
    assert offsets[-1] - offsets[0] >= len(offsets) - 1, "offsets must rise"
    # The records at or below clean_upto are the first `cut`; of those, the latest index per key
    # (dict keeps the last value given for a key). No key: written before the topic was
    # compacted, dropped as Kafka's cleaner drops it.
    cut = bisect.bisect_right(offsets, clean_upto)
    if latest is None or cut != len(keys):
        latest = last_index_per_key(keys[:cut])
    candidates = sorted(latest.values())
    if None in latest:
        del candidates[bisect.bisect_left(candidates, latest[None])]
    keyed = len(candidates)
    # The cleaned range's last record always stays (and so the range's last, when all of it
    # is cleaned; those above the cleaned range stay in any case).
    if cut and (not candidates or candidates[-1] != cut - 1):
        candidates.append(cut - 1)
    candidates.extend(range(cut, len(offsets)))
    # Only the candidates are decoded whole: the tombstone rule needs their values and times.
    encoded = encoded_of(candidates)
    assert len(encoded) == len(candidates), (len(encoded), len(candidates))
    candidate_extent = extent_of_encoded(encoded)
    try:
        records = _records_decoder.decode(candidate_extent)
    except msgspec.DecodeError as exc:
        raise CorruptData(f"a record kept by compaction is undecodable: {exc}") from exc
    assert len(records) == len(candidates)
    keep: list[int] = []  # positions in candidates
    kept: list[Record] = []
    tombstones_dropped = 0
    for j, (i, record) in enumerate(zip(candidates, records, strict=True)):
        expired = record.value is None and i < cut - 1
        if expired and now_ms - _record_time(record, written_at_ms[i]) >= delete_retention_ms:
            tombstones_dropped += 1
            continue  # a tombstone past delete.retention.ms
        keep.append(j)
        kept.append(record)
    extent = candidate_extent if not tombstones_dropped else extent_of_encoded([encoded[j] for j in keep])
    assert len(kept) <= keyed + (len(offsets) - cut) + 1  # + the cleaned range's last
    assert keep, "the range's last record always stays"
    kept_offsets = [offsets[candidates[j]] for j in keep]
    return Retained(kept_offsets, kept, extent, clean_upto, len(offsets) - len(keep), tombstones_dropped)


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
_records_decoder = msgspec.msgpack.Decoder(list[Record])
_encoded_records_decoder = msgspec.msgpack.Decoder(list[msgspec.Raw])


class _RecordKey(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A stored record decoded only as far as its key: msgspec skips the fields after it (value,
    timestamp, headers) without building them. Untracked by the GC: it holds bytes or None,
    never a cycle, and a pass makes one per record."""

    key: bytes | None


_record_keys_decoder = msgspec.msgpack.Decoder(list[_RecordKey])


def build_compacted_object(term: int, pid: int, offsets: Sequence[int], extent: bytes, count: int) -> bytes:
    """The object of `count` records at `offsets`, `extent` their encoded records (`Retained`)."""
    assert offsets and len(offsets) == count, (len(offsets), count)
    runs = contiguous_runs(offsets)
    data, _ = build_object(term, [(pid, extent, count), (pid, _runs_encoder.encode(runs), len(runs))])
    return data


def _l1_layout(data: bytes, where: str) -> tuple[memoryview, int, int, list[tuple[int, int]] | None]:
    """An L1 object's record extent (a view: no copy), its checksum and record count, and its
    runs (None: one run from the object's base offset), the runs verified."""
    header = read_header(data, where)
    if len(header.extents) not in (1, 2):
        raise CorruptData(f"{where}: {len(header.extents)} extents, an L1 object holds one or two")
    first = header.extents[0]
    raw = memoryview(data)[first.byte_offset : first.byte_offset + first.byte_length]
    if len(header.extents) == 1:
        return raw, first.checksum, first.record_count, None
    second = header.extents[1]
    runs_bytes = data[second.byte_offset : second.byte_offset + second.byte_length]
    if checksum(runs_bytes) != second.checksum:
        raise CorruptData(f"{where}: the runs' checksum does not match")
    try:
        runs = _runs_decoder.decode(runs_bytes)
    except msgspec.DecodeError as exc:
        raise CorruptData(f"{where}: undecodable runs: {exc}") from exc
    if len(runs) != second.record_count or sum(n for _, n in runs) != first.record_count:
        raise CorruptData(f"{where}: the runs do not add up to its {first.record_count} records")
    return raw, first.checksum, first.record_count, runs


def _split(runs: list[tuple[int, int]] | None, base_offset: int, count: int) -> list[tuple[int, int, int]]:
    """(first offset, first index, count) of each run."""
    if runs is None:
        return [(base_offset, 0, count)]
    result: list[tuple[int, int, int]] = []
    i = 0
    for start, n in runs:
        result.append((start, i, n))
        i += n
    return result


def l1_object_runs(data: bytes, base_offset: int, where: str) -> list[tuple[int, list[Record]]]:
    """(first offset, records at consecutive offsets) of each run of an L1 object, verified."""
    raw, crc, count, runs = l1_object_extent(data, base_offset, where)
    records = decode_extent(raw, crc, count, where)
    return [(start, records[i : i + n]) for start, i, n in runs]


def l1_object_extent(
    data: bytes, base_offset: int, where: str
) -> tuple[memoryview, int, int, list[tuple[int, int, int]]]:
    """An L1 object's record extent (a view, not yet checked against its checksum), that
    checksum, its record count, and its runs as (first offset, first index, count); the runs
    verified. For a reader that decodes the extent its own way (the data source's columns)."""
    raw, crc, count, runs = _l1_layout(data, where)
    return raw, crc, count, _split(runs, base_offset, count)


@dataclass(slots=True)
class _ScannedObject:
    extent: memoryview  # its records' extent, verified
    first: int  # the index of its first record in the pass's input
    count: int
    where: str
    encoded: list[msgspec.Raw] | None = None  # each record's bytes, once asked for


@dataclass(slots=True)
class PassInput:
    """A pass's input records, decoded only as far as the rule needs (see the module's
    docstring), in offset order: each record's offset, key and object's write time, and each
    object's newest timestamp (for `known_old`). A record's encoded bytes are found when asked
    for (`encoded`), an object at a time: the objects holding no record that may stay are
    never split into records."""

    offsets: list[int] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    written_at_ms: list[int] = field(default_factory=list)
    objects: list[tuple[int | None, int]] = field(default_factory=list)  # (newest timestamp, written)
    _scanned: list[_ScannedObject] = field(default_factory=list)

    def add_object(
        self, data: bytes, base_offset: int, written_at_ms: int, max_timestamp_ms: int | None, where: str
    ) -> None:
        """Add an L1 object's records (verified against its checksum); its offsets come after
        the ones added before."""
        raw, crc, count, runs = _l1_layout(data, where)
        actual = checksum(raw)
        if actual != crc:
            raise CorruptData(f"{where}: checksum mismatch (expected {crc:08x}, got {actual:08x})")
        try:
            keys = [r.key for r in _record_keys_decoder.decode(raw)]
        except msgspec.DecodeError as exc:
            raise CorruptData(f"{where}: undecodable extent: {exc}") from exc
        if len(keys) != count:
            raise CorruptData(f"{where}: {len(keys)} records, expected {count}")
        for start, _, n in _split(runs, base_offset, count):
            if self.offsets and start <= self.offsets[-1]:
                raise CorruptData(f"{where}: a run at offset {start}, not after {self.offsets[-1]}")
            self.offsets.extend(range(start, start + n))
        self._scanned.append(_ScannedObject(raw, len(self.keys), count, where))
        self.keys.extend(keys)
        self.written_at_ms.extend([written_at_ms] * count)
        self.objects.append((max_timestamp_ms, written_at_ms))
        assert len(self.offsets) == len(self.keys) == len(self.written_at_ms)

    def encoded(self, indices: Sequence[int]) -> list[msgspec.Raw]:
        """The encoded bytes of the records at `indices` (rising): views into their objects."""
        result: list[msgspec.Raw] = []
        at = 0
        for scanned in self._scanned:
            end = bisect.bisect_left(indices, scanned.first + scanned.count, at)
            if end == at:
                continue
            if scanned.encoded is None:
                try:
                    scanned.encoded = _encoded_records_decoder.decode(scanned.extent)
                except msgspec.DecodeError as exc:
                    raise CorruptData(f"{scanned.where}: undecodable extent: {exc}") from exc
                if len(scanned.encoded) != scanned.count:
                    raise CorruptData(
                        f"{scanned.where}: {len(scanned.encoded)} records, expected {scanned.count}"
                    )
            encoded, first = scanned.encoded, scanned.first
            assert indices[at] >= first, (indices[at], first)
            result.extend([encoded[i - first] for i in indices[at:end]])
            at = end
        assert at == len(indices), "indices rise, each within the input"
        return result

    def timestamps_ms(self) -> list[int]:
        """Each record's own timestamp (NO_TIMESTAMP: none): its objects decoded whole."""
        times: list[int] = []
        for scanned in self._scanned:
            try:  # verified as it was added
                records = _records_decoder.decode(scanned.extent)
            except msgspec.DecodeError as exc:
                raise CorruptData(f"{scanned.where}: undecodable extent: {exc}") from exc
            times.extend([r.timestamp_ms for r in records])
        assert len(times) == len(self.offsets)
        return times

    def apply_transactions(self, aborted: Sequence[tuple[int, int, int]]) -> None:
        """Kafka's cleaner's rule for transactions (see the module), given the partition's
        aborted transactions (producer id, first offset, abort marker's offset): a record of an
        aborted transaction and a commit marker get no key (dropped, superseding nothing); an
        abort marker a key equal to no other (kept). Only the objects whose bytes hold the
        reserved header's name are decoded for it."""
        for scanned in self._scanned:
            if _TXN_HEADER_BYTES not in bytes(scanned.extent):
                continue
            try:  # verified as it was added
                records = _records_decoder.decode(scanned.extent)
            except msgspec.DecodeError as exc:
                raise CorruptData(f"{scanned.where}: undecodable extent: {exc}") from exc
            for i, record in enumerate(records):
                txn = txn_kind(record.headers)
                if txn is None:
                    continue
                at = scanned.first + i
                producer_id, kind = txn
                if kind == KIND_ABORT:
                    self.keys[at] = cast(bytes, _AbortMarkerKey())
                elif kind != KIND_DATA:
                    self.keys[at] = None  # a commit marker
                elif any(
                    p == producer_id and first <= self.offsets[at] <= last for p, first, last in aborted
                ):
                    self.keys[at] = None


class _AbortMarkerKey:
    """An abort marker's key in a pass's key map: equal to nothing but itself (identity), so the
    marker is kept and supersedes no record."""

    __slots__ = ()


_TXN_HEADER_BYTES = TXN_HEADER.encode()  # as msgpack stores the header's name (a str)
