"""A Faust application run as a child process by test_kafka_faust (on the apps' Python): an
agent reads `numbers` (key k0..k2, value {"n": N}), keeps a running sum per key in a Table and
writes each new sum to `sums` as {"n": N, "total": SUM}. The table is stored in RocksDB under
DATADIR and logged to its changelog topic, `summing-totals-changelog`, which Faust creates
compacted (`sums` and its group-assignment topic too; `numbers` is the test's).

    python faust_app.py BOOTSTRAP GUARANTEE DATADIR DELAY_S HANG_AT

GUARANTEE is Faust's processing_guarantee (at_least_once or exactly_once). DELAY_S is a pause
before each record's processing, so that the test can kill the worker mid-stream. HANG_AT
(-1: never) is an input offset at which the agent stops for good once the record's new sum is in
the table (its changelog record sent) and before the agent goes on to the next record, so the
record is never acknowledged and its offset never committed: the window at-least-once leaves,
held open for the test to SIGKILL the worker in. The worker runs until SIGTERM (a graceful stop:
it commits) or SIGKILL. The agent prints each record it takes (its offset, key, value, the sum
before it, and the table's recovery state) into the worker's log, beside the test's tmp_path."""

from __future__ import annotations

import asyncio
import sys

import faust
from faust.tables.recovery import Recovery
from faust.transport.consumer import ThreadDelegateConsumer

SESSION_S = 3.0  # a killed member leaves the group at its session timeout: the rerun waits for it
COMMIT_S = 0.5


def seek_before_resuming_streams() -> None:
    """Faust 0.15.3 (and every release since its change #241, December 2021) resumes the stream
    partitions in Recovery.on_recovery_completed before it seeks them to their committed offsets:
    records the consumer fetched during the table's recovery are handed to the agent, the seek
    then sets Faust's read offset back, and the same records come again (processed twice), or the
    flow control's resume drops those still queued (a gap in the acknowledged offsets: nothing is
    committed past it). Which one happens depends on the event loop's timing, not on the broker.
    Here the resume waits until the seek is done, the order of Faust's own fix #217."""
    recovery_completed = Recovery.on_recovery_completed

    async def on_recovery_completed(self: Recovery, generation_id: int = 0) -> None:
        consumer = self.app.consumer
        held: set = set()
        resume, seek = consumer.resume_partitions, consumer.perform_seek

        async def seek_then_resume() -> None:
            await seek()
            resume(held)
            held.clear()

        consumer.resume_partitions, consumer.perform_seek = held.update, seek_then_resume
        try:
            await recovery_completed(self, generation_id)
        finally:
            consumer.resume_partitions, consumer.perform_seek = resume, seek
            if held:  # nothing to seek (an empty assignment)
                resume(held)

    Recovery.on_recovery_completed = on_recovery_completed


def fetch_only_the_partitions_active_when_asked() -> None:
    """aiokafka's `Fetcher.fetched_records(partitions)` drains every partition when `partitions`
    is empty, and Faust 0.15.3 hands it its live set of active partitions, which recovery
    empties while the fetch waits (the changelog paused once read, the stream partitions not yet
    resumed). The fetch then drains the records aiokafka prefetched for the stream partition
    from its committed offset; Faust drops them, the partition not being active, with aiokafka's
    position already past them: the rerun hung at the committed offset, or, the drain falling
    inside the seek to it, skipped the hung record (one failure in about twenty runs on a busy
    machine). Here the fetch takes a copy of the set as it is when asked, and nothing when that
    is empty (None, a client-only app's "every partition", is passed on)."""
    get_many = ThreadDelegateConsumer._getmany

    async def _getmany(self: ThreadDelegateConsumer, active_partitions, timeout: float):
        if active_partitions is None:
            return await get_many(self, None, timeout)
        asked = frozenset(active_partitions)
        return await get_many(self, asked, timeout) if asked else {}

    ThreadDelegateConsumer._getmany = _getmany


def main(bootstrap: str, guarantee: str, datadir: str, delay_s: float, hang_at: int) -> None:
    seek_before_resuming_streams()
    fetch_only_the_partitions_active_when_asked()
    app = faust.App(
        "summing",
        broker=f"kafka://{bootstrap}",
        store="rocksdb://",
        datadir=datadir,
        processing_guarantee=guarantee,
        topic_partitions=1,
        topic_replication_factor=1,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=SESSION_S,
        broker_heartbeat_interval=0.5,
        broker_commit_interval=COMMIT_S,
        web_enabled=False,
    )
    numbers = app.topic("numbers", key_type=str, value_serializer="json")
    sums = app.topic("sums", key_type=str, value_serializer="json", partitions=1)
    totals = app.Table("totals", default=int, key_type=str, value_type=int, partitions=1)

    @app.agent(numbers)
    async def add(stream):
        await sums.maybe_declare()  # Faust creates it (CreateTopics) if it is not there
        async for event in stream.events():
            if delay_s:
                await asyncio.sleep(delay_s)
            key, n = event.key, event.value["n"]
            recovery = app.tables.recovery
            print(
                f"record {event.message.offset} {key} +{n} on {totals[key]}"
                f" in_recovery={recovery.in_recovery} completed={recovery.completed.is_set()}",
                flush=True,
            )
            totals[key] += n
            await sums.send(key=key, value={"n": n, "total": totals[key]})
            if event.message.offset == hang_at:
                await asyncio.Event().wait()

    faust.Worker(app, loglevel="info").execute_from_commandline()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5]))
