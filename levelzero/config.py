"""Daemon configuration: embedded defaults < TOML file < LEVELZERO_* environment < command line.

Every source is merged into one plain dict first and validated once, by msgspec, against the
`Config` Struct tree below (`forbid_unknown_fields=True`), so a misspelt key, a wrong type or an
out-of-range value stops the start-up with a message naming the key (`server.listen: ...`) and
where the value came from: the file, a `LEVELZERO_*` variable or a flag (`--listen`).

Environment variables: `LEVELZERO_<SECTION>_<KEY>` for every key (`LEVELZERO_S3_BUCKET`,
`LEVELZERO_BATCHER_LINGER_MS`), plus the short aliases in `ENV_ALIASES` (`LEVELZERO_LISTEN`,
`LEVELZERO_DATA_DIR`, `LEVELZERO_TOKEN`). Secrets (the token, S3 credentials) belong in the
environment, e.g. a systemd `EnvironmentFile`; `describe()` masks them so they are never logged.

Adding a section (say `[gc]`): write a `GcSection` Struct like the ones below and add a
`gc: GcSection = msgspec.field(default_factory=GcSection)` field to `Config`. A section that
mirrors an actor's config (`[batcher]`, `[reconciler]`, `[housekeeper]`, `[gc]`) uses the same
key names and lets the actor's config check the values (`to_<actor>_config()`). The environment
mapping, error messages, `describe()` and `levelzero config show` follow from the Struct;
document the keys in `levelzero/deploy/levelzero.toml` and docs/configuration.md (a test checks
the reference names every key).
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import socket
import stat
import urllib.parse
import ssl
import tomllib
from collections.abc import Mapping
import typing
from typing import Any, Literal

import msgspec

from levelzero.actors.batcher import BatcherConfig
from levelzero.actors.gc import GcConfig
from levelzero.actors.housekeeper import HousekeeperConfig
from levelzero.actors.node import NodeConfig
from levelzero.actors.compactor import CompactorConfig
from levelzero.actors.intake import IDEMPOTENCY_KEY_RETENTION_S_DEFAULT
from levelzero.actors.reconciler import ReconcilerConfig
from levelzero.core.errors import InvalidInput, LevelZeroError
from levelzero.core.fence import FenceMode
from levelzero.storage.prefixed_store import check_key_prefix

MiB = 1024 * 1024
DEFAULT_PORT = 8420
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"
DEFAULT_DATA_DIR = "./levelzero-data"
TOKEN_LENGTH_MIN = 16
TOKEN_RULE = "printable ASCII without spaces ('!' to '~')"  # noqa: S105 - a rule, not a token
BODY_BYTES_MAX_LIMIT = 256 * MiB
RECORDS_PER_REQUEST_LIMIT = 1_000_000

ENV_PREFIX = "LEVELZERO_"
# Short names for the settings people set most; the long form works for these too.
ENV_ALIASES: dict[str, tuple[str, str]] = {
    "LEVELZERO_LISTEN": ("server", "listen"),
    "LEVELZERO_TOKEN": ("server", "token"),
    "LEVELZERO_DATA_DIR": ("storage", "data_dir"),
}
# LEVELZERO_* variables that are not daemon settings (the client's, the tests').
ENV_NOT_SETTINGS = ("LEVELZERO_URL", "LEVELZERO_CONFIG")
ENV_NOT_SETTINGS_PREFIXES = ("LEVELZERO_TEST_",)
SECRET_KEYS = frozenset(
    {
        ("server", "token"),
        ("s3", "access_key"),
        ("s3", "secret_key"),
        ("s3", "session_token"),
        ("control", "password"),
    }
)
# Secrets that may come from the environment only, never from the TOML file.
ENV_ONLY_KEYS = frozenset({("control", "password")})


class ConfigError(LevelZeroError):
    """The configuration is unusable; the message names the key and the source."""

    code = "invalid_config"


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    pass


def parse_listen(listen: str) -> tuple[str, int]:
    """`HOST:PORT` or `[IPv6]:PORT` -> (host, port). Raises ValueError naming the problem."""
    host, sep, port_text = listen.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"listen must be HOST:PORT (e.g. {DEFAULT_LISTEN}), not {listen!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"listen: write an IPv6 address in brackets, e.g. [::1]:{DEFAULT_PORT}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"listen port {port} is outside 0..65535")
    return host, port


WILDCARD_HOSTS = ("", "0.0.0.0", "::")  # noqa: S104 - names of the wildcard, not a bind


def listens_overlap(a: str, b: str) -> bool:
    """Whether two `HOST:PORT` listen addresses would take the same socket: the same port (not
    0, which picks a free one) on the same host, or on a wildcard address and any host."""
    (host_a, port_a), (host_b, port_b) = parse_listen(a), parse_listen(b)
    if port_a != port_b or port_a == 0:
        return False
    host_a, host_b = host_a.lower(), host_b.lower()
    return host_a == host_b or host_a in WILDCARD_HOSTS or host_b in WILDCARD_HOSTS


def token_problem(token: str) -> str | None:
    """The one token rule, shared by the daemon's configuration and the client: printable ASCII
    without spaces, so it travels unchanged in `Authorization: Bearer ...` (HTTP header values
    are bytes; a non-ASCII token could never match what a client sends). Never quotes the token."""
    for index, char in enumerate(token):
        if not "!" <= char <= "~":
            return f"token character {index + 1} is not allowed: a token is {TOKEN_RULE}"
    return None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


class ServerSection(_Section):
    listen: str = DEFAULT_LISTEN
    token: str = ""  # bearer token; required unless listen is a loopback address
    body_bytes_max: int = 8 * MiB
    # Request bodies all HTTP requests together hold (each counted at its Content-Length, at
    # most body_bytes_max; a chunked one at body_bytes_max); a request waits for room.
    inflight_body_bytes_max: int = 256 * MiB
    records_per_request_max: int = 10_000
    fetch_bytes_default: int = 1 * MiB
    connections_max: int = 1024
    connections_per_peer_max: int = 512  # one client address holds at most this many
    header_timeout_s: float = 10.0  # a request head must arrive within this
    body_timeout_s: float = 60.0  # a request body must arrive within this after its head
    keepalive_timeout_s: float = 5.0  # an idle kept-alive connection is closed after this
    shutdown_timeout_s: float = 30.0
    access_log: bool = False
    # A produce's idempotency_key is honoured at least this long (its stored batch is then
    # forgotten, so the keys table does not grow forever); 0 keeps every key.
    idempotency_key_retention_s: float = IDEMPOTENCY_KEY_RETENTION_S_DEFAULT

    def __post_init__(self) -> None:
        host, _ = parse_listen(self.listen)
        problem = token_problem(self.token)
        if problem:
            raise ValueError(problem)
        if self.token and len(self.token) < TOKEN_LENGTH_MIN:
            raise ValueError(f"token must be at least {TOKEN_LENGTH_MIN} characters")
        if not self.token and not is_loopback(host):
            raise ValueError(
                f"token is required when listen ({self.listen}) is not a loopback address: "
                "set server.token, or LEVELZERO_TOKEN in the environment file"
            )
        if not (
            self.idempotency_key_retention_s == 0
            or 60 <= self.idempotency_key_retention_s <= 10 * 365 * 86_400
        ):
            raise ValueError("idempotency_key_retention_s must be 0 (keep every key) or in 60..315360000 s")
        if not 1024 <= self.body_bytes_max <= BODY_BYTES_MAX_LIMIT:
            raise ValueError(f"body_bytes_max must be in 1024..{BODY_BYTES_MAX_LIMIT}")
        if not self.body_bytes_max <= self.inflight_body_bytes_max <= 16 * 1024 * MiB:
            raise ValueError("inflight_body_bytes_max must be at least body_bytes_max (and at most 16 GiB)")
        if not 1 <= self.records_per_request_max <= RECORDS_PER_REQUEST_LIMIT:
            raise ValueError(f"records_per_request_max must be in 1..{RECORDS_PER_REQUEST_LIMIT}")
        if not 1 <= self.fetch_bytes_default <= 16 * MiB:
            raise ValueError("fetch_bytes_default must be in 1..16777216")
        if not 1 <= self.connections_max <= 100_000:
            raise ValueError("connections_max must be in 1..100000")
        if not 1 <= self.connections_per_peer_max <= 100_000:
            raise ValueError("connections_per_peer_max must be in 1..100000")
        if not 0.1 <= self.header_timeout_s <= 3600:
            raise ValueError("header_timeout_s must be in 0.1..3600")
        if not 0.1 <= self.body_timeout_s <= 3600:
            raise ValueError("body_timeout_s must be in 0.1..3600")
        if not 0.1 <= self.keepalive_timeout_s <= 3600:
            raise ValueError("keepalive_timeout_s must be in 0.1..3600")
        if not 1 <= self.shutdown_timeout_s <= 3600:
            raise ValueError("shutdown_timeout_s must be in 1..3600")

    @property
    def host(self) -> str:
        return parse_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return parse_listen(self.listen)[1]


class StorageSection(_Section):
    kind: Literal["local", "s3"] = "local"
    data_dir: str = DEFAULT_DATA_DIR  # SQLite database; local objects under data_dir/objects
    sqlite_synchronous: Literal["FULL", "NORMAL"] = "FULL"
    local_fsync: bool = True  # false: faster, and a crash may lose acknowledged records
    # Local objects elsewhere than data_dir/objects: a directory several nodes of one host
    # share (`levelzero demo --nodes N` runs its cluster on one).
    objects_path: str = ""

    def __post_init__(self) -> None:
        if not self.data_dir:
            raise ValueError("data_dir must not be empty")

    @property
    def db_path(self) -> str:
        return os.path.join(self.data_dir, "levelzero.db")

    @property
    def objects_dir(self) -> str:
        return self.objects_path or os.path.join(self.data_dir, "objects")


class ControlSection(_Section):
    """Where the control plane lives (partition logs, epoch, metastore, catalog, events):
    SQLite in data_dir (one node), or a PostgreSQL database (shared). The PostgreSQL password
    comes from LEVELZERO_CONTROL_PASSWORD or `password_file`, never from the DSN or this file."""

    kind: Literal["sqlite", "postgres"] = "sqlite"
    dsn: str = ""  # postgresql://USER@HOST:PORT/DATABASE (no password in it)
    password: str = ""  # environment only: LEVELZERO_CONTROL_PASSWORD
    password_file: str = ""  # a file holding the password (its first line)
    pool_max: int = 8
    writers: int = 2
    connect_timeout_s: float = 10.0
    reconnect_timeout_s: float = 30.0
    # History rows (fence events, state samples, GC rounds, deleted L0 objects' rows: what
    # `levelzero export` reads) older than this are pruned, hourly (0: kept forever)
    history_retention_s: float = 7 * 86_400.0

    def __post_init__(self) -> None:
        if self.history_retention_s != 0 and not 3600 <= self.history_retention_s <= 3650 * 86_400:
            raise ValueError("history_retention_s must be 0 (keep forever) or in 3600..315360000 (10 years)")
        if self.dsn:
            if not self.dsn.startswith(("postgresql://", "postgres://")):
                raise ValueError("dsn must start with postgresql://")
            netloc = self.dsn.split("://", 1)[1].split("/", 1)[0]
            # In the user part or as a parameter (`?password=`, libpq's `sslpassword` for a
            # client key): either would be shown wherever the DSN is (config show, logs).
            query = urllib.parse.urlsplit(self.dsn).query
            named = {k.lower() for k, _ in urllib.parse.parse_qsl(query, keep_blank_values=True)}
            if ("@" in netloc and ":" in netloc.rsplit("@", 1)[0]) or named & {"password", "sslpassword"}:
                raise ValueError(
                    "dsn must not hold a password: set LEVELZERO_CONTROL_PASSWORD or control.password_file"
                )
            # libpq takes `?host=` and `?port=` beside a host in the URL; the driver (asyncpg)
            # does not: it connected to the URL's host at port 5432, and its refusal named no
            # address, so the port in the DSN seemed to refuse.
            if netloc.rsplit("@", 1)[-1] and named & {"host", "port"}:
                raise ValueError(
                    "dsn names a host and also ?host= or ?port=, which the PostgreSQL driver "
                    "ignores beside a host: write postgresql://USER@HOST:PORT/DATABASE (or leave the "
                    "host out of the URL to give it as ?host=, e.g. a Unix socket directory)"
                )
        if self.password and self.password_file:
            raise ValueError("set the password or password_file, not both")
        if not (1 <= self.writers < self.pool_max <= 1000):
            raise ValueError("need 1 <= writers < pool_max <= 1000")
        if not (0 < self.connect_timeout_s <= 600 and 0 < self.reconnect_timeout_s <= 3600):
            raise ValueError("connect_timeout_s must be in (0, 600], reconnect_timeout_s in (0, 3600]")

    def read_password(self) -> str | None:
        """The password (environment or file), None when neither is set (then libpq's
        PGPASSWORD / ~/.pgpass apply). Raises ConfigError if the file cannot be read."""
        if self.password:
            return self.password
        if not self.password_file:
            return None
        try:
            with open(self.password_file, encoding="utf-8") as file:
                return file.readline().rstrip("\r\n")
        except OSError as exc:
            raise ConfigError(
                f"control.password_file: cannot read {self.password_file}: {exc.strerror}"
            ) from None


class S3Section(_Section):
    endpoint: str = ""  # empty: AWS S3; e.g. http://127.0.0.1:9000 for MinIO
    bucket: str = ""
    key_prefix: str = ""  # e.g. "clusters/east/": lets several clusters share one bucket
    region: str = "us-east-1"
    path_style: bool = False  # true for MinIO
    access_key: str = ""  # empty: botocore's chain (AWS_ACCESS_KEY_ID, profiles, roles)
    secret_key: str = ""
    session_token: str = ""
    create_bucket: bool = False
    concurrency: int = 64
    max_attempts: int = 5
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.endpoint and not re.match(r"^https?://[^/\s]+", self.endpoint):
            raise ValueError(f"endpoint must be an http:// or https:// URL, not {self.endpoint!r}")
        check_key_prefix(self.key_prefix)  # InvalidInput (a ValueError) names the problem
        if bool(self.access_key) != bool(self.secret_key):
            raise ValueError("access_key and secret_key must be given together (or neither)")
        if not 1 <= self.concurrency <= 1024:
            raise ValueError("concurrency must be in 1..1024")
        if not 1 <= self.max_attempts <= 20:
            raise ValueError("max_attempts must be in 1..20")
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ValueError("connect_timeout_s and read_timeout_s must be positive")


EPOCH_BUMP_INTERVAL_S_MIN = 0.1  # seconds: at most ten cluster-epoch bumps a second


class NodeSection(_Section):
    fencing_mode: Literal["windowed", "strict"] = "windowed"
    epoch_cache_ttl_s: float = 5.0
    epoch_bump_interval_s: float = 60.0  # 0: only on demand (POST /v1/epoch/advance)
    snapshot_every_records: int = 1_000
    log_keep_records: int = 10_000
    drain_timeout_s: float = 20.0  # in-flight produces get this long at shutdown
    l0_cache_bytes_max: int = 128 * MiB  # L0 objects held for readers (0: a GET per extent)

    def __post_init__(self) -> None:
        if not 0 <= self.epoch_cache_ttl_s <= 3600:
            raise ValueError("epoch_cache_ttl_s must be in 0..3600")
        interval = self.epoch_bump_interval_s
        if not (interval == 0 or EPOCH_BUMP_INTERVAL_S_MIN <= interval <= 86_400):
            # (every bump is a control-plane write and a log line: a microsecond timer wrote
            # thousands a second)
            raise ValueError(
                f"epoch_bump_interval_s must be 0 (the timer off) or in {EPOCH_BUMP_INTERVAL_S_MIN}..86400"
            )
        if not 1 <= self.snapshot_every_records <= 10_000_000:
            raise ValueError("snapshot_every_records must be in 1..10000000")
        if not 0 <= self.log_keep_records <= 100_000_000:
            raise ValueError("log_keep_records must be in 0..100000000")
        if not 0 < self.drain_timeout_s <= 3600:
            raise ValueError("drain_timeout_s must be in (0, 3600]")
        if not 0 <= self.l0_cache_bytes_max <= 64 * 1024 * MiB:
            raise ValueError("l0_cache_bytes_max must be in 0..64 GiB")


LINGER_MS_MAX = 10_000.0


class BatcherSection(_Section):
    linger_ms: float = 250.0
    transaction_linger_ms: float = 0.0
    batch_bytes_max: int = 4 * MiB
    inflight_bytes_max: int = 64 * MiB
    uploads_max: int = 8
    stale_retries_max: int = 3
    mailbox_size: int = 1024

    def __post_init__(self) -> None:
        if not 1 <= self.mailbox_size <= 100_000:
            raise ValueError("mailbox_size must be in 1..100000")
        # A produce waits for its window: past a client's request timeout (Kafka's default
        # request.timeout.ms is 30 s) every produce would time out and be sent again.
        lingers = {"linger_ms": self.linger_ms, "transaction_linger_ms": self.transaction_linger_ms}
        for name, value in lingers.items():
            if value > LINGER_MS_MAX:
                raise ValueError(
                    f"{name} must be at most {LINGER_MS_MAX:g} (a produce waits up to this for its "
                    "batch window, and clients give up on a request after 30 s by default)"
                )
        self.to_batcher_config()  # the batcher's own checks, with its messages

    def to_batcher_config(self) -> BatcherConfig:
        return BatcherConfig(**msgspec.structs.asdict(self))


def _actor_check(section: str, build: Any) -> Any:
    """Build an actor's config with the actor's own checks; their messages start with the
    section name ("gc grace_s must be ..."), which the error path names already."""
    try:
        return build()
    except InvalidInput as exc:
        message = str(exc)
        raise ValueError(message.removeprefix(f"{section} ")) from None


class ReconcilerSection(_Section):
    """`ReconcilerConfig`: copies L0 extents into per-partition L1 objects."""

    interval_s: float = 1.0  # a pass over every partition this often
    object_bytes_max: int = 8 * MiB  # an L1 object holds at most this many extent bytes
    object_bytes_min: int = 4 * MiB  # ... and is written once this many wait (or ...)
    object_age_max_s: float = 30.0  # ... once they waited this long (0 and 0: every pass)
    placeholders_per_object_max: int = 4096
    partitions_in_flight_max: int = 4
    read_buffer_bytes_max: int = 64 * MiB  # a round's shared L0 reads hold at most this at once
    copy_deadline_s: float = 600.0  # an unfinished copy older than this is collected
    delete_retry_first_s: float = 1.0  # a failed L1 delete is tried again after this, doubling
    delete_retry_max_s: float = 300.0  # ... up to this
    l1_stray_grace_s: float = 3600.0  # an L1 object no row names is deleted once this old ...
    l1_stray_sweep_interval_s: float = 86_400.0  # ... by a sweep of its partition this often (0: never)
    enabled: bool = True

    def __post_init__(self) -> None:
        self.to_reconciler_config()

    def to_reconciler_config(self) -> ReconcilerConfig:
        return _actor_check("reconciler", lambda: ReconcilerConfig(**msgspec.structs.asdict(self)))


class CompactorSection(_Section):
    """`CompactorConfig`: compacts the L1 data of topics whose cleanup.policy has `compact`."""

    interval_s: float = 15.0  # a pass over the compacted partitions led here this often
    object_bytes_max: int = 64 * MiB  # the L1 bytes one pass reads, at most
    key_map_entries_max: int = 100_000  # distinct keys one pass maps (16-byte hashes)
    enabled: bool = True

    def __post_init__(self) -> None:
        self.to_compactor_config()

    def to_compactor_config(self) -> CompactorConfig:
        return _actor_check("compactor", lambda: CompactorConfig(**msgspec.structs.asdict(self)))


class HousekeeperSection(_Section):
    """`HousekeeperConfig`; TOML has no null, so 0 turns a retention limit off (None)."""

    interval_s: float = 1.0
    idle_after_s: float = 5.0  # advance a partition whose M(p) has not moved for this long
    retention_s: float = 0.0  # 0: keep reconciled data forever
    retention_bytes: int = 0  # 0: no size limit
    copy_deadline_s: float = 600.0
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.retention_s < 0:
            raise ValueError(f"retention_s must be >= 0 (0 turns it off), not {self.retention_s}")
        if self.retention_bytes < 0:
            raise ValueError(f"retention_bytes must be >= 0 (0 turns it off), not {self.retention_bytes}")
        self.to_housekeeper_config()

    def to_housekeeper_config(self) -> HousekeeperConfig:
        fields = msgspec.structs.asdict(self)
        fields["retention_s"] = self.retention_s or None
        fields["retention_bytes"] = self.retention_bytes or None
        return _actor_check("housekeeper", lambda: HousekeeperConfig(**fields))


_GC = GcConfig()  # the GC's defaults, written once (actors/gc.py)


class GcSection(_Section):
    """`GcConfig`: the L0 garbage collector (its defaults are the actor's)."""

    interval_s: float = _GC.interval_s  # between rounds that made progress
    idle_backoff_max_s: float = _GC.idle_backoff_max_s  # idle rounds back off up to this
    grace_s: float = _GC.grace_s  # an object younger than this is never deleted
    delete_batch_keys_max: int = _GC.delete_batch_keys_max
    deletes_in_flight_max: int = _GC.deletes_in_flight_max
    list_concurrency_max: int = _GC.list_concurrency_max
    worker_index: int = _GC.worker_index  # this GC's share of the 1000 prefixes
    worker_count: int = _GC.worker_count
    jitter_fraction: float = _GC.jitter_fraction
    throttle_backoff_s: float = _GC.throttle_backoff_s
    dry_run_keys_max: int = _GC.dry_run_keys_max
    sweep_interval_s: float = _GC.sweep_interval_s  # list the prefixes at least this often (0: every round)
    enabled: bool = _GC.enabled  # false: the GC starts paused (POST /v1/gc/resume starts it)

    def __post_init__(self) -> None:
        self.to_gc_config()

    def to_gc_config(self) -> GcConfig:
        return _actor_check("gc", lambda: GcConfig(**msgspec.structs.asdict(self)))


class LoggingSection(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["kv", "json"] = "kv"  # key=value lines or JSON lines
    file: str = ""  # empty: stderr (journald); a file is re-opened on SIGHUP


class MetricsSection(_Section):
    # Above this many partitions, per-partition series are left out (only totals are exported).
    per_partition_max: int = 256
    # HOST:PORT of a second listener serving GET /metrics alone, without the token; empty: off.
    listen: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.per_partition_max <= 100_000:
            raise ValueError("per_partition_max must be in 0..100000")
        if self.listen:
            parse_listen(self.listen)


KAFKA_FRAME_BYTES_LIMIT = 1024 * MiB


class KafkaSection(_Section):
    """The Kafka listener: off unless `listen` is set (e.g. "127.0.0.1:9092")."""

    listen: str = ""
    # The host and port clients are told to connect to (Metadata); empty: those of `listen`
    # (127.0.0.1 when listening on every address).
    advertised_host: str = ""
    advertised_port: int = 0
    frame_bytes_max: int = 100 * MiB  # a bigger request closes its connection unread
    connections_max: int = 1024
    # Request bytes all Kafka connections together hold at most (read, not yet answered).
    inflight_bytes_max: int = 256 * MiB
    default_partitions: int = 1  # CreateTopics with num_partitions = -1
    # Metadata and Produce naming an unknown topic create it (default_partitions, no configs),
    # as Kafka's auto.create.topics.enable; off by default, as in Redpanda.
    auto_create_topics: bool = False
    idle_timeout_s: float = 600.0  # a silent connection is closed (Kafka's connections.max.idle.ms)
    header_timeout_s: float = 10.0  # a new or unauthenticated connection's next frame, within this
    frame_timeout_s: float = 60.0  # a frame's body, within this of its length prefix
    # A transactional id with no transaction for this long is forgotten, in memory and in the
    # log store (Kafka's transactional.id.expiration.ms: 7 days).
    transactional_id_expiration_s: float = 7 * 24 * 3600.0
    # A consumer group without members loses each committed offset this long after its commit,
    # and none sooner than this long after it went empty; one left with neither is deleted
    # (Kafka's offsets.retention.minutes: 7 days), checked every offsets_retention_check_s
    # (offsets.retention.check.interval.ms: 10 min).
    offsets_retention_s: float = 7 * 24 * 3600.0
    offsets_retention_check_s: float = 600.0
    # An idempotent producer's last batches are kept this long after they were stored (Kafka's
    # producer.id.expiration.ms: 1 day); a retry after that is taken as new.
    producer_id_expiration_s: float = 86_400.0
    # Optional TLS (1.2 or later): a PEM certificate chain and its key, both or neither; with
    # tls_client_ca_file too, clients must present a certificate that CA signed (mutual TLS).
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""

    def __post_init__(self) -> None:
        if self.listen:
            parse_listen(self.listen)
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tls_cert_file and tls_key_file go together: set both or neither")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise ValueError("tls_client_ca_file needs tls_cert_file and tls_key_file")
        self.tls_context()  # an unreadable certificate or key stops the start-up here
        if not 0 <= self.advertised_port <= 65535:
            raise ValueError("advertised_port must be in 0..65535 (0: the listening port)")
        if not 1024 <= self.frame_bytes_max <= KAFKA_FRAME_BYTES_LIMIT:
            raise ValueError(f"frame_bytes_max must be in 1024..{KAFKA_FRAME_BYTES_LIMIT}")
        if not 1 <= self.connections_max <= 100_000:
            raise ValueError("connections_max must be in 1..100000")
        if not 1 <= self.transactional_id_expiration_s <= 365 * 24 * 3600:
            raise ValueError("transactional_id_expiration_s must be in 1..31536000 (a year)")
        if not 1 <= self.offsets_retention_s <= 10 * 365 * 24 * 3600:
            raise ValueError("offsets_retention_s must be in 1..315360000 (ten years)")
        if not 60 <= self.producer_id_expiration_s <= 365 * 24 * 3600:
            raise ValueError("producer_id_expiration_s must be in 60..31536000 (a year)")
        if not 0.1 <= self.offsets_retention_check_s <= 86_400:
            raise ValueError("offsets_retention_check_s must be in 0.1..86400")
        if not self.frame_bytes_max <= self.inflight_bytes_max <= 16 * KAFKA_FRAME_BYTES_LIMIT:
            raise ValueError("inflight_bytes_max must be at least frame_bytes_max (and at most 16 GiB)")
        if not 1 <= self.default_partitions <= 4096:
            raise ValueError("default_partitions must be in 1..4096")
        for name in ("idle_timeout_s", "header_timeout_s", "frame_timeout_s"):
            if not 0.1 <= getattr(self, name) <= 86_400:
                raise ValueError(f"{name} must be in 0.1..86400")

    @property
    def enabled(self) -> bool:
        return bool(self.listen)

    def tls_context(self) -> ssl.SSLContext | None:
        """The listener's server-side TLS context, or None without `tls_cert_file`."""
        if not self.tls_cert_file:
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"tls_cert_file/tls_key_file: cannot load {self.tls_cert_file!r} with key "
                f"{self.tls_key_file!r}: {exc}"
            ) from None
        if self.tls_client_ca_file:
            try:
                context.load_verify_locations(cafile=self.tls_client_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(
                    f"tls_client_ca_file: cannot load {self.tls_client_ca_file!r}: {exc}"
                ) from None
            context.verify_mode = ssl.CERT_REQUIRED
        return context


class ClusterSection(_Section):
    """Several nodes on one bucket and one PostgreSQL control plane: off unless `enabled`."""

    enabled: bool = False
    node_id: str = ""  # empty: this host's name and the HTTP port (stable across restarts)
    advertise_url: str = ""  # where other nodes and clients reach this node's HTTP API
    lease_ttl_s: float = 10.0
    # A node whose lease has been out this long (crashed, never restarted) is removed from the
    # cluster by the live nodes; at least a minute, so a crash shows as "expired" meanwhile.
    forget_expired_after_s: float = 3600.0

    def __post_init__(self) -> None:
        if not 1.0 <= self.lease_ttl_s <= 300.0:
            raise ValueError("lease_ttl_s must be in 1..300")
        if not 60.0 <= self.forget_expired_after_s <= 31_536_000.0:
            raise ValueError("forget_expired_after_s must be in 60..31536000 (a year)")
        if self.node_id and not re.fullmatch(r"[A-Za-z0-9._:-]{1,100}", self.node_id):
            raise ValueError("node_id must be 1-100 of A-Z a-z 0-9 . _ : -")
        if self.advertise_url:
            parsed = urllib.parse.urlsplit(self.advertise_url)
            if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.path not in ("", "/"):
                raise ValueError(
                    f"advertise_url {self.advertise_url!r} must be an http(s) URL of this node, "
                    "such as http://10.0.0.5:7070"
                )


class Config(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    server: ServerSection = msgspec.field(default_factory=ServerSection)
    storage: StorageSection = msgspec.field(default_factory=StorageSection)
    control: ControlSection = msgspec.field(default_factory=ControlSection)
    s3: S3Section = msgspec.field(default_factory=S3Section)
    node: NodeSection = msgspec.field(default_factory=NodeSection)
    batcher: BatcherSection = msgspec.field(default_factory=BatcherSection)
    reconciler: ReconcilerSection = msgspec.field(default_factory=ReconcilerSection)
    compactor: CompactorSection = msgspec.field(default_factory=CompactorSection)
    housekeeper: HousekeeperSection = msgspec.field(default_factory=HousekeeperSection)
    gc: GcSection = msgspec.field(default_factory=GcSection)
    logging: LoggingSection = msgspec.field(default_factory=LoggingSection)
    metrics: MetricsSection = msgspec.field(default_factory=MetricsSection)
    kafka: KafkaSection = msgspec.field(default_factory=KafkaSection)
    cluster: ClusterSection = msgspec.field(default_factory=ClusterSection)

    def __post_init__(self) -> None:
        if self.cluster.enabled and self.control.kind != "postgres":
            raise ValueError(
                "cluster.enabled needs the PostgreSQL control plane (control.kind = 'postgres'): "
                "the nodes of a cluster share it"
            )
        if self.cluster.enabled and not self.cluster.advertise_url:
            raise ValueError("cluster.advertise_url is required when cluster.enabled (this node's HTTP URL)")
        if self.control.kind == "postgres" and not self.control.dsn:
            raise ValueError(
                "control.dsn is required when control.kind = 'postgres' (or set LEVELZERO_CONTROL_DSN)"
            )
        if self.storage.kind == "s3" and not self.s3.bucket:
            raise ValueError("s3.bucket is required when storage.kind = 's3' (or set LEVELZERO_S3_BUCKET)")
        if self.node.drain_timeout_s >= self.server.shutdown_timeout_s:
            raise ValueError(
                "node.drain_timeout_s must be below server.shutdown_timeout_s, so a shutdown "
                "can drain and still finish in time"
            )
        self._check_listeners_apart()
        kafka_host = parse_listen(self.kafka.listen)[0] if self.kafka.enabled else ""
        if self.kafka.enabled and not self.server.token and not is_loopback(kafka_host):
            raise ValueError(
                f"server.token is required when kafka.listen ({self.kafka.listen}) is not a loopback "
                "address: Kafka clients then authenticate with SASL (PLAIN or SCRAM-SHA-256/512), "
                "the token as password"
            )

    def _check_listeners_apart(self) -> None:
        """Two listeners on one address: the second could never bind; say so now, not at start-up."""
        listeners = [("server.listen", self.server.listen)]
        listeners += [(f"{name}.listen", getattr(self, name).listen) for name in ("kafka", "metrics")]
        listeners = [(key, listen) for key, listen in listeners if listen]
        for index, (key_a, listen_a) in enumerate(listeners):
            for key_b, listen_b in listeners[index + 1 :]:
                if listens_overlap(listen_a, listen_b):
                    raise ValueError(
                        f"{key_b} ({listen_b}) and {key_a} ({listen_a}) take the same address: "
                        f"give {key_b} another port"
                    )

    def node_config(self) -> NodeConfig:
        return NodeConfig(
            fencing_mode=FenceMode(self.node.fencing_mode),
            epoch_cache_ttl_s=self.node.epoch_cache_ttl_s,
            epoch_bump_interval_s=self.node.epoch_bump_interval_s or None,
            snapshot_every_records=self.node.snapshot_every_records,
            log_keep_records=self.node.log_keep_records,
            l0_cache_bytes_max=self.node.l0_cache_bytes_max,
            batcher=self.batcher.to_batcher_config(),
            reconciler=self.reconciler.to_reconciler_config(),
            compactor=self.compactor.to_compactor_config(),
            housekeeper=self.housekeeper.to_housekeeper_config(),
            gc=self.gc.to_gc_config(),
        )


# ----------------------------------------------------------------------------- loading


def sections() -> dict[str, type[msgspec.Struct]]:
    """Section name -> its Struct type, read off `Config` itself."""
    return {f.name: f.type for f in msgspec.structs.fields(Config)}


def _env_names() -> dict[str, tuple[str, str]]:
    names = dict(ENV_ALIASES)
    for section, struct in sections().items():
        for f in msgspec.structs.fields(struct):
            names[f"{ENV_PREFIX}{section}_{f.name}".upper()] = (section, f.name)
    return names


def _field_type(section: str, key: str) -> Any:
    for f in msgspec.structs.fields(sections()[section]):
        if f.name == key:
            return f.type
    raise AssertionError(f"no field {section}.{key}")


def _describe_validation_error(message: str) -> str:
    """msgspec's 'Expected `int`, got `str` - at `$.server.port`' -> 'server.port: ...'."""
    match = re.fullmatch(r"(.*?)(?: - at `\$\.?(.*)`)?", message, re.DOTALL)
    assert match is not None
    what, path = match.group(1), match.group(2) or ""
    unknown = re.fullmatch(r"Object contains unknown field `(.*)`", what)
    if unknown:
        key = f"{path}.{unknown.group(1)}" if path else unknown.group(1)
        return f"{key}: unknown key"
    what = what.replace("`", "")
    section, dot, key = path.partition(".")
    if dot and "." not in key:
        what += _choices(section, key, what)
    return f"{path}: {what}" if path else what


def _choices(section: str, key: str, what: str) -> str:
    """' (one of 'a', 'b')' after msgspec's 'Invalid enum value' for a Literal setting."""
    if not what.startswith("Invalid enum value") or section not in sections():
        return ""
    if key not in sections()[section].__struct_fields__:
        return ""
    choices = typing.get_args(_field_type(section, key))
    return f" (one of {', '.join(repr(c) for c in choices)})" if choices else ""


def read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def secrets_readable_by_others(path: str) -> str | None:
    """A warning when the TOML file at `path` holds a secret (SECRET_KEYS) and its mode lets
    users other than its owner read it (the example installs as 0644, for the settings); None
    otherwise, or when the file cannot be read (loading it says so)."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        file = read_toml(path)
    except (OSError, ConfigError):
        return None
    held = [
        f"{section}.{key}"
        for section, key in sorted(SECRET_KEYS - ENV_ONLY_KEYS)
        if file.get(section, {}).get(key)
    ]
    if not held or not mode & 0o044:
        return None
    variables = ", ".join(f"{ENV_PREFIX}{name.replace('.', '_').upper()}" for name in held)
    return (
        f"{path} holds {' and '.join(held)} and other users may read it (mode {mode:04o}): "
        f"give {'them' if len(held) > 1 else 'it'} in the environment instead ({variables}, "
        f"e.g. in the unit's environment file, mode 0600), or chmod 600 {path}"
    )


def env_overrides(environ: Mapping[str, str]) -> dict[tuple[str, str], tuple[str, Any]]:
    """(section, key) -> (variable name, typed value) for every LEVELZERO_* setting."""
    names = _env_names()
    out: dict[tuple[str, str], tuple[str, Any]] = {}
    # Long names last, so LEVELZERO_SERVER_LISTEN wins over the alias LEVELZERO_LISTEN.
    for name in sorted(environ, key=lambda n: n not in ENV_ALIASES):
        if not name.startswith(ENV_PREFIX):
            continue
        if name in ENV_NOT_SETTINGS or name.startswith(ENV_NOT_SETTINGS_PREFIXES):
            continue
        target = names.get(name)
        if target is None:
            raise ConfigError(f"environment variable {name} is not a levelzero setting")
        raw = environ[name]
        try:
            value = msgspec.convert(raw, _field_type(*target), strict=False)
        except msgspec.ValidationError as exc:
            shown = "***" if target in SECRET_KEYS else repr(raw)
            raise ConfigError(
                f"environment variable {name} ({'.'.join(target)}) = {shown}: "
                f"{_describe_validation_error(str(exc))}{_choices(*target, str(exc))}"
            ) from None
        out[target] = (name, value)
    return out


def load_config(
    path: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[tuple[str, str], Any] | None = None,
    override_names: Mapping[tuple[str, str], str] | None = None,
) -> Config:
    """Merge defaults, the TOML file at `path`, `environ` and `overrides`; validate once.

    `override_names` names where an override came from (`--listen`); an error is blamed on the
    sources of the values it depends on (see `_blame`): the file, a variable, a flag."""
    file: dict[str, Any] = read_toml(path) if path else {}
    file_source = f"invalid configuration ({path})" if path else "invalid configuration"
    for section, value in file.items():
        if section in sections() and not isinstance(value, dict):
            raise ConfigError(f"{file_source}: [{section}] must be a table")
    for section, key in sorted(ENV_ONLY_KEYS):
        if key in file.get(section, {}):
            raise ConfigError(
                f"{file_source}: {section}.{key} may only come from the environment "
                f"({ENV_PREFIX}{section.upper()}_{key.upper()}) or {section}.{key}_file"
            )
    # Every value over the file, lowest precedence first, with its origin.
    layers: list[tuple[str, tuple[str, str], Any]] = []
    env = env_overrides(os.environ if environ is None else environ)
    for target, (name, value) in env.items():
        layers.append((f"environment variable {name}", target, value))
    for target, value in (overrides or {}).items():
        assert target[0] in sections(), target
        flag = (override_names or {}).get(target)
        layers.append((f"flag {flag}" if flag else f"override of {'.'.join(target)}", target, value))
    result = _validate(file, layers)
    if isinstance(result, Config):
        return result
    error = result
    origins = _blame(file, layers, error)
    source = f"invalid configuration ({', '.join(origins)})" if origins else file_source
    raise ConfigError(f"{source}: {error}")


def _validate(file: Mapping[str, Any], layers: list[tuple[str, tuple[str, str], Any]]) -> Config | str:
    """The Config from the file with `layers` over it, or the message saying why there is none."""
    raw = {section: dict(value) if isinstance(value, dict) else value for section, value in file.items()}
    for _, (section, key), value in layers:
        raw.setdefault(section, {})[key] = value
    try:
        config = msgspec.convert(raw, Config)
    except msgspec.ValidationError as exc:
        return _describe_validation_error(str(exc))
    except InvalidInput as exc:  # pragma: no cover - msgspec wraps __post_init__ errors
        return str(exc)
    return _not_finite(config) or config


def _not_finite(config: Config) -> str | None:
    """Why a number of `config` is not one: NaN or an infinity (TOML and the environment's
    `float()` read `nan` and `inf`). NaN passes a range check (every comparison with it is
    false): the daemon then crashed at start-up, or took produces it never answered. None if
    every number is finite."""
    for section in config.__struct_fields__:
        values = getattr(config, section)
        for key in getattr(values, "__struct_fields__", ()):
            value = getattr(values, key)
            if isinstance(value, float) and not math.isfinite(value):
                return f"{section}.{key}: must be a finite number, not {value}"
    return None


def _blame(file: Mapping[str, Any], layers: list[tuple[str, tuple[str, str], Any]], error: str) -> list[str]:
    """The origins (variables, flags) of the values `error` depends on: each value over the file
    that, taken away (its key then falls back to the file or a lower source), clears the error.
    If none does and the file alone (over the defaults) has the same error, it is the file's
    (none). Else each value whose removal changes the error (a bad value over another bad one).
    A value whose removal only makes an error of its own (one of a pair of S3 credentials) is
    not blamed for an error the file has without it."""
    final = {target: index for index, (_, target, _) in enumerate(layers)}  # the last wins
    without = {
        index: _validate(file, [layer for other, layer in enumerate(layers) if other != index])
        for index in sorted(final.values())
    }
    cleared = [layers[index][0] for index, result in without.items() if not isinstance(result, str)]
    if cleared or _validate(file, []) == error:
        return cleared
    return [layers[index][0] for index, result in without.items() if result != error]


def describe(config: Config) -> dict[str, dict[str, Any]]:
    """The effective configuration as plain data, secrets masked (safe to log or print)."""
    out: dict[str, dict[str, Any]] = msgspec.to_builtins(config)
    for section, key in SECRET_KEYS:
        if out[section][key]:
            out[section][key] = "***"
    return out


def node_id_of(config: Config) -> str:
    """The node's id in a cluster: `cluster.node_id`, or this host's name and the HTTP port."""
    return config.cluster.node_id or f"{socket.gethostname()}:{config.server.port}"
