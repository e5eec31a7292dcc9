"""Kafka message framing and the kio glue: which API versions the listener speaks, how a frame
becomes a typed request, and how a response becomes bytes.

Message types and their encodings come from kio (generated from Kafka's own JSON message
schemas); this module only picks versions and fills response dataclasses. Kafka's response
classes differ between versions by the fields they carry, so handlers build responses with
`make(cls, **values)`: it keeps the values the class has and converts plain ints into the
types kio expects (milliseconds into `timedelta`, codes into `ErrorCode`).
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import struct
import sys
from functools import cache
from types import ModuleType, NoneType, UnionType
from typing import Any, Union, get_args, get_origin

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from levelzero.kafka import skim

# api key -> (name, min version, max version) this listener speaks. Min versions are the first
# kio has a schema for that carries RecordBatch v2 (Produce >= 3, Fetch >= 4); max versions stop
# before a version changes semantics we do not implement (Fetch 13 names topics by id).
API_VERSIONS: dict[int, tuple[str, int, int]] = {
    0: ("Produce", 3, 9),
    1: ("Fetch", 4, 12),
    2: ("ListOffsets", 1, 11),
    3: ("Metadata", 1, 13),
    8: ("OffsetCommit", 2, 8),
    9: ("OffsetFetch", 1, 7),
    10: ("FindCoordinator", 0, 4),
    11: ("JoinGroup", 0, 9),
    12: ("Heartbeat", 0, 4),
    13: ("LeaveGroup", 0, 5),
    14: ("SyncGroup", 0, 5),
    17: ("SaslHandshake", 1, 1),
    36: ("SaslAuthenticate", 0, 2),
    18: ("ApiVersions", 0, 3),
    19: ("CreateTopics", 2, 7),
    22: ("InitProducerId", 0, 4),
    24: ("AddPartitionsToTxn", 0, 3),
    25: ("AddOffsetsToTxn", 0, 3),
    26: ("EndTxn", 0, 3),
    28: ("TxnOffsetCommit", 0, 3),
    15: ("DescribeGroups", 0, 6),
    16: ("ListGroups", 0, 5),
    23: ("OffsetForLeaderEpoch", 2, 4),
    42: ("DeleteGroups", 0, 2),
    47: ("OffsetDelete", 0, 0),
    60: ("DescribeCluster", 0, 2),
    32: ("DescribeConfigs", 1, 4),
    33: ("AlterConfigs", 0, 2),
    44: ("IncrementalAlterConfigs", 0, 1),
    20: ("DeleteTopics", 1, 6),
    21: ("DeleteRecords", 0, 2),
    37: ("CreatePartitions", 0, 3),
    43: ("ElectLeaders", 0, 2),
    45: ("AlterPartitionReassignments", 0, 0),
    46: ("ListPartitionReassignments", 0, 0),
    74: ("ListConfigResources", 0, 1),
    75: ("DescribeTopicPartitions", 0, 0),
    61: ("DescribeProducers", 0, 0),
    34: ("AlterReplicaLogDirs", 1, 2),
    # Not v5 (KIP-1066's cordoned log dirs): clients take a broker answering it for Kafka 4.3
    # and send that release's versions of other APIs unasked (kafka-python: Metadata v13).
    35: ("DescribeLogDirs", 1, 4),
    65: ("DescribeTransactions", 0, 0),
    66: ("ListTransactions", 0, 1),
}
API_VERSIONS_KEY = 18
REQUEST_PREFIX = struct.Struct(">hhi")  # api key, api version, correlation id
SIZE_PREFIX = struct.Struct(">i")


class BadRequest(Exception):
    """A frame that cannot be read as the request it names: the connection is closed."""


class UnansweredFailure(Exception):
    """A request that gets no answer (a produce with acks=0) failed: the connection is closed,
    as a Kafka broker closes it, so the client sees it, refreshes its metadata and reconnects
    (an acks=0 producer writing to a partition that went would otherwise lose every record
    without a sign)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any  # the kio request dataclass
    trailing_bytes: int = 0  # after the fields the schema names; ignored (see parse_request)
    client_host: str = ""  # the peer's address as Kafka shows it ("/127.0.0.1"; DescribeGroups)

    @property
    def response_module(self) -> ModuleType:
        return response_module(self.api_key, self.api_version)


def parse_prefix(frame: bytes) -> tuple[int, int, int]:
    if len(frame) < REQUEST_PREFIX.size:
        raise BadRequest(f"a request frame of {len(frame)} bytes is shorter than its header")
    return REQUEST_PREFIX.unpack_from(frame, 0)


def is_supported(api_key: int, api_version: int) -> bool:
    spec = API_VERSIONS.get(api_key)
    return spec is not None and spec[1] <= api_version <= spec[2]


@cache
def _readers(api_key: int, api_version: int) -> tuple[Any, Any, Any]:
    cls = load_request_schema(api_key, api_version)
    return cls, entity_reader(cls.__header_schema__), entity_reader(cls)


def _allows_null(tp: Any) -> bool:
    return get_origin(tp) in (Union, UnionType) and NoneType in get_args(tp)


def entity_inside(tp: Any) -> Any:
    """The entity class a field of type `tp` holds (itself, or an array of it), else None."""
    args = [a for a in get_args(tp) if a is not NoneType] if _allows_null(tp) else [tp]
    inner = args[0] if len(args) == 1 else None
    if get_origin(inner) is tuple:
        inner = get_args(inner)[0]
    return inner if dataclasses.is_dataclass(inner) else None


@cache
def _null_checks(cls: Any) -> tuple[tuple[str, bool, Any], ...]:
    """Per field of entity `cls`: its name, whether the schema lets it be null, and the entity
    class inside it to check in turn (None: a primitive)."""
    return tuple((f.name, _allows_null(f.type), entity_inside(f.type)) for f in dataclasses.fields(cls))


def _null_where_not_nullable(entity: Any, path: str) -> str | None:
    """The path of a field of `entity` that is null where its schema says it cannot be (kio
    reads an array's length -1 as null whatever the schema says), or None."""
    # a class is hashable; mypy does not count type[Any] as Hashable for functools.cache
    for name, nullable, inner in _null_checks(type(entity)):  # type: ignore[arg-type]
        value = getattr(entity, name)
        if value is None:
            if not nullable:
                return f"{path}{name}"
        elif inner is not None:
            for i, item in enumerate(value if isinstance(value, tuple) else (value,)):
                found = _null_where_not_nullable(item, f"{path}{name}[{i}].")
                if found is not None:
                    return found
    return None


def parse_request(frame: bytes) -> Request:
    """A whole frame (without its size prefix) as a typed request. Raises BadRequest."""
    api_key, api_version, correlation_id = parse_prefix(frame)
    if not is_supported(api_key, api_version):
        raise BadRequest(f"api key {api_key} version {api_version} is not supported")
    cls, read_header, read_body = _readers(api_key, api_version)
    try:  # every announced length checked first: kio's reader would reserve it (`skim`)
        frame = skim.skim(frame, cls)
    except skim.BadRequest as exc:
        raise BadRequest(f"api key {api_key} v{api_version}: {exc}") from None
    try:
        header, used = read_header(frame, 0)
        body, body_used = read_body(frame, used)
    except Exception as exc:  # noqa: BLE001 - kio raises many kinds on malformed input
        raise BadRequest(f"api key {api_key} v{api_version}: malformed request: {exc!r}") from None
    # Bytes after a request that parsed whole are ignored, as Kafka's own brokers do (they
    # read the fields the schema names and never check for a remainder): librdkafka's
    # "all topics" Metadata v12 request (AdminClient.list_topics, `kcat -L`) ends with three
    # bytes no schema version names, and refusing them closed the client's connection.
    trailing = len(frame) - used - body_used
    if trailing < 0:  # a field ran past the end of the frame (slicing bytes does not raise)
        raise BadRequest(f"api key {api_key} v{api_version}: the request is {-trailing} bytes short")
    # A handler iterates the arrays its schema says are never null: a null one is a malformed
    # request, not a handler's failure.
    null_field = _null_where_not_nullable(body, "")
    if null_field is not None:
        raise BadRequest(f"api key {api_key} v{api_version}: malformed request: {null_field} is null")
    return Request(api_key, api_version, correlation_id, header.client_id, body, trailing)


@cache
def response_module(api_key: int, api_version: int) -> ModuleType:
    return sys.modules[load_response_schema(api_key, api_version).__module__]


@cache
def _response_writers(cls: Any) -> tuple[Any, Any, Any]:
    header_cls = cls.__header_schema__
    return header_cls, entity_writer(header_cls), entity_writer(cls)


def encode_response(correlation_id: int, response: Any) -> bytes:
    # a class is hashable; mypy does not count type[Any] as Hashable for functools.cache
    header_cls, write_header, write_body = _response_writers(type(response))  # type: ignore[arg-type]
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    write_header(out, header_cls(correlation_id=correlation_id))
    write_body(out, response)
    data = out.getbuffer()
    SIZE_PREFIX.pack_into(data, 0, len(data) - 4)
    return bytes(data)


@cache
def _fields(cls: type) -> tuple[tuple[str, str | None], ...]:
    return tuple((f.name, f.metadata.get("kafka_type")) for f in dataclasses.fields(cls))


def make(cls: type, **values: Any) -> Any:
    """An instance of the kio dataclass `cls` from the `values` it has fields for."""
    kwargs: dict[str, Any] = {}
    for name, kafka_type in _fields(cls):
        if name not in values:
            continue
        value = values[name]
        if kafka_type in ("timedelta_i32", "timedelta_i64") and isinstance(value, int):
            value = datetime.timedelta(milliseconds=value)
        elif kafka_type == "error_code" and not isinstance(value, ErrorCode):
            value = ErrorCode(value)
        kwargs[name] = value
    return cls(**kwargs)


def api_versions_response(api_version: int, error: ErrorCode = ErrorCode.none) -> Any:
    module = response_module(API_VERSIONS_KEY, api_version)
    keys = tuple(
        make(module.ApiVersion, api_key=key, min_version=low, max_version=high)
        for key, (_, low, high) in sorted(API_VERSIONS.items())
    )
    return make(module.ApiVersionsResponse, error_code=error, api_keys=keys, throttle_time=0)
