"""Deliberately broken rules, applied from the simulation side (subclass or patch), never by a
flag in production code. Each must be caught by the simulation within a bounded number of seeds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

# name -> (what is broken, a context manager factory that breaks it while a seed runs)
_Patch = Callable[[], contextlib.AbstractContextManager[None]]
MUTATIONS: dict[str, str] = {}
_PATCHES: dict[str, _Patch] = {}


@contextlib.contextmanager
def applied(name: str | None) -> Iterator[None]:
    """Break the rule `name` while the block runs (nothing when None)."""
    if name is None:
        yield
        return
    with _PATCHES[name]():
        yield
