"""A deterministic asyncio event loop: virtual time and a seeded choice among ready callbacks.

The actors are anyio code on the asyncio backend, so the simulation runs them on an asyncio
loop whose sources of nondeterminism are replaced:

- **time**: `time()` is a virtual clock that starts at 0 and moves only when nothing is ready,
  jumping straight to the next timer. Minutes of virtual time run in milliseconds, and
  `anyio.current_time()`, `anyio.sleep()` and `move_on_after()` all follow it.
- **order**: each turn runs *one* ready callback, picked by a seeded `random.Random` among all
  that are ready. One seed is one interleaving; the same seed replays it exactly.
- **memory addresses**: anyio keeps tasks in sets and cancels them in set order, which follows
  `id()` and so differs between processes. The ready callbacks are therefore put in a canonical
  order before the seeded pick: by the creation number of the task they belong to (tasks are
  made by this loop's factory, numbered as they are created), then by when they became ready.
  That order is not enough on its own: which tasks a cancel scope reaches in one delivery, and
  so which callbacks become ready when, follows the order its sets iterate in. So tasks, and
  anyio's cancel scopes while a simulation runs, hash by their creation number, not by address
  (by address, the same seed ran one callback more or less in another process, or in the same
  one after other runs).

There is no selector: the simulated world does no I/O (memory stores only). When nothing is
ready, no timer is left and the loop was not stopped, the world is deadlocked and `Deadlock` is
raised (a real finding: something waits for an event nobody will ever set).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import contextvars
import heapq
import itertools
import random
from collections.abc import Callable, Coroutine, Iterator
from contextvars import Context
from typing import Any, TypeVar, TypeVarTuple, Unpack

from anyio._backends import _asyncio as anyio_asyncio
import anyio.lowlevel as anyio_lowlevel
from anyio._core import _eventloop as anyio_eventloop
from anyio._core import _synchronization as anyio_synchronization
from anyio._core import _tasks as anyio_tasks

T = TypeVar("T")
_Ts = TypeVarTuple("_Ts")

# Cancelled timers are dropped lazily from the heap's top; past this many (and half the heap),
# the heap is rebuilt without them, as asyncio's own loop does.
CANCELLED_TIMERS_REBUILD_AT = 100
# Ready callbacks that belong to no task sort after every task's (creation numbers are below).
NO_TASK = 1 << 62


# Callbacks run at one virtual instant before the loop calls it a livelock: tasks that keep one
# another ready forever (a busy-wait) never let the clock reach the next timer, and a seed would
# spin without end. A seed's busiest instant takes a few hundred (571 over seeds 0..99).
LIVELOCK_CALLBACKS = 200_000


class Deadlock(RuntimeError):
    """Nothing is ready, no timer is scheduled, and the loop was not stopped."""


class Livelock(Deadlock):
    """Callbacks keep running at one virtual instant (`LIVELOCK_CALLBACKS` of them): the clock
    cannot move on, so nothing waiting for a timer ever runs again."""


class SimTask(asyncio.Task):
    """An asyncio task that knows its creation number on its loop (its canonical rank), and
    hashes by it: anyio's sets of tasks iterate in an order the seed decides, not the heap's."""

    # Set by the loop's factory once the task is made: the task's first step, scheduled while it
    # is made, still sorts with the callbacks of no task.
    sim_rank: int = NO_TASK

    def __init__(self, coro: Any, *, loop: asyncio.AbstractEventLoop, hash_key: int, **kwargs: Any) -> None:
        self._hash_key = hash_key  # before Task.__init__, which adds the task to a WeakSet
        super().__init__(coro, loop=loop, **kwargs)

    def __hash__(self) -> int:
        return self._hash_key


class _Handle(asyncio.Handle):
    """A ready callback of this loop: asyncio's Handle, made without its debug-mode branch (the
    loop never runs in debug mode)."""

    __slots__ = ()

    def __init__(self, callback: Callable[..., Any], args: Any, loop: Any, context: Any) -> None:
        self._context = context if context is not None else contextvars.copy_context()
        self._loop = loop
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._repr = None
        self._source_traceback = None


class _Timer(asyncio.TimerHandle):
    """A timer of this loop's heap, made as `_Handle` is. The heap holds nothing else, so it
    compares by `_when` alone without asyncio's type check: the same comparisons, so the same
    heap order, as TimerHandle's."""

    __slots__ = ()

    def __init__(self, when: float, callback: Callable[..., Any], args: Any, loop: Any, context: Any) -> None:
        self._context = context if context is not None else contextvars.copy_context()
        self._loop = loop
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._repr = None
        self._source_traceback = None
        self._when = when
        self._scheduled = False

    def __lt__(self, other: Any) -> bool:
        return bool(self._when < other._when)


class DeterministicLoop(asyncio.BaseEventLoop):
    """An asyncio loop for simulation: virtual `time()`, one seeded ready callback per turn."""

    # BaseEventLoop's own state, which `_run_once` below takes over (the stubs leave it out);
    # its timers are asyncio.TimerHandles, whose private fields (_when, _scheduled, _callback,
    # _cancelled) the stubs leave out too.
    _scheduled: list[Any]
    _timer_cancelled_count: int
    _stopping: bool
    _closed: bool

    def __init__(self, rng: random.Random, *, start_s: float = 0.0) -> None:
        super().__init__()
        self._rng = rng
        self._randbelow: Callable[[int], int] = rng._randbelow  # type: ignore[attr-defined]
        self._virtual_now = start_s
        self._ready_seq = itertools.count()
        self._task_ranks = itertools.count()
        # (owner task's rank, readiness sequence, handle); `_ready` stays empty.
        self._runnable: list[tuple[int, int, asyncio.Handle]] = []
        self.callbacks_run = 0
        self._livelock_after = LIVELOCK_CALLBACKS  # `callbacks_run` bound until the clock moves
        self.set_task_factory(self._new_task)

    def _new_task(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> SimTask:
        rank = next(self._task_ranks)
        task = SimTask(coro, loop=loop, hash_key=rank, **kwargs)
        task.sim_rank = rank
        return task

    # -- what BaseEventLoop leaves to subclasses (there is no selector and no self-pipe)

    def time(self) -> float:
        return self._virtual_now

    def _write_to_self(self) -> None:
        pass  # single-threaded: nobody needs waking

    def _process_events(self, event_list: list[Any]) -> None:
        assert not event_list

    # The scheduling calls, without BaseEventLoop's layers for debug mode and threads (a
    # simulation runs neither); the same handles, in the same order.

    def call_soon(
        self, callback: Callable[[Unpack[_Ts]], object], *args: Unpack[_Ts], context: Context | None = None
    ) -> asyncio.Handle:
        if self._closed:
            raise RuntimeError("Event loop is closed")
        handle = _Handle(callback, args, self, context)
        self._make_runnable(callback, handle)
        return handle

    def _call_soon(self, callback: Callable[..., Any], args: Any, context: Any) -> asyncio.Handle:
        handle = _Handle(callback, args, self, context)
        self._make_runnable(callback, handle)
        return handle

    def call_at(
        self,
        when: float,
        callback: Callable[[Unpack[_Ts]], object],
        *args: Unpack[_Ts],
        context: Context | None = None,
    ) -> asyncio.TimerHandle:
        if when is None:
            raise TypeError("when cannot be None")
        if self._closed:
            raise RuntimeError("Event loop is closed")
        timer = _Timer(when, callback, args, self, context)
        heapq.heappush(self._scheduled, timer)
        timer._scheduled = True
        return timer

    def call_later(
        self,
        delay: float,
        callback: Callable[[Unpack[_Ts]], object],
        *args: Unpack[_Ts],
        context: Context | None = None,
    ) -> asyncio.TimerHandle:
        if delay is None:
            raise TypeError("delay must not be None")
        return self.call_at(self._virtual_now + delay, callback, *args, context=context)

    def _make_runnable(self, callback: Callable[..., Any], handle: asyncio.Handle) -> None:
        """Add `handle` to the ready callbacks, kept in canonical order (the owner's rank, then
        readiness): a turn picks by index without sorting. Readiness numbers only grow, so a
        callback of a rank at or above the last one's goes at the end. (A task's steps are its
        bound methods: their owner is the task.)"""
        owner = getattr(callback, "__self__", None)
        rank = owner.sim_rank if type(owner) is SimTask else NO_TASK
        item = (rank, next(self._ready_seq), handle)
        runnable = self._runnable
        if not runnable or rank >= runnable[-1][0]:
            runnable.append(item)
        else:  # (rank, readiness) pairs are unique: the handles are never compared
            bisect.insort(runnable, item)

    def close(self) -> None:
        self._runnable.clear()
        super().close()

    # -- the turn

    def _run_once(self) -> None:
        """Turns until the loop is told to stop (run_forever's own loop calls this once per
        iteration and checks `_stopping` after it: the same turns, one call less each)."""
        scheduled = self._scheduled
        runnable = self._runnable
        randbelow = self._randbelow
        heappop = heapq.heappop
        while True:
            if (
                self._timer_cancelled_count > CANCELLED_TIMERS_REBUILD_AT
                and self._timer_cancelled_count * 2 > len(scheduled)
            ):
                live = []
                for timer in scheduled:
                    if timer._cancelled:
                        timer._scheduled = False
                    else:
                        live.append(timer)
                heapq.heapify(live)
                self._scheduled = scheduled = live
                self._timer_cancelled_count = 0
            while scheduled and scheduled[0]._cancelled:
                timer = heappop(scheduled)
                timer._scheduled = False
                self._timer_cancelled_count -= 1
            if not runnable:
                if not scheduled:
                    if self._stopping:
                        return
                    raise Deadlock(f"nothing ready and no timer at virtual time {self._virtual_now:.6f}s")
                when = scheduled[0]._when
                if when > self._virtual_now:
                    self._virtual_now = when  # the clock jumps to the next timer
                    self._livelock_after = self.callbacks_run + LIVELOCK_CALLBACKS
            now = self._virtual_now
            while scheduled and scheduled[0]._when <= now:
                timer = heappop(scheduled)
                timer._scheduled = False
                if timer._cancelled:
                    self._timer_cancelled_count -= 1
                    continue
                self._make_runnable(timer._callback, timer)
            count = len(runnable)
            if count:
                # (in canonical order already: no sort; `randrange(count)` is
                # `_randbelow(count)`, the same draws with one call less)
                handle = runnable.pop()[2] if count == 1 else runnable.pop(randbelow(count))[2]
                if not handle._cancelled:
                    self.callbacks_run += 1
                    if self.callbacks_run > self._livelock_after:
                        raise Livelock(
                            f"{LIVELOCK_CALLBACKS} callbacks at virtual time {self._virtual_now:.6f}s "
                            f"without the clock moving on (the last: {handle!r})"
                        )
                    handle._run()
            if self._stopping:
                return


def run_deterministic(
    main: Coroutine[Any, Any, T], rng: random.Random, *, loop: DeterministicLoop | None = None
) -> T:
    """Run `main` to completion on a fresh deterministic loop (or `loop`) and close the loop."""
    loop = loop if loop is not None else DeterministicLoop(rng)
    asyncio.set_event_loop(loop)
    with _cancel_scopes_hashed_by_creation(), _asyncio_known(), _current_task_of(loop):
        try:
            return loop.run_until_complete(main)
        finally:
            try:
                _cancel_leftovers(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                asyncio.set_event_loop(None)
                loop.close()


@contextlib.contextmanager
def _asyncio_known() -> Iterator[None]:
    """anyio asks which library runs the loop at every sleep, checkpoint, cancel scope and
    event (`current_async_library`: an import statement and a look-up of the running loop, or
    sniffio's): a simulation runs on asyncio alone, so while it runs a thread running a loop
    is told asyncio at once."""
    module = anyio_eventloop
    original = module.current_async_library
    original_backend = module.get_async_backend
    running_loop = asyncio.events._get_running_loop
    backend = anyio_asyncio.backend_class

    def asyncio_library() -> str | None:
        # (another thread's answer stays its own: asyncio's, or none without a loop)
        return "asyncio" if running_loop() is not None else original()

    def asyncio_backend(asynclib_name: str | None = None) -> Any:
        # (the backend every anyio call asks for first: the same class, without asking the
        # library's name and looking it up)
        if asynclib_name is None and running_loop() is not None:
            return backend
        return original_backend(asynclib_name)

    # (the modules a simulation's anyio calls go through that took `get_async_backend` in at
    # their import)
    backend_users = [module, anyio_tasks, anyio_synchronization, anyio_lowlevel]
    assert all(m.get_async_backend is original_backend for m in backend_users)
    setattr(module, "current_async_library", asyncio_library)  # noqa: B010 - see above
    for user in backend_users:
        setattr(user, "get_async_backend", asyncio_backend)  # noqa: B010 - see above
    try:
        yield
    finally:
        setattr(module, "current_async_library", original)  # noqa: B010 - see above
        for user in backend_users:
            setattr(user, "get_async_backend", original_backend)  # noqa: B010 - see above


@contextlib.contextmanager
def _current_task_of(loop: DeterministicLoop) -> Iterator[None]:
    """anyio's asyncio backend asks `asyncio.current_task()` at every cancel scope, checkpoint
    and spawn; in Python 3.11 that is a Python function that looks the running loop up first.
    While a simulation runs, its thread's loop is known: the same answer from asyncio's own
    table (another thread, running a loop of its own or none, is answered as before)."""
    module = anyio_asyncio
    original = module.current_task
    current_tasks = asyncio.tasks._current_tasks  # type: ignore[attr-defined]
    running_loop = asyncio.events._get_running_loop

    def current_task(of: asyncio.AbstractEventLoop | None = None) -> asyncio.Task[Any] | None:
        if of is None and running_loop() is loop:
            task: asyncio.Task[Any] | None = current_tasks.get(loop)
            return task
        return original(of)  # another thread's loop, or none

    setattr(module, "current_task", current_task)  # noqa: B010 - see above
    try:
        yield
    finally:
        setattr(module, "current_task", original)  # noqa: B010 - see above


@contextlib.contextmanager
def _cancel_scopes_hashed_by_creation() -> Iterator[None]:
    """anyio's asyncio cancel scope keeps its child scopes in a set and delivers a cancellation
    to them in that set's order; meanwhile a scope hashes by its creation number. (Its class
    has __slots__: the numbers are kept by address, set as each scope is made, so an address
    reused by a later scope gets that scope's number.)"""
    scope_class = anyio_asyncio.CancelScope
    numbers: dict[int, int] = {}
    counter = itertools.count()
    original_init = scope_class.__init__

    def numbered_init(self: anyio_asyncio.CancelScope, *args: Any, **kwargs: Any) -> None:
        numbers[id(self)] = next(counter)
        original_init(self, *args, **kwargs)

    def hash_by_number(self: anyio_asyncio.CancelScope) -> int:
        number = numbers.get(id(self))
        return object.__hash__(self) if number is None else number  # made before the run

    assert "__hash__" not in vars(scope_class), "anyio's cancel scope hashes itself now"
    # setattr: mypy refuses assignments to methods, which this is for the run's length.
    setattr(scope_class, "__init__", numbered_init)  # noqa: B010 - see above
    setattr(scope_class, "__hash__", hash_by_number)  # noqa: B010 - see above
    try:
        yield
    finally:
        setattr(scope_class, "__init__", original_init)  # noqa: B010 - see above
        delattr(scope_class, "__hash__")


def _cancel_leftovers(loop: DeterministicLoop) -> None:
    tasks = sorted(
        (t for t in asyncio.all_tasks(loop) if not t.done()),
        key=lambda t: getattr(t, "sim_rank", NO_TASK),
    )
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
