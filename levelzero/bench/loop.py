"""Which event loop the benchmarks run on: uvloop when it is installed (and asked for), else
asyncio's own. uvloop is optional everywhere: nothing breaks without it."""

from __future__ import annotations

import importlib.util
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

T = TypeVar("T")
LOOP_CHOICES = ("auto", "asyncio", "uvloop")


def uvloop_available() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def resolve_loop(choice: str) -> str:
    """ "auto" -> "uvloop" if importable, else "asyncio"; "uvloop" without it is an error."""
    assert choice in LOOP_CHOICES, choice
    if choice == "auto":
        return "uvloop" if uvloop_available() else "asyncio"
    if choice == "uvloop" and not uvloop_available():
        raise SystemExit("--loop uvloop: uvloop is not installed (pip install uvloop)")
    return choice


def run_async(func: Callable[..., Awaitable[T]], *args: Any, loop: str = "asyncio") -> T:
    """`anyio.run` on the chosen loop (a fresh loop per call)."""
    options = {"use_uvloop": loop == "uvloop"}
    return anyio.run(func, *args, backend="asyncio", backend_options=options)
