"""The runtime's overhead and memory planning on a Llama-style decoder MLP, several layers deep.

    python bench/bench_runtime.py [--layers 4] [--n 128] [--hidden 512] [--inter 1376]
    python bench/bench_runtime.py --views [--size 4096] [--repeat 15]

Prints: time per call of dpl.interpret and of the Executable (numpy backend, fused groups on
and off), the plan's arena bytes with and without buffer reuse, and the per-kernel profile.
With ``--views``: what a lone reshape of a size x size f32 tensor costs, run as a view (now)
and as a copy kernel (before), between two kernels and at the output, on numpy and cpu; the
two builds' calls interleaved, medians quoted.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import numpy as np

import dpl
from dpl.ir import FunctionBuilder, Module


def model(layers: int, hidden: int, inter: int):
    gb = FunctionBuilder("fused_silu_multiply", attrs={"Primitive": True})
    g, u = gb.param("gate", "f32", ("n", inter)), gb.param("up", "f32", ("n", inter))
    swiglu = gb.ret(gb.emit("multiply", gb.emit("nn.silu", g), u))
    rb = FunctionBuilder("fused_add_rms_norm", attrs={"Primitive": True})
    x, r, w = rb.param("x", "f32", ("n", hidden)), rb.param("r", "f32", ("n", hidden)), rb.param("w", "f32", (hidden,))
    s = rb.emit("add", x, r)
    add_norm = rb.ret(s, rb.emit("nn.rms_norm", s, w, epsilon=1e-6))
    fb = FunctionBuilder("main")
    h = fb.param("x", "f32", ("n", hidden))
    resid = fb.emit("multiply", h, 0.0)
    weights = []
    for i in range(layers):
        nw = fb.param(f"norm{i}", "f32", (hidden,))
        wg, wu = fb.param(f"wg{i}", "f32", (hidden, inter)), fb.param(f"wu{i}", "f32", (hidden, inter))
        wd = fb.param(f"wd{i}", "f32", (inter, hidden))
        weights += [nw, wg, wu, wd]
        pair = fb.call(add_norm, h, resid, nw)
        resid, normed = fb.item(pair, 0), fb.item(pair, 1)
        act = fb.call(swiglu, fb.emit("matmul", normed, wg), fb.emit("matmul", normed, wu))
        h = fb.emit("matmul", act, wd)
    out = fb.emit("add", h, resid)
    return Module([fb.ret(out), swiglu, add_norm])


def best_ms(fn, repeat=5):
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return min(times)


def views_modules(size: int) -> dict[str, Module]:
    def between(fb, x):
        return fb.emit("tanh", fb.emit("reshape", fb.emit("exp", x), shape=[16, size * size // 16]))

    def at_output(fb, x):
        return fb.emit("reshape", fb.emit("exp", x), shape=[size * size])

    mods = {}
    for name, body in [("exp, reshape, tanh", between), ("exp, reshape returned", at_output)]:
        fb = FunctionBuilder("main")
        mods[name] = Module([fb.ret(body(fb, fb.param("x", "f32", (size, size))))])
    return mods


@contextlib.contextmanager
def views_as_copies():
    """Plans made meanwhile run every view op as a copy kernel, as before views (the plan of a
    static module is made at build)."""
    import dpl.runtime.plan as plan_module

    keep = plan_module.is_view
    plan_module.is_view = lambda call: False
    try:
        yield
    finally:
        plan_module.is_view = keep


def views_figure(size: int, repeat: int) -> None:
    x = np.random.default_rng(0).standard_normal((size, size)).astype(np.float32)
    print(f"a lone reshape of f32[{size}, {size}] ({size * size * 4 / 2**20:.0f} MiB): median ms per call, {repeat} interleaved calls each")
    print(f"{'module':<24} {'target':<7} {'copy kernel':>12} {'view':>8} {'ratio':>6}  kernel calls")
    for name, mod in views_modules(size).items():
        for target in ("numpy", "cpu"):
            with views_as_copies():
                before = dpl.build(mod, target)
            after = dpl.build(mod, target)
            want = dpl.interpret(mod, x)
            for exe in (before, after):
                np.testing.assert_allclose(exe(x), want, rtol=1e-6)
            times: dict[str, list[float]] = {"before": [], "after": []}
            for _ in range(repeat):
                for label, exe in (("before", before), ("after", after)):
                    t0 = time.perf_counter()
                    exe(x)
                    times[label].append((time.perf_counter() - t0) * 1e3)
            b, a = statistics.median(times["before"]), statistics.median(times["after"])
            calls = f"{len(before.plan(x).steps)} -> {len(after.plan(x).steps)}"
            print(f"{name:<24} {target:<7} {b:>12.2f} {a:>8.2f} {b / a:>6.2f}  {calls}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--inter", type=int, default=1376)
    ap.add_argument("--views", action="store_true", help="the cost of a lone reshape, as a view and as a copy")
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=15)
    a = ap.parse_args()
    if a.views:
        views_figure(a.size, a.repeat)
        return
    mod = model(a.layers, a.hidden, a.inter)
    rng = np.random.default_rng(0)
    args = [(rng.standard_normal(tuple(a.n if d == "n" else d for d in p.ty.shape)) * 0.05).astype(np.float32) for p in mod["main"].params]

    rows = [("dpl.interpret", best_ms(lambda: dpl.interpret(mod, *args)))]
    for label, cfg in [("build numpy, fusion on", dpl.FusionConfig()), ("build numpy, fusion off", dpl.FusionConfig(enable_fusion=False))]:
        exe = dpl.build(mod, "numpy", config=cfg)
        np.testing.assert_array_equal(exe(*args), dpl.interpret(mod, *args))
        t_first = time.perf_counter()
        dpl.build(mod, "numpy", config=cfg)(*args)
        first = (time.perf_counter() - t_first) * 1e3
        rows.append((label, best_ms(lambda: exe(*args))))
        rows.append((f"  first call incl. planning ({label.split(', ')[1]})", first))
    print(f"Llama MLP x{a.layers}, n={a.n}, hidden={a.hidden}, inter={a.inter}, f32")
    print(f"{'what':<44} {'ms':>9}")
    for name, ms in rows:
        print(f"{name:<44} {ms:>9.3f}")
    exe = dpl.build(mod, "numpy")
    plan = exe.plan(*args)
    print(f"\nplan: {len(plan.steps)} kernel calls; arena {plan.peak_bytes / 2**20:.2f} MiB in {len(plan.slot_sizes)} buffers, "
          f"without reuse {plan.unplanned_bytes / 2**20:.2f} MiB; outputs {plan.output_bytes / 2**20:.2f} MiB\n")
    print(exe.profile(*args, repeat=5))


if __name__ == "__main__":
    main()
