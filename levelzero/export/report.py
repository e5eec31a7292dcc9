"""The analysis's outputs from its collected results: result files, PNG plots, report.html.

No Spark here: everything arrives as small `Results` tables. Result tables are written as
Parquet and CSV under `tables/`, plots as PNG under `plots/` (matplotlib, Agg backend — no
display needed), and `report.html` embeds the plots (base64, so the file stands alone) with a
short explanation of each figure and its key numbers.
"""

from __future__ import annotations

import base64
import html
import io
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from .readable import duration_unit, human, human_bytes, human_number, y_limits
from .results import Results, ResultTable

if TYPE_CHECKING:  # matplotlib is imported when plots are drawn
    from matplotlib.figure import Figure

TOP_ROWS_SHOWN = 20  # rows of a per-partition table shown in the report
TOP_PARTITIONS_PLOTTED = 5
PLOT_DPI = 110
HOLDERS_PLOT_MIN_HEIGHT_IN = 2.4  # one holder still gets a readable plot
EPOCH_AXIS_SPAN_MIN = 10.0  # epochs: a watermark steady at 100,000 is not stretched over the plot


@dataclass(frozen=True, slots=True)
class WrittenReport:
    report_path: str
    tables: dict[str, str]
    plots: dict[str, str]

    def moved(self, staging: str, target: str) -> WrittenReport:
        """The same report once `staging` was copied to `target` (a URI)."""
        return WrittenReport(
            _rebased(self.report_path, staging, target),
            {name: _rebased(path, staging, target) for name, path in self.tables.items()},
            {name: _rebased(path, staging, target) for name, path in self.plots.items()},
        )


def _rebased(path: str, old_root: str, new_root: str) -> str:
    if path == old_root or path.startswith(old_root.rstrip("/") + "/"):
        return new_root.rstrip("/") + path[len(old_root.rstrip("/")) :]
    return path


def write_report(
    results: Results,
    out_dir: str,
    *,
    link_root: str | None = None,
    plots: dict[str, str] | None = None,
) -> WrittenReport:
    """Result tables, plots and report.html in the local directory `out_dir`. With `link_root`,
    `out_dir` is a staging copy of that URI: the tables Spark wrote there are linked as if
    they were in `out_dir` (the links are relative, so they hold once it is copied up). The
    plots are drawn here unless `plots` names them (a `PlotDrawer` drew them into
    `out_dir`/plots while the jobs ran)."""
    tables = _write_tables(results, os.path.join(out_dir, "tables"))
    if link_root is not None:
        tables = {name: _rebased(path, link_root, out_dir) for name, path in tables.items()}
    if plots is None:
        plots = _write_plots(results, plots_dir(out_dir))
    report_path = os.path.join(out_dir, "report.html")
    temp = report_path + ".tmp"
    with open(temp, "w", encoding="utf-8") as file:
        file.write(_render_html(results, plots, tables, out_dir))
    os.replace(temp, report_path)
    return WrittenReport(report_path, tables, plots)


# ------------------------------------------------------------------------ result files


def _arrow(table: ResultTable) -> pa.Table:
    return pa.table({name: [row[name] for row in table.rows] for name in table.columns})


def _write_tables(results: Results, tables_dir: str) -> dict[str, str]:
    os.makedirs(tables_dir, exist_ok=True)
    written = {}
    for name, table in results.tables.items():
        arrow = _arrow(table)
        parquet_path = os.path.join(tables_dir, f"{name}.parquet")
        pq.write_table(arrow, parquet_path)
        pa_csv.write_csv(arrow, os.path.join(tables_dir, f"{name}.csv"))
        written[name] = parquet_path
    written.update(results.spark_tables)
    return written


# ------------------------------------------------------------------------ plots


def _times(rows: list[dict[str, Any]], bucket_s: float) -> list[datetime]:
    """Bucket ends: a value at a bucket is the value at its end."""
    return [r["bucket_start"] + timedelta(seconds=bucket_s) for r in rows]


def plots_dir(out_dir: str) -> str:
    return os.path.join(out_dir, "plots")


def load_plotting() -> None:
    """matplotlib's imports (half a second; the caller may run them ahead, in a thread)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates
    import matplotlib.pyplot


class _Canvas:
    """matplotlib for one report's plots: pyplot's figures, the common axes, and saving (every
    plot of a report is drawn in one thread: pyplot is not thread-safe)."""

    def __init__(self, plots_dir: str) -> None:
        load_plotting()
        import matplotlib.dates as mdates
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter

        self.plt = plt
        self.mdates = mdates
        self.formatter = FuncFormatter
        self.bytes_axis = FuncFormatter(lambda value, _: human_bytes(value))
        self.plots_dir = plots_dir
        self.written: dict[str, str] = {}
        os.makedirs(plots_dir, exist_ok=True)
        for name in os.listdir(plots_dir):  # a previous report's plots this one may not redraw
            if name.endswith(".png"):
                os.unlink(os.path.join(plots_dir, name))

    def save(self, name: str, figure: Figure) -> None:
        figure.tight_layout()
        path = os.path.join(self.plots_dir, f"{name}.png")
        figure.savefig(path, dpi=PLOT_DPI)
        self.plt.close(figure)
        self.written[name] = path

    # The axes as Any: matplotlib's stubs refuse the datetime x values its date units plot.
    def time_figure(self, title: str) -> tuple[Figure, Any]:
        figure, axis = self.plt.subplots(figsize=(9, 3.6))
        locator = self.mdates.AutoDateLocator()
        axis.xaxis.set_major_locator(locator)
        axis.xaxis.set_major_formatter(self.mdates.ConciseDateFormatter(locator, tz=UTC))
        axis.set_title(title)
        axis.set_xlabel("time (UTC)")
        axis.grid(alpha=0.3)
        return figure, axis


def _plot_gc_lag_histogram(canvas: _Canvas, results: Results) -> None:
    plt = canvas.plt
    tables = results.tables
    panels = [
        ("gc_lag", "GC lag: eligible (M >= epoch) → deleted", tables["gc_lag_histogram"].rows),
        ("l0_age", "L0 age at deletion: created → deleted", tables["l0_age_histogram"].rows),
    ]
    panels = [panel for panel in panels if panel[2]]
    if panels:
        figure, axes = plt.subplots(1, len(panels), figsize=(10, 3.6), squeeze=False)
        for axis, (prefix, title, histogram) in zip(axes[0], panels, strict=True):
            widths = [r["bin_hi_s"] - r["bin_lo_s"] for r in histogram]
            axis.bar(
                [r["bin_lo_s"] for r in histogram],
                [r["objects"] for r in histogram],
                width=widths,
                align="edge",
                edgecolor="black",
                linewidth=0.4,
            )
            for p, style in (("p50", "--"), ("p90", "-."), ("p99", ":")):
                value = results.figures.get(f"{prefix}_{p}_s")
                if value is not None:
                    axis.axvline(value, linestyle=style, color="crimson", label=p)
            axis.set_title(title)
            axis.set_xlabel("seconds")
            axis.set_ylabel("L0 objects")
            axis.legend()
            axis.grid(alpha=0.3)
        canvas.save("gc_lag_histogram", figure)


def _plot_storage_over_time(canvas: _Canvas, results: Results) -> None:
    time_figure = canvas.time_figure
    bytes_axis = canvas.bytes_axis
    tables = results.tables
    bucket_s = results.bucket_s
    storage = tables["storage_over_time"].rows
    if storage:
        figure, axis = time_figure("Live bytes: L0 vs L1, and storage amplification")
        times = _times(storage, bucket_s)
        axis.plot(times, [r["l0_live_bytes"] for r in storage], label="L0 live bytes")
        axis.plot(times, [r["l1_live_bytes"] for r in storage], label="L1 live bytes")
        axis.set_ylabel("bytes")
        axis.yaxis.set_major_formatter(bytes_axis)
        axis.set_ylim(*y_limits([r[c] for r in storage for c in ("l0_live_bytes", "l1_live_bytes")]))
        twin = axis.twinx()
        amplification = [r["amplification"] for r in storage]
        twin.plot(times, amplification, color="gray", linestyle="--", label="(L0 + L1) / L1")
        twin.set_ylabel("amplification")
        twin.set_ylim(*y_limits(amplification))
        lines = axis.get_lines() + twin.get_lines()
        axis.legend(lines, [line.get_label() for line in lines], loc="upper left")
        canvas.save("storage_over_time", figure)


def _plot_watermark_over_time(canvas: _Canvas, results: Results) -> None:
    time_figure = canvas.time_figure
    tables = results.tables
    bucket_s = results.bucket_s
    watermark = tables["watermark_over_time"].rows
    gc_rounds = tables["gc_rounds_over_time"].rows
    if watermark or gc_rounds:
        figure, axis = time_figure("Safe-to-GC watermark and its lag (epochs)")
        if watermark:
            times = _times(watermark, bucket_s)
            for column, label, style in (
                ("max_applied_epoch", "max applied epoch", "-"),
                ("m", "M = min M(p)", "-"),
                ("partition_lag_max", "max partition lag", "--"),
            ):
                values = [r[column] for r in watermark]
                axis.step(times, values, where="post", linestyle=style, label=label)
        if gc_rounds:
            axis.plot(
                _times(gc_rounds, bucket_s),
                [r["m"] for r in gc_rounds],
                "o",
                markersize=3,
                label="M seen by GC rounds",
            )
        axis.set_ylabel("epoch")
        epochs = [r[c] for r in watermark for c in ("max_applied_epoch", "m")] + [r["m"] for r in gc_rounds]
        axis.set_ylim(*y_limits(epochs, span_min=EPOCH_AXIS_SPAN_MIN))
        axis.legend(loc="upper left")
        canvas.save("watermark_over_time", figure)


def _plot_cluster_lag(canvas: _Canvas, results: Results) -> None:
    time_figure = canvas.time_figure
    bucket_s = results.bucket_s
    watermark = results.tables["watermark_over_time"].rows
    gc_rounds = results.tables["gc_rounds_over_time"].rows
    cluster_lags = [r for r in watermark if r["cluster_lag_epochs"] is not None]
    round_lags = [r for r in gc_rounds if r["cluster_lag_epochs"] is not None]
    if cluster_lags or round_lags:
        figure, axis = time_figure("Cluster lag E − M (epochs the GC is behind)")
        if cluster_lags:
            axis.step(
                _times(cluster_lags, bucket_s),
                [r["cluster_lag_epochs"] for r in cluster_lags],
                where="post",
                label="max applied epoch − M (state samples)",
            )
            axis.step(
                _times(cluster_lags, bucket_s),
                [r["partition_lag_max"] for r in cluster_lags],
                where="post",
                linestyle="--",
                label="worst partition: max applied − M(p)",
            )
        if round_lags:
            axis.plot(
                _times(round_lags, bucket_s),
                [r["cluster_lag_epochs"] for r in round_lags],
                "o",
                markersize=3,
                label="E − M seen by GC rounds",
            )
        axis.set_ylabel("epochs")
        lags = [r[c] for r in cluster_lags for c in ("cluster_lag_epochs", "partition_lag_max")]
        axis.set_ylim(*y_limits(lags + [r["cluster_lag_epochs"] for r in round_lags]))
        axis.legend(loc="upper left")
        canvas.save("cluster_lag", figure)


def _plot_watermark_holders(canvas: _Canvas, results: Results) -> None:
    plt = canvas.plt
    tables = results.tables
    holders = [r for r in tables["partition_watermarks"].rows if r["buckets_holding_m"]]
    holders = holders[:TOP_ROWS_SHOWN]
    if holders:
        height = max(HOLDERS_PLOT_MIN_HEIGHT_IN, 0.9 + 0.3 * len(holders))
        figure, axis = plt.subplots(figsize=(9, height))
        names = [f"{r['topic']}/{r['partition']}" for r in holders][::-1]
        held = [r["seconds_holding_m"] for r in holders][::-1]
        unit, unit_s = duration_unit(max(held))
        axis.barh(names, [h / unit_s for h in held])
        axis.set_xlabel(f"time ({unit}) at the minimum M(p) while another partition was above it")
        axis.set_title("Partitions that held the GC watermark back")
        axis.grid(alpha=0.3, axis="x")
        canvas.save("watermark_holders", figure)


def _plot_fence(canvas: _Canvas, results: Results) -> None:
    plt = canvas.plt
    tables = results.tables
    by_window = tables["fence_by_window"].rows
    sizes = tables["fence_window_sizes"].rows
    if by_window or sizes:
        figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
        left.bar(
            [r["window_max_from"] for r in by_window],
            [r["rejection_rate"] for r in by_window],
            width=[r["window_max_to"] - r["window_max_from"] + 1 for r in by_window],
            align="edge",
        )
        left.set_title("Stale rejections / fence decisions")
        left.set_xlabel("window upper edge (epoch range)")
        left.yaxis.set_major_formatter(canvas.formatter(lambda v, _: human_number(v)))
        left.set_ylabel("rejection rate")
        left.set_ylim(*y_limits([r["rejection_rate"] for r in by_window]))
        right.bar([str(r["window_size"]) for r in sizes], [r["events"] for r in sizes])
        right.set_title("Window size at fence time")
        right.set_xlabel("window_max - window_min + 1")
        right.set_ylabel("fence events")
        for axis in (left, right):
            axis.grid(alpha=0.3, axis="y")
        canvas.save("fence", figure)


def _plot_reconciler_lag(canvas: _Canvas, results: Results) -> None:
    time_figure = canvas.time_figure
    tables = results.tables
    bucket_s = results.bucket_s
    reconciler = tables["reconciler_lag_over_time"].rows
    if reconciler:
        figure, axis = time_figure("Reconciler lag: records not yet in L1")
        times = _times(reconciler, bucket_s)
        for column, label in (
            ("unreconciled_total", "all partitions"),
            ("unreconciled_max", "worst partition"),
        ):
            axis.step(times, [r[column] for r in reconciler], where="post", label=label)
        axis.set_ylabel("records")
        axis.set_ylim(
            *y_limits([r[c] for r in reconciler for c in ("unreconciled_total", "unreconciled_max")])
        )
        axis.legend(loc="upper left")
        canvas.save("reconciler_lag", figure)


def _plot_throughput(canvas: _Canvas, results: Results) -> None:
    time_figure = canvas.time_figure
    bytes_axis = canvas.bytes_axis
    tables = results.tables
    bucket_s = results.bucket_s
    throughput = tables["throughput_over_time"].rows
    if throughput and results.figures.get("records_total"):
        figure, axis = time_figure("Throughput (placeholders appended)")
        times = _times(throughput, bucket_s)
        axis.plot(times, [r["records_per_s"] for r in throughput], label="records/s")
        axis.set_ylabel("records/s")
        axis.yaxis.set_major_formatter(canvas.formatter(lambda v, _: human_number(v)))
        axis.set_ylim(*y_limits([r["records_per_s"] for r in throughput]))
        twin = axis.twinx()
        bytes_per_s = [r["bytes_per_s"] for r in throughput]
        twin.plot(times, bytes_per_s, color="gray", linestyle="--", label="bytes/s")
        twin.set_ylabel("bytes/s")
        twin.set_ylim(*y_limits(bytes_per_s))
        twin.yaxis.set_major_formatter(bytes_axis)
        lines = axis.get_lines() + twin.get_lines()
        axis.legend(lines, [line.get_label() for line in lines], loc="upper left")
        canvas.save("throughput", figure)


# The plots in the report's order: a plot is drawn once the steps that make its tables (and
# the figures they set) are done.
_PLOTS: tuple[tuple[str, tuple[str, ...], Callable[[_Canvas, Results], None]], ...] = (
    ("gc_lag_histogram", ("gc_lag_histogram", "l0_age_histogram"), _plot_gc_lag_histogram),
    ("storage_over_time", ("storage_over_time",), _plot_storage_over_time),
    ("watermark_over_time", ("watermark_over_time", "gc_rounds_over_time"), _plot_watermark_over_time),
    ("cluster_lag", ("watermark_over_time", "gc_rounds_over_time"), _plot_cluster_lag),
    ("watermark_holders", ("partition_watermarks",), _plot_watermark_holders),
    ("fence", ("fence_by_window", "fence_window_sizes"), _plot_fence),
    ("reconciler_lag", ("reconciler_lag_over_time",), _plot_reconciler_lag),
    ("throughput", ("throughput_over_time", "throughput_by_partition"), _plot_throughput),
)


def _write_plots(results: Results, plots_dir: str) -> dict[str, str]:
    """Every plot of `results`, drawn now in this thread."""
    canvas = _Canvas(plots_dir)
    for _, _, draw in _PLOTS:
        draw(canvas, results)
    return canvas.written


class PlotDrawer:
    """Draws each plot as soon as the results it shows are in, while the Spark jobs run: in
    the one thread of `pool` (every plot of the report in that thread; pyplot is not
    thread-safe), from the collected rows, off the jobs' critical path. `ready` is called
    from the jobs' threads after each step of the analysis with the tables that step made;
    `finish` waits for the drawing and returns the plots in the report's order."""

    def __init__(self, plots_dir: str, pool: Executor) -> None:
        self._pool = pool
        self._plots_dir = plots_dir
        self._canvas: _Canvas | None = None
        self._ready: set[str] = set()
        self._drawn: set[str] = set()
        self._lock = threading.Lock()
        self._pending: list[Future[None]] = [pool.submit(self._start)]

    def _start(self) -> None:
        self._canvas = _Canvas(self._plots_dir)  # matplotlib's imports while the jobs start

    def ready(self, results: Results, tables: Iterable[str]) -> None:
        names = frozenset(tables)
        with self._lock:
            self._pending.append(self._pool.submit(self._draw, results, names))

    def _draw(self, results: Results, names: frozenset[str]) -> None:
        assert self._canvas is not None, "_start runs first in the pool's one thread"
        self._ready |= names
        for name, needs, draw in _PLOTS:
            if name not in self._drawn and self._ready.issuperset(needs):
                self._drawn.add(name)
                draw(self._canvas, results)

    def finish(self) -> dict[str, str]:
        with self._lock:
            pending, self._pending = self._pending, []
        for future in pending:
            future.result()
        assert self._canvas is not None
        missing = [name for name, _, _ in _PLOTS if name not in self._drawn]
        assert not missing, f"plots never drawn: {missing} (tables ready: {sorted(self._ready)})"
        written = self._canvas.written
        return {name: written[name] for name, _, _ in _PLOTS if name in written}


# ------------------------------------------------------------------------ HTML

_SECTIONS = [
    (
        "GC lag",
        "gc_lag_histogram",
        "Two ways. <em>Age at deletion</em> (created → deleted) is what storage costs: how long "
        "each L0 object's bytes were kept. <em>GC lag</em> (eligible → deleted) is the GC's own "
        "share of it: an object is eligible at the first GC round whose watermark M reached its "
        "epoch (not before it was created); the lag includes the grace period and the GC's "
        "pacing between rounds. Age minus lag is the time the watermark took to pass the object.",
        [
            "l0_age_p50_s",
            "l0_age_p90_s",
            "l0_age_p99_s",
            "l0_age_max_s",
            "l0_age_mean_s",
            "gc_lag_count",
            "gc_lag_p50_s",
            "gc_lag_p90_s",
            "gc_lag_p99_s",
            "gc_lag_max_s",
            "gc_lag_mean_s",
            "l0_eligible_not_deleted",
            "l0_deleted_unexplained",
        ],
        ["gc_lag_summary", "l0_age_histogram", "gc_lag_histogram"],
    ),
    (
        "Storage amplification",
        "storage_over_time",
        "Bytes held in live L0 objects next to live (COPY_FINISHED, not being deleted) L1 "
        "objects. L0 objects hold data that is often already reconciled into L1: until the GC "
        "deletes them the data is stored twice. Amplification = (L0 + L1) / L1.",
        [
            "l0_objects",
            "l0_bytes",
            "l0_deleted",
            "l0_deleted_bytes",
            "l0_live_objects_end",
            "l0_live_bytes_end",
            "l0_live_bytes_peak",
            "l1_live_bytes_end",
            "amplification_peak",
            "amplification_end",
        ],
        [],
    ),
    (
        "Safe-to-GC watermark",
        "watermark_over_time",
        "Each partition's published M(p) (from the housekeeper's state samples; a partition's "
        "value at a time is its latest sample). M = min M(p); the partitions at that minimum "
        "(or still without an M(p)) are what holds the GC back. Partition lag = max applied "
        "epoch − M(p).",
        [
            "watermark_lag_max_epochs",
            "watermark_lag_end_epochs",
            "top_m_holder",
            "top_m_holder_seconds",
            "gc_rounds",
            "gc_dry_runs",
            "gc_blocked_rounds",
            "gc_m_max",
            "cluster_epoch_max",
        ],
        [],
    ),
    (
        "Cluster lag",
        "cluster_lag",
        "How many epochs the GC watermark is behind: max applied epoch − M from the state "
        "samples, and E − M as each GC round saw it (E the cluster epoch). A growing lag means "
        "L0 objects wait longer to become collectable.",
        ["watermark_lag_max_epochs", "watermark_lag_end_epochs"],
        [],
    ),
    (
        "Partitions holding M back",
        "watermark_holders",
        "Time each partition spent at the minimum M(p) (or without an M(p)) while at least one "
        "other partition was above it, most first. Time when every partition was tied is "
        "nobody's in particular and is not counted.",
        ["sampled_partitions"],
        ["partition_watermarks"],
    ),
    (
        "Epoch fence",
        "fence",
        "Fence decisions grouped by the window's upper edge (the epoch a partition's window had "
        "moved to), in at most 200 equal epoch ranges whatever the history's length. A rejection "
        "is a write whose epoch was below the window: its writer "
        "refreshes its epoch cache and retries. Window size = window_max − window_min + 1.",
        ["fence_events", "fence_rejected", "fence_rejection_rate", "window_size_max"],
        ["fence_by_window", "fence_window_sizes", "fence_outcomes"],
    ),
    (
        "Reconciler lag",
        "reconciler_lag",
        "Records appended but not yet reconciled into L1 (high watermark − 1 − LRO), summed "
        "over partitions and for the worst partition.",
        ["reconciler_lag_max_records", "reconciler_lag_end_records"],
        [],
    ),
    (
        "Throughput",
        "throughput",
        "Records and bytes appended as placeholders per second, per time bucket; per partition "
        "in the table (the full partition × bucket table is in "
        "tables/throughput_partition_buckets).",
        ["records_total", "bytes_total", "partitions", "records_per_s_peak", "bytes_per_s_peak"],
        ["throughput_by_partition"],
    ),
]


def _format(value: Any, name: str = "") -> str:
    if value is None:
        return "–"
    return html.escape(human(name, value))


def _html_table(table: ResultTable, limit: int = TOP_ROWS_SHOWN) -> str:
    if not table.rows:
        return "<p class='empty'>no rows</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    body = []
    for row in table.rows[:limit]:
        cells = []
        for column in table.columns:
            value = row[column]
            if column == "bucket_start" and value is not None:
                value = value.strftime("%Y-%m-%d %H:%M:%S")
            name = row["figure"] if column == "value" and "figure" in row else column
            cells.append(f"<td>{_format(value, name)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = len(table.rows) - limit
    tail = f"<p class='more'>… and {more} more rows in the result files</p>" if more > 0 else ""
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{tail}"


def _figures_table(results: Results, names: list[str]) -> str:
    rows = "".join(
        f"<tr><th>{html.escape(name)}</th><td>{_format(results.figures.get(name), name)}</td></tr>"
        for name in names
    )
    return f"<table class='figures'>{rows}</table>"


def _image(path: str) -> str:
    with open(path, "rb") as file:
        data = base64.b64encode(file.read()).decode("ascii")
    alt = html.escape(os.path.basename(path))
    return f"<img alt='{alt}' src='data:image/png;base64,{data}'>"


def _render_html(results: Results, plots: dict[str, str], tables: dict[str, str], out_dir: str) -> str:
    figures = results.figures
    span = (
        f"{datetime.fromtimestamp(figures['time_start'], UTC):%Y-%m-%d %H:%M:%S} – "
        f"{datetime.fromtimestamp(figures['time_end'], UTC):%Y-%m-%d %H:%M:%S} UTC"
    )
    out = io.StringIO()
    out.write(
        "<!doctype html><html><head><meta charset='utf-8'><title>levelzero analysis</title>"
        "<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:0.5em 0 1em}td,th{border:1px solid #ccc;"
        "padding:2px 8px;text-align:right;font-size:0.9em}th{background:#f4f4f4}"
        "table.figures th{text-align:left}img{max-width:100%}.empty,.more{color:#777}"
        "code{background:#f4f4f4}</style></head><body>"
    )
    out.write("<h1>levelzero analysis</h1>")
    out.write(
        f"<p>Data from {span}; time buckets of {results.bucket_s:g} s "
        f"({results.buckets} buckets). Generated {datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC.</p>"
    )
    out.write("<h2>Inputs</h2><ul>")
    for path in results.inputs:
        out.write(f"<li><code>{html.escape(path)}</code></li>")
    out.write("</ul>")
    rows_table = ResultTable(["table", "rows"], [{"table": k, "rows": v} for k, v in results.rows.items()])
    out.write(_html_table(rows_table))
    out.write("<h2>Key figures</h2>")
    out.write(
        _figures_table(
            results,
            [
                "l0_objects",
                "l0_bytes",
                "l0_deleted",
                "gc_lag_p50_s",
                "gc_lag_p99_s",
                "gc_lag_max_s",
                "amplification_peak",
                "watermark_lag_max_epochs",
                "top_m_holder",
                "fence_rejection_rate",
                "reconciler_lag_max_records",
                "records_total",
                "bytes_total",
            ],
        )
    )
    for title, plot, text, figure_names, table_names in _SECTIONS:
        out.write(f"<h2>{html.escape(title)}</h2><p>{text}</p>")
        if plot in plots:
            out.write(_image(plots[plot]))
        else:
            out.write("<p class='empty'>no data for this plot</p>")
        out.write(_figures_table(results, figure_names))
        for name in table_names:
            out.write(f"<h3>{html.escape(name)}</h3>")
            out.write(_html_table(results.tables[name]))
    out.write("<h2>Result files</h2><ul>")
    for name, path in sorted(tables.items()):
        relative = html.escape(os.path.relpath(path, out_dir))
        csv = os.path.splitext(path)[0] + ".csv"
        csv_link = (
            f", <a href='{html.escape(os.path.relpath(csv, out_dir))}'>csv</a>" if os.path.exists(csv) else ""
        )
        out.write(f"<li>{html.escape(name)}: <a href='{relative}'>{relative}</a>{csv_link}</li>")
    out.write("</ul></body></html>")
    return out.getvalue()
