"""The S3 tests' bucket removal outlasts a PUT that lands after the bucket was listed empty
(a killed daemon's last PUT, which the server finishes after the kill)."""

from __future__ import annotations

import uuid

import pytest
from conftest import S3TestEndpoint, remove_bucket


class _LatePut:
    """A client whose first DeleteBucket finds an object put just before it: the server
    finishing a dead client's PUT between the listing and the removal."""

    def __init__(self, client, bucket: str) -> None:
        self._client = client
        self._bucket = bucket
        self.late_puts = 0

    def __getattr__(self, name: str):
        return getattr(self._client, name)

    def delete_bucket(self, **kwargs):
        if self.late_puts == 0:
            self.late_puts += 1
            self._client.put_object(Bucket=self._bucket, Key="l0/late", Body=b"x")
        return self._client.delete_bucket(**kwargs)


@pytest.mark.s3
def test_an_object_landing_after_the_listing_is_removed_with_the_bucket(
    s3_endpoint: S3TestEndpoint,
) -> None:
    bucket = f"lz-removal-{uuid.uuid4().hex[:16]}"
    client = s3_endpoint.boto3_client()
    try:
        client.create_bucket(Bucket=bucket)
        client.put_object(Bucket=bucket, Key="l0/early", Body=b"x")
        late = _LatePut(client, bucket)
        remove_bucket(late, bucket)
        assert late.late_puts == 1
        assert bucket not in [b["Name"] for b in client.list_buckets()["Buckets"]]
        remove_bucket(client, bucket)  # gone already: nothing to do
    finally:
        client.close()
