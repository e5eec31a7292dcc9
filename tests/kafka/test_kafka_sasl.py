"""SASL/PLAIN on the Kafka listener whenever the daemon has a token (SCRAM: test_kafka_scram.py):
real clients authenticate with the token as password; a wrong password or no SASL at all gets
nowhere."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import anyio
import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode


from daemon_support import TOKEN, daemon_and_client
from test_kafka_listener import Wire, lines_with, local_peer


def sasl_round_trip(port: int, password: str, mechanism: str = "PLAIN") -> list[tuple[int, bytes]]:
    common = {
        "bootstrap.servers": f"127.0.0.1:{port}",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": mechanism,
        "sasl.username": "app",
        "sasl.password": password,
    }
    admin = AdminClient(common)
    for future in admin.create_topics([NewTopic("secured", 1, 1)]).values():
        future.result(30)
    producer = Producer(common)
    for i in range(20):
        producer.produce("secured", value=b"v%d" % i, partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer({**common, "group.id": "sasl", "enable.auto.commit": False})
    got: list[tuple[int, bytes]] = []
    try:
        consumer.assign([TopicPartition("secured", 0, 0)])
        for _ in range(100):
            for message in consumer.consume(100, 0.5):
                assert message.error() is None
                got.append((message.offset(), message.value()))
            if len(got) == 20:
                break
    finally:
        consumer.close()
    return got


def wrong_password_fails(port: int, mechanism: str = "PLAIN") -> str:
    errors: list[str] = []
    admin = AdminClient(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": mechanism,
            "sasl.username": "app",
            "sasl.password": "wrong-password",
            "error_cb": lambda err: errors.append(str(err)),
        }
    )
    try:
        admin.list_topics(timeout=3)
    except Exception as exc:  # noqa: BLE001 - librdkafka's KafkaException
        errors.append(str(exc))
    for _ in range(30):
        admin.poll(0.1)
        if any("Authentication" in e or "authentication" in e for e in errors):
            break
    return " | ".join(errors)


async def test_clients_authenticate_with_the_token(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, token=TOKEN, server__token=TOKEN, kafka__listen="127.0.0.1:0") as (
        daemon,
        client,
    ):
        got = await anyio.to_thread.run_sync(sasl_round_trip, daemon.kafka_port, TOKEN)
        assert got == [(i, b"v%d" % i) for i in range(20)]
        assert (await client.fetch("secured", 0, offset=0)).high_watermark == 20
        errors = await anyio.to_thread.run_sync(wrong_password_fails, daemon.kafka_port)
        assert "uthentication" in errors, errors
        assert daemon.kafka.stats.authentications_failed >= 1


async def test_aiokafka_sasl_plain(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, token=TOKEN, server__token=TOKEN, kafka__listen="127.0.0.1:0") as (
        daemon,
        client,
    ):
        await client.create_topic("aio-sasl", 1)
        producer = AIOKafkaProducer(
            bootstrap_servers=f"127.0.0.1:{daemon.kafka_port}",
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN",
            sasl_plain_username="app",
            sasl_plain_password=TOKEN,
        )
        await producer.start()
        try:
            meta = await producer.send_and_wait("aio-sasl", b"hello", partition=0)
        finally:
            await producer.stop()
        assert meta.offset == 0
        assert [r.value for r in (await client.fetch("aio-sasl", 0, offset=0)).records] == [b"hello"]


async def test_requests_before_authentication_close_the_connection(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, token=TOKEN, server__token=TOKEN, kafka__listen="127.0.0.1:0") as (
        daemon,
        _,
    ):
        wire = await Wire.connect(daemon.kafka_port)
        try:
            versions = await wire.request(18, 3, client_software_name="t", client_software_version="1")
            assert versions.error_code == ErrorCode.none  # allowed before authentication
            await wire.send_raw(struct.pack(">ihhih", 10, 3, 1, 99, -1))  # Metadata v1, no SASL
            assert await wire.frame() is None
        finally:
            await wire.aclose()
        wire = await Wire.connect(daemon.kafka_port)
        try:
            handshake = await wire.request(17, 1, mechanism="GSSAPI")
            assert handshake.error_code == ErrorCode.unsupported_sasl_mechanism
            assert handshake.mechanisms == ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
            assert (await wire.request(17, 1, mechanism="PLAIN")).error_code == ErrorCode.none
            refused = await wire.request(36, 2, auth_bytes=b"\0app\0not-the-token")
            assert refused.error_code == ErrorCode.sasl_authentication_failed
            assert await wire.frame() is None  # answered, then closed
        finally:
            await wire.aclose()
        wire = await Wire.connect(daemon.kafka_port)
        try:
            assert (await wire.request(17, 1, mechanism="PLAIN")).error_code == ErrorCode.none
            accepted = await wire.request(36, 2, auth_bytes=b"\0app\0" + TOKEN.encode())
            assert accepted.error_code == ErrorCode.none
            metadata = await wire.request(3, 1, topics=None)
            assert metadata.brokers[0].port == daemon.kafka_port
        finally:
            await wire.aclose()


async def test_a_large_frame_before_authentication_closes_the_connection(tmp_path: Path) -> None:
    """Before SASL authentication a frame is at most 512 KiB (as Kafka's SASL server bounds it):
    an unauthenticated peer cannot make the listener hold frame_bytes_max for it."""
    async with daemon_and_client(tmp_path, token=TOKEN, server__token=TOKEN, kafka__listen="127.0.0.1:0") as (
        daemon,
        _,
    ):
        wire = await Wire.connect(daemon.kafka_port)
        try:
            await wire.send_raw(struct.pack(">i", 512 * 1024 + 1))
            assert await wire.frame() is None
            assert daemon.kafka.budget.used == 0
            assert daemon.kafka.stats.closed_bad_frames == 1
        finally:
            await wire.aclose()
        wire = await Wire.connect(daemon.kafka_port)
        try:  # once authenticated, frames up to frame_bytes_max are read
            assert (await wire.request(17, 1, mechanism="PLAIN")).error_code == ErrorCode.none
            accepted = await wire.request(36, 2, auth_bytes=b"\0app\0" + TOKEN.encode())
            assert accepted.error_code == ErrorCode.none
            big = await wire.request(18, 3, client_software_name="x" * 600_000, client_software_version="1")
            assert big.error_code != ErrorCode.none or big.api_keys  # answered, not closed
        finally:
            await wire.aclose()


async def test_a_listener_without_a_token_speaks_no_sasl_as_kafkas_plaintext_listener(tmp_path: Path) -> None:
    """Without `server.token` the listener is Kafka's PLAINTEXT: SASL/PLAIN took any password
    (a setting that fails in production worked here) and SCRAM failed as if a token existed.
    Now both are ILLEGAL_SASL_STATE, as Kafka's broker answers them there, and the connection
    stays usable; librdkafka reports the error."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        wire = await Wire.connect(daemon.kafka_port)
        try:
            for mechanism in ("PLAIN", "SCRAM-SHA-256", "GSSAPI"):
                handshake = await wire.request(17, 1, mechanism=mechanism)
                assert (handshake.error_code, handshake.mechanisms) == (ErrorCode.illegal_sasl_state, ())
            refused = await wire.request(36, 2, auth_bytes=b"\0app\0anything")
            assert refused.error_code == ErrorCode.illegal_sasl_state
            assert "security.protocol=PLAINTEXT" in refused.error_message
            metadata = await wire.request(3, 1, topics=None)  # still open, no SASL needed
            assert metadata.brokers[0].port == daemon.kafka_port
        finally:
            await wire.aclose()
        errors = await anyio.to_thread.run_sync(wrong_password_fails, daemon.kafka_port)
        assert "SASL" in errors, errors
        assert daemon.kafka.stats.authentications_failed == 0


async def test_requests_before_authentication_are_logged_once_an_interval_naming_the_peer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """50 connections sending Metadata without SASL wrote 50 warning lines naming no one: now
    one names its peer, and a failed login (another reason) still gets its own line."""
    caplog.set_level(logging.INFO, "levelzero.kafka")
    async with daemon_and_client(tmp_path, token=TOKEN, server__token=TOKEN, kafka__listen="127.0.0.1:0") as (
        daemon,
        _,
    ):
        peers = []
        for _ in range(50):
            wire = await Wire.connect(daemon.kafka_port)
            try:
                peers.append(local_peer(wire))
                await wire.send_raw(struct.pack(">ihhih", 10, 3, 1, 99, -1))  # Metadata v1, no SASL
                assert await wire.frame() is None
            finally:
                await wire.aclose()
        assert daemon.kafka.stats.authentications_failed == 50
        before = lines_with(caplog, "before SASL authentication")
        assert 1 <= len(before) <= 2, before
        assert before[0] == (
            f"kafka: closing a connection from {peers[0]}: api key 3 before SASL authentication"
            " (the listener requires SASL)"
        )
        wire = await Wire.connect(daemon.kafka_port)
        peer = local_peer(wire)
        try:
            assert (await wire.request(17, 1, mechanism="PLAIN")).error_code == ErrorCode.none
            refused = await wire.request(36, 2, auth_bytes=b"\0app\0not-the-token")
            assert refused.error_code == ErrorCode.sasl_authentication_failed
            assert await wire.frame() is None
        finally:
            await wire.aclose()
        assert lines_with(caplog, "authentication failed") == [
            f"kafka: SASL/PLAIN authentication failed (a wrong password); closing the connection from {peer}"
        ]
