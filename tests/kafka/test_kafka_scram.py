"""SASL/SCRAM-SHA-256 and SCRAM-SHA-512 on the Kafka listener whenever the daemon has a token:
real clients (librdkafka, kafka-python, aiokafka) authenticate with any user name and the
token as password; a wrong password, a forged proof or a malformed message is answered
SASL_AUTHENTICATION_FAILED and the connection closed, without a traceback."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError as AIOKafkaError
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.errors import KafkaTimeoutError
from kio.schema.errors import ErrorCode
from scramp import ScramClient

from daemon_support import TOKEN, daemon_and_client
from test_kafka_listener import Wire
from test_kafka_sasl import sasl_round_trip, wrong_password_fails

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_librdkafka_scram(tmp_path: Path, mechanism: str) -> None:
    async with daemon_and_client(tmp_path, token=TOKEN, server__token=TOKEN, kafka__listen="127.0.0.1:0") as (
        daemon,
        client,
    ):
        got = await anyio.to_thread.run_sync(sasl_round_trip, daemon.kafka_port, TOKEN, mechanism)
        assert got == [(i, b"v%d" % i) for i in range(20)]
        assert (await client.fetch("secured", 0, offset=0)).high_watermark == 20
        errors = await anyio.to_thread.run_sync(wrong_password_fails, daemon.kafka_port, mechanism)
        assert "Authentication failed" in errors, errors
        assert daemon.kafka.stats.authentications_failed >= 1
        assert daemon.kafka.stats.errors == 0


def kafka_python_round_trip(port: int, mechanism: str, password: str) -> list[bytes]:
    common = {
        "bootstrap_servers": f"127.0.0.1:{port}",
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": "alice",
        "sasl_plain_password": password,
    }
    producer = KafkaProducer(**common)
    try:
        for i in range(5):
            producer.send("kp-scram", b"kp%d" % i, partition=0).get(30)
    finally:
        producer.close()
    consumer = KafkaConsumer(**common, consumer_timeout_ms=5000)
    try:
        consumer.assign([TopicPartition("kp-scram", 0)])
        consumer.seek_to_beginning()
        return [message.value for _, message in zip(range(5), consumer, strict=False)]
    finally:
        consumer.close()


def kafka_python_refused(port: int, mechanism: str) -> None:
    """kafka-python retries a refused bootstrap until its bootstrap timeout; each refusal is
    logged with the broker's error."""
    KafkaAdminClient(
        bootstrap_servers=f"127.0.0.1:{port}",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism=mechanism,
        sasl_plain_username="alice",
        sasl_plain_password="wrong-password",
        bootstrap_timeout_ms=2000,
    )


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_kafka_python_scram(tmp_path: Path, mechanism: str, caplog: pytest.LogCaptureFixture) -> None:
    async with daemon_and_client(tmp_path, token=TOKEN, server__token=TOKEN, kafka__listen="127.0.0.1:0") as (
        daemon,
        client,
    ):
        await client.create_topic("kp-scram", 1)
        got = await anyio.to_thread.run_sync(kafka_python_round_trip, daemon.kafka_port, mechanism, TOKEN)
        assert got == [b"kp%d" % i for i in range(5)]
        with caplog.at_level(logging.WARNING, logger="kafka"), pytest.raises(KafkaTimeoutError):
            await anyio.to_thread.run_sync(kafka_python_refused, daemon.kafka_port, mechanism)
        assert any("SaslAuthenticationFailedError" in r.getMessage() for r in caplog.records), caplog.text
        assert daemon.kafka.stats.authentications_failed >= 1
        assert daemon.kafka.stats.errors == 0
        assert (await client.fetch("kp-scram", 0, offset=0)).high_watermark == 5


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_aiokafka_scram(tmp_path: Path, mechanism: str) -> None:
    async with daemon_and_client(tmp_path, token=TOKEN, server__token=TOKEN, kafka__listen="127.0.0.1:0") as (
        daemon,
        client,
    ):
        await client.create_topic("aio-scram", 1)

        def producer(password: str) -> AIOKafkaProducer:
            return AIOKafkaProducer(
                bootstrap_servers=f"127.0.0.1:{daemon.kafka_port}",
                security_protocol="SASL_PLAINTEXT",
                sasl_mechanism=mechanism,
                sasl_plain_username="app",
                sasl_plain_password=password,
            )

        good = producer(TOKEN)
        await good.start()
        try:
            meta = await good.send_and_wait("aio-scram", b"hello", partition=0)
        finally:
            await good.stop()
        assert meta.offset == 0
        bad = producer("wrong-password")
        with pytest.raises(AIOKafkaError):
            await bad.start()
        await bad.stop()
        assert daemon.kafka.stats.authentications_failed >= 1
        assert [r.value for r in (await client.fetch("aio-scram", 0, offset=0)).records] == [b"hello"]


async def scram_exchange(port: int, mechanism: str, password: str) -> tuple[Wire, Any]:
    """Handshake and both SCRAM round trips on a raw connection; the last answer."""
    wire = await Wire.connect(port)
    handshake = await wire.request(17, 1, mechanism=mechanism)
    assert handshake.error_code == ErrorCode.none
    assert handshake.mechanisms == ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
    scram = ScramClient([mechanism], "app", password)
    first = await wire.request(36, 2, auth_bytes=scram.get_client_first().encode())
    assert first.error_code == ErrorCode.none
    scram.set_server_first(first.auth_bytes.decode())
    assert f",i={4096}" in first.auth_bytes.decode()  # Kafka's iteration count
    return wire, await wire.request(36, 2, auth_bytes=scram.get_client_final().encode())


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_scram_on_the_wire(tmp_path: Path, mechanism: str) -> None:
    """The server proves it knows the token (its final message verifies), a wrong password and
    malformed messages are refused and the connection closed; nothing reaches the error log."""
    async with daemon_and_client(tmp_path, token=TOKEN, server__token=TOKEN, kafka__listen="127.0.0.1:0") as (
        daemon,
        _,
    ):
        wire, final = await scram_exchange(daemon.kafka_port, mechanism, TOKEN)
        try:
            assert final.error_code == ErrorCode.none
            assert final.auth_bytes.startswith(b"v=")
            metadata = await wire.request(3, 1, topics=None)
            assert metadata.brokers[0].port == daemon.kafka_port
        finally:
            await wire.aclose()
        wire, final = await scram_exchange(daemon.kafka_port, mechanism, "not-the-token")
        try:
            assert final.error_code == ErrorCode.sasl_authentication_failed
            assert mechanism in final.error_message
            assert await wire.frame() is None  # answered, then closed
        finally:
            await wire.aclose()
        for first, second in (
            (b"\xff\xfe", None),  # not UTF-8
            (b"n,,", None),  # no user, no nonce
            (b"garbage", None),
            (b"n,,n=app,r=abc", b"c=biws,r=wrong-nonce,p=AAAA"),
            (b"n,,n=app,r=abc", b"not a final message"),
        ):
            wire = await Wire.connect(daemon.kafka_port)
            try:
                assert (await wire.request(17, 1, mechanism=mechanism)).error_code == ErrorCode.none
                answer = await wire.request(36, 2, auth_bytes=first)
                if second is not None:
                    assert answer.error_code == ErrorCode.none
                    answer = await wire.request(36, 2, auth_bytes=second)
                assert answer.error_code == ErrorCode.sasl_authentication_failed, (first, second)
                assert await wire.frame() is None
            finally:
                await wire.aclose()
        assert daemon.kafka.stats.authentications_failed == 6
        assert daemon.kafka.stats.errors == 0
