"""The simulation of the shipping code (levelzero/sim): the real `Node` keeps every invariant
over a fixed range of seeds, a seed replays exactly (in this process and in fresh ones), and
windowed fencing rejects and stalls less than the strict baseline. Seeds are fixed so a failure
here replays with `levelzero sim --seed S`.
"""

from __future__ import annotations

import subprocess
import sys


import pytest

from levelzero.sim import SimConfig, SimResult, Summary, run_many, run_seed, summarize
from levelzero.sim import cli
from levelzero.sim.cli import main
from levelzero.sim.compaction import CompactionStats, draw
from levelzero.sim.transactions import TxnStats
from levelzero.sim.transactions import compacted as transactions_compacted
from levelzero.sim.transactions import drawn as transactions_drawn
import levelzero.sim.world as world_module
from levelzero.sim.world import World

SEEDS = range(500)  # the real code, under a deterministic loop: the CI's share of seeds
# Within it, 187 found a batcher that went on before every placeholder reply of an object was
# settled (its countdown had touched zero between two adds): a stale-epoch retry settled later
# was lost, and its producer waited forever.
# Within it too, 6 found a read_committed fetch that retention overtook: the start offset moved
# during a slow read, the aborted ranges below it were forgotten, and the answer listed none of
# those its records belonged to (the consumer took aborted records); 135 and 238 a transaction's
# range opened at a high watermark read before an await, stale by then (the last stable offset
# moved back).
# Seeds beyond that range that once found a bug, kept as regressions:
# 639: a reconciler of the previous term read placeholders after the current one had caught up
#      and the log was truncated below them; its assert crashed the node.
# 765: a read_committed fetch that retention overtook before the aborted ranges below the new
#      start were forgotten: the answer listed a range whose abort marker it no longer held, and
#      the consumer skipped the producer's later committed records as aborted.
# 3312: retention deleted the L1 object a read_committed fetch was reading: the answer was
#       KAFKA_STORAGE_ERROR (the object's absence), not OFFSET_OUT_OF_RANGE with the new start.
# 6960: a new partition's first records waited 3.6 s behind a reconciler round copying other
#       partitions' backlogs; the check's bound had counted the partition's own backlog only.
# 33361: after a restart, a producer's EndTxn of its next transaction (never registered, its
#        records stored after the prepared one's markers) was taken for a retry of the prepared
#        one's: answered commit, and the records then aborted.
REGRESSION_SEEDS = (639, 765, 3312, 6960, 33361)
COMPARE_SEEDS = range(100)
# Three real nodes over one memory control plane. Within this range, seeds that found bugs of
# the cluster when it first ran: 5 (a term started on a lease that had run out left the lease
# holder's actor fenced forever; a reconciler asserted on a catch-up made by another node),
# 18 (a new leader's TermStart raced the old leader's last append), 117 (an ack delayed by a
# pause came after the records were reconciled and their L0 object collected; only the check
# was wrong).
CLUSTER_SEEDS = range(200)  # (300 until the healed phase made a cluster seed longer)
# Beyond that range: 755 (a deposed leader's snapshot, saved late, replaced its successor's newer
# one, and a replay met a log truncated under it); 391 and 722 (found by a campaign of 20,000:
# a compacted topic's produce cancelled with the node the client entered at landed later, a
# tombstone after the key's later value; the check had not counted that tombstone in doubt);
# 1832 (a lease release given up on landed after the member had adopted the lease again: it led
# a partition with no lease), 838 and 2465 (declared healed while a node was stopping, and while
# a fault slowed a control-plane call: a write of the healed phase found no leader); 8695 (a
# compaction's superseded object whose delete failed as its node stopped stayed DELETE_STARTED:
# the retry had lived in that node's memory, and the next leader had led the partition before,
# so its reconciler's start-up collection had run already).
CLUSTER_REGRESSION_SEEDS = (391, 722, 755, 838, 1832, 2465, 8695)


def every_invariant_kept(results: list[SimResult]) -> Summary:
    """No seed broke an invariant or left an L0 object; their summary."""
    failed = [r for r in results if r.violation is not None]
    assert not failed, failed[0].violation.describe()  # type: ignore[union-attr]
    assert [r.seed for r in results if r.l0_left] == []
    return summarize(results)


@pytest.fixture(scope="module")
def windowed_results() -> list[SimResult]:
    return run_many(SEEDS)


def test_seeds_of_the_real_node_keep_every_invariant_and_leave_no_l0_object(
    windowed_results: list[SimResult],
) -> None:
    s = every_invariant_kept(windowed_results)
    print(
        f"\n{s.seeds} seeds in {s.wall_s:.1f} s ({s.seeds_per_s:.1f} seeds/s, "
        f"{s.callbacks // s.seeds} loop callbacks/seed): {s.writes_acked} writes acked, "
        f"{s.objects_uploaded} L0 objects uploaded, {s.crashes} crashes"
    )
    # The run exercised what it claims to: faults, crashes, orphans, creations during GC rounds.
    assert s.writes_acked > 10_000 and s.reads > 1000 and s.faults > 1000
    assert s.crashes > 100 and s.orphans > 0 and s.stale_rejections > 0
    assert s.partitions_created_during_gc > 0 and s.l1_written > 0 and s.gc_rounds > 0
    assert s.epoch_bumps > 1000
    # Every acknowledged record was read back byte for byte at the end of each seed.
    assert s.records_checked + s.records_dropped == s.records_acked
    # Compaction ran in its share of seeds: results accepted, late ones of an older term
    # refused, passes cut by crashes, and the compacted partitions scanned with every rule.
    # (1000 seeds: 1,408 accepted, 143 refused, 147 cut by a crash, 2,622 scans checked)
    assert s.compaction_passes > 400 and s.compaction_refused > 20 and s.compaction_interrupted > 20
    assert s.compaction_scans > 800
    # Transactions ran in their share of seeds: commits and aborts answered, transactions given
    # up (restarts, timeouts), and read_committed consumers skipping aborted records.
    assert s.txn_committed > 250 and s.txn_aborted > 100 and s.txn_given_up > 300
    assert s.txn_records_read > 500 and s.txn_records_skipped > 1000


class NoCompaction:
    """The world's compaction hooks doing nothing: the world as it was before compaction."""

    def __init__(self, world: object) -> None:
        self.enabled = False
        self.stats = CompactionStats()

    def owns(self, topic: str) -> bool:
        return False

    def node_config(self, config: object) -> object:
        return config

    async def start(self, tg: object, end: float) -> None:
        pass

    def on_incarnation(self, inc: object) -> None:
        pass

    def absorb(self, inc: object) -> None:
        pass

    def settled(self) -> bool:
        return True

    def leftovers(self) -> list[str]:
        return []

    def check_superseded_deleted(self) -> None:
        pass

    async def final_scan(self) -> None:
        pass


def test_a_seed_without_a_compacted_topic_runs_as_if_compaction_did_not_exist(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The share of seeds with a compacted topic is drawn from streams of their own, and the
    # others run no compactor: every other seed keeps its schedule (and the figures measured
    # on it) exactly.
    seed = next(s for s in range(100) if not draw(s, SimConfig().compaction_share).enabled)
    with_hooks = run_seed(seed)
    monkeypatch.setattr(world_module, "CompactionSim", NoCompaction)
    without = run_seed(seed)
    assert with_hooks == without and with_hooks.writes_acked > 0


class NoTransactions:
    """The world's transaction hooks doing nothing: the world as it was before transactions."""

    def __init__(self, world: object, enabled: bool) -> None:
        self.enabled = False
        self.stats = TxnStats()

    def owns(self, topic: str) -> bool:
        return False

    def node_config(self, config: object) -> object:
        return config

    def absorb(self, inc: object) -> None:
        pass

    def on_incarnation(self, inc: object) -> None:
        pass

    def on_transaction(self, row: object) -> None:
        pass

    def on_durable(self, pid: int, records: object) -> None:
        pass

    async def run(self, end: float) -> None:
        pass

    def settled(self) -> bool:
        return True

    def leftovers(self) -> list[str]:
        return []

    async def final_scan(self) -> None:
        pass


def test_a_seed_without_transactions_runs_as_if_they_did_not_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    # The seeds with transactional producers are drawn from a stream of their own, and the
    # others get neither the Kafka API nor the transaction tables: their schedule is unchanged.
    seed = next(s for s in range(100) if not transactions_drawn(s, 1))
    with_hooks = run_seed(seed)
    monkeypatch.setattr(world_module, "TransactionSim", NoTransactions)
    without = run_seed(seed)
    assert with_hooks == without and with_hooks.writes_acked > 0


def test_a_seed_with_transactions_on_a_compacted_topic_compacts_under_them() -> None:
    # In their share of the transactional seeds (a stream of their own) the producers write to
    # a compacted topic: the shipping compactor's passes run under the open transactions, and
    # the progress and per-key outcome rules hold.
    # The first such seed that commits (2 commits none since the compacted scans' fetch sizes
    # are drawn: its schedule moved); each tried keeps every invariant.
    for seed in [s for s in range(100) if transactions_drawn(s, 1) and transactions_compacted(s)][:4]:
        result = run_seed(seed)
        assert result.violation is None, seed
        if result.txn_committed > 0:
            break
    assert result.txn_compacted == 1 and result.txn_compactions > 0 and result.txn_committed > 0


def test_a_seed_with_transactions_replays_exactly_in_a_fresh_process() -> None:
    seed = [s for s in range(100) if transactions_drawn(s, 1)][1]  # (the first, 2, commits none)
    script = (
        "import sys; from levelzero.sim import run_seed; r = run_seed(int(sys.argv[1])); "
        "print(r.trace_digest, r.txn_committed, r.txn_aborted, r.txn_records_read, r.txn_records_skipped)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(seed)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={"PYTHONHASHSEED": "3", "PATH": ""},
    )
    here = run_seed(seed)
    assert here.txn_committed > 0 and here.violation is None
    expected = (here.trace_digest, here.txn_committed, here.txn_aborted)
    assert done.stdout.split()[:3] == [str(v) for v in expected]
    assert done.stdout.split()[3:] == [str(here.txn_records_read), str(here.txn_records_skipped)]


def test_each_seed_draws_the_readers_l0_cache_off_tiny_or_large() -> None:
    """Swarm testing of the readers' L0 cache: a size per seed from a stream of its own (off,
    one object, three, room for all), which the seed's nodes run with."""
    config = SimConfig()
    sizes = {seed: World(seed, config).l0_cache_bytes_max for seed in range(40)}
    assert set(sizes.values()) == set(config.l0_cache_bytes_max) == {0, 2048, 6144, 1 << 20}
    assert all(World(seed, config).node_config().l0_cache_bytes_max == sizes[seed] for seed in range(5))
    off = run_seed(next(seed for seed, size in sizes.items() if size == 0))
    large = run_seed(next(seed for seed, size in sizes.items() if size == 1 << 20))
    assert (off.l0_cache_served, off.l0_cache_loads) == (0, 0)
    assert large.l0_cache_served > 0 and large.l0_cache_loads > 0
    assert off.violation is None and large.violation is None


def test_a_gc_ignoring_reader_pins_is_caught_at_the_delete_though_the_cache_serves_reads() -> None:
    """With the mutation `reader_pins_ignored`, seed 233 (a cache of 1 MiB) deletes an object
    above a live reader's pin: caught as the delete lands, whatever the reader then reads (its
    cache may still hold the object's bytes). Without the check at the delete such a seed
    passed. (Seeds 35, 14, 98, 44, 150 and 44 again were the ones until changes to the actors
    moved the deterministic schedules: the batcher's catalog recorder task, the housekeeper
    tending partitions 64 at a time, then as many workers as partitions due, the GC marking its
    deletes in pages, the batcher writing an object's extents in partition order, the
    reconciler copying in waves what was due when its round began, then 172 until retention read
    a partition's L1 rows once a round, then 106 until its transactions went to a compacted
    topic; so were clean seeds 0's 42 deletes under pins, 7's one,
    4's four and 4's one, then seed 5's one; now seed 5's 103, its readers' small fetches
    holding their pins longer.)"""
    assert World(233, SimConfig()).l0_cache_bytes_max == 1024 * 1024
    result = run_seed(233, mutation="reader_pins_ignored")
    assert result.violation is not None and result.violation.invariant == "1"
    assert "reader(s) of" in result.violation.message and "held M(p) =" in result.violation.message
    assert run_seed(233).violation is None
    clean = run_seed(5)  # deletes land while readers hold pins, below them: kept
    assert clean.violation is None and clean.deletes_under_pins > 0


@pytest.mark.parametrize("seed", REGRESSION_SEEDS)
def test_seeds_that_once_found_a_bug_keep_every_invariant(seed: int) -> None:
    result = run_seed(seed)
    assert result.violation is None, result.violation.describe()
    assert result.l0_left == 0 and result.records_checked + result.records_dropped == result.records_acked


def test_seeds_of_a_three_node_cluster_keep_every_invariant_and_leave_no_l0_object() -> None:
    s = every_invariant_kept(run_many(CLUSTER_SEEDS, nodes=3))
    print(
        f"\n{s.seeds} three-node seeds in {s.wall_s:.1f} s: {s.writes_acked} writes acked, "
        f"{s.crashes} crashes, {s.graceful_stops} graceful stops, {s.pauses} pauses"
    )
    # Leadership moved for every reason the cluster has: crashes, hand-overs, zombies.
    assert s.crashes > 50 and s.graceful_stops > 50 and s.pauses > 50
    # (392 accepted, 14 refused, 631 scans checked)
    assert s.compaction_passes > 200 and s.compaction_refused > 5 and s.compaction_scans > 300
    assert s.writes_acked > 10_000 and s.faults > 1000 and s.orphans > 0
    assert s.records_checked + s.records_dropped == s.records_acked


@pytest.mark.parametrize("seed", CLUSTER_REGRESSION_SEEDS)
def test_cluster_seeds_that_once_found_a_bug_keep_every_invariant(seed: int) -> None:
    result = run_seed(seed, nodes=3)
    assert result.violation is None, result.violation.describe()
    assert result.l0_left == 0 and result.records_checked + result.records_dropped == result.records_acked


def test_a_cluster_seed_replays_exactly() -> None:
    # The first seed from 117 on whose run pauses, stops or crashes a node (which seeds do
    # moves with the code; most of them do).
    for seed in range(117, 147):
        first = run_seed(seed, nodes=3)
        if first.pauses + first.graceful_stops + first.crashes > 0:
            break
    else:
        raise AssertionError("no cluster seed in 117..146 paused, stopped or crashed a node")
    second = run_seed(seed, nodes=3)
    assert first == second and first.nodes == 3


def test_a_seed_replays_exactly_in_this_process() -> None:
    first, second = run_seed(12345), run_seed(12345)
    assert first == second  # every count, the violation (none) and the digest of the trace
    assert first.callbacks > 1000 and first.writes_acked > 0
    assert run_seed(12346).trace_digest != first.trace_digest


REPLAY = (
    "import sys; from levelzero.sim import run_seed; "
    "r = run_seed(int(sys.argv[1])); print(r.trace_digest, r.callbacks, r.writes_acked)"
)


def test_a_seed_gives_the_same_trace_digest_in_two_fresh_processes() -> None:
    def fresh(seed: int, hash_seed: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", REPLAY, str(seed)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
            env={"PYTHONHASHSEED": hash_seed, "PATH": ""},
        )
        return done.stdout.strip()

    # Different hash seeds and address layouts: nothing may depend on either.
    first, second = fresh(77, "1"), fresh(77, "2")
    assert first == second
    assert first.split()[0] == str(run_seed(77).trace_digest)


def test_windowed_fencing_rejects_and_stalls_less_than_strict(
    windowed_results: list[SimResult],
) -> None:
    windowed = summarize([r for r in windowed_results if r.seed in COMPARE_SEEDS])
    strict_results = run_many(COMPARE_SEEDS, fencing_mode="strict")
    assert all(r.violation is None for r in strict_results)  # strict is slower, not unsafe
    strict = summarize(strict_results)
    print(
        f"\nover seeds {COMPARE_SEEDS.start}..{COMPARE_SEEDS.stop - 1}:"
        f"\n  windowed: {windowed.stale_rejections} rejections, stall after takeovers "
        f"total {windowed.total_stall_s:.1f} s (max {windowed.max_stall_s:.2f} s)"
        f"\n  strict:   {strict.stale_rejections} rejections, stall after takeovers "
        f"total {strict.total_stall_s:.1f} s (max {strict.max_stall_s:.2f} s)"
    )
    assert windowed.leadership_changes > 50 and windowed.stale_cache_changes > 20
    assert windowed.stale_rejections < strict.stale_rejections
    assert windowed.rejections_after_change < strict.rejections_after_change
    assert windowed.total_stall_s < strict.total_stall_s


def test_cli_prints_a_summary_with_seeds_per_second(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seeds", "3", "--seed", "10"]) == 0
    out = capsys.readouterr().out
    assert "3 seeds (10..12), mode windowed" in out and "violations" in out
    assert "seeds per s" in out


def test_cli_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seeds", "0"]) == 2
    assert main(["--workload-s", "-1"]) == 2
    assert main(["--jobs", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--seeds must be >= 1" in err and "--workload-s" in err and "--jobs must be in 0..256" in err


def _without_timing(out: str) -> list[str]:
    return [line for line in out.splitlines() if "seeds per s" not in line]


def test_seeds_on_two_processes_sum_to_what_one_process_finds(capsys: pytest.CaptureFixture[str]) -> None:
    # The same seeds, one with a violation: the same summary (callbacks, writes, faults and
    # all), the same failing seed and replay, whichever process ran each seed.
    argv = ["--seeds", "6", "--seed", "3", "--mutation", "compaction_keeps_first_per_key"]
    assert main([*argv, "--jobs", "1"]) == 0
    alone = capsys.readouterr().out
    assert main([*argv, "--jobs", "2"]) == 0
    shared = capsys.readouterr().out
    assert "replay: levelzero sim --seed 5 --mode windowed --mutation compaction_keeps_first_per_key" in alone
    assert _without_timing(shared) == _without_timing(alone)
    assert "processes / seeds per s of one           2 / " in shared
    assert "processes" not in alone


def test_mutations_hunted_on_two_processes_report_in_their_order(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two mutations (the workers are handed their names), each caught within a few seeds.
    wanted = ("compaction_superseded_never_deleted", "compaction_keeps_first_per_key")
    monkeypatch.setattr(cli, "MUTATIONS", {name: cli.MUTATIONS[name] for name in wanted})
    assert main(["--mutate", "--seeds", "20", "--catches", "2", "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(wanted)]
    # (name, caught, first catching seed, median seeds-to-catch, seeds tried)
    assert [row[:5] for row in rows] == [
        ["compaction_superseded_never_deleted", "yes", "0", "1.5", "3"],
        ["compaction_keeps_first_per_key", "yes", "0", "3", "6"],
    ]


def test_a_cluster_seed_replays_exactly_whatever_the_heap_holds() -> None:
    # anyio keeps cancel scopes and tasks in sets, which iterate by hash: by address, objects
    # left on the heap between two runs of one seed changed which callbacks the second ran
    # (16,421 vs 16,422 for seed 117). Runs after holding on to objects of several sizes.
    # (The first seed from 117 on that pauses, stops or crashes a node: swarm rates leave some
    # seeds calm.)
    seed = next(
        s for s in range(117, 147) if (r := run_seed(s, nodes=3)).pauses + r.graceful_stops + r.crashes
    )
    first = run_seed(seed, nodes=3)
    assert first.pauses + first.graceful_stops + first.crashes > 0
    for size in (1, 7, 64, 500):
        ballast = [bytearray(size) for _ in range(size * 3)]
        assert run_seed(seed, nodes=3) == first, f"after {len(ballast)} objects of {size} bytes"
