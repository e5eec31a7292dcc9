"""Kafka's classic consumer-group protocol on one node: the group coordinator (JoinGroup,
SyncGroup, Heartbeat, LeaveGroup) and committed offsets (OffsetCommit, OffsetFetch).

A group moves empty -> preparing (a rebalance round collects JoinGroups) -> completing (the
leader's SyncGroup brings the assignment) -> stable, and back to preparing whenever a member
joins, leaves or misses its session timeout. A round ends when every known member has joined
(or, for a group that was empty, after INITIAL_REBALANCE_DELAY_S, so members starting together
land in one generation) or at the largest rebalance timeout, when members that did not rejoin
are dropped. Nothing runs in the background: session timeouts are checked whenever the group is
spoken to (a live member heartbeats, so a dead one is noticed within a heartbeat interval).

Group membership lives in memory (members rejoin after a restart, as they do when a Kafka
coordinator moves); committed offsets are durable in the log store's consumer-offsets role
before OffsetCommit is answered.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import anyio
from kio.schema.errors import ErrorCode

from levelzero.storage.protocols import ConsumerOffsetStore, OffsetRow

INITIAL_REBALANCE_DELAY_S = 0.5  # Kafka's group.initial.rebalance.delay.ms is 3 s
GROUPS_MAX = 10_000
MEMBERS_PER_GROUP_MAX = 1_000
GROUP_ID_CHARS_MAX = 255
METADATA_CHARS_MAX = 4_096  # offset commit metadata (Kafka's offset.metadata.max.bytes)
REBALANCE_TIMEOUT_S_MAX = 300.0
SESSION_TIMEOUT_S_MIN = 0.1
SESSION_TIMEOUT_S_MAX = 300.0


class GroupError(Exception):
    def __init__(self, code: ErrorCode) -> None:
        super().__init__(code.name)
        self.code = code


@dataclass(slots=True)
class Member:
    member_id: str
    client_id: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocols: list[tuple[str, bytes]]
    last_seen: float
    assignment: bytes = b""


@dataclass(slots=True)
class Round:
    """One rebalance round; what its JoinGroup waiters are answered with once `done`."""

    done: anyio.Event = field(default_factory=anyio.Event)
    generation: int = -1
    protocol_name: str | None = None
    leader: str = ""
    members: dict[str, bytes] = field(default_factory=dict)  # member -> chosen protocol's metadata
    error: ErrorCode = ErrorCode.none


@dataclass(slots=True)
class Group:
    group_id: str
    state: str = "empty"  # empty | preparing | completing | stable
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    joining: set[str] = field(default_factory=set)
    round: Round = field(default_factory=Round)
    round_deadline: float = 0.0
    initial_round: bool = False
    synced: anyio.Event = field(default_factory=anyio.Event)


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    generation: int
    protocol_type: str | None
    protocol_name: str | None
    leader: str
    member_id: str
    members: list[tuple[str, bytes]]  # for the leader only


class GroupCoordinator:
    def __init__(
        self,
        store: ConsumerOffsetStore,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self._clock = clock
        self._wall = wall_clock
        self.groups: dict[str, Group] = {}
        self._offsets: dict[str, dict[tuple[str, int], OffsetRow]] = {}

    # ------------------------------------------------------------------ membership

    def _group(self, group_id: str, *, create: bool) -> Group:
        if not group_id or len(group_id) > GROUP_ID_CHARS_MAX:
            raise GroupError(ErrorCode.invalid_group_id)
        group = self.groups.get(group_id)
        if group is None:
            if not create:
                raise GroupError(ErrorCode.unknown_member_id)
            if len(self.groups) >= GROUPS_MAX:
                self._forget_empty_groups()
                if len(self.groups) >= GROUPS_MAX:
                    raise GroupError(ErrorCode.coordinator_not_available)
            group = self.groups[group_id] = Group(group_id)
        self._expire(group)
        return group

    def _forget_empty_groups(self) -> None:
        for group_id in [g.group_id for g in self.groups.values() if not g.members and not g.joining]:
            del self.groups[group_id]

    def _expire(self, group: Group) -> None:
        now = self._clock()
        gone = [
            m.member_id
            for m in group.members.values()
            if m.member_id not in group.joining and now - m.last_seen > m.session_timeout_s
        ]
        if gone:
            for member_id in gone:
                del group.members[member_id]
            self._members_changed(group)

    def _members_changed(self, group: Group) -> None:
        if group.state == "preparing":
            return  # the round in progress takes the change into account
        if not group.members:
            group.state = "empty"
            group.synced.set()  # SyncGroup waiters of the old generation: rebalance
            return
        self._start_round(group, initial=False)

    def _start_round(self, group: Group, *, initial: bool) -> None:
        group.state = "preparing"
        group.round = Round()
        group.joining.clear()
        group.synced.set()  # SyncGroup waiters of the old generation: rebalance in progress
        group.initial_round = initial
        if initial:
            group.round_deadline = self._clock() + INITIAL_REBALANCE_DELAY_S
        else:
            longest = max((m.rebalance_timeout_s for m in group.members.values()), default=1.0)
            group.round_deadline = self._clock() + longest

    def _complete_round(self, group: Group) -> None:
        assert group.state == "preparing"
        current = group.round
        for member_id in [m for m in group.members if m not in group.joining]:
            del group.members[member_id]
        group.joining.clear()
        group.generation += 1
        if not group.members:
            group.state = "empty"
            current.generation = group.generation
            current.done.set()
            return
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        leader = group.members[group.leader]
        supported = [name for name, _ in leader.protocols]
        chosen = next(
            (
                name
                for name in supported
                if all(name in {n for n, _ in m.protocols} for m in group.members.values())
            ),
            None,
        )
        current.generation = group.generation
        current.leader = group.leader
        if chosen is None:
            current.error = ErrorCode.inconsistent_group_protocol
        else:
            current.protocol_name = chosen
            current.members = {
                m.member_id: next(meta for name, meta in m.protocols if name == chosen)
                for m in group.members.values()
            }
        group.protocol_name = chosen
        for member in group.members.values():
            member.assignment = b""
        group.state = "completing"
        group.synced = anyio.Event()
        current.done.set()

    async def join(
        self,
        group_id: str,
        member_id: str,
        client_id: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
    ) -> JoinResult:
        def refused(code: ErrorCode) -> JoinResult:
            return JoinResult(code, -1, None, None, "", member_id, [])

        session_s = session_timeout_ms / 1000
        if not SESSION_TIMEOUT_S_MIN <= session_s <= SESSION_TIMEOUT_S_MAX:
            return refused(ErrorCode.invalid_session_timeout)
        if not protocols:
            return refused(ErrorCode.inconsistent_group_protocol)
        try:
            group = self._group(group_id, create=True)
        except GroupError as exc:
            return refused(exc.code)
        if group.members and group.protocol_type not in (None, protocol_type):
            return refused(ErrorCode.inconsistent_group_protocol)
        now = self._clock()
        if not member_id:
            if len(group.members) >= MEMBERS_PER_GROUP_MAX:
                return refused(ErrorCode.group_max_size_reached)
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
        elif member_id not in group.members:
            return refused(ErrorCode.unknown_member_id)
        group.protocol_type = protocol_type
        group.members[member_id] = Member(
            member_id,
            client_id,
            session_s,
            min(max(rebalance_timeout_ms / 1000, session_s), REBALANCE_TIMEOUT_S_MAX),
            list(protocols),
            now,
        )
        if group.state != "preparing":
            self._start_round(group, initial=group.state == "empty")
        group.joining.add(member_id)
        current = group.round
        if not group.initial_round and group.joining >= set(group.members):
            self._complete_round(group)
        while not current.done.is_set():
            remaining = group.round_deadline - self._clock()
            if remaining <= 0:
                if group.round is current and group.state == "preparing":
                    self._complete_round(group)
                break
            with anyio.move_on_after(remaining):
                await current.done.wait()
        if member_id not in current.members and current.error == ErrorCode.none:
            return refused(ErrorCode.unknown_member_id)
        return JoinResult(
            current.error,
            current.generation,
            protocol_type,
            current.protocol_name,
            current.leader,
            member_id,
            sorted(current.members.items()) if member_id == current.leader else [],
        )

    def _member(self, group_id: str, member_id: str, generation: int) -> tuple[Group, Member]:
        group = self._group(group_id, create=False)
        member = group.members.get(member_id)
        if member is None:
            raise GroupError(ErrorCode.unknown_member_id)
        member.last_seen = self._clock()
        if generation != group.generation:
            raise GroupError(ErrorCode.illegal_generation)
        return group, member

    async def sync(
        self, group_id: str, member_id: str, generation: int, assignments: Sequence[tuple[str, bytes]]
    ) -> tuple[ErrorCode, bytes, str | None, str | None]:
        try:
            group, member = self._member(group_id, member_id, generation)
        except GroupError as exc:
            return exc.code, b"", None, None
        if group.state == "preparing":
            return ErrorCode.rebalance_in_progress, b"", None, None
        if group.state == "completing" and member_id == group.leader:
            given = dict(assignments)
            for other in group.members.values():
                other.assignment = given.get(other.member_id, b"")
            group.state = "stable"
            group.synced.set()
        synced = group.synced
        with anyio.move_on_after(member.rebalance_timeout_s):
            await synced.wait()
        if group.generation != generation or group.state != "stable" or member_id not in group.members:
            return ErrorCode.rebalance_in_progress, b"", None, None
        return ErrorCode.none, member.assignment, group.protocol_type, group.protocol_name

    def heartbeat(self, group_id: str, member_id: str, generation: int) -> ErrorCode:
        try:
            group, _ = self._member(group_id, member_id, generation)
        except GroupError as exc:
            known = self.groups.get(group_id)
            if exc.code == ErrorCode.illegal_generation and known is not None and known.state == "preparing":
                return ErrorCode.rebalance_in_progress
            return exc.code
        if group.state == "preparing":
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def leave(self, group_id: str, member_ids: Sequence[str]) -> dict[str, ErrorCode]:
        try:
            group = self._group(group_id, create=False)
        except GroupError as exc:
            return {m: exc.code for m in member_ids}
        out = {}
        for member_id in member_ids:
            if group.members.pop(member_id, None) is None:
                out[member_id] = ErrorCode.unknown_member_id
            else:
                group.joining.discard(member_id)
                out[member_id] = ErrorCode.none
        if any(code == ErrorCode.none for code in out.values()):
            if (
                group.state == "preparing"
                and group.joining >= set(group.members)
                and group.members
                and not group.initial_round
            ):
                self._complete_round(group)
            else:
                self._members_changed(group)
        return out

    # ------------------------------------------------------------------ offsets

    async def _cached(self, group_id: str) -> dict[tuple[str, int], OffsetRow]:
        cached = self._offsets.get(group_id)
        if cached is None:
            rows = await self.store.committed_offsets(group_id)
            cached = self._offsets.setdefault(group_id, {(r.topic, r.partition): r for r in rows})
            if len(self._offsets) > GROUPS_MAX:  # forget the oldest cached group (it is stored)
                del self._offsets[next(iter(self._offsets))]
        return cached

    def check_commit(self, group_id: str, member_id: str, generation: int) -> ErrorCode:
        """May this member commit? A commit with generation -1 is a standalone consumer's."""
        if not group_id or len(group_id) > GROUP_ID_CHARS_MAX:
            return ErrorCode.invalid_group_id
        if generation < 0:
            return ErrorCode.none
        try:
            group, _ = self._member(group_id, member_id, generation)
        except GroupError as exc:
            return exc.code
        # As Kafka's coordinator: a member of the current generation may commit while the group
        # prepares a rebalance (a consumer commits what it processed when its partitions are
        # revoked); between JoinGroup's answer and SyncGroup it has no assignment to commit for.
        if group.state == "completing":
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    async def commit(self, group_id: str, offsets: Sequence[tuple[str, int, int, str]]) -> None:
        """Durable on return: (topic, partition, offset, metadata) for `group_id`."""
        now = self._wall()
        rows = [OffsetRow(group_id, t, p, o, m, now) for t, p, o, m in offsets]
        await self.store.commit_offsets(rows)
        cached = await self._cached(group_id)
        for row in rows:
            cached[(row.topic, row.partition)] = row

    async def committed(self, group_id: str) -> dict[tuple[str, int], OffsetRow]:
        return dict(await self._cached(group_id))
