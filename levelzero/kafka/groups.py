"""Kafka's classic consumer-group protocol on one node: the group coordinator (JoinGroup,
SyncGroup, Heartbeat, LeaveGroup) and committed offsets (OffsetCommit, OffsetFetch).

A group moves empty -> preparing (a rebalance round collects JoinGroups) -> completing (the
leader's SyncGroup brings the assignment) -> stable, and back to preparing whenever a member
joins, leaves or misses its session timeout. A round ends when every known member has joined
(or, for a group that was empty, after INITIAL_REBALANCE_DELAY_S, so members starting together
land in one generation) or at the largest rebalance timeout, when members that did not rejoin
are dropped. Nothing runs in the background: session timeouts are checked whenever the group is
spoken to (a live member heartbeats, so a dead one is noticed within a heartbeat interval), and a
JoinGroup waiting in a round wakes at the next session expiry of a member that has not rejoined:
a member killed without a LeaveGroup is dropped at its session timeout and the round ends then,
not at the rebalance timeout (Kafka's heartbeat expiry completes the pending join the same way).

Group membership lives in memory and is stored as Kafka's coordinator stores it
(`GroupMetadataManager.storeGroup`): each group's metadata (its generation, protocol, leader and
members with their subscriptions and assignments) is written to the log store when a rebalance
completes, before the leader's SyncGroup is answered (a failed write fails the SyncGroup and the
members rejoin), and when the group goes empty or is deleted. A coordinator that does not hold a
group loads it from the store the first time the group is spoken to (after a restart, or when
the group's coordination comes to this node): a group with members comes back Stable, each
member's session timer started afresh, so its members go on with their member ids and
generation without rejoining; one that never comes back is dropped at its session timeout.
Committed offsets are durable in the log store's consumer-offsets role before OffsetCommit is
answered.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Coroutine, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
from kio.schema.errors import ErrorCode

from levelzero.core.errors import LevelZeroError
from levelzero.storage.protocols import ConsumerOffsetStore, OffsetRow

log = logging.getLogger(__name__)

INITIAL_REBALANCE_DELAY_S = 0.5  # Kafka's group.initial.rebalance.delay.ms is 3 s
GROUPS_MAX = 10_000
MEMBERS_PER_GROUP_MAX = 1_000
GROUP_ID_CHARS_MAX = 255
METADATA_CHARS_MAX = 4_096  # offset commit metadata (Kafka's offset.metadata.max.bytes)
# Kafka's default group.max.session.timeout.ms (30 min) bounds sessions, and rebalances here too
# (a member that never rejoins holds a rebalance for its rebalance timeout, `max.poll.interval.ms`).
REBALANCE_TIMEOUT_S_MAX = 1_800.0
SESSION_TIMEOUT_S_MIN = 0.1  # Kafka's default minimum is 6 s: shorter sessions are taken here
SESSION_TIMEOUT_S_MAX = 1_800.0
# Offsets retention (Kafka's offsets.retention.minutes, 7 days, checked every
# offsets.retention.check.interval.ms, 10 min): `GroupCoordinator.expire_offsets`.
OFFSETS_RETENTION_S_DEFAULT = 7 * 24 * 3600.0
OFFSETS_RETENTION_CHECK_S_DEFAULT = 600.0
GROUPS_EXPIRED_PER_PASS_MAX = 1_000  # the rest in the next pass


class StoredMember(msgspec.Struct, frozen=True):
    """A member as its group's metadata record keeps it (Kafka's MemberMetadata value)."""

    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_s: float
    session_timeout_s: float
    subscription: bytes  # its metadata for the group's protocol
    assignment: bytes


class StoredGroup(msgspec.Struct, frozen=True):
    """A group's metadata record (Kafka's GroupMetadataValue): its last completed rebalance, or
    an empty group's generation and protocol type. `version` says how to read the rest."""

    version: int
    protocol_type: str | None
    generation: int
    protocol_name: str | None
    leader: str | None
    members: list[StoredMember]
    # When the group last went empty (wall clock; None: it has members, or a record stored
    # before this field, whose emptiness is dated from the first expiry pass that sees it).
    empty_since: float | None = None


STORED_GROUP_VERSION = 1
_stored_encoder = msgspec.msgpack.Encoder()
_stored_decoder = msgspec.msgpack.Decoder(StoredGroup)


class GroupError(Exception):
    def __init__(self, code: ErrorCode) -> None:
        super().__init__(code.name)
        self.code = code


# The group states as Kafka names them (ListGroups, DescribeGroups).
KAFKA_STATES = {
    "empty": "Empty",
    "preparing": "PreparingRebalance",
    "completing": "CompletingRebalance",
    "stable": "Stable",
}
CONSUMER_PROTOCOL_TYPE = "consumer"


@dataclass(slots=True)
class Member:
    member_id: str
    client_id: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocols: list[tuple[str, bytes]]
    last_seen: float
    assignment: bytes = b""
    client_host: str = ""
    instance_id: str | None = None  # group.instance.id (KIP-345), as given at JoinGroup


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
    empty_since: float | None = None  # wall clock: when it last went empty (offsets retention)


@dataclass(frozen=True, slots=True)
class MemberSummary:
    member_id: str
    client_id: str
    client_host: str
    metadata: bytes  # the chosen protocol's metadata, while the group is stable (else empty)
    assignment: bytes  # likewise
    instance_id: str | None = None  # group.instance.id of a static member


@dataclass(frozen=True, slots=True)
class GroupSummary:
    """A group as ListGroups and DescribeGroups show it: a group known only by its committed
    offsets is Empty with no protocol type, as Kafka shows a standalone consumer's group."""

    group_id: str
    state: str  # Kafka's name (KAFKA_STATES)
    protocol_type: str
    protocol_name: str  # while stable, else empty
    members: tuple[MemberSummary, ...]


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    generation: int
    protocol_type: str | None
    protocol_name: str | None
    leader: str
    member_id: str
    members: list[tuple[str, bytes]]  # for the leader only


def _holder(group: Group, instance_id: str) -> str | None:
    """The member id holding `instance_id` (a static member, KIP-345), or None."""
    return next((m.member_id for m in group.members.values() if m.instance_id == instance_id), None)


def _supports(group: Group, protocol_type: str, protocols: Sequence[tuple[str, bytes]]) -> bool:
    """Whether a member joining `group` (which has members) with `protocol_type` and
    `protocols` may: the group's protocol type, and one of its protocols every member supports
    (the members as they joined last, a rejoining one included, as Kafka counts them)."""
    if group.protocol_type not in (None, protocol_type):
        return False
    names = {name for name, _ in protocols}
    for member in group.members.values():
        names &= {name for name, _ in member.protocols}
    return bool(names)


class GroupCoordinator:
    def __init__(
        self,
        store: ConsumerOffsetStore,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        placement: Callable[[], Hashable] = lambda: None,
    ) -> None:
        self.store = store
        self._clock = clock
        self._wall = wall_clock
        # What decides which node coordinates a group (the live nodes, in a cluster): when it
        # changes, groups this node held may have been coordinated, and stored, elsewhere.
        self._placement = placement
        self._placed = placement()
        self.groups: dict[str, Group] = {}
        self._absent: set[str] = set()  # groups the store was asked for and had no record of
        # Records to store that no request waits for (a group gone empty): group -> record, or
        # None to forget the group. Written in order with the others under `_writing`.
        self._unstored: dict[str, bytes | None] = {}
        self._writing = anyio.Lock()
        # Where those are written from: the daemon's task group (`Handlers.run` sets it); a
        # task runs only while there is something to write. Unset, `flush` writes them.
        self.spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], object] | None = None
        self._flushing = False

    # ------------------------------------------------------------------ stored metadata

    async def load(self, group_id: str) -> ErrorCode:
        """Bring the group's stored metadata into memory if this coordinator does not hold the
        group (as Kafka's coordinator loads its groups when it takes over): members come back
        Stable with their sessions started afresh. Call before any request about the group;
        COORDINATOR_NOT_AVAILABLE if the store could not be read (the client retries)."""
        try:
            await self._load(group_id)
        except LevelZeroError as exc:
            log.warning("loading group %s's metadata failed: %s: %s", group_id, exc.code, exc)
            return ErrorCode.coordinator_not_available
        return ErrorCode.none

    async def _load(self, group_id: str) -> None:
        placed = self._placement()
        if placed != self._placed:
            await self._forget_settled_groups()
            self._placed = placed
        if not group_id or len(group_id) > GROUP_ID_CHARS_MAX:
            return
        if group_id in self.groups or group_id in self._absent:
            return
        if group_id in self._unstored:  # on its way to the store
            stored = self._unstored[group_id]
        else:
            stored = await self.store.group_metadata(group_id)
        if group_id in self.groups:  # joined meanwhile: what is in memory is newer
            return
        if stored is None:
            if len(self._absent) >= GROUPS_MAX:
                self._absent.clear()
            self._absent.add(group_id)
            return
        record = _stored_decoder.decode(stored)
        assert record.version == STORED_GROUP_VERSION, record.version
        if len(self.groups) >= GROUPS_MAX:
            self._forget_empty_groups()
            if len(self.groups) >= GROUPS_MAX:
                return  # as a group this node cannot take: its members find out at their next call
        self.groups[group_id] = _restored(group_id, record, self._clock())

    async def _forget_settled_groups(self) -> None:
        """Forget every group not in a rebalance (its stored record says all of it): another
        node may have coordinated it, and stored it anew, since this one last did."""
        await self.flush()
        for group in list(self.groups.values()):
            if group.state in ("stable", "empty") and not group.joining:
                del self.groups[group.group_id]
        self._absent.clear()

    def _record(self, group: Group) -> bytes:
        members = [
            StoredMember(
                m.member_id,
                m.instance_id,
                m.client_id,
                m.client_host,
                m.rebalance_timeout_s,
                m.session_timeout_s,
                next((meta for name, meta in m.protocols if name == group.protocol_name), b""),
                m.assignment,
            )
            for m in group.members.values()
        ]
        record = StoredGroup(
            STORED_GROUP_VERSION,
            group.protocol_type,
            group.generation,
            group.protocol_name if members else None,
            group.leader if members else None,
            members,
            None if members else group.empty_since,
        )
        return _stored_encoder.encode(record)

    async def _store(self, group_id: str, record: bytes | None) -> None:
        """Durable on return (raises LevelZeroError if not); supersedes a record not yet stored."""
        async with self._writing:
            self._unstored.pop(group_id, None)
            await self.store.store_group_metadata(group_id, record, self._wall())
        if record is None:
            self._absent.add(group_id)
        else:
            self._absent.discard(group_id)

    def _store_later(self, group_id: str, record: bytes | None) -> None:
        self._absent.discard(group_id)  # `load` reads it from `_unstored` until it is stored
        self._unstored[group_id] = record
        if self.spawn is not None and not self._flushing:
            self._flushing = True
            self.spawn(self._flush_unstored)

    async def _flush_unstored(self) -> None:
        try:
            await self.flush()
        finally:
            self._flushing = False
        if self._unstored and self.spawn is not None:  # added as the flush ended
            self._flushing = True
            self.spawn(self._flush_unstored)

    async def flush(self) -> None:
        """Store the records no request waited for (a failure is logged: the group is stored
        again at its next rebalance, as Kafka's coordinator only logs a failed write then)."""
        async with self._writing:
            while self._unstored:
                group_id, record = next(iter(self._unstored.items()))
                del self._unstored[group_id]
                try:
                    await self.store.store_group_metadata(group_id, record, self._wall())
                except LevelZeroError as exc:
                    log.warning("storing group %s's metadata failed: %s: %s", group_id, exc.code, exc)
                    continue
                if record is None:
                    self._absent.add(group_id)
                else:
                    self._absent.discard(group_id)

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
            if m.member_id not in group.joining and now - m.last_seen >= m.session_timeout_s
        ]
        if gone:
            for member_id in gone:
                del group.members[member_id]
            self._members_changed(group)

    def _next_expiry(self, group: Group) -> float:
        """When the first member that has not joined the round in progress misses its session."""
        return min(
            (
                m.last_seen + m.session_timeout_s
                for m in group.members.values()
                if m.member_id not in group.joining
            ),
            default=float("inf"),
        )

    def _members_changed(self, group: Group) -> None:
        if group.state == "preparing":
            # The round in progress takes the change into account: it ends now if every member
            # left has joined it (the initial round waits out its delay all the same), or if
            # none is left (the group is empty: its offsets may be reset or it deleted, as
            # Kafka's coordinator completes the join when the last member leaves; nothing would
            # end the round otherwise, no JoinGroup waiting on it).
            if not group.members or (not group.initial_round and group.joining >= set(group.members)):
                self._complete_round(group)
            return
        if not group.members:
            group.state = "empty"
            group.empty_since = self._wall()
            group.synced.set()  # SyncGroup waiters of the old generation: rebalance
            self._store_later(group.group_id, self._record(group))
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
        now = self._clock()
        for member in group.members.values():
            member.last_seen = now  # a session runs from the round's end (a round can outlast it)
        if not group.members:
            group.state = "empty"
            group.empty_since = self._wall()
            current.generation = group.generation
            current.done.set()
            self._store_later(group.group_id, self._record(group))
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
        client_host: str = "",
        instance_id: str | None = None,
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
        if group.members and not _supports(group, protocol_type, protocols):
            # Refused to the joiner alone, as Kafka's coordinator checks a join
            # (`GroupMetadata.supportsProtocols`): a member whose assignors the group's members
            # do not all share would otherwise fail the whole round, every member left without
            # partitions for as long as it kept joining.
            return refused(ErrorCode.inconsistent_group_protocol)
        now = self._clock()
        holder = None if instance_id is None else _holder(group, instance_id)
        if member_id and holder is not None and holder != member_id:
            return refused(ErrorCode.fenced_instance_id)  # an older holder of the instance id
        rebalance_s = min(max(rebalance_timeout_ms / 1000, session_s), REBALANCE_TIMEOUT_S_MAX)

        def joined(member_id: str, assignment: bytes = b"") -> Member:
            return Member(
                member_id,
                client_id,
                session_s,
                rebalance_s,
                list(protocols),
                now,
                assignment=assignment,
                client_host=client_host,
                instance_id=instance_id,
            )

        if not member_id and holder is not None:
            # A static member back (restarted, its session not over): it takes the place of the
            # instance id's holder, under a new member id (the old one is fenced from now on),
            # with its assignment. A stable group whose protocol it still speaks goes on with
            # no rebalance, as Kafka's coordinator does it (KIP-345); otherwise it joins the
            # rebalance this starts or that is under way.
            leader = group.leader
            old = group.members.pop(holder)
            group.joining.discard(holder)
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            group.members[member_id] = joined(member_id, old.assignment)
            if group.leader == holder:
                group.leader = member_id
            if group.state == "stable" and group.protocol_name in {name for name, _ in protocols}:
                # The old leader id: the member does not take itself for the leader and
                # assign partitions a stable group would not hand out.
                return JoinResult(
                    ErrorCode.none,
                    group.generation,
                    group.protocol_type,
                    group.protocol_name,
                    leader or "",
                    member_id,
                    [],
                )
        elif not member_id:
            if len(group.members) >= MEMBERS_PER_GROUP_MAX:
                return refused(ErrorCode.group_max_size_reached)
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
        elif member_id not in group.members:
            return refused(ErrorCode.unknown_member_id)
        group.protocol_type = protocol_type
        group.members[member_id] = joined(member_id)
        if group.state != "preparing":
            self._start_round(group, initial=group.state == "empty")
        group.joining.add(member_id)
        current = group.round
        if not group.initial_round and group.joining >= set(group.members):
            self._complete_round(group)
        while not current.done.is_set():
            self._expire(group)  # a member gone without a word is dropped: the round may end here
            if current.done.is_set():
                break
            now = self._clock()
            remaining = group.round_deadline - now
            if remaining <= 0:
                if group.round is current and group.state == "preparing":
                    self._complete_round(group)
                break
            with anyio.move_on_after(min(remaining, self._next_expiry(group) - now)):
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

    def instance_ids(self, group_id: str) -> dict[str, str | None]:
        """Member id -> group.instance.id of the group's members (JoinGroup's answer to a leader)."""
        group = self.groups.get(group_id)
        return {} if group is None else {m.member_id: m.instance_id for m in group.members.values()}

    def _member(
        self, group_id: str, member_id: str, generation: int, instance_id: str | None = None
    ) -> tuple[Group, Member]:
        group = self._group(group_id, create=False)
        if instance_id is not None:
            holder = _holder(group, instance_id)
            if holder is not None and holder != member_id:
                raise GroupError(ErrorCode.fenced_instance_id)  # replaced by a newer member
        member = group.members.get(member_id)
        if member is None:
            raise GroupError(ErrorCode.unknown_member_id)
        member.last_seen = self._clock()
        if generation != group.generation:
            raise GroupError(ErrorCode.illegal_generation)
        return group, member

    async def sync(
        self,
        group_id: str,
        member_id: str,
        generation: int,
        assignments: Sequence[tuple[str, bytes]],
        instance_id: str | None = None,
    ) -> tuple[ErrorCode, bytes, str | None, str | None]:
        try:
            group, member = self._member(group_id, member_id, generation, instance_id)
        except GroupError as exc:
            return exc.code, b"", None, None
        if group.state == "preparing":
            return ErrorCode.rebalance_in_progress, b"", None, None
        if group.state == "completing" and member_id == group.leader:
            given = dict(assignments)
            for other in group.members.values():
                other.assignment = given.get(other.member_id, b"")
            # Stored before any member is answered, as Kafka's coordinator does: a member told
            # its assignment can count on its member id and generation outliving a restart.
            try:
                await self._store(group_id, self._record(group))
            except LevelZeroError as exc:
                log.warning("storing group %s's metadata failed: %s: %s", group_id, exc.code, exc)
                if group.generation == generation and group.state == "completing":
                    self._start_round(group, initial=False)  # every member rejoins
                return ErrorCode.coordinator_not_available, b"", None, None
            if group.generation == generation and group.state == "completing":
                group.state = "stable"
                group.synced.set()
        synced = group.synced
        with anyio.move_on_after(member.rebalance_timeout_s):
            await synced.wait()
        if group.generation != generation or group.state != "stable" or member_id not in group.members:
            return ErrorCode.rebalance_in_progress, b"", None, None
        return ErrorCode.none, member.assignment, group.protocol_type, group.protocol_name

    def heartbeat(
        self, group_id: str, member_id: str, generation: int, instance_id: str | None = None
    ) -> ErrorCode:
        try:
            group, _ = self._member(group_id, member_id, generation, instance_id)
        except GroupError as exc:
            known = self.groups.get(group_id)
            if exc.code == ErrorCode.illegal_generation and known is not None and known.state == "preparing":
                return ErrorCode.rebalance_in_progress
            return exc.code
        if group.state == "preparing":
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def leave(
        self, group_id: str, member_ids: Sequence[str], instance_ids: Sequence[str | None] | None = None
    ) -> dict[str, ErrorCode]:
        """LeaveGroup: each member by its id, or (v3+) by its instance id alone (an admin
        client's removal of a static member); a member id another member's instance id now
        holds is FENCED_INSTANCE_ID."""
        if instance_ids is None:
            instance_ids = [None] * len(member_ids)
        try:
            group = self._group(group_id, create=False)
        except GroupError as exc:
            return {m: exc.code for m in member_ids}
        out = {}
        for member_id, instance_id in zip(member_ids, instance_ids, strict=True):
            leaving = member_id
            if instance_id is not None:
                holder = _holder(group, instance_id)
                if holder is not None and member_id and member_id != holder:
                    out[member_id] = ErrorCode.fenced_instance_id
                    continue
                leaving = holder or member_id
            if not leaving or group.members.pop(leaving, None) is None:
                out[member_id] = ErrorCode.unknown_member_id
            else:
                group.joining.discard(leaving)
                out[member_id] = ErrorCode.none
        if any(code == ErrorCode.none for code in out.values()):
            self._members_changed(group)
        return out

    # ------------------------------------------------------------------ offsets

    def check_commit(
        self,
        group_id: str,
        member_id: str,
        generation: int,
        instance_id: str | None = None,
        *,
        transactional: bool = False,
    ) -> ErrorCode:
        """May offsets be committed for this member (OffsetCommit; with `transactional`,
        TxnOffsetCommit v3+, KIP-447)? As Kafka's coordinator validates an offset commit:

        - generation -1 to an empty group, or one that does not exist, is not checked (a
          standalone consumer's, or an admin client's `alter_consumer_group_offsets`);
        - generation -1 with no member id and no instance id to a group with members (preparing
          or completing a rebalance, or stable) is UNKNOWN_MEMBER_ID: only its members commit
          there. A transaction's is not checked (a producer naming only the group, v0-2);
        - otherwise the member must be in the group (UNKNOWN_MEMBER_ID: a member dropped at its
          session timeout, or a group this node knows no members of, as after a restart) at the
          group's generation (ILLEGAL_GENERATION: a zombie of an older generation). A member
          whose group.instance.id a newer member joined with is FENCED_INSTANCE_ID (static
          members are otherwise served as dynamic ones);
        - a member of the current generation may commit while the group prepares a rebalance (a
          consumer commits what it processed when its partitions are revoked), but not between
          JoinGroup's answer and SyncGroup, when it has no assignment to commit for
          (REBALANCE_IN_PROGRESS); a transaction's commit is not refused then.
        """
        if not group_id or len(group_id) > GROUP_ID_CHARS_MAX:
            return ErrorCode.invalid_group_id
        group = self.groups.get(group_id)
        if group is not None:
            self._expire(group)
        if generation < 0 and (group is None or group.state == "empty"):
            return ErrorCode.none
        if generation < 0 and not member_id and instance_id is None:
            return ErrorCode.none if transactional else ErrorCode.unknown_member_id
        members = {} if group is None else group.members
        if instance_id is not None:
            holders = [m.member_id for m in members.values() if m.instance_id == instance_id]
            if holders and holders[-1] != member_id:  # the latest to join with it holds it
                return ErrorCode.fenced_instance_id
        member = members.get(member_id)
        if group is None or member is None:
            return ErrorCode.unknown_member_id
        if not transactional:
            member.last_seen = self._clock()  # a member's commit keeps its session, as a heartbeat
        if generation != group.generation:
            return ErrorCode.illegal_generation
        if not transactional and group.state == "completing":
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    # Committed offsets are read from the store each time, never kept here: the store is where
    # they change (a topic deleted with its groups' offsets, on this node or another; another
    # node coordinating the group while this one was not; `levelzero restore`), and a copy
    # kept here served a deleted topic's offsets to the consumers of a topic made again with
    # its name, which then skipped its first records. OffsetFetch is a consumer's start, not
    # its loop: one indexed read of the group's rows.

    async def commit(self, group_id: str, offsets: Sequence[tuple[str, int, int, str, int]]) -> None:
        """Durable on return: (topic, partition, offset, metadata, leader epoch) for `group_id`."""
        now = self._wall()
        rows = [OffsetRow(group_id, t, p, o, m, now, e) for t, p, o, m, e in offsets]
        await self.store.commit_offsets(rows)

    async def committed(self, group_id: str) -> dict[tuple[str, int], OffsetRow]:
        return {(r.topic, r.partition): r for r in await self.store.committed_offsets(group_id)}

    # ------------------------------------------------------------------ admin

    async def has_offsets(self, group_id: str) -> bool:
        return bool(await self.store.committed_offsets(group_id))

    async def summaries(self, coordinates: Callable[[str], bool] = lambda _: True) -> list[GroupSummary]:
        """Every group this coordinator knows (ListGroups): those in memory, and those known only
        by committed offsets (Empty, as Kafka lists them), in group id order. A group stored
        but not in memory (after a restart) that this node `coordinates` is loaded first, as a
        Kafka coordinator loads its groups when it takes over: listed before as Empty with no
        protocol type until a request about it loaded it, and a listing by state missed it."""
        with_offsets = set(await self.store.offset_groups())
        for group_id in await self.store.metadata_groups():  # (offsets alone: listed Empty below)
            if group_id not in self.groups and coordinates(group_id):
                await self._load(group_id)
        out = {}
        for group in list(self.groups.values()):
            self._expire(group)
            if self._dead(group, group.group_id in with_offsets):
                continue
            out[group.group_id] = self._summary(group)
        for group_id in with_offsets:
            if group_id not in out:
                out[group_id] = GroupSummary(group_id, "Empty", "", "", ())
        return [out[group_id] for group_id in sorted(out)]

    async def summary(self, group_id: str) -> GroupSummary | None:
        """The group as DescribeGroups shows it; None for a group Kafka would call dead (neither
        members nor committed offsets)."""
        group = self.groups.get(group_id)
        if group is not None:
            self._expire(group)
            if group.state != "empty" or not self._dead(group, await self.has_offsets(group_id)):
                return self._summary(group)
            return None
        if group_id and len(group_id) <= GROUP_ID_CHARS_MAX and await self.has_offsets(group_id):
            return GroupSummary(group_id, "Empty", "", "", ())
        return None

    def _dead(self, group: Group, has_offsets: bool) -> bool:
        """An empty group without committed offsets is dead, as Kafka's coordinator makes it
        once its offsets are gone (their topic deleted, or never committed): forgotten here,
        neither listed nor described."""
        if group.state != "empty" or group.members or group.joining or has_offsets:
            return False
        if self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]
            self._store_later(group.group_id, None)  # as Kafka's tombstone for a dead group
        return True

    @staticmethod
    def _summary(group: Group) -> GroupSummary:
        # As Kafka's GroupMetadata.summary: the protocol, each member's metadata and assignment
        # only while stable.
        stable = group.state == "stable"
        members = []
        for m in group.members.values():
            metadata = b""
            if stable:
                metadata = next((meta for name, meta in m.protocols if name == group.protocol_name), b"")
            members.append(
                MemberSummary(
                    m.member_id,
                    m.client_id,
                    m.client_host,
                    metadata,
                    m.assignment if stable else b"",
                    m.instance_id,
                )
            )
        return GroupSummary(
            group.group_id,
            KAFKA_STATES[group.state],
            group.protocol_type or "",
            (group.protocol_name or "") if stable else "",
            tuple(members),
        )

    async def delete_group(self, group_id: str) -> ErrorCode:
        """DeleteGroups: an empty group's committed offsets and the group itself."""
        if not group_id or len(group_id) > GROUP_ID_CHARS_MAX:
            return ErrorCode.invalid_group_id
        group = self.groups.get(group_id)
        if group is not None:
            self._expire(group)
            if group.state != "empty":
                return ErrorCode.non_empty_group
        elif not await self.has_offsets(group_id):
            return ErrorCode.group_id_not_found
        await self._delete_offsets(group_id, None)
        if self.groups.get(group_id) is group and group is not None and group.state == "empty":
            del self.groups[group_id]
            await self._store(group_id, None)
        return ErrorCode.none

    async def delete_offsets(
        self, group_id: str, partitions: Sequence[tuple[str, int]]
    ) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]:
        """OffsetDelete, as Kafka's coordinator answers it: an empty group loses the offsets
        asked; a consumer group with members keeps those of topics a member subscribes to
        (GROUP_SUBSCRIBED_TO_TOPIC) and loses the others; another group with members refuses
        (NON_EMPTY_GROUP). (the group's error, partition -> error)"""
        if not group_id or len(group_id) > GROUP_ID_CHARS_MAX:
            return ErrorCode.invalid_group_id, {}
        group = self.groups.get(group_id)
        if group is not None:
            self._expire(group)
        if group is None or group.state == "empty":
            if group is None and not await self.has_offsets(group_id):
                return ErrorCode.group_id_not_found, {}
            subscribed: set[str] = set()
        elif group.protocol_type == CONSUMER_PROTOCOL_TYPE:
            topics = [subscribed_topics(meta) for m in group.members.values() for _, meta in m.protocols]
            if any(t is None for t in topics):  # unreadable: every topic counts as subscribed
                subscribed = {t for t, _ in partitions}
            else:
                subscribed = {t for ts in topics if ts is not None for t in ts}
        else:
            return ErrorCode.non_empty_group, {}
        codes = {
            tp: ErrorCode.group_subscribed_to_topic if tp[0] in subscribed else ErrorCode.none
            for tp in partitions
        }
        gone = [tp for tp, code in codes.items() if code == ErrorCode.none]
        if gone:
            await self._delete_offsets(group_id, gone)
        return ErrorCode.none, codes

    async def _delete_offsets(self, group_id: str, partitions: Sequence[tuple[str, int]] | None) -> None:
        await self.store.delete_offsets(group_id, partitions)

    # ------------------------------------------------------------------ offsets retention

    async def expire_offsets(
        self, retention_s: float, coordinates: Callable[[str], bool] = lambda _: True
    ) -> tuple[int, int]:
        """One pass of offsets retention, as Kafka's coordinator runs it (KIP-211): a group
        without members loses each committed offset `retention_s` after its commit, and none
        before `retention_s` after the group went empty; a group left with neither members nor
        offsets is deleted, its metadata too (Kafka's Dead). A group with members keeps every
        offset (Kafka also expires a stable consumer group's offsets of topics no member
        subscribes to: not done here). Only the groups this node `coordinates`; at most
        GROUPS_EXPIRED_PER_PASS_MAX groups, the rest in the next pass. (groups that lost
        offsets, offsets gone)"""
        now = self._wall()
        cutoff = now - retention_s
        known = set(await self.store.offset_groups()) | set(await self.store.metadata_groups())
        groups = offsets = 0
        for group_id in sorted(known):
            if groups >= GROUPS_EXPIRED_PER_PASS_MAX:
                break
            if not coordinates(group_id) or not group_id or len(group_id) > GROUP_ID_CHARS_MAX:
                continue
            held = group_id in self.groups
            await self._load(group_id)
            group = self.groups.get(group_id)
            if group is not None:
                self._expire(group)
                if group.members or group.joining or group.state != "empty":
                    continue
                if group.empty_since is None:  # stored before its emptiness was dated
                    group.empty_since = now
                    self._store_later(group_id, self._record(group))
                if group.empty_since > cutoff:
                    if not held:
                        self._forget_loaded(group)
                    continue
            rows = await self.store.committed_offsets(group_id)
            old = sum(1 for r in rows if r.committed_at < cutoff)
            if group is not None and (group.members or group.joining):
                continue  # joined while the rows were read
            if old and coordinates(group_id):  # (coordinated here still)
                await self.store.expire_offsets(group_id, cutoff)
                groups += 1
                offsets += old
                log.info(
                    "consumer group %s: %d committed offset(s) expired (offsets retention %g s)",
                    group_id,
                    old,
                    retention_s,
                    extra={"group": group_id, "offsets": old},
                )
            if group is None or self.groups.get(group_id) is not group:
                continue
            if old == len(rows) and not await self.store.committed_offsets(group_id):  # none since
                if (
                    self.groups.get(group_id) is group
                    and not group.members
                    and not group.joining
                    and coordinates(group_id)
                ):
                    del self.groups[group_id]  # Dead: neither members nor offsets
                    await self._store(group_id, None)
            elif not held:
                self._forget_loaded(group)
        return groups, offsets

    def _forget_loaded(self, group: Group) -> None:
        """A group loaded only to be looked at, still empty: its stored record says all of it."""
        if self.groups.get(group.group_id) is group and not group.members and not group.joining:
            del self.groups[group.group_id]


def _restored(group_id: str, record: StoredGroup, now: float) -> Group:
    """A group as its record left it: Stable with its members (each session from `now`), or
    Empty at its generation."""
    members = {
        m.member_id: Member(
            m.member_id,
            m.client_id,
            m.session_timeout_s,
            m.rebalance_timeout_s,
            [(record.protocol_name or "", m.subscription)],
            now,
            assignment=m.assignment,
            client_host=m.client_host,
            instance_id=m.instance_id,
        )
        for m in record.members[:MEMBERS_PER_GROUP_MAX]
    }
    group = Group(
        group_id,
        state="stable" if members else "empty",
        generation=record.generation,
        protocol_type=record.protocol_type,
        protocol_name=record.protocol_name if members else None,
        leader=record.leader if members else None,
        members=members,
        empty_since=None if members else record.empty_since,
    )
    group.synced.set()
    return group


def subscribed_topics(metadata: bytes) -> list[str] | None:
    """The topics of a consumer protocol subscription (Kafka's ConsumerProtocolSubscription:
    version int16, then an array of int16-length strings, every version), or None if the bytes
    do not read as one."""
    try:
        count = int.from_bytes(metadata[2:6], "big", signed=True)
        if len(metadata) < 6 or not 0 <= count <= len(metadata):
            return None
        pos, topics = 6, []
        for _ in range(count):
            size = int.from_bytes(metadata[pos : pos + 2], "big", signed=True)
            if size < 0 or pos + 2 + size > len(metadata):
                return None
            topics.append(metadata[pos + 2 : pos + 2 + size].decode())
            pos += 2 + size
    except UnicodeDecodeError:
        return None
    return topics
