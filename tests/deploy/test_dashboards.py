"""The shipped Grafana dashboard and Prometheus alert rules use only metrics a running daemon
exports: a renamed or removed metric fails here, not silently on an operator's wall."""

from __future__ import annotations

import json
import re
from pathlib import Path

import anyio
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from daemon_support import daemon_and_client
from prometheus_client.parser import text_string_to_metric_families

DEPLOY = Path(__file__).resolve().parents[2] / "levelzero" / "deploy"
# Series Prometheus makes itself (not exported by the daemon).
PROMETHEUS_OWN = {"up"}
# Series only a cluster node exports (tests/cluster/test_cluster_leases.py reads them there).
CLUSTER_ONLY = {"levelzero_cluster_nodes", "levelzero_cluster_partitions_without_leader"}
METRIC_NAME = re.compile(r"\b((?:levelzero|process|python)_[a-z0-9_]+|up)\b(?!\s*\()")


def alert_rules() -> list[dict]:
    groups = yaml.safe_load((DEPLOY / "prometheus-alerts.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return exprs


def referenced(exprs: list[str]) -> set[str]:
    return {name for expr in exprs for name in METRIC_NAME.findall(expr)}


def test_files_cover_what_an_operator_must_watch() -> None:
    alerts = {rule["alert"]: rule for rule in alert_rules()}
    for name in (
        "LevelZeroDown",
        "LevelZeroNotReady",
        "LevelZeroRestarting",
        "LevelZeroGcEpochLagHigh",
        "LevelZeroPartitionHoldingM",
        "LevelZeroReconcilerLagHigh",
        "LevelZeroReconcileFailing",
        "LevelZeroGcRoundsFailing",
        "LevelZeroObjectStoreErrors",
        "LevelZeroLogStoreErrors",
        "LevelZeroProduceLatencyHigh",
        "LevelZeroDataDirFilling",
    ):
        assert name in alerts, name
        assert alerts[name]["annotations"]["description"].strip(), name  # the threshold explained
    exprs = dashboard_exprs()
    assert len(exprs) >= 20
    for metric in (
        "levelzero_gc_epoch_lag",
        "levelzero_reconciler_lag_offsets",
        "levelzero_partition_mp",
        "levelzero_gc_failed_rounds_total",
        "levelzero_produce_latency_seconds_bucket",
        "levelzero_kafka_requests_total",
        "levelzero_kafka_request_errors_total",
        "levelzero_object_store_request_duration_seconds_bucket",
        "levelzero_ready",
    ):
        assert metric in referenced(exprs), metric


def kafka_produce_and_refused_create(port: int, topic: str) -> None:
    """A Kafka produce, and a CreateTopics answered TOPIC_ALREADY_EXISTS (an error code)."""
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}"})
    producer.produce(topic, b"over kafka", partition=1)
    assert producer.flush(20) == 0
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    refused = admin.create_topics([NewTopic(topic, 1, 1)])[topic].exception(20)
    assert refused is not None and "TOPIC_ALREADY_EXISTS" in str(refused), refused


async def test_every_metric_they_reference_is_in_a_running_daemons_metrics(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, gc__grace_s=0.0, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("t", 2)
        await client.produce("t", 0, [(None, b"a"), (b"k", b"b")])
        await anyio.to_thread.run_sync(kafka_produce_and_refused_create, daemon.kafka_port, "t")
        await client.fetch("t", 0, 0, None)
        await client.advance_epoch()
        assert (await client._http.post("/v1/housekeeper/run", json={"force": True})).status_code == 200
        await client.gc_run(dry_run=False)  # the GC's per-round gauges appear after a round
        response = await client._http.get("/metrics")
    assert response.status_code == 200
    exported = {
        sample.name for family in text_string_to_metric_families(response.text) for sample in family.samples
    }
    wanted = referenced(dashboard_exprs()) | referenced([rule["expr"] for rule in alert_rules()])
    assert len(wanted) >= 30
    missing = sorted(wanted - exported - PROMETHEUS_OWN - CLUSTER_ONLY)
    assert missing == [], missing
