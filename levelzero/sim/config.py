"""Knobs of the simulated world. Times are virtual seconds; `(lo, hi)` pairs are uniform ranges.

The defaults keep one seed to a few seconds of virtual workload (a fraction of a second of CPU)
while making the rare interleavings common: slow uploads that outlive window slides and GC
rounds, crashes with uploads and deletes still on the wire, epoch bumps in bursts, partitions
created while GC rounds are open, readers holding `M(p)` while the GC runs.
"""

from __future__ import annotations

from dataclasses import dataclass

Range = tuple[float, float]


@dataclass(frozen=True, slots=True)
class SimConfig:
    # topics and partitions
    initial_partitions: int = 3
    first_topic_after_s: Range = (0.0, 3.0)  # the GC runs with no partition at all until then
    topics_created_max: int = 5  # created while the workload runs (and GC rounds are open)
    partitions_per_created_topic: tuple[int, int] = (1, 3)
    create_interval_s: float = 1.0
    create_in_gc_round_p: float = 0.5  # a creation waits for an open GC round
    bump_after_create_p: float = 0.5  # an epoch bump right after a creation: E passes it at once

    # workload
    workload_s: float = 6.0  # virtual seconds of producing, reading, crashing
    produce_interval_s: float = 0.04  # mean, exponential
    records_per_write_max: int = 3
    value_bytes: tuple[int, int] = (4, 24)
    read_interval_s: float = 0.1
    boundary_read_p: float = 0.3  # reads at LRO, LRO + 1, the start offset or HWM - 1
    tail_read_p: float = 0.7  # reads of the unreconciled tail (from L0, pinning M(p))
    newest_partition_write_p: tuple[float, ...] = (0.0, 0.3, 0.6)  # one drawn per seed
    # seeds with a compacted topic and the compactor running (`compaction.py`, drawn apart)
    compaction_share: float = 0.4
    # the readers' L0 cache (`actors/l0_cache.py`), one size drawn per seed (a stream of its
    # own): off; one object (an L0 object is at most two batches: 2 * batch_bytes_max), every
    # load evicts; three objects; room for all
    l0_cache_bytes_max: tuple[int, ...] = (0, 2048, 6144, 1 << 20)

    # epochs: the node's timer, and bumps on demand (in bursts) at any time
    epoch_bump_interval_s: tuple[float, ...] = (0.5, 1.0, 2.0)  # one drawn per seed
    bump_interval_s: float = 0.7
    bump_burst_p: float = 0.2
    cache_ttl_s: tuple[float, ...] = (0.3, 1.0, 3.0)  # one drawn per seed
    stale_cache_epochs_max: int = 4  # a new incarnation's cache may start this far behind

    # crashes: the node is dropped mid-flight; its object-store requests on the wire still land
    crash_interval_s: float = 3.0
    late_reconciler_p: float = 0.5  # after a takeover, a reconciler of the old term finishes late
    late_reconciler_s: Range = (0.0, 1.0)
    zombie_s: Range = (0.0, 2.5)  # how long the dropped incarnation's work keeps landing
    restart_s: Range = (0.0, 0.5)

    # a cluster (`nodes > 1`): leases by the shipping ClusterMember over the memory control plane
    lease_ttl_s: tuple[float, ...] = (1.0, 2.0, 3.0)  # one drawn per seed
    cluster_fault_weights: tuple[float, ...] = (0.35, 0.25, 0.2, 0.2)  # crash, stop, pause, cut
    control_error_p: float = 0.02  # a control-plane call fails (before its effect)
    control_slow_p: float = 0.05  # ... or takes a share of a lease TTL
    control_slow_ttls: Range = (0.05, 0.6)
    cluster_restart_s: Range = (0.0, 4.0)  # often within the node's lease TTL, often after it
    pause_ttls: Range = (0.5, 3.0)  # a pause, in lease TTLs: often past the lease
    drain_s_max: float = 60.0  # a graceful stop ends within this (or it is a violation)
    # a graceful stop killed (a stop timeout's SIGKILL) just after it sent its drain's
    # set_draining or leave_node; a killed node's control-plane requests on the wire land up to
    # the longest restart plus two lease TTLs later (held behind a row lock, retransmitted),
    # often after its next run registered and took leases: they name the old incarnation and
    # must change nothing
    stop_killed_p: float = 0.5
    request_timeout_s: float = 15.0  # a client gives up on a request to a node that died
    not_leader_retries: int = 8  # a client retries `not_leader` with no leader named ...
    not_leader_retry_s: float = 0.25  # ... after this (the API's Retry-After)

    # the node's actors (shipping code, small bounds)
    linger_ms: float = 20.0
    batch_bytes_max: int = 1024
    uploads_max: int = 4
    stale_retries_max: int = 3
    snapshot_every_records: int = 5
    log_keep_records: int = 4
    reconciler_interval_s: tuple[float, ...] = (0.3, 0.6, 1.5)  # one drawn per seed
    # L1 objects grow to a size or an age (0: one every pass), one age drawn per seed
    reconciler_object_bytes_min: int = 512
    reconciler_object_age_max_s: tuple[float, ...] = (0.0, 1.0, 4.0)
    # The reconciler round's read buffer, one drawn per seed: room for everything, for a few
    # partitions' extents (rounds leave partitions to the next), for less than one, or none
    # (a GET per extent).
    reconciler_read_buffer_bytes: tuple[int, ...] = (64 * 1024 * 1024, 64 * 1024 * 1024, 1024, 128, 0)
    copy_deadline_s: float = 30.0
    housekeeper_interval_s: tuple[float, ...] = (0.4, 0.4, 2.5)  # one drawn per seed
    idle_after_s: float = 0.8
    gc_interval_s: float = 0.4
    gc_idle_backoff_max_s: float = 1.5
    gc_sweep_interval_s: float = 4.0
    gc_delete_batch_keys_max: int = 3
    gc_deletes_in_flight_max: int = 2

    # storage latency and faults (probabilities per operation, scaled per seed)
    fault_scales: tuple[float, ...] = (0.5, 1.0, 1.0, 2.0)
    swarm_scales: tuple[float, ...] = (0.0, 0.5, 1.0, 1.0, 2.0, 4.0)  # each fault's, per seed
    swarm_mix: tuple[float, ...] = (0.5, 1.0, 1.0, 2.0)  # each workload interval's, per seed
    # retention, one drawn per seed: none, by age (s), by bytes of valid L1 objects kept
    retentions: tuple[tuple[str, float], ...] = (
        ("none", 0),
        ("none", 0),
        ("s", 2.0),
        ("s", 4.0),
        ("bytes", 300),
        ("bytes", 900),
    )
    object_op_s: Range = (0.001, 0.03)
    slow_put_p: float = 0.12
    slow_put_s: Range = (0.3, 2.5)
    slow_get_p: float = 0.1  # a slow range read: a reader outlives a catch-up and a GC round
    slow_get_s: Range = (0.5, 3.0)
    log_op_s: Range = (0.0005, 0.01)
    slow_log_p: float = 0.04
    slow_log_s: Range = (0.05, 0.5)
    put_error_p: float = 0.04  # half of them after the effect (a timeout: the object exists)
    get_error_p: float = 0.02
    list_error_p: float = 0.03
    delete_batch_error_p: float = 0.06  # half after the effect
    delete_key_error_p: float = 0.08

    # the healed phase (faults stopped, the workload goes on), the quiet period and the checks
    heal_s_max: float = 80.0  # every node up again within this of the faults' end
    healed_s: float = 1.5  # the workload runs this long once healed
    healed_write_s_max: float = 2.0  # a write submitted once healed is acknowledged within this
    # (plus two lease TTLs in a cluster: a restarted node takes its share of partitions)
    # Once healed, an L0 object at or below M goes within this much more than a sweep's interval
    # plus the longest idle pause between GC rounds (with its jitter): a round's time.
    collect_round_s: float = 1.0
    # Once healed, the objects an accepted compaction result superseded are deleted within this
    # of the commit (its compactor deletes them right after it: no round to wait for)
    superseded_delete_s: float = 1.0
    reconcile_copy_s: float = 3.0  # plus two reconciler intervals: a durable record reaches LRO
    reconcile_records_per_s: float = 50.0  # ... plus its backlog at this floor of throughput
    # every L0 object collected within this of the workload's end (it covers a partition whose
    # reconciliation is failing, retried every RECONCILE_FAILING_RETRY_S = 30 s only)
    quiet_s_max: float = 45.0
    check_interval_s: float = 0.25  # monotone values and every acknowledged record readable
    trace_lines_max: int = 40
    stall_window_s: float = 1.0  # writes this soon after a new incarnation count for its stall
