"""Offsets retention, as Kafka's offsets.retention.minutes has it (KIP-211): a consumer group
without members loses each committed offset the retention after its commit, and none sooner
than the retention after it went empty; a group left with neither members nor offsets is
deleted, its metadata too. Without it every group ever made (a console consumer's random group
id, a test run's) kept its offsets and its metadata for ever, and ListGroups listed it for ever.
A group with members keeps every offset; a commit racing the expiry survives it."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from daemon_support import daemon_and_client
from test_kafka_groups import FakeClock
from levelzero.kafka.groups import GroupCoordinator, StoredGroup, _stored_decoder, _stored_encoder
from levelzero.storage.memory_log import MemoryLogStore

RETENTION_S = 100.0


async def _member(coordinator: GroupCoordinator, clock: FakeClock, group: str) -> str:
    """A consumer joins `group` alone and syncs: its member id (generation 1)."""
    results = []
    async with anyio.create_task_group() as tg:

        async def join() -> None:
            protocols = [("range", b"m")]
            results.append(await coordinator.join(group, "", "c", 10_000, 10_000, "consumer", protocols))

        tg.start_soon(join)
        await anyio.sleep(0)
        clock.now += 1  # past the initial rebalance delay
    member = results[0].member_id
    error, _, _, _ = await coordinator.sync(group, member, 1, [(member, b"parts")])
    assert error == 0
    return member


async def _listed(coordinator: GroupCoordinator) -> list[str]:
    return [s.group_id for s in await coordinator.summaries()]


async def test_a_standalone_consumers_offsets_expire_each_at_the_retention_after_its_commit() -> None:
    clock = FakeClock()
    store = MemoryLogStore()
    coordinator = GroupCoordinator(store, clock=clock, wall_clock=clock)
    await coordinator.commit("s", [("t", 0, 5, "", -1)])  # assign() and commit: no membership
    clock.now += 50
    await coordinator.commit("s", [("t", 1, 7, "", -1)])
    clock.now += 51  # (t, 0) committed 101 s ago, (t, 1) 51 s ago
    assert await coordinator.expire_offsets(RETENTION_S) == (1, 1)
    assert sorted(await coordinator.committed("s")) == [("t", 1)]
    assert await _listed(coordinator) == ["s"]
    clock.now += 50
    assert await coordinator.expire_offsets(RETENTION_S) == (1, 1)
    assert await coordinator.committed("s") == {}
    assert await _listed(coordinator) == []
    assert await coordinator.expire_offsets(RETENTION_S) == (0, 0)


async def test_an_empty_group_keeps_its_offsets_for_the_retention_after_it_went_empty_then_dies() -> None:
    clock = FakeClock()
    store = MemoryLogStore()
    coordinator = GroupCoordinator(store, clock=clock, wall_clock=clock)
    member = await _member(coordinator, clock, "g")
    assert coordinator.check_commit("g", member, 1) == 0
    await coordinator.commit("g", [("t", 0, 5, "", -1)])
    for _ in range(60):  # 300 s with a live member: its offset stays, committed long ago
        clock.now += 5
        assert coordinator.heartbeat("g", member, 1) == 0
        assert await coordinator.expire_offsets(RETENTION_S) == (0, 0)
    assert coordinator.leave("g", [member]) == {member: 0}
    went_empty = clock.now
    await coordinator.flush()  # the empty group's record, dated
    stored = _stored_decoder.decode(store.group_metadata_rows["g"])
    assert stored.members == [] and stored.empty_since == went_empty
    clock.now = went_empty + RETENTION_S - 1  # the offset is 300 s old, the emptiness 99 s
    assert await coordinator.expire_offsets(RETENTION_S) == (0, 0)
    assert ("t", 0) in await coordinator.committed("g")
    assert await _listed(coordinator) == ["g"]
    clock.now = went_empty + RETENTION_S + 1
    assert await coordinator.expire_offsets(RETENTION_S) == (1, 1)
    assert await coordinator.committed("g") == {}
    assert "g" not in coordinator.groups and "g" not in store.group_metadata_rows  # Dead
    assert await _listed(coordinator) == []
    # The group id can be used again from nothing.
    member = await _member(coordinator, clock, "g")
    assert coordinator.groups["g"].generation == 1


async def test_a_commit_racing_the_expiry_survives_it_and_keeps_the_group() -> None:
    clock = FakeClock()
    store = MemoryLogStore()
    coordinator = GroupCoordinator(store, clock=clock, wall_clock=clock)
    member = await _member(coordinator, clock, "g")
    await coordinator.commit("g", [("t", 0, 5, "", -1)])
    coordinator.leave("g", [member])
    clock.now += RETENTION_S + 5
    listed = store.committed_offsets

    async def commit_meanwhile(group_id: str):  # the pass reads the rows; a commit lands then
        rows = await listed(group_id)
        await coordinator.commit("g", [("t", 1, 9, "", -1)])  # an admin's alter of the offsets
        return rows

    store.committed_offsets = commit_meanwhile  # type: ignore[method-assign]
    assert await coordinator.expire_offsets(RETENTION_S) == (1, 1)
    store.committed_offsets = listed  # type: ignore[method-assign]
    assert sorted(await coordinator.committed("g")) == [("t", 1)]
    await coordinator.flush()
    assert "g" in store.group_metadata_rows and await _listed(coordinator) == ["g"]


async def test_after_a_restart_the_stored_emptiness_counts_and_an_undated_one_from_the_first_pass() -> None:
    clock = FakeClock()
    store = MemoryLogStore()
    coordinator = GroupCoordinator(store, clock=clock, wall_clock=clock)
    member = await _member(coordinator, clock, "dated")
    await coordinator.commit("dated", [("t", 0, 1, "", -1)])
    coordinator.leave("dated", [member])
    await coordinator.flush()
    # A group stored before records were dated: empty, with an offset.
    old = StoredGroup(1, "consumer", 3, None, None, [])
    store.group_metadata_rows["undated"] = _stored_encoder.encode(old)
    await coordinator.commit("undated", [("t", 0, 2, "", -1)])
    clock.now += RETENTION_S + 1
    restarted = GroupCoordinator(store, clock=clock, wall_clock=clock)  # nothing in memory
    assert await restarted.expire_offsets(RETENTION_S) == (1, 1)  # "dated" only
    assert "dated" not in store.group_metadata_rows
    assert await restarted.committed("undated") != {}
    await restarted.flush()
    dated_now = _stored_decoder.decode(store.group_metadata_rows["undated"]).empty_since
    assert dated_now == clock.now  # dated by this pass, and stored
    assert "undated" not in restarted.groups  # loaded only to be looked at
    clock.now += RETENTION_S + 1
    assert await restarted.expire_offsets(RETENTION_S) == (1, 1)
    assert "undated" not in store.group_metadata_rows and await _listed(restarted) == []


async def test_only_the_groups_this_node_coordinates_are_expired() -> None:
    clock = FakeClock()
    store = MemoryLogStore()
    coordinator = GroupCoordinator(store, clock=clock, wall_clock=clock)
    await coordinator.commit("mine", [("t", 0, 1, "", -1)])
    await coordinator.commit("theirs", [("t", 0, 1, "", -1)])
    clock.now += RETENTION_S + 1
    assert await coordinator.expire_offsets(RETENTION_S, lambda group: group == "mine") == (1, 1)
    assert await store.offset_groups() == ["theirs"]


def _consume_and_commit(port: int, group: str, topic: str) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 200,
        }
    )
    consumer.subscribe([topic])
    for _ in range(300):  # bounded: 300 polls of at most 0.1 s
        message = consumer.poll(0.1)
        if message is not None and message.error() is None:
            consumer.commit(message, asynchronous=False)
            return consumer
    raise AssertionError(f"{group} read nothing")


def _groups(admin: AdminClient) -> set[str]:
    listed = admin.list_consumer_groups().result(30)
    return {g.group_id for g in listed.valid}


def _retention_through_the_listener(port: int) -> None:
    bootstrap = f"127.0.0.1:{port}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic("r", 1, 1)]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce("r", b"x")
    assert producer.flush(30) == 0
    gone = _consume_and_commit(port, "gone", "r")
    gone.close()  # LeaveGroup: empty from now on
    kept = _consume_and_commit(port, "kept", "r")
    try:
        assert {"gone", "kept"} <= _groups(admin)
        deadline = time.monotonic() + 30
        while "gone" in _groups(admin):  # 2 s of retention after it went empty, then a pass
            assert time.monotonic() < deadline, "the empty group was never expired"
            kept.poll(0.2)
        for _ in range(15):  # 3 s more of a live member: its group and offset stay
            kept.poll(0.2)
        assert "kept" in _groups(admin)
        committed = kept.committed(kept.assignment(), timeout=30)
        assert [tp.offset for tp in committed] == [1]
    finally:
        kept.close()


async def test_an_empty_group_expires_through_the_listener_and_a_live_one_stays(tmp_path: Path) -> None:
    async with daemon_and_client(
        tmp_path,
        kafka__listen="127.0.0.1:0",
        kafka__offsets_retention_s=2.0,
        kafka__offsets_retention_check_s=0.2,
    ) as (daemon, _):
        await anyio.to_thread.run_sync(_retention_through_the_listener, daemon.kafka_port)
        assert await daemon.node.log_store.committed_offsets("gone") == []
        assert await daemon.node.log_store.group_metadata("gone") is None
