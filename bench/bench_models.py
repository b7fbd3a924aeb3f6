"""Real-shaped torch models through dpl, end to end, against torch, in one run on this machine.

    python bench/bench_models.py                  # every workload
    python bench/bench_models.py llama128 cnn     # some of them
    python bench/bench_models.py --profile        # also dpl's per-kernel profile and summary
    python bench/bench_models.py --no-compile     # skip torch.compile (it takes a minute or two)

The mission, measured: an engineer imports a model, says "fuse this", and runs it. Each model is
built from torch.nn here, in eval mode, with random weights:

- ``llama128`` / ``llama512``: a Llama-style decoder, 2 layers, hidden 1024, 16 heads of 64,
  intermediate 2816, batch 1, sequence 128 / 512: RMSNorm written out as Hugging Face does,
  rotary embedding (rotate_half: two slices, a negation and a concat; cos and sin are inputs),
  causal attention with the additive mask passed as an input, SwiGLU MLP, residuals;
- ``gpt2``: a GPT-2 block (hidden 768, 12 heads, sequence 128): LayerNorm, fused QKV
  projection split in three, causal attention, tanh-GELU MLP with biases, residuals;
- ``cnn``: a ResNet basic block at 1x64x56x56 (3x3 conv, batch norm, ReLU, 3x3 conv, batch
  norm, identity residual, ReLU).

dpl's pipeline: ``dpl.from_torch(model, args)`` -> ``dpl.apply(mod, patterns,
fuse_reductions=...)`` -> ``dpl.build(fused, "cpu")`` with the default FusionConfig -> run with
``out=``. Its configurations: ``numpy`` (``dpl.build(mod, "numpy")`` of the unfused import: the
interpreter-less plan, every op by NumPy), ``cpu FuseOps`` (``apply(mod)``: automatic fusion
only), ``cpu +patterns`` (``["rewrites", "llm"]``) and ``cpu +patterns +fr`` (also
``fuse_reductions=True``), each with ``products="auto"`` (the default: NumPy's BLAS or torch,
whichever measured faster on this machine, for products and for convolutions), and
``cpu +patterns, OpenBLAS`` / ``cpu +patterns, MKL`` (every product and convolution by
NumPy's OpenBLAS / by torch's MKL and oneDNN: the generated C is the same; it shows how much
of the gap to torch is the BLAS). Contenders: torch eager and torch.compile (inductor), under
``torch.no_grad``. Every dpl output is checked against torch eager (``assert_allclose``) before
it is timed. Every contender runs with all the cores of the machine (torch is told
``os.cpu_count()``; dpl's OpenMP kernels and NumPy's BLAS take every core by default), or with
``--threads N`` on ``N`` (``torch.set_num_threads(N)``, ``dpl.build(..., threads=N)``).

Two tables: the run times (best of >= 5 runs; ratio = contender / dpl's best configuration
other than the forced MKL one, so > 1 means dpl is faster), and what it cost to get there
(import, apply, and build with a cold kernel cache, a fresh directory, and a warm one: the same
directory, a new process-level cache; torch.compile's first call, with inductor's caches in a
fresh directory). A last section lists, from the plan of ``cpu +patterns``, the groups the
fusion heuristics ran op by op and why, and whether the plan capped its OpenMP kernels at one
thread (``dpl.runtime.threads``). On a shared machine repeat the run: the best times are stable
to about 10%; a single slow row is usually another process.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
import warnings

import numpy as np

import dpl
from dpl.backends.cpu.backend import CpuBackend

# torch.compile's first call is timed cold too: inductor's on-disk caches in a fresh directory
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="bench_models_inductor_"))
try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - the bench needs torch; say so plainly
    sys.exit("bench_models.py needs torch (pip install -e '.[torch]')")


def best(fn, repeat=5, budget=1.0):
    """The fastest of at least ``repeat`` runs and of as many as fit in ``budget`` seconds (at
    most 50), in ms: a shared machine has bursts of noise that five runs do not always avoid."""
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < repeat or (time.perf_counter() - start < budget and len(times) < 50):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) * 1e3


def timed(fn):
    t = time.perf_counter()
    value = fn()
    return value, (time.perf_counter() - t) * 1e3


# -- the models ------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """LlamaRMSNorm as Hugging Face writes it (the ``rewrites`` library turns it into nn.rms_norm)."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(d))
        self.eps = eps

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(hidden, hidden, bias=False) for _ in range(4))

    def forward(self, x, mask, cos, sin):
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, self.heads, self.head_dim).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim) + mask
        probs = F.softmax(scores, dim=-1, dtype=torch.float32)
        return self.o_proj(torch.matmul(probs, v).transpose(1, 2).reshape(b, s, -1))


class LlamaMLP(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    def __init__(self, hidden, heads, inter):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(hidden), RMSNorm(hidden)
        self.self_attn, self.mlp = LlamaAttention(hidden, heads), LlamaMLP(hidden, inter)

    def forward(self, x, mask, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), mask, cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, layers=2, hidden=1024, heads=16, inter=2816):
        super().__init__()
        self.layers = nn.ModuleList(LlamaLayer(hidden, heads, inter) for _ in range(layers))
        self.norm = RMSNorm(hidden)

    def forward(self, x, mask, cos, sin):
        for layer in self.layers:
            x = layer(x, mask, cos, sin)
        return self.norm(x)


def causal_mask(seq):
    return torch.full((seq, seq), torch.finfo(torch.float32).min).triu(1)[None, None]


def llama_inputs(seq, hidden=1024, head_dim=64):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(seq).float(), inv_freq)
    emb = torch.cat((freqs, freqs), -1)
    return torch.randn(1, seq, hidden), causal_mask(seq), emb.cos()[None, None], emb.sin()[None, None]


class GPT2Block(nn.Module):
    def __init__(self, hidden=768, heads=12):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.ln_1, self.ln_2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.c_attn, self.c_proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.c_fc, self.mlp_proj = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x, mask):
        b, s, h = x.shape
        q, k, v = (t.view(b, s, self.heads, self.head_dim).transpose(1, 2) for t in self.c_attn(self.ln_1(x)).split(h, dim=2))
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim) + mask
        a = torch.matmul(F.softmax(w, dim=-1), v).transpose(1, 2).reshape(b, s, h)
        x = x + self.c_proj(a)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class BasicBlock(nn.Module):
    def __init__(self, channels=64):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1, self.bn2 = nn.BatchNorm2d(channels), nn.BatchNorm2d(channels)
        for bn in (self.bn1, self.bn2):  # trained-looking statistics, not the identity
            bn.running_mean.normal_(0, 0.1)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.normal_(1, 0.1)
            bn.bias.data.normal_(0, 0.1)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + x)


def workloads():
    """name -> (description, model builder, inputs builder); built lazily, seeded."""
    return {
        "llama128": ("Llama 2 layers, seq 128", Llama, lambda: llama_inputs(128)),
        "llama512": ("Llama 2 layers, seq 512", Llama, lambda: llama_inputs(512)),
        "gpt2": ("GPT-2 block, seq 128", GPT2Block, lambda: (torch.randn(1, 128, 768), causal_mask(128))),
        "cnn": ("ResNet basic block 1x64x56x56", BasicBlock, lambda: (torch.randn(1, 64, 56, 56),)),
    }


# -- dpl's configurations --------------------------------------------------------------------------

LLM = ["rewrites", "llm"]
CONFIGS = {  # name -> (patterns, fuse_reductions, products); None: the unfused import on the NumPy backend
    "dpl numpy": None,
    "dpl cpu FuseOps": ([], False, "auto"),
    "dpl cpu +patterns": (LLM, False, "auto"),  # products="auto", the default (backends/cpu/products_choice.py)
    "dpl cpu +patterns +fr": (LLM, True, "auto"),
    "dpl cpu +patterns, OpenBLAS": (LLM, False, "numpy"),  # every product and convolution by NumPy's BLAS
    "dpl cpu +patterns, MKL": (LLM, False, "torch"),  # every product and convolution by torch (backends/cpu/blas.py)
    # kernel.attention as two BLAS products around a C softmax, not the flash kernel
    "dpl cpu +patterns, segments attn": (LLM, False, "auto", "segments"),
}
THREADS = None  # --threads: dpl's thread budget and torch's thread count (None: every core)


def run_dpl(name, mod, inputs, expected, cache_dir, timings):
    """Apply, build cold and warm, check against torch, time; returns the run time in ms."""
    config = CONFIGS[name]
    if config is None:
        exe, build_ms = timed(lambda: dpl.build(mod, "numpy"))
        timings[name] = {"build cold": build_ms}
    else:
        patterns, fuse_reductions, products, attention = (*config, "auto")[:4]
        fused, apply_ms = timed(lambda: dpl.apply(mod, patterns, fuse_reductions=fuse_reductions))
        cold_dir = tempfile.mkdtemp(dir=cache_dir)
        _, cold_ms = timed(lambda: dpl.build(fused, [CpuBackend(cache_dir=cold_dir, products=products, attention=attention), "numpy"],
                                             threads=THREADS))
        exe, warm_ms = timed(lambda: dpl.build(fused, [CpuBackend(cache_dir=cold_dir, products=products, attention=attention), "numpy"],
                                               threads=THREADS))
        timings[name] = {"apply": apply_ms, "build cold": cold_ms, "build warm": warm_ms}
    out = np.empty(expected.shape, expected.dtype)
    exe(*inputs, out=out)
    np.testing.assert_allclose(out, expected, rtol=2e-4, atol=2e-4, err_msg=f"{name} differs from torch")
    return exe, best(lambda: exe(*inputs, out=out), budget=2.0)


def run_torch(model, args, compile_too, timings):
    res = {}
    with torch.no_grad():
        res["torch eager"] = best(lambda: model(*args), budget=2.0)
        if compile_too:
            compiled = torch.compile(model)
            try:
                _, first_ms = timed(lambda: compiled(*args))
            except Exception as err:  # inductor needs a working C++ toolchain; report, do not crash
                print(f"torch.compile failed: {type(err).__name__}: {str(err).splitlines()[0]}", file=sys.stderr)
                return res
            timings["torch.compile"] = {"build cold": first_ms}
            res["torch.compile"] = best(lambda: compiled(*args), budget=2.0)
    return res


def bench(key, compile_too, profile, cache_dir):
    desc, make_model, make_inputs = workloads()[key]
    torch.manual_seed(0)
    model = make_model().eval()
    args = make_inputs()
    with torch.no_grad():
        expected = model(*args).numpy()
    inputs = [a.numpy() for a in args]
    timings = {}
    mod, import_ms = timed(lambda: dpl.from_torch(model, args))
    timings["import"] = {"import": import_ms}
    res, exes = {}, {}
    for name in CONFIGS:
        exes[name], res[name] = run_dpl(name, mod, inputs, expected, cache_dir, timings)
    res.update(run_torch(model, args, compile_too, timings))
    plan = exes["dpl cpu +patterns"].plan(*inputs)
    unfused = sorted({f"{name}: {group.decision}" for name, _, group in plan.decisions if not group.fused})
    timings["notes"] = unfused + ([plan.threads_note] if plan.threads_note else [])
    if profile:
        fastest = min((n for n in CONFIGS if n != "dpl numpy"), key=res.get)
        print(f"\n== {desc}: {fastest} ==\n{exes[fastest].summary()}\n{exes[fastest].profile(*inputs)}\n")
    return desc, res, timings


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", help=f"any of {', '.join(workloads())} (default: all)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--profile", action="store_true", help="print dpl's summary and per-kernel profile")
    parser.add_argument("--threads", type=int, help="threads for every contender (default: every core)")
    opts = parser.parse_args()
    global THREADS
    THREADS = opts.threads
    unknown = [w for w in opts.workloads if w not in workloads()]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(workloads())}")
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch.export's pytree notices
    torch.set_num_threads(opts.threads or os.cpu_count() or 1)
    rows = []
    with tempfile.TemporaryDirectory() as cache_dir:
        for key in opts.workloads or list(workloads()):
            rows.append(bench(key, not opts.no_compile, opts.profile, cache_dir))
    print(f"{opts.threads or os.cpu_count()} threads for every contender (load average {os.getloadavg()[0]:.1f}); ms, best of >= 5 runs; "
          "ratio = contender / best dpl cpu configuration (products 'auto' or OpenBLAS)")
    print(f"{'workload':<32} {'contender':<24} {'ms':>9} {'ratio':>7}")
    for desc, res, _ in rows:
        base = min(ms for who, ms in res.items() if who.startswith("dpl cpu") and "MKL" not in who)
        for who, ms in res.items():
            print(f"{desc:<32} {who:<24} {ms:9.2f} {ms / base:7.2f}")
            desc = ""
    print("\nwhat it costs to get there, ms (build cold: a fresh kernel cache directory; warm: the same directory;"
          " torch.compile: its first call)")
    print(f"{'workload':<32} {'step':<24} {'import':>9} {'apply':>9} {'build cold':>11} {'build warm':>11}")
    for desc, _, timings in rows:
        for who, t in timings.items():
            if who == "notes":
                continue
            cells = [f"{t[k]:9.1f}" if k in t else f"{'':>9}" for k in ("import", "apply")]
            cells += [f"{t[k]:11.1f}" if k in t else f"{'':>11}" for k in ("build cold", "build warm")]
            print(f"{desc:<32} {who:<24} {' '.join(cells)}")
            desc = ""
    print("\ndpl cpu +patterns, as its summary says: groups run op by op, and the threads")
    for desc, _, timings in rows:
        for note in timings["notes"] or ["every group fused"]:
            print(f"{desc:<32} {note}")
            desc = ""


if __name__ == "__main__":
    main()
