"""The runtime's own choices, measured: outputs of plain calls, parallel builds, thread budgets
and the default fusion model against the seed's rules.

    python bench/bench_runtime_choices.py [outputs] [builds] [threads] [fusion]

- ``outputs``: the 4096² 8-op chain of ``bench/bench_cpu.py``: a plain call ``exe(*args)``
  with a fresh output each call (as before the output pool), with the pool, and with ``out=``;
- ``builds``: the 2-layer Llama (seq 128) of ``bench/bench_models.py``, ``["rewrites", "llm"]``:
  a cold build (a fresh kernel directory) with the compiles one at a time and in parallel, and
  a warm one (the same directory, a new CpuBackend);
- ``threads``: ``cnn``, ``gpt2``, ``llama128`` at ``build(..., threads=1)`` and ``threads=2``;
- ``fusion``: groups run op by op and run times under ``FusionConfig.seed()`` and the default.

Runs are interleaved; medians and minimums are printed (on a shared machine the minimum is the
number to compare, the median shows the noise).
"""

from __future__ import annotations

import statistics
import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dpl  # noqa: E402
from dpl.backends.cpu.backend import CpuBackend  # noqa: E402
from dpl.runtime import build_pool  # noqa: E402


def interleaved(fns: dict, rounds: int) -> dict:
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[k].append((time.perf_counter() - t) * 1e3)
    return times


def show(label: str, times: dict) -> None:
    for k, v in times.items():
        print(f"{label:<10} {k:<36} median {statistics.median(v):9.2f} ms   min {min(v):9.2f} ms", flush=True)


def outputs() -> None:
    argv, sys.argv = sys.argv, ["bench_cpu"]
    import bench_cpu
    sys.argv = argv
    exe = bench_cpu.dpl_exe(bench_cpu.CHAIN)
    args = bench_cpu.arrays(bench_cpu.CHAIN)
    out = np.empty_like(args[0])
    plan = exe.plan(*args)
    pooled = plan.output_pool.take

    def fresh_call():
        plan.output_pool.take = lambda: [np.empty(s, d) for s, d in plan.out_specs]
        try:
            exe(*args)
        finally:
            plan.output_pool.take = pooled

    show("outputs", interleaved({"plain, fresh output (no pool)": fresh_call, "plain, pooled output": lambda: exe(*args),
                                 "out=": lambda: exe(*args, out=out)}, 40))


def llama(seq=128):
    import torch

    import bench_models as bm

    torch.manual_seed(0)
    model = bm.Llama().eval()
    args = bm.llama_inputs(seq)
    return dpl.apply(dpl.from_torch(model, args), bm.LLM)


def builds() -> None:
    fused = llama()

    def cold(parallel: bool):
        def run():
            backend = CpuBackend(cache_dir=tempfile.mkdtemp())
            if parallel:
                dpl.build(fused, [backend, "numpy"], progress=None)
                return
            with _serial():
                dpl.build(fused, [backend, "numpy"], progress=None)
        return run

    show("builds", interleaved({"cold, compiles one at a time": cold(False), "cold, compiles in parallel": cold(True)}, 4))
    warm_dir = tempfile.mkdtemp()
    dpl.build(fused, [CpuBackend(cache_dir=warm_dir), "numpy"], progress=None)
    show("builds", interleaved({"warm (same directory, new backend)": lambda: dpl.build(fused, [CpuBackend(cache_dir=warm_dir), "numpy"], progress=None)}, 10))


class _serial:
    """Builds one at a time: a pool of one worker."""

    def __enter__(self):
        self._init = build_pool.BuildPool.__init__
        init = self._init
        build_pool.BuildPool.__init__ = lambda pool, workers=None, progress=None: init(pool, 1, progress)

    def __exit__(self, *exc):
        build_pool.BuildPool.__init__ = self._init


def model_case(key):
    import torch

    import bench_models as bm

    _, make_model, make_inputs = bm.workloads()[key]
    torch.manual_seed(0)
    model = make_model().eval()
    args = make_inputs()
    with torch.no_grad():
        expected = model(*args).numpy()
    return dpl.apply(dpl.from_torch(model, args), bm.LLM), [a.numpy() for a in args], expected


def threads() -> None:
    cache = tempfile.mkdtemp()
    for key in ("cnn", "gpt2", "llama128"):
        fused, inputs, expected = model_case(key)
        out = np.empty(expected.shape, expected.dtype)
        exes = {f"threads={t}": dpl.build(fused, [CpuBackend(cache_dir=cache), "numpy"], threads=t, progress=None) for t in (1, 2)}
        for exe in exes.values():
            np.testing.assert_allclose(exe(*inputs), expected, rtol=2e-4, atol=2e-4)
        show(key, interleaved({k: (lambda e=e: e(*inputs, out=out)) for k, e in exes.items()}, 20))


def fusion() -> None:
    cache = tempfile.mkdtemp()
    for key in ("cnn", "gpt2", "llama128"):
        fused, inputs, expected = model_case(key)
        out = np.empty(expected.shape, expected.dtype)
        exes = {}
        for name, cfg in (("FusionConfig.seed()", dpl.FusionConfig.seed()), ("FusionConfig() (default)", dpl.FusionConfig())):
            exe = dpl.build(fused, [CpuBackend(cache_dir=cache), "numpy"], config=cfg, progress=None)
            np.testing.assert_allclose(exe(*inputs), expected, rtol=2e-4, atol=2e-4)
            decisions = exe.plan(*inputs).decisions
            print(f"{key:<10} {name:<36} {sum(not g.fused for _, _, g in decisions)} of {len(decisions)} groups op by op")
            exes[name] = exe
        show(key, interleaved({k: (lambda e=e: e(*inputs, out=out)) for k, e in exes.items()}, 20))


def main() -> None:
    warnings.filterwarnings("ignore")
    parts = {"outputs": outputs, "builds": builds, "threads": threads, "fusion": fusion}
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", metavar="part", help=f"what to measure (default all: {', '.join(parts)})")
    chosen = parser.parse_args().parts or list(parts)
    unknown = [c for c in chosen if c not in parts]
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(parts)}")
    for c in chosen:
        parts[c]()


if __name__ == "__main__":
    main()
