"""Leader epochs (KIP-320): a partition's term is its Kafka leader epoch. Metadata names it,
Fetch, ListOffsets and OffsetForLeaderEpoch check a client's `current_leader_epoch` against it
as Kafka's Partition does, and fetched batches carry the term that wrote their records
(`partitionLeaderEpoch`), so a consumer can ask OffsetForLeaderEpoch after a leader change
whether its position still exists (records acknowledged are never truncated here: it does)."""

from __future__ import annotations

from collections.abc import Sequence

from kio.schema.errors import ErrorCode

from levelzero.core.state import PartitionState
from levelzero.kafka import records as kr

NO_EPOCH = -1  # a client that sends no epoch skips the check


def epoch_error(term: int, current_leader_epoch: int) -> ErrorCode:
    """Kafka's checkCurrentLeaderEpoch: an older epoch is fenced, a newer one unknown (this
    leader's metadata is behind the client's)."""
    if current_leader_epoch in (NO_EPOCH, term):
        return ErrorCode.none
    if current_leader_epoch < term:
        return ErrorCode.fenced_leader_epoch
    return ErrorCode.unknown_leader_epoch


def encode_with_epochs(runs: Sequence[kr.StoredRun], state: PartitionState) -> bytes:
    """The runs a fetch took as batches, each run split where the term that wrote its records
    changes, each batch's partitionLeaderEpoch that term (-1 where the term is not known)."""
    out = []
    for run in runs:
        start = run.start
        while start < run.stop:
            offset = run.base_offset + start
            term = state.term_at(offset)
            stop = run.stop
            following = [first for t, first in state.term_starts if t > term]
            if following:
                stop = min(stop, max(start + 1, following[0] - run.base_offset))
            batch = bytearray(kr.encode_run(run.base_offset, run.records, start, stop))
            kr.set_leader_epoch(batch, term)  # every batch's (a run of transactions holds several)
            out.append(bytes(batch))
            start = stop
    return b"".join(out)
