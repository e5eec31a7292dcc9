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
