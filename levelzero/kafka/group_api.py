"""FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, and the groups' admin APIs
(ListGroups, DescribeGroups, DeleteGroups, OffsetDelete): answered by the group coordinator
(`groups.py`) on the node that coordinates the group, NOT_COORDINATOR elsewhere. ListGroups
answers the groups this node coordinates, as each Kafka broker does (an admin client asks every
broker)."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from levelzero.core.errors import LevelZeroError
from levelzero.kafka.errors import coordinator_unavailable
from levelzero.kafka.groups import GROUP_ID_CHARS_MAX, GroupCoordinator, GroupSummary
from levelzero.kafka.metadata import Cluster
from levelzero.kafka.operations import authorized_operations
from levelzero.kafka.protocol import Request, make

CLASSIC_GROUP_TYPE = "classic"  # the only group type served (KIP-848's "consumer" is not)


class GroupApi:
    def __init__(self, groups: GroupCoordinator, cluster: Cluster) -> None:
        self.groups = groups
        self.cluster = cluster

    def find_coordinator(self, request: Request) -> Any:
        m = request.response_module
        body = request.body

        def where(key: str) -> dict[str, Any]:
            broker = self.cluster.coordinator(key)
            return dict(node_id=broker.node_id, host=broker.host, port=broker.port)

        key_type = getattr(body, "key_type", 0)
        if key_type not in (0, 1):  # a group or a transactional id (Kafka: CoordinatorType.forId)
            refusal = dict(
                error_code=ErrorCode.invalid_request,
                error_message=f"unknown coordinator key type {key_type}",
                node_id=-1,
                host="",
                port=-1,
            )
            if request.api_version >= 4:
                refused = tuple(make(m.Coordinator, key=key, **refusal) for key in body.coordinator_keys)
                return make(m.FindCoordinatorResponse, throttle_time=0, coordinators=refused)
            return make(m.FindCoordinatorResponse, throttle_time=0, **refusal)
        if request.api_version >= 4:
            coordinators = tuple(
                make(m.Coordinator, key=key, error_code=ErrorCode.none, error_message=None, **where(key))
                for key in body.coordinator_keys
            )
            return make(m.FindCoordinatorResponse, throttle_time=0, coordinators=coordinators)
        # key_type 1 (a transactional id) is placed as a group id is (rendezvous)
        return make(
            m.FindCoordinatorResponse,
            throttle_time=0,
            error_code=ErrorCode.none,
            error_message=None,
            **where(body.key),
        )

    async def join_group(self, request: Request) -> Any:
        m = request.response_module
        body = request.body
        session_ms = int(body.session_timeout.total_seconds() * 1000)
        rebalance = getattr(body, "rebalance_timeout", None)
        rebalance_ms = session_ms if rebalance is None else int(rebalance.total_seconds() * 1000)

        def refused(code: ErrorCode) -> Any:
            return make(
                m.JoinGroupResponse,
                throttle_time=0,
                error_code=code,
                generation_id=-1,
                protocol_type=None,
                protocol_name=None if request.api_version >= 7 else "",
                leader="",
                skip_assignment=False,
                member_id=body.member_id,
                members=(),
            )

        if not self.cluster.coordinates(body.group_id):  # the client asks FindCoordinator again
            return refused(ErrorCode.not_coordinator)
        loaded = await self.groups.load(body.group_id)
        if loaded != ErrorCode.none:
            return refused(loaded)
        result = await self.groups.join(
            body.group_id,
            body.member_id,
            request.client_id or "",
            session_ms,
            rebalance_ms,
            body.protocol_type,
            [(p.name, bytes(p.metadata)) for p in body.protocols],
            request.client_host,
            getattr(body, "group_instance_id", None),  # v5+
        )
        instances = self.groups.instance_ids(body.group_id) if result.members else {}
        members = tuple(
            make(
                m.JoinGroupResponseMember, member_id=mid, group_instance_id=instances.get(mid), metadata=meta
            )
            for mid, meta in result.members
        )
        return make(
            m.JoinGroupResponse,
            throttle_time=0,
            error_code=result.error,
            generation_id=result.generation,
            protocol_type=result.protocol_type,
            protocol_name=result.protocol_name if request.api_version >= 7 else (result.protocol_name or ""),
            leader=result.leader,
            skip_assignment=False,
            member_id=result.member_id,
            members=members,
        )

    async def sync_group(self, request: Request) -> Any:
        m = request.response_module
        body = request.body
        if not self.cluster.coordinates(body.group_id):
            return make(
                m.SyncGroupResponse,
                throttle_time=0,
                error_code=ErrorCode.not_coordinator,
                protocol_type=None,
                protocol_name=None,
                assignment=b"",
            )
        loaded = await self.groups.load(body.group_id)
        if loaded != ErrorCode.none:
            return make(
                m.SyncGroupResponse,
                throttle_time=0,
                error_code=loaded,
                protocol_type=None,
                protocol_name=None,
                assignment=b"",
            )
        error, assignment, protocol_type, protocol_name = await self.groups.sync(
            body.group_id,
            body.member_id,
            body.generation_id,
            [(a.member_id, bytes(a.assignment)) for a in body.assignments],
            getattr(body, "group_instance_id", None),  # v3+
        )
        return make(
            m.SyncGroupResponse,
            throttle_time=0,
            error_code=error,
            protocol_type=protocol_type,
            protocol_name=protocol_name,
            assignment=assignment,
        )

    async def heartbeat(self, request: Request) -> Any:
        body = request.body
        if not self.cluster.coordinates(body.group_id):
            error = ErrorCode.not_coordinator
        elif (error := await self.groups.load(body.group_id)) == ErrorCode.none:
            error = self.groups.heartbeat(
                body.group_id, body.member_id, body.generation_id, getattr(body, "group_instance_id", None)
            )
        return make(request.response_module.HeartbeatResponse, throttle_time=0, error_code=error)

    async def leave_group(self, request: Request) -> Any:
        m = request.response_module
        body = request.body
        if request.api_version >= 3:
            ids = [member.member_id for member in body.members]
            instances = [member.group_instance_id for member in body.members]
        else:
            ids, instances = [body.member_id], [None]
        loaded = await self.groups.load(body.group_id)
        results: dict[str, ErrorCode] = dict.fromkeys(ids, loaded)
        if loaded == ErrorCode.none:
            results = self.groups.leave(body.group_id, ids, instances)
        given = dict(zip(ids, instances, strict=True))
        top = ErrorCode.none
        if request.api_version < 3:
            top = results[body.member_id]
        members = (
            tuple(
                make(m.MemberResponse, member_id=mid, group_instance_id=given.get(mid), error_code=code)
                for mid, code in results.items()
            )
            if request.api_version >= 3
            else ()
        )
        return make(m.LeaveGroupResponse, throttle_time=0, error_code=top, members=members)

    async def list_groups(self, request: Request) -> Any:
        m = request.response_module
        states = {s.lower() for s in getattr(request.body, "states_filter", ())}
        types = {t.lower() for t in getattr(request.body, "types_filter", ())}
        listed = []
        if not types or CLASSIC_GROUP_TYPE in types:
            try:
                summaries = await self.groups.summaries(self.cluster.coordinates)
            except LevelZeroError as exc:
                code = coordinator_unavailable("ListGroups", exc)
                return make(m.ListGroupsResponse, throttle_time=0, error_code=code, groups=())
            for group in summaries:
                if states and group.state.lower() not in states:
                    continue
                if not self.cluster.coordinates(group.group_id):
                    continue
                listed.append(
                    make(
                        m.ListedGroup,
                        group_id=group.group_id,
                        protocol_type=group.protocol_type,
                        group_state=group.state,
                        group_type=CLASSIC_GROUP_TYPE,
                    )
                )
        return make(m.ListGroupsResponse, throttle_time=0, error_code=ErrorCode.none, groups=tuple(listed))

    async def describe_groups(self, request: Request) -> Any:
        m = request.response_module
        described = []
        for group_id in request.body.groups:
            error, message = ErrorCode.none, None
            summary = None
            if not self.cluster.coordinates(group_id):
                error = ErrorCode.not_coordinator
            elif not group_id or len(group_id) > GROUP_ID_CHARS_MAX:
                error = ErrorCode.invalid_group_id
            elif (error := await self.groups.load(group_id)) == ErrorCode.none:
                try:
                    summary = await self.groups.summary(group_id)
                except LevelZeroError as exc:
                    error = coordinator_unavailable(f"DescribeGroups of {group_id}", exc)
                # KIP-1043 (v6): a group not found is an error; before, Dead with none
                if summary is None and error == ErrorCode.none and request.api_version >= 6:
                    error, message = ErrorCode.group_id_not_found, f"Group {group_id} not found."
            members = ()
            if summary is not None:
                members = tuple(
                    make(
                        m.DescribedGroupMember,
                        member_id=member.member_id,
                        group_instance_id=member.instance_id,
                        client_id=member.client_id,
                        client_host=member.client_host,
                        member_metadata=member.metadata,
                        member_assignment=member.assignment,
                    )
                    for member in summary.members
                )
            if summary is None:  # Kafka's dead group (no members, no committed offsets), or an error
                state = "Dead" if error in (ErrorCode.none, ErrorCode.group_id_not_found) else ""
                summary = GroupSummary(group_id, state, "", "", ())
            described.append(
                make(
                    m.DescribedGroup,
                    error_code=error,
                    error_message=message,
                    group_id=group_id,
                    group_state=summary.state,
                    protocol_type=summary.protocol_type,
                    protocol_data=summary.protocol_name,
                    members=members,
                    authorized_operations=authorized_operations(
                        "group",
                        request.api_version >= 3
                        and getattr(request.body, "include_authorized_operations", False),
                    ),
                )
            )
        return make(m.DescribeGroupsResponse, throttle_time=0, groups=tuple(described))

    async def delete_groups(self, request: Request) -> Any:
        m = request.response_module
        results = []
        for group_id in request.body.groups_names:
            if not self.cluster.coordinates(group_id):
                error = ErrorCode.not_coordinator
            elif (error := await self.groups.load(group_id)) == ErrorCode.none:
                try:
                    error = await self.groups.delete_group(group_id)
                except LevelZeroError as exc:
                    error = coordinator_unavailable(f"DeleteGroups of {group_id}", exc)
            results.append(make(m.DeletableGroupResult, group_id=group_id, error_code=error))
        return make(m.DeleteGroupsResponse, throttle_time=0, results=tuple(results))

    async def offset_delete(self, request: Request, known: dict[str, int]) -> Any:
        """OffsetDelete; `known`: topic -> partition count (an unknown partition is answered
        UNKNOWN_TOPIC_OR_PARTITION, as Kafka's handler does before asking the coordinator)."""
        m = request.response_module
        body = request.body
        asked = [(t.name, p.partition_index) for t in body.topics for p in t.partitions]
        if not self.cluster.coordinates(body.group_id):
            return make(
                m.OffsetDeleteResponse, error_code=ErrorCode.not_coordinator, throttle_time=0, topics=()
            )
        valid = [(t, p) for t, p in asked if 0 <= p < known.get(t, 0)]
        error = await self.groups.load(body.group_id)
        codes: dict[tuple[str, int], ErrorCode] = {}
        if error == ErrorCode.none:
            try:
                error, codes = await self.groups.delete_offsets(body.group_id, valid)
            except LevelZeroError as exc:
                error = coordinator_unavailable(f"OffsetDelete for group {body.group_id}", exc)
        if error != ErrorCode.none:
            return make(m.OffsetDeleteResponse, error_code=error, throttle_time=0, topics=())
        by_topic: dict[str, list[Any]] = {}
        for tp in asked:
            code = codes.get(tp, ErrorCode.unknown_topic_or_partition)
            by_topic.setdefault(tp[0], []).append(
                make(m.OffsetDeleteResponsePartition, partition_index=tp[1], error_code=code)
            )
        topics = tuple(
            make(m.OffsetDeleteResponseTopic, name=name, partitions=tuple(parts))
            for name, parts in by_topic.items()
        )
        return make(m.OffsetDeleteResponse, error_code=ErrorCode.none, throttle_time=0, topics=topics)
