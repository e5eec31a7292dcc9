"""What the Kafka listener counts per API, and the Prometheus families the daemon's registry reads
from it at scrape time.

The request path only adds to plain ints (a request, its latency's bucket, the error codes of its
response): no lock, no label lookup, nothing allocated per request. `kafka_metrics` turns them into
families when `/metrics` is scraped, as `daemon.metrics` reads the node's own counters. Labels are
bounded: the API's name (one of `protocol.API_VERSIONS`, or `unknown` for any other key) and
Kafka's error name (one of kio's `ErrorCode`), never a topic, a client or an offset.

Errors are counted as Kafka's broker counts them (`kafka.network:RequestMetrics,name=ErrorsPerSec`,
from `AbstractResponse.errorCounts`): every non-zero error code a response carries, at whatever
level (the request's, a topic's, a partition's), one count each; a produce refused on 3 partitions
counts 3. A request answered by closing the connection has no response: its close is counted by
reason instead (`levelzero_kafka_connections_closed_total`).

A request's latency runs from its frame read whole to its response's turn to be written: after the
responses before it on its connection (clients need them in order), before the socket write (a
slow reader's is not counted): Kafka's TotalTimeMs less its ResponseSendTimeMs. A Fetch waits up
to its max_wait_ms for records, so its latency is mostly that wait.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from typing import Any, Protocol

from kio.schema.errors import ErrorCode
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from levelzero.kafka.protocol import API_VERSIONS, entity_inside


class _ListenerCounts(Protocol):
    """The listener's connection counts (`server.ListenerStats`)."""

    @property
    def connections_open(self) -> int: ...

    @property
    def connections(self) -> int: ...

    @property
    def closed(self) -> Mapping[Any, int]: ...  # a close reason (an enum) -> its count


class CountedListener(Protocol):
    """What the metrics read of the Kafka listener (`server.KafkaListener`): named here so
    that this module, which the server imports, does not import the server."""

    @property
    def stats(self) -> _ListenerCounts: ...

    @property
    def requests(self) -> RequestStats: ...


# From an ApiVersions (well under a millisecond) to a Fetch that waited its max_wait_ms out
# (librdkafka's fetch.wait.max.ms: 500 ms) or a produce behind a slow object store.
DURATION_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
UNKNOWN_API_KEY = -1  # every key the listener does not serve counts here (label `unknown`)


class ApiStats:
    """One API's counters: requests read, their latencies, the error codes of their responses."""

    __slots__ = ("requests", "latency_counts", "latency_sum_s", "errors")

    def __init__(self) -> None:
        self.requests = 0
        self.latency_counts = [0] * (len(DURATION_BUCKETS_S) + 1)  # per bucket, the last +Inf
        self.latency_sum_s = 0.0
        self.errors: dict[int, int] = {}  # error code -> count

    def observe(self, seconds: float) -> None:
        self.latency_counts[bisect_left(DURATION_BUCKETS_S, seconds)] += 1
        self.latency_sum_s += seconds

    def count_errors(self, response: Any) -> None:
        """Counts each non-zero error code `response` (a kio response) carries, at any level."""
        # a class is hashable; mypy does not count type[Any] as Hashable for functools.cache
        for name, is_code in _error_fields(type(response)):  # type: ignore[arg-type]
            value = getattr(response, name)
            if is_code:
                if value:
                    code = int(value)
                    self.errors[code] = self.errors.get(code, 0) + 1
            elif type(value) is tuple:
                for item in value:
                    self.count_errors(item)
            elif value is not None:
                self.count_errors(value)


@cache
def _error_fields(cls: type) -> tuple[tuple[str, bool], ...]:
    """The fields of response entity `cls` an error code can be found in: its name, and whether
    it is an error code (else an entity, or an array of them, holding some). Walking only these
    skips the records and the arrays without codes of a response."""
    found = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("kafka_type") == "error_code":
            found.append((f.name, True))
            continue
        inner = entity_inside(f.type)
        if inner is not None and _error_fields(inner):
            found.append((f.name, False))
    return tuple(found)


class RequestStats:
    """Counters per API key, made once for every API served (and one for the rest): the request
    path finds its `ApiStats` with one dict lookup."""

    def __init__(self) -> None:
        self.by_api = {key: ApiStats() for key in (*API_VERSIONS, UNKNOWN_API_KEY)}
        self._unknown = self.by_api[UNKNOWN_API_KEY]

    def api(self, api_key: int) -> ApiStats:
        return self.by_api.get(api_key, self._unknown)


def _api_name(api_key: int) -> str:
    spec = API_VERSIONS.get(api_key)
    return "unknown" if spec is None else spec[0]


def _error_name(code: int) -> str:
    return ErrorCode(code).name.upper()  # as Kafka names them: UNKNOWN_TOPIC_OR_PARTITION


def kafka_metrics(listener: CountedListener) -> Callable[[object], Iterable[Metric]]:
    """A source of the daemon's collector (called with its node, which it does not read): the
    listener's families, an API's series once it has had a request."""

    def source(_node: object) -> Iterable[Metric]:
        yield from _families(listener)

    return source


def _families(listener: CountedListener) -> Iterable[Metric]:
    stats = listener.stats
    yield GaugeMetricFamily(
        "levelzero_kafka_connections", "Open Kafka connections.", value=stats.connections_open
    )
    yield CounterMetricFamily(
        "levelzero_kafka_connections_accepted",
        "Kafka connections accepted (those then refused at kafka.connections_max included).",
        value=stats.connections,
    )
    closed = CounterMetricFamily(
        "levelzero_kafka_connections_closed",
        "Kafka connections the listener closed (or refused), by reason; a client's own close is not counted.",
        labels=["reason"],
    )
    for reason, count in stats.closed.items():
        closed.add_metric([reason.value], count)
    yield closed
    requests = CounterMetricFamily("levelzero_kafka_requests", "Kafka requests read, by API.", labels=["api"])
    errors = CounterMetricFamily(
        "levelzero_kafka_request_errors",
        "Non-zero error codes in Kafka responses, by API and Kafka error name: one per code, "
        "at any level of the response (request, topic, partition).",
        labels=["api", "error"],
    )
    latency = HistogramMetricFamily(
        "levelzero_kafka_request_duration_seconds",
        "Kafka request latency, by API: from the request read to its response's turn to be "
        "written (after the connection's earlier responses; an acks=0 produce: its handler's end).",
        labels=["api"],
    )
    bounds = [*(str(float(b)) for b in DURATION_BUCKETS_S), "+Inf"]
    for api_key, api in sorted(listener.requests.by_api.items()):
        if not api.requests:
            continue
        name = _api_name(api_key)
        requests.add_metric([name], api.requests)
        for code, count in sorted(api.errors.items()):
            errors.add_metric([name, _error_name(code)], count)
        cumulative, buckets = 0, []
        for bound, count in zip(bounds, api.latency_counts, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        latency.add_metric([name], buckets, api.latency_sum_s)
    yield requests
    yield errors
    yield latency
