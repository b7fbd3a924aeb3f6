"""Bytes moved before and after fusion, and what lowering costs, on small model blocks.

    python bench/kernel_traffic.py

Prints, per graph: the traffic with one kernel per op (unfused), after row fusion
(`fuse_reductions`, everything else left one kernel per op), the floor (parameters in,
results out), and the time to partition and to lower every group.
"""

from __future__ import annotations

import argparse
import time

from dpl.ir import FunctionBuilder, Module
from dpl.kernel import lower_module
from dpl.kernel.row_fusion import fuse_reductions
from dpl.kernel.traffic import minimum_traffic, module_traffic


def rms_norm(fb, h, w):
    x = fb.emit("astype", h, dtype="f32")
    v = fb.emit("mean", fb.emit("multiply", x, x), axis=[-1], keepdims=True)
    y = fb.emit("astype", fb.emit("multiply", x, fb.emit("rsqrt", fb.emit("add", v, 1e-6))), dtype=h.ty.dtype)
    return fb.emit("multiply", w, y)


def softmax(fb, x):
    m = fb.emit("max", x, axis=[-1], keepdims=True)
    e = fb.emit("exp", fb.emit("subtract", x, m))
    return fb.emit("divide", e, fb.emit("sum", e, axis=[-1], keepdims=True))


def decoder(layers: int, tokens: int = 128, hidden: int = 4096, ffn: int = 11008, dtype: str = "f16") -> Module:
    """A llama-like stack: per layer a decomposed RMSNorm, a projection, a decomposed softmax
    over a [tokens, tokens] score matrix, a residual add, a second norm and a SiLU MLP."""
    fb = FunctionBuilder("main")
    h = fb.param("h", dtype, (tokens, hidden))
    for i in range(layers):
        wn = fb.param(f"norm{i}", dtype, (hidden,))
        wq = fb.param(f"wq{i}", dtype, (hidden, tokens))
        wo = fb.param(f"wo{i}", dtype, (tokens, hidden))
        wm = fb.param(f"wm{i}", dtype, (hidden, ffn))
        wd = fb.param(f"wd{i}", dtype, (ffn, hidden))
        s = softmax(fb, fb.emit("matmul", rms_norm(fb, h, wn), wq))
        h = fb.emit("add", h, fb.emit("matmul", s, wo))
        m = fb.emit("nn.silu", fb.emit("matmul", rms_norm(fb, h, wn), wm))
        h = fb.emit("add", h, fb.emit("matmul", m, wd))
    return Module([fb.ret(h)])


def mb(n: int) -> str:
    return f"{n / 2**20:9.1f}"


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    print(f"{'graph':<14}{'bindings':>9}{'unfused MiB':>13}{'row-fused MiB':>15}{'floor MiB':>11}{'partition ms':>14}{'lower ms':>10}{'kernels':>9}")
    for layers in (1, 4, 16):
        mod = decoder(layers)
        t0 = time.perf_counter()
        fused = fuse_reductions(mod)
        t1 = time.perf_counter()
        kernels = lower_module(fused)
        t2 = time.perf_counter()
        before, after, floor = module_traffic(mod), module_traffic(fused), minimum_traffic(mod["main"])
        print(
            f"{f'decoder x{layers}':<14}{len(mod['main'].bindings):>9}{mb(before.bytes):>13}{mb(after.bytes):>15}"
            f"{mb(floor.bytes):>11}{(t1 - t0) * 1e3:>14.1f}{(t2 - t1) * 1e3:>10.1f}{len(kernels):>9}"
        )


if __name__ == "__main__":
    main()
