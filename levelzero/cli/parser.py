"""The `levelzero` command line: every command's arguments, each naming its handler in `commands.py`."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable

from levelzero.core.names import topic_name_problem
from levelzero.core.reconcile_health import ABANDON_GIVES_UP
from levelzero.client import DEFAULT_TIMEOUT_S, DEFAULT_URL
from levelzero.daemon.buildinfo import version
from levelzero.config import RECORDS_PER_REQUEST_LIMIT
from levelzero.http.schema import UNSIGNED_MAX
from levelzero.cli.commands import (
    CLUSTER_DEMO_NODES_MAX,
    DRY_RUN_KEYS_SHOWN_DEFAULT,
    PRODUCE_BATCH_RECORDS,
    PRODUCE_IN_FLIGHT_DEFAULT,
    PRODUCE_IN_FLIGHT_MAX,
    TOOLS,
    _client_command,
    _cluster,
    _compaction_explain,
    _consume,
    _default_operator,
    _epoch_advance,
    _gc_explain,
    _gc_pause,
    _gc_resume,
    _gc_run,
    _partition_abandon,
    _produce,
    _status,
    _topic_partition,
    _topics_config,
    _topics_create,
    _topics_delete,
    _topics_list,
    cmd_backup,
    cmd_config_show,
    cmd_demo,
    cmd_install_files,
    cmd_recover,
    cmd_run,
)


def _config_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name.strip(), value


def _add_config_options(parser: argparse.ArgumentParser, *, listen: bool = False) -> None:
    """--config and --data-dir; --listen only for `run` and `config show` (which prints what
    `run` would use): the commands that never listen refuse it as bad usage."""
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file (or $LEVELZERO_CONFIG)")
    parser.add_argument("--data-dir", metavar="DIR", help="overrides storage.data_dir")
    if listen:
        parser.add_argument("--listen", metavar="HOST:PORT", help="overrides server.listen")


CLIENT_OPTIONS = ("url", "token", "timeout")  # accepted before the command too (build_parser)


def _add_client_options(parser: argparse.ArgumentParser, *, top_level: bool = False) -> None:
    """--url, --token and --timeout (and --json, after the command only). Every one's default is
    SUPPRESS, here and at the top level: a subcommand's parser writes each default it has over
    what the top level parsed (`levelzero --url U cluster` would lose U), so the defaults are
    filled in after parsing, by `settle_client_options`."""
    where = " (also accepted after a client command, where it wins)" if top_level else ""
    if not top_level:
        parser.set_defaults(client_command=True)
        if "--json" not in parser._option_string_actions:  # every client command takes --json
            parser.add_argument("--json", action="store_true", help="print the answer as JSON")
    parser.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help=f"daemon URL (default $LEVELZERO_URL, else {DEFAULT_URL}){where}",
    )
    parser.add_argument(
        "--token", default=argparse.SUPPRESS, help=f"bearer token (default $LEVELZERO_TOKEN){where}"
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=argparse.SUPPRESS,
        metavar="S",
        help=f"request timeout, retries included (default {DEFAULT_TIMEOUT_S:g}){where}",
    )


def settle_client_options(args: argparse.Namespace) -> None:
    """The client options' defaults, for a client command (the value given after the command
    has already replaced one given before it); before a command that takes none they are a
    usage error rather than silently ignored."""
    if getattr(args, "client_command", False):
        args.url = getattr(args, "url", None)
        if not hasattr(args, "token"):
            args.token = os.environ.get("LEVELZERO_TOKEN") or None
        args.timeout = getattr(args, "timeout", DEFAULT_TIMEOUT_S)
        return
    given = [f"--{name}" for name in CLIENT_OPTIONS if hasattr(args, name)]
    if given:
        args.command_parser.error(f"{given[0]} is an option of the commands that talk to a daemon only")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not >= 1")
    if value > UNSIGNED_MAX:
        raise argparse.ArgumentTypeError(f"{text} is above {UNSIGNED_MAX}")
    return value


def _topic_name(text: str) -> str:
    """The server's own name rule, checked before any request (bad usage: exit 2)."""
    problem = topic_name_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"topic name {text[:64]!r} {problem}")
    return text


def _positive_at_most(limit: int, why: str = "") -> Callable[[str], int]:
    """`_positive`, and at most `limit` (`why`: what the bound is, after the number)."""

    def parse(text: str) -> int:
        value = _positive(text)
        if value > limit:
            raise argparse.ArgumentTypeError(f"{text} is above {limit:,}{why}")
        return value

    return parse


_in_flight = _positive_at_most(PRODUCE_IN_FLIGHT_MAX)
# No server takes more records a request (server.records_per_request_max is at most it).
_batch_records = _positive_at_most(RECORDS_PER_REQUEST_LIMIT, ", the most any server takes")


def _partition_name(text: str) -> str:
    """`TOPIC/P`, checked (a usage error otherwise) and written as status writes it."""
    topic, partition = _topic_partition(text)
    return f"{topic}/{partition}"


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    if value > UNSIGNED_MAX:  # the HTTP API's bound on offsets and partitions
        raise argparse.ArgumentTypeError(f"{text} is above {UNSIGNED_MAX}")
    return value


def _seconds(text: str) -> float:
    """A positive, finite number of seconds (0 would mean no wait at all: a timeout that
    always fires, a poll loop that never pauses)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


def _separator(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("the key separator must not be empty")
    return text


def add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run the daemon (foreground; systemd Type=notify)")
    _add_config_options(p, listen=True)
    p.set_defaults(handler=cmd_run)


def add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run an in-process daemon, drive producers, verify, summarise")
    p.add_argument("--duration", type=float, default=30.0, metavar="S", help="seconds of load (default 30)")
    p.add_argument("--producers", type=int, default=6, help="concurrent producers (default 6)")
    p.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="1: one in-process daemon on embedded defaults (default); "
        f"2..{CLUSTER_DEMO_NODES_MAX}: "
        "a local cluster of `levelzero run` processes over a throwaway PostgreSQL "
        "(needs initdb and pg_ctl on PATH), with a crash and a rolling restart",
    )
    p.add_argument(
        "--data-dir", default=None, metavar="DIR", help="where to keep the data (default: a temp dir)"
    )
    p.add_argument("--keep", action="store_true", help="keep the temp data directory")
    p.set_defaults(handler=cmd_demo)


def add_config(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="configuration")
    config_sub = p.add_subparsers(dest="config_command", required=True, metavar="COMMAND")
    show = config_sub.add_parser(
        "show", help="validate and print the effective configuration (secrets masked)"
    )
    _add_config_options(show, listen=True)
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
    c = sub.add_parser(
        "recover",
        help="bring the control plane up to what the bucket holds (daemons stopped): rebuild a lost "
        "one, or adopt L1 objects a restored one does not know",
    )
    c.add_argument("--from-bucket", action="store_true", help="read the L1 objects in the bucket")
    _add_config_options(c)
    c.set_defaults(handler=cmd_recover)


def add_install_files(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "install-files",
        help="write the systemd unit, the example configuration and the env-file template into DIR",
    )
    p.add_argument("directory", metavar="DIR", help="where to write them")
    p.add_argument("--force", action="store_true", help="overwrite files that exist")
    p.set_defaults(handler=cmd_install_files)


def add_topics(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("topics", help="create, list and delete topics")
    topics_sub = p.add_subparsers(dest="topics_command", required=True, metavar="COMMAND")
    create = topics_sub.add_parser("create", help="create a topic")
    create.add_argument("name", type=_topic_name, help="the topic to create")
    create.add_argument("--partitions", type=_positive, default=1, help="how many partitions (default 1)")
    create.add_argument(
        "--config",
        type=_config_pair,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a Kafka topic config (repeatable), e.g. retention.ms=86400000",
    )
    _add_client_options(create)
    create.set_defaults(handler=_client_command(_topics_create))
    config = topics_sub.add_parser(
        "config",
        help="show a topic's configs; NAME=VALUE sets, --delete NAME deletes (back to the default)",
    )
    config.add_argument("topic", type=_topic_name, help="the topic")
    config.add_argument(
        "set", nargs="*", type=_config_pair, metavar="NAME=VALUE", help="configs to set (none: show them)"
    )
    config.add_argument(
        "--delete", action="append", default=[], metavar="NAME", help="a config to reset (repeatable)"
    )
    config.add_argument("--replace", action="store_true", help="NAME=VALUE are the whole set")
    config.add_argument("--all", action="store_true", help="every config, not only those set on the topic")
    _add_client_options(config)
    config.set_defaults(handler=_client_command(_topics_config))
    listing = topics_sub.add_parser("list", help="list topics and their partition counts")
    _add_client_options(listing)
    listing.set_defaults(handler=_client_command(_topics_list))
    delete = topics_sub.add_parser("delete", help="delete a topic and every record in it")
    delete.add_argument("name", help="the topic")
    delete.add_argument("--confirm", action="store_true", help="yes, delete its records for good")
    _add_client_options(delete)
    delete.set_defaults(handler=_topics_delete)


def add_produce(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("produce", help="produce records: the VALUE arguments, or one per stdin line")
    p.add_argument("topic", help="the topic to write to")
    p.add_argument("values", nargs="*", metavar="VALUE", help="record values (none: one per stdin line)")
    p.add_argument("-p", "--partition", type=_non_negative, default=0, help="partition (default 0)")
    p.add_argument("--key", default=None, help="key of every record")
    p.add_argument(
        "--key-separator",
        default=None,
        metavar="SEP",
        type=_separator,
        help="split each line (or VALUE) into KEY SEP VALUE",
    )
    p.add_argument(
        "--batch-records",
        type=_batch_records,
        default=PRODUCE_BATCH_RECORDS,
        help=f"records per request (default {PRODUCE_BATCH_RECORDS}; at most the server's "
        "server.records_per_request_max)",
    )
    p.add_argument(
        "--in-flight",
        type=_in_flight,
        default=PRODUCE_IN_FLIGHT_DEFAULT,
        metavar="N",
        help=f"requests on their way at once (default {PRODUCE_IN_FLIGHT_DEFAULT}). Above 1 a "
        "request may overtake an earlier one (e.g. one retried after a stale epoch), so "
        "offsets need not follow the input order between requests; the summary says so",
    )
    p.add_argument(
        "--skip-malformed",
        action="store_true",
        help="skip (and report) input lines without the key separator instead of stopping",
    )
    p.add_argument(
        "-Z",
        "--empty-as-null",
        action="store_true",
        help="send an empty value as a null value (a tombstone), as kcat -Z does",
    )
    p.add_argument(
        "--no-idempotency-key",
        dest="idempotency_keys",
        action="store_false",
        help="send requests without an idempotency key: a request the daemon dropped (it "
        "crashed or restarted with it in hand) then stops the run, as it may have been stored; "
        "by default each request has a key of its own and is sent again until --timeout",
    )
    _add_client_options(p)
    p.set_defaults(handler=_client_command(_produce, wait_for_restart=True))


def add_consume(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("consume", help="print records from an offset (--follow: keep polling)")
    p.add_argument("topic", help="the topic to read")
    p.add_argument("-p", "--partition", type=_non_negative, default=0, help="partition (default 0)")
    p.add_argument("--offset", type=_non_negative, default=None, help="first offset (default: the start)")
    p.add_argument("--max-records", type=_positive, default=None, help="stop after N records")
    p.add_argument("--max-bytes", type=_positive, default=None, help="bytes per fetch")
    p.add_argument("--follow", action="store_true", help="wait for new records (Ctrl-C ends)")
    p.add_argument("--poll-max-s", type=_seconds, default=1.0, help="longest pause between polls")
    p.add_argument(
        "--format",
        choices=("text", "offsets", "json"),
        default="text",
        help='json shows a null value as null and an empty one as "" (text and offsets print both empty)',
    )
    _add_client_options(p)
    p.set_defaults(handler=_client_command(_consume))


def add_cluster(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cluster", help="the cluster's nodes, their health and how many partitions each leads")
    _add_client_options(p)
    p.set_defaults(handler=_client_command(_cluster))


def add_status(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="cluster epoch, M, outlier partitions, per-partition fence and state")
    p.add_argument(
        "--all",
        action="store_true",
        help="every partition, paged from the daemon (default: the first page and the outliers)",
    )
    p.add_argument("--topic", type=_topic_name, default=None, help="this topic's partitions only")
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
            run.add_argument(
                "--show",
                type=_non_negative,
                default=DRY_RUN_KEYS_SHOWN_DEFAULT,
                metavar="N",
                help=f"keys to print (default {DRY_RUN_KEYS_SHOWN_DEFAULT})",
            )
            run.add_argument(
                "--all",
                dest="show",
                action="store_const",
                const=None,
                help="print every key the server returned",
            )
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
    _add_client_options(explain)
    explain.set_defaults(handler=_client_command(_gc_explain))


def add_compaction(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compaction", help="compacted topics: what the compactor did and why not")
    compaction_sub = p.add_subparsers(dest="compaction_command", required=True, metavar="COMMAND")
    explain = compaction_sub.add_parser(
        "explain",
        help="per compacted partition led here: dirty ratio, last compaction, bytes reclaimed,"
        " the cleaner-offset map, why it was not compacted",
    )
    explain.add_argument(
        "partition", nargs="?", type=_partition_name, metavar="TOPIC/P", help="this partition only"
    )
    _add_client_options(explain)
    explain.set_defaults(handler=_client_command(_compaction_explain))


def add_partition(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("partition", help="operator actions on one partition")
    partition_sub = p.add_subparsers(dest="partition_command", required=True, metavar="COMMAND")
    abandon = partition_sub.add_parser(
        "abandon-unreconciled",
        help="give up a failing partition's unreconciled records (its L0 data is gone for good)",
        description="Only for a partition whose reconciliation keeps failing (see status). "
        f"It {ABANDON_GIVES_UP}.",
    )
    abandon.add_argument("partition", type=_topic_partition, metavar="TOPIC/P", help="the partition")
    abandon.add_argument("--confirm", action="store_true", help="yes, give those records up")
    abandon.add_argument("--reason", required=True, help="why (recorded in the log: the incident)")
    abandon.add_argument(
        "--by", default=_default_operator(), help="who asks (recorded in the log; default USER@HOST)"
    )
    _add_client_options(abandon)
    abandon.set_defaults(handler=_partition_abandon)


def add_tools(sub: argparse._SubParsersAction) -> None:
    """Listed in the help; `main` hands their arguments over before argparse sees them."""
    for name, (hook, text) in TOOLS.items():
        p = sub.add_parser(name, help=text, add_help=False)
        p.add_argument(
            "tool_args", nargs=argparse.REMAINDER, help=f"its own arguments (levelzero {name} --help)"
        )
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
    add_compaction,
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
    _add_client_options(parser, top_level=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    _name_parsers(parser)
    return parser


def _name_parsers(parser: argparse.ArgumentParser) -> None:
    """Each (sub)command's parser as `args.command_parser`, the innermost one chosen winning:
    `main` reports a stray argument with that command's usage, not the top level's."""
    parser.set_defaults(command_parser=parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _name_parsers(child)
