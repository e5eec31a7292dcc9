"""Consumer groups through the Kafka listener: real clients split partitions, rebalance when a
member leaves, and resume from offsets committed before a daemon restart; the coordinator's rules
(generations, unknown members, session expiry) with a fake clock."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import anyio
import pytest
from confluent_kafka import Consumer, Producer
from kio.schema.errors import ErrorCode

from levelzero.core.errors import StorageError
from levelzero.kafka.groups import GroupCoordinator
from levelzero.storage.memory_log import MemoryLogStore

from daemon_support import daemon_and_client

TOPIC = "grouped"
PARTITIONS = 6
PER_PARTITION = 50
POLL_ROUNDS_MAX = 600  # bounded loops: 600 rounds of 3 polls of at most 0.1 s


def produce(port: int, per_partition: int, first: int, create: bool) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    bootstrap = f"127.0.0.1:{port}"
    if create:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
            future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(first, first + per_partition):
        for partition in range(PARTITIONS):
            producer.produce(TOPIC, value=b"%d-%d" % (partition, i), partition=partition)
    assert producer.flush(60) == 0


def consumer(port: int, on_revoke=None):

    made = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": "readers",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 200,
            "fetch.wait.max.ms": 100,
        }
    )
    if on_revoke is None:
        made.subscribe([TOPIC])
    else:
        made.subscribe([TOPIC], on_revoke=on_revoke)
    return made


def assignment(c) -> set[int]:
    return {tp.partition for tp in c.assignment()}


def three_consumers_then_one_leaves(port: int) -> tuple[list[set[int]], list[set[int]], set[bytes]]:
    consumers = [consumer(port) for _ in range(3)]
    seen: set[bytes] = set()
    try:
        for _ in range(POLL_ROUNDS_MAX):
            for c in consumers:
                message = c.poll(0.1)
                if message is not None and message.error() is None:
                    seen.add(message.value())
                    c.commit(message=message, asynchronous=False)
            if len(seen) == PARTITIONS * PER_PARTITION:
                break
        split = [assignment(c) for c in consumers]
        consumers[0].close()  # LeaveGroup: the other two take over its partitions
        for _ in range(POLL_ROUNDS_MAX):
            for c in consumers[1:]:
                c.poll(0.1)
            if sum(len(assignment(c)) for c in consumers[1:]) == PARTITIONS:
                break
        after = [assignment(c) for c in consumers[1:]]
    finally:
        for c in consumers[1:]:
            c.close()
    return split, after, seen


def consume_fresh(port: int, expected: int) -> list[tuple[int, int, bytes]]:
    c = consumer(port)
    got: list[tuple[int, int, bytes]] = []
    try:
        for _ in range(POLL_ROUNDS_MAX):
            message = c.poll(0.1)
            if message is not None and message.error() is None:
                got.append((message.partition(), message.offset(), message.value()))
            if len(got) >= expected and len(assignment(c)) == PARTITIONS:
                # nothing more arrives: everything before was committed
                for _ in range(10):
                    message = c.poll(0.1)
                    if message is not None and message.error() is None:
                        got.append((message.partition(), message.offset(), message.value()))
                break
    finally:
        c.close()
    return got


async def test_a_group_splits_rebalances_and_resumes_after_restart(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        port = daemon.kafka_port
        await anyio.to_thread.run_sync(produce, port, PER_PARTITION, 0, True)
        split, after, seen = await anyio.to_thread.run_sync(three_consumers_then_one_leaves, port)
    assert len(seen) == PARTITIONS * PER_PARTITION
    assert [len(s) for s in split] == [2, 2, 2] and set().union(*split) == set(range(PARTITIONS))
    assert after[0].isdisjoint(after[1]) and after[0] | after[1] == set(range(PARTITIONS))

    # A new daemon on the same data directory: the committed offsets are still there, so a new
    # member of the group reads only what was produced after them.
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        port = daemon.kafka_port
        await anyio.to_thread.run_sync(produce, port, 5, PER_PARTITION, False)
        got = await anyio.to_thread.run_sync(consume_fresh, port, PARTITIONS * 5)
    assert sorted(got) == sorted(
        (p, PER_PARTITION + i, b"%d-%d" % (p, PER_PARTITION + i)) for p in range(PARTITIONS) for i in range(5)
    )


async def test_aiokafka_group_commits_and_reads_its_offsets_back(tmp_path: Path) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        bootstrap = f"127.0.0.1:{daemon.kafka_port}"
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic("aio-group", 2, 1)])
        finally:
            await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            for i in range(20):
                await producer.send_and_wait("aio-group", value=b"%d" % i, partition=i % 2)
        finally:
            await producer.stop()
        reader = AIOKafkaConsumer(
            "aio-group",
            bootstrap_servers=bootstrap,
            group_id="aio",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await reader.start()
        try:
            values = []
            for _ in range(100):
                batch = await reader.getmany(timeout_ms=500)
                values += [m.value for messages in batch.values() for m in messages]
                if len(values) == 20:
                    break
            assert sorted(values) == sorted(b"%d" % i for i in range(20))
            await reader.commit({TopicPartition("aio-group", 0): 7, TopicPartition("aio-group", 1): 10})
            assert await reader.committed(TopicPartition("aio-group", 0)) == 7
            assert await reader.committed(TopicPartition("aio-group", 1)) == 10
        finally:
            await reader.stop()
        rows = await daemon.node.log_store.committed_offsets("aio")
        assert [(r.topic, r.partition, r.committed_offset) for r in rows] == [
            ("aio-group", 0, 7),
            ("aio-group", 1, 10),
        ]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_members_generations_and_session_expiry() -> None:
    clock = FakeClock()
    coordinator = GroupCoordinator(MemoryLogStore(), clock=clock, wall_clock=clock)
    protocols = [("range", b"meta-a")]
    # A first member of an empty group waits out the initial delay: the waiter's bounded wait
    # ends, it reads the (fake) clock past the round's deadline and completes the round.
    async with anyio.create_task_group() as tg:
        results = []

        async def join(member: str) -> None:
            results.append(await coordinator.join("g", member, "c", 10_000, 10_000, "consumer", protocols))

        tg.start_soon(join, "")
        await anyio.sleep(0)
        clock.now += 1
    first = results[0]
    assert first.error == ErrorCode.none and first.generation == 1
    assert first.leader == first.member_id and first.members == [(first.member_id, b"meta-a")]
    me = first.member_id
    assert coordinator.heartbeat("g", me, 1) == ErrorCode.none  # completing: not a rebalance
    assert coordinator.heartbeat("g", "stranger", 1) == ErrorCode.unknown_member_id
    assert coordinator.heartbeat("g", me, 7) == ErrorCode.illegal_generation
    error, assignment, _, _ = await coordinator.sync("g", me, 1, [(me, b"parts")])
    assert (error, assignment) == (ErrorCode.none, b"parts")
    assert coordinator.check_commit("g", me, 1) == ErrorCode.none
    assert coordinator.check_commit("g", me, 0) == ErrorCode.illegal_generation
    # generation -1, no member id (a standalone consumer, an admin client): only to an empty group
    assert coordinator.check_commit("g", "", -1) == ErrorCode.unknown_member_id
    assert coordinator.check_commit("other", "", -1) == ErrorCode.none  # a group that does not exist
    # The member stops heartbeating: past its session timeout it is gone.
    clock.now += 11
    assert coordinator.heartbeat("g", me, 1) == ErrorCode.unknown_member_id
    assert coordinator.groups["g"].state == "empty"
    assert coordinator.check_commit("g", "", -1) == ErrorCode.none
    assert coordinator.leave("g", [me]) == {me: ErrorCode.unknown_member_id}
    await coordinator.commit("g", [("t", 0, 5, "m", 2)])
    assert (await coordinator.committed("g"))[("t", 0)].committed_offset == 5
    assert (await coordinator.committed("g"))[("t", 0)].leader_epoch == 2


async def test_a_member_commits_while_the_group_prepares_a_rebalance() -> None:
    """Kafka accepts a commit of the current generation while the group prepares a rebalance
    (a consumer commits in its revoke callback) and refuses one between JoinGroup and SyncGroup.
    In both states a commit with generation -1 and no member id is UNKNOWN_MEMBER_ID (the group
    is not empty); one naming a member with generation -1 is ILLEGAL_GENERATION."""
    clock = FakeClock()
    coordinator = GroupCoordinator(MemoryLogStore(), clock=clock, wall_clock=clock)
    protocols = [("range", b"meta")]
    results = []
    async with anyio.create_task_group() as tg:

        async def join(member: str) -> None:
            results.append(await coordinator.join("g", member, "c", 10_000, 10_000, "consumer", protocols))

        tg.start_soon(join, "")
        await anyio.sleep(0)
        clock.now += 1
    me = results[0].member_id
    await coordinator.sync("g", me, 1, [(me, b"parts")])
    # A second member joins: the group prepares a rebalance; the first has not rejoined yet.
    async with anyio.create_task_group() as tg:
        tg.start_soon(join, "")
        await anyio.sleep(0)
        assert coordinator.groups["g"].state == "preparing"
        assert coordinator.check_commit("g", me, 1) == ErrorCode.none
        assert coordinator.check_commit("g", "", -1) == ErrorCode.unknown_member_id  # not a member
        assert coordinator.check_commit("g", me, 0) == ErrorCode.illegal_generation
        assert coordinator.heartbeat("g", me, 1) == ErrorCode.rebalance_in_progress
        tg.start_soon(join, me)  # both have joined: the round completes
    assert coordinator.groups["g"].state == "completing"
    assert coordinator.check_commit("g", me, 2) == ErrorCode.rebalance_in_progress
    assert coordinator.check_commit("g", "", -1) == ErrorCode.unknown_member_id
    assert coordinator.check_commit("g", me, -1) == ErrorCode.illegal_generation
    # a transaction's commit naming only the group (TxnOffsetCommit v0-2) is not checked
    assert coordinator.check_commit("g", "", -1, transactional=True) == ErrorCode.none


async def test_a_joiner_sharing_no_assignor_is_refused_alone_and_the_group_goes_on() -> None:
    """As Kafka's coordinator checks a join (`supportsProtocols`): a member whose assignors the
    group's members do not all share is INCONSISTENT_GROUP_PROTOCOL at once, and nothing else
    changes: no rebalance, the members keep their generation and assignment (the round failed
    for every member, all of them left without partitions while the joiner retried: a
    confluent-kafka consumer with `range` joining an aiokafka group with `roundrobin`). One
    sharing an assignor joins."""
    clock = FakeClock()
    coordinator = GroupCoordinator(MemoryLogStore(), clock=clock, wall_clock=clock)
    results = []

    async def join(member: str, protocols: list[tuple[str, bytes]]) -> None:
        results.append(await coordinator.join("g", member, "c", 10_000, 10_000, "consumer", protocols))

    async with anyio.create_task_group() as tg:
        tg.start_soon(join, "", [("roundrobin", b"m"), ("range", b"m")])
        await anyio.sleep(0)
        clock.now += 1
    me = results[0].member_id
    await coordinator.sync("g", me, 1, [(me, b"parts")])
    with anyio.fail_after(5):  # refused at once (the fake clock never ends a round by itself)
        await join("", [("cooperative-sticky", b"x")])
    assert results[1].error == ErrorCode.inconsistent_group_protocol
    group = coordinator.groups["g"]
    assert (group.state, group.generation, list(group.members)) == ("stable", 1, [me])
    assert coordinator.heartbeat("g", me, 1) == ErrorCode.none
    await join("", [("consumer-other-type", b"x")])  # (same protocol type, no shared name)
    assert results[2].error == ErrorCode.inconsistent_group_protocol
    async with anyio.create_task_group() as tg:
        tg.start_soon(join, "", [("range", b"y")])  # shares `range`: a rebalance begins
        await anyio.sleep(0)
        assert group.state == "preparing"
        tg.start_soon(join, me, [("roundrobin", b"m"), ("range", b"m")])
    assert results[3].error == results[4].error == ErrorCode.none
    assert results[4].protocol_name == "range"


async def test_a_static_member_back_takes_its_place_without_a_rebalance_and_fences_the_old_one() -> None:
    """KIP-345 as Kafka's coordinator serves it: a static member (group.instance.id) joining
    again with no member id (restarted) replaces the instance id's holder under a new member
    id, in a stable group at once and with no rebalance (same generation; the old leader id,
    so it assigns nothing), and its SyncGroup gets the old assignment; the old member id is
    FENCED_INSTANCE_ID from then on (heartbeat, sync, join, leave). DescribeGroups shows the
    instance id; LeaveGroup by instance id alone removes it (an admin client's removal). It
    used to join as a second member beside the first, and come back only through a rebalance
    after the first's session timeout."""
    clock = FakeClock()
    coordinator = GroupCoordinator(MemoryLogStore(), clock=clock, wall_clock=clock)
    protocols = [("range", b"meta")]
    results = []

    async def join(member: str, instance: str | None) -> None:
        results.append(
            await coordinator.join("g", member, "c", 10_000, 10_000, "consumer", protocols, "", instance)
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(join, "", "i1")
        await anyio.sleep(0)
        clock.now += 1
    old = results[0].member_id
    assert (results[0].error, results[0].generation) == (ErrorCode.none, 1)
    await coordinator.sync("g", old, 1, [(old, b"parts-1")], "i1")
    with anyio.fail_after(5):  # at once: no round
        await join("", "i1")
    back = results[1]
    assert (back.error, back.generation, back.leader, back.members) == (ErrorCode.none, 1, old, [])
    assert back.member_id != old
    group = coordinator.groups["g"]
    assert (group.state, group.generation, list(group.members)) == ("stable", 1, [back.member_id])
    with anyio.fail_after(5):
        assert await coordinator.sync("g", back.member_id, 1, [], "i1") == (
            ErrorCode.none,
            b"parts-1",
            "consumer",
            "range",
        )
    assert coordinator.heartbeat("g", back.member_id, 1, "i1") == ErrorCode.none
    assert coordinator.heartbeat("g", old, 1, "i1") == ErrorCode.fenced_instance_id
    assert (await coordinator.sync("g", old, 1, [], "i1"))[0] == ErrorCode.fenced_instance_id
    assert coordinator.check_commit("g", old, 1, "i1") == ErrorCode.fenced_instance_id
    await join(old, "i1")
    assert results[2].error == ErrorCode.fenced_instance_id
    assert coordinator.leave("g", [old], ["i1"]) == {old: ErrorCode.fenced_instance_id}
    summary = await coordinator.summary("g")
    assert summary is not None and [m.instance_id for m in summary.members] == ["i1"]
    assert coordinator.leave("g", [""], ["i1"]) == {"": ErrorCode.none}  # by instance id alone
    assert coordinator.groups["g"].members == {}


async def test_a_killed_member_is_dropped_at_its_session_timeout_not_the_rebalance_timeout() -> None:
    """A consumer SIGKILLed sends no LeaveGroup. Its successor's JoinGroup opens a round that
    waits for the dead member; Kafka's heartbeat expiry drops it at its session timeout and the
    round ends then. The round must not wait out the rebalance timeout (max.poll.interval.ms,
    300 s for Quix Streams and Kafka's clients): the successor would get no partitions for
    minutes."""
    clock = FakeClock()
    coordinator = GroupCoordinator(MemoryLogStore(), clock=clock, wall_clock=clock)
    protocols = [("range", b"meta")]
    session_ms, rebalance_ms = 500, 300_000
    results = []

    async def join(member: str) -> None:
        results.append(
            await coordinator.join("g", member, "c", session_ms, rebalance_ms, "consumer", protocols)
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(join, "")
        await anyio.sleep(0)
        clock.now += 0.5  # the initial round's delay
    dead = results[0].member_id
    await coordinator.sync("g", dead, 1, [(dead, b"parts")])
    assert coordinator.groups["g"].state == "stable"
    # The member is killed. Its successor joins before the session has run out: the round waits.
    with anyio.fail_after(30):  # a bound, never reached with the fix (the wait is 0.5 s)
        async with anyio.create_task_group() as tg:
            tg.start_soon(join, "")
            await anyio.sleep(0)
            assert coordinator.groups["g"].state == "preparing"
            clock.now += 0.6  # past the dead member's session, far short of the rebalance timeout
    successor = results[1]
    assert successor.error == ErrorCode.none and successor.generation == 2
    assert successor.leader == successor.member_id
    assert successor.members == [(successor.member_id, b"meta")]  # the dead member is gone
    assert coordinator.heartbeat("g", dead, 1) == ErrorCode.unknown_member_id
    error, assignment, _, _ = await coordinator.sync(
        "g", successor.member_id, 2, [(successor.member_id, b"all")]
    )
    assert (error, assignment) == (ErrorCode.none, b"all")


async def test_the_last_members_leaving_during_a_rebalance_leave_the_group_empty() -> None:
    """Two consumers closing together: the first LeaveGroup opens a round, the second leaves
    the round with no member, and no JoinGroup is left to end it. As Kafka's coordinator
    completes the join when the last member leaves, the group is empty at once (it stayed
    PreparingRebalance with no members, so its offsets could not be reset nor it deleted)."""
    clock = FakeClock()
    coordinator = GroupCoordinator(MemoryLogStore(), clock=clock, wall_clock=clock)
    protocols = [("range", b"meta")]
    results = []

    async def join(member: str) -> None:
        results.append(await coordinator.join("g", member, "c", 10_000, 300_000, "consumer", protocols))

    async with anyio.create_task_group() as tg:
        tg.start_soon(join, "")
        tg.start_soon(join, "")
        await anyio.sleep(0)
        clock.now += 1  # the initial round's delay
    a, b = (r.member_id for r in results)
    await coordinator.sync("g", a, 1, [(a, b"p0"), (b, b"p1")])
    await coordinator.sync("g", b, 1, [])
    assert coordinator.groups["g"].state == "stable"
    await coordinator.commit("g", [("t", 0, 5, "", -1)])
    assert coordinator.leave("g", [a]) == {a: ErrorCode.none}
    assert coordinator.groups["g"].state == "preparing"  # b is asked to rejoin
    assert coordinator.leave("g", [b]) == {b: ErrorCode.none}
    group = coordinator.groups["g"]
    assert (group.state, group.members, group.generation) == ("empty", {}, 2)
    assert coordinator.check_commit("g", "", -1) == ErrorCode.none  # an admin's offset reset
    assert (await coordinator.summary("g")).state == "Empty"  # type: ignore[union-attr]
    assert await coordinator.delete_group("g") == ErrorCode.none
    assert await coordinator.committed("g") == {}


def commit_on_revoke(port: int) -> tuple[list[str], dict[int, int], int]:
    """Consumer A reads everything, then B joins; A commits its position in on_revoke.
    Returns the errors A's commits raised, the offsets committed, and records A read."""
    from confluent_kafka import KafkaException, TopicPartition

    errors: list[str] = []
    read = 0

    def on_revoke(c, partitions) -> None:
        positions = [tp for tp in c.position(partitions) if tp.offset >= 0]
        if not positions:
            return  # nothing read yet
        try:
            c.commit(offsets=positions, asynchronous=False)
        except KafkaException as exc:
            errors.append(str(exc))

    a = consumer(port, on_revoke)
    b = None
    try:
        for _ in range(POLL_ROUNDS_MAX):
            message = a.poll(0.1)
            if message is not None and message.error() is None:
                read += 1
            if read == PARTITIONS * PER_PARTITION and b is None:
                b = consumer(port)
            if b is not None:
                b.poll(0.1)
                if assignment(a) and assignment(b) and len(assignment(a) | assignment(b)) == PARTITIONS:
                    break
        committed = a.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=10)
        offsets = {tp.partition: tp.offset for tp in committed}
    finally:
        a.close()
        if b is not None:
            b.close()
    return errors, offsets, read


async def test_a_commit_in_the_revoke_callback_is_accepted(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        port = daemon.kafka_port
        await anyio.to_thread.run_sync(produce, port, PER_PARTITION, 0, True)
        errors, offsets, read = await anyio.to_thread.run_sync(commit_on_revoke, port)
    assert read == PARTITIONS * PER_PARTITION
    assert errors == []
    assert offsets == {p: PER_PARTITION for p in range(PARTITIONS)}


def static_member_restarts(port: int) -> dict[str, object]:
    """A static consumer (group.instance.id) closes (librdkafka sends no LeaveGroup for one) and
    starts again with the same instance id, its session (30 s) not over; then a second consumer
    with that id starts beside it. What each saw."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    bootstrap = f"127.0.0.1:{port}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("static", 6, 1)])["static"].result(10)

    def static() -> Consumer:
        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "g-static",
                "group.instance.id": "inst-1",
                "session.timeout.ms": 30_000,
                "heartbeat.interval.ms": 200,
                "enable.auto.commit": False,
            }
        )
        c.subscribe(["static"])
        return c

    def assigned(c: Consumer, seconds: float) -> int:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not c.assignment():
            c.poll(0.1)
        return len(c.assignment())

    first = static()
    out: dict[str, object] = {"first": assigned(first, 20)}
    first.close()
    again = static()
    out["again"] = assigned(again, 20)  # well inside the first's 30 s session
    described = admin.describe_consumer_groups(["g-static"])["g-static"].result(10)
    out["instances"] = [m.group_instance_id for m in described.members]
    second = static()
    errors: list[str] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not errors:
        for c in (again, second):
            try:
                message = c.poll(0.1)
            except KafkaException as exc:
                errors.append(f"{exc.args[0].name()}: {exc.args[0].str()}")
                break
            if message is not None and message.error() is not None:
                errors.append(f"{message.error().name()}: {message.error().str()}")
    out["errors"] = errors
    for c in (again, second):
        with contextlib.suppress(KafkaException):  # (the fenced one's close fails)
            c.close()
    return out


async def test_a_restarted_static_consumer_gets_its_partitions_at_once_and_a_duplicate_fences(
    tmp_path: Path,
) -> None:
    """confluent-kafka with group.instance.id: a restarted static consumer gets its partitions
    back at once, not after the old session times out; a second consumer with the same instance
    id fences the first (FENCED_INSTANCE_ID, librdkafka's fatal error), as against Kafka."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        seen = await anyio.to_thread.run_sync(static_member_restarts, daemon.kafka_port)
    assert seen["first"] == 6 and seen["again"] == 6, seen
    assert seen["instances"] == ["inst-1"], seen
    errors = seen["errors"]
    assert isinstance(errors, list) and len(errors) == 1, seen
    assert errors[0].startswith("_FATAL") and "fenced" in errors[0].lower(), seen


class FailingGroupStore(MemoryLogStore):
    async def store_group_metadata(self, group_id: str, metadata: bytes | None, now: float) -> None:
        raise StorageError("the control plane is away")


async def stable_group(coordinator: GroupCoordinator, clock: FakeClock, generation: int = 1) -> str:
    """One member joins group "g" (session 10 s) and syncs at `generation`; its member id."""
    session_ms = 10_000
    results = []
    async with anyio.create_task_group() as tg:

        async def join() -> None:
            results.append(
                await coordinator.join("g", "", "c", session_ms, session_ms, "consumer", [("range", b"sub")])
            )

        tg.start_soon(join)
        await anyio.sleep(0)
        clock.now += 1
    me = results[0].member_id
    assert results[0].generation == generation
    assert await coordinator.sync("g", me, generation, [(me, b"parts")]) == (
        ErrorCode.none,
        b"parts",
        "consumer",
        "range",
    )
    return me


async def test_a_restarted_coordinator_restores_its_members_until_their_sessions_end() -> None:
    """As Kafka's coordinator loads a group: the members of the last completed rebalance come
    back Stable with their member ids, generation and assignments, each session started afresh;
    a member that never comes back is dropped at its session timeout, and the group, empty,
    keeps its generation."""
    clock, store = FakeClock(), MemoryLogStore()
    before = GroupCoordinator(store, clock=clock, wall_clock=clock)
    me = await stable_group(before, clock)
    clock.now += 8  # most of the session gone before the restart
    after = GroupCoordinator(store, clock=clock, wall_clock=clock)
    assert await after.load("g") == ErrorCode.none
    assert after.heartbeat("g", me, 1) == ErrorCode.none
    assert after.check_commit("g", me, 1) == ErrorCode.none
    assert after.check_commit("g", me, 1, transactional=True) == ErrorCode.none
    assert after.check_commit("g", me, 0, transactional=True) == ErrorCode.illegal_generation
    assert after.check_commit("g", "stranger", 1, transactional=True) == ErrorCode.unknown_member_id
    summary = await after.summary("g")
    assert summary is not None and (summary.state, summary.protocol_name) == ("Stable", "range")
    assert [(m.member_id, m.metadata, m.assignment) for m in summary.members] == [(me, b"sub", b"parts")]

    # A third coordinator, and the member never comes back: its session, started afresh at the
    # load, ends 10 s later.
    again = GroupCoordinator(store, clock=clock, wall_clock=clock)
    assert await again.load("g") == ErrorCode.none
    clock.now += 9
    assert again.check_commit("g", me, 1, transactional=True) == ErrorCode.none
    clock.now += 1
    assert again.check_commit("g", me, 1, transactional=True) == ErrorCode.unknown_member_id
    assert again.groups["g"].state == "empty"
    await again.flush()  # the empty group is stored as it is, at its generation
    last = GroupCoordinator(store, clock=clock, wall_clock=clock)
    assert await last.load("g") == ErrorCode.none
    assert (last.groups["g"].state, last.groups["g"].generation) == ("empty", 1)
    assert last.heartbeat("g", me, 1) == ErrorCode.unknown_member_id
    assert await stable_group(last, clock, generation=2) != me  # the generation goes on


async def test_a_restarted_coordinator_lists_its_stored_groups_as_they_were() -> None:
    """ListGroups after a restart: a stored group this node coordinates is loaded first, as a
    Kafka coordinator loads its groups when it takes over. It was listed Empty with no protocol
    type until a request about it loaded it (a listing by state missed live groups); a group
    another node coordinates is listed by its offsets alone and not loaded here."""
    clock, store = FakeClock(), MemoryLogStore()
    before = GroupCoordinator(store, clock=clock, wall_clock=clock)
    me = await stable_group(before, clock)
    await before.commit("g", [("t", 0, 5, "", -1)])
    await before.commit("elsewhere", [("t", 0, 1, "", -1)])
    await store.store_group_metadata("elsewhere", b"not read here", 0.0)
    after = GroupCoordinator(store, clock=clock, wall_clock=clock)
    listed = await after.summaries(lambda group_id: group_id != "elsewhere")
    assert [(g.group_id, g.state, g.protocol_type) for g in listed] == [
        ("elsewhere", "Empty", ""),
        ("g", "Stable", "consumer"),
    ]
    assert [m.member_id for m in listed[1].members] == [me]
    assert "elsewhere" not in after.groups


async def test_a_deleted_group_is_not_restored() -> None:
    clock, store = FakeClock(), MemoryLogStore()
    coordinator = GroupCoordinator(store, clock=clock, wall_clock=clock)
    me = await stable_group(coordinator, clock)
    assert coordinator.leave("g", [me]) == {me: ErrorCode.none}
    await coordinator.commit("g", [("t", 0, 5, "", -1)])
    assert await coordinator.delete_group("g") == ErrorCode.none
    assert await store.group_metadata("g") is None
    restarted = GroupCoordinator(store, clock=clock, wall_clock=clock)
    assert await restarted.load("g") == ErrorCode.none
    assert "g" not in restarted.groups


async def test_a_sync_group_whose_metadata_cannot_be_stored_fails_and_the_members_rejoin() -> None:
    clock = FakeClock()
    coordinator = GroupCoordinator(FailingGroupStore(), clock=clock, wall_clock=clock)
    with pytest.raises(AssertionError):
        await stable_group(coordinator, clock)
    assert coordinator.groups["g"].state == "preparing"
    (me,) = coordinator.groups["g"].members
    assert coordinator.heartbeat("g", me, 1) == ErrorCode.rebalance_in_progress


async def test_a_group_gone_empty_is_stored_with_its_generation() -> None:
    clock, store = FakeClock(), MemoryLogStore()
    coordinator = GroupCoordinator(store, clock=clock, wall_clock=clock)
    async with anyio.create_task_group() as tg:
        coordinator.spawn = tg.start_soon  # as the daemon runs it: a write no request waits for
        me = await stable_group(coordinator, clock)
        assert coordinator.leave("g", [me]) == {me: ErrorCode.none}
    restarted = GroupCoordinator(store, clock=clock, wall_clock=clock)
    assert await restarted.load("g") == ErrorCode.none
    assert (restarted.groups["g"].state, restarted.groups["g"].generation) == ("empty", 1)
    assert not restarted.groups["g"].members
