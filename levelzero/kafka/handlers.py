"""The Kafka APIs by key, each answered by the module of its job: metadata (and the brokers),
admin (CreateTopics, auto-creation), configs (DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs), produce (through the produce intake both front ends share), fetch,
offsets (ListOffsets, the groups' committed offsets) and the consumer groups. Each translates
between a kio request and the operations of the node and the intake, so HTTP and Kafka clients
see the same partitions, records, size rule and errors.

Operating errors (`LevelZeroError`) become Kafka error codes per partition or per topic
(`errors.error_code_for`); a stale cluster epoch never reaches a client (the batcher retries it
inside). Records keep their keys, values, timestamps and headers (L0/L1 format 2); a null value
is stored as an empty one.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import anyio
import anyio.abc

from levelzero.actors.intake import ProduceIntake, ProduceObserver, unobserved
from levelzero.actors.node import Node
from levelzero.core.errors import LevelZeroError
from levelzero.kafka.admin import AdminApi, TopicLifecycleApi
from levelzero.kafka.cluster_admin import ClusterAdminApi
from levelzero.kafka.configs import ConfigsApi
from levelzero.kafka.fetch import FetchApi
from levelzero.kafka.group_api import GroupApi
from levelzero.kafka.groups import GroupCoordinator
from levelzero.kafka.metadata import Cluster, KafkaSettings, MetadataApi
from levelzero.kafka.offsets import OffsetsApi
from levelzero.kafka.produce import ProduceApi
from levelzero.kafka.protocol import Request, api_versions_response
from levelzero.kafka.transactions import TransactionCoordinator
from levelzero.kafka.txn_admin import TransactionAdminApi

log = logging.getLogger(__name__)

# Test use only: with this set to 1 retention and DeleteRecords move a start offset past open
# transactions' first offsets (as before they were held there), leaving partitions as a restart
# may find them in a store written then.
UNHELD_START_OFFSET_ENV = "LEVELZERO_TEST_UNHELD_START_OFFSET"


class Handlers:
    def __init__(
        self,
        node: Node,
        settings: KafkaSettings,
        intake: ProduceIntake | None = None,
        produce_observer: ProduceObserver = unobserved,
    ) -> None:
        self.node = node
        self.settings = settings
        self.intake = ProduceIntake(node) if intake is None else intake
        cluster = self.cluster = Cluster(node, settings)
        self.groups = GroupCoordinator(node.log_store, placement=cluster.placement)
        self.admin = AdminApi(node, settings, cluster)
        auto_create = self.admin.auto_create if settings.auto_create_topics else None
        self.metadata = MetadataApi(node, cluster, auto_create)
        self.configs = ConfigsApi(node, cluster, settings)
        self.transactions = TransactionCoordinator(
            self.intake, self.groups, cluster, id_expiration_s=settings.transactional_id_expiration_s
        )
        # retention and DeleteRecords never pass an open transaction's first offset
        if os.environ.get(UNHELD_START_OFFSET_ENV) == "1":
            log.warning(
                "%s is set: start offsets pass open transactions (test use only)", UNHELD_START_OFFSET_ENV
            )
        else:
            node.housekeeper.open_transactions = self.transactions.index.oldest_open
        # A deleted topic's transaction ranges go (however it was deleted: HTTP or Kafka), and
        # a partition's once handed over: a topic made again under its name, a partition back
        # from another leader, load theirs from the store.
        node.topic_deleted.append(self.transactions.index.forget)
        node.partition_left.append(self.transactions.index.forget_partition)
        self.producing = ProduceApi(self.intake, auto_create, self.transactions, produce_observer)
        self.topic_lifecycle = TopicLifecycleApi(node, cluster)
        self.cluster_admin = ClusterAdminApi(node, cluster)
        self.fetching = FetchApi(node, self.intake, self.transactions.index)
        self.offsets = OffsetsApi(
            node,
            self.intake,
            self.groups,
            cluster,
            self.transactions.index,
            self.transactions.wait_offsets_stable,
            self.transactions.pending_offsets,
        )
        self.group_api = GroupApi(self.groups, cluster)
        self.txn_admin = TransactionAdminApi(node, self.transactions)

    async def run(self, *, task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        """The intake's lanes (their drain tasks) and the transaction coordinator's timeouts;
        runs until cancelled."""
        async with anyio.create_task_group() as tg:
            if not self.intake.running:  # the daemon runs the intake both front ends share
                await tg.start(self.intake.run)
            tg.start_soon(self.transactions.run)
            tg.start_soon(self._offsets_retention)
            self.groups.spawn = tg.start_soon  # stores a group gone empty
            task_status.started()

    async def _offsets_retention(self) -> None:
        """A pass of offsets retention (`GroupCoordinator.expire_offsets`) every check interval;
        a pass the store fails is logged and tried again at the next."""
        while True:
            await anyio.sleep(self.settings.offsets_retention_check_s)
            try:
                await self.groups.expire_offsets(self.settings.offsets_retention_s, self.cluster.coordinates)
            except LevelZeroError as exc:
                log.warning("offsets retention: the pass failed: %s: %s", exc.code, exc)
            except Exception:  # a bug (a record that does not decode): logged, the daemon serves on
                log.exception("BUG: offsets retention: the pass failed")

    async def handle(
        self, request: Request, after: anyio.Event | None = None, submitted: anyio.Event | None = None
    ) -> Any | None:
        """The response for `request` (None: the client expects none, acks=0). `after` and
        `submitted` order a connection's produce requests (see `ProduceApi.produce`)."""
        match request.api_key:
            case 18:
                return api_versions_response(request.api_version)
            case 3:
                return await self.metadata.metadata(request)
            case 19:
                return await self.admin.create_topics(request)
            case 0:
                return await self.producing.produce(request, after, submitted)
            case 1:
                return await self.fetching.fetch(request)
            case 2:
                return await self.offsets.list_offsets(request)
            case 22:
                if request.body.transactional_id is not None:
                    return await self.transactions.init_producer_id(request)
                return self.producing.init_producer_id(request)
            case 24:
                return await self.transactions.add_partitions(request)
            case 25:
                return await self.transactions.add_offsets(request)
            case 26:
                return await self.transactions.end_txn(request)
            case 28:
                return await self.transactions.txn_offset_commit(request)
            case 10:
                return self.group_api.find_coordinator(request)
            case 11:
                return await self.group_api.join_group(request)
            case 14:
                return await self.group_api.sync_group(request)
            case 12:
                return await self.group_api.heartbeat(request)
            case 13:
                return await self.group_api.leave_group(request)
            case 8:
                return await self.offsets.offset_commit(request)
            case 9:
                return await self.offsets.offset_fetch(request)
            case 15:
                return await self.group_api.describe_groups(request)
            case 16:
                return await self.group_api.list_groups(request)
            case 23:
                return self.offsets.offset_for_leader_epoch(request)
            case 42:
                return await self.group_api.delete_groups(request)
            case 47:
                return await self.group_api.offset_delete(request, self.node.topics())
            case 60:
                return self.metadata.describe_cluster(request)
            case 61:
                return await self.txn_admin.describe_producers(request)
            case 65:
                return await self.txn_admin.describe_transactions(request)
            case 66:
                return await self.txn_admin.list_transactions(request)
            case 32:
                return await self.configs.describe_configs(request)
            case 33:
                return await self.configs.alter_configs(request)
            case 44:
                return await self.configs.incremental_alter_configs(request)
            case 20:
                return await self.topic_lifecycle.delete_topics(request)
            case 21:
                return await self.topic_lifecycle.delete_records(request)
            case 37:
                return await self.topic_lifecycle.create_partitions(request)
            case 43:
                return self.cluster_admin.elect_leaders(request)
            case 45:
                return self.cluster_admin.alter_partition_reassignments(request)
            case 46:
                return self.cluster_admin.list_partition_reassignments(request)
            case 74:
                return self.cluster_admin.list_config_resources(request)
            case 75:
                return self.cluster_admin.describe_topic_partitions(request)
            case 34:
                return self.cluster_admin.alter_replica_log_dirs(request)
            case 35:
                return await self.cluster_admin.describe_log_dirs(request)
        raise AssertionError(f"no handler for api key {request.api_key}")  # protocol checked it
