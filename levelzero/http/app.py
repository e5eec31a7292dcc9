"""The HTTP API (Starlette): a thin translation between JSON over HTTP and the `Node`.

Every request body is read under a byte bound and decoded by a typed msgspec decoder; malformed
input is a 400 with a JSON body naming the field, never a traceback. Operating errors
(`LevelZeroError`) map to statuses by their `code`; anything else is a 500 with a log line, and
an `AssertionError` (a violated invariant: a bug) is logged at CRITICAL. No request can take
the daemon down.

    POST /v1/topics                                   create a topic (with its configs)
    GET  /v1/topics                                   list topics
    GET|PUT|PATCH /v1/topics/{topic}/configs          a topic's configs: read, replace, change
    POST /v1/topics/{topic}/partitions/{p}/records    produce (records: key/value base64)
    GET  /v1/topics/{topic}/partitions/{p}/records    fetch (?offset=&max_bytes=)
    GET  /v1/status                                   epoch, M, the outlier partitions, the first
                                                      page of partitions, reconciler, housekeeper, GC
    GET  /v1/status/partitions                        ?after=topic/p&limit=N&topic=: a page of them
    POST /v1/epoch/advance                            bump the cluster epoch now
    POST /v1/gc/run                                   one GC round now ({"dry_run": bool})
    POST /v1/gc/pause  /v1/gc/resume                  stop / restart the GC's own rounds
    GET  /v1/gc/explain                               ?key= or ?epoch=: why (not) deleted
    POST /v1/housekeeper/run                          one housekeeper pass now ({"force": bool})
    GET  /healthz  /readyz  /metrics                  liveness, readiness, Prometheus
"""

from __future__ import annotations

import asyncio
import heapq
import hmac
import ipaddress
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from levelzero.actors.batcher import _ByteBudget as ByteBudget
from levelzero.actors.intake import ProduceIntake, ProduceObserver
from levelzero.actors.gc import WatermarkReading
from levelzero.actors.node import Node
from levelzero.actors.partition import PartitionView
from levelzero.actors.reader import FETCH_BYTES_MAX
from levelzero.core.errors import IdempotencyKeyReused, InvalidInput, LedElsewhere, LevelZeroError
from levelzero.core.keys import parse_l0_key
from levelzero.core.names import unstorable_topic_advice
from levelzero.core.reconcile_health import ABANDON_GIVES_UP
from levelzero.core.l0format import NO_TIMESTAMP, Record
from levelzero.core.topic_configs import INT64_MAX, AlterOp, ConfigSource, describe_topic
from levelzero.core.throttled_warning import ThrottledBugs, ThrottledWarnings
from levelzero.core.txn_marks import RESERVED_HEADER_REFUSAL, client_headers, has_reserved_header, is_marker

from levelzero.http.guard import PROTOCOL_ANSWER_KEY, send_unavailable
from levelzero.http.schema import (
    RETRY_AFTER_S,
    UNSIGNED_MAX,
    AbandonRequest,
    KeyReusedBody,
    BatcherStatus,
    ClusterInfo,
    ClusterNodeInfo,
    CreateTopicRequest,
    EmptyRequest,
    EpochResponse,
    ErrorBody,
    FetchResponse,
    GcRoundSummary,
    GcRunRequest,
    GcStatus,
    HealthResponse,
    HousekeeperRunRequest,
    HousekeeperStatus,
    L1DeletePendingStatus,
    L1ObjectStatus,
    PartitionOutlier,
    PartitionPage,
    PartitionStatus,
    ProduceRequest,
    ProduceResponse,
    RecordOut,
    ReconcileFailingStatus,
    L0CacheStatus,
    ReconcilerStatus,
    CompactorStatus,
    PartitionCompactionStatus,
    StatusResponse,
    TopicConfigOut,
    TopicConfigs,
    TopicConfigsRequest,
    TopicInfo,
    TopicList,
    UnstorableTopic,
)

log = logging.getLogger("levelzero.api")

MiB = 1024 * 1024
# An oversized body is read and thrown away up to this many bytes before the 413 goes out, so
# the client gets the reply instead of a connection reset in the middle of its upload.
DISCARD_BYTES_MAX = 64 * MiB
BLOCKED_BY_SHOWN_MAX = 20
L1_LINEAGE_SHOWN_MAX = 20  # per partition in /v1/status: the newest valid L1 objects
L1_DELETES_PENDING_SHOWN_MAX = 20  # in /v1/status: the oldest failed L1 deletes
# /v1/status stays small with 10,000 partitions: the first page of partitions and the worst
# outliers only; GET /v1/status/partitions pages through the rest.
STATUS_PARTITIONS_SHOWN_MAX = 100
STATUS_OUTLIERS_MAX = 50
STATUS_PAGE_LIMIT_DEFAULT = 100
STATUS_PAGE_LIMIT_MAX = 1000
# Metastore reads of uncached L1 lineages one status page makes at once (right after a start).
STATUS_LINEAGE_READS_MAX = 16
IDEMPOTENCY_KEY_MAX = 256  # characters of a produce's idempotency_key
# Why a partition is an outlier, the most pressing first (the order outliers are shown in).
OUTLIER_REASONS = ("m_holder", "reconcile_failing", "unstorable", "stale_rejections", "reconciler_lag")

STATUS_BY_CODE: dict[str, int] = {
    "invalid_input": 400,
    "invalid_config": 400,
    "policy_violation": 400,
    "invalid_record": 400,
    "internal_topic": 400,
    "malformed_key": 400,
    "unknown_topic": 404,
    "unknown_partition": 404,
    "offset_out_of_range": 404,
    "too_large": 413,
    "stale_cluster_epoch": 409,
    "topic_exists": 409,
    "topic_collides": 409,
    "idempotency_key_reused": 422,
    "not_leader": 503,
    "shutting_down": 503,
    "interrupted": 503,
    "storage_error": 503,
    "corrupt_data": 500,
    "object_not_found": 500,
}
FAILURE_ADVICE = {
    "object_not_found": (
        " (an object the log store names is missing from the object store: deleted by hand, "
        "a bucket emptied or restored from an older backup, a lifecycle rule, another cluster "
        "in the same keyspace; see docs/operating.md, 'A partition that cannot be reconciled')"
    ),
    "corrupt_data": (
        " (stored data does not decode or verify: see docs/operating.md, 'A partition that "
        "cannot be reconciled')"
    ),
}
_UNSIGNED = re.compile(r"^[0-9]{1,18}\Z")  # at most UNSIGNED_MAX
JSON_MEDIA_TYPE = "application/json"
# Counted for a request whose client went away before its body arrived (nginx's number): the
# client's doing, not a server error, so never a "500" in levelzero_http_requests_total.
CLIENT_CLOSED_CODE = "499"


@dataclass(frozen=True, slots=True)
class ApiSettings:
    token: str = ""  # empty: no authentication
    body_bytes_max: int = 8 * MiB
    records_per_request_max: int = 10_000
    fetch_bytes_default: int = 1 * MiB


class ApiMetrics(Protocol):
    """What the API observes and serves at /metrics; the daemon passes its own
    (`daemon.metrics.DaemonMetrics`): a front end never imports the daemon."""

    @property
    def registry(self) -> CollectorRegistry: ...

    @property
    def requests(self) -> Counter: ...  # by route and status code

    def produce_observer(self, protocol: str) -> ProduceObserver: ...


class StorageProblem(Protocol):
    """Whether the storage takes writes (the daemon's `storage_health.StorageHealth`)."""

    def problem(self) -> str | None: ...


class _NoStorageProblem:
    def problem(self) -> str | None:
        return None


class Lifecycle:
    """What the daemon tells the API about itself: ready once listening, stopping at SIGTERM,
    and whether its storage takes writes (`storage`: the daemon's storage health; without it the
    storage is taken as healthy)."""

    def __init__(self, storage: StorageProblem | None = None) -> None:
        self.ready = False
        self.stopping = False
        self.forced = False  # the stop ran past its time: requests still in the app are cancelled
        self.storage: StorageProblem = storage or _NoStorageProblem()
        self.writes_refused: Callable[[], str | None] = lambda: None  # the node's, once serving

    def not_ready_reason(self) -> str | None:
        """Why `/readyz` is 503 now, or None when it is 200."""
        if not self.ready:
            return "the daemon is starting"
        if self.stopping:
            return "the daemon is shutting down"
        problem = self.storage.problem()
        if problem:
            return f"storage unhealthy: {problem}"
        return self.writes_refused()


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


_encoder = msgspec.json.Encoder()
_decoders: dict[type, msgspec.json.Decoder[Any]] = {
    CreateTopicRequest: msgspec.json.Decoder(CreateTopicRequest),
    TopicConfigsRequest: msgspec.json.Decoder(TopicConfigsRequest),
    ProduceRequest: msgspec.json.Decoder(ProduceRequest),
    GcRunRequest: msgspec.json.Decoder(GcRunRequest),
    HousekeeperRunRequest: msgspec.json.Decoder(HousekeeperRunRequest),
    AbandonRequest: msgspec.json.Decoder(AbandonRequest),
    EmptyRequest: msgspec.json.Decoder(EmptyRequest),
}


def _json(body: msgspec.Struct, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_encoder.encode(body), status, headers, media_type="application/json")


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    return _json(ErrorBody(code, message), status, headers)


def _decode(cls: type, body: bytes):  # noqa: ANN202 - returns an instance of cls
    if not body:
        raise ApiError(400, "malformed_request", "the request needs a JSON body")
    try:
        return _decoders[cls].decode(body)
    except msgspec.ValidationError as exc:
        raise ApiError(400, "malformed_request", f"invalid request body: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, "malformed_request", f"request body is not valid JSON: {exc}") from None
    except UnicodeDecodeError:  # msgspec's own error for a string (or field name) not in UTF-8
        raise ApiError(
            400, "malformed_request", "request body is not valid JSON: a string is not UTF-8"
        ) from None


def _decode_optional(cls: type, body: bytes):  # noqa: ANN202 - returns an instance of cls
    """A body whose every field has a default: no body (or only whitespace) means defaults."""
    return cls() if not body.strip() else _decode(cls, body)


def _require_json(request: Request) -> None:
    """Every POST says `Content-Type: application/json`, body or not. A web page can send a
    cross-site POST only as a form or text/plain (or without a type) unless a CORS preflight
    allows more, which this daemon never does, so no page can change a daemon's state."""
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != JSON_MEDIA_TYPE:
        shown = repr(media_type) if media_type else "none"
        raise ApiError(
            415,
            "unsupported_media_type",
            f"POST needs Content-Type: {JSON_MEDIA_TYPE} (got {shown})",
        )


def _host_name(header: str) -> str:
    """A Host header's name without its port (an IPv6 literal keeps its brackets)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header.partition("]")[0] + "]"
    return header.rpartition(":")[0] if ":" in header else header


def _is_loopback_name(host: str) -> bool:
    if host in ("localhost", "[::1]") or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _single(params, name: str) -> str | None:  # noqa: ANN001 - starlette QueryParams
    values = params.getlist(name)
    if len(values) > 1:
        raise ApiError(400, "malformed_request", f"query parameter {name!r} given more than once")
    return values[0] if values else None


def _unsigned(name: str, text: str, low: int = 0, high: int = UNSIGNED_MAX) -> int:
    """A query or path parameter that is an integer in low..high; one message for each way it
    is not, naming the same range."""
    if _UNSIGNED.match(text) and low <= int(text) <= high:
        return int(text)
    shown = text if len(text) <= 40 else f"{text[:40]}..."
    if text.isascii() and text.isdigit():  # digits, out of the range (or more than 18 of them)
        bound = f"at most {high}" if low == 0 else f"{low}..{high}"
        raise ApiError(400, "malformed_request", f"{name} {shown} is out of range ({bound})")
    kind = "a non-negative integer" if low == 0 else f"an integer in {low}..{high}"
    raise ApiError(400, "malformed_request", f"{name} must be {kind}, not {shown!r}")


class Api:
    def __init__(
        self,
        node: Node,
        settings: ApiSettings,
        metrics: ApiMetrics,
        lifecycle: Lifecycle,
        intake: ProduceIntake,
    ) -> None:
        self.node = node
        self.intake = intake
        self.settings = settings
        self.metrics = metrics
        self._observe_produce = metrics.produce_observer("http")
        self.lifecycle = lifecycle
        self._token = settings.token.encode()
        # A retriable failure (a store outage) meets every request: one line per error code
        # every 10 s, with the count of those held back, not one line per request.
        self._retriable_failures = ThrottledWarnings(log, time.monotonic)
        self._failures = ThrottledWarnings(log, time.monotonic, level=logging.ERROR)
        # A bug meets every retry of the request that found it: its traceback at most once an
        # interval per route and kind of error, with the count of those held back.
        self._bugs = ThrottledBugs(log, time.monotonic)

    # ------------------------------------------------------------------ plumbing

    def route(
        self,
        path: str,
        handlers: dict[str, Callable[[Request], Awaitable[Response]]],
        *,
        params: frozenset[str] = frozenset(),
        public: bool = False,
    ) -> Route:
        """The route at `path`: its handler by method, answering an error in JSON whatever
        happens; `params`: the query parameters its handlers read (any other is refused)."""

        async def endpoint(request: Request) -> Response:
            # Starlette answers HEAD on GET routes; HEAD runs the GET handler.
            handler = handlers.get(request.method) or handlers["GET"]
            if (answered := request.scope.get(PROTOCOL_ANSWER_KEY)) is not None:
                return self._answered_by_protocol(path, answered)
            if "transfer-encoding" in request.headers and "content-length" in request.headers:
                # RFC 9112 6.3: a server may refuse it and must close the connection after:
                # behind a proxy that reads the other header, what follows the body could be
                # a request the proxy never saw (request smuggling).
                self.metrics.requests.labels(path, "400").inc()
                return error_response(
                    400,
                    "malformed_request",
                    "a request with both Content-Length and Transfer-Encoding is refused",
                    {"Connection": "close"},
                )
            try:
                if not public:
                    self._authenticate(request)
                unknown = sorted(set(request.query_params) - params)
                if unknown:
                    raise ApiError(400, "malformed_request", f"unknown query parameter {unknown[0]!r}")
                if request.method in ("POST", "PUT", "PATCH"):
                    _require_json(request)
                response = await handler(request)
            except ClientDisconnect:
                if (answered := request.scope.get(PROTOCOL_ANSWER_KEY)) is not None:
                    return self._answered_by_protocol(path, answered)
                log.info(
                    "%s %s: the client closed the connection before its request body arrived",
                    request.method,
                    request.url.path,
                )
                self.metrics.requests.labels(path, CLIENT_CLOSED_CODE).inc()
                return error_response(400, "client_closed", "the client closed the connection")
            except ApiError as exc:
                headers = {
                    401: {"WWW-Authenticate": "Bearer"},
                    503: {"Retry-After": str(RETRY_AFTER_S)},
                }.get(exc.status)
                response = error_response(exc.status, exc.code, exc.message, headers)
            except LevelZeroError as exc:
                response = self._operating_error(request, exc)
            except AssertionError as exc:
                self._bugs.failed(
                    exc,
                    (path, request.method),
                    "BUG: invariant violated while serving %s %s",
                    request.method,
                    request.url.path,
                )
                response = error_response(500, "internal_error", "internal error (a bug; logged)")
            except Exception as exc:  # noqa: BLE001 - logged (throttled), answered 500
                self._bugs.failed(
                    exc,
                    (path, request.method),
                    "unexpected error serving %s %s",
                    request.method,
                    request.url.path,
                )
                response = error_response(500, "internal_error", "internal error (logged)")
            self.metrics.requests.labels(path, str(response.status_code)).inc()
            return response

        return Route(path, endpoint, methods=list(handlers))

    def _answered_by_protocol(self, path: str, status: int) -> Response:
        """The request's body was not HTTP and the server answered it already (http_guard):
        counted as that answer; the response returned here is never sent."""
        self.metrics.requests.labels(path, str(status)).inc()
        return error_response(status, "malformed_request", "answered by the server")

    def _authenticate(self, request: Request) -> None:
        if not self._token:
            # No token: a loopback listener only (the configuration refuses any other), so
            # every client names a loopback address. A page whose own name its DNS turned to
            # 127.0.0.1 (DNS rebinding) is same-origin to the browser, and its requests name
            # the page's host: refused, as the JSON content type alone could not.
            host = _host_name(request.headers.get("host", ""))
            if not _is_loopback_name(host):
                raise ApiError(
                    403,
                    "forbidden_host",
                    f"Host {host[:80]!r} is not a loopback name: without server.token the daemon "
                    "answers only requests to localhost, 127.0.0.1 or [::1] (set a token to serve "
                    "others)",
                )
            return
        header = request.headers.get("authorization", "")
        scheme, _, credentials = header.partition(" ")
        if scheme.lower() != "bearer" or not credentials:
            raise ApiError(401, "unauthorized", "missing bearer token (Authorization: Bearer ...)")
        if not hmac.compare_digest(credentials.strip().encode(), self._token):
            raise ApiError(401, "unauthorized", "invalid bearer token")

    def _operating_error(self, request: Request, exc: LevelZeroError) -> Response:
        if isinstance(exc, LedElsewhere) and exc.leader_url:
            # Redirect rather than forward: the leader does the work once, the client learns
            # where the partition is, and 307 keeps the method and the body.
            location = exc.leader_url.rstrip("/") + request.url.path
            if request.url.query:
                location += "?" + request.url.query
            return error_response(307, exc.code, str(exc), {"Location": location})
        status = STATUS_BY_CODE.get(exc.code, 500)
        if isinstance(exc, IdempotencyKeyReused) and exc.first is not None:
            base, count = exc.first
            return _json(KeyReusedBody(exc.code, str(exc), base, base + count - 1), status)
        if status >= 500 and exc.retriable:
            self._retriable_failures.warn(
                exc.code, "%s %s failed: %s: %s", request.method, request.url.path, exc.code, exc
            )
        elif status >= 500:
            # Every read of a lost object fails alike: once an interval per code, with the rest
            # counted ("N more like it"), and what it means.
            self._failures.warn(
                exc.code,
                "%s %s failed: %s: %s%s",
                request.method,
                request.url.path,
                exc.code,
                exc,
                FAILURE_ADVICE.get(exc.code, ""),
            )
        headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
        return error_response(status, exc.code, str(exc), headers)

    async def _read_body(self, request: Request) -> bytes:
        limit = self.settings.body_bytes_max
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > DISCARD_BYTES_MAX:
            raise self._too_large(int(declared))
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size <= limit:
                chunks.append(chunk)
            elif size > DISCARD_BYTES_MAX:
                break
        if size > limit:
            raise self._too_large(size)
        return b"".join(chunks)

    def _too_large(self, size: int) -> ApiError:
        return ApiError(
            413,
            "too_large",
            f"request body of {size} bytes exceeds body_bytes_max {self.settings.body_bytes_max}",
        )

    async def _partition_path(self, request: Request) -> tuple[str, int]:
        topic = request.path_params["topic"]
        partition = _unsigned("partition", request.path_params["partition"])
        # UnknownTopic / UnknownPartition -> 404; in a cluster, LedElsewhere -> 307 or 503
        await self.node.led_partition(topic, partition)
        return topic, partition

    def _check_serving(self) -> None:
        if self.lifecycle.stopping or not self.node.accepting:
            raise ApiError(503, "shutting_down", "the daemon is shutting down or not ready")

    # ------------------------------------------------------------------ topics

    async def create_topic(self, request: Request) -> Response:
        body: CreateTopicRequest = _decode(CreateTopicRequest, await self._read_body(request))
        self._check_serving()
        rows = await self.node.create_topic(body.name, body.partitions, body.configs)
        return _json(TopicInfo(body.name, len(rows)), 201)

    async def topic_configs(self, request: Request) -> Response:
        topic = request.path_params["topic"]
        configs = self.node.topic_configs
        if request.method in ("PUT", "PATCH"):
            body: TopicConfigsRequest = _decode(TopicConfigsRequest, await self._read_body(request))
            self._check_serving()
            if request.method == "PUT":
                await configs.replace(topic, list(body.configs.items()))
            else:
                ops = [
                    (AlterOp.DELETE if value is None else AlterOp.SET, name, value)
                    for name, value in body.configs.items()
                ]
                await configs.alter(topic, ops)
        stored = await configs.stored(topic)
        sources = {
            ConfigSource.DYNAMIC_TOPIC_CONFIG: "topic",
            ConfigSource.STATIC_BROKER_CONFIG: "node",
            ConfigSource.DEFAULT_CONFIG: "default",
        }
        entries = [
            TopicConfigOut(e.name, e.value, sources[e.source], e.is_default)
            for e in describe_topic(stored, configs.broker)
        ]
        return _json(TopicConfigs(topic, entries))

    async def delete_topic(self, request: Request) -> Response:
        """The topic goes at once (unknown_topic from then on; a topic made again with its
        name starts empty); the GC's rounds collect its objects (docs/operating.md)."""
        self._check_serving()
        topic = request.path_params["topic"]
        rows = await self.node.delete_topic(topic)  # UnknownTopic -> 404
        return _json(TopicInfo(topic, len(rows)))

    async def cluster(self, request: Request) -> Response:
        member = self.node.member
        if member is None:
            total = len(self.node.partitions())
            return _json(ClusterInfo(False, None, [], total, 0))
        await member.refresh()
        view = member.view
        assert view is not None
        led: dict[str, int] = {}
        without = 0
        live = {n.node_id for n in view.nodes if n.lease_expires_at > view.now}
        for lease in view.leases:
            if lease.node_id in live and lease.lease_expires_at > view.now:
                led[lease.node_id] = led.get(lease.node_id, 0) + 1
            else:
                without += 1
        nodes = [
            ClusterNodeInfo(
                n.node_id,
                n.advertise_url,
                n.node_id in live,
                n.draining,
                led.get(n.node_id, 0),
                round(n.lease_expires_at - view.now, 3),
            )
            for n in view.nodes
        ]
        return _json(ClusterInfo(True, member.node_id, nodes, len(view.leases), without))

    async def list_topics(self, request: Request) -> Response:
        topics = sorted(self.node.topics().items())
        return _json(TopicList([TopicInfo(name, count) for name, count in topics]))

    # ------------------------------------------------------------------ records

    async def produce(self, request: Request) -> Response:
        topic, partition = await self._partition_path(request)
        body: ProduceRequest = _decode(ProduceRequest, await self._read_body(request))
        count = len(body.records)
        if any(r.timestamp_ms is not None and not 0 <= r.timestamp_ms <= INT64_MAX for r in body.records):
            raise ApiError(
                400, "malformed_request", f"timestamp_ms must be in 0..{INT64_MAX} (ms since the epoch)"
            )
        if count == 0:
            raise ApiError(400, "malformed_request", "records must hold at least one record")
        if any(has_reserved_header(r.headers) for r in body.records):
            raise ApiError(400, "malformed_request", RESERVED_HEADER_REFUSAL)
        if count > self.settings.records_per_request_max:
            raise ApiError(
                413,
                "too_large",
                f"{count} records exceed records_per_request_max {self.settings.records_per_request_max}",
            )
        self._check_serving()
        # Over batch_bytes_max by the one size rule (core.produce_size), which the batcher
        # applies to every request: TooLarge, a 413.
        started = time.perf_counter()
        # A record sent without a timestamp gets the time the daemon received it, as a Kafka
        # producer stamps every record it sends (or as a topic of LogAppendTime would): stored
        # without one, Kafka consumers read -1 (Kafka Streams' default extractor refuses it) and
        # lookups by time passed it over. The idempotency key's digest is of the records as sent.
        now_ms = int(time.time() * 1000)
        records = [
            Record(
                r.key,
                r.value,
                now_ms if r.timestamp_ms is None else r.timestamp_ms,
                tuple(r.headers) if r.headers else (),
            )
            for r in body.records
        ]
        if body.idempotency_key is not None:
            if not 1 <= len(body.idempotency_key) <= IDEMPOTENCY_KEY_MAX:
                raise ApiError(
                    400, "malformed_request", f"idempotency_key must hold 1..{IDEMPOTENCY_KEY_MAX} characters"
                )
            unstamped = {"timestamp_ms": NO_TIMESTAMP}
            sent = [
                r if given.timestamp_ms is not None else msgspec.structs.replace(r, **unstamped)
                for r, given in zip(records, body.records, strict=True)
            ]
            try:
                base, count, duplicate = await self.intake.produce_once(
                    topic, partition, records, body.idempotency_key, as_sent=sent
                )
            except Exception:
                self._observe_produce(time.perf_counter() - started, False)
                raise
            self._observe_produce(time.perf_counter() - started, True)
            return _json(ProduceResponse(base, base + count - 1, 1, duplicate))
        try:
            result = await self.intake.produce(topic, partition, records)
        except Exception:
            self._observe_produce(time.perf_counter() - started, False)
            raise
        self._observe_produce(time.perf_counter() - started, True)
        return _json(ProduceResponse(result.base_offset, result.last_offset, result.attempts))

    async def fetch(self, request: Request) -> Response:
        topic, partition = await self._partition_path(request)
        params = request.query_params
        offset_text, max_bytes_text = _single(params, "offset"), _single(params, "max_bytes")
        if offset_text is not None:
            offset = _unsigned("offset", offset_text)
        else:
            offset = self.node.partition(topic, partition).state.first_readable_offset
        max_bytes = self.settings.fetch_bytes_default
        if max_bytes_text is not None:
            max_bytes = _unsigned("max_bytes", max_bytes_text, 1, FETCH_BYTES_MAX)
        result = await self.node.fetch(topic, partition, offset, max_bytes)
        # As a Kafka consumer reads: no transaction markers (their offsets are gaps), and a
        # transaction's records without the reserved header (core.txn_marks).
        return _json(
            FetchResponse(
                records=[
                    RecordOut(
                        r.offset,
                        r.key,
                        r.value,
                        None if r.timestamp_ms == NO_TIMESTAMP else r.timestamp_ms,
                        list(client_headers(r.headers)) or None,
                    )
                    for r in result.records
                    if not is_marker(r.headers)
                ],
                next_offset=result.next_offset,
                high_watermark=result.high_watermark,
                start_offset=result.start_offset,
                tier=result.tier,
            )
        )

    # ------------------------------------------------------------------ operations

    def _status_views(self, topic: str | None) -> list[PartitionView]:
        if topic is not None and topic not in self.node.topics():
            self.node.partition(topic, 0)  # raises UnknownTopic
        return [v for v in self.node.views() if topic is None or v.topic == topic]

    async def _page(
        self, views: list[PartitionView], after: tuple[str, int] | None, limit: int
    ) -> tuple[list[PartitionStatus], str | None]:
        """The first `limit` partitions after `after` in (topic, partition) order: a heap
        selection (n log limit), then the page's own statuses, L1 lineage only for the page:
        the catalog's cached one, or for a partition nothing cached yet (right after a start)
        the metastore's, read for the page's partitions only, `STATUS_LINEAGE_READS_MAX` at once."""
        assert limit >= 1, limit
        later = (v for v in views if after is None or (v.topic, v.partition) > after)
        chosen = heapq.nsmallest(limit + 1, later, key=lambda v: (v.topic, v.partition))
        more = len(chosen) > limit
        shown = chosen[:limit]
        # The actors themselves, not `Node.partition`: status shows a partition whose lease ran
        # out here (a node cut off from the control plane) rather than redirecting the request.
        by_name = self.node.partitions_by_name()
        actors = [by_name[v.name] for v in shown]
        lineages: list[list[dict[str, int | str]] | None] = [None] * len(shown)
        failures: list[str] = []
        limiter = anyio.CapacityLimiter(STATUS_LINEAGE_READS_MAX)

        async def read(i: int) -> None:
            async with limiter:
                try:
                    lineages[i] = await self.node.l1.status_lineage(actors[i])
                except LevelZeroError as exc:  # shown as unknown: status answers without it
                    failures.append(f"{actors[i].name}: {exc}")

        async with anyio.create_task_group() as tg:
            for i in range(len(shown)):
                tg.start_soon(read, i)
        if failures:
            log.warning(
                "status: the L1 lineage of %d partitions could not be read, shown as unknown (%s)",
                len(failures),
                failures[0],
            )
        page = [self._partition_status(v, lineage) for v, lineage in zip(shown, lineages, strict=True)]
        return page, (f"{page[-1].topic}/{page[-1].partition}" if more else None)

    def _partition_status(
        self, v: PartitionView, lineage: list[dict[str, int | str]] | None
    ) -> PartitionStatus:
        return PartitionStatus(
            topic=v.topic,
            partition=v.partition,
            term=v.term,
            window=v.fence.window,
            previous_applied_epoch=v.state.previous_applied_epoch,
            max_applied_epoch=v.state.max_applied_epoch,
            min_epoch_lower_bound=v.state.min_epoch_lower_bound,
            mp=v.published_mp,
            lro=v.state.lro,
            lrlo=v.state.lrlo,
            high_watermark=v.state.high_watermark,
            start_offset=v.state.first_readable_offset,
            size_bytes=v.state.size_bytes,
            readers=v.readers,
            pending_records=v.pending_records,
            read_units=v.fence.read_units,
            window_slides=v.fence.window_slides,
            stale_rejections=v.fence.stale_rejections,
            last_rejected_gap=v.fence.last_rejected_gap,
            new_epoch_fences=v.fence.new_epoch_fences,
            same_epoch_fences=v.fence.same_epoch_fences,
            reconciler_lag=v.reconciler_lag,
            l1_objects=None if lineage is None else len(lineage),
            l1_lineage=None
            if lineage is None
            else [
                # the lineage rows carry exactly L1ObjectStatus's fields, typed int | str
                L1ObjectStatus(**row)  # type: ignore[arg-type]
                for row in lineage[-L1_LINEAGE_SHOWN_MAX:]
            ],
        )

    async def status(self, request: Request) -> Response:
        views = self._status_views(_single(request.query_params, "topic"))
        not_accepting = self.lifecycle.not_ready_reason() or (
            None if self.node.accepting else "the node is not accepting requests"
        )
        reading = self.node.gc.watermark()
        decision = None if reading is None else reading.decision
        holders = [] if decision is None else list(decision.holders[:BLOCKED_BY_SHOWN_MAX])
        blocked_by = [] if decision is None else list(decision.blocked_by[:BLOCKED_BY_SHOWN_MAX])
        leaders = self.node.partition_leaders()
        stats = self.node.batcher.stats
        partitions, next_after = await self._page(views, None, STATUS_PARTITIONS_SHOWN_MAX)
        outliers, outliers_count = status_outliers(self.node, views, reading)
        return _json(
            StatusResponse(
                cluster_epoch=self.node.epochs.current,
                cached_epoch=self.node.epoch_cache.cached,
                m=None if decision is None else decision.m,
                m_holders=holders,
                m_blocked_by=blocked_by,
                m_blocked_count=0 if decision is None else len(decision.blocked_by),
                m_read_at=None if reading is None else reading.read_at,
                m_led_by={name: leaders[name] for name in holders + blocked_by if name in leaders},
                m_holders_count=0 if decision is None else len(decision.holders),
                accepting=not_accepting is None,
                not_accepting_reason=not_accepting,
                partitions=partitions,
                partitions_total=len(views),
                partitions_next_after=next_after,
                outliers=outliers,
                outliers_count=outliers_count,
                batcher=BatcherStatus(
                    objects_uploaded=stats.objects_uploaded,
                    bytes_uploaded=stats.bytes_uploaded,
                    records_appended=stats.records_appended,
                    stale_rejections=stats.stale_rejections,
                    stale_retries=stats.stale_retries,
                    stale_failures=stats.stale_failures,
                    orphan_objects=stats.orphan_objects,
                    inflight_bytes=stats.inflight_bytes,
                ),
                reconciler=reconciler_status(self.node),
                l0_cache=l0_cache_status(self.node),
                compactor=compactor_status(self.node),
                housekeeper=housekeeper_status(self.node),
                gc=gc_status(self.node),
                unstorable_topics=[
                    UnstorableTopic(name, problem, unstorable_topic_advice(name, problem))
                    for name, problem in sorted(self.node.unstorable_topics.items())
                ],
            )
        )

    async def status_partitions(self, request: Request) -> Response:
        """A page of partition statuses: ?after=topic/p (exclusive), ?limit=N, ?topic=."""
        params = request.query_params
        limit_text = _single(params, "limit")
        limit = STATUS_PAGE_LIMIT_DEFAULT if limit_text is None else _unsigned("limit", limit_text)
        if not 1 <= limit <= STATUS_PAGE_LIMIT_MAX:
            raise ApiError(400, "malformed_request", f"limit must be 1..{STATUS_PAGE_LIMIT_MAX}, not {limit}")
        after_text = _single(params, "after")
        after = None if after_text is None else _partition_cursor(after_text)
        views = self._status_views(_single(params, "topic"))
        page, next_after = await self._page(views, after, limit)
        return _json(PartitionPage(page, len(views), next_after))

    async def advance_epoch(self, request: Request) -> Response:
        _decode_optional(EmptyRequest, await self._read_body(request))
        self._check_serving()
        return _json(EpochResponse(await self.node.epochs.advance()))

    # ------------------------------------------------------------------ GC and housekeeping

    async def gc_run(self, request: Request) -> Response:
        """One round now, also while paused (pause stops only the GC's own rounds)."""
        body: GcRunRequest = _decode_optional(GcRunRequest, await self._read_body(request))
        self._check_serving()
        return _json(await self.node.gc.run_round(dry_run=body.dry_run))

    async def gc_pause(self, request: Request) -> Response:
        _decode_optional(EmptyRequest, await self._read_body(request))
        self.node.gc.pause()
        log.info("gc paused over the API")
        return _json(gc_status(self.node))

    async def gc_resume(self, request: Request) -> Response:
        _decode_optional(EmptyRequest, await self._read_body(request))
        self.node.gc.resume()
        log.info("gc resumed over the API")
        return _json(gc_status(self.node))

    async def gc_explain(self, request: Request) -> Response:
        params = request.query_params
        key, epoch_text = _single(params, "key"), _single(params, "epoch")
        if (key is None) == (epoch_text is None):
            raise ApiError(400, "malformed_request", "give exactly one of key=L0_KEY or epoch=N")
        epoch = None
        if key is not None:
            parse_l0_key(key)  # MalformedKey (400) names the key
        else:
            assert epoch_text is not None
            epoch = _unsigned("epoch", epoch_text)
            if epoch < 1:
                raise ApiError(400, "malformed_request", "epoch must be >= 1 (epochs start at 1)")
        return _json(await self.node.gc.explain(key=key, epoch=epoch))

    async def housekeeper_run(self, request: Request) -> Response:
        body: HousekeeperRunRequest = _decode_optional(HousekeeperRunRequest, await self._read_body(request))
        self._check_serving()
        await self.node.housekeeper.run_round(force=body.force)
        return _json(housekeeper_status(self.node))

    async def abandon_unreconciled(self, request: Request) -> Response:
        """The operator's escape hatch for a partition whose L0 data is gone for good."""
        body: AbandonRequest = _decode(AbandonRequest, await self._read_body(request))
        if body.confirm is not True:
            raise InvalidInput(f"abandon-unreconciled needs confirm=true: it {ABANDON_GIVES_UP}")
        _unsigned("partition", str(body.partition))  # as in a path: -1 is refused, not unknown
        self._check_serving()
        done = await self.node.abandon_unreconciled(
            body.topic, body.partition, operator=body.operator, reason=body.reason
        )
        return _json(done)

    async def healthz(self, request: Request) -> Response:
        return _json(HealthResponse("ok"))

    async def readyz(self, request: Request) -> Response:
        if not self.lifecycle.ready:
            raise ApiError(503, "not_ready", "the daemon is starting")
        self._check_serving()
        problem = self.lifecycle.storage.problem()
        if problem:
            raise ApiError(503, "storage_error", f"not ready: storage unhealthy: {problem}")
        return _json(HealthResponse("ready"))

    async def metrics_text(self, request: Request) -> Response:
        # Runs on the event loop: the collectors read the node, which only that loop mutates.
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _partition_cursor(text: str) -> tuple[str, int]:
    topic, slash, number = text.rpartition("/")
    if not slash or not topic or not _UNSIGNED.match(number):
        raise ApiError(400, "malformed_request", f"after must be TOPIC/PARTITION (e.g. t/0), not {text!r}")
    return topic, int(number)


def status_outliers(
    node: Node, views: list[PartitionView], reading: WatermarkReading | None
) -> tuple[list[PartitionOutlier], int]:
    """The partitions worth an operator's look (the STATUS_OUTLIERS_MAX most pressing, first)
    and how many there are; the worst first: holding M back (its M(p) is
    M while another partition's is above), lagging the reconciler, rejecting stale appends,
    failing to reconcile, or in a topic today's name rule refuses. One pass over the views and
    a bounded heap selection (n log STATUS_OUTLIERS_MAX), no sort of every partition."""
    holders: set[str] = set()
    if reading is not None and reading.decision.m is not None:
        highest = max((mp for mp in reading.mps.values() if mp is not None), default=None)
        if highest is not None and highest > reading.decision.m:
            holders = set(reading.decision.holders)
    failing = {f.partition for f in node.reconciler.health.failing()}
    unstorable = node.unstorable_topics
    found = []
    for v in views:
        lag = v.reconciler_lag
        hits = (
            v.name in holders,
            v.name in failing,
            v.topic in unstorable,
            v.fence.stale_rejections > 0,
            lag > 0,
        )
        reasons = [reason for reason, hit in zip(OUTLIER_REASONS, hits, strict=True) if hit]
        if reasons:
            found.append(PartitionOutlier(v.name, reasons, v.published_mp, lag, v.fence.stale_rejections))
    shown = heapq.nsmallest(
        STATUS_OUTLIERS_MAX,
        found,
        key=lambda o: (
            min(OUTLIER_REASONS.index(r) for r in o.reasons),
            -len(o.reasons),
            -o.reconciler_lag,
            -o.stale_rejections,
            o.partition,
        ),
    )
    return shown, len(found)


def compactor_status(node: Node) -> CompactorStatus:
    stats = node.compactor.stats
    return CompactorStatus(
        rounds=stats.rounds,
        passes=stats.passes,
        refused=stats.refused,
        bytes_read=stats.bytes_read,
        bytes_written=stats.bytes_written,
        errors=stats.errors,
        partitions=[
            PartitionCompactionStatus(
                partition=name,
                dirty_ratio=round(p.dirty_ratio, 4),
                last_compaction_at=p.last_compaction_at,
                bytes_reclaimed=p.bytes_reclaimed,
                records_removed=p.records_removed,
                tombstones_dropped=p.tombstones_dropped,
                cleaner_offsets={str(t): end for t, end in sorted(p.cleaner_offsets.items())},
                passes=p.passes,
                refused=p.refused,
                not_compacted=p.not_compacted,
            )
            for name, p in sorted(node.compactor.partitions.items())[:STATUS_PARTITIONS_SHOWN_MAX]
        ],
    )


def l0_cache_status(node: Node) -> L0CacheStatus:
    stats = node.l0_cache.statistics()
    return L0CacheStatus(
        bytes_max=stats.bytes_max,
        held_bytes=stats.held_bytes,
        inflight_bytes=stats.inflight_bytes,
        objects=stats.objects,
        hits=stats.hits,
        shared=stats.shared,
        loads=stats.loads,
        uncached_gets=stats.uncached_gets,
        evictions=stats.evictions,
        hit_ratio=round(stats.hit_ratio, 4),
        load_every=stats.load_every,
        released=stats.released,
    )


def reconciler_status(node: Node) -> ReconcilerStatus:
    stats = node.reconciler.stats
    pending = node.l1.pending_deletes
    return ReconcilerStatus(
        rounds=stats.rounds,
        objects_written=stats.objects_written,
        bytes_written=stats.bytes_written,
        records_reconciled=stats.records_reconciled,
        catch_ups_rejected=stats.catch_ups_rejected,
        errors=stats.errors,
        lag_offsets=sum(v.reconciler_lag for v in node.views()),
        failing=[
            ReconcileFailingStatus(f.partition, f.since, f.failures, f.last_error, f.last_failed_at)
            for f in node.reconciler.health.failing()
        ],
        l1_deletes_pending=len(pending),
        l1_deletes_pending_shown=[
            L1DeletePendingStatus(e.key, e.partition, e.since, e.failures, e.last_error, e.next_retry_at)
            for e in pending.pending()[:L1_DELETES_PENDING_SHOWN_MAX]
        ],
        l1_strays_deleted=node.l1.strays_deleted,
    )


def housekeeper_status(node: Node) -> HousekeeperStatus:
    stats = node.housekeeper.stats
    return HousekeeperStatus(
        rounds=stats.rounds,
        epochs_advanced=stats.epochs_advanced,
        catch_ups=stats.catch_ups,
        start_offsets_set=stats.start_offsets_set,
        l1_deleted=stats.l1_deleted,
        errors=stats.errors,
    )


def gc_status(node: Node) -> GcStatus:
    stats = node.gc.statistics()
    last = node.gc.last_round
    summary = None
    if last is not None:
        summary = GcRoundSummary(
            round_id=last.round_id,
            dry_run=last.dry_run,
            finished_at=last.finished_at,
            duration_s=max(0.0, last.finished_at - last.started_at),
            cluster_epoch=last.cluster_epoch,
            m=last.m,
            blocked_by=last.blocked_by[:BLOCKED_BY_SHOWN_MAX],
            listed=last.listed,
            eligible=last.eligible,
            deleted=last.deleted,
            deleted_bytes=last.deleted_bytes,
            too_young=last.too_young,
            errors=last.errors,
            backlog=last.backlog,
        )
    return GcStatus(
        paused=stats.paused,
        m=stats.m,
        epoch_lag=None if stats.m is None else node.epochs.current - stats.m,
        rounds=stats.rounds,
        dry_runs=stats.dry_runs,
        failed_rounds=stats.failed_rounds,
        safety_blocked_rounds=stats.safety_blocked_rounds,
        objects_deleted=stats.totals.deleted,
        bytes_deleted=stats.totals.deleted_bytes,
        max_deleted_epoch=stats.totals.max_deleted_epoch,
        backlog=stats.backlog,
        next_round_in_s=stats.next_round_in_s,
        pace_reason=stats.pace_reason,
        last_round=summary,
    )


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    message = f"{request.method} {request.url.path}: {exc.detail}"
    path = request.url.path
    if exc.status_code == 404 and path.endswith("/") and path != "/":
        message += f" (no trailing slash: {path.rstrip('/')})"
    return error_response(exc.status_code, code, message, dict(exc.headers or {}))


async def _escaped_exception(request: Request, exc: Exception) -> Response:
    """An exception no route caught (every route catches its own; this is the last line, in
    Starlette's outermost middleware, which then re-raises it for uvicorn to log with its
    traceback): the documented JSON 500, never Starlette's plain text."""
    return error_response(500, "internal_error", "internal error (logged)")


FORCED_STOP_MESSAGE = (
    "the daemon stopped while this request was in progress (its stop ran past "
    "server.shutdown_timeout_s): it may or may not have been carried out; retry it against a "
    "running node (a produce with the same Idempotency-Key is stored once)"
)
GRACEFUL_STOP_MESSAGE = (
    "the daemon stopped while this request was in progress (it was still running when the "
    "HTTP server's wait for requests at a stop ran out, a third of server.shutdown_timeout_s: "
    "a request body still arriving, a slow client): it may or may not have been carried out; "
    "retry it against a running node (a produce with the same Idempotency-Key is stored once)"
)


class BodyBudget:
    """Request bodies held by every HTTP request together, bounded: each request with a body
    reserves it (its Content-Length, at most `body_bytes_max`; a chunked one `body_bytes_max`)
    before the app reads it, and gives it back once answered; a request waits for room. Each
    request alone was bounded, not their sum: 500 connections sending 8 MiB bodies slowly held
    4.7 GB. Whole reservations, first come first served: no request holds part of what it needs
    while it waits for the rest."""

    def __init__(self, app: Any, body_bytes_max: int, inflight_bytes_max: int) -> None:
        self.app = app
        self._body_bytes_max = body_bytes_max
        self.budget = ByteBudget(inflight_bytes_max)

    def reservation(self, scope: dict[str, Any]) -> int:
        length = chunked = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                chunked = value
        if length is not None and length.isdigit():
            return min(int(length), self._body_bytes_max)
        return self._body_bytes_max if chunked is not None else 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        n = self.reservation(scope) if scope["type"] == "http" else 0
        if not n:
            await self.app(scope, receive, send)
            return
        await self.budget.acquire(n)
        try:
            await self.app(scope, receive, send)
        finally:
            self.budget.release(n)


class AnsweredWhenForced:
    """The outermost ASGI app. When a stop runs past `server.shutdown_timeout_s` (a hung store),
    the daemon cancels the requests still in the app (`Lifecycle.forced`); uvicorn logged each
    as an ERROR traceback and answered a bare 500, which a client cannot tell from a failure
    of the request itself. Here such a request is answered 503 `interrupted` (retriable; unlike
    `shutting_down` it may have been carried out), unless its answer had begun, and its
    cancellation ends here (its task is being given up). So is a request uvicorn itself cancels
    at a graceful stop, once its wait for the requests in progress ran out (a request whose
    body was still arriving from a slow client: a bare 500 and a traceback too, found by a new
    user's trial): while the daemon stops, nothing else cancels a request's task."""

    def __init__(self, app: Any, lifecycle: Lifecycle) -> None:
        self.app = app
        self._lifecycle = lifecycle

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: dict[str, Any]) -> None:
            nonlocal started
            await send(message)  # (may wait for the client to read: not begun until written)
            started = started or message["type"] == "http.response.start"

        try:
            await self.app(scope, receive, sending)
        except asyncio.CancelledError:
            if not self._lifecycle.stopping:
                raise
            if started:
                return  # half an answer: the connection's close says the rest
            message = FORCED_STOP_MESSAGE if self._lifecycle.forced else GRACEFUL_STOP_MESSAGE
            await send_unavailable(send, "interrupted", message)


def build_app(
    node: Node,
    metrics: ApiMetrics,
    settings: ApiSettings | None = None,
    lifecycle: Lifecycle | None = None,
    intake: ProduceIntake | None = None,
) -> Starlette:
    """`intake`: the produce intake this app shares with the Kafka front end (its own if None)."""
    api = Api(
        node,
        settings or ApiSettings(),
        metrics,
        lifecycle or Lifecycle(),
        ProduceIntake(node) if intake is None else intake,
    )
    records = "/v1/topics/{topic}/partitions/{partition}/records"
    routes = [
        api.route("/v1/topics", {"POST": api.create_topic, "GET": api.list_topics}),
        api.route("/v1/topics/{topic}", {"DELETE": api.delete_topic}),
        api.route(
            records, {"POST": api.produce, "GET": api.fetch}, params=frozenset({"offset", "max_bytes"})
        ),
        api.route(
            "/v1/topics/{topic}/configs",
            {"GET": api.topic_configs, "PUT": api.topic_configs, "PATCH": api.topic_configs},
        ),
        api.route("/v1/status", {"GET": api.status}, params=frozenset({"topic"})),
        api.route("/v1/cluster", {"GET": api.cluster}),
        api.route(
            "/v1/status/partitions",
            {"GET": api.status_partitions},
            params=frozenset({"after", "limit", "topic"}),
        ),
        api.route("/v1/epoch/advance", {"POST": api.advance_epoch}),
        api.route("/v1/gc/run", {"POST": api.gc_run}),
        api.route("/v1/gc/pause", {"POST": api.gc_pause}),
        api.route("/v1/gc/resume", {"POST": api.gc_resume}),
        api.route("/v1/gc/explain", {"GET": api.gc_explain}, params=frozenset({"key", "epoch"})),
        api.route("/v1/housekeeper/run", {"POST": api.housekeeper_run}),
        api.route("/v1/partitions/abandon-unreconciled", {"POST": api.abandon_unreconciled}),
        api.route("/metrics", {"GET": api.metrics_text}),
        api.route("/healthz", {"GET": api.healthz}, public=True),
        api.route("/readyz", {"GET": api.readyz}, public=True),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: _http_exception, Exception: _escaped_exception},
    )
    # No 307 to the slash-less path: Starlette builds its Location from the client's Host
    # header, so anyone could make the daemon redirect elsewhere. A trailing slash is a 404
    # whose message names the path without it.
    app.router.redirect_slashes = False
    app.state.api = api
    return app
