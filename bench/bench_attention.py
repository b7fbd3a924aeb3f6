"""Attention on the CPU, in one process, interleaved: dpl's flash kernel against dpl's segments
(two BLAS products with a C softmax between them), torch's scaled_dot_product_attention,
torch eager written out and torch.compile of it.

    python bench/bench_attention.py [HEADS SEQ HEAD_DIM] [--threads N] [--rounds R] [--dense]
    python bench/bench_attention.py --model llama512 [--threads N] [--rounds R]
    python bench/bench_attention.py --decode [--heads H,HKV,D] [--keys N,N,...] [--threads N] [--rounds R]
    python bench/bench_attention.py --isa native,haswell [--rounds R]

softmax(q @ k^T * 1/sqrt(D) + causal mask (--dense: a random one)) @ v in float32, k given transposed ([H, D, S]) to
dpl as the torch frontend hands it to the composite. Each round runs every contender once, in
turn; the table gives medians over the rounds and the ratio to dpl flash. ``--model`` takes a
workload of ``bench_models.py`` (its Llama decoder: attention inside a whole model) and runs
dpl's ``["rewrites", "llm"]`` build with flash and with segments attention beside torch eager
and torch.compile of the model.

``--decode`` times one decode step's attention (issue 31: a kernel made for one query row, not
the prefill one): 32 query heads in 8 groups of 4 over 8 key/value heads of 128 (``--heads
8,4,64``: bench_zoo's generated Llama), 128 to 8192 cached keys (``--keys``), no mask, float32, three ways: dpl's decode kernel (backends/cpu/decode_attention.py),
the flash kernel on the one row, and the segments (two library products around a C softmax).
GB/s counts k and v read once (8 heads x n x 128 x 4 bytes each), what a decode step must read;
GFLOP/s the two products. Measured on the loaded 2-core host (an Intel Xeon VM, other jobs beside
it: load average 4.0-4.1), 9 interleaved rounds, ms and GB/s of k and v:

    one thread (streaming 256 MiB: copy 12.8 GB/s read + write, sum 6.5 GB/s)
      keys   decode           flash, one row     segments
       128   0.113   9.3      0.166   6.3 1.46x  0.594  1.8 5.2x
       512   0.329  12.7      0.655   6.4 1.99x  3.05   1.4 9.3x
      2048   2.39    7.0     11.2     1.5 4.68x  24.7   0.7 10.3x
      8192  13.2     5.1     67.4     1.0 5.11x  195    0.3 14.8x
    two threads (copy 15.4 GB/s, sum 9.5 GB/s)
       128  11.9     0.1     14.7     0.1 1.24x  56.0   0.0 4.7x
       512  15.9     0.3     16.0     0.3 1.01x  72.1   0.1 4.5x
      2048  15.9     1.1     28.9     0.6 1.82x  79.6   0.2 5.0x
      8192  23.0     2.9    111       0.6 4.84x  355    0.2 15.5x

At 8192 keys (64 MiB of k and v) one thread reads them at 5.1 GB/s, near the 6.5 a plain sum
streams: the step is bound by memory, as decoding is. The flash kernel on one row computes
eight rows' scores for each real one and reads a group's keys once per query head. Two threads
on this host mostly wait: their OpenMP team meets a core another job holds at every barrier (as
bench_generate.py's docstring says of its 2-thread rows), so read those rows as that host's
load, not as the kernels' scaling.

``--isa`` (issue 30): the zoo's attentions (4 heads of 64, bench_zoo.py's hidden 256: Llama's
1 x 128 under a causal mask, BERT's 1 x 128 and 8 x 128 under a padding mask, T5's 1 x 128
without one) per instruction set, one thread: the flash kernel built with ``-march`` (``native``:
this CPU's; ``haswell``: AVX2 and FMA only, its libraries' AVX2 kernels too) and the segments
beside it, interleaved, in GFLOP/s over every key (as bench/roofline.py counts attention) and as
% of that build's FMA peak (CPU time, medians). On the 2-core Intel Xeon (AVX-512, AMX), flash
before (the kernel called alone, load 0.1) -> after (this table, load 2.2), segments after:
    native  (peak 237-239): Llama 1x128 47% -> 66% (segments 21%), BERT 1x128 37% -> 41% (34%),
                            BERT 8x128 36% -> 51% (26%), T5 1x128 40% -> 43% (35%)
    haswell (peak 131):     Llama 1x128  4% -> 85% (34%), BERT 1x128  3% -> 52% (51%),
                            BERT 8x128  3% -> 65% (38%), T5 1x128  3% -> 53% (53%)
(the AVX2 build's 64-byte vectors had been split into spilled register pairs.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
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
    ap.add_argument("--decode", action="store_true", help="one decode step's attention (32 query / 8 key-value heads of 128) "
                    "at 128-8192 cached keys: the decode kernel, the flash kernel on one row, the segments")
    ap.add_argument("--heads", default="32,8,128", help="--decode's query heads, key/value heads and head size "
                    "(8,4,64: bench_zoo's generated Llama)")
    ap.add_argument("--keys", help="--decode's cached key counts, comma-separated (default 128,512,2048,8192)")
    ap.add_argument("--isa", help="comma-separated -march values (native,haswell): the zoo's attentions per build, "
                    "flash and segments, GFLOP/s and %% of the build's FMA peak")
    ap.add_argument("--isa-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.isa_child:
        return print(json.dumps(isa_rows(args.isa_child, args.rounds)))
    if args.isa:
        return isa_table(args.isa.split(","), args.rounds)
    if args.model:
        return model_main(args)
    if args.decode:
        heads, kv_heads, dim = (int(x) for x in args.heads.split(","))
        keys = tuple(int(x) for x in args.keys.split(",")) if args.keys else DECODE_KEYS
        return decode_main(args, heads, kv_heads, dim, keys)
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


DECODE_KEYS = (128, 512, 2048, 8192)


def decode_module(heads, kv_heads, keys, dim):
    """One decode step's grouped-query attention as the torch frontend writes it (q [1, Hkv, G, 1, D]
    against k [1, Hkv, 1, D, n]), no mask (Hugging Face's dynamic cache at batch 1)."""
    g = heads // kv_heads
    return dpl.parse(f"""
func main(q: f32[1, {kv_heads}, {g}, 1, {dim}], k: f32[1, {kv_heads}, 1, {dim}, {keys}], v: f32[1, {kv_heads}, 1, {keys}, {dim}]) -> f32[1, {kv_heads}, {g}, 1, {dim}] {{
  s = matmul(q, k)
  z = multiply(s, {1 / dim ** 0.5})
  p = nn.softmax(z)
  o = matmul(p, v)
  return o
}}""")


def memory_bandwidth(mib=256, rounds=5) -> tuple[float, float]:
    """GB/s of one thread streaming ``mib`` MiB: a copy (bytes read plus bytes written) and a sum
    (bytes read), the medians of ``rounds``."""
    src = np.ones(mib << 18, np.float32)
    dst = np.empty_like(src)
    copy, read = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        np.copyto(dst, src)
        copy.append(time.perf_counter() - t)
        t = time.perf_counter()
        src.sum()
        read.append(time.perf_counter() - t)
    return 2 * src.nbytes / float(np.median(copy)) / 1e9, src.nbytes / float(np.median(read)) / 1e9


def decode_main(args, heads=32, kv_heads=8, dim=128, key_counts=DECODE_KEYS):
    """The three ways to run a decode step's attention, interleaved, at each key count: GB/s of
    k and v read (each read once in all: the bound a decode step has) and GFLOP/s."""
    from dpl.backends.cpu import flash_attention as fa
    from dpl.kernel.attention import read_attention

    flash_be, segments_be = CpuBackend(attention="flash"), CpuBackend(attention="segments")
    copy, read = memory_bandwidth()
    print(f"decode attention: {heads} query / {kv_heads} key-value heads of {dim}, one query row, float32, no mask, "
          f"{args.threads} thread(s) (OMP_NUM_THREADS); median of {args.rounds} interleaved rounds; load average "
          f"{os.getloadavg()[0]:.1f}; one thread streaming 256 MiB: copy {copy:.1f} GB/s (read + write), sum {read:.1f} GB/s")
    print(f"  {'keys':>5} {'kernel':<22} {'ms':>8} {'GB/s k,v':>9} {'GFLOP/s':>8} {'vs decode':>9}")
    rng = np.random.default_rng(0)
    for keys in key_counts:
        fused = dpl.apply(decode_module(heads, kv_heads, keys, dim), ["llm"])
        fn = next(f for f in fused.functions.values() if f.attrs.get("Composite") == "kernel.attention")
        arrays = {p.name: rng.standard_normal(p.ty.shape).astype(np.float32) for p in fused["main"].params}
        call = next(b.value for b in fused["main"].bindings if b.value.op.name.endswith("_kernel"))
        inputs = [arrays[a.name] for a in call.args]  # the composite's parameter order
        shapes = tuple(a.shape for a in inputs)
        spec = read_attention(fn)
        source = fa.emit_flash(spec, vector_math=flash_be.cache.vector_math())
        kernels = {"dpl decode": flash_be.compile(fn, module=fused, shapes=shapes),
                   "dpl flash, one row": fa.flash_runner(fn.name, spec, source, flash_be.cache.load(source)),
                   "dpl segments": segments_be.compile(fn, module=fused, shapes=shapes)}
        assert kernels["dpl decode"].__qualname__.startswith("cpu-decode:")
        want = dpl.interpret(fused, *arrays.values())
        out = np.empty(fn.ret.ty.shape, np.float32)
        runs = {}
        for name, kernel in kernels.items():
            kernel(inputs, [out])
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
            runs[name] = (lambda k: lambda: k(inputs, [out]))(kernel)
        times = interleaved(runs, args.rounds)
        base = float(np.median(times["dpl decode"]))
        kv_bytes = 2 * kv_heads * keys * dim * 4
        flops = 4 * heads * keys * dim
        for name, ts in times.items():
            med = float(np.median(ts))
            print(f"  {keys:>5} {name:<22} {med:8.3f} {kv_bytes / med / 1e6:9.1f} {flops / med / 1e6:8.1f} {med / base:9.2f}")


# the zoo's attentions at bench_zoo.py's hidden 256 (4 heads of 64): name, batch, rows, mask kind
ISA_CASES = (("Llama 1x128 causal", 1, 128, "causal"), ("BERT 1x128 padding", 1, 128, "padding"),
             ("BERT 8x128 padding", 8, 128, "padding"), ("T5 1x128 none", 1, 128, None))


def zoo_attention(batch, seq, mask_kind, heads=4, dim=64):
    """The module and its inputs: a causal mask (-inf above the diagonal), a padding one (each
    batch entry's last keys at float32's minimum, as Hugging Face's), or none."""
    mask = {"causal": f", mask: f32[{seq}, {seq}]", "padding": f", mask: f32[{batch}, 1, 1, {seq}]", None: ""}[mask_kind]
    mod = dpl.parse(f"""
func main(q: f32[{batch}, {heads}, {seq}, {dim}], k: f32[{batch}, {heads}, {dim}, {seq}], v: f32[{batch}, {heads}, {seq}, {dim}]{mask}) -> f32[{batch}, {heads}, {seq}, {dim}] {{
  s = matmul(q, k)
  z = multiply(s, {1 / dim ** 0.5})
  {"m = add(z, mask)" if mask_kind else ""}
  p = nn.softmax({"m" if mask_kind else "z"})
  o = matmul(p, v)
  return o
}}""")
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(p.ty.shape).astype(np.float32) for p in mod["main"].params]
    if mask_kind == "causal":
        args[3] = np.triu(np.full((seq, seq), -np.inf, np.float32), 1)
    elif mask_kind == "padding":
        args[3] = np.zeros((batch, 1, 1, seq), np.float32)
        for b in range(batch):
            args[3][b, ..., seq - 9 * b - 5:] = np.finfo(np.float32).min
    return mod, args


def isa_rows(march, rounds):
    """The FMA peak of a ``-march=march`` build and per :data:`ISA_CASES` its flash and segments
    GFLOP/s, one thread, medians of ``rounds`` interleaved samples of CPU time."""
    import tempfile

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_products import _cpu_medians
    from roofline import fma_peak
    from dpl.backends.cpu.toolchain import KernelCache

    rows = []
    with tempfile.TemporaryDirectory() as cache_dir:
        cache = KernelCache(cache_dir, march=march)
        peak = fma_peak(1, cache)
        for name, batch, seq, mask_kind in ISA_CASES:
            mod, args = zoo_attention(batch, seq, mask_kind)
            fused = dpl.apply(mod, ["llm"])
            want = dpl.interpret(mod, *args)
            fns = []
            for mode in ("flash", "segments"):
                backend = CpuBackend(attention=mode)
                backend.cache = cache
                exe = dpl.build(fused, [backend, "numpy"], config=dpl.FusionConfig(fallback_on_error=False), threads=1)
                np.testing.assert_allclose(exe(*args), want, rtol=1e-4, atol=1e-4)
                assert f"{mode} attention" in exe.summary() or f"attention={mode!r}" in exe.summary(), exe.summary()
                out = np.empty_like(want)
                fns.append(lambda exe=exe, out=out: exe(*args, out=out))
            flops = 4 * batch * 4 * seq * seq * 64  # both products over every key
            rows.append((name, *(flops / s / 1e9 for s in _cpu_medians(fns, rounds))))
    return peak / 1e9, rows


def isa_table(marchs, rounds):
    """Each ``-march`` build's rows, each in a child process (a ``haswell`` one beside its
    libraries' AVX2 kernels), as GFLOP/s and % of that build's FMA peak."""
    from roofline import MARCH_LIBRARIES

    from dpl.host_cpu import describe

    results = {}
    for march in marchs:
        env = {**os.environ, **MARCH_LIBRARIES.get(march, {})}
        child = subprocess.run([sys.executable, __file__, "--isa-child", march, "--rounds", str(rounds)], env=env,
                               capture_output=True, text=True)
        if child.returncode != 0:
            raise SystemExit(f"bench_attention: the -march={march} build did not run here:\n{child.stderr[-2000:]}")
        results[march] = json.loads(child.stdout.splitlines()[-1])
    print(f"{describe()}; load average {os.getloadavg()[0]:.1f}; one thread, medians of {rounds} interleaved samples (CPU time)")
    print("attention GFLOP/s over every key (% of the build's FMA peak): dpl flash, dpl segments")
    print(f"  {'':<20}" + "".join(f" | {march + f' (peak {results[march][0]:.0f})':^32}" for march in marchs))
    for i, (name, *_) in enumerate(results[marchs[0]][1]):
        cells = ""
        for march in marchs:
            peak, rows = results[march]
            cells += " | " + "  ".join(f"{g:6.1f} ({100 * g / peak:3.0f}%)" for g in rows[i][1:])
        print(f"  {name:<20}{cells}")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
