"""The CLI's text formats of what the daemon answers (`levelzero/cli/formats.py`)."""

from __future__ import annotations

import msgspec

from levelzero.cli.formats import format_compaction
from levelzero.http.schema import CompactorStatus, PartitionCompactionStatus


def test_compaction_explain_says_its_counts_are_since_the_node_started() -> None:
    # After a restart the counts start again while the stored cleaner-offset map shows the
    # compactions before it: "never" read as "this partition was never compacted".
    restarted = PartitionCompactionStatus(
        partition="c/0",
        dirty_ratio=0.0,
        last_compaction_at=None,
        bytes_reclaimed=0,
        records_removed=0,
        tombstones_dropped=0,
        cleaner_offsets={"1": 365},
        passes=0,
        refused=0,
        not_compacted="nothing dirty",
    )
    compactor = CompactorStatus(rounds=3, passes=0, refused=0, bytes_read=0, bytes_written=0, errors=0)
    text = format_compaction(msgspec.structs.replace(compactor, partitions=[restarted]))
    assert text.splitlines()[0].startswith("compactor, since this node started: 3 rounds, 0 accepted passes")
    assert "last compaction none since this node started; passes here 0" in text
    assert "cleaner-offset map: term 1 -> 365" in text
    assert "never" not in text
