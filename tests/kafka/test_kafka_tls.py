"""Optional TLS on the Kafka listener: confluent-kafka over SSL and SASL_SSL against a throwaway
CA made here with the openssl command; a plaintext client against the TLS listener is dropped
and the listener keeps serving; bad TLS settings stop the start-up naming the key."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import anyio
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from levelzero.config import ConfigError

from daemon_support import TOKEN, daemon_and_client, daemon_config

RECORDS = 20


def make_certificates(directory: Path) -> dict[str, Path]:
    """A self-signed CA and a server certificate for 127.0.0.1 it signed (EC keys: quick)."""
    files = {
        name: directory / name for name in ("ca.pem", "ca.key", "server.pem", "server.key", "server.csr")
    }
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for args in (
        [
            "req",
            "-x509",
            *ec,
            "-keyout",
            files["ca.key"],
            "-out",
            files["ca.pem"],
            "-days",
            "2",
            "-subj",
            "/CN=levelzero test CA",
        ],
        ["req", *ec, "-keyout", files["server.key"], "-out", files["server.csr"], "-subj", "/CN=127.0.0.1"],
        [
            "x509",
            "-req",
            "-in",
            files["server.csr"],
            "-CA",
            files["ca.pem"],
            "-CAkey",
            files["ca.key"],
            "-CAcreateserial",
            "-out",
            files["server.pem"],
            "-days",
            "2",
            "-extfile",
            directory / "san.ext",
        ],
    ):
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)
    return files


def tls_round_trip(port: int, ca: Path, topic: str, sasl_password: str | None) -> list[tuple[int, bytes]]:
    common = {
        "bootstrap.servers": f"127.0.0.1:{port}",
        "security.protocol": "SSL",
        "ssl.ca.location": str(ca),
    }
    if sasl_password is not None:
        common.update(
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanisms": "PLAIN",
                "sasl.username": "app",
                "sasl.password": sasl_password,
            }
        )
    admin = AdminClient(common)
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(30)
    producer = Producer(common)
    for i in range(RECORDS):
        producer.produce(topic, value=b"v%d" % i, partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer({**common, "group.id": "tls", "enable.auto.commit": False})
    got: list[tuple[int, bytes]] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        for _ in range(100):
            for message in consumer.consume(100, 0.5):
                assert message.error() is None
                got.append((message.offset(), message.value()))
            if len(got) == RECORDS:
                break
    finally:
        consumer.close()
    return got


def plaintext_is_dropped(port: int) -> bytes:
    """An ApiVersions request sent in the clear: the TLS listener closes the connection."""
    frame = b"\x00\x12\x00\x03\x00\x00\x00\x01\x00\x04test\x00\x04kcat\x010\x00"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(len(frame).to_bytes(4, "big") + frame)
        received = b""
        try:
            for _ in range(100):  # bounded: a TLS alert at most, then end of stream
                chunk = sock.recv(4096)
                if not chunk:
                    break
                received += chunk
        except ConnectionResetError:
            pass
    return received


async def test_confluent_kafka_over_tls_and_a_plaintext_client_is_dropped(tmp_path: Path) -> None:
    files = make_certificates(tmp_path)
    async with daemon_and_client(
        tmp_path / "data",
        kafka__listen="127.0.0.1:0",
        kafka__tls_cert_file=str(files["server.pem"]),
        kafka__tls_key_file=str(files["server.key"]),
    ) as (daemon, client):
        received = await anyio.to_thread.run_sync(plaintext_is_dropped, daemon.kafka_port)
        # Whatever came back is no Kafka response: at most a TLS alert record (content type 21).
        assert received == b"" or received[0] == 21, received
        assert daemon.kafka.stats.requests == 0
        got = await anyio.to_thread.run_sync(tls_round_trip, daemon.kafka_port, files["ca.pem"], "tls", None)
        assert got == [(i, b"v%d" % i) for i in range(RECORDS)]
        assert (await client.fetch("tls", 0, offset=0)).high_watermark == RECORDS
        # Still serving plaintext attempts and TLS clients after both.
        await anyio.to_thread.run_sync(plaintext_is_dropped, daemon.kafka_port)
        assert [r.value for r in (await client.fetch("tls", 0, offset=0)).records][:2] == [b"v0", b"v1"]


async def test_sasl_ssl_with_the_token(tmp_path: Path) -> None:
    files = make_certificates(tmp_path)
    async with daemon_and_client(
        tmp_path / "data",
        token=TOKEN,
        server__token=TOKEN,
        kafka__listen="127.0.0.1:0",
        kafka__tls_cert_file=str(files["server.pem"]),
        kafka__tls_key_file=str(files["server.key"]),
    ) as (daemon, client):
        got = await anyio.to_thread.run_sync(
            tls_round_trip, daemon.kafka_port, files["ca.pem"], "sasl-tls", TOKEN
        )
        assert got == [(i, b"v%d" % i) for i in range(RECORDS)]
        assert (await client.fetch("sasl-tls", 0, offset=0)).high_watermark == RECORDS
        assert daemon.kafka.stats.authentications_failed == 0


def test_bad_tls_settings_name_the_key(tmp_path: Path) -> None:
    files = make_certificates(tmp_path)
    with pytest.raises(ConfigError, match="tls_cert_file and tls_key_file go together"):
        daemon_config(tmp_path, kafka__listen="127.0.0.1:0", kafka__tls_cert_file=str(files["server.pem"]))
    with pytest.raises(ConfigError, match="tls_client_ca_file needs tls_cert_file"):
        daemon_config(tmp_path, kafka__listen="127.0.0.1:0", kafka__tls_client_ca_file=str(files["ca.pem"]))
    with pytest.raises(ConfigError, match="tls_cert_file/tls_key_file: cannot load"):
        daemon_config(
            tmp_path,
            kafka__listen="127.0.0.1:0",
            kafka__tls_cert_file=str(tmp_path / "missing.pem"),
            kafka__tls_key_file=str(files["server.key"]),
        )
    with pytest.raises(ConfigError, match="tls_cert_file/tls_key_file: cannot load"):
        daemon_config(
            tmp_path,
            kafka__listen="127.0.0.1:0",
            kafka__tls_cert_file=str(files["server.pem"]),
            kafka__tls_key_file=str(files["ca.key"]),
        )  # a key that does not match
    with pytest.raises(ConfigError, match="tls_client_ca_file: cannot load"):
        daemon_config(
            tmp_path,
            kafka__listen="127.0.0.1:0",
            kafka__tls_cert_file=str(files["server.pem"]),
            kafka__tls_key_file=str(files["server.key"]),
            kafka__tls_client_ca_file=str(tmp_path / "san.ext"),
        )
    config = daemon_config(
        tmp_path,
        kafka__listen="127.0.0.1:0",
        kafka__tls_cert_file=str(files["server.pem"]),
        kafka__tls_key_file=str(files["server.key"]),
        kafka__tls_client_ca_file=str(files["ca.pem"]),
    )
    context = config.kafka.tls_context()
    assert context is not None
    assert context.minimum_version.name == "TLSv1_2"
    assert context.verify_mode.name == "CERT_REQUIRED"


def make_client_certificate(directory: Path, files: dict[str, Path]) -> tuple[Path, Path]:
    key, csr, cert = directory / "client.key", directory / "client.csr", directory / "client.pem"
    for args in (
        [
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            key,
            "-out",
            csr,
            "-subj",
            "/CN=app",
        ],
        [
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            files["ca.pem"],
            "-CAkey",
            files["ca.key"],
            "-CAcreateserial",
            "-out",
            cert,
            "-days",
            "2",
        ],
    ):
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)
    return cert, key


def produce_one(port: int, ca: Path, client_cert: tuple[Path, Path] | None) -> list[str | None]:
    """The delivery report of one produce: [None] when it was stored, else [its error]."""

    config = {
        "bootstrap.servers": f"127.0.0.1:{port}",
        "security.protocol": "SSL",
        "ssl.ca.location": str(ca),
        "message.timeout.ms": 3000,
    }
    if client_cert is not None:
        config.update(
            {"ssl.certificate.location": str(client_cert[0]), "ssl.key.location": str(client_cert[1])}
        )
    producer = Producer(config)
    reports: list[str | None] = []
    producer.produce(
        "mtls",
        value=b"signed" if client_cert else b"anonymous",
        partition=0,
        on_delivery=lambda err, _msg: reports.append(None if err is None else str(err)),
    )
    assert producer.flush(10) == 0
    return reports


async def test_mutual_tls_admits_only_clients_with_a_certificate_the_ca_signed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = make_certificates(tmp_path)
    client_cert = make_client_certificate(tmp_path, files)
    async with daemon_and_client(
        tmp_path / "data",
        kafka__listen="127.0.0.1:0",
        kafka__tls_cert_file=str(files["server.pem"]),
        kafka__tls_key_file=str(files["server.key"]),
        kafka__tls_client_ca_file=str(files["ca.pem"]),
    ) as (daemon, client):
        await client.create_topic("mtls", 1)
        refused = await anyio.to_thread.run_sync(produce_one, daemon.kafka_port, files["ca.pem"], None)
        assert len(refused) == 1 and refused[0] is not None, refused
        failed = [r for r in caplog.records if "TLS handshake failed" in r.getMessage()]
        assert failed and all(r.levelname == "WARNING" and r.exc_info is None for r in failed)
        assert daemon.kafka.stats.requests == 0
        assert await anyio.to_thread.run_sync(
            produce_one, daemon.kafka_port, files["ca.pem"], client_cert
        ) == [None]
        assert [r.value for r in (await client.fetch("mtls", 0, offset=0)).records] == [b"signed"]


def plaintext_is_dropped_from(port: int) -> str:
    """`plaintext_is_dropped`, from a socket whose address is known: it, as log lines name it."""
    frame = b"\x00\x12\x00\x03\x00\x00\x00\x01\x00\x04test\x00\x04kcat\x010\x00"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        host, local_port = sock.getsockname()[:2]
        sock.sendall(len(frame).to_bytes(4, "big") + frame)
        try:
            for _ in range(100):  # bounded: a TLS alert at most, then end of stream
                if not sock.recv(4096):
                    break
        except ConnectionResetError:
            pass
    return f"{host}:{local_port}"


async def test_failed_tls_handshakes_are_logged_once_an_interval_naming_the_peer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """50 plaintext clients on the TLS port wrote 50 warning lines naming no one: now one
    names its peer (the others are counted on the next line an interval later)."""
    files = make_certificates(tmp_path)
    async with daemon_and_client(
        tmp_path / "data",
        kafka__listen="127.0.0.1:0",
        kafka__tls_cert_file=str(files["server.pem"]),
        kafka__tls_key_file=str(files["server.key"]),
    ) as (daemon, _):
        peers = [
            await anyio.to_thread.run_sync(plaintext_is_dropped_from, daemon.kafka_port) for _ in range(50)
        ]
        with anyio.fail_after(10):  # the listener closes the last one as the client does
            while sum("TLS handshake failed" in r.getMessage() for r in caplog.records) == 0:
                await anyio.sleep(0.01)
        await anyio.sleep(0.2)
        failed = [r.getMessage() for r in caplog.records if "TLS handshake failed" in r.getMessage()]
        assert 1 <= len(failed) <= 2, failed
        assert failed[0].startswith(f"kafka: TLS handshake failed; closing the connection from {peers[0]}: ")
        assert daemon.kafka.stats.requests == 0
