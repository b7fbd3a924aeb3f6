"""Compiling a module's kernels in parallel.

Planning walks the entry function in order and asks a backend for each kernel as it meets it;
the C backend's slow part is the C compiler, a subprocess per kernel (1.3-1.8 s for a 2-layer
model, one after the other). So while a plan is made, :func:`parallel_builds` is active, and a
backend hands its slow work to :func:`submit`: a thread pool runs the compilers side by side
(the GIL is free while a subprocess runs; the disk cache's file locks keep two threads from
building one key) and the backend gets a :class:`~concurrent.futures.Future`, which its
kernel resolves when first called. When the walk is over the Executable waits for every
future (:meth:`BuildPool.wait`); a build that failed there makes it plan again without the
pool, so the failure meets the ordinary fall-back path where it arises.

Outside :func:`parallel_builds`, :func:`submit` runs the work at once (a finished future).
While builds run, a progress line is drawn on a terminal (:mod:`dpl.runtime.progress`).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Callable, Iterator, TextIO

from dpl.runtime.progress import Progress

_ACTIVE: contextvars.ContextVar["BuildPool | None"] = contextvars.ContextVar("dpl_build_pool", default=None)


class BuildPool:
    def __init__(self, workers: int | None = None, progress: TextIO | None = None):
        self.workers = workers or os.cpu_count() or 1
        self._executor: ThreadPoolExecutor | None = None
        self.futures: list[Future] = []
        self._progress = Progress(None, progress, title="dpl: compiling kernels ")  # the total is known when the walk is over

    def submit(self, work: Callable[[], object], label: str = "") -> Future:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="dpl-build")
        self._progress.grow()
        future = self._executor.submit(work)
        future.add_done_callback(lambda _f: self._progress.step(label))
        self.futures.append(future)
        return future

    def wait(self) -> list[BaseException]:
        """Wait for every build (the walk is over: no more will come); the errors of those that failed."""
        self._progress.settle()
        wait(self.futures)
        return [f.exception() for f in self.futures if f.exception() is not None]

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        self._progress.finish()


@contextlib.contextmanager
def parallel_builds(workers: int | None = None, progress: TextIO | None = None) -> Iterator[BuildPool]:
    """Builds :func:`submit` gets in this context (this thread and what it calls) run on a pool."""
    pool = BuildPool(workers, progress)
    token = _ACTIVE.set(pool)
    try:
        yield pool
    finally:
        _ACTIVE.reset(token)
        pool.close()


@contextlib.contextmanager
def serial_builds() -> Iterator[None]:
    """Builds run at once, even inside :func:`parallel_builds`."""
    token = _ACTIVE.set(None)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def submit(work: Callable[[], object], label: str = "") -> Future:
    """Run ``work`` on the active pool, or now; either way its result is in the future."""
    pool = _ACTIVE.get()
    if pool is not None:
        return pool.submit(work, label)
    future: Future = Future()
    try:
        future.set_result(work())
    except BaseException as err:  # noqa: BLE001 - handed to whoever resolves the future
        future.set_exception(err)
    return future
