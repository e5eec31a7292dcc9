"""The S3 adapter's timestamp parser: ISO 8601 UTC (what listings return) the fast way,
everything else through botocore's own parser, the same instant either way."""

from __future__ import annotations

from datetime import timezone

import pytest
from botocore.utils import parse_timestamp as botocore_parse_timestamp

from levelzero.storage import s3_store
from levelzero.storage.s3_store import parse_timestamp


@pytest.mark.parametrize(
    "value",
    [
        "2026-11-22T04:10:55.000Z",  # ListObjectsV2 LastModified
        "2026-11-22T04:10:55Z",
        "2026-11-22T04:10:55.123456Z",
        "Sat, 22 Nov 2026 04:10:55 GMT",  # HEAD Last-Modified header
        "1700000000",
        1700000000,
    ],
)
def test_parse_timestamp_agrees_with_botocore(value: object) -> None:
    ours, theirs = parse_timestamp(value), botocore_parse_timestamp(value)
    assert ours.timestamp() == theirs.timestamp()
    assert ours.utcoffset() == timezone.utc.utcoffset(None)


def test_listing_timestamps_skip_dateutil(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(value: object) -> None:
        raise AssertionError(f"botocore's slow parser called for {value!r}")

    monkeypatch.setattr(s3_store, "botocore_parse_timestamp", refuse)
    assert parse_timestamp("2026-11-22T04:10:55.000Z").year == 2026
