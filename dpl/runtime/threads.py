"""Thread pools that spin, and plans that call more than one of them.

NumPy's BLAS (OpenBLAS, its own pthreads) and the OpenMP runtime of the generated C kernels each
keep a pool of worker threads that busy-wait for a while after every call, so that the next
call starts at once. Two such pools in one process, on a machine with as many threads as cores,
take turns badly: a kernel of one pool runs while the other pool's workers still spin on the
same cores and waits for the scheduler. Measured on the 2-core bench host: a 0.05 ms C kernel
right after a BLAS product took 3-5 ms, a 1.8 ms product right after a two-thread C kernel
30 ms, and the 2-layer Llama of ``bench/bench_models.py`` ran in 71 ms against 36 ms for the
sum of its kernels.

The rule the plan applies: when its steps use more than one pool, every OpenMP kernel runs on
the calling thread alone (a team of one starts no workers, so nothing spins against BLAS);
BLAS keeps every core, as the products are where such a plan spends its time. A plan that uses
one pool keeps it whole.

torch's products and convolutions (``CpuBackend(products="torch")``, or ``"auto"`` where torch
measures faster) run on torch's threads, and with the torch wheels for Linux those are the
kernels' OpenMP team itself: torch's ``libgomp.so.1`` and the one GCC's ``-fopenmp`` kernels
need are one library in the process, and MKL threads through it. Such a plan uses one pool
(:data:`OPENMP`), so its OpenMP kernels (flash attention, the parts between products) keep
every core. Where torch runs on another runtime its pool is :data:`TORCH`, a pool of its own.
dpl's own product routine (backends/cpu/packed_gemm.py) runs on the OpenMP team too: a plan whose
products all go there uses one pool, and two threads run it about twice as fast as one.

A thread budget (``dpl.build(..., threads=N)``) caps them all: every OpenMP kernel at ``N``
threads (one when the plan mixes pools, as above), and the BLAS and torch at ``N`` for the
duration of each call, through threadpoolctl's handle on the loaded BLAS library and
``torch.set_num_threads`` (:func:`budget_threads`, a couple of microseconds per call; never
environment variables, which a BLAS reads once at load). At ``N = 1`` nothing spins against
anything.

The protocol, for kernels that take part (others are left alone): ``kernel.thread_pools``, a
frozenset of pool names (:data:`OPENMP`, :data:`BLAS`), and for kernels that can run on fewer
threads ``kernel.with_threads(n)``, the same kernel capped at ``n`` threads.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Callable, Iterable, Iterator

OPENMP = "openmp"
BLAS = "blas"
TORCH = "torch"  # torch's intra-op threads, where they are not the kernels' OpenMP team (backends/cpu/blas.py)


def openmp_kernel(run: Callable, qualname: str, source: str, threads: int | None,
                  remake: Callable[[int | None], Callable]) -> Callable:
    """``run`` marked as an OpenMP kernel of the protocol above: its name and C source, the cap
    it was built with (None: the runtime's default team), and ``with_threads(n)`` giving the same
    kernel capped at ``n`` threads (``remake(n)``; itself where nothing changes)."""
    run.__qualname__ = qualname
    run.source = source  # type: ignore[attr-defined]
    run.threads = threads  # type: ignore[attr-defined]
    run.thread_pools = frozenset({OPENMP})  # type: ignore[attr-defined]
    run.with_threads = lambda n: run if n == threads else remake(n)  # type: ignore[attr-defined]
    return run


def available_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def pools_of(kernel: Callable) -> frozenset[str]:
    return frozenset(getattr(kernel, "thread_pools", ()))


def one_pool_kernels(kernels: Iterable[Callable], budget: int | None = None) -> dict[int, Callable]:
    """Replacements (by ``id`` of the kernel) that keep a plan calling these kernels from mixing
    spinning pools: each OpenMP kernel capped at one thread when the kernels use several pools
    between them (a kernel that uses several pools itself counts), else at ``budget`` threads
    (None: no cap); empty when nothing changes."""
    kernels = list(kernels)
    used = frozenset().union(*(pools_of(k) for k in kernels))
    cap = 1 if len(used) >= 2 else budget
    if cap is None:
        return {}
    return {id(k): k.with_threads(cap) for k in kernels if OPENMP in pools_of(k) and hasattr(k, "with_threads")}


_CONTROLLERS: list | None = None
_CONTROLLERS_SEEN = -1  # len(sys.modules) when the controllers were found
_CONTROLLERS_LOCK = threading.Lock()


def _blas_controllers() -> list:
    """threadpoolctl's controllers of the BLAS libraries loaded in this process, found again
    whenever modules were imported since (a BLAS comes with an extension module: torch's, SciPy's;
    one found only once left a BLAS loaded later uncapped)."""
    global _CONTROLLERS, _CONTROLLERS_SEEN
    with _CONTROLLERS_LOCK:
        if _CONTROLLERS is None or _CONTROLLERS_SEEN != len(sys.modules):
            from threadpoolctl import ThreadpoolController

            _CONTROLLERS_SEEN = len(sys.modules)
            _CONTROLLERS = list(ThreadpoolController().select(user_api="blas").lib_controllers)
        return _CONTROLLERS


@contextlib.contextmanager
def blas_threads(n: int | None) -> Iterator[None]:
    """The loaded BLAS libraries on at most ``n`` threads inside the block (None: unchanged);
    their settings are restored after. The setting is the process's: calls from several
    threads at once with different budgets see each other's caps."""
    if n is None:
        yield
        return
    saved = []
    for lib in _blas_controllers():
        before = lib.get_num_threads()
        if before is not None and before > n:
            lib.set_num_threads(n)
            saved.append((lib, before))
    try:
        yield
    finally:
        for lib, before in saved:
            lib.set_num_threads(before)


def budget_binds(n: int | None, pools: frozenset[str] | None = None) -> bool:
    """Whether :func:`budget_threads` with these arguments could change a setting: a BLAS a step
    may use (``pools`` None or naming it), or torch's threads above ``n``. Where it could not,
    a call skips the context managers (about 2 us, part of every small call's Python)."""
    if n is None:
        return False
    if pools is None or BLAS in pools:
        return True
    torch = sys.modules.get("torch")
    return torch is not None and torch.get_num_threads() > n


@contextlib.contextmanager
def budget_threads(n: int | None, pools: frozenset[str] | None = None) -> Iterator[None]:
    """A plan's thread budget for one call: the loaded BLAS libraries (:func:`blas_threads`) and,
    when torch is loaded, torch's intra-op threads (which its MKL products and oneDNN
    convolutions use; an OpenMP cap alone does not bind MKL, whose own setting wins: measured)
    on at most ``n`` threads; restored after. ``torch.set_num_threads`` costs about 0.1 us;
    capping and restoring a BLAS through threadpoolctl about 10 us, so ``pools``, the pools a
    plan's steps declare (None: not known, every pool capped), leaves alone a BLAS no step uses."""
    torch = sys.modules.get("torch") if n is not None else None
    before = torch.get_num_threads() if torch is not None else None
    if before is not None and before > n:
        torch.set_num_threads(n)
    try:
        with blas_threads(n if pools is None or BLAS in pools else None):
            yield
    finally:
        if before is not None and before > n:
            torch.set_num_threads(before)
