"""Numbers for people: the one formatting of figures in the summary, report.html and plots.

A byte count reads as "1.00 TB" (not 1e12), a small rate keeps its significant digits
("0.000246", not "0.000"), a large count gets thousands separators. A figure's name says its
kind: a name with the word `bytes` is bytes (`_per_s` in it: bytes a second).
"""

from __future__ import annotations

import math
from typing import Any

BYTE_UNITS = ("B", "kB", "MB", "GB", "TB", "PB", "EB")
SIGNIFICANT_DIGITS = 3


def human_bytes(value: float) -> str:
    """Decimal (SI) units, three significant digits: 1_000_000_000_000 -> "1.00 TB"."""
    if value is None or not math.isfinite(value):
        return str(value)
    magnitude = abs(value)
    unit = 0
    while magnitude >= 1000 and unit < len(BYTE_UNITS) - 1:
        magnitude /= 1000
        unit += 1
    if unit == 0:
        return f"{value:,.0f} B" if float(value).is_integer() else f"{value:.3g} B"
    decimals = max(0, SIGNIFICANT_DIGITS - len(str(int(magnitude))))
    sign = "-" if value < 0 else ""
    return f"{sign}{magnitude:.{decimals}f} {BYTE_UNITS[unit]}"


def human_number(value: float) -> str:
    """Integers with separators; fractions with three significant digits below 1000."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    return f"{value:.{SIGNIFICANT_DIGITS}g}"


DURATION_UNITS = (("s", 1.0), ("min", 60.0), ("h", 3_600.0), ("d", 86_400.0))
DURATION_UNIT_FROM = 2.0  # a unit is used from two of it: 90 s stays seconds, 150 s is 2.5 min


def duration_unit(seconds_max: float) -> tuple[str, float]:
    """The unit to show durations up to `seconds_max` in, and its length in seconds: long
    holder times read as "3.2 h", not 11,520 seconds."""
    chosen = DURATION_UNITS[0]
    for unit in DURATION_UNITS:
        if seconds_max >= DURATION_UNIT_FROM * unit[1]:
            chosen = unit
    return chosen


def y_limits(values: list[float], *, span_min: float = 0.0) -> tuple[float, float]:
    """A y axis that does not magnify noise. Values that are all >= 0 are shown from zero
    (a throughput steady to 0.02% is a flat line, not a storm); otherwise, or with `span_min`
    (epochs, which only make sense near their values), the axis spans at least `span_min`
    around the values. Never an empty range."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return 0.0, 1.0
    lo, hi = min(finite), max(finite)
    if lo >= 0 and not span_min:
        return 0.0, hi * 1.05 if hi > 0 else 1.0
    span = max(hi - lo, span_min, abs(hi) * 1e-9, 1.0)
    middle = (hi + lo) / 2
    bottom = middle - span * 0.55
    if lo >= 0:
        bottom = max(0.0, bottom)
    return bottom, bottom + span * 1.1


def human(name: str, value: Any, unit: str = "") -> str:
    """A figure called `name`, for people ("n/a" when unknown)."""
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    if "bytes" in name.split("_"):
        text = human_bytes(value)
        return f"{text}/s" if "_per_s" in name else text
    return f"{human_number(value)}{unit}"
