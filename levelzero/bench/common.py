"""What every benchmark item shares: a figure (the system under test beside its floor, measured in
the same run, in interleaved rounds), medians, the machine's description, and a moto server.

Why ratios: this machine is shared. Absolute rates move by tens of percent with whatever else
runs; a ratio of two measurements taken back to back, alternating which goes first, does not.
"""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from levelzero.testing.moto import moto_process

if TYPE_CHECKING:
    from levelzero.actors.node import Node
    from levelzero.client import Client
    from levelzero.daemon.service import Daemon

T = TypeVar("T")
U = TypeVar("U")

MOTO_ACCESS_KEY = "levelzero-bench"
MOTO_SECRET_KEY = "levelzero-bench-secret"  # noqa: S105 - a local moto server's, no secret
SETTLE_STEPS_MAX = 1200  # of 50 ms: a minute for the reconciler to catch up before a round


# ------------------------------------------------------------------------------------ settings


@dataclass(frozen=True, slots=True)
class Settings:
    """How much each item measures: `quick` is a smoke test of a few seconds per item."""

    quick: bool = False
    rounds: int = 5  # interleaved SUT/floor pairs per figure
    seconds: float = 1.0  # per timed measurement, where the item runs for a time
    work_dir: str | None = None  # stores and databases (default: a temporary directory)

    def pick(self, full: T, quick: T) -> T:
        return quick if self.quick else full


# ------------------------------------------------------------------------------------ figures


@dataclass(frozen=True, slots=True)
class Target:
    """The ratio a figure must reach: at least `bound` (higher is better) or at most `bound`."""

    bound: float
    higher_is_better: bool = True

    def met(self, ratio: float) -> bool:
        return ratio >= self.bound if self.higher_is_better else ratio <= self.bound

    def __str__(self) -> str:
        return f"{'>=' if self.higher_is_better else '<='} {self.bound:.0%}"


@dataclass(frozen=True, slots=True)
class Figure:
    """One row of the table: `sut` and `floor` are medians over the rounds, `ratio` the median of
    the rounds' own ratios (None when the floor is zero in every round)."""

    item: str
    name: str
    unit: str
    sut: float
    floor: float
    ratio: float | None
    target: Target | None = None
    sut_label: str = "sut"
    floor_label: str = "floor"
    rounds: tuple[tuple[float, float], ...] = ()
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def round_ratios(self) -> list[float]:
        return [r for r in (safe_ratio(s, f) for s, f in self.rounds) if r is not None]

    @property
    def judged_ratio(self) -> float | None:
        """The ratio a target is judged on: the worst quartile of the rounds' ratios (nearest
        rank: the worst of 2-4 rounds, the second worst of 5-8), so that a figure passes only
        when three rounds in four would. The median alone passed figures whose rounds swung
        by 45 points. One round (or none recorded): the ratio."""
        ratios = self.round_ratios
        if len(ratios) < 2 or self.target is None:
            return self.ratio
        worst_first = sorted(ratios, reverse=not self.target.higher_is_better)
        return worst_first[(len(worst_first) - 1) // 4]

    @property
    def spread(self) -> str:
        """The rounds' ratios, lowest to highest ("-" for a single round)."""
        ratios = self.round_ratios
        if len(ratios) < 2:
            return "-"
        return f"{min(ratios):.0%}–{max(ratios):.0%}"

    @property
    def verdict(self) -> str:
        if self.target is None:
            return "info"
        judged = self.judged_ratio
        if judged is None:
            return "n/a"
        return "pass" if self.target.met(judged) else "miss"

    def to_json(self) -> dict[str, Any]:
        return {
            "item": self.item,
            "name": self.name,
            "unit": self.unit,
            "sut_label": self.sut_label,
            "floor_label": self.floor_label,
            "sut": self.sut,
            "floor": self.floor,
            "ratio": self.ratio,
            "target": None
            if self.target is None
            else {"bound": self.target.bound, "higher_is_better": self.target.higher_is_better},
            "verdict": self.verdict,
            "judged_ratio": self.judged_ratio,
            "spread": self.spread,
            "rounds": [list(r) for r in self.rounds],
            "notes": self.notes,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Figure:
        """A figure back from its `to_json` (a child process's): its rounds give the rest."""
        target = data["target"]
        return figure(
            data["item"],
            data["name"],
            data["unit"],
            [(sut, floor) for sut, floor in data["rounds"]],
            target=None if target is None else Target(target["bound"], target["higher_is_better"]),
            sut_label=data["sut_label"],
            floor_label=data["floor_label"],
            notes=data["notes"],
        )


def safe_ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def figure(
    item: str,
    name: str,
    unit: str,
    pairs: Sequence[tuple[float, float]],
    *,
    target: Target | None = None,
    sut_label: str = "sut",
    floor_label: str = "floor",
    notes: dict[str, Any] | None = None,
) -> Figure:
    """A figure from per-round (sut, floor) pairs: medians, and the median per-round ratio."""
    assert pairs, "a figure needs at least one round"
    ratios = [r for r in (safe_ratio(s, f) for s, f in pairs) if r is not None]
    return Figure(
        item=item,
        name=name,
        unit=unit,
        sut=statistics.median(s for s, _ in pairs),
        floor=statistics.median(f for _, f in pairs),
        ratio=statistics.median(ratios) if ratios else None,
        target=target,
        sut_label=sut_label,
        floor_label=floor_label,
        rounds=tuple((float(s), float(f)) for s, f in pairs),
        notes=notes or {},
    )


async def interleave(
    rounds: int,
    sut: Callable[[int], Awaitable[T]],
    floor: Callable[[int], Awaitable[U]],
) -> list[tuple[T, U]]:
    """`rounds` pairs, alternating which side runs first (ABBA), so drift hits both alike."""
    assert rounds >= 1
    out: list[tuple[T, U]] = []
    for i in range(rounds):
        if i % 2 == 0:
            a = await sut(i)
            b = await floor(i)
        else:
            b = await floor(i)
            a = await sut(i)
        out.append((a, b))
    return out


def quantile(values: Sequence[float], q: float) -> float:
    """The `q` quantile by nearest rank (no interpolation: it is a value that happened)."""
    assert values
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered))))]


async def closed_loop(callers: int, seconds: float, call: Callable[[int], Awaitable[object]]) -> float:
    """Calls per CPU second of `callers` tasks each calling `call(i)` back to back for `seconds`
    of wall time. CPU time, not wall time: everything runs on this one thread, and the figure
    must not depend on what else the machine is running."""
    done = 0
    deadline = time.perf_counter() + seconds

    async def caller(i: int) -> None:
        nonlocal done
        n = 0
        while True:  # at least one call each: a stalled machine must not make a zero figure
            await call(i)
            n += 1
            if time.perf_counter() >= deadline:
                break
        done += n

    start = time.process_time()
    async with anyio.create_task_group() as tg:
        for i in range(callers):
            tg.start_soon(caller, i)
    return done / max(time.process_time() - start, 1e-9)


async def timed_tasks(count: int, task: Callable[[int], Coroutine[Any, Any, object]]) -> tuple[float, float]:
    """Run `task(0)` .. `task(count - 1)` at once until all end: (wall seconds, seconds of this
    thread's CPU, the event loop's)."""
    start, start_cpu = time.perf_counter(), time.thread_time()
    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(task, i)
    return time.perf_counter() - start, time.thread_time() - start_cpu


# ------------------------------------------------------------------------------------ machine


def _first_line_value(path: str, key: str) -> str | None:
    with contextlib.suppress(OSError), open(path, encoding="utf-8") as f:
        for line in f:
            name, sep, value = line.partition(":")
            if sep and name.strip() == key:
                return value.strip()
    return None


def machine() -> dict[str, Any]:
    """What the figures were measured on (Linux /proc where it exists)."""
    mem_kib = _first_line_value("/proc/meminfo", "MemTotal")
    usable: int | None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    return {
        "nproc": usable,
        "cpu_count": os.cpu_count(),
        "cpu_model": _first_line_value("/proc/cpuinfo", "model name") or platform.processor(),
        "memory_gib": round(int(mem_kib.split()[0]) / 2**20, 1) if mem_kib else None,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
    }


def rss_bytes() -> int:
    """This process's resident set size (VmRSS of /proc/self/status)."""
    value = _first_line_value("/proc/self/status", "VmRSS")
    assert value is not None, "VmRSS needs Linux /proc"
    return int(value.split()[0]) * 1024


def loop_backend() -> str:
    """The event loop running this task ("asyncio", "uvloop" or "trio")."""
    import asyncio

    try:
        module = type(asyncio.get_running_loop()).__module__
    except RuntimeError:
        return "trio"
    return "uvloop" if module.startswith("uvloop") else "asyncio"


@contextlib.contextmanager
def work_dir(settings: Settings, name: str) -> Any:
    """A fresh directory for one item, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix=f"lz-bench-{name}-", dir=settings.work_dir) as tmp:
        yield Path(tmp)


# ------------------------------------------------------------------------------------ daemon


@contextlib.asynccontextmanager
async def kafka_bench_daemon(
    data_dir: Path, *, kafka: bool = True, l1_every_pass: bool = True
) -> AsyncIterator[tuple[Daemon, Client]]:
    """The daemon the front-end items measure (9 Kafka, 15 CLI produce, 16 transactions), and a
    client of its HTTP API: local object store in `data_dir`, the daemon's defaults but
    `batcher.linger_ms` 5 (as the test helpers use) and no epoch bumper; HTTP on a loopback port,
    and the Kafka listener too with `kafka`. `l1_every_pass`: an L1 object every reconciler pass,
    so a round can start once the last one's data is reconciled (`wait_reconciled`), not 30 s
    later."""
    from levelzero.client import Client
    from levelzero.config import load_config
    from levelzero.daemon.service import running_daemon

    overrides: dict[tuple[str, str], object] = {
        ("storage", "data_dir"): str(data_dir),
        ("server", "listen"): "127.0.0.1:0",
        ("batcher", "linger_ms"): 5.0,
        ("node", "epoch_bump_interval_s"): 0.0,
    }
    if kafka:
        overrides["kafka", "listen"] = "127.0.0.1:0"
    if l1_every_pass:
        overrides["reconciler", "object_age_max_s"] = 0.0
    config = load_config(None, environ={}, overrides=overrides)
    async with running_daemon(config) as daemon, Client(daemon.url) as client:
        assert daemon.url is not None and daemon.node is not None
        assert (daemon.kafka_port is not None) == kafka
        yield daemon, client


async def wait_reconciled(node: Node) -> None:
    """Until `node` holds no unreconciled data, for a minute at most (SETTLE_STEPS_MAX steps of
    50 ms): a round starts after the previous round's copy, which would otherwise run inside it,
    on the CPUs its clients and the daemon share."""
    for _ in range(SETTLE_STEPS_MAX):
        if not any(a.state.has_unreconciled_data for a in node.partitions()):
            return
        await anyio.sleep(0.05)


# ------------------------------------------------------------------------------------ moto


@contextlib.asynccontextmanager
async def moto_server(log_dir: Path) -> AsyncIterator[str]:
    """moto's standalone S3 server as a subprocess; its URL (`levelzero.testing.moto.moto_process`, the one
    moto helper of the benchmarks and the tests: moto's own application, as `python -m
    moto.server` runs it, plus a setup endpoint that creates many objects at once). Started and
    stopped on a worker thread: the event loop keeps running meanwhile."""
    stack = contextlib.ExitStack()
    url = await anyio.to_thread.run_sync(lambda: stack.enter_context(moto_process(log_dir / "moto.log")))
    try:
        yield url
    finally:
        await anyio.to_thread.run_sync(stack.close)


@contextlib.contextmanager
def frozen_heap() -> Any:
    """What `levelzero run` does once its stores are open (`daemon.service.freeze_heap`): collect,
    then freeze what is left (the S3 clients' service models above all), so that a full
    collection in the middle of a measured round walks only what the round allocated. Unfrozen
    on the way out: the next item starts as before."""
    from levelzero.daemon.service import freeze_heap

    freeze_heap()
    try:
        yield
    finally:
        gc.unfreeze()


def s3_config(url: str, bucket: str, **overrides: Any):  # noqa: ANN201 - S3Config (lazy import)
    from levelzero.storage.s3_store import S3Config

    settings: dict[str, Any] = {
        "bucket": bucket,
        "endpoint_url": url,
        "path_style": True,
        "access_key": MOTO_ACCESS_KEY,
        "secret_key": MOTO_SECRET_KEY,
        "create_bucket": True,
    }
    settings.update(overrides)
    return S3Config(**settings)


@contextlib.asynccontextmanager
async def raw_s3_client(url: str) -> AsyncIterator[Any]:
    """A bare aiobotocore client: the floor the S3 adapter is measured against. Its settings
    are the adapter's for `s3_config(url, ...)` (`s3_store.client_config`: connection pool,
    retries, timeouts, path-style addressing), so a floor differs from the adapter only in
    what the adapter does around its requests. (Before, the floor's client had botocore's
    default retries and timeouts; measured alternating, that moved raw PUTs to moto by less
    than their spread.)"""
    from aiobotocore.session import get_session

    from levelzero.storage.s3_store import client_config, send_puts_without_continue

    async with get_session().create_client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=MOTO_ACCESS_KEY,
        aws_secret_access_key=MOTO_SECRET_KEY,
        config=client_config(s3_config(url, "levelzero-bench-raw")),
    ) as client:
        # A PUT goes without "Expect: 100-continue", as the adapter's do: botocore adds it to a
        # body it can read (bytes become a BytesIO), and the floor would wait a round trip the
        # adapter does not.
        send_puts_without_continue(client)
        yield client
