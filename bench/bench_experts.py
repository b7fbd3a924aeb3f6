"""A Mixtral-like mixture-of-experts layer on the CPU: the experts' gate and up product with its
gated unit as one composite (``llm.grouped_matmul_glu``: per expert run, the product and
``silu(gate) * up`` in one pass) against the same ops unfused (``rewrites`` only: the grouped
product alone, then the slices, SiLU and product as one generated-C kernel), interleaved in one
process, and torch eager beside them.

    python bench/bench_experts.py                      # K = 256, 512, 1024; 8 experts, top-2, 128 tokens
    python bench/bench_experts.py --hidden 512 --products numpy --rounds 30

Each layer is transformers' ``MixtralSparseMoeBlock`` (random weights, intermediate size 2K),
imported by ``dpl.from_torch`` (its experts trace to ``grouped_matmul``), built once per
contender on one thread and checked against torch. Every contender runs once per round, the
rounds interleaved; printed: the median wall time and the median CPU time of the calling thread
(one thread: all the work, and not inflated by other processes on a shared host).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np
import torch
import transformers

import dpl
from dpl.backends.cpu.backend import CpuBackend


def moe_layer(hidden: int, experts: int, top_k: int):
    torch.manual_seed(0)
    config = transformers.MixtralConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_local_experts=experts,
                                        num_experts_per_tok=top_k)
    config._experts_implementation = "grouped_mm"  # as a MixtralModel sets it (a lone block's default loops)
    block = transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock(config).eval()
    with torch.no_grad():  # a lone block's experts are torch.empty: a model's init fills them
        for p in block.parameters():
            p.normal_(0.0, config.initializer_range)
    return block


def contenders(hidden: int, experts: int, top_k: int, tokens: int, products: str, cache_dir: str) -> dict:
    model = moe_layer(hidden, experts, top_k)
    x = torch.randn(1, tokens, hidden)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = model(x).numpy()
        mod = dpl.from_torch(model, (x,))
    found = {}
    for name, patterns in (("composite", ["rewrites", "llm"]), ("unfused", ["rewrites"])):
        fused = dpl.apply(mod, patterns)
        claimed = sum(f.attrs.get("Composite") == "kernel.grouped_matmul_glu" for f in fused.functions.values())
        assert claimed == (name == "composite"), f"{name}: {claimed} grouped_matmul_glu composites"
        exe = dpl.build(fused, [CpuBackend(cache_dir=cache_dir, products=products), "numpy"], threads=1, progress=False)
        np.testing.assert_allclose(exe(x.numpy()), expected, rtol=2e-4, atol=2e-4, err_msg=name)
        found[f"dpl {name}"] = lambda exe=exe, a=x.numpy(): exe(a)
    found["torch eager"] = lambda: model(x)
    return found


def measure(fns: dict, rounds: int) -> dict:
    """name -> (median wall ms, median thread-CPU ms), the contenders interleaved round by round."""
    wall, cpu = {k: [] for k in fns}, {k: [] for k in fns}
    for fn in fns.values():  # warm
        fn()
    for _ in range(rounds):
        for k, fn in fns.items():
            w0, c0 = time.perf_counter(), time.thread_time()
            fn()
            cpu[k].append((time.thread_time() - c0) * 1e3)
            wall[k].append((time.perf_counter() - w0) * 1e3)
    return {k: (statistics.median(wall[k]), statistics.median(cpu[k])) for k in fns}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", default="256,512,1024", help="hidden sizes K, comma-separated")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--products", default="auto", help="CpuBackend(products=...): auto, dpl, numpy or torch")
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"load average {os.getloadavg()[0]:.1f}; one thread; products={args.products}; "
          f"{args.experts} experts, top-{args.top_k}, {args.tokens} tokens", file=sys.stderr)
    with tempfile.TemporaryDirectory() as cache_dir:
        for hidden in (int(h) for h in args.hidden.split(",")):
            times = measure(contenders(hidden, args.experts, args.top_k, args.tokens, args.products, cache_dir), args.rounds)
            base = times["dpl unfused"][1]
            for name, (w, c) in times.items():
                print(f"K={hidden:5d} F={2 * hidden:5d}  {name:14s} wall {w:8.2f} ms  cpu {c:8.2f} ms  ({c / base:.2f}x unfused cpu)")
    print(f"load average {os.getloadavg()[0]:.1f}", file=sys.stderr)


if __name__ == "__main__":
    main()
