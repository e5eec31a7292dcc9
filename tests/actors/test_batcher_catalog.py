"""An uploaded object's catalog row (`l0_objects`, the GC's list of this node's uploads): written
once the object's placeholders are durable, never beside them in a commit of its own that holds
them back; the rows of objects fenced meanwhile go together, one write on its way at a time."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
from test_gc_actor import node_config, produce

from levelzero.core.entries import Placeholder
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.protocols import Append, L0ObjectRow, OnDurable
from levelzero.testing.nodes import running_node


class CatalogWatch(MemoryLogStore):
    """Notes which objects' placeholders are durable, and what each catalog write found; holds
    catalog writes while `hold` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.durable_keys: set[str] = set()
        self.recorded_after_durable: list[tuple[str, bool]] = []
        self.writes_started = 0
        self.writes_on_their_way = 0
        self.most_on_their_way = 0
        self.hold: anyio.Event | None = None

    async def append_many(self, appends: Sequence[Append], on_durable: OnDurable | None = None) -> list:  # type: ignore[type-arg]
        refused = await super().append_many(appends, on_durable)
        for append in appends:
            for record in append.records:
                if isinstance(record.entry, Placeholder):
                    self.durable_keys.add(record.entry.object_key)
        return refused

    async def record_l0_object(self, row: L0ObjectRow) -> None:
        self.writes_started += 1
        self.writes_on_their_way += 1
        self.most_on_their_way = max(self.most_on_their_way, self.writes_on_their_way)
        try:
            self.recorded_after_durable.append((row.key, row.key in self.durable_keys))
            if self.hold is not None:
                await self.hold.wait()
            await super().record_l0_object(row)
        finally:
            self.writes_on_their_way -= 1


async def wait_until(condition, steps: int = 1000) -> None:  # type: ignore[no-untyped-def]
    for _ in range(steps):
        if condition():
            return
        await anyio.sleep(0.001)
    raise AssertionError("condition not reached")


async def test_an_objects_row_is_written_once_its_placeholders_are_durable() -> None:
    log_store = CatalogWatch()
    async with running_node(node_config(), log_store, MemoryObjectStore()) as node:
        await node.create_topic("t", 3)
        keys = [await produce(node, "t", p, b"v%d" % p) for p in range(3)]
        await wait_until(lambda: set(keys) <= set(log_store.l0_objects))
    assert len(set(keys)) == 3
    # Every row found its object's placeholders durable already (written at the fence's start,
    # as before, the row went in before them).
    assert sorted(log_store.recorded_after_durable) == sorted((key, True) for key in keys)
    assert {key: log_store.l0_objects[key].extents for key in keys} == dict.fromkeys(keys, 1)


async def test_rows_of_objects_fenced_while_a_row_is_written_go_together_afterwards() -> None:
    log_store = CatalogWatch()
    log_store.hold = anyio.Event()
    async with running_node(node_config(), log_store, MemoryObjectStore()) as node:
        await node.create_topic("t", 1)
        first = await produce(node, "t", 0, b"a")  # its producer is answered: no row needed
        await wait_until(lambda: log_store.writes_started == 1)
        later = [await produce(node, "t", 0, b"v%d" % n) for n in range(3)]
        for _ in range(20):
            await anyio.lowlevel.checkpoint()
        # One catalog write on its way at a time: the later rows wait for the first.
        assert log_store.writes_started == 1 and log_store.l0_objects == {}
        log_store.hold.set()
        await wait_until(lambda: len(log_store.l0_objects) == 4)
    assert set(log_store.l0_objects) == {first, *later}
    assert log_store.writes_started == 4
    assert log_store.most_on_their_way == 3  # the three waiting rows went out together


async def test_a_shutdown_writes_the_rows_still_waiting() -> None:
    log_store = CatalogWatch()
    log_store.hold = anyio.Event()
    async with running_node(node_config(), log_store, MemoryObjectStore()) as node:
        await node.create_topic("t", 1)
        keys = [await produce(node, "t", 0, b"v%d" % n) for n in range(3)]
        await wait_until(lambda: log_store.writes_started >= 1)
        log_store.hold.set()
        await node.shutdown()
    assert set(log_store.l0_objects) == set(keys)
