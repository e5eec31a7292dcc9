"""The shipped Grafana dashboard and Prometheus alert rules use only what a running daemon
exports: a renamed or removed metric, a label it does not carry, a rate() over a gauge fails
here, not silently on an operator's wall."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import yaml
from daemon_support import scrape_of_a_working_daemon
from prometheus_client.parser import text_string_to_metric_families

from levelzero.config import load_config
from levelzero.daemon.metrics import LATENCY_BUCKETS_S

DEPLOY = Path(__file__).resolve().parents[2] / "levelzero" / "deploy"
# Series Prometheus makes itself (not exported by the daemon).
PROMETHEUS_OWN = {"up"}
# Labels Prometheus adds to every scraped series (the scrape has none of them).
TARGET_LABELS = {"job", "instance"}
# Series only a cluster node exports (tests/cluster/test_cluster_leases.py reads them there),
# with their labels.
CLUSTER_ONLY = {"levelzero_cluster_nodes": {"state"}, "levelzero_cluster_partitions_without_leader": set()}
METRIC_NAME = re.compile(r"\b((?:levelzero|process|python)_[a-z0-9_]+|up)\b(?!\s*\()")
SELECTOR = re.compile(r"\b((?:levelzero|process|python)_[a-z0-9_]+|up)\s*\{([^}]*)\}")
MATCHER_LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"")
GROUPING = re.compile(r"\b(by|without)\s*\(([^)]*)\)\s*\(")
JOINING = re.compile(r"\b(on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
COUNTER_FUNCTION = re.compile(r"\b(rate|irate|increase|resets)\s*\(")


def alert_rules() -> list[dict]:
    groups = yaml.safe_load((DEPLOY / "prometheus-alerts.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def all_panels(panels: list[dict]) -> Iterator[dict]:
    """Every panel, those inside rows included (a collapsed row keeps its panels there)."""
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def dashboard() -> dict:
    return json.loads((DEPLOY / "grafana-dashboard.json").read_text())


def dashboard_exprs() -> list[str]:
    board = dashboard()
    exprs = [t["expr"] for panel in all_panels(board["panels"]) for t in panel.get("targets", [])]
    exprs += [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return exprs


def all_exprs() -> list[str]:
    return dashboard_exprs() + [rule["expr"] for rule in alert_rules()]


def referenced(exprs: list[str]) -> set[str]:
    return {name for expr in exprs for name in METRIC_NAME.findall(expr)}


def closing(expr: str, opening: int) -> int:
    """The index of the parenthesis closing the one at `opening`."""
    depth = 0
    for i in range(opening, len(expr)):
        depth += {"(": 1, ")": -1}.get(expr[i], 0)
        if depth == 0:
            return i
    raise AssertionError(f"unbalanced parentheses in {expr!r}")


def label_names(labels: str) -> set[str]:
    return {name.strip() for name in labels.split(",") if name.strip()}


class Scrape:
    """Each exported sample name with the label names its samples carry and its family's type."""

    def __init__(self, text: str) -> None:
        self.labels: dict[str, set[str]] = {}
        self.kind: dict[str, str] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self.labels.setdefault(sample.name, set()).update(sample.labels)
                self.kind[sample.name] = family.type
        for name, labels in CLUSTER_ONLY.items():
            self.labels.setdefault(name, set(labels))
            self.kind.setdefault(name, "gauge")

    def labels_of(self, metric: str) -> set[str]:
        return self.labels.get(metric, set()) | TARGET_LABELS

    def is_counted(self, metric: str) -> bool:
        """A counter's samples, or a histogram's buckets, count and sum: what rate() is for."""
        kind = self.kind.get(metric)
        return kind == "counter" or (kind == "histogram" and metric.endswith(("_bucket", "_count", "_sum")))


def label_problems(expr: str, scrape: Scrape) -> list[str]:
    problems = []
    for metric, matchers in SELECTOR.findall(expr):
        if metric in PROMETHEUS_OWN:
            continue
        for label in set(MATCHER_LABEL.findall(matchers)) - scrape.labels_of(metric):
            problems.append(f"{metric} has no label {label!r}")
    for match in GROUPING.finditer(expr):
        argument = expr[match.end() - 1 : closing(expr, match.end() - 1) + 1]
        for metric in set(METRIC_NAME.findall(argument)) - PROMETHEUS_OWN:
            for label in label_names(match.group(2)) - scrape.labels_of(metric):
                problems.append(f"{match.group(1)} ({label}) over {metric}, which has no such label")
    for match in JOINING.finditer(expr):
        for metric in set(METRIC_NAME.findall(expr)) - PROMETHEUS_OWN:
            for label in label_names(match.group(2)) - scrape.labels_of(metric):
                problems.append(f"{match.group(1)}({label}) joins {metric}, which has no such label")
    return problems


def counter_function_problems(expr: str, scrape: Scrape) -> list[str]:
    problems = []
    for match in COUNTER_FUNCTION.finditer(expr):
        argument = expr[match.end() - 1 : closing(expr, match.end() - 1) + 1]
        for metric in set(METRIC_NAME.findall(argument)) - PROMETHEUS_OWN:
            if not scrape.is_counted(metric):
                problems.append(f"{match.group(1)}() of {metric}, a {scrape.kind.get(metric)}")
    return problems


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
        "LevelZeroObjectsMissing",
        "LevelZeroHttpServerErrors",
        "LevelZeroL1DeletesPending",
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
        "levelzero_reconciler_failing_partitions",
        "levelzero_partition_mp",
        "levelzero_gc_failed_rounds_total",
        "levelzero_l1_deletes_pending",
        "levelzero_storage_healthy",
        "levelzero_object_store_errors_total",
        "levelzero_produce_latency_seconds_bucket",
        "levelzero_kafka_requests_total",
        "levelzero_kafka_request_errors_total",
        "levelzero_object_store_request_duration_seconds_bucket",
        "levelzero_ready",
    ):
        assert metric in referenced(exprs), metric


def test_acknowledged_data_that_cannot_be_read_pages() -> None:
    """After a bucket lost its objects, reads answered 500 object_not_found and nothing fired:
    the object-store alert looks only at storage_error, and nothing at the 5xx answers."""
    alerts = {rule["alert"]: rule for rule in alert_rules()}
    missing = alerts["LevelZeroObjectsMissing"]
    # Reads that failed, not every store-level miss: a read racing a delete is served anyway.
    assert missing["expr"].strip() == "increase(levelzero_reads_objects_missing_total[5m]) > 0"
    assert missing["labels"]["severity"] == "critical"
    server_errors = alerts["LevelZeroHttpServerErrors"]
    assert 'levelzero_http_requests_total{code=~"5.."' in server_errors["expr"]
    assert server_errors["for"]
    pending = alerts["LevelZeroL1DeletesPending"]
    assert pending["expr"].strip() == "levelzero_l1_deletes_pending > 0"
    # Retries back off up to reconciler.delete_retry_max_s: a transient failure's delete is
    # retried several times before the alert could fire.
    retry_max_s = load_config(None, environ={}).reconciler.delete_retry_max_s
    assert duration_s(pending["for"]) >= 5 * retry_max_s


def duration_s(text: str) -> float:
    value, unit = re.fullmatch(r"([0-9]+)([smhd])", text).groups()  # type: ignore[union-attr]
    return int(value) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]


def series_kind(expr: str) -> tuple[str, ...]:
    """What a query's values are, as far as its unit goes: a rate, an increase over a range, a
    quantile, a count of changes, or the value of a gauge."""
    kinds = re.findall(r"\b(rate|irate|histogram_quantile|changes)\s*\(", expr)
    kinds += [f"increase[{r}]" for r in re.findall(r"\bincrease\s*\(.*?\[([0-9]+[smhd])\]", expr)]
    return tuple(sorted(set(kinds))) or ("gauge",)


def test_each_panel_shows_series_of_one_kind() -> None:
    """A panel's series share its axis and unit: a rate next to a 15-minute count, an object
    count and a 0/1 flag (the old "GC deletions and failures") reads as none of them."""
    mixed = {}
    for panel in all_panels(dashboard()["panels"]):
        kinds = {series_kind(target["expr"]) for target in panel.get("targets", [])}
        if len(kinds) > 1:
            mixed[panel["title"]] = sorted(kinds)
    assert mixed == {}


def test_panels_inside_collapsed_rows_are_read() -> None:
    board = {
        "panels": [
            {"type": "row", "collapsed": True, "panels": [{"targets": [{"expr": "levelzero_hidden"}]}]},
        ]
    }
    assert [t["expr"] for p in all_panels(board["panels"]) for t in p.get("targets", [])] == [
        "levelzero_hidden"
    ]


async def test_every_metric_label_and_function_they_use_fits_a_running_daemons_metrics(
    tmp_path: Path,
) -> None:
    scrape = Scrape(await scrape_of_a_working_daemon(tmp_path))
    exprs = all_exprs()
    wanted = referenced(exprs)
    assert len(wanted) >= 30
    missing = sorted(wanted - set(scrape.labels) - PROMETHEUS_OWN)
    assert missing == [], missing
    assert [p for expr in exprs for p in label_problems(expr, scrape)] == []
    assert [p for expr in exprs for p in counter_function_problems(expr, scrape)] == []


async def test_the_checks_catch_a_wrong_label_and_a_rate_of_a_gauge(tmp_path: Path) -> None:
    scrape = Scrape(await scrape_of_a_working_daemon(tmp_path))
    assert label_problems('levelzero_storage_healthy{job="x", stor="log_store"}', scrape) == [
        "levelzero_storage_healthy has no label 'stor'"
    ]
    assert label_problems("sum by (operation) (rate(levelzero_http_requests_total[5m]))", scrape) == [
        "by (operation) over levelzero_http_requests_total, which has no such label"
    ]
    assert (
        label_problems("sum by (instance, le) (rate(levelzero_produce_latency_seconds_bucket[5m]))", scrape)
        == []
    )
    assert counter_function_problems("rate(levelzero_l1_deletes_pending[5m])", scrape) == [
        "rate() of levelzero_l1_deletes_pending, a gauge"
    ]
    assert counter_function_problems("increase(levelzero_gc_failed_rounds_total[15m])", scrape) == []


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
