"""Run kafka-python's own integration suite against levelzero daemons.

kafka-python (https://github.com/dpkp/kafka-python) ships an integration suite,
``test/integration``, whose broker fixture (``KafkaFixture``) starts a Kafka broker for each
test module. This script runs that suite with the fixture pointed at levelzero instead: this
file is also a pytest plugin (loaded with ``-p``) that replaces the fixture's broker start with
``levelzero run`` on embedded defaults (SQLite, local objects) in the fixture's temporary
directory, with a Kafka listener on the fixture's loopback port and what the fixture asks for:

- topic auto-creation and the default partition count of the suite's broker template
  (``auto.create.topics.enable=true``, ``num.partitions=4``);
- ``transport="SASL_PLAINTEXT"``: ``server.token`` set to the fixture's password (the listener
  takes any user name and the token as password with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512, so
  the fixture's SCRAM user needs no ``kafka-configs.sh`` step);
- ``transport="SSL"``: a CA and a server certificate for ``localhost`` made in the fixture's
  ``ssl_dir`` (``ca-cert``, as the suite's Java keystore step makes it) and
  ``kafka.tls_cert_file`` / ``kafka.tls_key_file``.

Topic listing (``get_topic_names``, a ``kafka-topics.sh`` call in the suite) goes through
kafka-python's admin client instead. The suite runs with its own kafka-python package (the
checkout's), and the count is pytest's summary line.

The suite's source is not in this repository and CI does not have it, so this is not part of
``make test``. Get it at the tag the counts in docs/kafka.md were taken at::

    git clone --branch 3.0.11 --depth 1 https://github.com/dpkp/kafka-python /tmp/kafka-python
    .venv/bin/pip install pytest-timeout lz4 zstandard python-snappy
    .venv/bin/python scripts/kafka_python_suite.py /tmp/kafka-python [pytest args...]

Extra arguments go to pytest (e.g. ``-k test_admin``, ``-x``; ``-p no:logging`` silences the
suite's DEBUG logging). The suite's pytest options need pytest-timeout, and it skips its
compression tests without the codecs' libraries. ``KAFKA_VERSION`` (default 4.2.0, the suite's
own default) is the broker version the suite assumes: it picks tests and the clients'
``api_version`` by it. A daemon's log is printed when it logged errors.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

READY_WAIT_S = 60.0
LEVELZERO = Path(os.environ.get("LEVELZERO_SUITE_EXECUTABLE", Path(sys.executable).with_name("levelzero")))
# The fixture's SASL password becomes the daemon's token, which must be 16 characters or more.
SASL_PASSWORD = "alice-secret-for-levelzero"  # noqa: S105 - a throwaway daemon's, on loopback


def wait_listening(port: int, daemon: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_WAIT_S
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise RuntimeError(f"levelzero exited with status {daemon.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"levelzero's Kafka listener did not open port {port} within {READY_WAIT_S:.0f} s")


def make_certificates(directory: Path) -> tuple[Path, Path]:
    """A CA (``ca-cert``) and a server certificate for localhost signed by it; returns the
    server's certificate and key files."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "levelzero suite CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    (directory / "ca-cert").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file, key_file = directory / "server.pem", directory / "server.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file


class LevelzeroChild:
    """The daemon as the fixture's ``child``: ``stop`` and ``dump_logs``."""

    def __init__(self, process: subprocess.Popen[bytes], log_file: Path) -> None:
        self.process = process
        self.log_file = log_file

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        text = self.log_file.read_text(errors="replace")
        if "level=error" in text or "Traceback" in text:
            print(f"levelzero ({self.log_file}) logged errors:\n{text[-8000:]}", file=sys.stderr)

    def dump_logs(self) -> None:
        pass


def start_levelzero(fixture: Any) -> bool:
    """KafkaFixture.start, replaced: a levelzero daemon as the broker the fixture describes."""
    import py  # noqa: PLC0415 - pytest's, inside the suite only

    if fixture.running:
        return True
    if fixture.tmp_dir is None:
        fixture.tmp_dir = py.path.local.mkdtemp()
    tmp = Path(fixture.tmp_dir.strpath)
    fixture.host = "127.0.0.1"
    env = {
        **os.environ,
        "LEVELZERO_KAFKA_LISTEN": f"127.0.0.1:{fixture.port}",
        "LEVELZERO_KAFKA_AUTO_CREATE_TOPICS": "true" if fixture.auto_create_topic else "false",
        "LEVELZERO_KAFKA_DEFAULT_PARTITIONS": str(fixture.partitions),
    }
    if fixture.sasl_enabled:
        env["LEVELZERO_TOKEN"] = fixture.broker_password
    if fixture.ssl_enabled:
        fixture.ssl_dir = str(tmp / "ssl")
        cert, key = make_certificates(Path(fixture.ssl_dir))
        env["LEVELZERO_KAFKA_TLS_CERT_FILE"], env["LEVELZERO_KAFKA_TLS_KEY_FILE"] = str(cert), str(key)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        http_port = sock.getsockname()[1]
    log_file = tmp / "levelzero.log"
    with open(log_file, "wb") as log:
        process = subprocess.Popen(  # noqa: S603 - our own executable, our own arguments
            [
                str(LEVELZERO),
                "run",
                "--data-dir",
                str(tmp / "levelzero"),
                "--listen",
                f"127.0.0.1:{http_port}",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_listening(fixture.port, process)
    except RuntimeError:
        process.kill()
        process.wait()
        print(log_file.read_text(errors="replace")[-8000:], file=sys.stderr)
        raise
    fixture.child = LevelzeroChild(process, log_file)
    fixture.running = True
    return True


def open_levelzero(fixture: Any) -> None:
    start_levelzero(fixture)


def topic_names(fixture: Any) -> list[str]:
    from kafka import KafkaAdminClient  # noqa: PLC0415 - the checkout's, inside the suite only

    params = fixture._enrich_client_params({}, client_id="topic_lister")  # noqa: SLF001 - the suite's own
    with KafkaAdminClient(**params) as admin:
        return sorted(admin.list_topics())


def pytest_configure() -> None:
    """The plugin: the suite's KafkaFixture starts levelzero (see the module's docstring)."""
    from test.integration import fixtures  # noqa: PLC0415 - the suite's, importable inside it only

    fixtures.KafkaFixture.broker_password = SASL_PASSWORD
    fixtures.KafkaFixture.start = start_levelzero
    fixtures.KafkaFixture.open = open_levelzero
    fixtures.KafkaFixture.get_topic_names = topic_names


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("source", type=Path, help="a kafka-python checkout (tag 3.0.11)")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="passed to pytest")
    args = parser.parse_args()
    source = args.source.resolve()
    if not (source / "test" / "integration" / "conftest.py").is_file():
        raise SystemExit(f"{source} has no test/integration/conftest.py: not a kafka-python checkout")
    if not LEVELZERO.is_file():
        raise SystemExit(f"{LEVELZERO} not found: run this with the venv's python (.venv/bin/python)")
    with tempfile.TemporaryDirectory(prefix="levelzero-kafka-python-") as tmp:
        env = {
            **os.environ,
            "KAFKA_VERSION": os.environ.get("KAFKA_VERSION", "4.2.0"),
            # The fixture checks that a Kafka installation directory exists; nothing in it runs.
            "KAFKA_ROOT": tmp,
            "PYTHONPATH": str(Path(__file__).resolve().parent),
        }
        env.pop("KAFKA_URI", None)
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", Path(__file__).stem]
        command += ["-q", "-rfEs", "test/integration", *args.pytest_args]
        # the suite the user pointed at, run as they asked
        return subprocess.run(command, cwd=source, env=env, check=False).returncode  # noqa: S603


if __name__ == "__main__":
    sys.exit(main())
