"""The `levelzero` command: the daemon (`run`), the demo, and client commands for the HTTP API.

    levelzero run [--config FILE] [--data-dir DIR] [--listen HOST:PORT]
    levelzero demo [--duration S] [--nodes N]
    levelzero topics create NAME [--partitions N] | topics list
    levelzero produce TOPIC [-p P] [--in-flight N] [VALUE ...]   (no VALUE: one record per stdin line)
    levelzero consume TOPIC [-p P] [--offset O] [--follow] [--json]
    levelzero status | epoch advance | config show
    levelzero install-files DIR [--force]            (systemd unit, example TOML, env template)
    levelzero backup DEST | restore BACKUP [--config FILE] [--data-dir DIR]
    levelzero gc run | dry-run | pause | resume | explain (--key K | --epoch N)
    levelzero partition abandon-unreconciled TOPIC/P --confirm --reason TEXT [--by NAME]
    levelzero sim ... | export ... | analyze ... | bench ...   (tools with flags of their own)

Client commands take `--url` (or $LEVELZERO_URL) and `--token` (or $LEVELZERO_TOKEN). Errors are
one line on stderr and a non-zero exit: 1 for a failed operation, 2 for bad usage or
configuration (systemd does not restart on 2), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import base64
import getpass
import importlib
import importlib.util
import json
import logging
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from typing import Any

import anyio
import msgspec

from levelzero.core.errors import LevelZeroError, StoreRefused
from levelzero.core.names import topic_name_problem
from levelzero.core.reconcile_health import ABANDON_GIVES_UP

from levelzero.cli.client import ApiError, Client, default_url
from levelzero.daemon.buildinfo import version
from levelzero.config import ConfigError, describe, load_config, token_problem
from levelzero.daemon.logs import configure_logging

log = logging.getLogger("levelzero.cli")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

# One request waits out the batcher's linger (250 ms by default) whatever its size, so a request
# carries as much as the server takes by default (server.records_per_request_max = 10000) and
# stays under batcher.batch_bytes_max (4 MiB, one request's limit by the size rule of
# core/produce_size.py: 3 MiB of keys and values leave room for its 8 bytes a record).
PRODUCE_BATCH_RECORDS = 10_000
PRODUCE_BATCH_BYTES = 3 * 1024 * 1024
PRODUCE_IN_FLIGHT_DEFAULT = 1
PRODUCE_IN_FLIGHT_MAX = 64
PROGRESS_AFTER_RECORDS = 10_000
PROGRESS_INTERVAL_S = 1.0
FOLLOW_POLL_MIN_S = 0.1
DRY_RUN_KEYS_SHOWN_DEFAULT = 20
MiB = 1024 * 1024
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


# ------------------------------------------------------------------------------- daemon


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file (or $LEVELZERO_CONFIG)")
    parser.add_argument("--data-dir", metavar="DIR", help="overrides storage.data_dir")
    parser.add_argument("--listen", metavar="HOST:PORT", help="overrides server.listen")


def _load(args: argparse.Namespace):  # noqa: ANN202 - Config
    overrides: dict[tuple[str, str], Any] = {}
    if args.data_dir is not None:
        overrides[("storage", "data_dir")] = args.data_dir
    if args.listen is not None:
        overrides[("server", "listen")] = args.listen
    path = args.config or os.environ.get("LEVELZERO_CONFIG") or None
    return load_config(path, environ=os.environ, overrides=overrides)


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
    tune_gc()  # fewer, cheaper collections with many partitions (daemon/gc_tuning.py)
    try:
        # uvloop when installed (an optional dependency): +15-30% on actor-bound paths.
        uvloop = importlib.util.find_spec("uvloop") is not None
        clean = anyio.run(run_until_signalled, config, backend_options={"use_uvloop": uvloop})
    except BaseException as error:  # noqa: BLE001 - the process boundary: report, exit non-zero
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
        cluster = anyio.run(lambda: run_cluster_demo(
            nodes=args.nodes, duration_s=args.duration, producers=args.producers,
            keep=args.keep, out=sys.stdout,
        ))
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


def cmd_backup(args: argparse.Namespace) -> int:
    from levelzero.daemon.backup import BackupError, backup, restore

    try:
        config = _load(args)
    except ConfigError as exc:
        _fail(str(exc))
        return EXIT_USAGE
    data_dir = config.storage.data_dir
    try:
        if args.backup_command == "backup":
            summary = backup(data_dir, args.destination)
        else:
            summary = restore(args.backup, data_dir)
    except BackupError as exc:
        _fail(str(exc))
        return EXIT_FAILED
    m = summary.manifest
    facts = (f"cluster epoch {m['cluster_epoch']}, {m['partitions']} partitions, "
             f"schema {m['schema_version']}, taken {m['taken_at']} by levelzero {m['levelzero_version']}")
    if args.backup_command == "backup":
        print(f"backed up {data_dir} to {summary.directory}: {facts}")
        print("objects are not in a backup: they stay in the object store")
    else:
        print(f"restored {args.backup} into {data_dir}: {facts}")
        print("start the daemon; see the README (Backup and restore) for what an older backup means")
    return EXIT_OK


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


# ------------------------------------------------------------------------------- client


def url_problem(url: str) -> str | None:
    """A daemon URL must name its scheme: `127.0.0.1:8420` would be taken for a scheme."""
    if url.startswith(("http://", "https://")):
        return None
    return f"daemon URL {url!r} has no http:// or https:// scheme (e.g. http://{url.split('://')[-1]})"


def _client(args: argparse.Namespace) -> Client:
    return Client(args.url, token=args.token, timeout_s=args.timeout)


def _client_command(body: Callable[[argparse.Namespace, Client], Any]) -> Handler:
    """Run an async client command; ApiError -> one line and exit 1; Ctrl-C -> 130."""

    def handler(args: argparse.Namespace) -> int:
        problem = token_problem(args.token) if args.token else None
        if problem:
            _fail(f"--token (or $LEVELZERO_TOKEN): {problem}")
            return EXIT_USAGE
        problem = url_problem(args.url or default_url())
        if problem is not None:
            _fail(problem)
            return EXIT_USAGE

        async def main() -> int:
            async with _client(args) as client:
                return await body(args, client) or EXIT_OK

        try:
            return anyio.run(main)
        except (ApiError, CommandFailed) as exc:
            _fail(str(exc))
            return EXIT_FAILED
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED

    return handler


def plural(count: int, word: str) -> str:
    """`1 record`, `2 records`, `0 partitions`."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    every = [tuple(header), *(tuple(row) for row in rows)]
    widths = [max(len(row[i]) for row in every) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in every)


async def _topics_create(args: argparse.Namespace, client: Client) -> None:
    info = await client.create_topic(args.name, args.partitions)
    if args.json:
        _json_out(info)
    else:
        print(f"created topic {info.name} with {plural(info.partitions, 'partition')}")


async def _topics_list(args: argparse.Namespace, client: Client) -> None:
    topics = await client.list_topics()
    if args.json:
        print(msgspec.json.format(msgspec.json.encode({"topics": topics})).decode())
    elif not topics:
        print("no topics")
    else:
        print(table(("TOPIC", "PARTITIONS"), [(t.name, str(t.partitions)) for t in topics]))


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
        self.skipped = 0
        self.malformed: MalformedLine | None = None  # the line that stopped the input
        if lines is None:
            if args.values:
                lines = (value.encode() for value in args.values)
            else:
                lines = (line.rstrip(b"\r\n") if line.endswith(b"\n") else line for line in sys.stdin.buffer)
        self._lines = lines

    def __iter__(self) -> Iterator[tuple[bytes | None, bytes]]:
        for number, line in enumerate(self._lines, start=1):
            if self._separator is None:
                yield self._key, line
                continue
            if self._separator not in line:
                problem = MalformedLine(
                    f"input line {number}: no key separator {self._shown_separator!r} in {line[:80]!r}"
                )
                if not self._skip:
                    self.malformed = problem
                    return
                self.skipped += 1
                _fail(f"{problem} (skipped)")
                continue
            line_key, _, value = line.partition(self._separator)
            yield line_key, value


def _batches(
    records: Iterable[tuple[bytes | None, bytes]], max_records: int, max_bytes: int
) -> Iterable[list[tuple[bytes | None, bytes]]]:
    batch: list[tuple[bytes | None, bytes]] = []
    size = 0
    for record in records:
        record_size = len(record[1]) + len(record[0] or b"")
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
        self.first: int | None = None
        self.last: int | None = None
        self.overtaken = 0  # requests answered with offsets below an earlier-sent request's
        self._highest_base_by_sequence: list[tuple[int, int]] = []

    def add(self, sequence: int, batch: list[tuple[bytes | None, bytes]], base: int, last: int) -> None:
        self.records += len(batch)
        self.size += sum(len(v) + len(k or b"") for k, v in batch)
        self.requests += 1
        self.first = base if self.first is None else min(self.first, base)
        self.last = last if self.last is None else max(self.last, last)
        # A request sent later whose offsets are lower: the input order was not kept.
        self.overtaken += any(s < sequence and b > base for s, b in self._highest_base_by_sequence[-PRODUCE_IN_FLIGHT_MAX:])
        self._highest_base_by_sequence.append((sequence, base))


async def _produce(args: argparse.Namespace, client: Client) -> None:
    """Requests of `--batch-records` records; up to `--in-flight` of them at once. Reading the
    next batch from stdin happens in a worker thread while requests are on their way."""
    records = _Input(args)
    batches = iter(_batches(records, args.batch_records, PRODUCE_BATCH_BYTES))
    done = _Produced()
    progress = _Progress()
    slots = anyio.Semaphore(args.in_flight)

    async def send(sequence: int, batch: list[tuple[bytes | None, bytes]]) -> None:
        try:
            ack = await client.produce(args.topic, args.partition, batch)
        finally:
            slots.release()
        done.add(sequence, batch, ack.base_offset, ack.last_offset)
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
            + (f"; {plural(done.overtaken, 'request')} overtook an earlier one (--in-flight > 1)"
               if done.overtaken else "")
        )
    if records.malformed is not None:
        raise CommandFailed(f"{records.malformed}; stopped there (--skip-malformed skips such lines)")
    if done.records == 0 and not records.skipped:
        raise CommandFailed("nothing to produce (no values and empty stdin)")


def _produce_summary(args: argparse.Namespace, done: _Produced, records: _Input) -> dict[str, Any]:
    return {
        "topic": args.topic, "partition": args.partition, "records": done.records,
        "requests": done.requests, "first_offset": done.first, "last_offset": done.last,
        "skipped_lines": records.skipped, "overtaken_requests": done.overtaken,
    }


def record_json(offset: int, key: bytes | None, value: bytes) -> dict[str, Any]:
    """A record as JSON: keys and values that are UTF-8 text as strings, anything else as
    base64 under `key_b64` / `value_b64` (so no byte is lost and text stays readable)."""
    out: dict[str, Any] = {"offset": offset}
    for name, data in (("key", key), ("value", value)):
        if data is None:
            out[name] = None
            continue
        try:
            out[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            out[f"{name}_b64"] = base64.b64encode(data).decode("ascii")
    return out


def _print_record(fmt: str, offset: int, key: bytes | None, value: bytes) -> None:
    if fmt == "json":
        print(msgspec.json.encode(record_json(offset, key, value)).decode())
    elif fmt == "offsets":
        print(f"{offset}\t{value.decode('utf-8', 'backslashreplace')}")
    else:
        print(value.decode("utf-8", "backslashreplace"))


async def _consume_stream(
    args: argparse.Namespace, client: Client
) -> AsyncIterator[tuple[int, bytes | None, bytes]]:
    offset = args.offset
    delay_s = FOLLOW_POLL_MIN_S
    while True:
        result = await client.fetch(args.topic, args.partition, offset, args.max_bytes)
        for record in result.records:
            yield record.offset, record.key, record.value
        if result.records:
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


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, tuple):
        return f"[{value[0]},{value[1]}]"
    return str(value)


def _mib(size: int) -> str:
    return f"{size / MiB:.1f} MiB"


def _ago(at: float) -> str:
    return f"{max(0.0, time.time() - at):.1f} s ago"


def _component_lines(status) -> list[str]:  # noqa: ANN001 - StatusResponse
    lines = []
    r = status.reconciler
    if r is not None:
        lines.append(
            f"reconciler: {r.objects_written} L1 objects ({_mib(r.bytes_written)}), "
            f"{r.records_reconciled} records, lag {r.lag_offsets} offsets, "
            f"rejected catch-ups {r.catch_ups_rejected}, errors {r.errors}"
        )
        for f in r.failing:
            lines.append(
                f"  RECONCILE FAILING {f.partition} since {_ago(f.since)} ({f.failures} passes), "
                f"holding M back: {f.last_error}"
            )
        if r.l1_deletes_pending:
            lines.append(f"  L1 DELETES PENDING {r.l1_deletes_pending} (failed, retried with backoff)")
        for d in r.l1_deletes_pending_shown:
            lines.append(
                f"    {d.partition} {d.key}: failing since {_ago(d.since)} ({d.failures} tries), "
                f"next in {max(0.0, d.next_retry_at - time.time()):.0f} s: {d.last_error}"
            )
    h = status.housekeeper
    if h is not None:
        lines.append(
            f"housekeeper: epochs advanced {h.epochs_advanced}, catch-ups {h.catch_ups}, "
            f"start offsets set {h.start_offsets_set}, L1 deleted {h.l1_deleted}, errors {h.errors}"
        )
    g = status.gc
    if g is not None:
        m = "none yet" if g.m is None else f"{g.m} (epoch lag {g.epoch_lag})"
        line = (
            f"GC: {'PAUSED' if g.paused else 'running'}, M {m}, {g.rounds} rounds, "
            f"deleted {g.objects_deleted} objects ({_mib(g.bytes_deleted)}), backlog {g.backlog}"
        )
        last = g.last_round
        if last is not None:
            kind = "dry run" if last.dry_run else "round"
            outcome = (
                f"blocked by {', '.join(last.blocked_by[:3])}" if last.m is None
                else f"M {last.m}, deleted {last.deleted}, too young {last.too_young}, "
                f"errors {last.errors}"
            )
            line += f"; last {kind} #{last.round_id} {_ago(last.finished_at)}: {outcome}"
        lines.append(line)
    return lines


def format_status(status) -> str:  # noqa: ANN001 - StatusResponse
    m = "blocked" if status.m is None else str(status.m)
    if status.m is None and status.m_blocked_count:
        m += f" ({status.m_blocked_count} partitions without M(p), e.g. {', '.join(status.m_blocked_by[:3])})"
    elif status.m_holders:
        m += f" (held by {', '.join(status.m_holders[:3])})"
    b = status.batcher
    lines = [
        f"cluster epoch {status.cluster_epoch} (cached {_cell(status.cached_epoch)})   "
        f"M {m}   accepting {'yes' if status.accepting else 'no'}"
        + (f" ({status.not_accepting_reason})" if status.not_accepting_reason else ""),
        f"L0 objects {b.objects_uploaded} ({b.bytes_uploaded} bytes), orphans {b.orphan_objects}, "
        f"stale rejections {b.stale_rejections}, retries {b.stale_retries}, failures {b.stale_failures}",
        *_component_lines(status),
        *(f"UNSTORABLE TOPIC: {t.advice}" for t in status.unstorable_topics),
        *_outlier_lines(status),
        "",
    ]
    header = ("PARTITION", "TERM", "WINDOW", "APPLIED", "LOWER", "M(p)", "LRO", "HWM", "LAG", "L1",
              "START", "SLIDES", "STALE")
    rows = [header] + [
        (
            f"{p.topic}/{p.partition}",
            _cell(p.term),
            _cell(p.window),
            _cell(None if p.max_applied_epoch is None else (p.previous_applied_epoch, p.max_applied_epoch)),
            _cell(p.min_epoch_lower_bound),
            _cell(p.mp),
            _cell(p.lro),
            _cell(p.high_watermark),
            _cell(p.reconciler_lag),
            _cell(p.l1_objects),
            _cell(p.start_offset),
            _cell(p.window_slides),
            _cell(p.stale_rejections),
        )
        for p in status.partitions
    ]
    if len(rows) == 1:
        lines.append("no partitions")
    else:
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    total = getattr(status, "partitions_total", 0)
    if total > len(status.partitions):
        lines.append(f"... {len(status.partitions)} of {total} partitions shown (--all for every one)")
    return "\n".join(lines)


def _outlier_lines(status) -> list[str]:  # noqa: ANN001 - StatusResponse
    if not status.outliers_count:
        return []
    lines = [f"outliers: {status.outliers_count} partitions"
             + (f" ({len(status.outliers)} shown)" if len(status.outliers) < status.outliers_count else "")]
    lines += [
        f"  {o.partition}: {', '.join(o.reasons)} (M(p) {_cell(o.mp)}, lag {o.reconciler_lag}, "
        f"stale {o.stale_rejections})"
        for o in status.outliers
    ]
    return lines


async def _status(args: argparse.Namespace, client: Client) -> None:
    status = await client.status()
    if args.all:
        partitions = await client.all_partitions()
        status = msgspec.structs.replace(
            status, partitions=partitions, partitions_total=len(partitions), partitions_next_after=None
        )
    if args.json:
        print(msgspec.json.format(msgspec.json.encode(status)).decode())
    else:
        print(format_status(status))


async def _epoch_advance(args: argparse.Namespace, client: Client) -> None:
    epoch = await client.advance_epoch()
    print(msgspec.json.encode({"cluster_epoch": epoch}).decode() if args.json else f"cluster epoch is now {epoch}")


# ------------------------------------------------------------------------------- gc


def _json_out(value: msgspec.Struct) -> None:
    print(msgspec.json.format(msgspec.json.encode(value)).decode())


def format_round(report) -> str:  # noqa: ANN001 - RoundReport
    kind = "gc dry run" if report.dry_run else "gc round"
    head = f"{kind} #{report.round_id}: cluster epoch {report.cluster_epoch}"
    took = f"{report.finished_at - report.started_at:.3f} s"
    if report.m is None:
        blocked = ", ".join(report.blocked_by[:10])
        more = len(report.blocked_by) - 10
        blocked += f" and {more} more" if more > 0 else ""
        return f"{head}, M undefined: no deletes, partitions without an M(p) yet: {blocked} ({took})"
    lines = [f"{head}, M {report.m} (held by {', '.join(report.holders[:5]) or '-'})"]
    if report.dry_run:
        lines.append(
            f"  would delete {report.eligible} objects ({_mib(report.eligible_bytes)}) of "
            f"{report.listed} listed"
        )
    else:
        lines.append(
            f"  deleted {report.deleted} objects ({_mib(report.deleted_bytes)}) of {report.listed} "
            f"listed; backlog {report.backlog}"
            + ("" if report.max_deleted_epoch is None else f"; highest epoch deleted {report.max_deleted_epoch}")
        )
    lines.append(
        f"  kept: {report.too_young} too young (grace period), {report.above_m} prefixes stopped "
        f"above M, {report.malformed} malformed keys"
    )
    lines.append(
        f"  requests: {report.list_requests} list ({report.list_errors} failed), "
        f"{report.delete_requests} delete ({report.delete_errors} keys failed), "
        f"{report.throttled} throttled; {took}"
    )
    lines += [f"  error: {sample}" for sample in report.error_samples]
    return "\n".join(lines)


def format_explanation(explanation) -> str:  # noqa: ANN001 - Explanation
    e = explanation
    lines = []
    if e.key is not None:
        age = "" if e.age_s is None else f", {e.age_s:.1f} s old"
        owned = " (not this GC worker's prefix)" if e.owned is False else ""
        lines.append(f"key {e.key}")
        lines.append(f"  epoch {_cell(e.epoch)}{age}{owned}")
    elif e.epoch is not None:
        lines.append(f"L0 objects of epoch {e.epoch}")
    lines.append(f"verdict: {e.verdict or '-'}: {e.detail}")
    lines.append(f"cluster epoch {e.cluster_epoch}, M {'undefined' if e.m is None else e.m}")
    if e.blocked_by:
        lines.append(f"partitions without an M(p) (no deletes until they have one): {', '.join(e.blocked_by[:20])}")
    if not e.holders:
        return "\n".join(lines)
    if e.epoch is not None:
        title = f"held back by {e.holders_total} (M(p) below epoch {e.epoch}; BEHIND: how far it must rise):"
    else:
        title = f"M is held by {e.holders_total}:"
    lines.append(title)
    header = ("PARTITION", "M(p)", "M(p)-M", "BEHIND", "WHY")
    rows = [header] + [
        (h.partition, _cell(h.mp), _cell(h.mp_minus_m), _cell(h.behind), h.reason) for h in e.holders
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    if e.holders_total > len(e.holders):
        lines.append(f"  ... and {e.holders_total - len(e.holders)} more")
    return "\n".join(lines)


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


# ------------------------------------------------------------------------------- tools
# Commands implemented elsewhere, each with its own flags: `levelzero sim ARGS` calls the hook
# with ARGS untouched. Imported only when used (they pull in heavier dependencies), so a tool
# that is missing or broken in this installation is a one-line error, not a CLI that won't start.


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
    "sim": (_tool("sim", "levelzero.sim.cli", "main"),
            "seeded simulation with fault injection (levelzero sim --help)"),
    "export": (_tool("export", "levelzero.export.cli", "export_main"),
               "export the store to Parquet (levelzero export --help)"),
    "analyze": (_tool("analyze", "levelzero.export.cli", "analyze_main"),
                "analyse exports with PySpark (levelzero analyze --help)"),
    "bench": (_bench, "run the benchmark suite"),
}


# ------------------------------------------------------------------------------- parser


def _add_client_options(parser: argparse.ArgumentParser) -> None:
    if "--json" not in parser._option_string_actions:  # every client command takes --json
        parser.add_argument("--json", action="store_true", help="print the answer as JSON")
    parser.add_argument("--url", default=None, help=f"daemon URL (default $LEVELZERO_URL or {default_url()})")
    parser.add_argument("--token", default=os.environ.get("LEVELZERO_TOKEN") or None,
                        help="bearer token (default $LEVELZERO_TOKEN)")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="S", help="request timeout")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not >= 1")
    return value


def _topic_name(text: str) -> str:
    """The server's own name rule, checked before any request (bad usage: exit 2)."""
    problem = topic_name_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"topic name {text[:64]!r} {problem}")
    return text


def _in_flight(text: str) -> int:
    value = _positive(text)
    if value > PRODUCE_IN_FLIGHT_MAX:
        raise argparse.ArgumentTypeError(f"{text} is above {PRODUCE_IN_FLIGHT_MAX}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run the daemon (foreground; systemd Type=notify)")
    _add_config_options(p)
    p.set_defaults(handler=cmd_run)


def add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run an in-process daemon, drive producers, verify, summarise")
    p.add_argument("--duration", type=float, default=30.0, metavar="S", help="seconds of load (default 30)")
    p.add_argument("--producers", type=int, default=6, help="concurrent producers (default 6)")
    p.add_argument("--nodes", type=int, default=1,
                   help=f"1: one in-process daemon on embedded defaults (default); 2..{CLUSTER_DEMO_NODES_MAX}: "
                        "a local cluster of `levelzero run` processes over a throwaway PostgreSQL "
                        "(needs initdb and pg_ctl on PATH), with a crash and a rolling restart")
    p.add_argument("--data-dir", default=None, metavar="DIR", help="where to keep the data (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the temp data directory")
    p.set_defaults(handler=cmd_demo)


def add_config(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="configuration")
    config_sub = p.add_subparsers(dest="config_command", required=True, metavar="COMMAND")
    show = config_sub.add_parser("show", help="validate and print the effective configuration (secrets masked)")
    _add_config_options(show)
    show.set_defaults(handler=cmd_config_show)


def add_backup(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("backup", help="copy the log store consistently (also while the daemon runs)")
    p.add_argument("destination", metavar="DEST", help="a new (or empty) directory")
    _add_config_options(p)
    p.set_defaults(handler=cmd_backup, backup_command="backup")
    r = sub.add_parser("restore", help="put a backup in place as the log store (daemon stopped)")
    r.add_argument("backup", metavar="BACKUP", help="a directory written by levelzero backup")
    _add_config_options(r)
    r.set_defaults(handler=cmd_backup, backup_command="restore")


def add_install_files(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "install-files",
        help="write the systemd unit, the example configuration and the env-file template into DIR",
    )
    p.add_argument("directory", metavar="DIR")
    p.add_argument("--force", action="store_true", help="overwrite files that exist")
    p.set_defaults(handler=cmd_install_files)


def add_topics(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("topics", help="create and list topics")
    topics_sub = p.add_subparsers(dest="topics_command", required=True, metavar="COMMAND")
    create = topics_sub.add_parser("create", help="create a topic")
    create.add_argument("name", type=_topic_name)
    create.add_argument("--partitions", type=int, default=1)
    _add_client_options(create)
    create.set_defaults(handler=_client_command(_topics_create))
    listing = topics_sub.add_parser("list", help="list topics and their partition counts")
    _add_client_options(listing)
    listing.set_defaults(handler=_client_command(_topics_list))


def add_produce(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("produce", help="produce records: the VALUE arguments, or one per stdin line")
    p.add_argument("topic")
    p.add_argument("values", nargs="*", metavar="VALUE")
    p.add_argument("-p", "--partition", type=_non_negative, default=0)
    p.add_argument("--key", default=None, help="key of every record")
    p.add_argument("--key-separator", default=None, metavar="SEP", help="split each line into KEY SEP VALUE")
    p.add_argument("--batch-records", type=_positive, default=PRODUCE_BATCH_RECORDS,
                   help=f"records per request (default {PRODUCE_BATCH_RECORDS}; at most the server's "
                   "server.records_per_request_max)")
    p.add_argument("--in-flight", type=_in_flight, default=PRODUCE_IN_FLIGHT_DEFAULT, metavar="N",
                   help=f"requests on their way at once (default {PRODUCE_IN_FLIGHT_DEFAULT}). Above 1 a "
                   "request may overtake an earlier one (e.g. one retried after a stale epoch), so "
                   "offsets need not follow the input order between requests; the summary says so")
    p.add_argument("--skip-malformed", action="store_true",
                   help="skip (and report) input lines without the key separator instead of stopping")
    _add_client_options(p)
    p.set_defaults(handler=_client_command(_produce))


def add_consume(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("consume", help="print records from an offset (--follow: keep polling)")
    p.add_argument("topic")
    p.add_argument("-p", "--partition", type=_non_negative, default=0)
    p.add_argument("--offset", type=_non_negative, default=None, help="first offset (default: the start)")
    p.add_argument("--max-records", type=_non_negative, default=None)
    p.add_argument("--max-bytes", type=int, default=None, help="bytes per fetch")
    p.add_argument("--follow", action="store_true", help="wait for new records (Ctrl-C ends)")
    p.add_argument("--poll-max-s", type=float, default=1.0, help="longest pause between polls")
    p.add_argument("--format", choices=("text", "offsets", "json"), default="text")
    _add_client_options(p)
    p.set_defaults(handler=_client_command(_consume))


def add_cluster(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cluster", help="the cluster's nodes, their health and how many partitions each leads")
    p.add_argument("--json", action="store_true")
    _add_client_options(p)
    p.set_defaults(handler=_client_command(_cluster))


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
        rows.append((n.node_id + (" *" if n.node_id == info.node_id else ""), n.advertise_url, state,
                     str(n.partitions_led), f"{n.lease_expires_in_s:+.1f}s"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    print(f"{info.partitions_total} partitions, {info.partitions_without_leader} without a live leader"
          " (* answered)")


def add_status(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="cluster epoch, M, outlier partitions, per-partition fence and state")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--all", action="store_true",
        help="every partition, paged from the daemon (default: the first page and the outliers)",
    )
    _add_client_options(p)
    p.set_defaults(handler=_client_command(_status))


def add_epoch(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("epoch", help="cluster epoch")
    epoch_sub = p.add_subparsers(dest="epoch_command", required=True, metavar="COMMAND")
    advance = epoch_sub.add_parser("advance", help="advance the cluster epoch now")
    _add_client_options(advance)
    advance.set_defaults(handler=_client_command(_epoch_advance))


def add_gc(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gc", help="L0 garbage collector: run, dry-run, pause, resume, explain")
    gc_sub = p.add_subparsers(dest="gc_command", required=True, metavar="COMMAND")
    for name, dry_run, text in (
        ("run", False, "run one GC round now (also while paused)"),
        ("dry-run", True, "list what a round would delete; delete nothing"),
    ):
        run = gc_sub.add_parser(name, help=text)
        run.set_defaults(dry_run=dry_run, handler=_client_command(_gc_run))
        if dry_run:
            run.add_argument("--show", type=_non_negative, default=DRY_RUN_KEYS_SHOWN_DEFAULT,
                             metavar="N", help=f"keys to print (default {DRY_RUN_KEYS_SHOWN_DEFAULT})")
            run.add_argument("--all", dest="show", action="store_const", const=None,
                             help="print every key the server returned")
        else:
            run.set_defaults(show=0)
        run.add_argument("--json", action="store_true", help="print the round report as JSON")
        _add_client_options(run)
    for name, body, text in (
        ("pause", _gc_pause, "stop the GC's own rounds (one in progress finishes)"),
        ("resume", _gc_resume, "restart the GC's rounds, the first one now"),
    ):
        q = gc_sub.add_parser(name, help=text)
        q.add_argument("--json", action="store_true", help="print the GC status as JSON")
        _add_client_options(q)
        q.set_defaults(handler=_client_command(body))
    explain = gc_sub.add_parser(
        "explain", help="why an L0 object (or an epoch) is or is not deleted; what holds M back"
    )
    which = explain.add_mutually_exclusive_group(required=True)
    which.add_argument("--key", help="an L0 object key (level_zero/data/PPP/EPOCH/UUID)")
    which.add_argument("--epoch", type=_positive, help="an epoch: what keeps its objects")
    explain.add_argument("--json", action="store_true")
    _add_client_options(explain)
    explain.set_defaults(handler=_client_command(_gc_explain))


def add_partition(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("partition", help="operator actions on one partition")
    partition_sub = p.add_subparsers(dest="partition_command", required=True, metavar="COMMAND")
    abandon = partition_sub.add_parser(
        "abandon-unreconciled",
        help="give up a failing partition's unreconciled records (its L0 data is gone for good)",
        description=f"Only for a partition whose reconciliation keeps failing (see status). It {ABANDON_GIVES_UP}.",
    )
    abandon.add_argument("partition", type=_topic_partition, metavar="TOPIC/P")
    abandon.add_argument("--confirm", action="store_true", help="yes, give those records up")
    abandon.add_argument("--reason", required=True, help="why (recorded in the log: the incident)")
    abandon.add_argument("--by", default=_default_operator(),
                         help="who asks (recorded in the log; default USER@HOST)")
    abandon.add_argument("--json", action="store_true")
    _add_client_options(abandon)
    abandon.set_defaults(handler=_partition_abandon)


def add_tools(sub: argparse._SubParsersAction) -> None:
    """Listed in the help; `main` hands their arguments over before argparse sees them."""
    for name, (hook, text) in TOOLS.items():
        p = sub.add_parser(name, help=text, add_help=False)
        p.add_argument("tool_args", nargs=argparse.REMAINDER)
        p.set_defaults(handler=lambda args, hook=hook: hook(args.tool_args))


# The commands, in help order: a function `add_<name>(subparsers)` adds a parser and sets
# `handler` (a `(args) -> exit code` function). A tool with flags of its own goes in `TOOLS`.
COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    add_run,
    add_demo,
    add_topics,
    add_produce,
    add_consume,
    add_status,
    add_cluster,
    add_epoch,
    add_gc,
    add_partition,
    add_config,
    add_backup,
    add_install_files,
    add_tools,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="levelzero",
        description="Partitioned record logs on object storage with windowed epoch fencing.",
    )
    parser.add_argument("--version", action="version", version=f"levelzero {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in TOOLS:
        return TOOLS[argv[0]][0](argv[1:])  # the tool owns every argument after its name
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse gives a `nargs="*"` positional its (empty) share as soon as it meets it, so in
    # `produce TOPIC -p 1 a b` the values come back unrecognised; they are values all the same.
    if extra and getattr(args, "values", None) == [] and not any(e.startswith("-") for e in extra):
        args.values = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
