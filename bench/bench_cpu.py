"""dpl's generated-C CPU backend against the field, in one run, on this machine.

    python bench/bench_cpu.py [N]        # N x N float32 (default 4096)

Workloads: the 8-op chain relu((x*a + b) * sigmoid(x) - c) / 2 + d (a..d broadcast over rows),
nn.softmax, nn.rms_norm, the decomposed RMSNorm under fuse_reductions, a Llama MLP block and
scaled-dot-product attention through the llm.attention pattern.
Contenders: dpl cpu (with out=), NumPy op by op, NumPy with out=, numexpr (if installed), torch
eager and torch.compile (if importable; never installed by this script), and the bandwidth
floor: a measured copy scaled to the bytes each workload must read and write. Every contender
runs with the threads it has by default on this machine.
"""

import argparse
import os
import sys
import time

import numpy as np

import dpl


def _size() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="?", type=int, default=4096, help="the inputs' rows and columns (default 4096)")
    return parser.parse_args().n


N = _size()
rng = np.random.default_rng(0)


def best(fn, repeat=5, budget=0.5):
    """The fastest of at least ``repeat`` runs and of as many as fit in ``budget`` seconds (at
    most 50): a shared 2-core machine has bursts of noise that five runs do not always avoid."""
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < repeat or (time.perf_counter() - start < budget and len(times) < 50):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) * 1e3


def module(text):
    return dpl.parse(text)


CHAIN = module(f"""
func main(x: f32[{N}, {N}], a: f32[{N}], b: f32[{N}], c: f32[{N}], d: f32[{N}]) -> f32[{N}, {N}] {{
  t0 = multiply(x, a)
  t1 = add(t0, b)
  t2 = sigmoid(x)
  t3 = multiply(t1, t2)
  t4 = subtract(t3, c)
  t5 = nn.relu(t4)
  t6 = divide(t5, 2.0)
  t7 = add(t6, d)
  return t7
}}""")
SOFTMAX = module(f"func main(x: f32[{N}, {N}]) -> f32[{N}, {N}] {{\n  y = nn.softmax(x)\n  return y\n}}")
RMSNORM = module(f"func main(x: f32[{N}, {N}], w: f32[{N}]) -> f32[{N}, {N}] {{\n  y = nn.rms_norm(x, w, epsilon=1e-06)\n  return y\n}}")
RMS_DECOMPOSED = module(f"""
func main(x: f32[{N}, {N}], w: f32[{N}]) -> f32[{N}, {N}] {{
  sq = multiply(x, x)
  ms = mean(sq, axis=[-1], keepdims=true)
  r = rsqrt(add(ms, 1e-06))
  y = multiply(multiply(x, r), w)
  return y
}}""")
MLP_TOKENS, HIDDEN, INTER = 128, 1024, 2816
MLP = module(f"""
func main(x: f32[{MLP_TOKENS}, {HIDDEN}], wg: f32[{HIDDEN}, {INTER}], wu: f32[{HIDDEN}, {INTER}], wd: f32[{INTER}, {HIDDEN}]) -> f32[{MLP_TOKENS}, {HIDDEN}] {{
  gate = matmul(x, wg)
  up = matmul(x, wu)
  h = multiply(nn.silu(gate), up)
  out = matmul(h, wd)
  return out
}}""")

HEADS, SEQ, HEAD_DIM = 16, 512, 64
ATTENTION = module(f"""
func main(q: f32[{HEADS}, {SEQ}, {HEAD_DIM}], k: f32[{HEADS}, {HEAD_DIM}, {SEQ}], v: f32[{HEADS}, {SEQ}, {HEAD_DIM}], mask: f32[{SEQ}, {SEQ}]) -> f32[{HEADS}, {SEQ}, {HEAD_DIM}] {{
  scores = matmul(q, k)
  scaled = multiply(scores, 0.125)
  masked = add(scaled, mask)
  probs = nn.softmax(masked)
  ctx = matmul(probs, v)
  return ctx
}}""")


def arrays(mod):
    return [rng.standard_normal(tuple(p.ty.shape)).astype(np.float32) * (0.05 if p.ty.ndim == 2 and p.name.startswith("w") else 1)
            for p in mod["main"].params]


def numpy_chain(x, a, b, c, d):
    return np.maximum((x * a + b) * (1 / (1 + np.exp(-x))) - c, 0) / 2 + d


def numpy_chain_out(x, a, b, c, d, out, tmp):
    np.multiply(x, a, out=out); out += b
    np.negative(x, out=tmp); np.exp(tmp, out=tmp); tmp += 1; np.reciprocal(tmp, out=tmp)
    out *= tmp; out -= c; np.maximum(out, 0, out=out); out /= 2; out += d


def numpy_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def numpy_rms(x, w):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6) * w


def numpy_attention(q, k, v, mask):
    s = q @ k * 0.125 + mask
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


def numpy_mlp(x, wg, wu, wd):
    g = x @ wg
    return (g / (1 + np.exp(-g)) * (x @ wu)) @ wd


_COPY = None


def copies():
    """Two copies of an N x N float32 array: NumPy's (one thread) and a generated-C one with the
    threads dpl uses (whose streaming stores skip the read-for-ownership)."""
    global _COPY
    if _COPY is None:
        src = np.ones((N, N), np.float32)
        dst = np.empty_like(src)
        c_copy = dpl_exe(module(f"func main(x: f32[{N}, {N}]) -> f32[{N}, {N}] {{\n  y = multiply(x, 1.0)\n  return y\n}}"))
        _COPY = (lambda: np.copyto(dst, src), lambda: c_copy(src, out=dst))
    return _COPY


def with_floor(run, nbytes_read, nbytes_written):
    """dpl's time, then the bandwidth floor measured right after it: the time to move these
    bytes at the speed of the faster copy. Each runs in its own steady state, as every contender
    does (the same footprint as a one-read one-write kernel); measured per row, since a shared
    host's bandwidth drifts over a run."""
    dpl_ms = best(run)
    copy_ms = min(best(f) for f in copies())
    return dpl_ms, copy_ms * (nbytes_read + nbytes_written) / (2 * N * N * 4)


def torch_fns():
    """The workloads in torch (eager), keyed like the rows; None without torch."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(os.cpu_count() or 1)
    return torch, {
        "8-op chain": lambda x, a, b, c, d: torch.relu((x * a + b) * torch.sigmoid(x) - c) / 2 + d,
        "nn.softmax": lambda x: torch.softmax(x, -1),
        "nn.rms_norm": lambda x, w: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w,
        "decomposed RMSNorm (fuse_reductions)": lambda x, w: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w,
        "Llama MLP block (matmul-bound)": lambda x, wg, wu, wd: (torch.nn.functional.silu(x @ wg) * (x @ wu)) @ wd,
        "attention (llm.attention)": lambda q, k, v, mask: torch.softmax(q @ k * 0.125 + mask, -1) @ v,
    }


def add_torch(res, name, args, torch_bits, repeat=5):
    if torch_bits is None:
        return
    torch, fns = torch_bits
    targs = [torch.from_numpy(v) for v in args]
    fn = fns[name]
    with torch.no_grad():
        res["torch eager"] = best(lambda: fn(*targs), repeat)
        try:
            compiled = torch.compile(fn)
            res["torch.compile"] = best(lambda: compiled(*targs), repeat)
        except Exception as err:  # inductor needs a working C++ toolchain; report, do not crash
            print(f"torch.compile failed on {name}: {type(err).__name__}: {err}", file=sys.stderr)


def dpl_exe(mod, fuse_reductions=False, patterns=(), attention=None):
    fused = dpl.apply(mod, list(patterns), fuse_reductions=fuse_reductions)
    cfg = dpl.FusionConfig(min_nodes_for_fusion=1, max_graph_size=1000, min_tensor_elements=0, fallback_on_error=False)
    if attention is not None:
        from dpl.backends.cpu.backend import CpuBackend

        return dpl.build(fused, [CpuBackend(attention=attention), "numpy"], config=cfg)
    return dpl.build(fused, "cpu", config=cfg)


def main():
    try:
        import numexpr
    except ImportError:
        numexpr = None
    torch_bits = torch_fns()
    rows = []
    x, a, b, c, d = args = arrays(CHAIN)
    out, tmp = np.empty_like(x), np.empty_like(x)
    exe = dpl_exe(CHAIN)
    dpl_ms, floor = with_floor(lambda: exe(*args, out=out), x.nbytes + 4 * a.nbytes, x.nbytes)
    res = {"dpl cpu (out=)": dpl_ms, "numpy op by op": best(lambda: numpy_chain(*args)),
           "numpy out=": best(lambda: numpy_chain_out(*args, out, tmp))}
    if numexpr is not None:
        names = {"x": x, "a": a, "b": b, "c": c, "d": d}
        res["numexpr"] = best(lambda: numexpr.evaluate("where((x*a+b)/(1+exp(-x))-c > 0, (x*a+b)/(1+exp(-x))-c, 0)/2+d",
                                                        local_dict=names, out=out))
    add_torch(res, "8-op chain", args, torch_bits)
    res["bandwidth floor"] = floor
    rows.append(("8-op chain", res))
    for name, mod, ref, fr in [("nn.softmax", SOFTMAX, numpy_softmax, False), ("nn.rms_norm", RMSNORM, numpy_rms, False),
                               ("decomposed RMSNorm (fuse_reductions)", RMS_DECOMPOSED, numpy_rms, True)]:
        args = arrays(mod)
        out = np.empty((N, N), np.float32)
        exe = dpl_exe(mod, fr)
        dpl_ms, floor = with_floor(lambda: exe(*args, out=out), args[0].nbytes, args[0].nbytes)
        res = {"dpl cpu (out=)": dpl_ms, "numpy op by op": best(lambda: ref(*args))}
        add_torch(res, name, args, torch_bits)
        res["bandwidth floor"] = floor
        rows.append((name, res))
    args = arrays(MLP)
    exe = dpl_exe(MLP)
    out = np.empty((MLP_TOKENS, HIDDEN), np.float32)
    res = {"dpl cpu (out=)": best(lambda: exe(*args, out=out), repeat=3), "numpy op by op": best(lambda: numpy_mlp(*args), repeat=3)}
    add_torch(res, "Llama MLP block (matmul-bound)", args, torch_bits, repeat=3)
    rows.append(("Llama MLP block (matmul-bound)", res))
    args = arrays(ATTENTION)
    exe = dpl_exe(ATTENTION, patterns=["llm"])  # the kernel.attention composite: the flash kernel at 512 keys
    segments = dpl_exe(ATTENTION, patterns=["llm"], attention="segments")  # BLAS, C softmax, BLAS
    out = np.empty((HEADS, SEQ, HEAD_DIM), np.float32)
    res = {"dpl cpu (out=)": best(lambda: exe(*args, out=out)), "dpl cpu segments": best(lambda: segments(*args, out=out)),
           "numpy op by op": best(lambda: numpy_attention(*args))}
    add_torch(res, "attention (llm.attention)", args, torch_bits)
    rows.append(("attention (llm.attention)", res))
    print(f"{N}x{N} float32 (MLP: {MLP_TOKENS} tokens, {HIDDEN} -> {INTER}; attention: {HEADS} heads x {SEQ} x {HEAD_DIM}); ms, best of >= 5 runs; ratio = contender / dpl")
    print(f"{'workload':<38} {'contender':<18} {'ms':>9} {'ratio':>7}")
    for name, res in rows:
        base = res["dpl cpu (out=)"]
        for who, ms in res.items():
            print(f"{name:<38} {who:<18} {ms:9.2f} {ms / base:7.2f}")
            name = ""


if __name__ == "__main__":
    main()
