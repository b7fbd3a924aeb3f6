"""dpl's products providers and thread counts against torch, interleaved in one process.

    python bench/bench_products.py                          # cnn gpt2 llama128, auto vs numpy, 1 and 2 threads
    python bench/bench_products.py cnn --products auto,torch --threads 1 --compile
    python bench/bench_products.py --isa native,haswell      # the packed routine per instruction set

Each workload of ``bench_models.py`` is built with ``["rewrites", "llm"]`` once per products
provider (``CpuBackend(products=...)``) and thread budget (``dpl.build(..., threads=N)``),
checked against torch eager, then every contender (and torch eager / torch.compile at the same
thread counts) runs once per round, the rounds interleaved. Two columns: the median wall time,
and the median CPU time of the calling thread, which at one thread is all the work (every
library runs on the caller) and, unlike wall time, is not inflated by other processes on a
shared machine; at two threads only wall time says anything. The load average is printed
before and after: on the shared 2-core bench host two-thread wall times at a load of 7-12 were
3-40x the one-thread times for every contender, torch included.

``--isa`` (issue 30): the packed routine (:mod:`dpl.backends.cpu.packed_gemm`) at the zoo's
product shapes (1x128 and 8x128 tokens by the tiny zoo's, bench_zoo's hidden-256 and BERT-base's
weights), one thread, built once per ``-march`` (``native``: this CPU's instruction sets;
``haswell``: AVX2 and FMA only, as on a Zen 3), each in a child process beside NumPy's OpenBLAS
and torch's MKL (a ``haswell`` child restricted to their AVX2 kernels: ``OPENBLAS_CORETYPE``,
``MKL_ENABLE_INSTRUCTIONS``), as a share of that build's FMA peak (bench/roofline.py, CPU time).
On the 2-core Intel Xeon (AVX-512 with two 512-bit FMA units, AMX), load 3.2-3.5, three runs of
9 rounds, % of the peak (AVX-512 235-239 GFLOP/s, AVX2 127-130); "before": the routine as it was
(the same 6 x 64 and 6 x 16 tiles on NumPy's 16-byte-offset panels, no row groups, K-blocks of
256), one run at load 4.6, against the same peaks:

        m x k x n   AVX-512 build: before  packed  OpenBLAS  torch    AVX2 build: before  packed  OpenBLAS  torch
       128x64x192       40     55-58       53    72-73              57     67-69    72-75    79-85
       128x64x256       44     55-58    52-55    64-74              56     67-71    74-75    81-85
       128x128x64       42     44-56    45-50    53-71              57     66-68    71-74    76-81
      128x256x768       54     65-76    56-67    69-73              74     79-84    79-83    83-88
      128x256x256       52     64-74    56-63    63-83              77     81-86    79-83    84-88
     128x256x1024       50     66-74    55-62    61-70              68     78-84    75-81    79-85
      128x512x256       54     72-79    59-64    67-81              75     83-88    80-84    86-88
     128x768x3072       43     64-67    58-60    45-48              60     74-77    79-82    77-82
     128x3072x768       48     68-73       59       70              63     76-77    80-83    80-83
      1024x64x192       55     70-73    59-62    73-81              68     72-75    76-80    83-88
      1024x64x256       54     68-72    60-61    74-79              60     71-76    77-81    82-87
      1024x128x64       56     69-73    58-60    70-77              74     77-80    75-79    83-87
     1024x256x768       57     74-81    70-78    77-88              65     84-89    84-87    89-92
     1024x256x256       52     69-79    62-74    71-81              69     82-88    83-88    83-88
    1024x256x1024       56     71-75    67-71    72-79              64     83-88    83-86    86-92
     1024x512x256       49     74-79    62-68    69-74              64     86-90    83-87    80-86
    1024x768x3072       43     70-71    70-71    78-80              50     79-83    86-89    86-90
    1024x3072x768       56     70-74    66-68    75-79              50     79-83    83-88    86-89

The AVX2 build reaches 74-90% at K >= 256 (its micro-kernel was 6 x 16 already: aligned panels,
row groups of 128, the result's lines prefetched for writing and K-blocks of 512 did it), level
with OpenBLAS's Haswell kernels and a few points under MKL's AVX2 ones; the AVX-512 build 64-81%
there, ahead of OpenBLAS, about level with MKL, short of 80% on most shapes: its 6 x 64 tile runs
at 83% with every operand in L1 and L2 (120 x 128 by 128 x 128 in C, no Python between calls),
so the rest is the memory hierarchy. At K = 64-128 both pay each call's fixed costs (a product
of 3 MFLOP takes 15-25 us, a few of them Python's).

Stop 43 (a thread walks a panel's K-blocks with its part of C near; the first tiles of each
block fetch the next into L2), same host, load 0.5, 9 rounds, the AVX-512 build at K >= 256,
before -> after: 128 rows 69-83 -> 72-83% (128x256x768 70 -> 83), 1024 rows 70-78 -> 74-84%
(1024x256x1024 73 -> 84, 1024x512x256 77 -> 83); the AVX2 build 82-90%, as before. A model
meets its weights from L3, which this bench (its weights in L2 from call to call) does not
show: there, in C, 128x256x1024 with 16 weights in turn ran at 70-76% of the peak before and
76-83% after (the medians of three interleaved runs each).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import bench_models as bm  # noqa: E402  (its models and inputs; it imports torch)

import dpl  # noqa: E402
from dpl.backends.cpu.backend import CpuBackend  # noqa: E402

torch = bm.torch


def contenders(key, providers, threads, compile_too, cache_dir):
    """name -> (thread count, fn) for one workload; the dpl ones checked against torch eager."""
    _, make_model, make_inputs = bm.workloads()[key]
    torch.manual_seed(0)
    model, args = make_model().eval(), make_inputs()
    with torch.no_grad():
        expected = model(*args).numpy()
    inputs = [a.numpy() for a in args]
    fused = dpl.apply(dpl.from_torch(model, args), bm.LLM)
    found = {}
    for products in providers:
        for n in threads:
            exe = dpl.build(fused, [CpuBackend(cache_dir=cache_dir, products=products), "numpy"], threads=n)
            out = np.empty(expected.shape, expected.dtype)
            exe(*inputs, out=out)
            np.testing.assert_allclose(out, expected, rtol=2e-4, atol=2e-4, err_msg=f"{key} products={products} differs")
            found[f"dpl {products} t{n}"] = (n, lambda exe=exe, out=out: exe(*inputs, out=out))
    for n in threads:
        found[f"torch eager t{n}"] = (n, lambda: model(*args))
    if compile_too:
        compiled = torch.compile(model)
        with torch.no_grad():
            compiled(*args)
        for n in threads:
            found[f"torch.compile t{n}"] = (n, lambda: compiled(*args))
    return found


def interleaved(found, rounds):
    """name -> (wall ms, caller-thread CPU ms), medians over interleaved rounds."""
    wall = {k: [] for k in found}
    cpu = {k: [] for k in found}
    cores = os.cpu_count() or 1
    with torch.no_grad():
        for _ in range(2):  # warm
            for k, (n, fn) in found.items():
                torch.set_num_threads(n if k.startswith("torch") else cores)
                fn()
        for _ in range(rounds):
            for k, (n, fn) in found.items():
                torch.set_num_threads(n if k.startswith("torch") else cores)  # dpl: its budget sets torch's
                c, t = time.thread_time(), time.perf_counter()
                fn()
                wall[k].append(time.perf_counter() - t)
                cpu[k].append(time.thread_time() - c)
    torch.set_num_threads(cores)
    return {k: (float(np.median(wall[k])) * 1e3, float(np.median(cpu[k])) * 1e3) for k in found}


# the products of the zoo's models, (k, n) of each weight: the tiny zoo's (hidden 64), bench_zoo's
# default sizes (hidden 256: q/k/v, o, gate and up merged, down) and BERT-base's MLP (768 / 3072)
ISA_SHAPES = ((64, 192), (64, 256), (128, 64), (256, 768), (256, 256), (256, 1024), (512, 256), (768, 3072), (3072, 768))
ISA_ROWS = (128, 1024)  # 1x128 and 8x128 tokens


def isa_rows(march, rounds):
    """Rows of (m, k, n, packed, OpenBLAS, torch GFLOP/s) for the packed routine built with
    ``-march=march``, one thread, and the FMA peak of that build: medians of ``rounds``
    interleaved rounds of the calling thread's CPU time, each sample >= 5 ms of calls."""
    from threadpoolctl import threadpool_limits

    from roofline import fma_peak
    from dpl.backends.cpu import packed_gemm
    from dpl.backends.cpu.toolchain import KernelCache
    from dpl.ir.expr import Call, Constant, Var
    from dpl.ir.types import TensorType

    with tempfile.TemporaryDirectory() as cache_dir:
        cache = KernelCache(cache_dir, march=march)
        peak = fma_peak(1, cache)
        routine = packed_gemm.Routine(cache.load(packed_gemm.source(cache.vector_math())))
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    rows = []
    with threadpool_limits(1):
        for m in ISA_ROWS:
            for k, n in ISA_SHAPES:
                a, w = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
                out = np.empty((m, n), np.float32)
                call = Call("matmul", (Var("a", TensorType((m, k), "float32")), Constant(w)), {}, TensorType((m, n), "float32"))
                packed = packed_gemm.runner(call, routine, 1)
                ta, tw, tout = torch.from_numpy(a), torch.from_numpy(w), torch.from_numpy(out)
                fns = [lambda: packed(a, w, out), lambda: np.matmul(a, w, out=out), lambda: torch.matmul(ta, tw, out=tout)]
                packed(a, w, out)
                np.testing.assert_allclose(out, a @ w, rtol=1e-4, atol=1e-3 * k ** 0.5)
                seconds = _cpu_medians(fns, rounds)
                rows.append((m, k, n, *(2 * m * k * n / t / 1e9 for t in seconds)))
    return peak / 1e9, rows


def _cpu_medians(fns, rounds):
    """Each of ``fns``' median CPU seconds a call, over ``rounds`` interleaved samples."""
    reps = []
    for fn in fns:  # warm, and enough calls for a sample of >= 5 ms
        fn()
        start = time.thread_time()
        fn()
        reps.append(max(1, int(0.005 / max(time.thread_time() - start, 1e-6))))
    samples = [[] for _ in fns]
    for _ in range(rounds):
        for fn, n, got in zip(fns, reps, samples):
            start = time.thread_time()
            for _ in range(n):
                fn()
            got.append((time.thread_time() - start) / n)
    return [float(np.median(s)) for s in samples]


def isa_table(marchs, rounds):
    """Each ``-march`` build's rows, each run in a child process (a ``haswell`` one beside
    OpenBLAS's and MKL's AVX2 kernels), printed side by side as % of that build's FMA peak."""
    from roofline import MARCH_LIBRARIES

    from dpl.host_cpu import describe

    results = {}
    for march in marchs:
        env = {**os.environ, **MARCH_LIBRARIES.get(march, {})}
        child = subprocess.run([sys.executable, __file__, "--isa-child", march, "--rounds", str(rounds)], env=env,
                               capture_output=True, text=True)
        if child.returncode != 0:  # an unknown -march, or one this CPU cannot run
            raise SystemExit(f"bench_products: the -march={march} build did not run here (exit {child.returncode}):\n"
                             f"{child.stderr.strip()[-1500:]}")
        results[march] = json.loads(child.stdout.splitlines()[-1])
    print(f"{describe()}; load average {os.getloadavg()[0]:.2f}; one thread, CPU time, medians of {rounds} rounds")
    print("GFLOP/s (% of the build's FMA peak): the packed routine, OpenBLAS, torch")
    head = "".join(f" | {march + f' (peak {results[march][0]:.0f})':^44}" for march in marchs)
    print(f"{'m x k x n':>16}{head}")
    for i, (m, k, n, *_) in enumerate(results[marchs[0]][1]):
        cells = ""
        for march in marchs:
            peak, rows = results[march]
            cells += " | " + "  ".join(f"{g:5.1f} ({100 * g / peak:3.0f}%)" for g in rows[i][3:])
        print(f"{f'{m}x{k}x{n}':>16}{cells}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", default=["cnn", "gpt2", "llama128"])
    parser.add_argument("--products", default="auto,numpy", help="comma-separated CpuBackend(products=...) values")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--compile", action="store_true", help="also torch.compile (a minute or two)")
    parser.add_argument("--isa", help="comma-separated -march values (native,haswell): the packed routine's "
                                      "products at the zoo's shapes per build, as %% of its FMA peak")
    parser.add_argument("--isa-child", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.isa_child:
        print(json.dumps(isa_rows(opts.isa_child, opts.rounds)))
        return
    if opts.isa:
        isa_table(opts.isa.split(","), opts.rounds)
        return
    unknown = [w for w in opts.workloads if w not in bm.workloads()]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(bm.workloads())}")
    warnings.filterwarnings("ignore", category=FutureWarning)
    threads = [int(t) for t in opts.threads.split(",")]
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as cache_dir:
        for key in opts.workloads:
            found = contenders(key, opts.products.split(","), threads, opts.compile, cache_dir)
            times = interleaved(found, opts.rounds)
            print(f"\n{bm.workloads()[key][0]} (load average {os.getloadavg()[0]:.2f}), medians of {opts.rounds} interleaved rounds, ms")
            print(f"  {'contender':<24} {'wall':>9} {'caller CPU':>11}")
            for k, (w, c) in times.items():
                print(f"  {k:<24} {w:9.2f} {c:11.2f}")


if __name__ == "__main__":
    main()
