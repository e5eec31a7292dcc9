"""The `levelzero` commands: the daemon (`run`), the demos, backup and install, and the client
commands over the HTTP API (`client.py`); the tools (sim, export, analyze, bench) own their
arguments.
"""

from __future__ import annotations

import argparse
import getpass
import importlib
import importlib.util
import json
import logging
import os
import secrets
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

import anyio
import httpx
import msgspec

from levelzero.core.errors import LevelZeroError, StoreRefused, UnknownPartition
from levelzero.core.reconcile_health import ABANDON_GIVES_UP
from levelzero.client import ApiError, Client, default_url
from levelzero.config import ConfigError, describe, load_config, secrets_readable_by_others, token_problem
from levelzero.daemon.logs import configure_logging
from levelzero.cli.formats import (
    _cell,
    _json_out,
    _print_record,
    format_compaction,
    format_explanation,
    format_round,
    format_status,
    plural,
    table,
)


log = logging.getLogger("levelzero.cli")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
# Standard output's reader went away (`levelzero consume t | head -1`): what the shell reports
# for `cat` there, killed by SIGPIPE (128 + 13), so a `set -o pipefail` script treats both
# alike; and neither 1 (a failed operation) nor 2 (bad usage).
EXIT_BROKEN_PIPE = 141

# One request waits out the batcher's linger (250 ms by default) whatever its size, so a request
# carries as much as the server takes by default (server.records_per_request_max = 10000) and
# stays under batcher.batch_bytes_max (4 MiB, one request's limit by the size rule of
# core/produce_size.py: 3 MiB of keys and values leave room for its 8 bytes a record).
PRODUCE_BATCH_RECORDS = 10_000
PRODUCE_BATCH_BYTES = 3 * 1024 * 1024
PRODUCE_IN_FLIGHT_DEFAULT = 1
PRODUCE_IN_FLIGHT_MAX = 64
# A produce request's idempotency key: "levelzero-produce/<run>/<request number>", the run a
# random 64-bit id (hex), so no two runs share a key: 1-256 characters (docs/http-api.md).
PRODUCE_KEY_PREFIX = "levelzero-produce"
PRODUCE_RUN_ID_BYTES = 8
PROGRESS_AFTER_RECORDS = 10_000
PROGRESS_INTERVAL_S = 1.0
FOLLOW_POLL_MIN_S = 0.1
DRY_RUN_KEYS_SHOWN_DEFAULT = 20
CLUSTER_DEMO_NODES_MAX = 5

Handler = Callable[[argparse.Namespace], int]


class CommandFailed(Exception):
    """A command's own one-line failure (printed without a traceback)."""


def _fail(message: str) -> None:
    print(f"levelzero: {message}", file=sys.stderr)


def refuse_optimized_python() -> int | None:
    """Assertions guard the invariants; running without them (python -O) is refused."""
    if not __debug__:
        _fail(
            "refusing to run with assertions disabled (python -O or PYTHONOPTIMIZE): "
            "levelzero's invariant checks must stay on"
        )
        return EXIT_USAGE
    return None


def _load(args: argparse.Namespace):  # noqa: ANN202 - Config
    overrides: dict[tuple[str, str], Any] = {}
    if args.data_dir is not None:
        overrides[("storage", "data_dir")] = args.data_dir
    if getattr(args, "listen", None) is not None:  # only the commands that take --listen
        overrides[("server", "listen")] = args.listen
    path = args.config or os.environ.get("LEVELZERO_CONFIG") or None
    names = {("storage", "data_dir"): "--data-dir", ("server", "listen"): "--listen"}
    return load_config(path, environ=os.environ, overrides=overrides, override_names=names)


def leaf_errors(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaf_errors(inner)]
    return [error]


def cmd_run(args: argparse.Namespace) -> int:
    from levelzero.daemon.gc_tuning import tune_gc
    from levelzero.daemon.service import run_until_signalled

    refused = refuse_optimized_python()
    if refused is not None:
        return refused
    try:
        config = _load(args)
    except ConfigError as exc:
        _fail(str(exc))
        return EXIT_USAGE
    try:
        configure_logging(config.logging.level, config.logging.format, config.logging.file)
    except OSError as exc:
        _fail(f"cannot open the log file logging.file = {config.logging.file!r}: {exc.strerror}")
        return EXIT_USAGE
    path = args.config or os.environ.get("LEVELZERO_CONFIG")
    exposed = secrets_readable_by_others(path) if path else None
    if exposed is not None:
        log.warning(exposed)
    tune_gc()  # fewer, cheaper collections with many partitions (daemon/gc_tuning.py)
    try:
        # uvloop when installed (an optional dependency): +15-30% on actor-bound paths.
        uvloop = importlib.util.find_spec("uvloop") is not None
        clean = anyio.run(run_until_signalled, config, backend_options={"use_uvloop": uvloop})
    except BaseException as error:  # the process boundary: report, exit non-zero
        leaves = leaf_errors(error)
        if all(isinstance(leaf, LevelZeroError) for leaf in leaves):
            for message, code in dict.fromkeys((str(leaf), leaf.code) for leaf in leaves):  # type: ignore[attr-defined]
                # Once on stderr (journald); a log file gets it as an event of its own.
                if config.logging.file:
                    log.error("levelzero stopped", extra={"error": code, "detail": message})
                _fail(message)
            # A store a restart cannot fix (a newer schema, another cluster's objects): 2, which
            # systemd does not restart (RestartPreventExitStatus=2), like bad configuration.
            return EXIT_USAGE if any(isinstance(leaf, StoreRefused) for leaf in leaves) else EXIT_FAILED
        if all(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
            return EXIT_INTERRUPTED
        log.critical("levelzero crashed", exc_info=error)
        return EXIT_FAILED
    return EXIT_OK if clean else EXIT_FAILED


def cmd_demo(args: argparse.Namespace) -> int:
    from levelzero.cli.demo import run_demo

    refused = refuse_optimized_python()
    if refused is not None:
        return refused
    if args.duration <= 0:
        _fail("--duration must be positive")
        return EXIT_USAGE
    if not 1 <= args.nodes <= CLUSTER_DEMO_NODES_MAX:
        _fail(f"--nodes must be in 1..{CLUSTER_DEMO_NODES_MAX}")
        return EXIT_USAGE
    if args.producers < 1:
        _fail("--producers must be >= 1")
        return EXIT_USAGE
    configure_logging("warning")
    if args.nodes > 1:
        from levelzero.cli.cluster_demo import run_cluster_demo

        if args.data_dir is not None:
            _fail("--data-dir is for the one-node demo; the cluster demo keeps its data with --keep")
            return EXIT_USAGE
        cluster = anyio.run(
            lambda: run_cluster_demo(
                nodes=args.nodes,
                duration_s=args.duration,
                producers=args.producers,
                keep=args.keep,
                out=sys.stdout,
            )
        )
        if cluster.failure is not None and cluster.acked_writes == 0 and "PostgreSQL" in cluster.failure:
            return EXIT_USAGE
        return EXIT_OK if cluster.ok else EXIT_FAILED
    summary = anyio.run(
        lambda: run_demo(
            duration_s=args.duration,
            data_dir=args.data_dir,
            keep=args.keep,
            producers=args.producers,
            out=sys.stdout,
        )
    )
    return EXIT_OK if summary.ok else EXIT_FAILED


def cmd_config_show(args: argparse.Namespace) -> int:
    try:
        config = _load(args)
    except ConfigError as exc:
        _fail(str(exc))
        return EXIT_USAGE
    print(json.dumps(describe(config), indent=2))
    return EXIT_OK


# `levelzero backup` and `restore` are for the SQLite file; on PostgreSQL the data directory holds
# no log store, and restoring one there would replace its cluster-id (docs/backup-restore.md,
# "PostgreSQL"; docs/postgresql.md).
POSTGRES_BACKUP = (
    'the control plane is PostgreSQL (control.kind = "postgres"): `levelzero backup` copies the '
    "SQLite log store only; back the database up with PostgreSQL's tools (pg_dump, base backups "
    "and WAL archiving), see docs/postgresql.md, 'PostgreSQL control plane'"
)
POSTGRES_RESTORE = (
    'the control plane is PostgreSQL (control.kind = "postgres"): `levelzero restore` puts back a '
    "SQLite log store only, and nothing was changed. Restore the database with PostgreSQL's tools "
    "(pg_restore of a pg_dump, a base backup), then, every daemon stopped, run "
    "`levelzero recover --from-bucket --config …` (see docs/backup-restore.md, 'PostgreSQL')"
)


def cmd_backup(args: argparse.Namespace) -> int:
    from levelzero.daemon.backup import (
        BackupError,
        BackupRefused,
        backup,
        backup_taken_at,
        finish_restore,
        restore,
    )

    try:
        config = _load(args)
    except ConfigError as exc:
        _fail(str(exc))
        return EXIT_USAGE
    if config.control.kind == "postgres":
        _fail(POSTGRES_BACKUP if args.backup_command == "backup" else POSTGRES_RESTORE)
        return EXIT_USAGE
    data_dir = config.storage.data_dir
    try:
        if args.backup_command == "backup":
            unfinished = _unfinished_restore(data_dir)
            if unfinished is not None:  # a backup of a store the daemon refuses to start on
                _fail(f"refusing to back up: {unfinished}")
                return EXIT_FAILED
            summary = backup(data_dir, args.destination)
        else:
            summary = restore(args.backup, data_dir, check_cluster=_backup_cluster_check(config, args.backup))
    except BackupError as exc:
        _fail(str(exc))
        return EXIT_USAGE if isinstance(exc, BackupRefused) else EXIT_FAILED
    m = summary.manifest
    facts = (
        f"cluster epoch {m['cluster_epoch']}, {m['partitions']} partitions, "
        f"schema {m['schema_version']}, taken {m['taken_at']} by levelzero {m['levelzero_version']}"
    )
    if args.backup_command == "backup":
        print(f"backed up {data_dir} to {summary.directory}: {facts}")
        print("objects are not in a backup: they stay in the object store")
        return EXIT_OK
    print(
        f"copied the log store of {args.backup} into {data_dir} ({facts}); adopting the bucket's L1 objects"
    )
    # The bucket holds what the live daemon reconciled since the backup: adopt it, or reads of
    # records the backup acknowledged fail once the live GC deleted their L0 objects.
    code = _recover(config, after_restore=True, backup=args.backup, taken_at=backup_taken_at(m))
    if code == EXIT_OK:
        finish_restore(data_dir)  # only now may the daemon start on it
        print(f"restored {args.backup} into {data_dir}")
        print("start the daemon; see docs/backup-restore.md, 'What an older backup means'")
    return code


def _unfinished_restore(data_dir: str) -> str | None:
    """Why `data_dir` holds a restore that did not finish (the daemon refuses to start on it),
    or None."""
    from levelzero.daemon.backup import refuse_unfinished_restore

    try:
        refuse_unfinished_restore(data_dir)
    except LevelZeroError as exc:
        return str(exc)
    return None


def _backup_cluster_check(config: Any, backup: str) -> Callable[[str], None]:
    """Refuse, before `restore` writes anything, a backup of a cluster that does not own the
    bucket: the daemon would refuse to start on it."""
    from levelzero.daemon.backup import BackupError, BackupRefused
    from levelzero.daemon.ownership import StoreOwnedByAnotherCluster
    from levelzero.daemon.recover import refuse_another_clusters_backup

    def check(cluster_id: str) -> None:
        try:
            anyio.run(refuse_another_clusters_backup, config, cluster_id, backup)
        except StoreOwnedByAnotherCluster as exc:
            raise BackupRefused(f"refusing to restore, nothing was changed: {exc}") from None
        except (LevelZeroError, OSError) as exc:
            raise BackupError(
                f"cannot read the object store's ownership marker, nothing was restored: {exc}"
            ) from None

    return check


def _recover(
    config: Any, *, after_restore: bool, backup: str | None = None, taken_at: float | None = None
) -> int:
    from levelzero.daemon.recover import describe as describe_recovery
    from levelzero.daemon.recover import recover_configured

    try:
        summary = anyio.run(recover_configured, config, taken_at)
    except BaseException as error:  # the process boundary: report, exit non-zero
        leaves = leaf_errors(error)
        if not all(isinstance(leaf, (LevelZeroError, OSError)) for leaf in leaves):
            raise
        for message in dict.fromkeys(str(leaf) for leaf in leaves):
            if after_restore:
                message = (
                    f"the log store is restored, but adopting the bucket's L1 objects failed: "
                    f"{message}; fix the cause and run `levelzero restore {backup} --config …` "
                    "again (the daemon refuses to start until it has finished)"
                )
            _fail(message)
        return EXIT_FAILED
    for line in describe_recovery(summary):
        print(line)
    return EXIT_OK


def cmd_recover(args: argparse.Namespace) -> int:
    try:
        config = _load(args)
    except ConfigError as exc:
        _fail(str(exc))
        return EXIT_USAGE
    if not args.from_bucket:
        _fail("say where to recover from: --from-bucket")
        return EXIT_USAGE
    unfinished = _unfinished_restore(config.storage.data_dir) if config.control.kind != "postgres" else None
    if unfinished is not None:  # the restore's own adoption finishes it; this would leave the marker
        _fail(f"refusing to recover, nothing was changed: {unfinished}")
        return EXIT_FAILED
    return _recover(config, after_restore=False)


def cmd_install_files(args: argparse.Namespace) -> int:
    from levelzero.daemon.install import InstallError, install_files

    try:
        written = install_files(args.directory, force=args.force)
    except InstallError as exc:
        _fail(str(exc))
        return EXIT_FAILED
    for item in written:
        print(f"wrote {item.path} (mode {item.mode:04o})")
    return EXIT_OK


def url_problem(url: str) -> str | None:
    """What is wrong with a daemon URL, before any request: a missing scheme (`127.0.0.1:8420`
    would be taken for one), no host, a port out of range, a malformed address."""
    if not url.startswith(("http://", "https://")):
        return f"daemon URL {url!r} has no http:// or https:// scheme (e.g. http://{url.split('://')[-1]})"
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        return f"daemon URL {url!r} is malformed: {exc}"
    if not parsed.host:
        return f"daemon URL {url!r} names no host"
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        return f"daemon URL {url!r}: port {parsed.port} is not in 1..65535"
    return None


def _client(args: argparse.Namespace, *, wait_for_restart: bool = False) -> Client:
    return Client(args.url, token=args.token, timeout_s=args.timeout, wait_for_restart=wait_for_restart)


def _client_command(
    body: Callable[[argparse.Namespace, Client], Any], *, wait_for_restart: bool = False
) -> Handler:
    """Run an async client command; ApiError -> one line and exit 1; Ctrl-C -> 130.
    `wait_for_restart`: a daemon that stops answering mid-command is waited for (Client)."""

    def handler(args: argparse.Namespace) -> int:
        problem = token_problem(args.token) if args.token else None
        if problem:
            _fail(f"--token (or $LEVELZERO_TOKEN): {problem}")
            return EXIT_USAGE
        problem = url_problem(args.url or default_url())
        if problem is not None:
            _fail(
                problem if args.url or not os.environ.get("LEVELZERO_URL") else f"$LEVELZERO_URL: {problem}"
            )
            return EXIT_USAGE

        async def main() -> int:
            async with _client(args, wait_for_restart=wait_for_restart) as client:
                return await body(args, client) or EXIT_OK

        try:
            return anyio.run(main)
        except (ApiError, CommandFailed) as exc:
            _fail(str(exc))
            return EXIT_FAILED
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED

    return handler


async def _topics_create(args: argparse.Namespace, client: Client) -> None:
    info = await client.create_topic(args.name, args.partitions, dict(args.config))
    if args.json:
        _json_out(info)
    else:
        print(f"created topic {info.name} with {plural(info.partitions, 'partition')}")


def _topics_delete(args: argparse.Namespace) -> int:
    if not args.confirm:
        _fail(f"topics delete removes every record of {args.name} for good. Add --confirm to do it")
        return EXIT_USAGE
    return _client_command(_topics_delete_call)(args)


async def _topics_delete_call(args: argparse.Namespace, client: Client) -> None:
    info = await client.delete_topic(args.name)
    if args.json:
        _json_out(info)
    else:
        print(
            f"deleted topic {info.name} ({plural(info.partitions, 'partition')}); the GC collects its objects"
        )


async def _topics_list(args: argparse.Namespace, client: Client) -> None:
    topics = await client.list_topics()
    if args.json:
        print(msgspec.json.format(msgspec.json.encode({"topics": topics})).decode())
    elif not topics:
        print("no topics")
    else:
        print(table(("TOPIC", "PARTITIONS"), [(t.name, str(t.partitions)) for t in topics]))


async def _topics_config(args: argparse.Namespace, client: Client) -> None:
    """`topics config TOPIC` shows the configs; with NAME=VALUE sets and --delete NAME deletes
    them (the others stay); --replace makes NAME=VALUE the topic's whole set."""
    changes: dict[str, str | None] = dict(args.set)
    changes.update((name, None) for name in args.delete)
    if args.replace:
        configs = await client.replace_topic_configs(args.topic, dict(args.set))
    elif changes:
        configs = await client.change_topic_configs(args.topic, changes)
    else:
        configs = await client.topic_configs(args.topic)
    shown = [c for c in configs.configs if args.all or c.source == "topic"]
    if args.json:
        _json_out(configs)
    elif not shown:
        print(f"no configs set on topic {configs.topic} (--all lists every config and where it comes from)")
    else:
        print(table(("CONFIG", "VALUE", "SOURCE"), [(c.name, c.value, c.source) for c in shown]))


class MalformedLine(Exception):
    """An input line the command cannot turn into a record (it names the line)."""


class _Input:
    """The records to produce, from the VALUE arguments or one per stdin line, with the line
    number of each: a malformed line (no key separator) stops the input cleanly, after the
    records before it, or is skipped and reported (`--skip-malformed`)."""

    def __init__(self, args: argparse.Namespace, lines: Iterable[bytes] | None = None) -> None:
        self._key = None if args.key is None else args.key.encode()
        self._separator = None if args.key_separator is None else args.key_separator.encode()
        self._shown_separator = args.key_separator
        self._skip = args.skip_malformed
        self._empty_as_null = args.empty_as_null
        self.skipped = 0
        self.malformed: MalformedLine | None = None  # the line that stopped the input
        self._what = "input line"  # how a malformed line is named
        if lines is None:
            if args.values:
                self._what = "VALUE argument"
                lines = (value.encode() for value in args.values)
            else:
                lines = (line.rstrip(b"\r\n") if line.endswith(b"\n") else line for line in sys.stdin.buffer)
        self._lines = lines

    def __iter__(self) -> Iterator[tuple[bytes | None, bytes | None]]:
        for number, line in enumerate(self._lines, start=1):
            if self._separator is None:
                yield self._key, self._value(line)
                continue
            if self._separator not in line:
                problem = MalformedLine(
                    f"{self._what} {number}: no key separator {self._shown_separator!r} in {line[:80]!r}"
                )
                if not self._skip:
                    self.malformed = problem
                    return
                self.skipped += 1
                _fail(f"{problem} (skipped)")
                continue
            line_key, _, value = line.partition(self._separator)
            yield line_key, self._value(value)

    def _value(self, value: bytes) -> bytes | None:
        """`--empty-as-null`: an empty value is sent as a null value (a tombstone)."""
        return None if self._empty_as_null and not value else value


def _batches(
    records: Iterable[tuple[bytes | None, bytes | None]], max_records: int, max_bytes: int
) -> Iterable[list[tuple[bytes | None, bytes | None]]]:
    batch: list[tuple[bytes | None, bytes | None]] = []
    size = 0
    for record in records:
        record_size = len(record[1] or b"") + len(record[0] or b"")
        if batch and (len(batch) >= max_records or size + record_size > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(record)
        size += record_size
    if batch:
        yield batch


class _Progress:
    """A progress line on stderr for large inputs: '\\r' on a terminal, new lines otherwise."""

    def __init__(self) -> None:
        self._tty = sys.stderr.isatty()
        self._last = float("-inf")  # the first update past the threshold shows at once
        self.shown = False

    def update(self, records: int, size: int) -> None:
        now = time.monotonic()
        if records < PROGRESS_AFTER_RECORDS or now - self._last < PROGRESS_INTERVAL_S:
            return
        self._last = now
        self.shown = True
        line = f"produced {records} records ({size / 1048576:.1f} MiB)"
        print(f"\r{line}" if self._tty else line, end="" if self._tty else "\n", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.shown and self._tty:
            print(file=sys.stderr)


class _Produced:
    """What the server acknowledged: counts, the offsets' range, whether requests overtook."""

    def __init__(self) -> None:
        self.records = self.size = self.requests = 0
        self.duplicates = 0  # requests a resend found stored already (sent before a crash)
        self.first: int | None = None
        self.last: int | None = None
        self.overtaken = 0  # requests answered with offsets below an earlier-sent request's
        self._highest_base_by_sequence: list[tuple[int, int]] = []

    def add(
        self,
        sequence: int,
        batch: list[tuple[bytes | None, bytes | None]],
        base: int,
        last: int,
        duplicate: bool = False,
    ) -> None:
        self.duplicates += duplicate
        self.records += len(batch)
        self.size += sum(len(v or b"") + len(k or b"") for k, v in batch)
        self.requests += 1
        self.first = base if self.first is None else min(self.first, base)
        self.last = last if self.last is None else max(self.last, last)
        # A request sent later whose offsets are lower: the input order was not kept.
        self.overtaken += any(
            s < sequence and b > base for s, b in self._highest_base_by_sequence[-PRODUCE_IN_FLIGHT_MAX:]
        )
        self._highest_base_by_sequence.append((sequence, base))


def produce_key(run: str, sequence: int) -> str:
    """The idempotency key of a run's request `sequence`: a resend of it (after a lost
    connection or a 503, by the client) carries the same key, so the daemon stores it once."""
    return f"{PRODUCE_KEY_PREFIX}/{run}/{sequence}"


async def _produce(args: argparse.Namespace, client: Client) -> None:
    """Requests of `--batch-records` records; up to `--in-flight` of them at once. Reading the
    next batch from stdin happens in a worker thread while requests are on their way. Each
    request carries an idempotency key of its own (the run's random id and its number), so
    the client sends it again when the daemon dies or restarts with it in hand."""
    records = _Input(args)
    batches = iter(_batches(records, args.batch_records, PRODUCE_BATCH_BYTES))
    done = _Produced()
    progress = _Progress()
    slots = anyio.Semaphore(args.in_flight)
    run = secrets.token_hex(PRODUCE_RUN_ID_BYTES)

    async def send(sequence: int, batch: list[tuple[bytes | None, bytes | None]]) -> None:
        key = produce_key(run, sequence) if args.idempotency_keys else None
        try:
            ack = await client.produce(args.topic, args.partition, batch, idempotency_key=key)
        except ApiError as error:
            if not error.outcome_unknown:
                raise
            raise CommandFailed(f"{error}; {_outcome_unknown(args, len(batch), key)}") from None
        finally:
            slots.release()
        done.add(sequence, batch, ack.base_offset, ack.last_offset, ack.duplicate)
        progress.update(done.records, done.size)

    try:
        async with anyio.create_task_group() as tg:
            for sequence in range(sys.maxsize):
                await slots.acquire()
                batch = await anyio.to_thread.run_sync(next, batches, None)
                if batch is None:
                    slots.release()
                    break
                tg.start_soon(send, sequence, batch)
    except BaseExceptionGroup as group:
        failures = [leaf for leaf in leaf_errors(group) if isinstance(leaf, (ApiError, CommandFailed))]
        if not failures:
            raise
        acknowledged = f"; {plural(done.records, 'record')} acknowledged before it" if done.records else ""
        raise CommandFailed(f"{failures[0]}{acknowledged}") from None
    finally:
        progress.done()
    summary = _produce_summary(args, done, records)
    if args.json:
        print(msgspec.json.encode(summary).decode())
    elif done.records:
        print(
            f"produced {plural(done.records, 'record')} to {args.topic}/{args.partition} at offsets "
            f"{done.first}..{done.last}"
            + (f"; skipped {plural(records.skipped, 'malformed line')}" if records.skipped else "")
            + (
                f"; {plural(done.overtaken, 'request')} overtook an earlier one (--in-flight > 1)"
                if done.overtaken
                else ""
            )
        )
    if records.malformed is not None:
        raise CommandFailed(f"{records.malformed}; stopped there (--skip-malformed skips such lines)")
    if done.records == 0 and not records.skipped:
        raise CommandFailed("nothing to produce (no values and empty stdin)")


def _outcome_unknown(args: argparse.Namespace, records: int, key: str | None) -> str:
    """What to do about a request the daemon may have stored without saying so: its records,
    sent again blindly, may be stored twice. The run's keys are its own (a random run id): a
    new run sends the records under new keys, which the daemon cannot recognise."""
    where = f"{args.topic}/{args.partition}"
    check = f"check {where}'s high watermark (levelzero status) or consume it before sending them again"
    if key is None:
        return (
            f"the outcome is unknown: its {plural(records, 'record')} may have been stored, and "
            f"the request carried no idempotency key (--no-idempotency-key); {check}"
        )
    return (
        f"the outcome is unknown: its {plural(records, 'record')} may have been stored; {check}: "
        f"a new levelzero produce run sends them with new idempotency keys, so they would be "
        f"stored twice (a client sending them again with this request's key, {key}, has them "
        "stored once)"
    )


def _produce_summary(args: argparse.Namespace, done: _Produced, records: _Input) -> dict[str, Any]:
    return {
        "topic": args.topic,
        "partition": args.partition,
        "records": done.records,
        "requests": done.requests,
        "first_offset": done.first,
        "last_offset": done.last,
        "skipped_lines": records.skipped,
        "overtaken_requests": done.overtaken,
        "duplicate_requests": done.duplicates,
    }


async def _consume_stream(
    args: argparse.Namespace, client: Client
) -> AsyncIterator[tuple[int, bytes | None, bytes | None]]:
    offset = args.offset
    delay_s = FOLLOW_POLL_MIN_S
    while True:
        result = await client.fetch(args.topic, args.partition, offset, args.max_bytes)
        for record in result.records:
            yield record.offset, record.key, record.value
        # A page of Kafka transaction markers alone has no records but moves on (they are not
        # returned): read on from its next offset while it is below the high watermark.
        moved = offset is None or result.next_offset > offset
        if result.records or (moved and result.next_offset < result.high_watermark):
            offset = result.next_offset
            delay_s = FOLLOW_POLL_MIN_S
            continue
        if offset is None:
            offset = result.next_offset
        if not args.follow:
            return
        await anyio.sleep(delay_s)  # bounded polling: back off up to --poll-max-s
        delay_s = min(delay_s * 2, args.poll_max_s)


async def _consume(args: argparse.Namespace, client: Client) -> None:
    count = 0
    fmt = "json" if args.json else args.format  # --json: one JSON object per record
    async for offset, key, value in _consume_stream(args, client):
        _print_record(fmt, offset, key, value)
        count += 1
        if args.max_records is not None and count >= args.max_records:
            break
    sys.stdout.flush()


async def _compaction_explain(args: argparse.Namespace, client: Client) -> None:
    if args.partition is None:
        compactor = (await client.status()).compactor
    else:  # a partition the daemon does not have is an error (exit 1), as a fetch of it is
        topic, partition = _topic_partition(args.partition)
        compactor = (await client.status(topic)).compactor  # an unknown topic: the server's 404
        counts = {t.name: t.partitions for t in await client.list_topics()}
        if partition >= counts.get(topic, 0):
            raise CommandFailed(str(UnknownPartition(topic, partition)))
    if args.json:
        if compactor is not None and args.partition is not None:  # that partition's only, as the text
            shown = [p for p in compactor.partitions if p.partition == args.partition]
            compactor = msgspec.structs.replace(compactor, partitions=shown)
        print(msgspec.json.format(msgspec.json.encode(compactor)).decode())
    else:
        print(format_compaction(compactor, args.partition))


async def _status(args: argparse.Namespace, client: Client) -> None:
    status = await client.status(args.topic)
    if args.all:
        partitions = await client.all_partitions(topic=args.topic)
        status = msgspec.structs.replace(
            status, partitions=partitions, partitions_total=len(partitions), partitions_next_after=None
        )
    if args.json:
        print(msgspec.json.format(msgspec.json.encode(status)).decode())
        return
    print(format_status(status))
    cluster = await client.cluster()
    if cluster.enabled:  # a node's status is of the partitions it leads: say so, and how to see the rest
        print(
            f"(node {cluster.node_id} leads the partitions above; the cluster has "
            f"{cluster.partitions_total}: `levelzero --url URL status` against each node shows its own, "
            "`levelzero cluster` lists the nodes)"
        )


async def _epoch_advance(args: argparse.Namespace, client: Client) -> None:
    epoch = await client.advance_epoch()
    print(
        msgspec.json.encode({"cluster_epoch": epoch}).decode()
        if args.json
        else f"cluster epoch is now {epoch}"
    )


async def _gc_run(args: argparse.Namespace, client: Client) -> None:
    report = await client.gc_run(dry_run=args.dry_run)
    if args.json:
        _json_out(report)
        return
    print(format_round(report))
    if args.dry_run and report.would_delete:
        shown = report.would_delete if args.show is None else report.would_delete[: args.show]
        for key in shown:
            print(f"  {key}")
        left = len(report.would_delete) - len(shown)
        if left > 0:
            print(f"  ... and {left} more (--all prints them)")
        if report.would_delete_truncated:
            print(f"  ... the server listed only the first {len(report.would_delete)} (gc.dry_run_keys_max)")


async def _gc_pause(args: argparse.Namespace, client: Client) -> None:
    status = await client.gc_pause()
    if args.json:
        _json_out(status)
    else:
        print("gc paused: no rounds of its own until `levelzero gc resume` (gc run still works)")


async def _gc_resume(args: argparse.Namespace, client: Client) -> None:
    status = await client.gc_resume()
    if args.json:
        _json_out(status)
    else:
        print("gc resumed: a round runs now")


async def _gc_explain(args: argparse.Namespace, client: Client) -> None:
    explanation = await client.gc_explain(key=args.key, epoch=args.epoch)
    if args.json:
        _json_out(explanation)
    else:
        print(format_explanation(explanation))


def _topic_partition(text: str) -> tuple[str, int]:
    """`TOPIC/P` (the last `/` splits, so any stored topic name can be named)."""
    topic, slash, number = text.rpartition("/")
    if not slash or not topic or not number.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not TOPIC/PARTITION (e.g. orders/3)")
    return topic, int(number)


def _default_operator() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _partition_abandon(args: argparse.Namespace) -> int:
    if not args.confirm:
        _fail(f"partition abandon-unreconciled {ABANDON_GIVES_UP}. Add --confirm to do it")
        return EXIT_USAGE
    return _client_command(_partition_abandon_call)(args)


async def _partition_abandon_call(args: argparse.Namespace, client: Client) -> None:
    topic, partition = args.partition
    done = await client.abandon_unreconciled(
        topic, partition, operator=args.by, reason=args.reason, confirm=True
    )
    if args.json:
        _json_out(done)
        return
    given_up = (
        f"data offsets {done.first_offset}..{done.last_offset} given up"
        if done.first_offset <= done.last_offset
        else "nothing given up (a catch-up landed first)"
    )
    print(
        f"{done.partition}: {given_up} (log offset {done.log_offset}, term {done.term}); "
        f"M(p) {_cell(done.mp_before)} -> {_cell(done.mp_after)}; recorded as by {done.operator!r}: "
        f"{done.reason!r}"
    )


def _tool(command: str, module: str, function: str) -> Callable[[list[str]], int]:
    def run(argv: list[str]) -> int:
        try:
            hook = getattr(importlib.import_module(module), function)
        except ImportError as exc:
            _fail(f"{command}: not available in this installation ({module}: {exc})")
            return EXIT_FAILED
        return hook(argv)

    return run


BENCH_NEEDS = "moto"  # the S3 items run against an in-process moto server


def _bench(argv: list[str]) -> int:
    if importlib.util.find_spec("levelzero.bench") is None:
        _fail(
            "bench: the benchmark suite (levelzero.bench) is not part of this installation; "
            "install levelzero from a source checkout with the bench extra"
        )
        return EXIT_FAILED
    if importlib.util.find_spec(BENCH_NEEDS) is None and not {"-h", "--help"} & set(argv):
        _fail(f"bench: needs the bench extra ({BENCH_NEEDS}): pip install 'levelzero[bench]'")
        return EXIT_USAGE
    return _tool("bench", "levelzero.bench", "main")(argv)


TOOLS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "sim": (
        _tool("sim", "levelzero.sim.cli", "main"),
        "seeded simulation with fault injection (levelzero sim --help)",
    ),
    "export": (
        _tool("export", "levelzero.export.cli", "export_main"),
        "export the store to Parquet (levelzero export --help)",
    ),
    "analyze": (
        _tool("analyze", "levelzero.export.cli", "analyze_main"),
        "analyse exports with PySpark (levelzero analyze --help)",
    ),
    "bench": (_bench, "run the benchmark suite"),
}


async def _cluster(args: argparse.Namespace, client: Client) -> None:
    info = await client.cluster()
    if args.json:
        print(msgspec.json.format(msgspec.json.encode(info)).decode())
        return
    if not info.enabled:
        print(f"a single node (no [cluster]): it leads all {info.partitions_total} partitions")
        return
    rows = [("NODE", "URL", "STATE", "LEADS", "LEASE")]
    for n in info.nodes:
        state = ("draining" if n.draining else "live") if n.live else "expired"
        rows.append(
            (
                n.node_id + (" *" if n.node_id == info.node_id else ""),
                n.advertise_url,
                state,
                str(n.partitions_led),
                f"{n.lease_expires_in_s:+.1f}s",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    print(
        f"{info.partitions_total} partitions, {info.partitions_without_leader} without a live leader"
        " (* answered)"
    )
