"""Match 20 patterns against every binding of a transformer-like function.

    python bench/bench_match.py [--layers N]

Prints a table: bindings, patterns, matches, seconds and bindings per second, for growing
function sizes (the last row is about 50,000 bindings) -- the rate must stay flat (matching is
linear in the number of bindings) -- and, at full size, without the root-op index. Each row is
timed twice: as is, and with CPython's garbage collector off during the run (its full
collections re-scan the whole heap of IR objects, which is what bends the "gc on" column at
the large sizes; the "gc off" column is the matcher's own cost).
"""

from __future__ import annotations

import argparse
import gc
import time

from dpl.ir import FunctionBuilder, const
from dpl.pattern import Matcher, PatternIndex, is_const, is_op, match_bindings, wildcard


def transformer(layers: int, hidden: int = 64):
    """``layers`` decoder blocks, each: RMSNorm written out, q/k/v projections, scores,
    softmax written out, output projection, residual, RMSNorm, SwiGLU MLP, residual."""
    fb = FunctionBuilder("main")
    h = fb.param("h", "f16", ("n", hidden))
    weights = {k: fb.param(k, "f16", (hidden, hidden)) for k in ("wq", "wk", "wv", "wo", "wg", "wu", "wd")}
    norm_w = fb.param("norm_w", "f16", (hidden,))
    bias = fb.param("bias", "f16", (hidden,))

    def rms(x):
        x32 = fb.emit("astype", x, dtype="f32")
        var = fb.emit("mean", fb.emit("power", x32, 2.0), axis=[-1], keepdims=True)
        normed = fb.emit("multiply", x32, fb.emit("rsqrt", fb.emit("add", var, const(1e-6))))
        return fb.emit("multiply", norm_w, fb.emit("astype", normed, dtype="f16"))

    for _ in range(layers):
        x = rms(h)
        q = fb.emit("add", fb.emit("matmul", x, weights["wq"]), bias)
        k = fb.emit("matmul", x, weights["wk"])
        v = fb.emit("matmul", x, weights["wv"])
        scores = fb.emit("multiply", fb.emit("matmul", q, fb.emit("permute_dims", k)), const(0.125, "f16"))
        e = fb.emit("exp", fb.emit("subtract", scores, fb.emit("max", scores, axis=[-1], keepdims=True)))
        probs = fb.emit("divide", e, fb.emit("sum", e, axis=[-1], keepdims=True))
        attn = fb.emit("matmul", fb.emit("matmul", probs, v), weights["wo"])
        h = fb.emit("add", h, attn)
        y = rms(h)
        gate = fb.emit("nn.silu", fb.emit("matmul", y, weights["wg"]))
        up = fb.emit("matmul", y, weights["wu"])
        h = fb.emit("add", h, fb.emit("matmul", fb.emit("multiply", gate, up), weights["wd"]))
    return fb.ret(h)


def patterns():
    w = wildcard
    mm = lambda: is_op("matmul")(w(), w())  # noqa: E731
    x32 = is_op("astype")(w(), dtype="f32")
    var = is_op("mean")(is_op("power")(x32, is_const(2.0)), axis=[-1], keepdims=True)
    rms = is_op("multiply")(w(), is_op("astype")(is_op("multiply")(x32, is_op("rsqrt")(is_op("add")(var, is_const())))))
    s = w()
    e = is_op("exp")(is_op("subtract")(s, is_op("max")(s)))
    softmax = is_op("divide")(e, is_op("sum")(e))
    act = lambda x: is_op("nn.relu")(x) | is_op("nn.gelu")(x) | is_op("nn.silu")(x)  # noqa: E731
    return [
        rms,
        softmax,
        is_op("add")(mm(), w()),                                                  # matmul + bias
        act(is_op("add")(mm(), w())),                                             # matmul + bias + act
        is_op("multiply")(is_op("nn.silu")(mm()), mm()),                           # SwiGLU
        is_op("matmul")(w(), is_op("permute_dims")(w())),                         # q @ k^T
        is_op("multiply")(is_op("matmul")(w(), w()), is_const()),                 # scaled scores
        is_op("matmul")(is_op("divide")(w(), w()), w()),                          # probs @ v
        is_op("add")(w(), is_op("matmul")(is_op("matmul")(w(), w()), w())),       # residual + attention
        is_op("nn.silu")(mm()),
        is_op("nn.gelu")(mm()),                                                   # never matches
        is_op("nn.relu")(w()),                                                    # never matches
        is_op("astype")(w(), dtype="f32").has_shape(["n", None]),
        is_op("rsqrt")(is_op("add")(w(), is_const())),
        is_op("sum")(is_op("exp")(w()), axis=[-1]),
        mm().has_dtype("f16"),
        is_op("add")(w(), w()).has_dtype("f32"),
        is_op("layer_norm" if False else "nn.layer_norm")(w(), w(), w()),          # never matches
        is_op("divide")(w(), w()) | is_op("multiply")(w(), is_const()),
        wildcard().has_dtype("f16") & ~is_op("matmul")(w(), w()),                 # any op: not indexed
    ]


def run(fn, pats, indexed=True) -> tuple[int, float]:
    start = time.perf_counter()
    if indexed:
        found = len(match_bindings(PatternIndex(pats), fn))
    else:
        matcher, found = Matcher(fn), 0
        for b in fn.bindings:
            for p in pats:
                found += bool(matcher.match(p, b.value))
    return found, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=1430, help="decoder blocks (35 bindings each)")
    args = parser.parse_args()
    pats = patterns()
    print(f"{'bindings':>9} {'patterns':>8} {'index':>6} {'matches':>8} {'s, gc on':>9} {'bind/s':>8} "
          f"{'s, gc off':>9} {'bind/s':>8}")

    def row(fn, indexed):
        found, secs = run(fn, pats, indexed)
        gc.collect()
        gc.disable()
        try:
            found_off, secs_off = run(fn, pats, indexed)
        finally:
            gc.enable()
        assert found == found_off
        n = len(fn.bindings)
        print(f"{n:>9} {len(pats):>8} {'yes' if indexed else 'no':>6} {found:>8} {secs:>9.3f} {n / secs:>8,.0f} "
              f"{secs_off:>9.3f} {n / secs_off:>8,.0f}")
        return found

    for layers in (args.layers // 8, args.layers // 4, args.layers // 2, args.layers):
        fn = transformer(max(1, layers))
        found = row(fn, True)
    assert row(fn, False) == found, "the index changed the answers"

if __name__ == "__main__":
    main()
