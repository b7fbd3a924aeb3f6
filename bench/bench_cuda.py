"""dpl on a CUDA device against torch on the same device, in one run.

    python bench/bench_cuda.py [N]           # kernel workloads at N x N float32 (default 8192)
    python bench/bench_cuda.py --models      # also the model zoo of bench_models.py
    python bench/bench_cuda.py --no-compile  # skip torch.compile

Workloads: those of ``bench_cpu.py`` (the 8-op chain, softmax, RMSNorm, the decomposed
RMSNorm under fuse_reductions, a Llama MLP block, attention through ``llm.attention``) and,
with ``--models``, the models of ``bench_models.py`` (Llama 2 layers at seq 128 and 512,
GPT-2 block, ResNet basic block; batch 1). dpl: ``dpl.build(apply(mod, ["rewrites", "llm",
"cublas"], ...), "cuda")``, device-resident (every intermediate on the device, a CUDA graph per
shape), called on torch CUDA tensors through DLPack. Contenders: torch eager and torch.compile
on the same device. Every dpl result is checked against torch before it is timed.

Times are the best of several runs, each ended by a device synchronisation. For the
memory-bound rows, the achieved bandwidth (bytes the workload must read and write over dpl's
time) is printed against the device's copy bandwidth (a device-to-device copy of 1 GiB), the
ceiling a one-read one-write kernel can reach. Those rows time the whole Executable (its
graph copies inputs into the captured buffers and results out of them), so the row kernels
are also measured alone (``bench/cuda_rows.py``: softmax, RMSNorm, LayerNorm, add+RMSNorm at
float32 and float16, each kernel launched on CuPy arrays and timed by CUDA events) against a
copy of the same traffic; issue 21 asks them for 80% of it. Without a CUDA device the script
says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import dpl

HERE = Path(__file__).parent


def _exit(message: str):
    print(f"bench_cuda: {message}", file=sys.stderr)
    sys.exit(2)


def device_or_exit():
    """CuPy and torch, with a CUDA device; otherwise a clear message and exit status 2."""
    try:
        import cupy as cp

        count = cp.cuda.runtime.getDeviceCount()
    except Exception as err:  # noqa: BLE001 (no CuPy, no driver: whatever it raised)
        _exit(f"no CUDA device ({type(err).__name__}: {err}); this benchmark needs a GPU")
    if count == 0:
        _exit("no CUDA device; this benchmark needs a GPU")
    try:
        import torch
    except ImportError as err:
        _exit(f"torch is not installed ({err}); pip install 'dpl[bench]'")
    if not torch.cuda.is_available():
        _exit("torch has no CUDA; install a CUDA build of torch")
    return cp, torch


def best(fn, sync, repeat=10, budget=2.0) -> float:
    """Best time of ``fn`` in ms, each run ended by ``sync``; warmed up first."""
    fn()
    sync()
    times, start = [], time.perf_counter()
    while len(times) < repeat or (time.perf_counter() - start < budget and len(times) < 200):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return min(times)


def copy_bandwidth(cp, sync) -> float:
    """GB/s of a device-to-device copy of 1 GiB (read + written bytes over the time)."""
    src = cp.ones(1 << 28, cp.float32)
    dst = cp.empty_like(src)
    ms = best(lambda: cp.copyto(dst, src), sync)
    return 2 * src.nbytes / ms / 1e6


def kernel_workloads(n):
    """(name, module, torch function, patterns, fuse_reductions, memory-bound) from bench_cpu."""
    saved = sys.argv
    sys.argv = ["bench_cpu", str(n)]
    sys.path.insert(0, str(HERE))
    try:
        import bench_cpu as cpu
    finally:
        sys.argv = saved
    _, fns = cpu.torch_fns()
    llm = ["rewrites", "llm", "cublas"]
    return [("8-op chain", cpu.CHAIN, fns["8-op chain"], [], False, True),
            ("nn.softmax", cpu.SOFTMAX, fns["nn.softmax"], llm, False, True),
            ("nn.rms_norm", cpu.RMSNORM, fns["nn.rms_norm"], llm, False, True),
            ("decomposed RMSNorm (fuse_reductions)", cpu.RMS_DECOMPOSED, fns["decomposed RMSNorm (fuse_reductions)"], [], True, True),
            ("Llama MLP block (matmul-bound)", cpu.MLP, fns["Llama MLP block (matmul-bound)"], llm, False, False),
            ("attention (llm.attention)", cpu.ATTENTION, fns["attention (llm.attention)"], llm, False, False)], cpu


def run_row(torch, sync, name, exe, fn, targs, compile_too):
    with torch.no_grad():
        want = fn(*targs)
        got = exe(*targs)
        torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3, msg=lambda m: f"{name}: dpl differs from torch: {m}")
        res = {"dpl cuda": best(lambda: exe(*targs), sync), "torch eager": best(lambda: fn(*targs), sync)}
        if compile_too:
            try:
                compiled = torch.compile(fn)
                compiled(*targs)
                res["torch.compile"] = best(lambda: compiled(*targs), sync)
            except Exception as err:  # noqa: BLE001 (inductor's toolchain: report, do not crash)
                print(f"torch.compile failed on {name}: {type(err).__name__}: {err}", file=sys.stderr)
    return res


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="?", type=int, default=8192)
    parser.add_argument("--models", action="store_true")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--rows", type=int, nargs=2, default=(8192, 4096), metavar=("ROWS", "COLS"),
                        help="the row kernels' shape (default 8192 4096)")
    args = parser.parse_args()
    cp, torch = device_or_exit()
    sync = torch.cuda.synchronize
    name = torch.cuda.get_device_name()
    bandwidth = copy_bandwidth(cp, sync)
    print(f"{name}: device-to-device copy {bandwidth:.0f} GB/s\n")
    print(f"{'workload':<40} {'dpl ms':>9} {'eager ms':>9} {'compile ms':>10} {'dpl GB/s':>9} {'of copy':>8}")
    workloads, cpu = kernel_workloads(args.n)
    for row, mod, fn, patterns, fuse_reductions, memory_bound in workloads:
        exe = dpl.build(dpl.apply(mod, patterns, fuse_reductions=fuse_reductions), "cuda")
        arrays = cpu.arrays(mod)
        targs = [torch.from_numpy(a).cuda() for a in arrays]
        res = run_row(torch, sync, row, exe, fn, targs, not args.no_compile)
        moved = sum(a.nbytes for a in arrays) + arrays[0].nbytes  # inputs read, one output written
        gbs = moved / res["dpl cuda"] / 1e6
        share = f"{100 * gbs / bandwidth:.0f}%" if memory_bound else "-"
        print(f"{row:<40} {res['dpl cuda']:>9.3f} {res['torch eager']:>9.3f} {res.get('torch.compile', float('nan')):>10.3f} {gbs:>9.0f} {share:>8}")
    sys.path.insert(0, str(HERE))
    import cuda_rows
    from dpl.backends.cuda.backend import CupyBackend

    print()
    print(cuda_rows.report(cp, CupyBackend(cupy=cp), *args.rows))
    if args.models:
        sys.path.insert(0, str(HERE))
        import bench_models

        print(f"\n{'model':<40} {'dpl ms':>9} {'eager ms':>9} {'compile ms':>10}")
        for key, (desc, make_model, make_inputs) in bench_models.workloads().items():
            torch.manual_seed(0)
            model = make_model().eval()
            inputs = make_inputs()
            mod = dpl.from_torch(model, inputs)
            exe = dpl.build(dpl.apply(mod, ["rewrites", "llm", "cublas"]), "cuda")
            model = model.cuda()
            res = run_row(torch, sync, key, exe, model, [t.cuda() for t in inputs], not args.no_compile)
            print(f"{desc:<40} {res['dpl cuda']:>9.3f} {res['torch eager']:>9.3f} {res.get('torch.compile', float('nan')):>10.3f}")
            for line in exe.summary().splitlines():  # how it ran: one graph, or step by step and why
                if "device-resident" in line:
                    print(f"    {line.strip()}")
        print(f"\n{exe.summary()}")
    return 0


if __name__ == "__main__":
    np.random.seed(0)
    sys.exit(main())
