"""KIP-447 at the broker: OffsetFetch with require_stable (v7+) answers UNSTABLE_OFFSET_COMMIT for
a partition whose offset an unfinished transaction holds, as Kafka's group coordinator does, so
a read_committed consumer never starts from the offset before that transaction; TxnOffsetCommit
v3+ carries the consumer's group metadata and is fenced like an offset commit
(ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID), so a zombie member's transaction
cannot commit its offsets. At the wire (kio requests) and with confluent-kafka."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from levelzero.kafka.protocol import make

from daemon_support import daemon_and_client
from test_kafka_listener import MS, Wire, module_of

TOPIC = "kip447"
GROUP = "kip447-group"
TID = "kip447-tx"
STABLE_POLLS_MAX = 200  # of 50 ms
CLIENT_POLLS_MAX = 150  # confluent-kafka polls of 0.2 s


# ---------------------------------------------------------------------- wire helpers


async def offset_commit(wire: Wire, partition: int, offset: int) -> None:
    m = module_of(8, 2)
    response = await wire.request(
        8,
        2,
        group_id=GROUP,
        generation_id_or_member_epoch=-1,
        member_id="",
        retention_time=-1 * MS,
        topics=(
            make(
                m.OffsetCommitRequestTopic,
                name=TOPIC,
                partitions=(
                    make(
                        m.OffsetCommitRequestPartition,
                        partition_index=partition,
                        committed_offset=offset,
                        committed_metadata="",
                    ),
                ),
            ),
        ),
    )
    assert response.topics[0].partitions[0].error_code == ErrorCode.none


async def offset_fetch(
    wire: Wire, *, require_stable: bool, partitions: tuple[int, ...] | None = (0, 1)
) -> dict[int, tuple[ErrorCode, int]]:
    """partition -> (error, committed offset), OffsetFetch v7."""
    m = module_of(9, 7)
    topics = (
        None
        if partitions is None
        else (make(m.OffsetFetchRequestTopic, name=TOPIC, partition_indexes=partitions),)
    )
    response = await wire.request(9, 7, group_id=GROUP, topics=topics, require_stable=require_stable)
    assert response.error_code == ErrorCode.none
    return {
        p.partition_index: (p.error_code, p.committed_offset) for t in response.topics for p in t.partitions
    }


async def init_producer(wire: Wire, tid: str = TID) -> tuple[int, int]:
    init = await wire.request(
        22, 4, transactional_id=tid, transaction_timeout=60_000 * MS, producer_id=-1, producer_epoch=-1
    )
    assert init.error_code == ErrorCode.none
    return init.producer_id, init.producer_epoch


async def add_offsets(wire: Wire, producer: tuple[int, int], tid: str = TID) -> None:
    response = await wire.request(
        25, 3, transactional_id=tid, producer_id=producer[0], producer_epoch=producer[1], group_id=GROUP
    )
    assert response.error_code == ErrorCode.none


async def txn_offset_commit(
    wire: Wire,
    producer: tuple[int, int],
    offset: int,
    *,
    generation: int = -1,
    member_id: str = "",
    instance_id: str | None = None,
    version: int = 3,
    tid: str = TID,
) -> ErrorCode:
    m = module_of(28, version)
    fields: dict[str, Any] = {}
    if version >= 3:
        fields = dict(generation_id=generation, member_id=member_id, group_instance_id=instance_id)
    response = await wire.request(
        28,
        version,
        transactional_id=tid,
        group_id=GROUP,
        producer_id=producer[0],
        producer_epoch=producer[1],
        topics=(
            make(
                m.TxnOffsetCommitRequestTopic,
                name=TOPIC,
                partitions=(
                    make(
                        m.TxnOffsetCommitRequestPartition,
                        partition_index=0,
                        committed_offset=offset,
                        committed_leader_epoch=-1,
                        committed_metadata="",
                    ),
                ),
            ),
        ),
        **fields,
    )
    return response.topics[0].partitions[0].error_code


async def end_txn(wire: Wire, producer: tuple[int, int], commit: bool, tid: str = TID) -> None:
    ended = await wire.request(
        26, 3, transactional_id=tid, producer_id=producer[0], producer_epoch=producer[1], committed=commit
    )
    assert ended.error_code == ErrorCode.none


async def stable_offset(wire: Wire, partition: int) -> int:
    """The partition's committed offset once require_stable is answered without an error."""
    for _ in range(STABLE_POLLS_MAX):
        code, offset = (await offset_fetch(wire, require_stable=True))[partition]
        if code != ErrorCode.unstable_offset_commit:
            assert code == ErrorCode.none
            return offset
        await anyio.sleep(0.05)
    raise AssertionError(f"partition {partition}'s offset is still unstable")


async def test_offset_fetch_require_stable_answers_unstable_while_a_transaction_holds_the_offset(
    tmp_path: Path,
) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic(TOPIC, 2)
        coordinator = daemon.kafka.handlers.transactions
        wire = await Wire.connect(daemon.kafka_port)
        try:
            await offset_commit(wire, 0, 3)
            await offset_commit(wire, 1, 4)
            producer = await init_producer(wire)
            await add_offsets(wire, producer)
            assert await txn_offset_commit(wire, producer, 10) == ErrorCode.none
            unstable = (ErrorCode.unstable_offset_commit, -1)
            # Ongoing: the partition it holds is unstable, the other answered as committed
            assert await offset_fetch(wire, require_stable=True) == {0: unstable, 1: (ErrorCode.none, 4)}
            assert await offset_fetch(wire, require_stable=True, partitions=None) == {
                0: unstable,
                1: (ErrorCode.none, 4),
            }
            # A client that does not ask for stable offsets gets the committed ones, as from Kafka
            assert await offset_fetch(wire, require_stable=False) == {
                0: (ErrorCode.none, 3),
                1: (ErrorCode.none, 4),
            }
            # Prepared, its completion held back (neither the task after EndTxn's answer nor the
            # coordinator's pass runs it): unstable, answered at once (not waited for)
            completions: list[Any] = []

            async def held(txn: Any) -> None:
                completions.append(txn)

            async def no_pass() -> None:
                pass

            coordinator._complete_later, coordinator.expire = held, no_pass
            await end_txn(wire, producer, commit=True)
            assert [t.state for t in completions] == ["prepare_commit"]
            assert await offset_fetch(wire, require_stable=True) == {0: unstable, 1: (ErrorCode.none, 4)}
            # A client that does not ask for stable offsets: OffsetFetch completes the committed
            # transaction first, so it never reads the offset from before a commit answered
            assert await offset_fetch(wire, require_stable=False) == {
                0: (ErrorCode.none, 10),
                1: (ErrorCode.none, 4),
            }
            assert completions[0].state == "complete_commit"
            assert await offset_fetch(wire, require_stable=True) == {
                0: (ErrorCode.none, 10),
                1: (ErrorCode.none, 4),
            }
            del coordinator._complete_later, coordinator.expire
            # An aborted transaction's offset is unstable until its abort completes, then the
            # offset before it stands
            await add_offsets(wire, producer)
            assert await txn_offset_commit(wire, producer, 20) == ErrorCode.none
            assert (await offset_fetch(wire, require_stable=True))[0] == unstable
            await end_txn(wire, producer, commit=False)
            assert await stable_offset(wire, 0) == 10
        finally:
            await wire.aclose()


async def test_offset_fetch_require_stable_answers_unstable_while_the_completion_is_on_its_way(
    tmp_path: Path,
) -> None:
    """Between the markers queued and the completion stored the transaction is COMPLETE_* in
    memory, kept as the prepared one beside its producer's next: its offsets are still pending
    (answered before, OffsetFetch read the group's older offset in that window)."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic(TOPIC, 2)
        coordinator = daemon.kafka.handlers.transactions
        coordinator.hold_completion = True  # markers queued and stored, the completion never
        wire = await Wire.connect(daemon.kafka_port)
        try:
            await offset_commit(wire, 0, 3)
            producer = await init_producer(wire)
            await add_offsets(wire, producer)
            assert await txn_offset_commit(wire, producer, 10) == ErrorCode.none
            await end_txn(wire, producer, commit=True)
            (txn,) = coordinator._txns.values()
            for _ in range(STABLE_POLLS_MAX):
                if txn.state == "complete_commit" and txn.prepared is not None:
                    break
                await anyio.sleep(0.05)
            assert txn.state == "complete_commit" and txn.prepared is not None
            code, offset = (await offset_fetch(wire, require_stable=True))[0]
            assert (code, offset) == (ErrorCode.unstable_offset_commit, -1)
        finally:
            await wire.aclose()


# ---------------------------------------------------------------------- group membership


async def join(wire: Wire, member_id: str = "", instance_id: str | None = None) -> tuple[str, int]:
    """JoinGroup v5 (member id asked for first, as v4+ clients do), then SyncGroup: (member id,
    generation)."""
    m = module_of(11, 5)
    protocols = (make(m.JoinGroupRequestProtocol, name="range", metadata=b"\x00\x00\x00\x00\x00\x00"),)
    joined = await wire.request(
        11,
        5,
        group_id=GROUP,
        session_timeout=30_000 * MS,
        rebalance_timeout=30_000 * MS,
        member_id=member_id,
        group_instance_id=instance_id,
        protocol_type="consumer",
        protocols=protocols,
    )
    assert joined.error_code == ErrorCode.none, joined.error_code
    s = module_of(14, 3)
    synced = await wire.request(
        14,
        3,
        group_id=GROUP,
        generation_id=joined.generation_id,
        member_id=joined.member_id,
        group_instance_id=instance_id,
        assignments=tuple(
            make(s.SyncGroupRequestAssignment, member_id=mid.member_id, assignment=b"")
            for mid in joined.members
        ),
    )
    assert synced.error_code == ErrorCode.none, synced.error_code
    return joined.member_id, joined.generation_id


async def test_txn_offset_commit_is_fenced_by_the_consumers_group_metadata(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic(TOPIC, 2)
        wire = await Wire.connect(daemon.kafka_port)
        other = await Wire.connect(daemon.kafka_port)
        try:
            producer = await init_producer(wire)
            await add_offsets(wire, producer)
            # A group this node knows no members of: only "not checked" passes
            assert await txn_offset_commit(wire, producer, 1, generation=1, member_id="gone") == (
                ErrorCode.unknown_member_id
            )
            assert await txn_offset_commit(wire, producer, 1) == ErrorCode.none
            member, generation = await join(wire, instance_id="worker-1")
            assert (
                await txn_offset_commit(
                    wire, producer, 2, generation=generation, member_id=member, instance_id="worker-1"
                )
                == ErrorCode.none
            )
            code = await txn_offset_commit(wire, producer, 3, generation=generation - 1, member_id=member)
            assert code == ErrorCode.illegal_generation
            code = await txn_offset_commit(wire, producer, 3, generation=generation, member_id="stranger")
            assert code == ErrorCode.unknown_member_id
            # generation -1 naming a member of a group with members: checked (Kafka's rule)
            code = await txn_offset_commit(wire, producer, 3, member_id=member)
            assert code == ErrorCode.illegal_generation
            # Not checked: generation -1 and no member, or a request before v3
            assert await txn_offset_commit(wire, producer, 4) == ErrorCode.none
            assert await txn_offset_commit(wire, producer, 5, version=2) == ErrorCode.none
            # A newer member joins with the same group.instance.id: the older one is fenced
            async with anyio.create_task_group() as tg:
                tg.start_soon(join, other, "", "worker-1")  # waits for the round: cancelled below
                for _ in range(STABLE_POLLS_MAX):
                    if len(daemon.kafka.handlers.groups.groups[GROUP].members) == 2:
                        break
                    await anyio.sleep(0.05)
                assert (
                    await txn_offset_commit(
                        wire, producer, 6, generation=generation, member_id=member, instance_id="worker-1"
                    )
                    == ErrorCode.fenced_instance_id
                )
                tg.cancel_scope.cancel()
            await end_txn(wire, producer, commit=True)
            assert await stable_offset(wire, 0) == 5  # the last offset it accepted
        finally:
            await other.aclose()
            await wire.aclose()


# ---------------------------------------------------------------------- confluent-kafka


def read_committed_consumer_waits_for_the_transaction(port: int) -> tuple[list[int], int]:
    """The group's offset of partition 0 is 5; a transaction commits 12 for it and stays open
    while a read_committed consumer of the group starts. (offsets the consumer got while the
    transaction was open, the first offset it got after the commit)"""
    from confluent_kafka import Consumer, Producer, TopicPartition

    bootstrap = f"127.0.0.1:{port}"
    plain = Producer({"bootstrap.servers": bootstrap})
    for i in range(20):
        plain.produce(TOPIC, value=b"%d" % i, partition=0)
    assert plain.flush(30) == 0
    setter = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False})
    try:
        setter.commit(offsets=[TopicPartition(TOPIC, 0, 5)], asynchronous=False)
        metadata = setter.consumer_group_metadata()  # not joined: generation -1, no member id
    finally:
        setter.close()
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": TID})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(TOPIC, value=b"out", partition=1)
    producer.send_offsets_to_transaction([TopicPartition(TOPIC, 0, 12)], metadata, 30)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": GROUP,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(TOPIC, 0)])
        early = []
        for _ in range(10):
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                early.append(message.offset())
        producer.commit_transaction(30)
        for _ in range(CLIENT_POLLS_MAX):
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                return early, message.offset()
        raise AssertionError("the consumer got nothing after the commit")
    finally:
        consumer.close()


async def test_a_read_committed_consumer_starts_at_the_offset_the_open_transaction_commits(
    tmp_path: Path,
) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic(TOPIC, 2)
        early, first = await anyio.to_thread.run_sync(
            read_committed_consumer_waits_for_the_transaction, daemon.kafka_port
        )
        assert early == []  # never from 5, the offset before the transaction
        assert first == 12


def zombie_member_commits_offsets(port: int) -> tuple[str, bool, int, int]:
    """Consumer A takes metadata in its first generation; B joins and both move to the next one;
    a transaction sends offsets with A's stale metadata, then one with its current metadata.
    (the stale one's error name, whether it asks for an abort, the offset committed after it,
    the offset committed after the current one)"""
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    bootstrap = f"127.0.0.1:{port}"
    assigned: dict[str, int] = {"a": 0, "b": 0}

    def consumer(name: str) -> Any:
        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": GROUP,
                "enable.auto.commit": False,
                "session.timeout.ms": 30_000,
            }
        )

        def on_assign(_: Any, partitions: Any) -> None:
            assigned[name] += 1

        c.subscribe([TOPIC], on_assign=on_assign)
        return c

    def committed() -> int:
        reader = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP})
        try:
            (tp,) = reader.committed([TopicPartition(TOPIC, 0)], timeout=30)
            return int(tp.offset)
        finally:
            reader.close()

    a = consumer("a")
    b = None
    try:
        for _ in range(CLIENT_POLLS_MAX):
            a.poll(0.2)
            if assigned["a"]:
                break
        assert assigned["a"] == 1
        stale = a.consumer_group_metadata()
        b = consumer("b")
        for _ in range(CLIENT_POLLS_MAX):
            a.poll(0.1)
            b.poll(0.1)
            if assigned["a"] == 2 and assigned["b"] == 1:
                break
        assert (assigned["a"], assigned["b"]) == (2, 1)
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": TID})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(TOPIC, value=b"zombie", partition=1)
        error, requires_abort = "", False
        try:
            producer.send_offsets_to_transaction([TopicPartition(TOPIC, 0, 7)], stale, 30)
            producer.commit_transaction(30)
        except KafkaException as exc:
            error, requires_abort = exc.args[0].name(), exc.args[0].txn_requires_abort()
            producer.abort_transaction(30)
        after_stale = committed()
        producer.begin_transaction()
        producer.produce(TOPIC, value=b"live", partition=1)
        producer.send_offsets_to_transaction([TopicPartition(TOPIC, 0, 9)], a.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
        return error, requires_abort, after_stale, committed()
    finally:
        a.close()
        if b is not None:
            b.close()


async def test_a_zombie_members_send_offsets_to_transaction_is_refused(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic(TOPIC, 2)
        error, requires_abort, after_stale, after_current = await anyio.to_thread.run_sync(
            zombie_member_commits_offsets, daemon.kafka_port
        )
        assert (error, requires_abort) == ("ILLEGAL_GENERATION", True)
        assert after_stale == -1001  # nothing committed for the group
        assert after_current == 9
