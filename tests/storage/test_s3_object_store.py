"""S3ObjectStore beyond the shared contract: opening errors, error mapping, configuration.

Against moto, credentials are only checked while IAM authentication is switched on
(`/moto-api/reset-auth`); the `s3_auth_enforced` fixture does that for one test.
"""

from __future__ import annotations

import base64
import io
import hashlib
import random
import socket
import threading
import urllib.request
import zlib
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import aiohttp.payload
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

from levelzero.core.errors import InvalidInput, ObjectNotFound, StorageError, StoreRefused
from levelzero.storage import s3_store
from levelzero.storage.s3_store import S3Config, S3ObjectStore, map_s3_error

if TYPE_CHECKING:
    from conftest import S3TestEndpoint


def client_error(code: str, status: int, operation: str = "GetObject") -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": f"{code} message"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        operation,
    )


def mapped(exc: BaseException, op: str = "get_object", key: str | None = "k/1") -> Any:
    return map_s3_error(exc, op=op, bucket="bkt", where="http://minio:9000", key=key)


# ------------------------------------------------------------------- error mapping (unit)


@pytest.mark.parametrize(
    ("code", "status", "op"),
    [
        ("InvalidAccessKeyId", 403, "put_object"),
        ("SignatureDoesNotMatch", 403, "get_object"),
        ("ExpiredToken", 400, "list_objects_v2"),
        ("403", 403, "head_bucket"),  # HEAD has no body: only the status says it
    ],
)
def test_rejected_credentials_are_named_as_such(code: str, status: int, op: str) -> None:
    error = mapped(client_error(code, status), op=op)
    assert isinstance(error, StorageError)
    assert str(error).startswith("credentials rejected by http://minio:9000")
    assert error.retriable is False


def test_missing_bucket_is_named_with_the_endpoint() -> None:
    error = mapped(client_error("NoSuchBucket", 404))
    assert str(error) == "bucket bkt does not exist at http://minio:9000"
    assert error.retriable is False
    head_error = mapped(client_error("404", 404, "HeadBucket"), op="head_bucket", key=None)
    assert str(head_error) == (  # at opening: how to have it made
        "bucket bkt does not exist at http://minio:9000: create it, or set s3.create_bucket = true "
        "(LEVELZERO_S3_CREATE_BUCKET=true) to have it created at start-up"
    )


def test_missing_key_maps_to_object_not_found() -> None:
    error = mapped(client_error("NoSuchKey", 404))
    assert isinstance(error, ObjectNotFound) and error.key == "k/1"


def test_access_denied_is_not_called_a_credential_problem() -> None:
    error = mapped(client_error("AccessDenied", 403), op="delete_objects", key=None)
    assert str(error).startswith("access denied by http://minio:9000")
    assert error.retriable is False


def test_throttling_left_over_after_retries_is_a_retriable_storage_error() -> None:
    error = mapped(client_error("SlowDown", 503), op="put_object")
    assert isinstance(error, StorageError) and error.retriable is True
    assert "SlowDown (HTTP 503)" in str(error)


def test_unreachable_endpoint_and_missing_credentials_are_explained() -> None:
    unreachable = mapped(EndpointConnectionError(endpoint_url="http://minio:9000/bkt"), op="head_bucket")
    assert str(unreachable).startswith("S3 endpoint http://minio:9000 is unreachable")
    assert unreachable.retriable is True
    no_credentials = mapped(NoCredentialsError(), op="head_bucket")
    assert "no S3 credentials for http://minio:9000" in str(no_credentials)
    assert "AWS_ACCESS_KEY_ID" in str(no_credentials)
    assert "set LEVELZERO_S3_ACCESS_KEY and LEVELZERO_S3_SECRET_KEY" in str(no_credentials)


def test_config_keeps_secrets_out_of_repr_and_messages() -> None:
    config = S3Config(
        bucket="bkt",
        endpoint_url="https://user:pa55word@minio.example:9000",
        access_key="AKIAEXAMPLEKEY",
        secret_key="s3cr3t-value",
        session_token="tok3n-value",
    )
    shown = repr(config) + config.where + repr(S3ObjectStore(config))
    for secret in ("AKIAEXAMPLEKEY", "s3cr3t-value", "tok3n-value", "pa55word", "user:"):
        assert secret not in shown
    assert config.where == "https://minio.example:9000"
    assert S3Config(bucket="b", region="eu-west-1").where == "AWS S3 (eu-west-1)"


@pytest.mark.parametrize(
    "settings",
    [
        {"bucket": ""},
        {"bucket": "b", "access_key": "only-the-key"},
        {"bucket": "b", "concurrency": 0},
        {"bucket": "b", "max_attempts": 0},
        {"bucket": "b", "retry_mode": "legacy"},
        {"bucket": "b", "read_timeout_s": 0},
    ],
)
def test_invalid_config_is_rejected(settings: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        S3Config(**settings)


class FakeDeleteClient:
    def __init__(self, response: dict[str, Any]) -> None:
        self.response = response
        self.requests: list[dict[str, Any]] = []

    async def delete_objects(self, **request: Any) -> dict[str, Any]:
        self.requests.append(request)
        return self.response


async def test_delete_many_maps_per_key_errors_of_delete_objects() -> None:
    store = S3ObjectStore(S3Config(bucket="bkt"))
    fake = FakeDeleteClient(
        {
            "Errors": [
                {"Key": "b", "Code": "InternalError", "Message": "try again"},
                {"Key": "zzz", "Code": "InternalError", "Message": "not asked for"},
            ],
        }
    )
    store._client = fake  # a unit test of the response mapping, no endpoint involved
    result = await store.delete_many(["a", "b", "c", "d", "a"])
    # Quiet mode: the answer names the failures; every other key was deleted.
    assert result.deleted == ["a", "c", "d"]
    assert result.errors == {"b": "InternalError: try again"}
    (request,) = fake.requests
    assert request["Delete"] == {
        "Objects": [{"Key": "a"}, {"Key": "b"}, {"Key": "c"}, {"Key": "d"}],
        "Quiet": True,
    }


# -------------------------------------------------------------------- against the endpoint


@pytest.fixture
def s3_auth_enforced(s3_endpoint: S3TestEndpoint) -> Iterator[None]:
    """moto checks credentials only with IAM auth on; a real server always checks them."""
    if not s3_endpoint.is_moto:
        yield
        return

    def set_no_auth_action_count(value: str) -> None:
        request = urllib.request.Request(  # noqa: S310 (the moto server's http URL)
            f"{s3_endpoint.endpoint_url}/moto-api/reset-auth",
            data=value.encode(),
            method="POST",
            headers={"Content-Type": "text/plain"},
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=5):
            pass

    set_no_auth_action_count("0")
    try:
        yield
    finally:
        set_no_auth_action_count("inf")


@pytest.mark.s3
async def test_open_reports_a_missing_bucket(s3_endpoint: S3TestEndpoint) -> None:
    bucket = f"lz-missing-{uuid.uuid4().hex[:16]}"
    with pytest.raises(StorageError) as caught:
        await S3ObjectStore.open(s3_endpoint.config(bucket))
    assert str(caught.value) == (
        f"bucket {bucket} does not exist at {s3_endpoint.endpoint_url}: create it, or set "
        "s3.create_bucket = true (LEVELZERO_S3_CREATE_BUCKET=true) to have it created at start-up"
    )
    assert caught.value.retriable is False
    assert isinstance(caught.value, StoreRefused)  # the daemon exits 2: a restart cannot fix it


@pytest.mark.s3
async def test_open_reports_rejected_credentials(
    s3_endpoint: S3TestEndpoint, s3_bucket: str, s3_auth_enforced: None
) -> None:
    config = s3_endpoint.config(
        s3_bucket, access_key="LZNOSUCHACCESSKEY", secret_key="wrong-secret", max_attempts=1
    )
    with pytest.raises(StorageError) as caught:
        await S3ObjectStore.open(config)
    message = str(caught.value)
    assert isinstance(caught.value, StoreRefused)
    assert message.startswith(f"credentials rejected by {s3_endpoint.endpoint_url}")
    assert "wrong-secret" not in message and "LZNOSUCHACCESSKEY" not in message


@pytest.mark.s3
async def test_requests_with_rejected_credentials_fail_clearly(
    s3_endpoint: S3TestEndpoint, s3_bucket: str, request: pytest.FixtureRequest
) -> None:
    config = s3_endpoint.config(
        s3_bucket, access_key="LZNOSUCHACCESSKEY", secret_key="wrong-secret", max_attempts=1
    )
    if s3_endpoint.is_moto:  # open while moto still accepts anything, then switch auth on
        store = await S3ObjectStore.open(config)
        request.getfixturevalue("s3_auth_enforced")
    else:
        pytest.skip("a real endpoint rejects these credentials already at open")
    try:
        with pytest.raises(StorageError, match="credentials rejected .*InvalidAccessKeyId"):
            await store.put("k", b"v")
    finally:
        await store.aclose()


async def test_open_reports_an_unreachable_endpoint() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = S3Config(
        bucket="b",
        endpoint_url=f"http://127.0.0.1:{port}",
        path_style=True,
        access_key="k",
        secret_key="s",
        max_attempts=1,
        connect_timeout_s=2,
    )
    with pytest.raises(StorageError, match=f"S3 endpoint http://127.0.0.1:{port} is unreachable"):
        await S3ObjectStore.open(config)


@pytest.mark.s3
async def test_open_creates_the_bucket_when_asked(s3_endpoint: S3TestEndpoint) -> None:
    bucket = f"lz-created-{uuid.uuid4().hex[:16]}"
    async with S3ObjectStore(s3_endpoint.config(bucket, create_bucket=True)) as store:
        await store.put("k", b"v")
        assert await store.get("k") == b"v"
        await store.delete_many(["k"])
    # Opening again finds the bucket (and does not try to create it twice).
    async with S3ObjectStore(s3_endpoint.config(bucket, create_bucket=True)) as store:
        assert (await store.list_page("")).objects == []
    client = s3_endpoint.boto3_client()
    client.delete_bucket(Bucket=bucket)
    client.close()


@pytest.mark.s3
async def test_client_is_configured_for_retries_pool_and_path_style(s3_config: S3Config) -> None:
    config = S3Config(
        **{
            **{name: getattr(s3_config, name) for name in s3_config.__dataclass_fields__},
            "concurrency": 7,
            "max_attempts": 4,
            "retry_mode": "adaptive",
        }
    )
    async with S3ObjectStore(config) as store:
        client_config = store._client.meta.config
        assert client_config.retries == {"total_max_attempts": 4, "mode": "adaptive"}
        assert client_config.max_pool_connections == 7
        assert client_config.s3 == {"addressing_style": "path"}
        await store.put("k", b"v")  # adaptive mode works end to end
        assert await store.get("k", 0, 1) == b"v"


async def test_open_rejects_an_endpoint_that_is_not_a_url() -> None:
    config = S3Config(bucket="b", endpoint_url="not a url", access_key="k", secret_key="s")
    with pytest.raises(StoreRefused, match="S3 endpoint 'not a url' is not usable"):
        await S3ObjectStore.open(config)


# ------------------------------------------------------------- a large PUT's checksums


class SentHeaders:
    """The payload hash and CRC-32 headers of every PutObject as it is sent."""

    def __init__(self, store: S3ObjectStore) -> None:
        self.sent: list[tuple[str | None, str | None]] = []
        store._client.meta.events.register("before-send.s3.PutObject", self._note)

    def _note(self, request: Any, **_: Any) -> None:
        headers = {name.lower(): value for name, value in request.headers.items()}
        as_text = [headers.get(n) for n in ("x-amz-content-sha256", "x-amz-checksum-crc32")]
        self.sent.append(tuple(v.decode() if isinstance(v, bytes) else v for v in as_text))  # type: ignore[arg-type]


def true_checksums(data: bytes | bytearray) -> tuple[str, str]:
    crc = base64.b64encode((zlib.crc32(data) & 0xFFFFFFFF).to_bytes(4, "big")).decode()
    return hashlib.sha256(data).hexdigest(), crc


@pytest.mark.s3
async def test_a_large_put_is_hashed_on_a_worker_thread_and_signed_with_that_hash(
    s3_config: S3Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[int] = []
    checksums = s3_store.put_checksums

    def watched(data: bytes | bytearray) -> tuple[str, str]:
        threads.append(threading.get_ident())
        return checksums(data)

    data = bytearray(random.Random(38).randbytes(s3_store.CHECKSUMS_OFF_LOOP_BYTES_MIN + 1))
    async with S3ObjectStore(s3_config) as store:
        headers = SentHeaders(store)
        monkeypatch.setattr(s3_store, "put_checksums", watched)
        await store.put("big", data)
        assert await store.get("big") == data
        # The headers sent are the body's own, computed once, off the loop's thread.
        assert headers.sent == [true_checksums(data)]
        assert len(threads) == 1 and threads[0] != threading.get_ident()
        # botocore signs the digest it is given (it computes none of its own): a digest
        # that is not the body's goes out as it is, for S3 to refuse (moto does not check).
        monkeypatch.setattr(s3_store, "put_checksums", lambda body: ("AAAAAA==", "0" * 64))
        await store.put("big-2", data)
        assert headers.sent[-1] == ("0" * 64, "AAAAAA==")


@pytest.mark.s3
async def test_a_small_put_is_hashed_by_botocore_on_the_loop(
    s3_config: S3Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(s3_store, "put_checksums", lambda body: calls.append(len(body)))
    data = b"x" * (s3_store.CHECKSUMS_OFF_LOOP_BYTES_MIN - 1)
    async with S3ObjectStore(s3_config) as store:
        headers = SentHeaders(store)
        await store.put("small", data)
        assert await store.get("small") == data
    assert calls == []
    assert headers.sent == [true_checksums(data)]  # botocore's own, the same values


def test_a_body_reader_reads_views_of_the_buffer_and_rewinds_for_a_retry() -> None:
    data = bytearray(random.Random(5).randbytes(1000))
    body = s3_store.BodyReader(data)
    assert len(body) == 1000 and body.tell() == 0
    chunks = [body.read(300) for _ in range(4)]
    # Each chunk is a view of the caller's buffer (nothing copied), the last one short.
    assert all(chunk.obj is data for chunk in chunks)
    assert [len(chunk) for chunk in chunks] == [300, 300, 300, 100]
    assert b"".join(chunks) == data and body.read(10) == b"" and body.tell() == 1000
    # botocore measures the body with seek/tell, and rewinds it before a retry.
    assert body.seek(0, io.SEEK_END) == 1000 and body.seek(-10, io.SEEK_CUR) == 990
    assert body.read() == data[990:]
    assert body.seek(0) == 0 and bytes(body.read()) == data
    assert body.getvalue() == data and bytes(body.getbuffer()) == data
    buffer = bytearray(64)
    body.seek(980)
    assert body.readinto(buffer) == 20 and buffer[:20] == data[980:]
    # What would read the empty BytesIO underneath refuses instead.
    for refused in (
        body.readline,
        body.readlines,
        lambda: iter(body),
        lambda: next(body),
        lambda: body.write(b"x"),
        lambda: body.writelines([b"x"]),
        lambda: body.truncate(0),
    ):
        with pytest.raises(io.UnsupportedOperation):
            refused()


@pytest.mark.s3
async def test_a_large_put_is_streamed_from_the_callers_buffer_in_chunks(
    s3_config: S3Config,
) -> None:
    """aiohttp sends a BytesIO body chunk by chunk as the socket drains; a bytearray body it
    joins with the headers into one copy written at once (the event loop's time a MB of an
    upload, `levelzero bench --only upload`). The batcher's objects are bytearrays."""
    data = bytearray(random.Random(39).randbytes(3 * 1024 * 1024 + 7))
    sent: list[Any] = []
    async with S3ObjectStore(s3_config) as store:
        store._client.meta.events.register(
            "before-send.s3.PutObject",
            lambda request, **_: sent.append((request.body, request.headers.get("Expect"))),
        )
        await store.put("streamed", data)
        assert await store.get("streamed") == data
    [(body, expect)] = sent
    # A body botocore can read gets "Expect: 100-continue" from it, a round trip's wait for
    # the server's go-ahead before aiohttp sends the body: taken off again.
    assert expect is None
    assert isinstance(body, io.BytesIO) and len(body) == len(data)
    assert aiohttp.payload.PAYLOAD_REGISTRY.get(body).__class__ is aiohttp.payload.BytesIOPayload
    body.seek(0)
    assert body.read(10).obj is data  # read in place, not a copy of it
