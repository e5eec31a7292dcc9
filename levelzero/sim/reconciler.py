"""The reconciler and the L1 catalog: `levelzero/actors/reconciler.py` and `l1.py` as events.

A job copies placeholders `(LRO, HWM]` of one leader into one L1 object (pinning `M(p)` while it
reads the extents), records it COPY_STARTED → COPY_FINISHED, and sends a catch-up with the term it
read under. Jobs can be slow, die mid-copy, and outlive their leader's term (zombies): their
catch-up is then rejected and they delete their object through DELETE_STARTED → DELETE_FINISHED,
never deleting what the deleter's lineage (`l1_range_valid`) still serves.
"""

from __future__ import annotations

from functools import partial

from levelzero.core.entries import AdvanceReconciledOffset, LogRecord, Placeholder
from levelzero.core.keys import format_l1_key, new_uuid
from levelzero.core.l0format import Record, build_object, decode_extent, encode_extent
from levelzero.core.state import PartitionState

from .leader import Leader
from .model import Node, ReconcileJob, short
from .stores import L1Row, L1State
from .violation import SimulationViolation


class ReconcilerMixin:
    """Mixed into `World` (world.py): `self` is the world, with its scheduler, rng and stores."""

    def _reconciler_tick(self, node: Node) -> None:
        self.node_after(
            node, self.cfg.reconciler_interval_s, "reconciler", self._reconciler_tick, node
        )
        for rt in list(node.leaders.values()):
            if rt.deposed is not None or rt.job is not None:
                continue
            self._collect_l1(rt)
            if rt.state.has_unreconciled_data:
                self._start_job(rt)

    def _start_job(self, rt: Leader) -> None:
        state = rt.state
        lro, hwm = state.lro, state.high_watermark
        placeholders = [
            r
            for r in rt.part.log.placeholders_from(lro + 1, self.cfg.placeholders_per_l1_max)
            if r.base_offset < hwm
        ]
        assert placeholders and placeholders[0].base_offset == lro + 1, (rt, lro, placeholders[:1])
        pin, _ = rt.pins.register(state.mp)
        keys = frozenset(r.entry.object_key for r in placeholders)  # type: ignore[union-attr]
        job = ReconcileJob(rt, rt.term, pin, placeholders, keys)
        rt.job = job
        delay = self.delay(
            self.cfg.reconcile_read_s, self.cfg.slow_reconcile_p, self.cfg.slow_reconcile_s
        )
        self.node_after(rt.node, delay, f"reconcile read {rt} from {lro + 1}", self._job_read, job)

    def _job_end(self, job: ReconcileJob) -> None:
        if job.leader.job is job:
            job.leader.job = None

    def _job_read(self, job: ReconcileJob) -> None:
        rt = job.leader
        records: list[Record] = []
        failed = self.chance(self.cfg.get_error_p)
        if not failed:
            for record in job.placeholders:
                p = record.entry
                assert isinstance(p, Placeholder)
                if not self.store.exists(p.object_key):
                    if rt.current:
                        raise SimulationViolation(
                            "1",
                            f"reconciler of current leader {rt} found {short(p.object_key)} "
                            f"(log offset {record.log_offset}, data offset {record.base_offset}) deleted",
                        )
                    failed = True  # a zombie reading after the new leader moved M(p): harmless
                    break
                data = self.store.get(p.object_key)[p.byte_offset : p.byte_offset + p.byte_length]
                records.extend(decode_extent(data, p.checksum, p.record_count, f"{rt} reconcile"))
        assert job.pin is not None
        rt.pins.release(job.pin)
        job.pin = None
        rt.publish()
        if failed:
            self._job_end(job)
            return
        first, last_record = job.placeholders[0], job.placeholders[-1]
        base = first.base_offset
        last = last_record.base_offset + last_record.entry.record_count - 1  # type: ignore[union-attr]
        part = rt.part
        key = format_l1_key(
            self.cfg.topic, part.pid, base, last, job.term, new_uuid(self.rng.getrandbits(128))
        )
        data, _ = build_object(job.term, [(part.pid, encode_extent(records), len(records))])
        now = self.sched.now
        job.row = L1Row(
            key,
            part.pid,
            base,
            last,
            last_record.log_offset,
            job.term,
            L1State.COPY_STARTED,
            now,
            now,
        )
        self.l1.insert(job.row)
        if self.chance(self.cfg.reconcile_abort_p):
            self.note(f"reconciler of {rt} dies mid-copy of {short(key)}")
            self._job_end(job)
            return
        delay = self.delay(self.cfg.upload_s, self.cfg.slow_upload_p, self.cfg.slow_upload_s)
        self.node_after(
            rt.node,
            delay,
            f"L1 uploaded {short(key)} [{base}, {last}]",
            self._job_uploaded,
            job,
            data,
        )

    def _job_uploaded(self, job: ReconcileJob, data: bytes) -> None:
        row = job.row
        assert row is not None
        if self.chance(self.cfg.l1_put_error_p):
            self._job_end(job)
            return
        if row.state != L1State.COPY_STARTED:
            # Collected as a stale COPY_STARTED meanwhile: the copy is void, do not claim it.
            self._job_end(job)
            return
        self.store.put(row.key, data, self.sched.now)
        finished = self.l1.transition(
            row.key, L1State.COPY_STARTED, L1State.COPY_FINISHED, self.sched.now
        )
        assert finished, row
        self.stats.l1_written += 1
        rt = job.leader
        entry = AdvanceReconciledOffset(row.last_offset, row.lrlo)
        self.node_after(
            rt.node,
            self.message_delay(),
            f"catch-up {rt} lro {row.last_offset} lrlo {row.lrlo} (reconciler t{job.term})",
            rt.on_control,
            entry,
            job.term,
            partial(self._job_caught_up, job),
        )

    def _job_caught_up(
        self, job: ReconcileJob, record: LogRecord | None, error: Exception | None
    ) -> None:
        self._job_end(job)
        if error is None:
            self.stats.catch_ups += 1
            return
        self.stats.catch_ups_rejected += 1
        assert job.row is not None
        self.note(f"catch-up of {job.leader} rejected: {error}")
        self._delete_l1(job.leader, job.row, "catch-up rejected")

    def _collect_l1(self, rt: Leader) -> None:
        """L1Catalog.collect: resume deletes, drop stale copies and out-of-lineage objects."""
        now = self.sched.now
        for row in self.l1.of_partition(rt.part.pid):
            if row.state == L1State.DELETE_FINISHED:
                continue
            stale = now - row.updated_at > self.cfg.copy_deadline_s
            reason = None
            if row.state == L1State.DELETE_STARTED:
                reason = "resuming an unfinished delete"
            elif row.state == L1State.COPY_STARTED and stale:
                reason = "stale COPY_STARTED"
            elif row.state == L1State.COPY_FINISHED and not self._l1_valid(rt.state, row):
                if row.term < rt.term or stale:
                    reason = f"outside the term lineage (term {row.term})"
            if reason is not None:
                self._delete_l1(rt, row, reason)

    @staticmethod
    def _l1_valid(state: PartitionState, row: L1Row) -> bool:
        return row.state == L1State.COPY_FINISHED and state.l1_range_valid(
            row.term, row.base_offset, row.last_offset
        )

    def _delete_l1(self, rt: Leader, row: L1Row, reason: str) -> None:
        """L1Catalog.delete: two-phase, and never what the deleter's lineage still serves."""
        if row.term > rt.term:
            return
        if self._l1_valid(rt.state, row) and row.last_offset >= rt.state.start_offset:
            return
        if row.state != L1State.DELETE_STARTED:
            before = row.state
            self.truth.on_l1_delete_started(row)
            if not self.l1.transition(row.key, before, L1State.DELETE_STARTED, self.sched.now):
                return
        if self.chance(self.cfg.delete_key_error_p):
            return  # stays DELETE_STARTED; the next collect resumes it
        self.store.delete(row.key)
        self.l1.transition(row.key, L1State.DELETE_STARTED, L1State.DELETE_FINISHED, self.sched.now)
        self.stats.l1_deleted += 1
        self.note(f"{rt} deleted {short(row.key)} ({reason})")
