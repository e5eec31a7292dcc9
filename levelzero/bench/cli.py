"""`levelzero bench`: every benchmark item, one table; `--out FILE` keeps the results as JSON.

    levelzero bench                        # every item, full length (about 7 minutes)
    levelzero bench --quick                # a few seconds per item: a smoke test
    levelzero bench --only fence --only gc # some items (repeat --only, or give a comma list)
    levelzero bench --markdown BENCHMARKS.md   # also rewrite the figures section of that file
    levelzero bench --out ~/lz-bench/results.json   # write the results (JSON) there

The results file belongs outside the source tree (`make bench` writes it under
$HOME/.cache/levelzero/bench unless BENCH_OUT says otherwise). Wider sweeps of three items run
on their own: `python -m levelzero.bench.sweep_actors`, `... .sweep_gc`, `... .sweep_log_store`.

Needs the `bench` extra (`pip install 'levelzero[bench]'`): the S3 items run against moto.

Every figure is a ratio of two measurements taken in the same run — the system under test and
its floor, in interleaved rounds (ABBA), medians — so the noise of a shared machine cancels.
Each item runs in its own event loop; the memory item runs in a child process (clean RSS).
Exit status: 0 when every item ran (a missed target is a finding, not a failure), 1 when an
item crashed, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import os
import shlex
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from .common import Figure, Settings, machine
from .loop import LOOP_CHOICES, resolve_loop, run_async

DEFAULT_RESULTS = os.path.join("~", "lz-bench", "results.json")  # an example for --help
MARK_BEGIN = "<!-- levelzero bench: generated figures begin -->"
MARK_END = "<!-- levelzero bench: generated figures end -->"


@dataclass(frozen=True, slots=True)
class Item:
    name: str
    module: str  # levelzero.bench.<module>, with `async def run(settings) -> list[Figure]`
    title: str


# In table order (cheap and local first, moto last but one, the long memory run last).
ITEMS: tuple[Item, ...] = (
    Item("churn", "churn", "1. spurious rejections under epoch churn, windowed vs strict"),
    Item("stall", "stall", "2. write stall after a leadership move to a stale cache (simulation)"),
    Item("fence", "fence", "3. fence throughput vs a bare actor round trip"),
    Item("durable", "durable", "4. durable produce vs raw aiosqlite group commit"),
    Item("upload", "upload", "5. L0 upload vs raw aiobotocore PUTs (moto)"),
    Item("gc", "gc", "6. GC deletes vs raw DeleteObjects (moto); GC lag"),
    Item("memory", "memory", "7. daemon RSS over a long produce/consume/GC run"),
    Item("scale", "scale", "8. fence and produce cost at 1, 64, 1024 partitions"),
    Item("kafka", "kafka", "9. produce and fetch: Kafka listener (confluent-kafka) vs HTTP API"),
    Item(
        "control", "control", "10. PostgreSQL control plane: durable produce vs raw asyncpg; commit latency"
    ),
    Item(
        "analysis",
        "analysis",
        "11. levelzero analyze vs a hand-written job of the same tables; the data source vs Parquet",
    ),
    Item(
        "cluster",
        "cluster",
        "12. failover of a three-node cluster after SIGKILL of a leader, vs the lease TTL",
    ),
    Item("cost", "cost", "13. object-store requests and dollars per GiB ingested vs the batch window floor"),
    Item(
        "latency", "latency", "14. produce latency with S3-like object-store latency vs window + PUT + commit"
    ),
    Item(
        "cli",
        "cli_produce",
        "15. levelzero produce from stdin at its defaults vs the 30,000 records/s target",
    ),
    Item("compaction", "compaction", "16. compaction vs raw read + write of the same L1 bytes"),
    Item("lookup", "lookup", "17. ListOffsets by time vs one object GET (S3 Express-like latency)"),
    Item("txn", "txn", "18. Kafka transactions of 100 records vs idempotent produce"),
)
ITEM_NAMES = tuple(item.name for item in ITEMS)


def _items(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ITEM_NAMES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown item {', '.join(unknown)} (choose from {', '.join(ITEM_NAMES)})"
        )
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a few seconds per item (smoke test)")
    parser.add_argument(
        "--only",
        type=_items,
        action="append",
        metavar="ITEM",
        help=f"run only these items (repeatable, or comma-separated): {', '.join(ITEM_NAMES)}",
    )
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds per figure")
    parser.add_argument("--seconds", type=float, default=None, help="per timed measurement")
    parser.add_argument(
        "--out",
        "--results",
        dest="results",
        default=None,
        metavar="FILE",
        help=f"write the results as JSON to FILE (e.g. {DEFAULT_RESULTS}); default: not written",
    )
    parser.add_argument(
        "--markdown",
        default=None,
        metavar="PATH",
        help="rewrite the generated figures section of this Markdown file (e.g. BENCHMARKS.md)",
    )
    parser.add_argument(
        "--loop",
        choices=LOOP_CHOICES,
        default="auto",
        help="event loop (auto: uvloop when installed, else asyncio)",
    )
    parser.add_argument("--dir", default=None, help="directory for stores (default: a temp dir)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="levelzero bench",
        description="Benchmarks of levelzero, each a ratio to its floor measured in the same run.",
    )
    add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if (args.rounds is not None and args.rounds < 1) or (args.seconds is not None and args.seconds <= 0):
        print("--rounds must be >= 1 and --seconds > 0", file=sys.stderr)
        return 2
    selected = [n for group in args.only for n in group] if args.only else list(ITEM_NAMES)
    settings = Settings(quick=args.quick, work_dir=args.dir)
    if args.rounds is not None:
        settings = replace(settings, rounds=args.rounds)
    if args.seconds is not None:
        settings = replace(settings, seconds=args.seconds)
    loop = resolve_loop(args.loop)
    described = machine()
    command = " ".join(["levelzero bench", *(shlex.quote(a) for a in _argv_of(args))])
    print(
        f"levelzero bench{' --quick' if settings.quick else ''}: {len(selected)} items, "
        f"loop {loop}; {described['nproc']} CPUs ({described['cpu_model']}), "
        f"{described['memory_gib']} GiB, Python {described['python']}",
        file=out,
        flush=True,
    )
    started = time.time()
    figures: list[Figure] = []
    items: dict[str, dict[str, Any]] = {}
    failed = False
    for item in ITEMS:
        if item.name not in selected:
            continue
        print(f"\n== {item.title}", file=out, flush=True)
        item_started = time.perf_counter()
        try:
            module = importlib.import_module(f"levelzero.bench.{item.module}")
            runner: Callable[[Settings], Any] = module.run
            produced: list[Figure] = run_async(runner, settings, loop=loop)
        except Exception:  # noqa: BLE001 - one item's crash must not hide the others' figures
            failed = True
            text = traceback.format_exc()
            print(text, file=out, flush=True)
            items[item.name] = {"title": item.title, "error": text.strip().splitlines()[-1]}
            continue
        elapsed = time.perf_counter() - item_started
        for f in produced:
            print(format_row(f), file=out, flush=True)
        figures.extend(produced)
        items[item.name] = {
            "title": item.title,
            "seconds": round(elapsed, 2),
            "figures": [f.to_json() for f in produced],
        }
    results = {
        "command": command,
        "quick": settings.quick,
        "loop": loop,
        "started_at": datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(time.time() - started, 1),
        "machine": described,
        "items": items,
    }
    print("\n" + format_table(figures), file=out)
    if args.results:
        write_results(Path(args.results), results)
        print(f"\nwrote {args.results}", file=out)
    if args.markdown:
        update_markdown(Path(args.markdown), results)
        print(f"updated {args.markdown}", file=out)
    return 1 if failed else 0


def _argv_of(args: argparse.Namespace) -> list[str]:
    """The options that shaped this run, for the record (re-run it with the same command)."""
    argv: list[str] = []
    if args.quick:
        argv.append("--quick")
    for group in args.only or []:
        argv += ["--only", ",".join(group)]
    for name in ("rounds", "seconds"):
        value = getattr(args, name)
        if value is not None:
            argv += [f"--{name}", str(value)]
    if args.loop != "auto":
        argv += ["--loop", args.loop]
    return argv


# ------------------------------------------------------------------------------------ output


def _number(value: float) -> str:
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 0.1:
        return f"{value:.3f}"
    return f"{value:.4f}" if value else "0"


def _ratio(f: Figure) -> str:
    return "n/a" if f.ratio is None else f"{f.ratio:.1%}"


COLUMNS = ("item", "figure", "unit", "sut", "floor", "ratio", "rounds", "target", "verdict")


def _cells(f: Figure) -> tuple[str, ...]:
    return (
        f.item,
        f.name,
        f.unit,
        f"{f.sut_label} {_number(f.sut)}",
        f"{f.floor_label} {_number(f.floor)}",
        _ratio(f),
        f.spread,
        "-" if f.target is None else str(f.target),
        f.verdict,
    )


def format_row(f: Figure) -> str:
    item, name, unit, sut, floor, ratio, spread, target, verdict = _cells(f)
    return (
        f"  {name} [{unit}]: {sut} | {floor} | ratio {ratio} (rounds {spread}) | target {target} | {verdict}"
    )


def format_table(figures: Sequence[Figure]) -> str:
    rows = [COLUMNS, *(_cells(f) for f in figures)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = []
    for index, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_results(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _rows(results: dict[str, Any]) -> dict[str, list[str]]:
    """The table rows of a run, by item."""
    rows: dict[str, list[str]] = {}
    for name, item in results["items"].items():
        if "error" in item:
            rows[name] = [f"| {name} | **crashed**: {item['error']} | | | | | | |"]
            continue
        rows[name] = []
        for f in item["figures"]:
            target = f["target"]
            shown = "-"
            if target is not None:
                shown = f"{'≥' if target['higher_is_better'] else '≤'} {target['bound']:.0%}"
            ratio = "n/a" if f["ratio"] is None else f"{f['ratio']:.1%}"
            rows[name].append(
                f"| {name} | {f['name']} | {f['unit']} | {f['sut_label']} {_number(f['sut'])} | "
                f"{f['floor_label']} {_number(f['floor'])} | {ratio} | {f.get('spread', '-')} | {shown} | "
                f"{f['verdict']} |"
            )
    return rows


def render_markdown(results: dict[str, Any], previous: str = "") -> str:
    """The generated section. With `previous` (the section as it was), the rows of items this
    run did not measure are kept, in place, and the run they came from is named."""
    m = results["machine"]
    measured = (
        f"Measured {results['started_at']} with `{results['command']}` "
        f"({results['duration_s']:.0f} s, event loop {results['loop']})."
    )
    fresh = _rows(results)
    table: list[str] = []
    kept_from: list[str] = []
    replaced: set[str] = set()  # items whose rows this run gives: their old rows all go
    for line in previous.splitlines():
        if line.startswith("Measured ") or line.startswith("Other rows: "):
            kept_from.append(line.removeprefix("Other rows: "))
        cells = line.split("|")
        if not line.startswith("| ") or len(cells) < 3 or cells[1].strip() in ("item", "---"):
            continue
        name = cells[1].strip()
        if name in fresh:
            table.extend(fresh.pop(name))  # this run's rows, where the item's were
            replaced.add(name)
        elif name in ITEM_NAMES and name not in replaced:
            table.append(_with_spread_cell(line))
    for rows in fresh.values():
        table.extend(rows)
    lines = [MARK_BEGIN, "", measured]
    if previous and len(table) > sum(len(r) for r in _rows(results).values()):
        kept_from = _runs_still_shown(kept_from, replaced, measured)
        lines.append(f"Other rows: {' / '.join(kept_from) if kept_from else 'an earlier run.'}")
    lines += [
        "",
        f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB memory, "
        f"{m['implementation']} {m['python']}, {m['platform']}.",
        "",
        "| item | figure | unit | system under test | floor | ratio | rounds | target | verdict |",
        "|---|---|---|---:|---:|---:|---|---|---|",
        *table,
        "",
        MARK_END,
    ]
    return "\n".join(lines)


def _with_spread_cell(line: str) -> str:
    """A row kept from a run before the rounds column existed gets "-" there."""
    cells = line.split("|")
    if len(cells) == 10:  # "", 8 cells, "": no rounds column yet
        cells.insert(7, " - ")
    return "|".join(cells)


def _runs_still_shown(runs: list[str], replaced: set[str], measured: str) -> list[str]:
    """The earlier runs named under "Other rows", once each, without this run and without a run
    of only items this run measured again (none of its rows is left)."""
    shown: list[str] = []
    for run in " / ".join(runs).split(" / "):
        only = re.search(r"--only ([\w,-]+)", run)
        if run == measured or run in shown or (only and set(only.group(1).split(",")) <= replaced):
            continue
        shown.append(run)
    return shown


def update_markdown(path: Path, results: dict[str, Any]) -> None:
    """Replace the generated section (between the markers) and keep everything else; a run of
    some items (`--only`) keeps the other items' rows."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    begin, end = text.find(MARK_BEGIN), text.find(MARK_END)
    if begin >= 0 and end > begin:
        block = render_markdown(results, text[begin:end])
        text = text[:begin] + block + text[end + len(MARK_END) :]
    else:
        text = (text.rstrip() + "\n\n" if text.strip() else "") + render_markdown(results) + "\n"
    path.write_text(text, encoding="utf-8")
