"""Deliberately broken rules, applied from the simulation side (a patch of the shipping code
while a seed runs), never by a flag in production code. `levelzero sim --mutate` runs each one
until a violation catches it; tests/sim/test_mutations.py bounds the seeds each may take.

Every mutant wraps or replaces one rule where the shipping code looks it up (a module global or
a class attribute), so the code under test is otherwise the code that ships.
"""

from __future__ import annotations

import bisect
import contextlib
import inspect

import anyio
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import levelzero.actors.batcher as batcher_module
import levelzero.actors.compactor as compactor_module
import levelzero.actors.gc as gc_module
import levelzero.actors.housekeeper as housekeeper_module
import levelzero.actors.l1 as l1_module
import levelzero.core.state as state_module
import levelzero.storage.log_rules as log_rules_module
from levelzero.actors.gc import GcActor
from levelzero.actors.intake import ProduceIntake
import levelzero.actors.cluster as cluster_module
from levelzero.actors.cluster import ClusterMember
from levelzero.actors.compactor import Compactor
from levelzero.actors.epochs import EpochCache
from levelzero.actors.l1 import L1Catalog
from levelzero.actors.partition import PartitionActor as _Actor
from levelzero.actors.reader import UNFRAMED, FetchResult, FetchWindow, Framing, Reader
from levelzero.core.cluster import LeaseClock
from levelzero.core.compaction import EncodedOf, Retained, retain
from levelzero.core.l0format import extent_of_encoded
from levelzero.core.entries import LogRecord, Placeholder
from levelzero.core.errors import InvalidInput, LevelZeroError, OffsetOutOfRange, OffsetsAbandoned
from levelzero.actors.partition import PartitionActor, _Control
from levelzero.core.fence import Admitted, Fence
from levelzero.core.leader import l1_collect_reason
from levelzero.core.topic_configs import RetainedObject, retention_start_offset
from levelzero.core.producers import PartitionProducers, ProducerSequences, batch_with_sequence
from levelzero.core.gc import GcPacer, Pace, PaceReason, WatermarkDecision, compute_cluster_watermark
from levelzero.core.state import PartitionState, ReaderPins
from levelzero.kafka.transactions import (
    PartitionTxns,
    Prepared,
    TransactionCoordinator,
    TxnState,
    marker_record,
)
from levelzero.storage.memory_cluster import MemoryClusterControl
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.protocols import CompactionCommit


@contextlib.contextmanager
def _patched(owner: object, name: str, value: Any) -> Iterator[None]:
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


# ---------------------------------------------------------------- the state machine


def _lower_bound_follows_max() -> contextlib.AbstractContextManager[None]:
    return _patched(state_module, "lower_bound_after_catch_up", lambda previous, maximum: maximum)


def _mp_off_by_one() -> contextlib.AbstractContextManager[None]:
    def mp(self: PartitionState) -> int | None:
        return self.min_epoch_lower_bound  # should be min_epoch_lower_bound - 1

    return _patched(PartitionState, "mp", property(mp))


# ---------------------------------------------------------------- the fence and the actor


def _admit_below_window() -> contextlib.AbstractContextManager[None]:
    original = Fence.try_fence

    def try_fence(self: Fence, epoch: int, term: int, applied_window: Any) -> Any:
        window = self.effective_window(term, applied_window)
        if self.updater_epoch is None and window is not None and epoch < window[0]:
            self.read_units += 1
            return Admitted(epoch, term, window, new_epoch=False)
        return original(self, epoch, term, applied_window)

    return _patched(Fence, "try_fence", try_fence)


def _slide_without_drain() -> contextlib.AbstractContextManager[None]:
    # The actor slides as soon as an updater comes, whatever the old window still has in flight.
    return _patched(Fence, "drained", property(lambda self: True))


def _catch_up_without_term_check() -> contextlib.AbstractContextManager[None]:
    original = PartitionActor._on_control

    def on_control(self: PartitionActor, msg: _Control) -> None:
        msg.term = None  # whatever term the sender expected
        original(self, msg)

    return _patched(PartitionActor, "_on_control", on_control)


def _reader_pins_ignored() -> contextlib.AbstractContextManager[None]:
    def register(self: ReaderPins, state_mp: int | None) -> tuple[int, int | None]:
        reader_id = self._next_id
        self._next_id += 1
        return reader_id, state_mp  # nothing pinned

    return _patched(ReaderPins, "register", register)


# ---------------------------------------------------------------- the read path


def _l1_lookup_bisect_left() -> contextlib.AbstractContextManager[None]:
    # The L1 read looks up the object holding an offset with bisect_left: at an object's first
    # offset it lands on the object before, which does not hold it ("no valid L1 object").
    shim = types.SimpleNamespace(bisect_right=bisect.bisect_left, bisect_left=bisect.bisect_left)
    return _patched(l1_module, "bisect", shim)


def _l1_lineage_never_reread() -> contextlib.AbstractContextManager[None]:
    # The L1 read keeps the lineage it cached first: offsets reconciled since are in no object.
    original = L1Catalog.refresh

    async def refresh(self: L1Catalog, actor: _Actor) -> list[Any]:
        cached = self._valid.get(actor.row.pid)
        return cached if cached else await original(self, actor)

    return _patched(L1Catalog, "refresh", refresh)


def _placeholders_from_base() -> contextlib.AbstractContextManager[None]:
    # The log store's placeholder read starts at the first placeholder whose base offset is at
    # or after the offset asked, missing the one that holds it.
    async def read_placeholders(
        self: MemoryLogStore, pid: int, from_data_offset: int, limit: int
    ) -> list[LogRecord]:
        found = []
        for record in self.logs[pid]:
            if isinstance(record.entry, Placeholder) and record.base_offset >= from_data_offset:
                found.append(record)
                if len(found) >= limit:
                    break
        return found

    return _patched(MemoryLogStore, "read_placeholders", read_placeholders)


def _reader_l1_below_lro_only() -> contextlib.AbstractContextManager[None]:
    # The reader serves L1 for offsets below the LRO only: the LRO itself is read from L0,
    # whose object the GC may have collected already.
    return _patched(Reader, "fetch", _fetch_with(l1_at_lro=False))


def _reader_serves_below_start() -> contextlib.AbstractContextManager[None]:
    # The reader checks the offset against the high watermark only: offsets retention dropped
    # are served while their objects last.
    return _patched(Reader, "fetch", _fetch_with(below_start=True))


def _reader_refuses_the_start_offset() -> contextlib.AbstractContextManager[None]:
    # The reader's range check refuses the start offset itself (`offset <= start`).
    return _patched(Reader, "fetch", _fetch_with(start_refused=True))


def _fetch_with(*, l1_at_lro: bool = True, below_start: bool = False, start_refused: bool = False) -> Any:
    """`Reader.fetch` with one of three slips."""

    async def fetch(
        self: Reader, actor: _Actor, offset: int, max_bytes: int, framing: Framing = UNFRAMED
    ) -> FetchResult:
        if max_bytes < 1:
            raise InvalidInput("max_bytes")
        state = actor.state
        hwm, start, lro = state.high_watermark, state.start_offset, state.lro
        if (offset < start and not below_start) or (offset == start and start_refused) or offset > hwm:
            raise OffsetOutOfRange(offset, start, hwm)
        if offset == hwm:
            return FetchResult([], offset, hwm, start, "none")
        abandoned = state.abandoned_range(offset)
        if abandoned is not None:
            raise OffsetsAbandoned(offset, *abandoned, start, hwm)
        tiers = []
        if (offset <= lro if l1_at_lro else offset < lro) and self.l1 is not None:
            tiers.append("l1")
            window = FetchWindow(offset, lro, max_bytes, framing)
            await self.l1.fill(actor, window)
            window.extend_to(hwm - 1)
        else:
            window = FetchWindow(offset, hwm - 1, max_bytes, framing)
        taken = window.count
        if window.stopped is None:
            await self._fill_l0(actor, window, hwm)
            if window.count > taken or not tiers:
                tiers.append("l0")
        return FetchResult(window.runs, window.next_offset, hwm, start, "+".join(tiers))

    return fetch


# ---------------------------------------------------------------- liveness


def _stale_rejection_keeps_cache() -> contextlib.AbstractContextManager[None]:
    # A stale-epoch rejection does not invalidate the epoch cache: the retries carry the same
    # stale epoch until the cache's TTL runs out.
    return _patched(EpochCache, "invalidate_below", lambda self, epoch: None)


def _gc_idle_backoff_uncapped() -> contextlib.AbstractContextManager[None]:
    # The GC's idle backoff doubles without its cap: after an idle stretch the next round may
    # be minutes away, and the L0 objects of a burst wait for it.
    original = GcPacer.after_round

    def after_round(self: GcPacer, **kwargs: Any) -> Pace:
        backoff = self.idle_backoff_s
        pace = original(self, **kwargs)
        if self.idle_backoff_s == self.idle_backoff_max_s and pace.reason == PaceReason.IDLE:
            self.idle_backoff_s = backoff * 2  # the slip: `min(backoff * 2, max)` lost its min
        return pace

    return _patched(GcPacer, "after_round", after_round)


# ---------------------------------------------------------------- the batcher


def _batcher_ignores_creation_epochs() -> contextlib.AbstractContextManager[None]:
    return _patched(batcher_module, "object_epoch", lambda cached, creation_epochs: cached)


# ---------------------------------------------------------------- the GC

UNCAPPED_M = 1 << 62  # no partition and no cap: every object is below M


def _gc_decision(
    change: Callable[[int, Mapping[str, int | None]], WatermarkDecision],
) -> contextlib.AbstractContextManager[None]:
    return _patched(gc_module, "compute_cluster_watermark", change)


def _gc_ignores_cap() -> contextlib.AbstractContextManager[None]:
    def decide(cluster_epoch: int, mps: Mapping[str, int | None]) -> WatermarkDecision:
        decision = compute_cluster_watermark(cluster_epoch, mps)
        if decision.m is None:
            return decision
        known = [mp for mp in mps.values() if mp is not None]
        return replace(decision, m=min(known) if known else UNCAPPED_M)

    return _gc_decision(decide)


def _gc_cap_at_e() -> contextlib.AbstractContextManager[None]:
    # The cap is E, not E - 1: a partition created after the round's snapshot (creation epoch
    # E) has objects at or below M.
    def decide(cluster_epoch: int, mps: Mapping[str, int | None]) -> WatermarkDecision:
        decision = compute_cluster_watermark(cluster_epoch, mps)
        if decision.m is None or "cap" not in decision.holders:
            return decision
        known = [mp for mp in mps.values() if mp is not None]
        return replace(decision, m=min([*known, cluster_epoch]))

    return _gc_decision(decide)


def _gc_deletes_up_to_m_plus_1() -> contextlib.AbstractContextManager[None]:
    def decide(cluster_epoch: int, mps: Mapping[str, int | None]) -> WatermarkDecision:
        decision = compute_cluster_watermark(cluster_epoch, mps)
        return decision if decision.m is None else replace(decision, m=decision.m + 1)

    return _gc_decision(decide)


def _gc_skips_partitions_without_mp() -> contextlib.AbstractContextManager[None]:
    def decide(cluster_epoch: int, mps: Mapping[str, int | None]) -> WatermarkDecision:
        known = {name: mp for name, mp in mps.items() if mp is not None}
        return compute_cluster_watermark(cluster_epoch, known)

    return _gc_decision(decide)


# ---------------------------------------------------------------- the cluster (nodes > 1)


def _appends_ignore_term() -> contextlib.AbstractContextManager[None]:
    # The store takes an append whatever term it carries: a zombie leader is not fenced by it.
    return _patched(MemoryLogStore, "_check_term", staticmethod(lambda row, expected_term: None))


def _gc_takes_local_watermarks() -> contextlib.AbstractContextManager[None]:
    # Each node's GC takes M over its own board (what it leads and created), not over every
    # partition's M(p) published in the control plane.
    async def snapshot(self: GcActor) -> tuple[int, dict[str, int | None]]:
        return self._cluster_epoch(), self._board.snapshot()

    return _patched(GcActor, "_snapshot", snapshot)


def _lease_without_margin() -> contextlib.AbstractContextManager[None]:
    # The local lease deadline has no margin for clock drift: a node whose clock runs slow
    # serves past the lease the control plane gave it.
    def lease_clock(ttl_s: float, margin_fraction: float = 0.0) -> LeaseClock:  # noqa: ARG001
        return LeaseClock(ttl_s, 0.0)

    return _patched(cluster_module, "LeaseClock", lease_clock)


def _lease_margin_typo() -> contextlib.AbstractContextManager[None]:
    # The lease margin is 0.02 of the TTL, not 0.2: less than a drifting clock needs.
    def lease_clock(ttl_s: float, margin_fraction: float = 0.02) -> LeaseClock:  # noqa: ARG001
        return LeaseClock(ttl_s, 0.02)

    return _patched(cluster_module, "LeaseClock", lease_clock)


def _lease_from_reply() -> contextlib.AbstractContextManager[None]:
    # The local lease deadline counts from the renewal's reply, not from when it was sent: a
    # slow control plane stretches it past the lease.
    original = LeaseClock.renewed

    def renewed(self: LeaseClock, sent_at: float) -> None:  # noqa: ARG001
        original(self, anyio.current_time())

    return _patched(LeaseClock, "renewed", renewed)


def _leads_ignores_deadline() -> contextlib.AbstractContextManager[None]:
    # `leads` answers from the set of partitions led, not the lease's local deadline: a node
    # cut off the control plane serves until a round tells it otherwise.
    return _patched(ClusterMember, "leads", lambda self, pid: pid in self.leading)


def _retention_bytes_one_object_too_many() -> contextlib.AbstractContextManager[None]:
    # Retention by bytes tests what is left before dropping an object, not after: a partition
    # keeps one object less than its bound says.
    def start(
        objects: list[RetainedObject],
        start_offset: int,
        now: float,
        retention_s: float | None,
        retention_bytes: int | None,
    ) -> int:
        new_start = retention_start_offset(objects, start_offset, now, retention_s, None)
        if retention_bytes is not None:
            live = [o for o in objects if o.last_offset >= start_offset]
            remaining = sum(o.size for o in live)
            for o in live:
                if remaining < retention_bytes:  # the slip: `remaining - o.size < retention_bytes`
                    break
                remaining -= o.size
                new_start = max(new_start, o.last_offset + 1)
        return new_start

    return _patched(housekeeper_module, "retention_start_offset", start)


def _l1_collect_ignores_retention() -> contextlib.AbstractContextManager[None]:
    # The L1 collection keeps objects below the start offset: retention moves the start but
    # frees nothing.
    original = l1_collect_reason  # the core rule, which the L1 catalog imports

    def reason(*args: Any, **kwargs: Any) -> str | None:
        why = original(*args, **kwargs)
        return None if why is not None and why.startswith("below the start") else why

    return _patched(l1_module, "l1_collect_reason", reason)


# ---------------------------------------------------------------- compaction (issue 34)


def _compaction_lineage_unchecked() -> contextlib.AbstractContextManager[None]:
    # The store takes a compaction result whatever cleaner-offset map it carries: a zombie
    # leader's result (an older term) is applied.
    return _patched(log_rules_module, "cleaner_map_refusal", lambda *args: None)


def _compaction_tombstones_dropped_early() -> contextlib.AbstractContextManager[None]:
    # A pass drops tombstones at once, not after delete.retention.ms.
    def early(*args: Any, **kwargs: Any) -> Retained:
        if len(args) >= 6:
            args = (*args[:5], 0, *args[6:])
        else:
            kwargs["delete_retention_ms"] = 0
        return retain(*args, **kwargs)

    return _patched(compactor_module, "retain", early)


def _compaction_keeps_first_per_key() -> contextlib.AbstractContextManager[None]:
    # A pass keeps the first record per key of the range it cleans, not the last (the range's
    # last record still stays, as the real rule keeps it).
    def first(
        offsets: list[int],
        keys: list[bytes | None],
        written_at_ms: list[int],
        clean_upto: int,
        now_ms: int,
        delete_retention_ms: int,
        encoded_of: EncodedOf,
        latest: Mapping[bytes | None, int] | None = None,  # noqa: ARG001 - the real rule's, unused
    ) -> Retained:
        cut = bisect.bisect_right(offsets, clean_upto)
        firsts: dict[bytes | None, int] = {}
        for i, key in enumerate(keys[:cut]):
            firsts.setdefault(key, i)
        chosen = sorted({*firsts.values(), len(offsets) - 1, *range(cut, len(offsets))})
        kept = retain(
            [offsets[i] for i in chosen],
            [keys[i] for i in chosen],
            [written_at_ms[i] for i in chosen],
            clean_upto,
            now_ms,
            delete_retention_ms,
            lambda indices: encoded_of([chosen[i] for i in indices]),
        )
        return replace(kept, removed=len(offsets) - len(kept.records))

    return _patched(compactor_module, "retain", first)


def _compaction_drops_cleaned_last() -> contextlib.AbstractContextManager[None]:
    # The rule before the cleaned range's last record was kept: a pass keeps it only if it is
    # its key's latest (or the range's last), so a commit marker (no key) at the end of the
    # cleaned range goes, and a read_committed consumer below an open transaction just above
    # it finds nothing below the last stable offset.
    def drops(*args: Any, **kwargs: Any) -> Retained:
        kept = retain(*args, **kwargs)
        given = inspect.signature(retain).bind(*args, **kwargs).arguments
        offsets, keys, clean_upto = given["offsets"], given["keys"], given["clean_upto"]
        encoded_of = given["encoded_of"]
        cut = bisect.bisect_right(offsets, clean_upto)
        if not 0 < cut < len(offsets) or keys[cut - 1] is not None:
            return kept
        j = bisect.bisect_left(kept.offsets, offsets[cut - 1])
        if j == len(kept.offsets) or kept.offsets[j] != offsets[cut - 1]:
            return kept
        indices = [bisect.bisect_left(offsets, o) for o in kept.offsets]
        del indices[j]
        return replace(
            kept,
            offsets=kept.offsets[:j] + kept.offsets[j + 1 :],
            records=kept.records[:j] + kept.records[j + 1 :],
            extent=extent_of_encoded(encoded_of(indices)),
            removed=kept.removed + 1,
        )

    return _patched(compactor_module, "retain", drops)


def _compaction_deletes_before_commit() -> contextlib.AbstractContextManager[None]:
    # The compactor deletes the objects it supersedes before its result is recorded (accepted
    # or not): a refused result, a crash or a reader in between loses them.
    original = Compactor.compact_partition

    async def compact_partition(self: Compactor, actor: _Actor, term: int | None = None) -> bool:
        log = self._log
        objects = self._objects

        class DeletingFirst:
            def __getattr__(self, attr: str) -> Any:
                return getattr(log, attr)

            async def l1_compaction_commit(self, commit: CompactionCommit, now: float) -> str | None:
                await objects.delete_many(list(commit.superseded_keys))
                return await log.l1_compaction_commit(commit, now)

        self._log = DeletingFirst()
        try:
            return await original(self, actor, term)
        finally:
            self._log = log

    return _patched(Compactor, "compact_partition", compact_partition)


def _compaction_superseded_never_deleted() -> contextlib.AbstractContextManager[None]:
    # An accepted result's superseded objects are never deleted from the store (their rows go
    # DELETE_STARTED in the commit and stay): the leak check must see them.
    async def finish_superseded(
        self: L1Catalog,  # noqa: ARG001
        keys: Sequence[str],  # noqa: ARG001
        partition: str,  # noqa: ARG001
    ) -> dict[str, LevelZeroError]:
        return {}  # "all deleted"

    return _patched(L1Catalog, "finish_superseded", finish_superseded)


# ---------------------------------------------------------------- Kafka idempotent producers


def _idempotent_duplicates_unchecked() -> contextlib.AbstractContextManager[None]:
    return _both(
        _patched(ProducerSequences, "duplicate_of", lambda self, *identity: None),
        _patched(PartitionProducers, "duplicate_of", lambda self, *identity: None),
    )


def _idempotent_epoch_ignored() -> contextlib.AbstractContextManager[None]:
    """A partition's producer state finds a batch by its sequence in whatever epoch the
    producer was stored under: a new epoch starting over at sequence 0 (a transactional
    producer's next InitProducerId) is answered as a repeat of the old epoch's first batch."""

    def duplicate_of(
        self: PartitionProducers, producer_id: int, producer_epoch: int, base_sequence: int
    ) -> Any:
        del producer_epoch  # the slip: not compared with the stored one
        state = self._states.get(producer_id)
        return None if state is None else batch_with_sequence(state[1], base_sequence)

    return _patched(PartitionProducers, "duplicate_of", duplicate_of)


def _idempotent_out_of_order_taken() -> contextlib.AbstractContextManager[None]:
    return _patched(ProduceIntake, "_in_sequence", lambda self, taken, producers: taken)


class _ProcessMemory:
    """What one intake learnt itself of a partition's producers, in `PartitionProducers`' shape."""

    def __init__(self, intake: ProduceIntake, taken: list[Any]) -> None:
        self.sequences = intake.sequences
        self.topic: str = taken[0].topic if taken else ""
        self.partition: int = taken[0].partition if taken else -1

    def duplicate_of(self, producer_id: int, epoch: int, base_sequence: int) -> Any:
        return self.sequences.duplicate_of(producer_id, epoch, self.topic, self.partition, base_sequence)

    def next_sequence(self, producer_id: int, epoch: int) -> int | None:
        return self.sequences.next_sequence(producer_id, epoch, self.topic, self.partition)

    def epoch_of(self, producer_id: int) -> int | None:
        return self.sequences.epoch_of(producer_id, self.topic, self.partition)


def _idempotent_state_per_process() -> contextlib.AbstractContextManager[None]:
    """The intake checks a producer's batches against what its own process learnt (its answers,
    the sequence table), not the partition's state, which each term rebuilds from the log: it
    misses the batches another node, or an earlier run, stored."""
    repeats, in_sequence = ProduceIntake._without_repeats, ProduceIntake._in_sequence
    return _both(
        _patched(
            ProduceIntake,
            "_without_repeats",
            lambda self, taken, producers: repeats(self, taken, _ProcessMemory(self, taken)),  # type: ignore[arg-type]
        ),
        _patched(
            ProduceIntake,
            "_in_sequence",
            lambda self, taken, producers: in_sequence(self, taken, _ProcessMemory(self, taken)),  # type: ignore[arg-type]
        ),
    )


# ---------------------------------------------------------------- Kafka transactions


def _txn_marker_before_data() -> contextlib.AbstractContextManager[None]:
    """The coordinator writes a marker straight to the node (`ProduceIntake.produce`, HTTP's
    path), not through the partition's lane: record sets of the transaction still queued there
    are stored after it, outside the range it closed."""

    async def queue_markers(self: TransactionCoordinator, txn: TxnState, prepared: Prepared) -> None:
        for tp in list(prepared.firsts):
            if prepared.queued(tp) is not None:
                continue
            topic, partition = tp
            marker = marker_record(txn.producer_id, prepared.producer_epoch, prepared.commit, self.clock())
            result = await self.intake.produce(topic, partition, [marker])
            prepared.markers[tp] = result.base_offset
        prepared.fresh = False

    return _patched(TransactionCoordinator, "_queue_markers", queue_markers)


def _txn_lso_past_open_transaction() -> contextlib.AbstractContextManager[None]:
    def last_stable_offset(self: PartitionTxns, high_watermark: int) -> int:
        oldest = min(self.open.values(), default=high_watermark)
        return min(oldest + 1, high_watermark)  # should be `oldest`

    return _patched(PartitionTxns, "last_stable_offset", last_stable_offset)


def _txn_aborted_list_misses_a_range() -> contextlib.AbstractContextManager[None]:
    original = PartitionTxns.aborted_between

    def aborted_between(self: PartitionTxns, start: int, stop: int) -> list[tuple[int, int]]:
        return original(self, start, stop)[1:]  # the oldest overlapping range left out

    return _patched(PartitionTxns, "aborted_between", aborted_between)


def _txn_start_offset_past_open_transaction() -> contextlib.AbstractContextManager[None]:
    async def start_offset_held(
        self: housekeeper_module.Housekeeper,  # noqa: ARG001
        actor: PartitionActor,  # noqa: ARG001
        offset: int,
    ) -> int:
        return offset  # should stop at the oldest open transaction's first offset

    return _patched(housekeeper_module.Housekeeper, "start_offset_held", start_offset_held)


def _control_plane_ignores_incarnation() -> contextlib.AbstractContextManager[None]:
    def ours(self: MemoryClusterControl, node_id: str, incarnation: int) -> Any:  # noqa: ARG001
        return self.nodes.get(node_id)  # whichever run of the node sent it

    return _patched(MemoryClusterControl, "_ours", ours)


@contextlib.contextmanager
def _both(
    first: contextlib.AbstractContextManager[None], second: contextlib.AbstractContextManager[None]
) -> Iterator[None]:
    with first, second:
        yield


# name -> (what is broken, the patch that breaks it while a seed runs)
_MUTANTS: dict[str, tuple[str, Callable[[], contextlib.AbstractContextManager[None]]]] = {
    "lower_bound_follows_max": (
        "min_epoch_lower_bound follows max_applied_epoch on catch-up",
        _lower_bound_follows_max,
    ),
    "admit_below_window": ("the fence admits epochs below the window", _admit_below_window),
    "gc_ignores_cap": ("the GC ignores the cap (M not capped at E - 1)", _gc_ignores_cap),
    "mp_off_by_one": ("M(p) = min_epoch_lower_bound instead of min_epoch_lower_bound - 1", _mp_off_by_one),
    "gc_deletes_up_to_m_plus_1": ("the GC deletes objects with epoch <= M + 1", _gc_deletes_up_to_m_plus_1),
    "gc_skips_partitions_without_mp": (
        "the GC skips partitions without an M(p) instead of deleting nothing",
        _gc_skips_partitions_without_mp,
    ),
    "batcher_ignores_creation_epochs": (
        "the batcher stamps objects with its cached epoch, ignoring creation epochs",
        _batcher_ignores_creation_epochs,
    ),
    "slide_without_drain": (
        "the window slides without waiting for the old window's writes",
        _slide_without_drain,
    ),
    "catch_up_without_term_check": (
        "a catch-up is accepted whatever term its sender expected",
        _catch_up_without_term_check,
    ),
    "reader_pins_ignored": ("L0 readers do not pin M(p)", _reader_pins_ignored),
    "l1_lookup_bisect_left": (
        "the L1 read looks an offset up with bisect_left (an object's first offset is missed)",
        _l1_lookup_bisect_left,
    ),
    "l1_lineage_never_reread": (
        "the L1 read never reads the lineage again after it first cached it",
        _l1_lineage_never_reread,
    ),
    "placeholders_from_base": (
        "the placeholder read misses the placeholder holding the offset asked",
        _placeholders_from_base,
    ),
    "reader_l1_below_lro_only": (
        "the reader serves offsets < LRO from L1, LRO from L0",
        _reader_l1_below_lro_only,
    ),
    "stale_rejection_keeps_cache": (
        "a stale-epoch rejection does not invalidate the epoch cache",
        _stale_rejection_keeps_cache,
    ),
    "gc_idle_backoff_uncapped": ("the GC's idle backoff doubles past its cap", _gc_idle_backoff_uncapped),
    "lease_without_margin": ("the local lease deadline has no margin for clock drift", _lease_without_margin),
    "lease_margin_typo": ("the lease margin is 0.02 of the TTL, not 0.2", _lease_margin_typo),
    "lease_from_reply": ("the local lease deadline counts from the renewal's reply", _lease_from_reply),
    "leads_ignores_deadline": ("leads() ignores the lease's local deadline", _leads_ignores_deadline),
    "reader_refuses_the_start_offset": (
        "the reader refuses a fetch at the start offset itself",
        _reader_refuses_the_start_offset,
    ),
    "reader_serves_below_start": (
        "the reader serves offsets below the start offset while their objects last",
        _reader_serves_below_start,
    ),
    "retention_bytes_one_object_too_many": (
        "retention by bytes drops one object more than its bound allows",
        _retention_bytes_one_object_too_many,
    ),
    "gc_cap_at_e": ("the GC caps M at E instead of E - 1", _gc_cap_at_e),
    "l1_collect_ignores_retention": (
        "the L1 collection keeps objects below the start offset",
        _l1_collect_ignores_retention,
    ),
    "control_plane_ignores_incarnation": (
        "the control plane takes a node's calls whatever incarnation they name (a late request of "
        "the node's previous run applied to its next)",
        _control_plane_ignores_incarnation,
    ),
    "appends_ignore_term": (
        "the log store takes appends of any term (zombie leaders unfenced)",
        _appends_ignore_term,
    ),
    "gc_takes_local_watermarks": (
        "a node's GC takes M over its own partitions, not every published M(p)",
        _gc_takes_local_watermarks,
    ),
    # compaction (issue 34): only seeds with a compacted topic exercise these
    "compaction_lineage_unchecked": (
        "the store accepts a compaction result whatever its cleaner-offset map (zombies applied)",
        _compaction_lineage_unchecked,
    ),
    "compaction_tombstones_dropped_early": (
        "a compaction drops tombstones at once, not after delete.retention.ms",
        _compaction_tombstones_dropped_early,
    ),
    "compaction_keeps_first_per_key": (
        "a compaction keeps the first record per key instead of the last",
        _compaction_keeps_first_per_key,
    ),
    "compaction_drops_cleaned_last": (
        "a compaction drops the cleaned range's last record unless it is its key's latest (a "
        "commit marker just below an open transaction)",
        _compaction_drops_cleaned_last,
    ),
    "compaction_deletes_before_commit": (
        "the compactor deletes superseded objects before its result is recorded",
        _compaction_deletes_before_commit,
    ),
    "compaction_superseded_never_deleted": (
        "an accepted compaction's superseded objects are never deleted (left in the store)",
        _compaction_superseded_never_deleted,
    ),
    "idempotent_duplicates_unchecked": (
        "the produce intake does not recognise an idempotent batch already stored",
        _idempotent_duplicates_unchecked,
    ),
    "idempotent_epoch_ignored": (
        "a partition's producer state matches a batch by its sequence whatever its producer epoch",
        _idempotent_epoch_ignored,
    ),
    "idempotent_out_of_order_taken": (
        "the produce intake stores an idempotent batch that does not follow the last one stored",
        _idempotent_out_of_order_taken,
    ),
    "idempotent_state_per_process": (
        "the produce intake checks idempotent batches against its own process's memory, not the "
        "partition's state (rebuilt from the log at every term start)",
        _idempotent_state_per_process,
    ),
    # Kafka transactions (issues 35, 36): only the seeds with transactional producers (20% of
    # the single-node seeds) exercise these
    "txn_marker_before_data": (
        "a transaction's marker bypasses the partition's lane: records still queued land after it",
        _txn_marker_before_data,
    ),
    "txn_lso_past_open_transaction": (
        "the last stable offset is one past the oldest open transaction's first offset",
        _txn_lso_past_open_transaction,
    ),
    "txn_aborted_list_misses_a_range": (
        "a read_committed fetch's aborted-transactions list leaves out the oldest range",
        _txn_aborted_list_misses_a_range,
    ),
    "txn_start_offset_past_open_transaction": (
        "DeleteRecords and retention move a start offset past an open transaction's first offset",
        _txn_start_offset_past_open_transaction,
    ),
}

MUTATIONS: dict[str, str] = {name: what for name, (what, _) in _MUTANTS.items()}
# Rules only a cluster exercises: `levelzero sim --mutate` runs these with CLUSTER_NODES nodes.
CLUSTER_MUTATIONS = frozenset(
    {
        "appends_ignore_term",
        "control_plane_ignores_incarnation",
        "gc_takes_local_watermarks",
        "lease_without_margin",
        "lease_from_reply",
        "leads_ignores_deadline",
        "lease_margin_typo",
        "idempotent_state_per_process",
    }
)
CLUSTER_NODES = 3


@contextlib.contextmanager
def applied(name: str | None) -> Iterator[None]:
    """Break the rule `name` while the block runs (nothing when None)."""
    if name is None:
        yield
        return
    with _MUTANTS[name][1]():
        yield
