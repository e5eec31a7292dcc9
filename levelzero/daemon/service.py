"""One levelzero process: concrete storage wired into a `Node`, served over HTTP, told to systemd.

Everything runs in one anyio task group. Start-up order (DESIGN.md): open storage (SQLite log
store, object store) -> `Node.run` (replays every partition) -> listen (uvicorn on a socket we
bound ourselves) -> `READY=1`. Stopping: readiness goes 503 and new produces get 503, the node
drains in-flight produces (`Node.shutdown`), the HTTP server finishes its responses, the stores
flush and close, all within `server.shutdown_timeout_s`.

uvicorn runs as a task of our group (`uvicorn.Server.serve`) with its own signal handling
switched off: signals belong to `run_until_signalled`, which owns SIGTERM/SIGINT (stop) and
SIGHUP (re-open logs).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator

from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.abc
import uvicorn
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from starlette.applications import Starlette

from levelzero.actors.intake import ProduceIntake
from levelzero.actors.node import ClusterSettings, Node
from levelzero.core.errors import LevelZeroError, StorageError, StoreRefused, directory_problem
from levelzero.storage import opening
from levelzero.storage.opening import ControlStore
from levelzero.storage.protocols import L1State, ObjectStore
from levelzero.storage.postgres.store import PostgresLogStore

from levelzero.http.access_log import AccessLogMiddleware
from levelzero.http.app import AnsweredWhenForced, ApiSettings, BodyBudget, Lifecycle, build_app
from levelzero.config import Config, describe, node_id_of, parse_listen
from levelzero.http.guard import REQUEST_HEAD_BYTES_MAX, ConnectionGuard, ConnectionLimits
from levelzero.daemon.logs import configure_logging
from levelzero.daemon.metrics import DaemonMetrics
from levelzero.daemon.metrics_listener import METRICS_CONNECTIONS_MAX, metrics_app
from levelzero.daemon.observed import ObservedLogStore, ObservedObjectStore, StoreMetrics
from levelzero.daemon.backup import refuse_unfinished_restore
from levelzero.daemon.ownership import (
    FOREIGN_MARKER,
    MARKER_CHECK_INTERVAL_S,
    MarkerWatch,
    claim_store,
    local_cluster_id,
    prepare_cluster_id,
    refuse_lost_id,
)
from levelzero.daemon.history_pruning import HISTORY_PRUNE_INTERVAL_S, run_history_pruning
from levelzero.daemon.storage_health import StorageHealth, probe_stores
from levelzero.daemon.systemd import Notifier

log = logging.getLogger("levelzero.daemon")
_T = TypeVar("_T")

LISTEN_BACKLOG = 2048
KAFKA_TLS_HANDSHAKE_TIMEOUT_S = 10.0  # a client that never finishes its TLS handshake is dropped
# Opening, then claiming, the object store at start: each within this (both together below
# the unit's TimeoutStartSec=90, so the daemon says why, not systemd).
OBJECT_STORE_START_TIMEOUT_S = 40.0
FORCED_ANSWERS_WAIT_S = 1.0  # a forced stop waits this long for its 503 answers to be written


class StartupError(LevelZeroError):
    """The daemon cannot start (cannot listen, cannot create its data directory)."""

    code = "startup_failed"


@dataclass(frozen=True, slots=True)
class _KafkaBound:
    """The Kafka listener's socket, bound before the node starts, and what clients are told."""

    listener: Any
    host: str
    advertised_host: str
    advertised_port: int


class _UvicornServer(uvicorn.Server):
    """uvicorn without signal handlers, with events for 'listening' and 'finished'."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = anyio.Event()
        self.finished = anyio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the daemon owns signals (run_until_signalled)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.listening.set()

    async def serve_until_exit(self, sock: socket.socket) -> None:
        try:
            await self.serve(sockets=[sock])
        finally:
            self.listening.set()  # never leave a waiter hanging if start-up failed
            self.finished.set()


def bind_listener(host: str, port: int, listener: str) -> socket.socket:
    """A listening socket on host:port; a failure names `listener` (which one, and its key)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise StartupError(f"cannot listen on {host}:{port} for {listener}: {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port} for {listener}: {exc.strerror}") from None
    return sock


FAULTS_ENV = "LEVELZERO_TEST_FAULTS"


async def open_object_store(config: Config) -> ObjectStore:
    """The configured object store (`storage.opening`), with injected faults where the tests'
    environment variable asks for them."""
    store = await opening.open_object_store(config)
    spec = os.environ.get(FAULTS_ENV)
    if spec:
        from levelzero.testing.faulty_store import FaultSpec, FaultyObjectStore

        log.warning("%s is set: injecting object-store faults (%s); test use only", FAULTS_ENV, spec)
        return FaultyObjectStore(store, FaultSpec.parse(spec))
    return store


CLAIM_ATTEMPTS_MAX = 5


async def _claim_store_with_retries(
    store: ObjectStore, config: Config, log_store: ControlStore, id_lost: bool = False
) -> str:
    """Claim the store for this data directory, or in a cluster for the cluster the control
    plane names (every node shares its id); transient store errors are retried (bounded).
    `id_lost`: the data directory's database is there and its id is not (`prepare_cluster_id`):
    a store some cluster claimed is refused before a new id is made."""
    where = store_where(config)

    async def named_object() -> str | None:
        """An L1 object the control plane names (a partition's first), if any."""
        for row in await log_store.list_partitions():
            names = await log_store.l1_list(row.pid, [L1State.COPY_FINISHED])
            if names:
                return names[0].key
        return None

    cluster_id: str | None = None
    for attempt in range(1, CLAIM_ATTEMPTS_MAX + 1):
        try:
            if cluster_id is None:
                if id_lost:
                    await refuse_lost_id(store, config.storage.data_dir, config.storage.db_path, where)
                cluster_id = local_cluster_id(config.storage.data_dir)
                if config.cluster.enabled:
                    assert isinstance(log_store, PostgresLogStore), "a cluster runs only on PostgreSQL"
                    cluster_id = await log_store.cluster_id(cluster_id)
            await claim_store(
                store,
                cluster_id,
                where,
                named_object,
                ours="this cluster's database" if config.cluster.enabled else "this data directory",
                control_plane_empty=lambda: _no_partitions(log_store),
            )
            return cluster_id
        except StorageError as exc:
            if not exc.retriable or attempt == CLAIM_ATTEMPTS_MAX:
                raise
            log.warning("claiming the object store failed (attempt %d): %s", attempt, exc)
            await anyio.sleep(0.1 * attempt)
    raise AssertionError("unreachable: the last attempt returns or raises")


async def _no_partitions(log_store: ControlStore) -> bool:
    return not await log_store.list_partitions()


def kafka_log_dir(config: Config) -> str:
    """DescribeLogDirs' one log directory: where the partitions' objects are."""
    if config.storage.kind == "local":
        return os.path.abspath(config.storage.objects_dir)
    return f"s3://{config.s3.bucket}/{config.s3.key_prefix}"


def store_where(config: Config) -> str:
    """The object store as the log names it: its location, and an S3 bucket's endpoint."""
    if config.storage.kind == "local":
        return config.storage.objects_dir
    return f"{kafka_log_dir(config)} at {config.s3.endpoint or 'AWS S3'}"


# The log store writer's counters (`LogStoreStatistics`), each with its HELP text.
LOG_STORE_COUNTERS = {
    "batches": "Write batches the log store's writer executed (several writes share one transaction).",
    "commits": "Write batches of the log store that committed (durable).",
    "appends": "Partition log appends the log store committed.",
    "records": "Partition log records the log store committed (appends and term starts).",
    "rejected_appends": "Appends the log store refused (a partition led elsewhere, or a broken invariant).",
}


def _log_store_metrics(store: ControlStore) -> Callable[[Node], Iterable[Metric]]:
    def source(node: Node) -> Iterable[Metric]:
        stats = store.statistics()
        for field, doc in LOG_STORE_COUNTERS.items():
            yield CounterMetricFamily(f"levelzero_log_store_{field}", doc, value=getattr(stats, field))
        yield GaugeMetricFamily(
            "levelzero_log_store_queued", "Write jobs queued for the log store writer.", value=stats.queued
        )

    return source


def _ownership_metric(marker: MarkerWatch) -> Callable[[Node], Iterable[Metric]]:
    def source(_node: Node) -> Iterable[Metric]:
        yield GaugeMetricFamily(
            "levelzero_object_store_owned",
            "1 while the object store's marker names this cluster (read again every minute); 0 "
            "while it names another cluster (this node's GC paused, its writes refused).",
            value=1 if marker.owned else 0,
        )
        yield CounterMetricFamily(
            "levelzero_object_store_marker_lost",
            "Times the object store's marker was found gone while running (the store emptied or "
            "its keyspace deleted); written again each time.",
            value=marker.lost,
        )

    return source


def _readiness_metric(lifecycle: Lifecycle, health: StorageHealth) -> Callable[[Node], Iterable[Metric]]:
    def source(node: Node) -> Iterable[Metric]:
        ready = lifecycle.not_ready_reason() is None
        yield GaugeMetricFamily(
            "levelzero_ready",
            "1 while /readyz answers 200 (replayed, serving, not stopping, storage healthy).",
            value=1 if ready else 0,
        )
        healthy = GaugeMetricFamily(
            "levelzero_storage_healthy",
            "1 while the store takes writes; 0 after repeated storage failures, until writes succeed again.",
            labels=["store"],
        )
        for store in (health.object_store, health.log_store):
            healthy.add_metric([store.store.replace(" ", "_")], 1 if store.healthy else 0)
        yield healthy

    return source


def connection_metrics(guard: ConnectionGuard) -> Callable[[Node], Iterable[Metric]]:
    def source(node: Node) -> Iterable[Metric]:
        stats = guard.table.statistics()
        open_ = GaugeMetricFamily(
            "levelzero_http_connections",
            "Admitted HTTP connections by phase (head, body, app).",
            labels=["phase"],
        )
        for phase, count in stats.by_phase.items():
            open_.add_metric([phase], count)
        yield open_
        yield GaugeMetricFamily(
            "levelzero_http_connection_peers", "Client addresses holding HTTP connections.", value=stats.peers
        )
        closed = CounterMetricFamily(
            "levelzero_http_connections_closed",
            "HTTP connections the server closed (or refused), by reason; "
            "a client's own close is not counted.",
            labels=["reason"],
        )
        for reason, count in stats.closed.items():
            closed.add_metric([reason], count)
        yield closed

    return source


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def disabled_by_configuration(config: Config) -> list[str]:
    """What the configuration turns off that L0 storage needs: without the reconciler the
    partitions' M(p) stop rising, without the housekeeper an idle partition's never does; either
    way the GC's M stays held and L0 objects accumulate. Said at every start."""
    consequence = "the GC's M stays held and L0 objects accumulate in the object store"
    warnings = []
    if not config.reconciler.enabled:
        warnings.append(
            "the reconciler is disabled by configuration (reconciler.enabled = false): no partition's "
            f"M(p) rises, so {consequence}"
        )
    if not config.housekeeper.enabled:
        warnings.append(
            "the housekeeper is disabled by configuration (housekeeper.enabled = false): an idle "
            f"partition's M(p) is never advanced, so {consequence}"
        )
    return warnings


class Daemon:
    """Create, then `await tg.start(daemon.run)`; `request_stop()` ends it gracefully."""

    def __init__(
        self,
        config: Config,
        *,
        notifier: Notifier | None = None,
        wrap_object_store: Callable[[ObjectStore], ObjectStore] | None = None,
        freeze_heap_at_start: bool = False,
    ) -> None:
        """`freeze_heap_at_start`: the process is this daemon's alone (`levelzero run`), so
        what start-up built (once the stores are open, before anything runs) may be moved out
        of the cyclic collector's sight (`freeze_heap`)."""
        self.config = config
        self.notifier = notifier or Notifier(environ={})
        self._wrap_object_store = wrap_object_store
        self._freeze_heap_at_start = freeze_heap_at_start
        self.storage_health = StorageHealth()
        self.marker: MarkerWatch | None = None  # the store's marker, read again while serving
        self.marker_check_interval_s = MARKER_CHECK_INTERVAL_S
        self.object_store_start_timeout_s = OBJECT_STORE_START_TIMEOUT_S
        self.history_prune_interval_s = HISTORY_PRUNE_INTERVAL_S
        self.lifecycle = Lifecycle(self.storage_health)
        self._stop_requested = anyio.Event()
        self.stop_reason = ""
        self.node: Node | None = None
        self.intake: ProduceIntake | None = None
        self.metrics: DaemonMetrics | None = None
        self.port: int | None = None
        self.url: str | None = None
        self.metrics_url: str | None = None  # the optional metrics listener (metrics.listen)
        self.connection_guard: ConnectionGuard | None = None
        self._metrics_server: _UvicornServer | None = None
        self.kafka_port: int | None = None
        self.kafka: Any = None  # its KafkaListener, imported only with [kafka] listen
        self.stopped_cleanly = False

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested.is_set()

    def request_stop(self, reason: str) -> None:
        if not self._stop_requested.is_set():
            self.stop_reason = reason
            self._stop_requested.set()

    async def run(self, *, task_status: anyio.abc.TaskStatus[Daemon] = anyio.TASK_STATUS_IGNORED) -> None:
        config = self.config
        log.info("starting levelzero", extra={"config": describe(config)})
        for warning in disabled_by_configuration(config):
            log.warning(warning)
        self.notifier.status("opening storage")
        try:
            os.makedirs(config.storage.data_dir, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as exc:  # a file in the way: only an
            # operator can fix it (exit 2, not restarted by systemd)
            raise StoreRefused(
                f"data_dir: {directory_problem(config.storage.data_dir, exc)}: "
                f"move it away or set another storage.data_dir"
            ) from None
        except OSError as exc:
            raise StartupError(f"data_dir: {directory_problem(config.storage.data_dir, exc)}") from None
        refuse_unfinished_restore(config.storage.data_dir)  # before the store is opened
        id_lost = config.control.kind == "sqlite" and prepare_cluster_id(
            config.storage.data_dir,
            config.storage.db_path,
            store_where(config),
            config.storage.objects_dir if config.storage.kind == "local" else None,
        )
        async with anyio.create_task_group() as tg:
            name = f"levelzero {node_id_of(config)}"
            log_store = await opening.open_control_store(tg, config, application_name=name)
            try:
                # On PostgreSQL: no `levelzero recover` runs there while this daemon does.
                async with opening.control_plane_presence(tg, config, application_name=name, exclusive=False):
                    object_store = await self._in_start_time("opening", open_object_store(config))
                    try:
                        if self._wrap_object_store is not None:
                            object_store = self._wrap_object_store(object_store)
                        cluster_id = await self._in_start_time(
                            "claiming", _claim_store_with_retries(object_store, config, log_store, id_lost)
                        )
                        await self._serve(tg, log_store, object_store, cluster_id, task_status)
                    finally:
                        with anyio.CancelScope(shield=True):
                            await object_store.aclose()
            finally:
                with anyio.CancelScope(shield=True):
                    await log_store.aclose()
            tg.cancel_scope.cancel()  # the watchdog; everything else has ended
        log.info("levelzero stopped", extra={"clean": self.stopped_cleanly})

    async def _in_start_time(self, what: str, call: Awaitable[_T]) -> _T:
        """`call` (opening or claiming the object store at start), within
        `object_store_start_timeout_s`: a hung endpoint answers nothing for the S3 client's
        retries (up to 5 x 35 s), past systemd's TimeoutStartSec=90, which killed the daemon
        with its own message and none of ours."""
        timeout_s = self.object_store_start_timeout_s
        with anyio.move_on_after(timeout_s):
            return await call
        raise StartupError(
            f"the object store {store_where(self.config)} did not answer within {timeout_s:g} s "
            f"while {what} it at start-up (a hung endpoint, or a network path that drops "
            "packets? claiming also lists, in the control plane, an L1 object to look for); "
            "levelzero exits and is restarted"
        )

    async def _serve(
        self,
        tg: anyio.abc.TaskGroup,
        log_store: ControlStore,
        object_store: ObjectStore,
        cluster_id: str,
        task_status: anyio.abc.TaskStatus[Daemon],
    ) -> None:
        config = self.config
        stores = StoreMetrics()
        health = self.storage_health
        health.on_change = self._storage_health_changed
        observed_objects = ObservedObjectStore(object_store, stores, health)
        if isinstance(log_store, PostgresLogStore):
            # Each connection failure it retries counts, so readiness turns 503 during an
            # outage rather than only once a call gives up.
            log_store.on_connection_error = lambda what, error: health.failed(health.log_store, what, error)
        # The Kafka socket is bound before the node starts: in a cluster the node registers the
        # address Kafka clients are sent to (Metadata names every node as a broker).
        kafka = await self._bind_kafka()
        cluster = None
        if config.cluster.enabled:
            assert isinstance(log_store, PostgresLogStore), "config allows a cluster only on PostgreSQL"
            cluster = ClusterSettings(
                log_store,
                node_id_of(config),
                config.cluster.advertise_url.rstrip("/"),
                lease_ttl_s=config.cluster.lease_ttl_s,
                forget_expired_after_s=config.cluster.forget_expired_after_s,
                kafka_url=None if kafka is None else f"{kafka.advertised_host}:{kafka.advertised_port}",
            )
        observed_log = ObservedLogStore(log_store, stores, health)
        # ObservedLogStore wraps the LogStore's writes at run time (mypy sees (*Any) -> Awaitable)
        node = Node(
            config.node_config(),
            observed_log,  # type: ignore[arg-type]
            observed_objects,
            cluster=cluster,
        )
        node.drain_timeout_s = config.node.drain_timeout_s
        self.node = node
        # One produce intake for both front ends.
        self.intake = ProduceIntake(
            node,
            key_retention_s=config.server.idempotency_key_retention_s or None,
            producer_id_expiration_s=config.kafka.producer_id_expiration_s,
        )
        self.metrics = metrics = DaemonMetrics(
            node, per_partition_max=config.metrics.per_partition_max, data_dir=config.storage.data_dir
        )
        metrics.registry.register(stores)
        metrics.collector.add_source(_log_store_metrics(log_store))
        metrics.collector.add_source(_readiness_metric(self.lifecycle, self.storage_health))
        self.marker = marker = MarkerWatch(
            observed_objects,
            cluster_id,
            store_where(config),
            pause_gc=functools.partial(node.gc.pause, FOREIGN_MARKER),
            resume_gc=functools.partial(node.gc.resume, FOREIGN_MARKER),
            refuse_writes=functools.partial(setattr, node, "writes_refused"),
        )
        metrics.collector.add_source(_ownership_metric(marker))
        self.lifecycle.writes_refused = lambda: node.writes_refused
        settings = ApiSettings(
            token=config.server.token,
            body_bytes_max=config.server.body_bytes_max,
            records_per_request_max=config.server.records_per_request_max,
            fetch_bytes_default=config.server.fetch_bytes_default,
        )
        app: Starlette | AccessLogMiddleware = build_app(node, metrics, settings, self.lifecycle, self.intake)
        if config.server.access_log:
            app = AccessLogMiddleware(app)
        bodies = BodyBudget(app, config.server.body_bytes_max, config.server.inflight_body_bytes_max)
        self.body_budget = bodies.budget
        outermost = AnsweredWhenForced(bodies, self.lifecycle)

        # Everything serving needs is built (and so imported) before the node runs: in a cluster
        # the node registers and takes leases as it starts, and must renew them within the TTL;
        # importing the Kafka handlers on the loop after that took 9-17 s under load.
        guard = ConnectionGuard(
            ConnectionLimits(
                connections_max=config.server.connections_max,
                connections_per_peer_max=min(
                    config.server.connections_per_peer_max, config.server.connections_max
                ),
                header_timeout_s=config.server.header_timeout_s,
                body_timeout_s=config.server.body_timeout_s,
            )
        )
        self.connection_guard = guard
        metrics.collector.add_source(connection_metrics(guard))
        server = _UvicornServer(
            uvicorn.Config(
                outermost,
                lifespan="off",
                log_config=None,
                access_log=False,  # ours is structured (AccessLogMiddleware)
                http=guard.protocol_factory(),  # h11, with deadlines and fair admission
                ws="none",
                limit_concurrency=None,  # the guard admits, evicts and refuses (JSON 503)
                h11_max_incomplete_event_size=REQUEST_HEAD_BYTES_MAX,
                # uvicorn annotates int but takes it as a timeout in seconds (a float works)
                timeout_keep_alive=config.server.keepalive_timeout_s,  # type: ignore[arg-type]
                timeout_graceful_shutdown=max(1, int(config.server.shutdown_timeout_s / 3)),
                server_header=False,
                proxy_headers=False,
            )
        )
        server.config.load()  # its protocol and lifespan modules, now rather than when it serves
        metrics_server = self._metrics_server_for(metrics) if config.metrics.listen else None
        kafka_listener = self._kafka_listener_for(node, metrics, kafka)

        if self._freeze_heap_at_start:
            freeze_heap()  # before anything runs: nothing short-lived is alive to be frozen
        self.notifier.status("replaying partitions")
        async with anyio.create_task_group() as replaying:  # a long replay is not a stuck one
            await replaying.start(self.notifier.extend_start_timeout)
            await tg.start(node.run)
            replaying.cancel_scope.cancel()
        assert self.intake is not None
        await tg.start(self.intake.run)  # idempotent produces' lanes (HTTP's keyed, Kafka's)

        sock = bind_listener(config.server.host, config.server.port, "the HTTP API (server.listen)")
        self.port = sock.getsockname()[1]
        self.url = f"http://{_url_host(config.server.host)}:{self.port}"
        tg.start_soon(server.serve_until_exit, sock)
        await server.listening.wait()
        if not server.started:
            raise StartupError(f"the HTTP server on {config.server.listen} did not start")
        if metrics_server is not None:
            await self._serve_metrics(tg, metrics_server)

        kafka_scope = self._start_kafka(tg, kafka, kafka_listener)

        self.lifecycle.ready = True
        self.notifier.ready(self._serving_status())
        probing = anyio.CancelScope()  # ends before the stores close

        async def probe() -> None:
            with probing:
                # One attempt's bound of the S3 client: a probe never waits out its retries.
                probe_timeout_s = config.s3.connect_timeout_s + config.s3.read_timeout_s
                await probe_stores(
                    observed_objects,
                    observed_log,
                    health,
                    probe_timeout_s=probe_timeout_s,
                )

        watching = anyio.CancelScope()  # as `probing`

        async def watch_marker() -> None:
            with watching:
                await marker.run(self.marker_check_interval_s)

        pruning = anyio.CancelScope()  # as `probing`

        async def prune_history() -> None:
            with pruning:
                await run_history_pruning(
                    log_store, config.control.history_retention_s, interval_s=self.history_prune_interval_s
                )

        tg.start_soon(probe)
        tg.start_soon(watch_marker)
        tg.start_soon(prune_history)
        await tg.start(self.notifier.run_watchdog)
        partitions = len(node.partitions())
        log.info(
            "levelzero ready",
            extra={"url": self.url, "partitions": partitions, "cluster_epoch": node.epochs.current},
        )
        task_status.started(self)

        await self._stop_requested.wait()
        probing.cancel()
        watching.cancel()
        pruning.cancel()
        await self._stop(node, server)
        kafka_scope.cancel()

    async def _bind_kafka(self) -> _KafkaBound | None:
        """The Kafka socket (if `[kafka] listen` is set) and the address advertised to clients."""
        settings = self.config.kafka
        if not settings.enabled:
            return None
        host, port = parse_listen(settings.listen)
        try:
            listener = await anyio.create_tcp_listener(
                local_host=host, local_port=port, reuse_port=False, backlog=LISTEN_BACKLOG
            )
        except OSError as exc:
            raise StartupError(
                f"cannot listen for Kafka clients (kafka.listen) on {settings.listen}: {exc}"
            ) from None
        self.kafka_port = listener.extra(anyio.abc.SocketAttribute.local_port)
        advertised_host = settings.advertised_host or ("127.0.0.1" if host in ("0.0.0.0", "", "::") else host)
        return _KafkaBound(listener, host, advertised_host, settings.advertised_port or self.kafka_port)

    def _kafka_listener_for(self, node: Node, metrics: DaemonMetrics, bound: _KafkaBound | None) -> Any:
        """The Kafka listener over `node` (built before the node runs: see `_serve`), or None;
        its metrics in `metrics`."""
        if bound is None:
            return None
        from levelzero.kafka.handlers import Handlers  # only with [kafka] listen
        from levelzero.kafka.metadata import KafkaSettings
        from levelzero.kafka.metrics import kafka_metrics
        from levelzero.kafka.server import KafkaListener, KafkaTLSListener, ListenerSettings

        settings = self.config.kafka
        listener: Any = bound.listener
        handlers = Handlers(
            node,
            KafkaSettings(
                bound.advertised_host,
                bound.advertised_port,
                settings.default_partitions,
                settings.auto_create_topics,
                # PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
                ("SASL_" if self.config.server.token else "")
                + ("SSL" if settings.tls_cert_file else "PLAINTEXT"),
                log_dir=kafka_log_dir(self.config),
                transactional_id_expiration_s=settings.transactional_id_expiration_s,
                offsets_retention_s=settings.offsets_retention_s,
                offsets_retention_check_s=settings.offsets_retention_check_s,
            ),
            self.intake,
            metrics.produce_observer("kafka"),
        )
        self.kafka = KafkaListener(
            handlers,
            ListenerSettings(
                settings.frame_bytes_max,
                settings.connections_max,
                settings.inflight_bytes_max,
                token=self.config.server.token,
                idle_timeout_s=settings.idle_timeout_s,
                header_timeout_s=settings.header_timeout_s,
                frame_timeout_s=settings.frame_timeout_s,
            ),
        )
        metrics.collector.add_source(kafka_metrics(self.kafka))
        tls_context = settings.tls_context()
        if tls_context is not None:
            listener = KafkaTLSListener(
                listener,
                tls_context,
                standard_compatible=False,
                handshake_timeout=KAFKA_TLS_HANDSHAKE_TIMEOUT_S,
                stats=self.kafka.stats,
            )
        return listener

    def _start_kafka(
        self, tg: anyio.abc.TaskGroup, bound: _KafkaBound | None, listener: Any
    ) -> anyio.CancelScope:
        """The Kafka listener serving on its bound socket, in a scope `run` cancels at the end."""
        scope = anyio.CancelScope()
        if bound is None:
            return scope
        assert self.kafka is not None

        async def serve() -> None:
            with scope:
                async with listener:
                    await self.kafka.serve(listener)

        tg.start_soon(serve)
        log.info(
            "kafka listener ready",
            extra={"listen": f"{bound.host}:{self.kafka_port}", "tls": listener is not bound.listener},
        )
        return scope

    def _serving_status(self) -> str:
        """systemd's STATUS= line while serving: what is wrong first, if anything."""
        node = self.node
        assert node is not None
        serving = f"serving on {self.url}: {len(node.partitions())} partitions, epoch {node.epochs.current}"
        problem = self.lifecycle.storage.problem()
        return f"NOT READY, storage unhealthy: {problem} ({serving})" if problem else serving

    def _storage_health_changed(self, health: StorageHealth) -> None:
        if self.lifecycle.ready and not self.lifecycle.stopping:
            self.notifier.status(self._serving_status())

    def _metrics_server_for(self, metrics: DaemonMetrics) -> _UvicornServer:
        """The optional second listener: GET /metrics, no token (`metrics.listen`); built and
        loaded before the node runs (see `_serve`)."""
        server = _UvicornServer(
            uvicorn.Config(
                metrics_app(metrics.registry),
                lifespan="off",
                log_config=None,
                access_log=False,
                http="h11",
                ws="none",
                limit_concurrency=METRICS_CONNECTIONS_MAX,
                server_header=False,
                proxy_headers=False,
            )
        )
        server.config.load()
        return server

    async def _serve_metrics(self, tg: anyio.abc.TaskGroup, server: _UvicornServer) -> None:
        host, port = parse_listen(self.config.metrics.listen)
        sock = bind_listener(host, port, "the metrics listener (metrics.listen)")
        self.metrics_url = f"http://{_url_host(host)}:{sock.getsockname()[1]}"
        self._metrics_server = server
        tg.start_soon(server.serve_until_exit, sock)
        await server.listening.wait()
        if not server.started:
            raise StartupError(f"the metrics listener on {self.config.metrics.listen} did not start")

    async def _stop(self, node: Node, server: _UvicornServer) -> None:
        timeout_s = self.config.server.shutdown_timeout_s
        log.info("stopping: draining in-flight produces", extra={"reason": self.stop_reason})
        self.lifecycle.stopping = True
        self.notifier.stopping("draining in-flight produces")
        with anyio.move_on_after(timeout_s) as scope:
            await node.shutdown()
            server.should_exit = True
            await server.finished.wait()
            if self._metrics_server is not None:
                self._metrics_server.should_exit = True
                await self._metrics_server.finished.wait()
        if scope.cancelled_caught:
            log.error("shutdown did not finish within %.0f s; forcing", timeout_s)
            for stuck in (server, self._metrics_server):
                if stuck is not None:
                    stuck.force_exit = True
                    stuck.should_exit = True
            await self._interrupt_requests(server)
        else:
            self.stopped_cleanly = True

    async def _interrupt_requests(self, server: _UvicornServer) -> None:
        """A forced stop: the requests still in the app are cancelled now and answered 503
        `interrupted` (`AnsweredWhenForced`), rather than cancelled as the event loop closes
        (uvicorn's bare 500, an ERROR traceback each), and given a moment to be written."""
        self.lifecycle.forced = True
        tasks = list(server.server_state.tasks)
        for task in tasks:
            task.cancel()
        with anyio.move_on_after(FORCED_ANSWERS_WAIT_S):
            while any(not task.done() for task in tasks):
                await anyio.sleep(0.01)
        if tasks:
            log.warning(
                "%d request(s) in progress when the stop was forced were interrupted (answered 503 "
                "interrupted where their answer had not begun)",
                len(tasks),
            )


@contextlib.asynccontextmanager
async def running_daemon(
    config: Config,
    *,
    wrap_object_store: Callable[[ObjectStore], ObjectStore] | None = None,
) -> AsyncIterator[Daemon]:
    """A started daemon for in-process use (demo, tests); stopped gracefully on exit."""
    daemon = Daemon(config, wrap_object_store=wrap_object_store)
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        try:
            yield daemon
        finally:
            daemon.request_stop("leaving running_daemon")


def freeze_heap() -> None:
    """Collect, then freeze what is left: the modules, the S3 client's service models (tens of
    thousands of dicts), the config, the HTTP app. A full collection otherwise walks all of it
    again and again: 80 ms pauses of the event loop, measured in the GC benchmark, where a
    frozen heap pauses for 1-2 ms. Frozen objects are never collected: a frozen object that
    later becomes garbage in a reference cycle stays (bounded by what start-up built, once).
    So only a process that is the daemon's alone calls this, once, after the stores are open
    and before any actor or request runs."""
    gc.collect()
    gc.freeze()
    log.debug("heap frozen after start-up", extra={"objects_frozen": gc.get_freeze_count()})


async def run_until_signalled(config: Config, notifier: Notifier | None = None) -> bool:
    """The `levelzero run` process body. Returns whether the stop was clean.

    First SIGTERM/SIGINT: graceful stop (or, during start-up, abandon the start-up). A second
    one while stopping: give up waiting and exit at once. SIGHUP: re-open log handlers.
    """
    daemon = Daemon(config, notifier=notifier or Notifier(), freeze_heap_at_start=True)
    forced = False
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async with anyio.create_task_group() as tg:
            run_scope = anyio.CancelScope()

            async def watch_signals() -> None:
                nonlocal forced
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if signum == signal.SIGHUP:
                        settings = config.logging
                        try:
                            configure_logging(settings.level, settings.format, settings.file)
                        except OSError as exc:  # keep the old handler; never die of a reload
                            log.error("SIGHUP: cannot re-open the log file %s: %s", settings.file, exc)
                        else:
                            log.info("SIGHUP: log handlers re-opened")
                    elif not daemon.lifecycle.ready:
                        log.info("%s during start-up: abandoning the start-up", name)
                        daemon.request_stop(name)
                        run_scope.cancel()
                    elif daemon.stop_requested:
                        log.warning("%s again while stopping: exiting at once", name)
                        forced = True
                        run_scope.cancel()
                    else:
                        daemon.request_stop(name)

            tg.start_soon(watch_signals)
            with run_scope:
                await daemon.run()
            daemon.notifier.close()
            tg.cancel_scope.cancel()
    if forced:
        return False
    return daemon.stopped_cleanly or not daemon.lifecycle.ready
