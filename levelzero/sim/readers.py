"""Readers: `levelzero/actors/reader.py` as events. An L0 read pins `M(p)` at the leader for the
virtual time it takes to read its extents; an L1 read goes through the valid lineage. Both compare
what they read with what was acknowledged.
"""

from __future__ import annotations

from levelzero.core.entries import Placeholder
from levelzero.core.l0format import decode_extent

from .leader import Leader
from .model import L0Read, short
from .stores import L1Row, L1State
from .violation import SimulationViolation


class ReadersMixin:
    """Mixed into `World` (world.py): `self` is the world, with its scheduler, rng and stores."""

    def _read_tick(self) -> None:
        if self.phase != "workload":
            return
        self.after(self.expo(self.cfg.read_interval_s), "read", self._read_tick)
        leaders = [rt for p in self.parts.values() if (rt := self.current_leader(p)) is not None]
        if not leaders:
            return
        rt = self.rng.choice(leaders)
        state = rt.state
        if state.lro >= state.start_offset and (
            self.rng.random() < 0.4 or state.lro + 1 >= state.high_watermark
        ):
            self._read_l1(rt, self.rng.randint(state.start_offset, state.lro))
        elif state.lro + 1 < state.high_watermark:
            self._read_l0(rt, self.rng.randint(state.lro + 1, state.high_watermark - 1))

    def _read_l0(self, rt: Leader, offset: int) -> None:
        """Reader._fetch_l0: pin M(p), read placeholders and their extents over time, unpin."""
        self.stats.l0_reads += 1
        hwm = rt.state.high_watermark
        pin, _ = rt.pins.register(rt.state.mp)
        placeholders = [r for r in rt.part.log.placeholders_from(offset, 4) if r.base_offset < hwm]
        keys = frozenset(r.entry.object_key for r in placeholders)  # type: ignore[union-attr]
        read = L0Read(self.new_id(), rt, pin, offset, placeholders, keys)
        rt.readers[read.rid] = read
        self.node_after(
            rt.node,
            self.uniform(self.cfg.read_s),
            f"L0 read {rt} @{offset} done",
            self._read_l0_done,
            read,
        )

    def _read_l0_done(self, read: L0Read) -> None:
        rt = read.leader
        del rt.readers[read.rid]
        if rt.current:
            for record in read.placeholders:
                p = record.entry
                assert isinstance(p, Placeholder)
                if not self.store.exists(p.object_key):
                    raise SimulationViolation(
                        "1", f"reader of {rt} pinned M(p) and found {short(p.object_key)} deleted"
                    )
                data = self.store.get(p.object_key)[p.byte_offset : p.byte_offset + p.byte_length]
                decoded = decode_extent(data, p.checksum, p.record_count, f"{rt} L0 read")
                for i, rec in enumerate(decoded):
                    self.truth.compare(rt.part, record.base_offset + i, rec, "L0 read")
        rt.pins.release(read.pin)
        rt.publish()

    def _read_l1(self, rt: Leader, offset: int) -> None:
        self.stats.l1_reads += 1
        rows = [
            row
            for row in self.l1.of_partition(rt.part.pid)
            if self._l1_valid(rt.state, row) and row.base_offset <= offset <= row.last_offset
        ]
        if len(rows) != 1:
            raise SimulationViolation(
                "3",
                f"{rt}: offset {offset} <= LRO {rt.state.lro} is served by {len(rows)} valid L1 objects",
            )
        self.node_after(
            rt.node,
            self.uniform(self.cfg.read_s),
            f"L1 read {rt} @{offset} done",
            self._read_l1_done,
            rt,
            rows[0],
            offset,
        )

    def _read_l1_done(self, rt: Leader, row: L1Row, offset: int) -> None:
        if not rt.current or row.state != L1State.COPY_FINISHED:
            return
        for i, rec in enumerate(self.truth.l1_records(row)):
            if row.base_offset + i >= offset:
                self.truth.compare(rt.part, row.base_offset + i, rec, "L1 read")
