"""ApiVersions advertises exactly what is served: every advertised version of every API is
read and answered (a request with empty or zero fields, encoded with kio from Kafka's own
schemas, gets a response that parses at that version). What Kafka's SocketServer does with the
rest: an ApiVersions request at a version it does not know gets UNSUPPORTED_VERSION in a v0
response with the versions; another API at a version outside its range, or an unknown API key,
closes the connection."""

from __future__ import annotations

import dataclasses
import datetime
import struct
from pathlib import Path
from typing import Any

from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from daemon_support import daemon_and_client
from levelzero.kafka.protocol import API_VERSIONS, make

from test_kafka_listener import Wire

SASL_KEYS = (17, 36)  # answered by the listener itself; SaslAuthenticate closes after answering
OVERRIDES = {0: {"acks": -1}}  # a Produce with acks=0 gets no answer, as Kafka specifies


def minimal(cls: type) -> Any:
    """An instance with every field without a default empty, zero or false."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        kind = f.metadata.get("kafka_type")
        annotation = str(f.type)
        if annotation.startswith("tuple"):
            values[f.name] = ()
        elif kind in ("timedelta_i32", "timedelta_i64"):
            values[f.name] = datetime.timedelta(0)
        elif kind == "bool":
            values[f.name] = False
        elif kind in ("bytes", "records"):
            values[f.name] = b""
        elif kind == "string":
            values[f.name] = ""
        elif kind == "uuid":
            values[f.name] = None
        else:
            values[f.name] = 0
    return make(cls, **values)


async def test_every_advertised_version_is_read_and_answered(tmp_path: Path) -> None:
    answered = []
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        for key, (_, low, high) in sorted(API_VERSIONS.items()):
            if key in SASL_KEYS:
                continue
            for version in range(low, high + 1):
                wire = await Wire.connect(daemon.kafka_port)
                try:
                    cls = load_request_schema(key, version)
                    body = minimal(cls)
                    fields = {f.name: getattr(body, f.name) for f in dataclasses.fields(cls)}
                    fields.update(OVERRIDES.get(key, {}))
                    response = await wire.request(key, version, **fields)
                    answered.append((key, version, type(response).__name__))
                finally:
                    await wire.aclose()
    expected = [
        (key, version)
        for key, (_, low, high) in sorted(API_VERSIONS.items())
        if key not in SASL_KEYS
        for version in range(low, high + 1)
    ]
    assert [(k, v) for k, v, _ in answered] == expected
    assert all(name.endswith("Response") for _, _, name in answered)


async def test_unknown_keys_and_versions_are_refused_as_kafka_refuses_them(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        # ApiVersions at an unknown version: UNSUPPORTED_VERSION and the versions, v0 layout.
        wire = await Wire.connect(daemon.kafka_port)
        frame = struct.pack(">hhih", 18, 99, 7, 4) + b"test"
        await wire.send_raw(struct.pack(">i", len(frame)) + frame)
        reply = await wire.frame()
        assert reply is not None
        correlation, error, count = struct.unpack_from(">ihi", reply)
        assert (correlation, error, count) == (7, ErrorCode.unsupported_version.value, len(API_VERSIONS))
        await wire.aclose()
        # Metadata at a version above ours, then an API key nobody has: the connection closes.
        for key, version in ((3, API_VERSIONS[3][2] + 1), (9999, 0)):
            wire = await Wire.connect(daemon.kafka_port)
            frame = struct.pack(">hhih", key, version, 1, 4) + b"test"
            await wire.send_raw(struct.pack(">i", len(frame)) + frame)
            assert await wire.frame() is None
            await wire.aclose()


def test_clients_infer_the_kafka_release_levelzero_is_taken_for() -> None:
    """Clients guess the broker's Kafka release from the highest versions it advertises, and
    act on the guess: advertising DescribeLogDirs v5 (KIP-1066, the version that marks Kafka
    4.3) made kafka-python (its integration suite, pinned to 4.2) send Metadata v13, which is
    not served, on every connection: nothing connected. The guess stays at 4.2."""
    from kafka.protocol.broker_version_data import infer_broker_version_from_api_versions

    advertised = {key: (low, high) for key, (_, low, high) in API_VERSIONS.items()}
    assert infer_broker_version_from_api_versions(advertised) == (4, 2)
