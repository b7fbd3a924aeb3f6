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

The protocol, for kernels that take part (others are left alone): ``kernel.thread_pools``, a
frozenset of pool names (:data:`OPENMP`, :data:`BLAS`), and for kernels that can run on fewer
threads ``kernel.with_threads(n)``, the same kernel capped at ``n`` threads.
"""

from __future__ import annotations

from typing import Callable, Iterable

OPENMP = "openmp"
BLAS = "blas"


def pools_of(kernel: Callable) -> frozenset[str]:
    return frozenset(getattr(kernel, "thread_pools", ()))


def one_pool_kernels(kernels: Iterable[Callable]) -> dict[int, Callable]:
    """Replacements (by ``id`` of the kernel) that keep a plan calling these kernels from mixing
    spinning pools: each OpenMP kernel capped at one thread when the kernels use several pools
    between them (a kernel that uses several pools itself counts); empty when they do not."""
    kernels = list(kernels)
    used = frozenset().union(*(pools_of(k) for k in kernels))
    if len(used) < 2:
        return {}
    return {id(k): k.with_threads(1) for k in kernels if OPENMP in pools_of(k) and hasattr(k, "with_threads")}
