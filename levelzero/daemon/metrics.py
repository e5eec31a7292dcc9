"""Prometheus metrics of one daemon, in a registry of its own (several daemons per test process).

Most values already live in the node (fence statistics, batcher counters, the epoch), so they are
read at scrape time by `NodeCollector` rather than mirrored into metric objects on every change.
Only what the node does not count is observed directly: HTTP requests (in the API), produce
latency (by both front ends, through `produce_observer`), and L0 object sizes (drained from
`node.batcher.stats.object_sizes` at each scrape). The Kafka listener keeps its own counters
(`kafka.metrics`), added as a source when it runs.

Each component has a source, a function `(node) -> Iterable[Metric]` in `DEFAULT_SOURCES`
(epochs, cluster, batcher, reconciler, housekeeper, GC); another one is passed in `sources` or added with
`collector.add_source`. Sources run at scrape time on the event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import os

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from levelzero.actors.intake import ProduceObserver
from levelzero.actors.node import Node
from levelzero.actors.partition import PartitionView
from levelzero.core.cluster import live_nodes

from levelzero.daemon.buildinfo import build_labels

Source = Callable[[Node], Iterable[Metric]]

# Produce latency: a produce waits for the batcher's linger (250 ms by default), then the L0
# upload and the log commit, so most fall between 0.25 and 1 s; 2 s is the p99 the shipped
# alert (LevelZeroProduceLatencyHigh) fires at, a boundary here so its quantile is not a guess
# interpolated across a wide bucket.
LATENCY_BUCKETS_S = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
OBJECT_SIZE_BUCKETS = tuple(float(1 << n) for n in range(10, 27, 2))  # 1 KiB .. 64 MiB
OBJECT_SIZES_DRAIN_MAX = 100_000


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def epoch_metrics(node: Node) -> Iterable[Metric]:
    yield _gauge("levelzero_cluster_epoch", "The cluster epoch.", node.epochs.current)
    cached = node.epoch_cache.cached
    if cached is not None:
        yield _gauge("levelzero_epoch_cache_epoch", "This node's cached cluster epoch.", cached)
    yield _counter("levelzero_epoch_advances", "Cluster epoch advances by this node.", node.epochs.advances)
    yield _counter("levelzero_epoch_cache_refreshes", "Epoch cache refreshes.", node.epoch_cache.refreshes)
    yield _counter(
        "levelzero_epoch_cache_invalidations",
        "Epoch cache invalidations (a fence showed the cache was stale).",
        node.epoch_cache.invalidations,
    )
    reading = node.gc.watermark()
    if reading is None:  # a cluster node before its first read of the control plane
        return
    decision = reading.decision
    yield _gauge(
        "levelzero_gc_watermark_blocked",
        "1 when some partition has no M(p) yet, so M is undefined and the GC deletes nothing.",
        1 if decision.m is None else 0,
    )
    if decision.m is not None:
        yield _gauge(
            "levelzero_gc_watermark",
            "M: min over partitions of M(p), capped at cluster epoch - 1.",
            decision.m,
        )


def fence_metrics_of(views: Sequence[PartitionView], per_partition: bool) -> Iterable[Metric]:
    """The windowed-fencing probe: totals always, per-partition series when asked."""
    totals = {
        "window_slides": "Fence window slides (a newer epoch became the window's maximum).",
        "stale_rejections": "Writes rejected by the fence with StaleClusterEpoch.",
        "new_epoch_fences": "Writes admitted as a window's new maximum epoch.",
        "same_epoch_fences": "Writes admitted inside the current window.",
    }
    for field, doc in totals.items():
        yield _counter(f"levelzero_fence_{field}", doc, sum(getattr(v.fence, field) for v in views))
    yield _gauge(
        "levelzero_fence_read_units",
        "Writes holding a fence read unit.",
        sum(v.fence.read_units for v in views),
    )
    yield _gauge(
        "levelzero_fence_window_size_max",
        "Largest fence window (epochs) over partitions.",
        max((v.fence.window_size for v in views), default=0),
    )
    yield _gauge(
        "levelzero_fence_last_rejected_gap_max",
        "Largest gap (window minimum - epoch) of a partition's last rejection.",
        max((v.fence.last_rejected_gap for v in views), default=0),
    )
    yield _gauge("levelzero_partitions", "Partitions on this node.", len(views))
    if not per_partition:
        return
    labels = ["topic", "partition"]
    families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
        "window_size": GaugeMetricFamily(
            "levelzero_partition_fence_window_size", "Fence window size in epochs.", labels=labels
        ),
        "window_slides": CounterMetricFamily(
            "levelzero_partition_fence_window_slides", "Fence window slides.", labels=labels
        ),
        "stale_rejections": CounterMetricFamily(
            "levelzero_partition_fence_stale_rejections", "Stale-epoch rejections.", labels=labels
        ),
        "last_rejected_gap": GaugeMetricFamily(
            "levelzero_partition_fence_last_rejected_gap",
            "Window minimum - epoch of the last rejection.",
            labels=labels,
        ),
    }
    state_families = {
        "high_watermark": GaugeMetricFamily(
            "levelzero_partition_high_watermark", "Next data offset.", labels=labels
        ),
        "lro": GaugeMetricFamily("levelzero_partition_lro", "Last reconciled offset.", labels=labels),
        "mp": GaugeMetricFamily(
            "levelzero_partition_mp", "Published M(p) (absent until defined).", labels=labels
        ),
        "max_applied_epoch": GaugeMetricFamily(
            "levelzero_partition_max_applied_epoch", "Newest applied epoch.", labels=labels
        ),
        "reconciler_lag": GaugeMetricFamily(
            "levelzero_partition_reconciler_lag_offsets",
            "Offsets written but not yet reconciled.",
            labels=labels,
        ),
    }
    for v in views:
        label_values = [v.topic, str(v.partition)]
        for field, family in families.items():
            family.add_metric(label_values, getattr(v.fence, field))
        state_values = {
            "high_watermark": v.state.high_watermark,
            "lro": v.state.lro,
            "mp": v.published_mp,
            "max_applied_epoch": v.state.max_applied_epoch,
            "reconciler_lag": v.reconciler_lag,
        }
        for field, family in state_families.items():
            value = state_values[field]
            if value is not None:
                family.add_metric(label_values, value)
    yield from families.values()
    yield from state_families.values()


def batcher_metrics(node: Node) -> Iterable[Metric]:
    stats = node.batcher.stats
    counters = {
        "objects_uploaded": "L0 objects uploaded.",
        "bytes_uploaded": "Bytes of L0 objects uploaded.",
        "extents_appended": "Extents whose placeholder was appended.",
        "records_appended": "Records acknowledged through placeholders.",
        "stale_rejections": "Extents rejected by a partition fence (stale epoch).",
        "stale_retries": "Produce requests retried with a fresh epoch after a rejection.",
        "stale_failures": "Produce requests that failed after exhausting stale retries.",
        "orphan_objects": "L0 objects rejected by every partition (left to the GC).",
    }
    for field, doc in counters.items():
        yield _counter(f"levelzero_batcher_{field}", doc, getattr(stats, field))
    yield _gauge("levelzero_batcher_inflight_bytes", "Produce bytes in flight.", stats.inflight_bytes)
    yield _counter(
        "levelzero_appender_calls",
        "Log-store append calls of the node's appender.",
        node.appender.calls,
    )
    yield _counter(
        "levelzero_appender_batches",
        "Partitions' batches appended (a call carries every partition that had records).",
        node.appender.batches,
    )
    yield _counter("levelzero_reader_l0_reads", "Fetches served from L0.", node.reader.l0_reads)
    yield _counter("levelzero_reader_l1_reads", "Fetches served from L1.", node.reader.l1_reads)
    yield _counter(
        "levelzero_reads_objects_missing",
        "Reads (HTTP fetches, Kafka fetches and ListOffsets) that failed because an object they "
        "need is not in the object store: acknowledged records that cannot be read.",
        node.reads_objects_missing,
    )
    yield from l0_cache_metrics(node)


def l0_cache_metrics(node: Node) -> Iterable[Metric]:
    stats = node.l0_cache.statistics()
    counters = {
        "hits": "L0 extents read from an object the readers' cache held.",
        "shared": "L0 extents read from an object GET another read had in flight.",
        "loads": "GETs of whole L0 objects by the readers' cache.",
        "uncached_gets": "L0 extents read with a ranged GET of their own (cache off, full or thrashing).",
        "evictions": "L0 objects dropped from the readers' cache for room.",
        "released": "L0 objects dropped from the readers' cache once the GC's watermark passed their epoch.",
    }
    for name, doc in counters.items():
        yield _counter(f"levelzero_l0_cache_{name}", doc, getattr(stats, name))
    gauges = {
        "held_bytes": "Bytes of L0 objects the readers' cache holds.",
        "objects": "L0 objects the readers' cache holds.",
        "bytes_max": "The readers' cache bound (node.l0_cache_bytes_max).",
        "load_every": "One miss in this many loads its whole L0 object (above 1: the cache thrashes).",
    }
    for name, doc in gauges.items():
        yield _gauge(f"levelzero_l0_cache_{name}", doc, getattr(stats, name))


def reconciler_metrics(node: Node) -> Iterable[Metric]:
    stats = node.reconciler.stats
    counters = {
        "rounds": "Reconciler passes over every partition.",
        "objects_written": "L1 objects written.",
        "bytes_written": "Bytes of L1 objects written.",
        "records_reconciled": "Records copied from L0 into L1.",
        "catch_ups_rejected": "Catch-ups rejected (a newer term): their L1 object is collected.",
        "errors": "Failed partition reconciliations (retried next pass).",
    }
    for field, doc in counters.items():
        yield _counter(f"levelzero_reconciler_{field}", doc, getattr(stats, field))
    yield _gauge(
        "levelzero_reconciler_lag_offsets",
        "Offsets written but not yet reconciled, over every partition.",
        sum(v.reconciler_lag for v in node.views()),
    )
    failing = node.reconciler.health.failing()
    yield _gauge(
        "levelzero_reconciler_failing_partitions",
        "Partitions whose reconciliation keeps failing: each holds M (and the GC) back.",
        len(failing),
    )
    since = GaugeMetricFamily(
        "levelzero_partition_reconcile_failing_since_timestamp_seconds",
        "Unix time a failing partition's reconciliation started failing (absent when healthy).",
        labels=["topic", "partition"],
    )
    for f in failing:
        topic, _, partition = f.partition.rpartition("/")
        since.add_metric([topic, partition], f.since)
    yield since
    yield _counter("levelzero_l1_objects_deleted", "L1 objects deleted (two-phase).", node.l1.deleted)
    yield _counter(
        "levelzero_l1_delete_refusals",
        "L1 deletes refused because the current lineage serves the object (or a zombie asked).",
        node.l1.delete_refusals,
    )
    pending = node.l1.pending_deletes
    yield _gauge(
        "levelzero_l1_deletes_pending",
        "L1 objects whose delete failed (DELETE_STARTED, still in the bucket), retried with backoff.",
        len(pending),
    )
    oldest = pending.oldest_since()
    since = GaugeMetricFamily(
        "levelzero_l1_deletes_pending_since_timestamp_seconds",
        "Unix time of the oldest failed L1 delete still pending (absent when none).",
    )
    if oldest is not None:
        since.add_metric([], oldest)
    yield since
    yield _counter(
        "levelzero_l1_delete_failures",
        "Failed L1 object deletes (each is retried until it succeeds).",
        node.l1.delete_failures,
    )
    yield _counter("levelzero_l1_delete_retries", "Retries of failed L1 deletes.", node.l1.delete_retries)
    yield _counter(
        "levelzero_l1_strays_deleted",
        "L1 objects of partitions led here that no row named, deleted by the sweeps of their prefixes.",
        node.l1.strays_deleted,
    )


def housekeeper_metrics(node: Node) -> Iterable[Metric]:
    stats = node.housekeeper.stats
    counters = {
        "rounds": "Housekeeper passes over every partition.",
        "epochs_advanced": "AdvanceEpoch entries appended for idle or new partitions.",
        "catch_ups": "Catch-ups appended for idle, fully reconciled partitions.",
        "start_offsets_set": "Start offsets moved by retention.",
        "l1_deleted": "L1 objects deleted by retention and clean-up.",
        "errors": "Failed partition housekeeping (retried next pass).",
    }
    for field, doc in counters.items():
        yield _counter(f"levelzero_housekeeper_{field}", doc, getattr(stats, field))


def gc_metrics(node: Node) -> Iterable[Metric]:
    stats = node.gc.statistics()
    t = stats.totals
    counters = {
        "rounds": ("GC rounds finished (dry runs included).", stats.rounds),
        "dry_runs": ("GC dry runs.", stats.dry_runs),
        "failed_rounds": (
            "GC rounds that failed: an error, every list failed, or none of its keys deleted.",
            stats.failed_rounds,
        ),
        "safety_blocked_rounds": (
            "GC rounds that deleted nothing: a partition had no M(p).",
            stats.safety_blocked_rounds,
        ),
        "objects_listed": ("L0 objects listed.", t.listed),
        "objects_deleted": ("L0 objects deleted.", t.deleted),
        "bytes_deleted": ("Bytes of L0 objects deleted.", t.deleted_bytes),
        "delete_requests": ("Delete requests sent (batches of keys).", t.delete_requests),
        "delete_errors": ("Keys a delete failed for (listed again next round).", t.delete_errors),
        "list_requests": ("List requests sent.", t.list_requests),
        "list_errors": ("List requests that failed.", t.list_errors),
        "throttled": ("Store answers of 'slow down' (backed off and retried).", t.throttled),
        "sweeps": (
            "GC rounds that listed the prefixes (the others deleted from the catalog only).",
            stats.sweeps,
        ),
        "objects_from_catalog": (
            "Eligible L0 objects found in the catalog of this node's uploads.",
            t.catalog_eligible,
        ),
    }
    for field, (doc, value) in counters.items():
        yield _counter(f"levelzero_gc_{field}", doc, value)
    skipped = CounterMetricFamily(
        "levelzero_gc_objects_skipped",
        "Listed L0 objects the GC kept: too_young (inside grace_s), malformed (not an L0 key).",
        labels=["reason"],
    )
    skipped.add_metric(["too_young"], t.too_young)
    skipped.add_metric(["malformed"], t.malformed)
    yield skipped
    yield _counter(
        "levelzero_gc_prefixes_stopped_above_m",
        "Prefix listings that stopped at an object above M (not yet eligible).",
        t.above_m,
    )
    yield _gauge("levelzero_gc_paused", "1 while the GC's own rounds are paused.", int(stats.paused))
    yield _gauge(
        "levelzero_gc_backlog_objects",
        "Eligible L0 objects not deleted at the end of the last round.",
        stats.backlog,
    )
    if stats.m is not None:
        yield _gauge("levelzero_gc_round_watermark", "The highest M the GC has acted on.", stats.m)
        yield _gauge(
            "levelzero_gc_epoch_lag",
            "Cluster epoch now minus the highest M the GC has acted on (E - M).",
            node.epochs.current - stats.m,
        )
    if t.max_deleted_epoch is not None:
        yield _gauge(
            "levelzero_gc_max_deleted_epoch",
            "Highest epoch of a deleted L0 object.",
            t.max_deleted_epoch,
        )
    if stats.last_round_at is not None:
        yield _gauge(
            "levelzero_gc_last_round_timestamp_seconds",
            "When the last GC round finished.",
            stats.last_round_at,
        )


def compactor_metrics(node: Node) -> Iterable[Metric]:
    stats = node.compactor.stats
    counters = {
        "rounds": "Compactor passes over the compacted partitions led here.",
        "passes": "Compaction results accepted.",
        "refused": "Compaction results the control plane refused (outside the term lineage).",
        "bytes_read": "L1 bytes compaction read.",
        "bytes_written": "Bytes of compacted L1 objects written.",
        "errors": "Failed compaction passes (retried next round).",
    }
    for field, doc in counters.items():
        yield _counter(f"levelzero_compactor_{field}", doc, getattr(stats, field))
    per_partition: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
        "dirty_ratio": GaugeMetricFamily(
            "levelzero_partition_compaction_dirty_ratio",
            "A compacted partition's L1 bytes above its cleaner offset over all its L1 bytes.",
            labels=["topic", "partition"],
        ),
        "bytes_reclaimed": CounterMetricFamily(
            "levelzero_partition_compaction_bytes_reclaimed",
            "L1 bytes compaction reclaimed in a compacted partition (since this node led it).",
            labels=["topic", "partition"],
        ),
        "last_compaction_at": GaugeMetricFamily(
            "levelzero_partition_compaction_last_timestamp_seconds",
            "Unix time of a compacted partition's last accepted compaction (absent: none yet).",
            labels=["topic", "partition"],
        ),
    }
    for name, status in sorted(node.compactor.partitions.items()):
        topic, _, partition = name.rpartition("/")
        per_partition["dirty_ratio"].add_metric([topic, partition], status.dirty_ratio)
        per_partition["bytes_reclaimed"].add_metric([topic, partition], status.bytes_reclaimed)
        if status.last_compaction_at is not None:
            per_partition["last_compaction_at"].add_metric([topic, partition], status.last_compaction_at)
    yield from per_partition.values()


def cluster_metrics(node: Node) -> Iterable[Metric]:
    """A cluster node's view of the membership and the leases, as its last cluster round read
    them (`/v1/cluster` says the same): nothing on a node alone or before its first view. A
    node gone without a graceful stop is `expired` (its row stays until forgotten), and its
    partitions have no leader until their leases expire and others take them."""
    member = node.member
    view = None if member is None else member.view
    if member is None or view is None:
        return
    active, draining = live_nodes(((n.node_id, n.lease_expires_at, n.draining) for n in view.nodes), view.now)
    nodes = GaugeMetricFamily(
        "levelzero_cluster_nodes",
        "Nodes of the cluster by state, in this node's last view.",
        labels=["state"],
    )
    nodes.add_metric(["live"], len(active))
    nodes.add_metric(["draining"], len(draining))
    nodes.add_metric(["expired"], len(view.nodes) - len(active) - len(draining))
    yield nodes
    holders = member.lease_holders()
    yield _gauge(
        "levelzero_cluster_partitions_without_leader",
        "Partitions whose lease no live node holds, in this node's last view.",
        sum(1 for holder in holders.values() if holder is None),
    )
    yield _gauge(
        "levelzero_cluster_partitions_led", "Partitions this node holds the lease of.", len(member.leading)
    )


DEFAULT_SOURCES: tuple[Source, ...] = (
    epoch_metrics,
    cluster_metrics,
    batcher_metrics,
    reconciler_metrics,
    compactor_metrics,
    housekeeper_metrics,
    gc_metrics,
)


class NodeCollector(Collector):
    def __init__(
        self, node: Node, sources: Sequence[Source], per_partition_max: int, sizes: Histogram
    ) -> None:
        self._node = node
        self._sources = list(sources)
        self._per_partition_max = per_partition_max
        self._sizes = sizes

    def add_source(self, source: Source) -> None:
        self._sources.append(source)

    def collect(self) -> Iterable[Metric]:
        node = self._node
        stats = node.batcher.stats
        # Drain what the batcher noted since the last scrape (it stops noting at its bound).
        sizes, stats.object_sizes = stats.object_sizes, []
        for size in sizes[:OBJECT_SIZES_DRAIN_MAX]:
            self._sizes.observe(size)
        yield from self._sizes.collect()
        for source in self._sources:
            yield from source(node)
        views = node.views()
        yield from fence_metrics_of(views, len(views) <= self._per_partition_max)


class BuildAndDiskCollector(Collector):
    """`levelzero_build_info` (what runs) and the data directory's free space (read at scrape
    time: a full disk stops the log store, so it is alerted on before it happens)."""

    def __init__(self, data_dir: str | None) -> None:
        self._data_dir = data_dir
        self._labels = build_labels()

    def collect(self) -> Iterable[Metric]:
        info = GaugeMetricFamily(
            "levelzero_build_info",
            "The running levelzero: version and Python (value 1).",
            labels=list(self._labels),
        )
        info.add_metric(list(self._labels.values()), 1)
        yield info
        if self._data_dir is None:
            return
        try:
            disk = os.statvfs(self._data_dir)
        except OSError:
            return  # the directory is gone: the log store's errors say so
        yield _gauge(
            "levelzero_data_dir_free_bytes",
            "Bytes available to the daemon on the data directory's file system.",
            disk.f_bavail * disk.f_frsize,
        )
        yield _gauge(
            "levelzero_data_dir_size_bytes",
            "Size of the data directory's file system.",
            disk.f_blocks * disk.f_frsize,
        )


class DaemonMetrics:
    """The registry and the metrics the API observes directly."""

    def __init__(
        self,
        node: Node,
        *,
        per_partition_max: int = 256,
        sources: Sequence[Source] = DEFAULT_SOURCES,
        data_dir: str | None = None,
    ) -> None:
        # No `*_created` series: prometheus_client exports one per counter and histogram
        # (per label set), which doubles their series for a value Prometheus does not use.
        # The switch is the library's own and process-wide, read at each scrape.
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=False)
        # process_* (RSS, CPU seconds, open fds, start time) and python_info, as every
        # Prometheus client exports them by default, in this daemon's own registry.
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.registry.register(BuildAndDiskCollector(data_dir))
        self.produce_latency = Histogram(
            "levelzero_produce_latency_seconds",
            "Produce request latency, from the decoded request to its answer, by front end "
            "(http, kafka) and outcome (acknowledged: every record stored; failed).",
            ["protocol", "outcome"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.requests = Counter(
            "levelzero_http_requests",
            "HTTP requests by route and status code.",
            ["route", "code"],
            registry=self.registry,
        )
        object_sizes = Histogram(
            "levelzero_batcher_object_size_bytes",
            "Sizes of uploaded L0 objects.",
            buckets=OBJECT_SIZE_BUCKETS,
            registry=None,  # exported through NodeCollector, which feeds it at scrape time
        )
        self.collector = NodeCollector(node, sources, per_partition_max, object_sizes)
        self.registry.register(self.collector)

    def produce_observer(self, protocol: str) -> ProduceObserver:
        """What front end `protocol` tells of each produce; its series exist, at 0, from here."""
        acknowledged = self.produce_latency.labels(protocol, "acknowledged")
        failed = self.produce_latency.labels(protocol, "failed")

        def observe(seconds: float, ok: bool) -> None:
            (acknowledged if ok else failed).observe(seconds)

        return observe
