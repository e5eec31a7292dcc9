"""What the client commands print: tables, records, the status page, GC rounds and explanations."""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from levelzero.actors.gc import RoundReport
from levelzero.core.reconcile_health import utc_time

MiB = 1024 * 1024


def plural(count: int, word: str) -> str:
    """`1 record`, `2 records`, `0 partitions`."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    every = [tuple(header), *(tuple(row) for row in rows)]
    widths = [max(len(row[i]) for row in every) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip() for row in every
    )


def record_json(offset: int, key: bytes | None, value: bytes | None) -> dict[str, Any]:
    """A record as JSON: keys and values that are UTF-8 text as strings, anything else as
    base64 under `key_b64` / `value_b64` (so no byte is lost and text stays readable); a null
    key or value as `null` (an empty one is `""`)."""
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


def _print_record(fmt: str, offset: int, key: bytes | None, value: bytes | None) -> None:
    """`text` and `offsets` print a null value as an empty line, as kcat does; `json` tells
    them apart."""
    if fmt == "json":
        print(msgspec.json.encode(record_json(offset, key, value)).decode())
        return
    text = (value or b"").decode("utf-8", "backslashreplace")
    print(f"{offset}\t{text}" if fmt == "offsets" else text)


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


def _holder_reason(holder) -> str:  # noqa: ANN001 - gc.Holder
    """Its reason, with the time its reconciliation started failing shown as in status."""
    since = holder.reconcile_failing_since
    if since is None:
        return holder.reason
    return holder.reason.replace(f"failing since {utc_time(since)}", f"failing since {_ago(since)}")


def _component_lines(status) -> list[str]:  # noqa: ANN001 - StatusResponse
    lines = []
    r = status.reconciler
    if r is not None:
        lines.append(
            f"reconciler: {r.objects_written} L1 objects ({_mib(r.bytes_written)}), "
            f"{r.records_reconciled} records, lag {r.lag_offsets} offsets, "
            f"rejected catch-ups {r.catch_ups_rejected}, errors {r.errors}"
            + (f", stray L1 objects deleted {r.l1_strays_deleted}" if r.l1_strays_deleted else "")
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
    c = status.l0_cache
    if c is not None:
        lines.append(
            f"L0 cache: {c.objects} objects ({_mib(c.held_bytes)} of {_mib(c.bytes_max)}), "
            f"extents without a GET of their own {c.hits + c.shared} ({c.hit_ratio:.0%}), "
            f"object GETs {c.loads}, extent GETs {c.uncached_gets}, evictions {c.evictions}, "
            f"released (collected) {c.released}"
            + (f", thrashing: one miss in {c.load_every} loads its object" if c.load_every > 1 else "")
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
                f"blocked by {', '.join(last.blocked_by[:3])}"
                if last.m is None
                else f"M {last.m}, deleted {last.deleted}, too young {last.too_young}, errors {last.errors}"
            )
            line += f"; last {kind} #{last.round_id} {_ago(last.finished_at)}: {outcome}"
        lines.append(line)
    return lines


def _led_by(partition: str, led_by: dict[str, str]) -> str:
    """A partition, with the node leading it in a cluster."""
    node = led_by.get(partition)
    if node is None:
        return partition
    return f"{partition} on {node}" if node else f"{partition} (moving)"


def format_status(status) -> str:  # noqa: ANN001 - StatusResponse
    m = "blocked" if status.m is None else str(status.m)
    if status.m is None and status.m_blocked_count:
        blocked = ", ".join(_led_by(name, status.m_led_by) for name in status.m_blocked_by[:3])
        m += f" ({status.m_blocked_count} partitions without M(p), e.g. {blocked})"
    elif status.m_holders:
        held = ", ".join(_led_by(name, status.m_led_by) for name in status.m_holders[:3])
        more = max(status.m_holders_count, len(status.m_holders)) - min(3, len(status.m_holders))
        m += f" (held by {held}{f' and {more} more' if more > 0 else ''})"
    elif status.m is None and status.m_read_at is None:
        m = "not read from the control plane yet"
    b = status.batcher
    lines = [
        f"cluster epoch {status.cluster_epoch} (cached {_cell(status.cached_epoch)})   "
        f"M {m}   accepting {'yes' if status.accepting else 'no'}"
        + (f" ({status.not_accepting_reason})" if status.not_accepting_reason else ""),
        # Counters of this daemon's uploads since it started, not the L0 objects in the store.
        f"since start: L0 objects uploaded {b.objects_uploaded} ({b.bytes_uploaded} bytes), "
        f"orphans {b.orphan_objects}, "
        f"stale rejections {b.stale_rejections}, retries {b.stale_retries}, failures {b.stale_failures}",
        *_component_lines(status),
        *(f"UNSTORABLE TOPIC: {t.advice}" for t in status.unstorable_topics),
        *_outlier_lines(status),
        "",
    ]
    header = (
        "PARTITION",
        "TERM",
        "WINDOW",
        "APPLIED",
        "LOWER",
        "M(p)",
        "LRO",
        "HWM",
        "LAG",
        "L1",
        "START",
        "SLIDES",
        "STALE",
    )
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
            "?" if p.l1_objects is None else str(p.l1_objects),  # unknown: not read
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
        lines += [
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip() for row in rows
        ]
    total = getattr(status, "partitions_total", 0)
    if total > len(status.partitions):
        lines.append(f"... {len(status.partitions)} of {total} partitions shown (--all for every one)")
    return "\n".join(lines)


def _outlier_lines(status) -> list[str]:  # noqa: ANN001 - StatusResponse
    if not status.outliers_count:
        return []
    lines = [
        f"outliers: {status.outliers_count} partitions"
        + (f" ({len(status.outliers)} shown)" if len(status.outliers) < status.outliers_count else "")
    ]
    lines += [
        f"  {o.partition}: {', '.join(o.reasons)} (M(p) {_cell(o.mp)}, lag {o.reconciler_lag}, "
        f"stale {o.stale_rejections})"
        for o in status.outliers
    ]
    return lines


def _json_out(value: msgspec.Struct) -> None:
    print(msgspec.json.format(msgspec.json.encode(value)).decode())


def format_round(report: RoundReport) -> str:
    kind = "gc dry run" if report.dry_run else "gc round"
    kind += " (failed)" if report.failed else ""
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
            + (
                ""
                if report.max_deleted_epoch is None
                else f"; highest epoch deleted {report.max_deleted_epoch}"
            )
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
        lines.append(
            f"partitions without an M(p) (no deletes until they have one): {', '.join(e.blocked_by[:20])}"
        )
    if not e.holders:
        return "\n".join(lines)
    if e.epoch is not None:
        title = f"held back by {e.holders_total} (M(p) below epoch {e.epoch}; BEHIND: how far it must rise):"
    else:
        title = f"M is held by {e.holders_total}:"
    lines.append(title)
    header = ("PARTITION", "M(p)", "M(p)-M", "BEHIND", "WHY")
    rows = [header] + [
        (h.partition, _cell(h.mp), _cell(h.mp_minus_m), _cell(h.behind), _holder_reason(h)) for h in e.holders
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip() for row in rows
    ]
    if e.holders_total > len(e.holders):
        lines.append(f"  ... and {e.holders_total - len(e.holders)} more")
    return "\n".join(lines)


def format_compaction(compactor, partition: str | None = None) -> str:  # noqa: ANN001 - CompactorStatus
    """`levelzero compaction explain`: per compacted partition led by the node answering, its
    dirty ratio, last compaction, bytes reclaimed, cleaner-offset map and why it was not
    compacted on its last visit; `partition` ("topic/p") shows that one only."""
    if compactor is None:
        return "the answering node runs no compactor"
    shown = [p for p in compactor.partitions if partition is None or p.partition == partition]
    if partition is not None and not shown:
        return (
            f"{partition}: not seen by this node's compactor (not a compacted topic, not led "
            "here, or not visited yet)"
        )
    # The counts and the last compaction are the node's since it started (kept in memory); the
    # cleaner-offset map is stored, so a partition compacted before a restart shows it there.
    lines = [
        f"compactor, since this node started: {plural(compactor.rounds, 'round')},"
        f" {compactor.passes} accepted passes,"
        f" {compactor.refused} refused, {compactor.errors} failed;"
        f" {compactor.bytes_read} bytes read, {compactor.bytes_written} written"
    ]
    for p in shown:
        last = (
            "none since this node started"
            if p.last_compaction_at is None
            else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(p.last_compaction_at))
        )
        cleaner = ", ".join(f"term {t} -> {end}" for t, end in p.cleaner_offsets.items()) or "empty"
        lines.append(f"{p.partition}")
        lines.append(f"  dirty ratio {p.dirty_ratio:.4f}; last compaction {last}; passes here {p.passes}")
        lines.append(
            f"  reclaimed {p.bytes_reclaimed} bytes, {p.records_removed} records removed,"
            f" {p.tombstones_dropped} tombstones dropped; {p.refused} results refused"
        )
        lines.append(f"  cleaner-offset map: {cleaner}")
        lines.append(
            f"  not compacted: {p.not_compacted}" if p.not_compacted else "  compacted on its last visit"
        )
    return "\n".join(lines)
