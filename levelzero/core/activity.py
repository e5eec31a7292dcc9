"""Which partitions moved since a periodic task last looked.

A node may lead 10,000 partitions of which a handful take writes. Periodic work (the
housekeeper's idle check, its state samples, the reconciler's scan) would cost a visit per
partition per interval if it walked them all; instead each partition, whenever its state moves
(a durable append applied, a new term, a reader released), notes its name here, and each
periodic task takes the names noted since it last looked. A partition that did not move since
a task last found it settled needs nothing from that task: its state is what it was.

Every consumer has its own set, so one taking its names does not hide them from another.
A set holds each name once, so its size is bounded by the partition count.
"""

from __future__ import annotations


class ActivityBoard:
    def __init__(self, consumers: tuple[str, ...]) -> None:
        assert len(set(consumers)) == len(consumers), consumers
        self._touched: dict[str, set[str]] = {consumer: set() for consumer in consumers}
        self._sets = tuple(self._touched.values())
        # Raised by every `take`: a name touched in this round is in every set already, so a
        # partition that moves often notes itself once a round (it keeps the round it did).
        self.round = 0

    def touch(self, name: str) -> None:
        """`name`'s state moved: every consumer sees it at its next look."""
        for touched in self._sets:
            touched.add(name)

    def take(self, consumer: str) -> set[str]:
        """The names noted since `consumer` last took them (and forget them for it)."""
        taken = self._touched[consumer]
        self._touched[consumer] = set()
        self._sets = tuple(self._touched.values())
        self.round += 1
        return taken

    def pending(self, consumer: str) -> int:
        return len(self._touched[consumer])
