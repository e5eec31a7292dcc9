"""Deleting a topic, adding partitions and deleting records, on a node over memory stores: what
each leaves in the object store after the reconciler, the housekeeper and a GC round (driven
here, never waited for), and what reads and writes see."""

from __future__ import annotations

import dataclasses
import logging
import types
from typing import cast

import anyio
import pytest

from levelzero.actors.batcher import BatcherConfig
from levelzero.actors.gc import GcConfig
from levelzero.actors.housekeeper import HousekeeperConfig
from levelzero.actors.intake import ProduceIntake
from levelzero.actors.l1 import L1Catalog
from levelzero.actors.node import NodeConfig
from levelzero.actors.partition import PartitionActor
from levelzero.actors.reconciler import ReconcilerConfig
from levelzero.core.errors import (
    InvalidInput,
    OffsetOutOfRange,
    PolicyViolation,
    ShuttingDown,
    StorageError,
    UnknownTopic,
)
from levelzero.core.entries import LogRecord
from levelzero.core.keys import (
    ENDS_ROOT,
    RESTORES_ROOT,
    L0_ROOT,
    L1_ROOT,
    decode_topic_record,
    format_end_key,
    format_restore_key,
    parse_l0_key,
    topic_record_key,
)
from levelzero.core.l0format import Record, read_header
from levelzero.daemon.recover import rebuild_from_bucket
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.protocols import L1Row, L1State, PartitionRow
from levelzero.testing.entries import placeholder
from levelzero.testing.latency_store import Latency, LatencyObjectStore
from levelzero.testing.nodes import running_node


def make_config() -> NodeConfig:
    return NodeConfig(
        epoch_bump_interval_s=None,
        epoch_cache_ttl_s=0.0,
        batcher=BatcherConfig(linger_ms=1),
        reconciler=ReconcilerConfig(enabled=False, object_age_max_s=0.0),  # an L1 object every pass
        housekeeper=HousekeeperConfig(enabled=False, idle_after_s=0.0),
        gc=GcConfig(enabled=False, grace_s=0.0),
    )


def keys(store: MemoryObjectStore, prefix: str) -> list[str]:
    return sorted(k for k in store._objects if k.startswith(prefix))


async def produce(node, topic: str, partition: int, count: int, tag: bytes = b"v") -> None:
    for i in range(count):
        await node.produce(topic, partition, [Record(None, tag + str(i).encode())])


async def settle(node) -> None:
    """Reconcile, then advance the epoch and every partition past it, twice: M passes every
    epoch written before."""
    await node.reconciler.run_round()
    for _ in range(2):
        await node.epochs.advance()
        await node.housekeeper.run_round(force=True)


def pids_in(store: MemoryObjectStore, key: str) -> set[int]:
    return {extent.pid for extent in read_header(store._objects[key][0], key).extents}


async def test_a_deleted_topics_objects_are_all_collected_and_others_stay() -> None:
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(make_config(), log_store, objects) as node:
        await node.create_topic("gone", 2)
        await node.create_topic("kept", 1)
        for p in range(2):
            await produce(node, "gone", p, 5)
        await produce(node, "kept", 0, 5)
        await settle(node)  # some of it in L1 ...
        await produce(node, "gone", 0, 3, b"late")  # ... some only in L0
        gone_pids = {actor.row.pid for actor in node.partitions() if actor.row.topic == "gone"}
        assert keys(objects, f"{L1_ROOT}gone/")
        only_gone = [k for k in keys(objects, L0_ROOT) if pids_in(objects, k) <= gone_pids]
        assert only_gone  # the late records' object, at least
        assert topic_record_key("gone") in objects._objects

        rows = await node.delete_topic("gone")
        assert {row.pid for row in rows} == gone_pids
        assert "gone" not in node.topics()
        assert "gone/0" not in node.board.snapshot()
        assert topic_record_key("gone") not in objects._objects
        with pytest.raises(UnknownTopic):
            await node.produce("gone", 0, [Record(None, b"x")])
        with pytest.raises(UnknownTopic):
            await node.fetch("gone", 0, 0, 1 << 20)

        await settle(node)
        report = await node.gc.run_round()
        assert report.m is not None
        assert keys(objects, f"{L1_ROOT}gone/") == []
        assert await log_store.deleted_partitions() == []
        assert [k for k in keys(objects, L0_ROOT) if pids_in(objects, k) <= gone_pids] == []
        assert max(parse_l0_key(k).epoch for k in only_gone) <= report.m
        assert keys(objects, f"{L1_ROOT}kept/")
        assert [r.value for r in (await node.fetch("kept", 0, 0, 1 << 20)).records] == [
            f"v{i}".encode() for i in range(5)
        ]


async def test_a_recreated_topic_starts_empty() -> None:
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(make_config(), log_store, objects) as node:
        await node.create_topic("t", 1)
        await produce(node, "t", 0, 4)
        await node.reconciler.run_round()
        await node.delete_topic("t")
        await node.create_topic("t", 1)
        assert node.partition("t", 0).state.high_watermark == 0
        await produce(node, "t", 0, 2, b"new")
        await node.reconciler.run_round()
        await node.gc.run_round()  # collects the old partition's L1 objects, never the new one's
        result = await node.fetch("t", 0, 0, 1 << 20)
        assert [r.value for r in result.records] == [b"new0", b"new1"]
        (l1,) = keys(objects, f"{L1_ROOT}t/0/")
        assert l1 == (await log_store.l1_list(node.partition("t", 0).row.pid))[0].key


async def test_a_crash_midway_through_collecting_resumes_and_strays_are_swept() -> None:
    """A deleted partition with one row left DELETE_STARTED (a crash between the two phases),
    one COPY_STARTED (a copy in flight) and one object no row names (a writer that crashed
    between its upload and its row's end): a later round leaves none of them."""
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(make_config(), log_store, objects) as node:
        await node.create_topic("t", 1)
        await produce(node, "t", 0, 3)
        await node.reconciler.run_round()
        (row,) = await log_store.l1_list(node.partition("t", 0).row.pid)
        pid = row.pid
        await log_store.l1_transition(row.key, L1State.COPY_FINISHED, L1State.DELETE_STARTED, 1.0)
        copying = L1Row(f"{L1_ROOT}t/0/copying", pid, 3, 5, 9, 1, 10, L1State.COPY_STARTED, 1.0, 1.0)
        await log_store.l1_insert(copying)
        await objects.put(copying.key, b"x")
        await objects.put(f"{L1_ROOT}t/0/stray", b"y")
        await node.delete_topic("t")
        objects.faults.fail_deletes([copying.key], count=1)  # fails once: kept for a later round
        await node.gc.run_round()
        assert [r.pid for r in await log_store.deleted_partitions()] == [pid]
        await node.gc.run_round()
        assert keys(objects, L1_ROOT) == []
        assert await log_store.deleted_partitions() == []
        assert await log_store.l1_list(pid) == []


async def test_partitions_are_added_writable_and_readable_never_removed() -> None:
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(make_config(), log_store, objects) as node:
        await node.create_topic("t", 2)
        assert await node.create_partitions("t", 4, validate_only=True) == 2
        assert node.topics()["t"] == 2
        assert await node.create_partitions("t", 4) == 2
        assert node.topics()["t"] == 4
        await produce(node, "t", 3, 2)
        assert [r.value for r in (await node.fetch("t", 3, 0, 1 << 20)).records] == [b"v0", b"v1"]
        with pytest.raises(InvalidInput, match="can only be added"):
            await node.create_partitions("t", 3)
        with pytest.raises(UnknownTopic):
            await node.create_partitions("missing", 3)
        creation = {r.partition: r.creation_epoch for r in await log_store.list_partitions()}
        assert creation[3] >= creation[0]


async def test_deleting_records_moves_the_start_offset_and_collects_l1_below_it() -> None:
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(make_config(), log_store, objects) as node:
        await node.create_topic("t", 1)
        for _ in range(3):  # three L1 objects: offsets 0-1, 2-3, 4-5
            await produce(node, "t", 0, 2)
            await node.reconciler.run_round()
        assert len(keys(objects, L1_ROOT)) == 3
        assert await node.delete_records("t", 0, 4) == 4
        assert node.partition("t", 0).state.start_offset == 4
        assert len(keys(objects, L1_ROOT)) == 1  # the two wholly below 4 went
        assert [r.offset for r in (await node.fetch("t", 0, 4, 1 << 20)).records] == [4, 5]
        # Their rows stay DELETE_FINISHED (history, pruned by age); the housekeeper's listing,
        # read every second, leaves them out.
        actor = node.partition("t", 0)
        states = sorted(r.state for r in await log_store.l1_list(actor.row.pid))
        assert states == [L1State.COPY_FINISHED, L1State.DELETE_FINISHED, L1State.DELETE_FINISHED]
        rows, lineage = await node.l1.listing(actor)
        assert [r.state for r in rows] == [L1State.COPY_FINISHED] and lineage == rows
        with pytest.raises(OffsetOutOfRange):
            await node.fetch("t", 0, 3, 1 << 20)
        assert await node.delete_records("t", 0, 2) == 4  # below the start: nothing changes
        with pytest.raises(OffsetOutOfRange):
            await node.delete_records("t", 0, 7)
        assert await node.delete_records("t", 0, -1) == 6  # -1: the high watermark


async def test_records_deleted_while_in_l0_leave_no_l1_object_once_reconciled() -> None:
    """DeleteRecords past records the reconciler has not copied yet: their L1 object, wholly
    below the start offset when it is written, goes at once (it stayed until the partition's
    next term where the topic had no retention: nothing else collected it)."""
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(make_config(), log_store, objects) as node:
        await node.create_topic("t", 1)
        await produce(node, "t", 0, 4)
        assert await node.delete_records("t", 0, 4) == 4
        assert keys(objects, L1_ROOT) == []
        await node.reconciler.run_round()
        state = node.partition("t", 0).state
        assert (state.lro, state.start_offset) == (3, 4)
        assert keys(objects, L1_ROOT) == []
        pid = node.partition("t", 0).row.pid
        assert [r.state for r in await log_store.l1_list(pid)] == [L1State.DELETE_FINISHED]
        await produce(node, "t", 0, 2)
        await node.reconciler.run_round()
        assert [r.offset for r in (await node.fetch("t", 0, 4, 1 << 20)).records] == [4, 5]
        assert len(keys(objects, L1_ROOT)) == 1


async def test_l1_objects_below_a_start_offset_delete_records_moved_are_logged_as_its_deletes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The reason logged for an L1 object DeleteRecords moved the start offset past names
    DeleteRecords (it said "retention", on a topic without any)."""
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(make_config(), log_store, objects) as node:
        await node.create_topic("t", 1)
        for _ in range(2):  # offsets 0-1, 2-3
            await produce(node, "t", 0, 2)
            await node.reconciler.run_round()
        first = min(keys(objects, L1_ROOT))
        with caplog.at_level(logging.INFO, logger="levelzero.l1"):
            assert await node.delete_records("t", 0, 2) == 2
        assert keys(objects, L1_ROOT) != [] and first not in keys(objects, L1_ROOT)
    deletes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("deleted L1 object")]
    assert deletes == [f"deleted L1 object {first} (below the start offset (moved by DeleteRecords))"]


def test_an_l1_deletes_reason_names_the_move_of_the_start_offset_past_the_object() -> None:
    """DeleteRecords to 10, retention to 20 and 30, DeleteRecords to 40: each object is named
    with the move that went past it; a move before this term, or never made here, is unknown."""
    catalog = L1Catalog(MemoryObjectStore(), MemoryLogStore(), lambda: 0.0)
    actor = types.SimpleNamespace(row=types.SimpleNamespace(pid=7), term=3)
    leader = cast("PartitionActor", actor)
    catalog.note_start_moved(leader, 0, 10, "DeleteRecords")
    catalog.note_start_moved(leader, 10, 20, "retention")
    catalog.note_start_moved(leader, 20, 30, "retention")  # merged with the move before
    catalog.note_start_moved(leader, 30, 40, "DeleteRecords")
    by = [catalog._start_moved_by(leader, last) for last in (9, 10, 29, 30, 39, 40)]
    assert by == ["DeleteRecords", "retention", "retention", "DeleteRecords", "DeleteRecords", None]
    actor.term = 4  # led again: the moves were another leadership's
    assert catalog._start_moved_by(leader, 9) is None


async def test_the_housekeeper_collects_l1_below_the_start_offset_without_retention(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An L1 object below the start offset that DeleteRecords' own collection left (a failed
    delete) is collected by the housekeeper's visit, retention or not, and logged as
    DeleteRecords' delete."""
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(make_config(), log_store, objects) as node:
        await node.create_topic("t", 1)
        for _ in range(2):  # offsets 0-1, 2-3
            await produce(node, "t", 0, 2)
            await node.reconciler.run_round()
        actor = node.partition("t", 0)
        collect, node.l1.collect = node.l1.collect, _nothing  # its collection fails to happen
        try:
            assert await node.delete_records("t", 0, 2) == 2
        finally:
            node.l1.collect = collect
        assert len(keys(objects, L1_ROOT)) == 2 and node.l1.holds_below_start(actor)
        first = min(keys(objects, L1_ROOT))
        with caplog.at_level(logging.INFO, logger="levelzero.l1"):
            await node.housekeeper.run_round()
        assert len(keys(objects, L1_ROOT)) == 1 and not node.l1.holds_below_start(actor)
        assert f"deleted L1 object {first} (below the start offset (moved by DeleteRecords))" in [
            r.getMessage() for r in caplog.records
        ]
        assert [r.offset for r in (await node.fetch("t", 0, 2, 1 << 20)).records] == [2, 3]


async def _nothing(*_args: object, **_kwargs: object) -> int:
    return 0


@pytest.mark.parametrize(
    ("policy", "refused"), [("compact", True), ("compact,delete", False), ("delete", False)]
)
async def test_delete_records_is_refused_where_the_cleanup_policy_has_no_delete(
    policy: str, refused: bool
) -> None:
    """As Kafka's Partition.deleteRecordsOnLeader: POLICY_VIOLATION on a topic whose
    cleanup.policy lacks `delete` (a changelog's records are the table's), nothing changed."""
    async with running_node(make_config(), MemoryLogStore(), MemoryObjectStore()) as node:
        await node.create_topic("t", 1, {"cleanup.policy": policy})
        await node.produce("t", 0, [Record(b"k", b"v0"), Record(b"k", b"v1")])
        if refused:
            with pytest.raises(
                PolicyViolation, match="t/0 can not be deleted: its cleanup.policy has no 'delete'"
            ):
                await node.delete_records("t", 0, 1)
            assert node.partition("t", 0).state.start_offset == 0
        else:
            assert await node.delete_records("t", 0, 1) == 1


async def test_a_produce_waiting_in_the_batch_window_when_its_topic_is_deleted_is_unknown_topic() -> None:
    """Produces in flight while their topic is deleted were answered ShuttingDown ("partition
    ... is stopped": HTTP 503, which says retry, and Kafka's NOT_LEADER) although the node goes
    on: they are told the topic is gone (HTTP 404, UNKNOWN_TOPIC_OR_PARTITION), and nothing of
    them is stored."""
    config = dataclasses.replace(make_config(), batcher=BatcherConfig(linger_ms=500))
    async with running_node(config, MemoryLogStore(), MemoryObjectStore()) as node:
        await node.create_topic("racy", 1)
        outcomes: list[BaseException | int] = []

        async def one(i: int) -> None:
            try:
                outcomes.append((await node.produce("racy", 0, [Record(None, b"%d" % i)])).base_offset)
            except Exception as exc:  # noqa: BLE001 - the outcome is what is checked
                outcomes.append(exc)

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(one, i)
            await anyio.sleep(0.05)  # in the batch window
            await node.delete_topic("racy")
        assert len(outcomes) == 8
        assert all(isinstance(o, UnknownTopic) for o in outcomes), outcomes
        await node.create_topic("racy", 1)
        assert node.partition("racy", 0).state.high_watermark == 0


async def test_a_partition_emptied_by_deleterecords_comes_back_from_the_bucket_at_its_end() -> None:
    """A partition whose every record DeleteRecords (or retention) removed has no L1 object
    left to say where its log ended: its topic record keeps the end, and a recovery from the
    bucket starts it there. It came back at offset 0, handing out offsets its consumers had
    read; a partition with records left comes back from its L1 objects as before."""
    objects = MemoryObjectStore()
    async with running_node(make_config(), MemoryLogStore(), objects) as node:
        await node.create_topic("e", 2)
        await node.topic_configs.replace("e", [("retention.ms", "-1")])  # the record is rewritten
        await produce(node, "e", 0, 5)
        await produce(node, "e", 1, 3)
        await settle(node)
        assert await node.delete_records("e", 0, -1) == 5
        assert keys(objects, f"{L1_ROOT}e/0/") == []  # collected: nothing says where it ended
        # retention's way: every record of r/0 past retention.ms
        await node.create_topic("r", 1, {"retention.ms": "1"})
        await produce(node, "r", 0, 4)
        await settle(node)
        await anyio.sleep(0.01)
        await node.housekeeper.run_round(force=True)
        assert node.partition("r", 0).state.start_offset == 4
    record = decode_topic_record(topic_record_key("e"), objects._objects[topic_record_key("e")][0])
    assert record.configs == {"retention.ms": "-1"}
    assert keys(objects, ENDS_ROOT) == [format_end_key("e", 0, 5), format_end_key("r", 0, 4)]
    rebuilt = MemoryLogStore()
    summary = await rebuild_from_bucket(rebuilt, objects, 100.0)
    assert [(p.name, p.high_watermark) for p in summary.partitions] == [("e/0", 5), ("e/1", 3), ("r/0", 4)]
    async with running_node(make_config(), rebuilt, objects) as node:
        state = node.partition("e", 0).state
        assert (state.start_offset, state.high_watermark) == (5, 5)
        assert (await node.produce("e", 0, [Record(None, b"next")])).base_offset == 5
        assert (await node.produce("e", 1, [Record(None, b"next")])).base_offset == 3
        assert (await node.produce("r", 0, [Record(None, b"next")])).base_offset == 4


async def test_partitions_emptied_at_once_each_keep_their_end_and_a_deleted_topic_none() -> None:
    """Retention empties every partition of an idle topic in one housekeeper round, several at
    once. Each partition's end was kept by rewriting the topic's record (read, change, write):
    with object store requests taking a few milliseconds, one end in four survived, and a
    recovery started the other partitions at offset 0 again. Each end is now a key of its own,
    the lower ones deleted after; a deleted topic's go with it, and a topic made again with its
    name starts from nothing."""
    objects = MemoryObjectStore()
    slow = LatencyObjectStore(objects, Latency("a few ms", put_ms=(1.0, 3.0), get_ms=(1.0, 3.0)))
    async with running_node(make_config(), MemoryLogStore(), slow) as node:
        await node.create_topic("r", 4, {"retention.ms": "1"})
        for partition in range(4):
            await produce(node, "r", partition, 3)
        await settle(node)
        assert [node.partition("r", p).state.start_offset for p in range(4)] == [3, 3, 3, 3]
        for partition in range(4):  # emptied again, further on: the lower end goes
            await produce(node, "r", partition, 2 + partition)
        await settle(node)
        assert [node.partition("r", p).state.start_offset for p in range(4)] == [5, 6, 7, 8]
        assert keys(objects, ENDS_ROOT) == [format_end_key("r", p, 5 + p) for p in range(4)]
        await node.create_topic("gone", 2, {"retention.ms": "1"})
        await produce(node, "gone", 1, 2)
        await settle(node)
        assert keys(objects, f"{ENDS_ROOT}gone/") == [format_end_key("gone", 1, 2)]
        marks = [format_restore_key("gone", 1, 3, 0), format_restore_key("r", 0, 3, 0)]  # restores'
        for mark in marks:
            await objects.put(mark, b"")
        await node.delete_topic("gone")
        assert keys(objects, f"{ENDS_ROOT}gone/") == []
        assert keys(objects, RESTORES_ROOT) == marks[1:]  # the deleted topic's only
        await node.create_topic("gone", 2)
    rebuilt = MemoryLogStore()
    summary = await rebuild_from_bucket(rebuilt, objects, 100.0)
    assert [(p.name, p.high_watermark) for p in summary.partitions] == [(f"r/{p}", 5 + p) for p in range(4)]


class _TermsFailing(MemoryLogStore):
    """A log store failing as the partition `failing_pid` begins its term (a database gone)."""

    failing_pid: int | None = None

    async def begin_term(self, pid: int, log_offset: int, base_offset: int, at_least: int = 0) -> LogRecord:
        if pid == self.failing_pid:
            raise StorageError("the log store is failing")
        return await super().begin_term(pid, log_offset, base_offset, at_least)


async def test_a_topic_whose_partitions_cannot_start_raises_the_stores_error_and_serves_none() -> None:
    """Its partitions start together in a task group: a failing store was a group of errors,
    which the HTTP API answered as a 500 with a traceback logged and Kafka's CreateTopics took
    for a bug; the store's own error is a 503 (storage_error) to retry, KAFKA_STORAGE_ERROR.
    The partitions that did start are stopped: left running unregistered, nothing reached
    them, and the partition's next start ran a second actor beside them."""
    log_store = _TermsFailing()
    async with running_node(make_config(), log_store, MemoryObjectStore()) as node:
        made: list[PartitionActor] = []
        new_partition = node._new_partition

        def recorded(row: PartitionRow) -> PartitionActor:
            made.append(new_partition(row))
            return made[-1]

        (first,) = await node.create_topic("first", 1)
        node._new_partition = recorded  # type: ignore[method-assign]
        log_store.failing_pid = first.pid + 3  # t/2's (pids are handed out in turn)
        with pytest.raises(StorageError, match="the log store is failing"):
            await node.create_topic("t", 3)
        assert "t" not in node.topics()
        assert sorted(a.row.partition for a in made) == [0, 1, 2]
        for actor in made[:2]:  # began their terms, then stopped
            with pytest.raises(ShuttingDown, match="stopped"):
                await actor.write(placeholder(0))
        assert not [name for name in node.board.snapshot() if name.startswith("t/")]  # GC not held
        log_store.failing_pid = None
        await node.create_topic("u", 2)  # the node carries on
        await produce(node, "u", 1, 1)
        assert node.partition("u", 1).state.high_watermark == 1


class _CreationsFailing(MemoryLogStore):
    """A log store failing the writes that create partitions (a database gone for a moment)."""

    failing = True

    async def create_topic(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self.failing:
            raise StorageError("the log store is failing")
        return await super().create_topic(*args, **kwargs)

    async def add_partitions(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self.failing:
            raise StorageError("the log store is failing")
        return await super().add_partitions(*args, **kwargs)


async def test_a_creation_the_store_failed_leaves_nothing_on_the_watermark_board() -> None:
    """The new partitions go on the board before the store makes them (a GC round from then on
    waits for their M(p)); a store that failed to make them left them there with no M(p), and
    every GC round was blocked by them until the daemon restarted, L0 objects piling up."""
    log_store = _CreationsFailing()
    log_store.failing = False
    async with running_node(make_config(), log_store, MemoryObjectStore()) as node:
        await node.create_topic("kept", 2)
        await produce(node, "kept", 0, 1)
        log_store.failing = True
        with pytest.raises(StorageError):
            await node.create_topic("x", 2)
        with pytest.raises(StorageError):
            await node.create_partitions("kept", 4)
        assert sorted(node.board.snapshot()) == ["kept/0", "kept/1"]
        assert "x" not in node.topics() and node.topics()["kept"] == 2
        log_store.failing = False
        await node.create_partitions("kept", 3)
        await node.create_topic("x", 1)
        assert sorted(node.board.snapshot()) == ["kept/0", "kept/1", "kept/2", "x/0"]


async def test_a_topic_made_and_deleted_in_a_loop_leaves_nothing_kept_per_partition() -> None:
    """The housekeeper kept each partition's last state sample, and its unsettled names, for
    every partition ever created; the produce intake each partition name it had checked (and
    its producers' batches until evicted): a daemon whose clients make and delete topics (a
    test suite's per-test topics) grew them for ever."""
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(make_config(), log_store, objects) as node:
        intake = ProduceIntake(node)
        await node.create_topic("kept", 1)
        for _ in range(5):
            await node.create_topic("t", 2)
            for partition in range(2):
                await produce(node, "t", partition, 1)
                intake.check_led("t", partition)
            await node.housekeeper.run_round(force=True)
            assert len(node.housekeeper._last_sampled) == 3
            await node.delete_topic("t")
            assert intake._pids == {}
        await node.housekeeper.run_round(force=True)
        assert list(node.housekeeper._last_sampled) == [node.partition("kept", 0).row.pid]
        assert node.housekeeper._unsettled <= {"kept/0"}
