"""The daemon on S3 (moto, or the server in LEVELZERO_TEST_S3_ENDPOINT) configured the way the
README configures MinIO: endpoint, bucket, region, path style, credentials from the environment."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from daemon_support import s3_environ

from levelzero.core.errors import StorageError
from levelzero.cli.commands import leaf_errors
from levelzero.client import ApiError, Client
from levelzero.config import load_config
from levelzero.daemon.service import running_daemon
from levelzero.daemon.storage_health import STORAGE_FAILURES_TO_UNHEALTHY

pytestmark = pytest.mark.s3
WAIT_S = 30.0


async def test_produce_and_fetch_through_s3(tmp_path: Path, s3_endpoint, s3_bucket: str) -> None:
    config = load_config(
        None,
        environ=s3_environ(s3_endpoint, s3_bucket),
        overrides={
            ("storage", "data_dir"): str(tmp_path),
            ("server", "listen"): "127.0.0.1:0",
            ("batcher", "linger_ms"): 5.0,
        },
    )
    async with running_daemon(config) as daemon, Client(daemon.url) as client:
        await client.create_topic("t", 2)
        ack = await client.produce("t", 1, [(b"k", b"stored in s3"), (None, b"\x00" * 1000)])
        assert (ack.base_offset, ack.last_offset) == (0, 1)
        fetched = await client.fetch("t", 1, 0)
        assert [(r.key, r.value) for r in fetched.records] == [
            (b"k", b"stored in s3"),
            (None, b"\x00" * 1000),
        ]
        keys = [
            o["Key"] for o in s3_endpoint.boto3_client().list_objects_v2(Bucket=s3_bucket).get("Contents", [])
        ]
        assert any(key.startswith("level_zero/data/") for key in keys)


async def test_a_missing_bucket_stops_the_start_up_with_its_name(tmp_path: Path, s3_endpoint) -> None:
    config = load_config(
        None,
        environ=s3_environ(s3_endpoint, "levelzero-no-such-bucket"),
        overrides={("storage", "data_dir"): str(tmp_path), ("server", "listen"): "127.0.0.1:0"},
    )
    with pytest.raises(BaseException) as caught:  # noqa: PT011 - may arrive in an exception group
        async with running_daemon(config):
            pass
    errors = leaf_errors(caught.value)
    assert any(
        isinstance(e, StorageError) and "levelzero-no-such-bucket does not exist" in str(e) for e in errors
    )
    [error] = [e for e in errors if isinstance(e, StorageError)]
    assert "set s3.create_bucket = true (LEVELZERO_S3_CREATE_BUCKET=true)" in str(error)


async def test_no_credentials_stop_the_start_up_naming_the_variables_to_set(
    tmp_path: Path, s3_endpoint, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither the configuration nor botocore's chain has a key: the message names the
    LEVELZERO_S3_* variables (the daemon's own), not only AWS_*."""
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    environ = s3_environ(s3_endpoint, s3_bucket)
    del environ["LEVELZERO_S3_ACCESS_KEY"], environ["LEVELZERO_S3_SECRET_KEY"]
    config = load_config(
        None,
        environ=environ,
        overrides={("storage", "data_dir"): str(tmp_path / "d"), ("server", "listen"): "127.0.0.1:0"},
    )
    with pytest.raises(BaseException) as caught:  # noqa: PT011 - may arrive in an exception group
        async with running_daemon(config):
            pass
    [error] = [e for e in leaf_errors(caught.value) if isinstance(e, StorageError)]
    assert str(error).startswith(f"no S3 credentials for {s3_endpoint.endpoint_url}: ")
    assert "set LEVELZERO_S3_ACCESS_KEY and LEVELZERO_S3_SECRET_KEY" in str(error)


def test_a_missing_bucket_exits_2_which_systemd_does_not_restart(make_daemon_process, s3_endpoint) -> None:
    """Only an operator can make the bucket (or fix the credentials): exit 2, not a restart loop."""
    process = make_daemon_process(env=s3_environ(s3_endpoint, "levelzero-no-such-bucket"))
    process.start(wait=False)
    assert process.wait_exit() == 2
    assert "bucket levelzero-no-such-bucket does not exist" in process.log()
    assert "LEVELZERO_S3_CREATE_BUCKET=true" in process.log()
    assert "Traceback" not in process.log()


async def test_a_bucket_gone_while_serving_makes_the_daemon_unready_until_it_is_back(
    tmp_path: Path,
    s3_endpoint,
    s3_bucket: str,
) -> None:
    config = load_config(
        None,
        environ=s3_environ(s3_endpoint, s3_bucket),
        overrides={
            ("storage", "data_dir"): str(tmp_path),
            ("server", "listen"): "127.0.0.1:0",
            ("batcher", "linger_ms"): 5.0,
            ("gc", "enabled"): False,
        },
    )
    s3 = s3_endpoint.boto3_client()
    async with running_daemon(config) as daemon, Client(daemon.url) as client:
        await client.create_topic("t", 1)
        assert await client.ready()
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=s3_bucket):
            for item in page.get("Contents", []):
                s3.delete_object(Bucket=s3_bucket, Key=item["Key"])
        s3.delete_bucket(Bucket=s3_bucket)
        for _ in range(STORAGE_FAILURES_TO_UNHEALTHY):
            with pytest.raises(ApiError) as caught:
                await client.produce("t", 0, [b"no bucket"])
            assert (caught.value.status, caught.value.code) == (503, "storage_error")
        assert not await client.ready()
        status = await client.status()
        assert status.accepting is False and status.not_accepting_reason is not None
        assert f"bucket {s3_bucket} does not exist" in status.not_accepting_reason
        s3.create_bucket(Bucket=s3_bucket)  # the probe finds it back, with no traffic
        with anyio.fail_after(WAIT_S):
            while not await client.ready():
                await anyio.sleep(0.05)
        assert (await client.produce("t", 0, [b"bucket back"])).base_offset == 0
