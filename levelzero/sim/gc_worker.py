"""GC rounds that span virtual time (DESIGN.md "GC"), one worker per node.

Step 1 snapshots the partition set (the board's names) and the cluster epoch E; step 2, after a
delay during which epochs bump and partitions are created, reads the published `M(p)`s and takes
`compute_cluster_watermark(E, mps)`; step 3 lists per prefix with `scan_prefix`; step 4 deletes
in batches that can fail whole (before or after the effect) or per key. Just before each actual
delete, the ground truth checks invariant 1.
"""

from __future__ import annotations

from levelzero.core.errors import InvariantViolation
from levelzero.core.gc import batches, compute_cluster_watermark, scan_prefix
from levelzero.core.keys import parse_l0_key

from .model import GcRound, Node, short
from .violation import SimulationViolation


class GcMixin:
    """Mixed into `World` (world.py): `self` is the world, with its scheduler, rng and stores."""

    def _gc_tick(self, node: Node) -> None:
        self.node_after(node, self.cfg.gc_interval_s, "gc", self._gc_tick, node)
        if node.gc_round is not None:
            return
        # Step 1: snapshot the partition set and the cluster epoch.
        gc_round = GcRound(node, self.board.names(), self.epoch, self.sched.now)
        node.gc_round = gc_round
        self.stats.gc_rounds += 1
        delay = self.delay(
            self.cfg.gc_read_delay_s, self.cfg.slow_gc_p, self.cfg.slow_gc_read_delay_s
        )
        self.node_after(
            node, delay, f"gc read M(p)s (E={gc_round.cluster_epoch})", self._gc_decide, gc_round
        )

    def _gc_decide(self, gc_round: GcRound) -> None:
        node = gc_round.node
        # Step 2: read the published M(p)s, lazily, long after the snapshot maybe.
        mps = {name: self.board.get(name) for name in gc_round.names}
        decision = compute_cluster_watermark(
            gc_round.cluster_epoch, mps, cap=self.mutation != "gc_ignores_cap"
        )
        try:
            node.gc_watermark.observe(decision.m)
        except InvariantViolation as exc:
            raise SimulationViolation(
                "2", f"GC of n{node.id}: {exc} (E={gc_round.cluster_epoch}, M(p)s {mps})"
            ) from exc
        m = gc_round.m = decision.m
        self.note(
            f"gc n{node.id}: E={gc_round.cluster_epoch} M={m} "
            f"holders={decision.holders} blocked={decision.blocked_by}"
        )
        if m is None:
            self.stats.gc_rounds_blocked += 1
            node.gc_round = None
            return
        if self.chance(self.cfg.list_error_p):
            node.gc_round = None
            return
        # Step 3: list per prefix, stop a prefix at its first epoch above M.
        keys: list[str] = []
        for prefix in self.store.l0_prefixes():
            scan = scan_prefix(
                self.store.list_l0_prefix(prefix), m, self.sched.now, self.cfg.grace_s
            )
            for obj in scan.deletable:
                assert parse_l0_key(obj.key).epoch <= m, (obj.key, m)
                keys.append(obj.key)
        if not keys:
            node.gc_round = None
            return
        todo = batches(keys, self.cfg.gc_delete_batch_keys)
        self.node_after(
            node,
            self.uniform(self.cfg.gc_delete_s),
            f"gc delete batch 1/{len(todo)}",
            self._gc_delete,
            gc_round,
            todo,
            0,
        )

    def _gc_delete(self, gc_round: GcRound, todo: list[list[str]], i: int) -> None:
        # Step 4: delete in batches; a batch may fail whole (before or after its effect) or per key.
        node = gc_round.node
        batch = todo[i]
        whole = self.chance(self.cfg.delete_batch_error_p)
        if whole and self.rng.random() < 0.5:
            self.stats.gc_delete_errors += len(batch)
        else:
            for key in batch:
                if not whole and self.chance(self.cfg.delete_key_error_p):
                    self.stats.gc_delete_errors += 1
                    continue
                if self.store.exists(key):
                    self.truth.on_l0_delete(
                        key, f"GC of n{node.id} (E={gc_round.cluster_epoch}, M={gc_round.m})"
                    )
                    self.store.delete(key)
                    self.stats.objects_deleted += 1
                    self.note(f"gc n{node.id} deleted {short(key)}")
            if whole:
                self.stats.gc_delete_errors += len(batch)
        if i + 1 < len(todo):
            self.node_after(
                node,
                self.uniform(self.cfg.gc_delete_s),
                f"gc delete batch {i + 2}/{len(todo)}",
                self._gc_delete,
                gc_round,
                todo,
                i + 1,
            )
        else:
            node.gc_round = None
