"""Producers and each node's batcher: `levelzero/actors/batcher.py` as events.

A produce request goes to the batcher of its partition's current leader. After the linger the
batch becomes one L0 object, stamped `max(cached epoch, creation epochs inside)`, uploaded (slow
or failing, maybe after the effect); then one fence message per extent goes to the leader the
requests were routed to. A stale-epoch rejection invalidates the node's cache and retries the
requests in a new object (bounded); an object rejected everywhere is an orphan for the GC.
"""

from __future__ import annotations

from functools import partial

from levelzero.core.entries import LogRecord, Placeholder
from levelzero.core.errors import NotLeader, StaleClusterEpoch
from levelzero.core.keys import format_l0_key, new_uuid
from levelzero.core.l0format import Record, build_object, encode_extent

from .model import Attempt, Node, Request, WriteMsg, short


class BatcherMixin:
    """Mixed into `World` (world.py): `self` is the world, with its scheduler, rng and stores."""

    def _produce_tick(self) -> None:
        if self.phase != "workload":
            return
        self.after(self.expo(self.cfg.produce_interval_s), "produce", self._produce_tick)
        parts = list(self.parts.values())
        if self.rng.random() < self.cfg.newest_partition_write_p:
            part = parts[-1]
        else:
            part = self.rng.choice(parts)
        count = self.rng.randint(1, self.cfg.records_per_write_max)
        records = []
        for _ in range(count):
            key = None if self.rng.random() < 0.5 else self.rng.randbytes(4)
            records.append(Record(key, self.rng.randbytes(int(self.uniform(self.cfg.value_bytes)))))
        self.stats.writes_submitted += 1
        rt = self.current_leader(part)
        if rt is None:
            self.stats.writes_unavailable += 1
            return
        size = sum(len(r.value) + len(r.key or b"") + 8 for r in records)
        now = self.sched.now
        change = rt.change if rt.change and now - rt.change.at <= self.cfg.stall_window_s else None
        request = Request(self.new_id(), part.pid, rt, records, size, now, change)
        if change is not None:
            change.writes += 1
        node = rt.node
        node.requests_in_flight += 1
        node.batch.append(request)
        node.batch_bytes += size
        if len(node.batch) == 1:
            self.node_after(
                node, self.cfg.linger_s, "linger", self._flush_batch, node, node.batch_gen
            )
        elif node.batch_bytes >= self.cfg.batch_bytes_max:
            self._flush_batch(node, node.batch_gen)

    def _flush_batch(self, node: Node, gen: int) -> None:
        if gen != node.batch_gen or not node.batch:
            return
        batch, node.batch, node.batch_bytes = node.batch, [], 0
        node.batch_gen += 1
        self._upload(node, batch)

    def _upload(self, node: Node, requests: list[Request]) -> None:
        now = self.sched.now
        by_pid: dict[int, list[Request]] = {}
        for r in requests:
            if r.attempts == 0:
                r.first_attempt_at = now
            r.attempts += 1
            r.attempt_at = now
            by_pid.setdefault(r.pid, []).append(r)
        cached = self.cache_get(node)
        epoch = max(cached, *(self.parts[pid].creation_epoch for pid in by_pid))
        extents = [
            (
                pid,
                encode_extent([rec for r in reqs for rec in r.records]),
                sum(len(r.records) for r in reqs),
            )
            for pid, reqs in by_pid.items()
        ]
        data, headers = build_object(epoch, extents)
        key = format_l0_key(
            self.rng.randrange(self.cfg.prefixes), epoch, new_uuid(self.rng.getrandbits(128))
        )
        attempt = Attempt(node, key, epoch, by_pid, headers)
        delay = self.delay(self.cfg.upload_s, self.cfg.slow_upload_p, self.cfg.slow_upload_s)
        self.node_after(
            node,
            delay,
            f"uploaded {short(key)} ({len(headers)} extents)",
            self._uploaded,
            attempt,
            data,
        )

    def _uploaded(self, attempt: Attempt, data: bytes) -> None:
        fails = self.chance(self.cfg.put_error_p)
        if not fails or self.rng.random() < 0.5:  # a timeout after the effect leaves an orphan
            self.store.put(attempt.key, data, self.sched.now)
            self.stats.objects_written += 1
        if fails:
            self.note(f"put {short(attempt.key)} failed")
            for reqs in attempt.by_pid.values():
                for r in reqs:
                    self._finish(r, acked=False)
            return
        attempt.outstanding = len(attempt.headers)
        for header in attempt.headers:
            reqs = attempt.by_pid[header.pid]
            placeholder = Placeholder(
                epoch=attempt.epoch,
                object_key=attempt.key,
                byte_offset=header.byte_offset,
                byte_length=header.byte_length,
                record_count=header.record_count,
                checksum=header.checksum,
            )
            rt = reqs[0].leader
            msg = WriteMsg(attempt.epoch, placeholder, partial(self._fenced, attempt, reqs))
            self.node_after(
                attempt.node,
                self.message_delay(),
                f"fence {rt} e{attempt.epoch} {short(attempt.key)}",
                rt.on_write,
                msg,
            )

    def _fenced(
        self,
        attempt: Attempt,
        reqs: list[Request],
        record: LogRecord | None,
        error: Exception | None,
    ) -> None:
        node = attempt.node
        if error is None:
            assert record is not None
            attempt.rejected_everything = False
            offset = record.base_offset
            for r in reqs:
                for rec in r.records:
                    self.truth.ack(r.pid, offset, rec, attempt.key)
                    offset += 1
                self._finish(r, acked=True)
        elif isinstance(error, StaleClusterEpoch):
            self.stats.stale_rejections += 1
            self.cache_invalidate_below(node, error.window_max)
            for r in reqs:
                r.rejections += 1
                if r.change is not None:
                    r.change.rejections += 1
                if r.attempts <= self.cfg.stale_retries_max:
                    attempt.retry.append(r)
                else:
                    self._finish(r, acked=False)
        else:
            if isinstance(error, NotLeader):
                self.stats.not_leader += 1
            for r in reqs:
                self._finish(r, acked=False)
        attempt.outstanding -= 1
        if attempt.outstanding == 0:
            if attempt.rejected_everything:
                self.stats.orphans += 1
            if attempt.retry:
                self.stats.stale_retries += len(attempt.retry)
                self.node_after(
                    node,
                    0.0,
                    f"retry {len(attempt.retry)} writes",
                    self._upload,
                    node,
                    attempt.retry,
                )

    def _finish(self, r: Request, *, acked: bool) -> None:
        node = r.leader.node
        node.requests_in_flight -= 1
        assert node.requests_in_flight >= 0
        if acked:
            self.stats.writes_acked += 1
            self.stats.records_acked += len(r.records)
        else:
            self.stats.writes_failed += 1
        change = r.change
        if change is None:
            return
        if acked:
            change.stall_s = max(change.stall_s, r.attempt_at - r.first_attempt_at)
        elif r.rejections:
            change.writes_failed += 1
            change.stall_s = max(change.stall_s, self.sched.now - r.first_attempt_at)
        if r.rejections > 1:
            change.writes_over_one_retry += 1
