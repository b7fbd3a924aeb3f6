"""dpl's products providers and thread counts against torch, interleaved in one process.

    python bench/bench_products.py                          # cnn gpt2 llama128, auto vs numpy, 1 and 2 threads
    python bench/bench_products.py cnn --products auto,torch --threads 1 --compile

Each workload of ``bench_models.py`` is built with ``["rewrites", "llm"]`` once per products
provider (``CpuBackend(products=...)``) and thread budget (``dpl.build(..., threads=N)``),
checked against torch eager, then every contender (and torch eager / torch.compile at the same
thread counts) runs once per round, the rounds interleaved. Two columns: the median wall time,
and the median CPU time of the calling thread, which at one thread is all the work (every
library runs on the caller) and, unlike wall time, is not inflated by other processes on a
shared machine; at two threads only wall time says anything. The load average is printed
before and after: on the shared 2-core bench host two-thread wall times at a load of 7-12 were
3-40x the one-thread times for every contender, torch included.
"""

from __future__ import annotations

import argparse
import os
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", default=["cnn", "gpt2", "llama128"])
    parser.add_argument("--products", default="auto,numpy", help="comma-separated CpuBackend(products=...) values")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--compile", action="store_true", help="also torch.compile (a minute or two)")
    opts = parser.parse_args()
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
