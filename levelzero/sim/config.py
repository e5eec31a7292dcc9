"""Knobs of the simulated cluster. Times are virtual seconds; `(lo, hi)` pairs are uniform ranges.

The defaults are tuned so one seed is a few hundred events, fast enough to run hundreds of seeds
in a test, while still making the rare interleavings (an upload outliving two window slides, a GC
round outliving several epoch bumps, a catch-up delivered late to a zombie) happen often.
"""

from __future__ import annotations

from dataclasses import dataclass

Range = tuple[float, float]


@dataclass(frozen=True, slots=True)
class SimConfig:
    # cluster
    nodes: int = 3
    initial_partitions: int = 3
    partitions_created_max: int = 5  # created while the workload runs (and GC rounds are open)
    prefixes: int = 4  # L0 prefixes used (000-003): few, so a prefix scan stops early
    topic: str = "sim"

    # workload
    workload_steps: int = 400  # events before the quiet period
    produce_interval_s: float = 0.15  # mean, exponential
    records_per_write_max: int = 3
    value_bytes: Range = (4, 24)
    read_interval_s: float = 0.25
    read_s: Range = (0.05, 3.0)
    create_interval_s: float = 1.5
    create_gap_s: Range = (0.0, 0.3)  # board registration -> creation epoch chosen

    # epochs
    epoch_bump_interval_s: float = 1.0
    epoch_burst_p: float = 0.15  # an on-demand bump right after a timer bump
    cache_ttl_s: float = 2.5

    # batcher
    linger_s: float = 0.05
    batch_bytes_max: int = 400
    stale_retries_max: int = 3
    upload_s: Range = (0.01, 0.1)
    slow_upload_p: float = 0.15
    slow_upload_s: Range = (0.4, 2.5)

    # partition leaders
    append_s: Range = (0.002, 0.02)
    slow_append_p: float = 0.05
    slow_append_s: Range = (0.1, 0.6)
    message_s: Range = (0.0005, 0.005)
    late_message_p: float = 0.06
    late_message_s: Range = (0.2, 2.5)
    snapshot_every_records: int = 5

    # reconciler
    reconciler_interval_s: float = 0.6
    placeholders_per_l1_max: int = 4
    reconcile_read_s: Range = (0.01, 0.2)
    slow_reconcile_p: float = 0.1
    slow_reconcile_s: Range = (0.5, 2.0)
    copy_deadline_s: float = 30.0  # must exceed the longest upload + late catch-up

    # housekeeper
    housekeeper_interval_s: float = 0.5
    idle_after_s: float = 0.8

    # GC
    gc_interval_s: float = 0.8
    gc_read_delay_s: Range = (0.01, 0.4)  # step 1 (snapshot) -> step 2 (read the M(p)s)
    slow_gc_p: float = 0.4
    slow_gc_read_delay_s: Range = (2.0, 12.0)
    gc_delete_s: Range = (0.005, 0.1)
    gc_delete_batch_keys: int = 3
    grace_s: float = 0.0  # no grace: the epoch rule alone must keep data safe

    # faults (probabilities per operation, scaled per seed by a fault intensity)
    put_error_p: float = 0.04  # half of them after the effect (a timeout: the object exists)
    get_error_p: float = 0.03
    list_error_p: float = 0.04
    delete_batch_error_p: float = 0.08  # half after the effect
    delete_key_error_p: float = 0.08
    l1_put_error_p: float = 0.04
    reconcile_abort_p: float = 0.04  # the reconciler dies mid-copy (COPY_STARTED left behind)
    crash_interval_s: float = 5.0
    restart_s: Range = (0.3, 3.0)
    move_interval_s: float = 2.0
    election_s: Range = (0.05, 0.6)
    zombie_notice_s: Range = (0.05, 2.5)

    # Per-seed variation: when on, each seed draws its own cache TTL, epoch bump interval,
    # reconciler interval and write skew (a share of writes to the newest partition), so the
    # seeds cover calm and stormy, fresh and stale, balanced and skewed clusters.
    vary_per_seed: bool = True
    newest_partition_write_p: float = 0.0

    # checks and phases
    check_every_steps: int = 100  # full "every acknowledged record is readable" check
    quiet_s_max: float = 120.0
    quiet_steps_max: int = 20_000
    stall_window_s: float = 3.0  # writes this soon after a leadership change count for its stall
