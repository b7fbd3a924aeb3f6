"""Attention on the CPU, in one process, interleaved: dpl's flash kernel against dpl's segments
(two BLAS products with a C softmax between them), torch's scaled_dot_product_attention,
torch eager written out and torch.compile of it.

    python bench/bench_attention.py [HEADS SEQ HEAD_DIM] [--threads N] [--rounds R] [--dense]
    python bench/bench_attention.py --model llama512 [--threads N] [--rounds R]

softmax(q @ k^T * 1/sqrt(D) + causal mask (--dense: a random one)) @ v in float32, k given transposed ([H, D, S]) to
dpl as the torch frontend hands it to the composite. Each round runs every contender once, in
turn; the table gives medians over the rounds and the ratio to dpl flash. ``--model`` takes a
workload of ``bench_models.py`` (its Llama decoder: attention inside a whole model) and runs
dpl's ``["rewrites", "llm"]`` build with flash and with segments attention beside torch eager
and torch.compile of the model.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

# the thread count is fixed before NumPy's BLAS and OpenMP start (a benchmark script, not library code)
_THREADS = sys.argv[sys.argv.index("--threads") + 1] if "--threads" in sys.argv else "1"
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = _THREADS

import numpy as np  # noqa: E402

import dpl  # noqa: E402
from dpl.backends.cpu.backend import CpuBackend  # noqa: E402


def attention_module(heads, seq, dim):
    return dpl.parse(f"""
func main(q: f32[{heads}, {seq}, {dim}], k: f32[{heads}, {dim}, {seq}], v: f32[{heads}, {seq}, {dim}], mask: f32[{seq}, {seq}]) -> f32[{heads}, {seq}, {dim}] {{
  s = matmul(q, k)
  z = multiply(s, {1 / dim ** 0.5})
  m = add(z, mask)
  p = nn.softmax(m)
  o = matmul(p, v)
  return o
}}""")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", nargs="*", type=int, default=[16, 512, 64])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--dense", action="store_true", help="a random finite mask instead of the causal one (no tile is skipped)")
    ap.add_argument("--model", help="a bench_models.py workload (llama128, llama512, gpt2) instead of one attention")
    args = ap.parse_args(argv)
    if args.model:
        return model_main(args)
    heads, seq, dim = args.shape
    mod = dpl.apply(attention_module(heads, seq, dim), ["llm"])
    rng = np.random.default_rng(0)
    q = rng.standard_normal((heads, seq, dim)).astype(np.float32)
    k = rng.standard_normal((heads, dim, seq)).astype(np.float32)
    v = rng.standard_normal((heads, seq, dim)).astype(np.float32)
    mask = np.triu(np.full((seq, seq), -np.inf, np.float32), 1)
    if args.dense:
        mask = rng.standard_normal((seq, seq)).astype(np.float32)
    cfg = dpl.FusionConfig(fallback_on_error=False)
    exes = {mode: dpl.build(mod, [CpuBackend(attention=mode), "numpy"], config=cfg) for mode in ("flash", "segments")}
    want = dpl.interpret(mod, q, k, v, mask)
    out = np.empty_like(want)
    runs = {}
    for mode, exe in exes.items():
        np.testing.assert_allclose(exe(q, k, v, mask), want, rtol=1e-4, atol=1e-4)
        runs[f"dpl {mode} (out=)"] = (lambda e: lambda: e(q, k, v, mask, out=out))(exe)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        torch.set_num_threads(args.threads)
        tq, tv = torch.from_numpy(q), torch.from_numpy(v)
        tk = torch.from_numpy(np.ascontiguousarray(k.transpose(0, 2, 1)))
        tkt, tmask = torch.from_numpy(k), torch.from_numpy(mask)
        scale = 1 / dim ** 0.5

        def eager(q_, kt_, v_, m_):
            return torch.softmax(q_ @ kt_ * scale + m_, -1) @ v_

        compiled = torch.compile(eager)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        if not args.dense:
            runs["torch SDPA (causal)"] = lambda: sdpa(tq, tk, tv, is_causal=True)
        runs["torch SDPA (mask)"] = lambda: sdpa(tq, tk, tv, attn_mask=tmask)
        runs["torch eager"] = lambda: eager(tq, tkt, tv, tmask)
        runs["torch.compile"] = lambda: compiled(tq, tkt, tv, tmask)
    times = {name: [] for name in runs}
    with torch.no_grad() if torch is not None else _nothing():
        for fn in runs.values():  # warm up (torch.compile compiles here)
            fn(), fn()
        for _ in range(args.rounds):
            for name, fn in runs.items():
                t = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - t) * 1e3)
    base = float(np.median(times["dpl flash (out=)"]))
    print(f"attention {heads} heads x {seq} x {dim}, float32, {'dense' if args.dense else 'causal'} mask, {args.threads} thread(s); "
          f"median of {args.rounds} interleaved rounds; ratio = contender / dpl flash")
    for name, ts in times.items():
        med = float(np.median(ts))
        print(f"  {name:<22} {med:9.2f} ms {med / base:7.2f}")
    for mode, exe in exes.items():
        notes = [line.strip() for line in exe.summary().splitlines() if "attention" in line and ": " in line and "on cpu" in line]
        print(f"  {mode}: {notes[0] if notes else '?'}")


def interleaved(runs, rounds):
    """name -> the times (ms) of ``rounds`` rounds, each running every contender once in turn."""
    times = {name: [] for name in runs}
    for fn in runs.values():  # warm up (torch.compile compiles here)
        fn(), fn()
    for _ in range(rounds):
        for name, fn in runs.items():
            t = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t) * 1e3)
    return times


def model_main(args):
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_models

    torch.set_num_threads(args.threads)
    desc, make_model, make_inputs = bench_models.workloads()[args.model]
    torch.manual_seed(0)
    model = make_model().eval()
    targs = make_inputs()
    with torch.no_grad():
        expected = model(*targs).numpy()
    inputs = [a.numpy() for a in targs]
    fused = dpl.apply(dpl.from_torch(model, targs), ["rewrites", "llm"])
    runs = {}
    out = np.empty(expected.shape, expected.dtype)
    notes = {}
    for mode in ("flash", "segments"):
        exe = dpl.build(fused, [CpuBackend(attention=mode), "numpy"])
        np.testing.assert_allclose(exe(*inputs), expected, rtol=2e-4, atol=2e-4)
        runs[f"dpl {mode} (out=)"] = (lambda e: lambda: e(*inputs, out=out))(exe)
        notes[mode] = sum(f"{mode} attention" in line or f": {mode}" in line for line in exe.summary().splitlines())
    compiled = torch.compile(model)
    runs["torch eager"] = lambda: model(*targs)
    runs["torch.compile"] = lambda: compiled(*targs)
    with torch.no_grad():
        times = interleaved(runs, args.rounds)
    base = float(np.median(times["dpl flash (out=)"]))
    print(f"{desc}, float32, {args.threads} thread(s); median of {args.rounds} interleaved rounds; "
          f"ratio = contender / dpl flash; attention kernels by path: {notes}")
    for name, ts in times.items():
        med = float(np.median(ts))
        print(f"  {name:<22} {med:9.2f} ms {med / base:7.2f}")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
