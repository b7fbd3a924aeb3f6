"""How far a model's time is from this machine's arithmetic floor: the float32 multiply-adds of
its products and convolutions at the CPU's measured fused-multiply-add peak.

    python bench/roofline.py            # the peak at 1 and 2 threads

``fma_peak(threads)`` times a C probe compiled as the CPU backend compiles every kernel (its
cache, its compiler, ``-O3 -march=native -fopenmp``): each thread runs independent chains of
vector fused multiply-adds (GCC's vector types, as wide as the routine of
``backends/cpu/packed_gemm.py``: 16 lanes on AVX-512), enough chains to cover the unit's latency,
so its rate is what the vector units can issue. ``product_flops(mod)`` counts what a module's
products and convolutions compute as written (two flops a multiply-add; attention's score and
value products over every key, masked or not, as torch's kernels compute them).

``floor = product_flops / peak`` is a time no implementation of the same arithmetic can beat on
this machine; ``flops / time`` over the peak is the share of the machine a run used. On the
2-core AVX-512 bench host (AMD EPYC, Zen 4 family 25 model 17), one thread: 115-117 GFLOP/s
(one 512-bit FMA a cycle at about 3.6 GHz, two cores twice that). On the 2-core Intel Xeon
(AVX-512 with two 512-bit FMA units, AMX), CPU time at load 4-5: 225-235 GFLOP/s for an AVX-512
build, 113-128 for an AVX2 one (``KernelCache(march="haswell")``). dpl's packed products run at
88-93% of it on one shape called again and again (1024 x 256 by 256 x 768: 103-106 GFLOP/s),
85-88% through a decoder's eight products in turn (97-101), as in a model.

``bench_zoo.py`` prints each row against this floor (the peak of N threads taken as N times one
core's: a probe of several threads on a shared host also measures the other processes).
"""

from __future__ import annotations

import argparse
import ctypes
import math
import sys
import time
from pathlib import Path

# what a ``-march`` build other than this CPU's runs beside, as on a host of that instruction set:
# OpenBLAS's, MKL's and oneDNN's kernels (NumPy's and torch's products, torch's convolutions, dpl's
# convolutions by torch) held to it. ONNX Runtime's and OpenVINO's products (MLAS, chosen by the
# CPU's own flags) are not: on an AVX-512 host they keep AVX-512. OpenVINO 2026.4 under
# ONEDNN_MAX_CPU_ISA=AVX2 computed wrong outputs for BERT, GPT-2, ViT and ResNet on the bench host
# (max err 2.8-4.2; bench_zoo's `!` keeps it out of dpl/peer)
MARCH_LIBRARIES = {"haswell": {"OPENBLAS_CORETYPE": "Haswell", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}

PROBE = r"""
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__)
enum { VL = 16 };
#elif defined(__AVX__)
enum { VL = 8 };
#else
enum { VL = 4 };
#endif
enum { CHAINS = 12 };
typedef float vf __attribute__((vector_size(VL * sizeof(float))));

/* flops one call of dpl_kernel(iters, .) does per thread */
int64_t dpl_flops_per_iter(void) { return 2 * CHAINS * VL; }

/* `iters` steps of CHAINS independent multiply-add chains on each of `threads` threads; the
   sum of the lanes, so that nothing is left out */
double dpl_kernel(int64_t iters, int threads) {
  double total = 0;
  #pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    vf c[CHAINS], m, a;
    for (int j = 0; j < VL; j++) { m[j] = 1.0f - 1e-7f; a[j] = 1e-7f; }
    for (int i = 0; i < CHAINS; i++)
      for (int j = 0; j < VL; j++) c[i][j] = (float)(i + j);
    for (int64_t n = 0; n < iters; n++)
      for (int i = 0; i < CHAINS; i++) c[i] = c[i] * m + a;
    for (int i = 0; i < CHAINS; i++)
      for (int j = 0; j < VL; j++) total += c[i][j];
  }
  return total;
}
"""


def fma_peak(threads: int = 1, cache=None, seconds: float = 0.05, tries: int = 7) -> float:
    """float32 flops a second that ``threads`` threads can issue on this machine (the best of
    ``tries`` calls of about ``seconds`` each), for the instruction set ``cache`` builds for
    (its ``march``). One thread is timed in its CPU time: the probe runs on the calling thread,
    and on a loaded host wall time counts the other processes' turns (at load 4 on the 2-core
    Xeon, calls of 30 ms measured 140 GFLOP/s by the wall clock, 212 by CPU time)."""
    if cache is None:
        from dpl.backends.cpu.backend import KernelCache
        cache = KernelCache()
    lib = cache.load(PROBE)
    clock = time.thread_time if threads == 1 else time.perf_counter
    run, per_iter = lib.dpl_kernel, lib.dpl_flops_per_iter
    run.restype, run.argtypes = ctypes.c_double, [ctypes.c_int64, ctypes.c_int]
    per_iter.restype = ctypes.c_int64
    iters = 1 << 16
    while True:  # enough iterations for a call of about `seconds`
        start = clock()
        run(iters, threads)
        took = clock() - start
        if took >= seconds / 4:
            break
        iters *= 4
    iters = max(1, int(iters * seconds / took))
    best = math.inf
    for _ in range(tries):
        start = clock()
        run(iters, threads)
        best = min(best, clock() - start)
    return iters * per_iter() * threads / best


def product_flops(mod) -> int:
    """Two flops for each multiply-add of ``mod``'s matrix products and 2-D convolutions (every
    function of it, each binding once), as written."""
    from dpl.ir.expr import Call

    total = 0
    for fn in mod.functions.values():
        for binding in fn.bindings:
            call = binding.value
            if not isinstance(call, Call) or not isinstance(call.op, str):
                continue
            shape = getattr(binding.var.ty, "shape", None)  # tuples and other non-tensors: no products
            if shape is None or not all(isinstance(d, int) for d in shape):
                continue
            if call.op == "matmul":
                k = call.args[0].ty.shape[-1]
                total += 2 * math.prod(shape) * k if isinstance(k, int) else 0
            elif call.op == "nn.conv2d":  # OIHW weights: every output sums I/groups x kh x kw products
                taps = call.args[1].ty.shape[1:]
                total += 2 * math.prod(shape) * math.prod(taps) if all(isinstance(d, int) for d in taps) else 0
    return total


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    for threads in (1, 2):
        print(f"float32 FMA peak at {threads} thread(s): {fma_peak(threads) / 1e9:.1f} GFLOP/s")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
