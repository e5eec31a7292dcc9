"""An async client of the levelzero HTTP API (httpx), used by the CLI, the demo, the Spark sink
and the tests. Beside the front ends, not in one: the CLI and the export reach the daemon
through it, and neither imports the HTTP front end itself.

Every failure surfaces as `ApiError`, carrying the server's error code and message (or
`unreachable` / `bad_response` when there is no usable answer), so callers print one line.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any
from urllib.parse import quote

import anyio
import httpx
import msgspec

from levelzero.actors.gc import RoundReport
from levelzero.core.gc import Explanation

from levelzero.config import token_problem
from levelzero.http.schema import (
    RETRY_AFTER_S,
    TopicConfigs,
    TopicConfigsRequest,
    AbandonRequest,
    AbandonResponse,
    ClusterInfo,
    CreateTopicRequest,
    EpochResponse,
    ErrorBody,
    KeyReusedBody,
    FetchResponse,
    GcRunRequest,
    GcStatus,
    HousekeeperRunRequest,
    HousekeeperStatus,
    ProduceRequest,
    ProduceResponse,
    RecordIn,
    PartitionPage,
    PartitionStatus,
    StatusResponse,
    TopicInfo,
    TopicList,
)

# RecordIn: the record of a produce request, the API's own message (http/schema.py).
__all__ = ["ApiError", "Client", "RecordIn", "default_url"]


DEFAULT_URL = "http://127.0.0.1:8420"
DEFAULT_TIMEOUT_S = 60.0

_encoder = msgspec.json.Encoder()


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        first_offsets: tuple[int, int] | None = None,
        *,
        outcome_unknown: bool = False,
    ) -> None:
        super().__init__(f"{message} ({code}{f', HTTP {status}' if status else ''})")
        self.status = status
        self.code = code
        self.message = message
        # idempotency_key_reused: (base offset, last offset) of the key's first request
        self.first_offsets = first_offsets
        # A request that changes something (not a GET) reached the daemon and got no answer (a
        # timeout waiting for it, a dropped connection) on one of its tries: it may have been
        # carried out, or not.
        self.outcome_unknown = outcome_unknown


def default_url() -> str:
    return os.environ.get("LEVELZERO_URL") or DEFAULT_URL


REDIRECTS_MAX = 3  # a leader moving twice while a request follows it
RETRY_PAUSE_FIRST_S = 0.05  # doubling up to the API's Retry-After (Client.request)
# Transport failures of a redirect target: no connection taken (nothing sent), or the
# connection dropped before an answer (the request may have been carried out).
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout)
_DROPPED = (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)
# Transport failures after the request went out, or while it did: it may have been carried out.
_MAYBE_DONE = (httpx.ReadTimeout, httpx.WriteTimeout, *_DROPPED)


class Client:
    """`async with Client(url, token=...) as client: await client.produce(...)`."""

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
        wait_for_restart: bool = False,
    ) -> None:
        """`wait_for_restart`: the URL given, once it has answered this client, is waited for
        when it stops answering (a daemon restarting) as a crashed leader is (see `request`):
        for a long run of requests that must all go through, such as the CLI's `produce`."""
        problem = token_problem(token) if token else None
        if problem:
            raise ValueError(problem)
        self.url = (url or default_url()).rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # trust_env=False: a levelzero daemon is reached directly, never through $HTTP_PROXY.
        # In a cluster, a node answers a request for a partition it does not lead with a 307 to
        # the leader (method and body kept): followed, a few hops at most.
        self._timeout_s = timeout_s
        self._wait_for_restart = wait_for_restart
        self._answered = False  # whether the URL given has answered a request of this client
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            timeout=timeout_s,
            transport=transport,
            trust_env=False,
            follow_redirects=True,
            max_redirects=REDIRECTS_MAX,
        )

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # ------------------------------------------------------------------ plumbing

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: msgspec.Struct | None = None,
        params: dict[str, int | str] | None = None,
        replayable: bool | None = None,
    ) -> httpx.Response:
        """One API call, retried at `self.url` while its partition has no reachable leader, with
        a pause growing to the API's Retry-After, until the client's timeout has passed since the
        first try: after a 503 `not_leader` (nothing was done), and after a redirect to a node
        that cannot be reached — a leader that crashed is still redirected to by the others
        until its lease expires (docs/cluster.md). A redirect target that refused the
        connection was sent nothing, so any request is tried again; one that dropped it may have
        done the work, so only a `replayable` request is (by default a GET; a produce with an
        idempotency key is stored once however often it is sent). The URL given is asked each
        time, never the dead node, and is not retried itself when unreachable (nothing else can
        answer for it) unless the client waits for restarts: then, once it has answered, it is
        treated as such a redirect target, and a `replayable` request is sent again after any
        503 (each says "try again later"; one starting or stopping answers `not_ready` or
        `shutting_down`). A URL that never answered is not waited for: it is likely mistyped."""
        content = None if body is None else _encoder.encode(body)
        # The daemon refuses a POST (PUT, PATCH) that does not say it is JSON (415), body or not.
        headers = {"Content-Type": "application/json"} if method in ("POST", "PUT", "PATCH") else None
        reads = method in ("GET", "HEAD")
        if replayable is None:
            replayable = reads
        maybe_done = False  # a try reached the daemon and got no answer (ApiError.outcome_unknown)
        started = time.monotonic()
        pause = RETRY_PAUSE_FIRST_S
        tries = 0
        while True:
            tries += 1
            left = self._timeout_s - (time.monotonic() - started)
            try:
                response = await self._http.request(
                    method,
                    path,
                    content=content,
                    params=params,
                    headers=headers,
                    timeout=max(left, RETRY_PAUSE_FIRST_S),
                )
            except httpx.HTTPError as exc:
                maybe_done = maybe_done or (not reads and isinstance(exc, _MAYBE_DONE))
                failure = self._unreachable(exc, replayable, maybe_done)
                if not self._lost_for_now(exc, replayable):
                    raise failure from None
            else:
                self._answered = True
                if response.status_code < 400:
                    return response
                failure = self._error(response)
                # `interrupted`: the daemon stopped while carrying it out (a forced stop)
                maybe_done = maybe_done or (not reads and failure.code == "interrupted")
                failure.outcome_unknown = maybe_done  # this try's, or an earlier try's
                if not self._unavailable_for_now(failure, replayable):
                    raise failure
            left = self._timeout_s - (time.monotonic() - started)
            if left <= 0:
                raise ApiError(
                    failure.status,
                    failure.code,
                    f"{failure.message}; still so after {_tries(tries)} in {self._timeout_s:g} s",
                    outcome_unknown=maybe_done,
                ) from None
            await anyio.sleep(min(pause, left))
            pause = min(2 * pause, RETRY_AFTER_S)

    def _unreachable(self, exc: httpx.HTTPError, replayable: bool, maybe_done: bool) -> ApiError:
        """The failure named by the URL that failed: the one asked, or the one a redirect from
        it led to (a dead leader's, not the healthy node's the caller gave); a request that
        node dropped and that is not sent again says why (it may have been carried out), as
        does one it took and did not answer in time. `maybe_done`: this or an earlier try of
        a request that changes something may have been carried out (outcome_unknown)."""
        url, note = self.url, ""
        target = self._redirect_target(exc)
        if target is not None:
            url = f"{_origin(target)} (redirected there by {self.url})"
        if isinstance(exc, _DROPPED) and not replayable:
            where = "" if target is None else " there"
            note = f"; it may have been carried out{where}, so it was not sent again"
        if isinstance(exc, httpx.TimeoutException):
            if maybe_done and isinstance(exc, _MAYBE_DONE):
                note = f"; it may have been carried out{'' if target is None else ' there'}"
            message = f"levelzero at {url} did not answer in time{note}"
            return ApiError(0, "timeout", message, outcome_unknown=maybe_done)
        message = f"cannot reach levelzero at {url}: {exc}{note}"
        return ApiError(0, "unreachable", message, outcome_unknown=maybe_done)

    def _lost_for_now(self, exc: httpx.HTTPError, replayable: bool) -> bool:
        """Whether a transport failure is one a retry may pass by: of a node waited for (a
        redirect target, or the URL given while restarting), one that took no connection (sent
        nothing), or — for a replayable request — one that dropped it before answering."""
        if not self._waited_for(exc):
            return False
        return isinstance(exc, _NOT_SENT) or (replayable and isinstance(exc, _DROPPED))

    def _waited_for(self, exc: httpx.HTTPError) -> bool:
        """Whether the node that failed is waited for: a redirect target (a crashed leader,
        until the partition's lease moves), or the URL given, when this client waits for its
        restart and it has answered before or took this request's connection (a drop: a server
        is there, the URL is not mistyped)."""
        if self._redirect_target(exc) is not None:
            return True
        return self._wait_for_restart and (self._answered or isinstance(exc, _DROPPED))

    def _unavailable_for_now(self, failure: ApiError, replayable: bool) -> bool:
        """Whether an error answer is one to try again after a pause: `not_leader` (nothing was
        done), or any 503 of a replayable request when this client waits for restarts."""
        if failure.code == "not_leader":
            return True
        return self._wait_for_restart and replayable and failure.status == 503

    def _redirect_target(self, exc: httpx.HTTPError) -> httpx.URL | None:
        """The URL of the failed request when a redirect led there, not the URL asked."""
        try:
            url = exc.request.url
        except RuntimeError:  # raised before any request was made
            return None
        base = self._http.base_url
        return None if (url.scheme, url.host, url.port) == (base.scheme, base.host, base.port) else url

    def _error(self, response: httpx.Response) -> ApiError:
        try:
            body = msgspec.json.decode(response.content, type=ErrorBody)
        except (msgspec.ValidationError, msgspec.DecodeError):
            text = response.text.strip()[:200] or response.reason_phrase
            return ApiError(response.status_code, "http_error", text)
        if body.error == "idempotency_key_reused":
            try:
                reused = msgspec.json.decode(response.content, type=KeyReusedBody)
            except msgspec.ValidationError:  # offsets not known (two requests at once)
                pass
            else:
                first = (reused.base_offset, reused.last_offset)
                return ApiError(response.status_code, body.error, body.message, first)
        return ApiError(response.status_code, body.error, body.message)

    async def _call(self, method: str, path: str, result: type, **kwargs: Any):  # noqa: ANN202
        response = await self.request(method, path, **kwargs)
        try:
            return msgspec.json.decode(response.content, type=result)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise ApiError(response.status_code, "bad_response", f"unexpected response: {exc}") from None

    # ------------------------------------------------------------------ API

    async def create_topic(
        self, name: str, partitions: int = 1, configs: dict[str, str] | None = None
    ) -> TopicInfo:
        body = CreateTopicRequest(name, partitions, configs or {})
        return await self._call("POST", "/v1/topics", TopicInfo, body=body)

    async def topic_configs(self, topic: str) -> TopicConfigs:
        return await self._call("GET", _configs_path(topic), TopicConfigs)

    async def replace_topic_configs(self, topic: str, configs: dict[str, str]) -> TopicConfigs:
        """The topic's whole set becomes `configs` (others go back to their defaults)."""
        body = TopicConfigsRequest(dict(configs))
        return await self._call("PUT", _configs_path(topic), TopicConfigs, body=body)

    async def change_topic_configs(self, topic: str, configs: dict[str, str | None]) -> TopicConfigs:
        """Set these configs; a None value deletes one (back to its default)."""
        return await self._call(
            "PATCH", _configs_path(topic), TopicConfigs, body=TopicConfigsRequest(configs)
        )

    async def delete_topic(self, name: str) -> TopicInfo:
        """The deleted topic and how many partitions it had."""
        return await self._call("DELETE", f"/v1/topics/{quote(name, safe='')}", TopicInfo)

    async def list_topics(self) -> list[TopicInfo]:
        return (await self._call("GET", "/v1/topics", TopicList)).topics

    async def produce(
        self,
        topic: str,
        partition: int,
        records: Sequence[tuple[bytes | None, bytes | None] | bytes | RecordIn],
        *,
        idempotency_key: str | None = None,
    ) -> ProduceResponse:
        """`records`: values, (key, value) pairs (a None value: a null value), or RecordIns.
        With `idempotency_key`, stored once however often it is sent (see ProduceRequest)."""
        body = ProduceRequest(
            [
                r
                if isinstance(r, RecordIn)
                else RecordIn(r)
                if isinstance(r, bytes)
                else RecordIn(r[1], r[0])
                for r in records
            ],
            idempotency_key,
        )
        return await self._call(
            "POST",
            _records_path(topic, partition),
            ProduceResponse,
            body=body,
            replayable=idempotency_key is not None,
        )

    async def fetch(
        self, topic: str, partition: int, offset: int | None = None, max_bytes: int | None = None
    ) -> FetchResponse:
        params: dict[str, int | str] = {}
        if offset is not None:
            params["offset"] = offset
        if max_bytes is not None:
            params["max_bytes"] = max_bytes
        return await self._call("GET", _records_path(topic, partition), FetchResponse, params=params)

    async def cluster(self) -> ClusterInfo:
        """The cluster's members and who leads how many partitions (a single node: enabled False)."""
        return await self._call("GET", "/v1/cluster", ClusterInfo)

    async def status(self, topic: str | None = None) -> StatusResponse:
        """The summary: M, the outlier partitions and the first page of partitions (of
        `topic` only, when given)."""
        params = {} if topic is None else {"topic": topic}
        return await self._call("GET", "/v1/status", StatusResponse, params=params)

    async def status_partitions(
        self, after: str | None = None, limit: int | None = None, topic: str | None = None
    ) -> PartitionPage:
        """One page of partition statuses after `after` ("topic/p"), in (topic, partition) order."""
        params: dict[str, int | str] = {}
        if after is not None:
            params["after"] = after
        if limit is not None:
            params["limit"] = limit
        if topic is not None:
            params["topic"] = topic
        return await self._call("GET", "/v1/status/partitions", PartitionPage, params=params)

    async def all_partitions(
        self, page_limit: int | None = None, topic: str | None = None
    ) -> list[PartitionStatus]:
        """Every partition's status (of `topic` only, when given), page by page (each
        partition once, in order)."""
        partitions: list[PartitionStatus] = []
        after = None
        while True:
            page = await self.status_partitions(after, page_limit, topic)
            partitions += page.partitions
            if page.next_after is None:
                return partitions
            assert page.partitions, page
            after = page.next_after

    async def advance_epoch(self) -> int:
        return (await self._call("POST", "/v1/epoch/advance", EpochResponse)).cluster_epoch

    async def gc_run(self, *, dry_run: bool = False) -> RoundReport:
        """One GC round now (also while paused); a dry run deletes nothing."""
        return await self._call("POST", "/v1/gc/run", RoundReport, body=GcRunRequest(dry_run))

    async def gc_pause(self) -> GcStatus:
        return await self._call("POST", "/v1/gc/pause", GcStatus)

    async def gc_resume(self) -> GcStatus:
        return await self._call("POST", "/v1/gc/resume", GcStatus)

    async def gc_explain(self, *, key: str | None = None, epoch: int | None = None) -> Explanation:
        """Why the L0 object `key` (or any object of `epoch`) is or is not deleted."""
        params: dict[str, int | str] = {}
        if key is not None:
            params["key"] = key
        if epoch is not None:
            params["epoch"] = epoch
        return await self._call("GET", "/v1/gc/explain", Explanation, params=params)

    async def run_housekeeper(self, *, force: bool = False) -> HousekeeperStatus:
        return await self._call(
            "POST", "/v1/housekeeper/run", HousekeeperStatus, body=HousekeeperRunRequest(force)
        )

    async def abandon_unreconciled(
        self, topic: str, partition: int, *, operator: str, reason: str, confirm: bool
    ) -> AbandonResponse:
        """The escape hatch for a partition whose L0 data is gone for good (docs/operating.md)."""
        body = AbandonRequest(topic, partition, operator, reason, confirm)
        return await self._call("POST", "/v1/partitions/abandon-unreconciled", AbandonResponse, body=body)

    async def metrics(self) -> str:
        return (await self.request("GET", "/metrics")).text

    async def ready(self) -> bool:
        try:
            await self.request("GET", "/readyz")
        except ApiError:
            return False
        return True


def _configs_path(topic: str) -> str:
    return f"/v1/topics/{quote(topic, safe='')}/configs"


def _records_path(topic: str, partition: int) -> str:
    return f"/v1/topics/{quote(topic, safe='')}/partitions/{partition}/records"


def _origin(url: httpx.URL) -> str:
    return str(url.copy_with(path="", query=None, fragment=None)).rstrip("/")


def _tries(n: int) -> str:
    return f"{n} {'try' if n == 1 else 'tries'}"
