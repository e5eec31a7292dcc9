"""FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup: answered by the group
coordinator (`groups.py`) on the node that coordinates the group, NOT_COORDINATOR elsewhere."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from levelzero.kafka.groups import GroupCoordinator
from levelzero.kafka.metadata import Cluster
from levelzero.kafka.protocol import Request, make


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

        if request.api_version >= 4:
            coordinators = tuple(
                make(m.Coordinator, key=key, error_code=ErrorCode.none, error_message=None, **where(key))
                for key in body.coordinator_keys
            )
            return make(m.FindCoordinatorResponse, throttle_time=0, coordinators=coordinators)
        if getattr(body, "key_type", 0) != 0:  # 1: a transaction coordinator
            return make(
                m.FindCoordinatorResponse,
                throttle_time=0,
                error_code=ErrorCode.coordinator_not_available,
                error_message="transactions are not supported",
                node_id=-1,
                host="",
                port=-1,
            )
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
        if not self.cluster.coordinates(body.group_id):  # the client asks FindCoordinator again
            return make(
                m.JoinGroupResponse,
                throttle_time=0,
                error_code=ErrorCode.not_coordinator,
                generation_id=-1,
                protocol_type=None,
                protocol_name=None if request.api_version >= 7 else "",
                leader="",
                skip_assignment=False,
                member_id=body.member_id,
                members=(),
            )
        result = await self.groups.join(
            body.group_id,
            body.member_id,
            request.client_id or "",
            session_ms,
            rebalance_ms,
            body.protocol_type,
            [(p.name, bytes(p.metadata)) for p in body.protocols],
        )
        members = tuple(
            make(m.JoinGroupResponseMember, member_id=mid, group_instance_id=None, metadata=meta)
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
        error, assignment, protocol_type, protocol_name = await self.groups.sync(
            body.group_id,
            body.member_id,
            body.generation_id,
            [(a.member_id, bytes(a.assignment)) for a in body.assignments],
        )
        return make(
            m.SyncGroupResponse,
            throttle_time=0,
            error_code=error,
            protocol_type=protocol_type,
            protocol_name=protocol_name,
            assignment=assignment,
        )

    def heartbeat(self, request: Request) -> Any:
        body = request.body
        if not self.cluster.coordinates(body.group_id):
            error = ErrorCode.not_coordinator
        else:
            error = self.groups.heartbeat(body.group_id, body.member_id, body.generation_id)
        return make(request.response_module.HeartbeatResponse, throttle_time=0, error_code=error)

    def leave_group(self, request: Request) -> Any:
        m = request.response_module
        body = request.body
        ids = [member.member_id for member in body.members] if request.api_version >= 3 else [body.member_id]
        results = self.groups.leave(body.group_id, ids)
        top = ErrorCode.none
        if request.api_version < 3:
            top = results[body.member_id]
        members = (
            tuple(
                make(m.MemberResponse, member_id=mid, group_instance_id=None, error_code=code)
                for mid, code in results.items()
            )
            if request.api_version >= 3
            else ()
        )
        return make(m.LeaveGroupResponse, throttle_time=0, error_code=top, members=members)
