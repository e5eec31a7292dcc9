"""ObjectStore over S3 or an S3-compatible server (MinIO, moto), via aiobotocore.

Retries of throttling (SlowDown, 503), 5xx and connection errors are botocore's own (standard or
adaptive mode, bounded by `max_attempts`, exponential backoff with jitter); what is left after
them surfaces as StorageError. Per-key failures of DeleteObjects are not retried here: they come
back in `DeleteResult.errors` and the GC retries them next round.

Opening checks the bucket, so a wrong endpoint, bucket or credential fails at startup with a
message that says which (`map_s3_error`). Credentials are taken from the config or, when not
given, from botocore's chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, profiles, instance
roles); they never appear in a message or a repr.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import zlib
from collections.abc import Sequence
from datetime import datetime
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, fields
from types import TracebackType
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import anyio.to_thread
import botocore.auth
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
)
from botocore.utils import parse_timestamp as botocore_parse_timestamp

from levelzero.core.errors import (
    InvalidInput,
    LevelZeroError,
    ObjectNotFound,
    StorageError,
    StoreRefused,
)
from levelzero.storage.keys_check import (
    check_delete_batch,
    check_list_limit,
    check_object_key,
    check_range,
    check_range_within,
)
from levelzero.storage.protocols import (
    DELETE_BATCH_KEYS_MAX,
    LIST_PAGE_KEYS_MAX,
    DeleteResult,
    ListPage,
    ObjectInfo,
)

MAX_ATTEMPTS_MAX = 20
CONCURRENCY_MAX = 1024

# Error codes that mean "these credentials are not accepted" (as opposed to "not allowed").
CREDENTIAL_ERROR_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "TokenRefreshRequired",
        "InvalidClientTokenId",
        "AuthorizationHeaderMalformed",
    }
)
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})


@dataclass(frozen=True, kw_only=True)
class S3Config:
    """Where and how to reach the bucket. Secrets (keys, a user:password in the endpoint URL)
    are kept out of `repr` and of every message."""

    bucket: str
    endpoint_url: str | None = None  # None: AWS S3
    region: str = "us-east-1"
    path_style: bool = False  # True for MinIO / moto; AWS picks virtual-hosted style
    access_key: str | None = field(default=None, repr=False)  # None: botocore's chain
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    concurrency: int = 64  # sizes the HTTP connection pool
    max_attempts: int = 5  # attempts per request, the first one included (1: no retries)
    retry_mode: Literal["standard", "adaptive"] = "standard"
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    create_bucket: bool = False  # tests and demos: create the bucket if it is missing

    def __post_init__(self) -> None:
        if not self.bucket:
            raise InvalidInput("S3 bucket name is empty")
        if (self.access_key is None) != (self.secret_key is None):
            raise InvalidInput("S3 access key and secret key must be given together (or neither)")
        if not 1 <= self.concurrency <= CONCURRENCY_MAX:
            raise InvalidInput(f"S3 concurrency {self.concurrency} is outside 1..{CONCURRENCY_MAX}")
        if not 1 <= self.max_attempts <= MAX_ATTEMPTS_MAX:
            raise InvalidInput(f"S3 max_attempts {self.max_attempts} is outside 1..{MAX_ATTEMPTS_MAX}")
        if self.retry_mode not in ("standard", "adaptive"):
            raise InvalidInput(f"S3 retry_mode {self.retry_mode!r} is not standard or adaptive")
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise InvalidInput("S3 timeouts must be positive")

    def __repr__(self) -> str:
        shown = {f.name: getattr(self, f.name) for f in fields(self) if f.repr}
        if self.endpoint_url is not None:
            shown["endpoint_url"] = self.where
        return f"S3Config({', '.join(f'{name}={value!r}' for name, value in shown.items())})"

    @property
    def where(self) -> str:
        """The endpoint as shown in messages: without any user:password part."""
        if self.endpoint_url is None:
            return f"AWS S3 ({self.region})"
        parts = urlsplit(self.endpoint_url)
        netloc = parts.netloc.rpartition("@")[2]
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


# The settings an operator fixes these with (levelzero/config.py), named in the messages.
CREDENTIAL_VARIABLES = "LEVELZERO_S3_ACCESS_KEY and LEVELZERO_S3_SECRET_KEY"
CREATE_BUCKET_HINT = (
    "create it, or set s3.create_bucket = true (LEVELZERO_S3_CREATE_BUCKET=true) to have it "
    "created at start-up"
)


def map_s3_error(
    exc: BaseException, *, op: str, bucket: str, where: str, key: str | None = None
) -> LevelZeroError:
    """Turn a botocore failure into the operating error the caller and operator can act on."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        # A HEAD response has no body, so its "code" is just the HTTP status.
        label = code if code and not code.isdigit() else f"HTTP {status}"
        if code == "NoSuchBucket" or (op == "head_bucket" and status == 404):
            missing = f"bucket {bucket} does not exist at {where}"
            if op == "head_bucket":  # opening: say how to have it made (later it went away)
                missing += f": {CREATE_BUCKET_HINT}"
            return _permanent(StorageError(missing))
        if key is not None and (code in _NOT_FOUND_CODES or status == 404):
            return ObjectNotFound(key, f"bucket {bucket} at {where}")
        if code in CREDENTIAL_ERROR_CODES or (op == "head_bucket" and status == 403):
            return _permanent(
                StorageError(
                    f"credentials rejected by {where} ({label} on bucket "
                    f"{bucket}): check s3.access_key and s3.secret_key ({CREDENTIAL_VARIABLES}), "
                    "and that they may use the bucket"
                )
            )
        if code == "AccessDenied" or status == 403:
            return _permanent(
                StorageError(
                    f"access denied by {where}: {op} on bucket {bucket} "
                    f"({label}); the credentials lack a permission"
                )
            )
        target = f"{key!r} in bucket {bucket}" if key is not None else f"bucket {bucket}"
        message = error.get("Message") or ""
        detail = f"{code} (HTTP {status})" if label == code else label
        return StorageError(f"S3 {op} of {target} at {where} failed: {detail} {message}".rstrip())
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return _permanent(
            StorageError(
                f"no S3 credentials for {where}: set {CREDENTIAL_VARIABLES} (s3.access_key and "
                "s3.secret_key), or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or an AWS profile)"
            )
        )
    if isinstance(exc, (EndpointConnectionError, ConnectTimeoutError)):
        return StorageError(f"S3 endpoint {where} is unreachable ({op}): {exc}")
    if isinstance(exc, (ReadTimeoutError, asyncio.TimeoutError)):
        return StorageError(f"S3 {op} timed out at {where}")
    return StorageError(f"S3 {op} at {where} failed: {type(exc).__name__}: {exc}")


def client_config(cfg: S3Config) -> AioConfig:
    """The aiobotocore client settings for `cfg` (the benchmarks' raw clients use the same)."""
    return AioConfig(
        region_name=cfg.region,
        # botocore's own "max_attempts" counts retries only; "total_max_attempts" counts all.
        retries={"total_max_attempts": cfg.max_attempts, "mode": cfg.retry_mode},
        max_pool_connections=cfg.concurrency,
        connect_timeout=cfg.connect_timeout_s,
        read_timeout=cfg.read_timeout_s,
        s3={"addressing_style": "path" if cfg.path_style else "auto"},
    )


def _permanent(error: StorageError) -> StorageError:
    """Configuration problems do not heal by retrying."""
    error.retriable = False
    return error


def parse_timestamp(value: object) -> datetime:
    """botocore's timestamp parser for responses, fast for what S3 lists: ISO 8601 in UTC
    (`2026-11-22T04:10:55.000Z`) goes through `datetime.fromisoformat`; anything else (HTTP
    dates in headers, epoch numbers) through botocore's own parser. botocore's default runs
    every `LastModified` of a listing through dateutil, which was three quarters of the CPU time
    of listing 1000 keys."""
    if isinstance(value, str) and value.endswith("Z") and "T" in value:
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            pass
    return botocore_parse_timestamp(value)


# What a request can fail with once botocore has given up: its own errors, and aiohttp's while
# a response body streams.
_REQUEST_ERRORS = (BotoCoreError, ClientError, aiohttp.ClientError, asyncio.TimeoutError)

# A PUT body of at least this many bytes has its CRC-32 and SHA-256 computed on a worker thread
# (one hop for both: ~50-100 us, against ~14 ms of a 4 MiB L0 object's hashing on the event
# loop); smaller bodies hash on the loop as botocore does.
CHECKSUMS_OFF_LOOP_BYTES_MIN = 256 * 1024


class BodyReader(io.BytesIO):
    """A PUT body read where it lies: each `read` a view of the caller's buffer, no copy.

    Why: aiohttp sends a `BytesIO` body in 256 KiB chunks as the socket drains (what botocore
    makes of a `bytes` body), but joins a `bytearray` or `memoryview` body with the request's
    headers into one fresh copy and writes it to the socket at once. The batcher builds an
    object in a bytearray; sent as it is, a 4 MiB L0 object cost the event loop ~0.35 ms a MB
    more than the same object sent from `bytes` (`levelzero bench --only upload`: the node's
    loop 1.68 against 1.34 ms a MB, the upload 85% against 92% of raw PUTs), and `bytes(body)`
    first is a copy on the loop too. A `BytesIO` subclass takes aiohttp's chunked path; every
    method that reads goes to the view, every other one that would use the `BytesIO` underneath
    (empty) refuses, and botocore
    measures it and rewinds it for a retry with `seek` and `tell`."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        super().__init__()
        self._view = memoryview(data).cast("B")
        self._position = 0

    def read(self, size: int | None = -1) -> memoryview:  # type: ignore[override]
        start, length = self._position, len(self._view)
        end = length if size is None or size < 0 else min(length, start + size)
        self._position = max(start, end)
        return self._view[start : self._position]

    read1 = read  # type: ignore[assignment]

    def readinto(self, buffer: Any) -> int:
        chunk = self.read(len(memoryview(buffer).cast("B")))
        memoryview(buffer).cast("B")[: len(chunk)] = chunk
        return len(chunk)

    def readline(self, _size: int | None = -1) -> bytes:  # not a line-oriented body
        raise io.UnsupportedOperation("a PUT body is read in chunks")

    def readlines(self, _hint: int | None = -1) -> list[bytes]:
        raise io.UnsupportedOperation("a PUT body is read in chunks")

    def __iter__(self) -> BodyReader:  # BytesIO's would iterate the empty buffer underneath
        raise io.UnsupportedOperation("a PUT body is read in chunks")

    def __next__(self) -> bytes:
        raise io.UnsupportedOperation("a PUT body is read in chunks")

    def write(self, _data: Any) -> int:
        raise io.UnsupportedOperation("a PUT body is read only")

    def writelines(self, _lines: Any) -> None:
        raise io.UnsupportedOperation("a PUT body is read only")

    def truncate(self, _size: int | None = None) -> int:
        raise io.UnsupportedOperation("a PUT body is read only")

    def writable(self) -> bool:
        return False

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: len(self._view)}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._position = base + offset
        return self._position

    def tell(self) -> int:
        return self._position

    def getbuffer(self) -> memoryview:
        return self._view[:]

    def getvalue(self) -> bytes:
        return self._view.tobytes()

    def __len__(self) -> int:
        return len(self._view)


# How a precomputed payload SHA-256 reaches the signer: a client parameter of our own, moved
# into the request's context before botocore builds the request (`provide-client-params`),
# read by the S3 SigV4 signer below, chosen for that request alone (`choose-signer`).
_PAYLOAD_SHA256_PARAM = "LevelZeroPayloadSha256"
_PAYLOAD_SHA256_CONTEXT = "levelzero_payload_sha256"
_PRECOMPUTED_SIGNER = "levelzero-s3v4"


def send_puts_without_continue(client: Any) -> None:
    """Register `_no_continue_for_put` on an aiobotocore S3 client (the adapter's, and the
    benchmarks' raw clients', so that a floor waits no more than the adapter does)."""
    client.meta.events.register_last("before-call.s3", _no_continue_for_put)


def _no_continue_for_put(model: Any, params: dict[str, Any], **_: Any) -> None:
    """`before-call.s3`, after botocore's own handler: a PutObject goes without the `Expect:
    100-continue` botocore adds to every body it can `read` (a `BodyReader`), which makes
    aiohttp wait a round trip for the server's go-ahead before it sends the body: a round trip
    more before every L0 object is stored, for a check of the headers alone that the answer
    to the whole request makes anyway."""
    if model.name == "PutObject":
        params["headers"].pop("Expect", None)


class _S3SigV4PrecomputedPayload(botocore.auth.S3SigV4Auth):
    """botocore's S3 SigV4 signer, taking the payload's SHA-256 from the request's context
    (computed off the event loop by `S3ObjectStore.put` over the very bytes sent) instead of
    hashing the body where it signs. Where botocore would not sign the payload at all, it does
    not either. A wrong digest is no silent harm: S3 refuses the request
    (XAmzContentSHA256Mismatch)."""

    def payload(self, request: Any) -> str:
        digest = request.context.get(_PAYLOAD_SHA256_CONTEXT)
        if (
            isinstance(digest, str)
            and not self._is_streaming_checksum_payload(request)
            and self._should_sha256_sign_payload(request)
        ):
            return digest
        result: str = super().payload(request)
        return result


botocore.auth.AUTH_TYPE_MAPS.setdefault(_PRECOMPUTED_SIGNER, _S3SigV4PrecomputedPayload)


def _take_payload_sha256(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    """`provide-client-params.s3.PutObject`: our parameter goes into the context, out of the
    parameters botocore validates."""
    digest = params.pop(_PAYLOAD_SHA256_PARAM, None)
    if digest is not None:
        context[_PAYLOAD_SHA256_CONTEXT] = digest


def _choose_precomputed_signer(context: dict[str, Any], signing_name: str, **_: Any) -> str | None:
    """`choose-signer.s3.PutObject`: the signer above where botocore's operation-specific choice
    would be plain S3 SigV4 (auth type "v4", signing name "s3", payload signing not turned off);
    anything else (S3 Express, SigV4a, unsigned bodies) is left to botocore."""
    if (
        _PAYLOAD_SHA256_CONTEXT in context
        and context.get("auth_type") == "v4"
        and signing_name == "s3"
        and not context.get("unsigned_payload")
    ):
        return _PRECOMPUTED_SIGNER
    return None


def put_checksums(data: bytes | bytearray) -> tuple[str, str]:
    """A PUT body's CRC-32 as the `ChecksumCRC32` parameter takes it (base64 of the big-endian
    value: the header botocore would otherwise compute) and its SHA-256 (hex, as SigV4 signs a
    payload). Both release the GIL: run on a worker thread, the event loop keeps going."""
    crc = base64.b64encode((zlib.crc32(data) & 0xFFFFFFFF).to_bytes(4, "big")).decode("ascii")
    return crc, hashlib.sha256(data).hexdigest()


class S3ObjectStore:
    """`async with S3ObjectStore(config) as store:` or `store = await S3ObjectStore.open(config)`
    followed by `await store.aclose()`."""

    def __init__(self, config: S3Config) -> None:
        self.config = config
        self._stack: AsyncExitStack | None = None
        self._client: Any = None

    @classmethod
    async def open(cls, config: S3Config) -> S3ObjectStore:
        store = cls(config)
        await store._open()
        return store

    async def __aenter__(self) -> S3ObjectStore:
        await self._open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"S3ObjectStore(bucket={self.config.bucket!r}, at={self.config.where!r})"

    async def _open(self) -> None:
        assert self._client is None, "S3ObjectStore opened twice"
        cfg = self.config
        credentials: dict[str, str | None] = {}
        if cfg.access_key is not None:
            credentials = {
                "aws_access_key_id": cfg.access_key,
                "aws_secret_access_key": cfg.secret_key,
                "aws_session_token": cfg.session_token,
            }
        session = get_session()
        session.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=parse_timestamp)
        stack = AsyncExitStack()
        try:
            try:
                client = await stack.enter_async_context(
                    session.create_client(
                        "s3", endpoint_url=cfg.endpoint_url, config=client_config(cfg), **credentials
                    )
                )
            except ValueError as exc:  # botocore: "Invalid endpoint: ..."
                raise StoreRefused(f"S3 endpoint {cfg.where!r} is not usable: {exc}") from exc
            client.meta.events.register("provide-client-params.s3.PutObject", _take_payload_sha256)
            client.meta.events.register("choose-signer.s3.PutObject", _choose_precomputed_signer)
            send_puts_without_continue(client)
            await self._check_bucket(client)
        except StorageError as exc:
            await stack.aclose()
            if exc.retriable:  # an unreachable endpoint may come back: retried by a restart
                raise
            # A missing bucket or rejected credentials: only an operator can fix them, so the
            # daemon exits 2 and systemd does not restart it in a loop.
            raise StoreRefused(str(exc)) from exc
        except BaseException:
            await stack.aclose()
            raise
        self._stack, self._client = stack, client

    async def _check_bucket(self, client: Any) -> None:
        cfg = self.config
        try:
            await client.head_bucket(Bucket=cfg.bucket)
            return
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if not (status == 404 and cfg.create_bucket):
                raise self._error(exc, "head_bucket") from exc
        except _REQUEST_ERRORS as exc:
            raise self._error(exc, "head_bucket") from exc
        create: dict[str, Any] = {"Bucket": cfg.bucket}
        if cfg.region != "us-east-1":
            create["CreateBucketConfiguration"] = {"LocationConstraint": cfg.region}
        try:
            await client.create_bucket(**create)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
                raise self._error(exc, "create_bucket") from exc
        except _REQUEST_ERRORS as exc:
            raise self._error(exc, "create_bucket") from exc

    async def aclose(self) -> None:
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    # -- ObjectStore

    async def put(self, key: str, data: bytes | bytearray) -> None:
        check_object_key(key)
        client = self._require_client()
        # bytes or bytearray as they are, never copied: the batcher hands over the bytearray it
        # built the object in, and changes it no more. A large body goes as a stream read in
        # place (`BodyReader`); a small one as it is (botocore wraps bytes in a BytesIO).
        body = data if isinstance(data, (bytes, bytearray)) else bytes(data)
        request: dict[str, Any] = {"Bucket": self.config.bucket, "Key": key, "Body": body}
        if len(body) >= CHECKSUMS_OFF_LOOP_BYTES_MIN:
            request["Body"] = BodyReader(body)
            # The body's CRC-32 and SHA-256 in one worker-thread hop, handed to botocore: it
            # sends the CRC as the x-amz-checksum-crc32 header (S3 checks it) and signs the
            # SHA-256 as the payload's hash, computing neither on the event loop. Over https
            # the payload is then signed too, not sent unsigned with a trailing CRC-32.
            crc, sha256 = await anyio.to_thread.run_sync(put_checksums, body)
            request["ChecksumCRC32"] = crc
            request[_PAYLOAD_SHA256_PARAM] = sha256
        try:
            await client.put_object(**request)
        except _REQUEST_ERRORS as exc:
            raise self._error(exc, "put_object", key) from exc

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        check_object_key(key)
        check_range(key, offset, length)
        client = self._require_client()
        request: dict[str, Any] = {"Bucket": self.config.bucket, "Key": key}
        ranged = offset > 0 or length is not None
        if length == 0:  # HTTP cannot express an empty range
            return await self._empty_range(key, offset)
        if ranged:
            last = "" if length is None else str(offset + length - 1)
            request["Range"] = f"bytes={offset}-{last}"
        try:
            response = await client.get_object(**request)
            async with response["Body"] as body:
                data: bytes = await body.read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "InvalidRange":
                # The range starts at or after the end; at the end it is just empty.
                return await self._empty_range(key, offset)
            raise self._error(exc, "get_object", key) from exc
        except _REQUEST_ERRORS as exc:
            raise self._error(exc, "get_object", key) from exc
        if ranged and "ContentRange" not in response:
            # A server that ignores Range sends the whole object.
            end = len(data) if length is None else offset + length
            return data[offset:end]
        return data

    async def _empty_range(self, key: str, offset: int) -> bytes:
        info = await self.head(key)
        if info is None:
            raise ObjectNotFound(key, f"bucket {self.config.bucket} at {self.config.where}")
        check_range_within(key, offset, info.size)
        return b""

    async def head(self, key: str) -> ObjectInfo | None:
        check_object_key(key)
        client = self._require_client()
        try:
            response = await client.head_object(Bucket=self.config.bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                return None
            raise self._error(exc, "head_object", key) from exc
        except _REQUEST_ERRORS as exc:
            raise self._error(exc, "head_object", key) from exc
        return ObjectInfo(
            key=key,
            size=int(response["ContentLength"]),
            last_modified=response["LastModified"].timestamp(),
        )

    async def list_page(
        self, prefix: str, start_after: str | None = None, limit: int = LIST_PAGE_KEYS_MAX
    ) -> ListPage:
        check_list_limit(limit, LIST_PAGE_KEYS_MAX)
        client = self._require_client()
        request: dict[str, Any] = {"Bucket": self.config.bucket, "Prefix": prefix, "MaxKeys": limit}
        if start_after is not None:
            request["StartAfter"] = start_after
        try:
            response = await client.list_objects_v2(**request)
        except _REQUEST_ERRORS as exc:
            raise self._error(exc, "list_objects_v2") from exc
        objects = [
            ObjectInfo(
                key=item["Key"],
                size=int(item["Size"]),
                last_modified=item["LastModified"].timestamp(),
            )
            for item in response.get("Contents", [])
        ]
        if not response.get("IsTruncated"):
            return ListPage(objects=objects, next_start_after=None)
        if not objects:
            raise StorageError(
                f"S3 list of {prefix!r} in bucket {self.config.bucket} at {self.config.where} "
                "returned an empty page marked truncated"
            )
        return ListPage(objects=objects, next_start_after=objects[-1].key)

    async def delete_many(self, keys: Sequence[str]) -> DeleteResult:
        unique = check_delete_batch(keys, DELETE_BATCH_KEYS_MAX)
        if not unique:
            return DeleteResult(deleted=[], errors={})
        client = self._require_client()
        try:
            # Quiet: the answer names only the keys that failed. Every other key was deleted
            # (S3's contract), and the server need not render, nor we parse, 1,000 <Deleted>
            # entries per request: that was a third of a GC delete's time on the client.
            response = await client.delete_objects(
                Bucket=self.config.bucket,
                Delete={"Objects": [{"Key": key} for key in unique], "Quiet": True},
            )
        except _REQUEST_ERRORS as exc:
            raise self._error(exc, "delete_objects") from exc
        asked = set(unique)
        errors = {
            item["Key"]: f"{item.get('Code', 'Error')}: {item.get('Message', '')}".rstrip(": ")
            for item in response.get("Errors", [])
            if item.get("Key") in asked
        }
        deleted = [key for key in unique if key not in errors]
        return DeleteResult(deleted=deleted, errors=errors)

    # -- internals

    def _require_client(self) -> Any:
        assert self._client is not None, "S3ObjectStore used before open() or after aclose()"
        return self._client

    def _error(self, exc: BaseException, op: str, key: str | None = None) -> LevelZeroError:
        return map_s3_error(exc, op=op, bucket=self.config.bucket, where=self.config.where, key=key)
