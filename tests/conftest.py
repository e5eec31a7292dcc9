"""Fixtures shared by the whole test suite.

S3: one endpoint per test session — moto's standalone server, started as a subprocess on a free
local port by the shared test helper (`levelzero.testing.moto.moto_process`), or a real server
named by LEVELZERO_TEST_S3_ENDPOINT (with LEVELZERO_TEST_S3_ACCESS_KEY,
LEVELZERO_TEST_S3_SECRET_KEY, optional LEVELZERO_TEST_S3_REGION). Nothing S3 starts unless a test
asks for it, so `pytest -m "not s3"` needs no server. Each test that uses S3 gets its own bucket.

Object stores: `object_store` runs a test against the memory, local and S3 adapters.

PostgreSQL: one throwaway server per session (or LEVELZERO_TEST_POSTGRES_DSN), started only when a
test asks for `postgres_dsn`; each such test gets a fresh database.
"""

from __future__ import annotations

import asyncio
import os
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import boto3
import botocore.config
import botocore.exceptions
import pytest
from daemon_support import DaemonProcess

from levelzero.storage.local_store import LocalObjectStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.protocols import ObjectStore
from levelzero.storage.s3_store import S3Config, S3ObjectStore
from levelzero.testing.moto import MotoDidNotStart, moto_process
from levelzero.testing.postgres import ServerUnavailable, ThrowawayServer, start_throwaway

# ------------------------------------------------------------------------------------- S3


@dataclass(frozen=True)
class S3TestEndpoint:
    endpoint_url: str
    region: str
    access_key: str = field(repr=False)
    secret_key: str = field(repr=False)
    is_moto: bool  # moto accepts any credentials unless told otherwise (see /moto-api/reset-auth)

    def config(self, bucket: str, **overrides: object) -> S3Config:
        settings: dict[str, object] = {
            "bucket": bucket,
            "endpoint_url": self.endpoint_url,
            "region": self.region,
            "path_style": True,
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "max_attempts": 3,
            "connect_timeout_s": 5.0,
            "read_timeout_s": 30.0,
        }
        settings.update(overrides)
        return S3Config(**settings)  # type: ignore[arg-type]

    def boto3_client(self):
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=botocore.config.Config(s3={"addressing_style": "path"}),
        )


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3TestEndpoint]:
    endpoint_url = os.environ.get("LEVELZERO_TEST_S3_ENDPOINT")
    if endpoint_url:
        yield S3TestEndpoint(
            endpoint_url=endpoint_url,
            region=os.environ.get("LEVELZERO_TEST_S3_REGION", "us-east-1"),
            access_key=os.environ["LEVELZERO_TEST_S3_ACCESS_KEY"],
            secret_key=os.environ["LEVELZERO_TEST_S3_SECRET_KEY"],
            is_moto=False,
        )
        return
    log_path = tmp_path_factory.mktemp("moto") / "moto_server.log"
    try:
        with moto_process(log_path) as url:  # the one way to run moto
            yield S3TestEndpoint(
                endpoint_url=url,
                region="us-east-1",
                access_key="levelzero-test",
                secret_key="levelzero-test-secret",
                is_moto=True,
            )
    except MotoDidNotStart as exc:
        pytest.fail(str(exc))


@pytest.fixture
def s3_bucket(s3_endpoint: S3TestEndpoint) -> Iterator[str]:
    """A fresh, empty bucket; emptied and removed afterwards."""
    bucket = f"lz-test-{uuid.uuid4().hex[:20]}"
    client = s3_endpoint.boto3_client()
    create: dict[str, object] = {"Bucket": bucket}
    if s3_endpoint.region != "us-east-1":
        create["CreateBucketConfiguration"] = {"LocationConstraint": s3_endpoint.region}
    client.create_bucket(**create)
    try:
        yield bucket
    finally:
        try:
            remove_bucket(client, bucket)
        finally:
            client.close()


BUCKET_REMOVAL_ATTEMPTS = 50
BUCKET_REMOVAL_PAUSE_S = 0.2


def remove_bucket(client: Any, bucket: str) -> None:
    """Empties `bucket` and removes it (gone already is fine). A daemon killed with a PUT on
    the wire does not take the PUT back: the server finishes it after the kill, so an object
    can land after the bucket was listed empty (seen on a busy host after a cluster test: the
    removal failed with BucketNotEmpty). The emptying is repeated until the removal takes, a
    bounded number of times; what is still there after them is named."""
    for _ in range(BUCKET_REMOVAL_ATTEMPTS):
        keys: list[str] = []
        try:
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                keys = [item["Key"] for item in page.get("Contents", [])]
                if keys:
                    client.delete_objects(
                        Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True}
                    )
            client.delete_bucket(Bucket=bucket)
            return
        except client.exceptions.NoSuchBucket:
            return
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "BucketNotEmpty":
                raise
        time.sleep(BUCKET_REMOVAL_PAUSE_S)
    left = [item["Key"] for item in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    raise AssertionError(
        f"bucket {bucket} still not empty after {BUCKET_REMOVAL_ATTEMPTS} emptyings: {left[:10]}"
    )


@pytest.fixture
def s3_config(s3_endpoint: S3TestEndpoint, s3_bucket: str) -> S3Config:
    return s3_endpoint.config(s3_bucket)


# ---------------------------------------------------------------------------- object stores

OBJECT_STORE_KINDS = ["memory", "local", pytest.param("s3", marks=pytest.mark.s3)]


@pytest.fixture(params=OBJECT_STORE_KINDS)
async def object_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    """An opened, empty store of each kind; closed afterwards."""
    store: ObjectStore
    match request.param:
        case "memory":
            store = MemoryObjectStore()
        case "local":
            store = LocalObjectStore(tmp_path / "objects")
        case "s3":
            store = await S3ObjectStore.open(request.getfixturevalue("s3_config"))
        case other:
            raise AssertionError(f"unknown object store kind {other!r}")
    try:
        yield store
    finally:
        await store.aclose()


# ---------------------------------------------------------------------------- PostgreSQL


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[ThrowawayServer | str]:
    """A throwaway PostgreSQL server for the session (initdb + pg_ctl, fsync off), or the DSN
    in LEVELZERO_TEST_POSTGRES_DSN (a server whose user may create databases). Without
    PostgreSQL binaries the tests that need it fail, saying how to install them."""
    dsn = os.environ.get("LEVELZERO_TEST_POSTGRES_DSN")
    if dsn:
        yield dsn
        return
    try:
        server = start_throwaway()
    except ServerUnavailable as error:
        pytest.fail(str(error), pytrace=False)
    try:
        yield server
    finally:
        server.close()


def _admin_dsn(server: ThrowawayServer | str) -> str:
    return server if isinstance(server, str) else server.dsn()


def _with_database(dsn: str, database: str) -> str:
    parts = urllib.parse.urlsplit(dsn)
    return urllib.parse.urlunsplit(parts._replace(path="/" + database))


@pytest.fixture
def postgres_dsn(postgres_server: ThrowawayServer | str) -> Iterator[str]:
    """A DSN of a fresh, empty database of its own (dropped afterwards)."""
    admin = _admin_dsn(postgres_server)
    database = f"levelzero_test_{uuid.uuid4().hex[:12]}"

    async def run(statement: str) -> None:
        connection = await asyncpg.connect(admin)
        try:
            await connection.execute(statement)
        finally:
            await connection.close()

    asyncio.run(run(f'CREATE DATABASE "{database}"'))
    try:
        yield _with_database(admin, database)
    finally:
        asyncio.run(run(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))


# ---------------------------------------------------------------- daemon subprocesses
# (the helpers behind these live in tests/daemon_support.py)


@pytest.fixture
def daemon_process(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A started daemon subprocess on tmp_path/data; killed at teardown if still running."""
    process = DaemonProcess(tmp_path / "data", tmp_path)
    try:
        yield process.start()
    finally:
        process.cleanup()


@pytest.fixture
def make_daemon_process(tmp_path: Path) -> Iterator[Any]:
    """Factory for daemon subprocesses with extra environment (not started)."""
    made: list[DaemonProcess] = []

    def make(env: Mapping[str, str] | None = None, name: str = "data") -> DaemonProcess:
        made.append(DaemonProcess(tmp_path / name, tmp_path, env))
        return made[-1]

    try:
        yield make
    finally:
        for process in made:
            process.cleanup()
