"""The `levelzero` command: the daemon (`run`), the demo, and client commands for the HTTP API.

    levelzero run [--config FILE] [--data-dir DIR] [--listen HOST:PORT]
    levelzero demo [--duration S] [--nodes N]
    levelzero topics create NAME [--partitions N] | topics list
    levelzero produce TOPIC [-p P] [--in-flight N] [VALUE ...]   (no VALUE: one record per stdin line)
    levelzero consume TOPIC [-p P] [--offset O] [--follow] [--json]
    levelzero status | epoch advance | config show
    levelzero install-files DIR [--force]            (systemd unit, example TOML, env template)
    levelzero backup DEST | restore BACKUP [--config FILE] [--data-dir DIR]
    levelzero recover --from-bucket [--config FILE] [--data-dir DIR]
    levelzero gc run | dry-run | pause | resume | explain (--key K | --epoch N)
    levelzero compaction explain [TOPIC/P] [--json]
    levelzero partition abandon-unreconciled TOPIC/P --confirm --reason TEXT [--by NAME]
    levelzero sim ... | export ... | analyze ... | bench ...   (tools with flags of their own)

Client commands take `--url` (or $LEVELZERO_URL), `--token` (or $LEVELZERO_TOKEN) and `--timeout`,
before or after the command (after it wins). Errors are
one line on stderr and a non-zero exit: 1 for a failed operation, 2 for bad usage or
configuration (systemd does not restart on 2), 130 when interrupted, 141 (quietly) when the
reader of standard output went away.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from levelzero.cli.commands import EXIT_BROKEN_PIPE, TOOLS, leaf_errors
from levelzero.cli.parser import build_parser, settle_client_options


def main(argv: Sequence[str] | None = None) -> int:
    """Python ignores SIGPIPE, so a write to a pipe whose reader is gone raises BrokenPipeError:
    handled here as Python's documentation advises (its note on SIGPIPE), with no traceback.
    Standard output is flushed here rather than at exit, where the error could not be caught;
    once broken it points at /dev/null, so that the flush at exit has nothing to fail on."""
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()
    except (BrokenPipeError, BaseExceptionGroup) as error:
        if not all(isinstance(leaf, BrokenPipeError) for leaf in leaf_errors(error)):
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in TOOLS:
        return TOOLS[argv[0]][0](argv[1:])  # the tool owns every argument after its name
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse gives a `nargs="*"` positional its (empty) share as soon as it meets it, so in
    # `produce TOPIC -p 1 a b` the values come back unrecognised; they are values all the same.
    if extra and getattr(args, "values", None) == [] and not any(e.startswith("-") for e in extra):
        args.values = extra
    elif extra:  # with the usage of the command they were given to
        args.command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    settle_client_options(args)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
