"""Log entries for tests: one `placeholder()` for every test of the core, the actors and the
stores, so a change to `Placeholder` is made here once."""

from __future__ import annotations

from levelzero.core.entries import Placeholder


def placeholder(
    epoch: int,
    records: int = 1,
    *,
    object_key: str | None = None,
    byte_length: int | None = None,
    checksum: int = 0,
    max_timestamp_ms: int | None = None,
) -> Placeholder:
    """A placeholder of `records` records in an object of `epoch` (its key made from the epoch
    unless given; 10 bytes a record unless `byte_length` says otherwise)."""
    assert epoch >= 0 and records >= 1, (epoch, records)
    return Placeholder(
        epoch=epoch,
        object_key=f"level_zero/data/000/{epoch:018}/{epoch:032x}" if object_key is None else object_key,
        byte_offset=0,
        byte_length=10 * records if byte_length is None else byte_length,
        record_count=records,
        checksum=checksum,
        max_timestamp_ms=max_timestamp_ms,
    )
