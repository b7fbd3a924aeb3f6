"""FuseOps time against the number of bindings, dpl beside TVM 0.27 on the same graph.

    python bench/bench_fuse_ops.py            # 1k, 10k, 50k bindings (TVM up to 10k)

The graph is a stack of transformer-like layers (norm, projections, attention scores,
softmax, MLP with SiLU, residuals). TVM's time is FuseOps alone (LegalizeOps and
AnnotateTIROpPattern run before the clock starts).
"""

import argparse
import sys
import time
from pathlib import Path


from dpl.ir import FunctionBuilder, Module
from dpl.transform import fuse_ops


def transformer(n_bindings: int):
    fb = FunctionBuilder("main")
    h = fb.param("x", "f32", (16, 64))
    w = fb.param("w", "f32", (64, 64))
    g = fb.param("g", "f32", (64,))
    count = 0
    while count < n_bindings:
        n = fb.emit("nn.rms_norm", h, g)
        q = fb.emit("matmul", n, w)
        k = fb.emit("permute_dims", fb.emit("matmul", n, w))
        s = fb.emit("multiply", fb.emit("matmul", q, k), 0.125)
        p = fb.emit("nn.softmax", s)
        a = fb.emit("matmul", p, fb.emit("matmul", n, w))
        h = fb.emit("add", h, fb.emit("matmul", a, w))
        m = fb.emit("nn.silu", fb.emit("matmul", fb.emit("nn.rms_norm", h, g), w))
        h = fb.emit("add", h, fb.emit("matmul", fb.emit("multiply", m, fb.emit("matmul", h, w)), w))
        count += 17
    return Module([fb.ret(h)])


def time_dpl(mod, repeat=3):
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fuse_ops(mod)
        best = min(best, time.perf_counter() - start)
    return best


def time_tvm(mod):
    try:
        import tvm
        from tvm import relax
    except ImportError:
        return None
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from tvm_oracle import to_relax

    with tvm.transform.PassContext(opt_level=3):
        legal = relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(to_relax(mod["main"])))
        start = time.perf_counter()
        relax.transform.FuseOps()(legal)
        return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[1000, 10000, 50000], help="transformer sizes, in bindings")
    sizes = parser.parse_args().sizes
    print(f"{'bindings':>9} {'dpl ms':>9} {'us/binding':>11} {'TVM ms':>9} {'TVM/dpl':>8}")
    for n in sizes:
        mod = transformer(n)
        nb = len(mod["main"].bindings)
        t = time_dpl(mod)
        tv = time_tvm(mod) if nb <= 11000 else None
        tvm_ms = f"{tv * 1e3:9.1f}" if tv else f"{'-':>9}"
        ratio = f"{tv / t:8.2f}" if tv else f"{'-':>8}"
        print(f"{nb:9d} {t * 1e3:9.1f} {t / nb * 1e6:11.1f} {tvm_ms} {ratio}")


if __name__ == "__main__":
    main()
