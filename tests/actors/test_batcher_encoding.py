"""Where the batcher encodes an object: a large one (its copy into the object's buffer and its
extents' CRC-32s) on a worker thread, so the event loop answers fences and commits meanwhile; a
small one on the loop, where a thread hop would cost more than the work."""

from __future__ import annotations

import threading

import pytest
from test_gc_actor import node_config

from levelzero.actors import batcher as batcher_module
from levelzero.core.entries import Placeholder
from levelzero.core.l0format import EncodedExtents, Record, decode_extent
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.testing.nodes import running_node


async def test_a_large_object_is_encoded_on_a_worker_thread_and_a_small_one_on_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    encoded_on: list[tuple[int, bool]] = []  # (bytes of records, on the loop's thread)
    loop_thread = threading.get_ident()

    class Watched(EncodedExtents):
        def __init__(self, extents) -> None:  # type: ignore[no-untyped-def]
            super().__init__(extents)
            size = len(self.buffer) - self.room  # the extents' encoded bytes
            encoded_on.append((size, threading.get_ident() == loop_thread))

    monkeypatch.setattr(batcher_module, "EncodedExtents", Watched)
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    large = bytes(range(256)) * (batcher_module.ENCODE_OFF_LOOP_BYTES_MIN // 256)
    async with running_node(node_config(), log_store, objects) as node:
        await node.create_topic("t", 1)
        await node.produce("t", 0, [Record(None, b"small")])
        await node.produce("t", 0, [Record(b"k", large)])
        pid = node.partition("t", 0).row.pid
        placeholders = [r.entry for r in log_store.logs[pid] if isinstance(r.entry, Placeholder)]
        values = []
        for p in placeholders:
            data = await objects.get(p.object_key, p.byte_offset, p.byte_length)
            values += [r.value for r in decode_extent(data, p.checksum, p.record_count, "t/0")]
    assert values == [b"small", large]  # the object's bytes and CRC-32s are the same either way
    assert [on_loop for _, on_loop in encoded_on] == [True, False]
    assert encoded_on[1][0] >= batcher_module.ENCODE_OFF_LOOP_BYTES_MIN > encoded_on[0][0]
