"""The shipped Grafana dashboard and Prometheus alert rules use only metrics a running daemon
exports: a renamed or removed metric fails here, not silently on an operator's wall."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from daemon_support import daemon_and_client
from prometheus_client.parser import text_string_to_metric_families

from levelzero.config import load_config
from levelzero.daemon.metrics import LATENCY_BUCKETS_S

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
        "levelzero_object_store_request_duration_seconds_bucket",
        "levelzero_ready",
    ):
        assert metric in referenced(exprs), metric


async def test_every_metric_they_reference_is_in_a_running_daemons_metrics(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, gc__grace_s=0.0) as (daemon, client):
        await client.create_topic("t", 2)
        await client.produce("t", 0, [(None, b"a"), (b"k", b"b")])
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


def test_produce_latency_buckets_resolve_the_linger_window_and_the_alert_threshold() -> None:
    """A quantile is interpolated inside its bucket: the alert's threshold must be a boundary
    (or a p99 of 1.3 s in a 1-2.5 s bucket can read as above 2 s), and the batcher's linger,
    which every produce waits, needs boundaries just above it."""
    (rule,) = [r for r in alert_rules() if r["alert"] == "LevelZeroProduceLatencyHigh"]
    threshold = re.fullmatch(r"histogram_quantile\(.*\)\s*>\s*([0-9.]+)", rule["expr"].strip())
    assert threshold is not None, rule["expr"]
    assert float(threshold.group(1)) in LATENCY_BUCKETS_S
    linger_s = load_config(None, environ={}).batcher.linger_ms / 1000
    assert linger_s in LATENCY_BUCKETS_S
    above_linger = [b for b in LATENCY_BUCKETS_S if linger_s < b <= 1.0]
    assert len(above_linger) >= 4, above_linger
    assert list(LATENCY_BUCKETS_S) == sorted(set(LATENCY_BUCKETS_S))
