"""One convolution through dpl's CPU backend, NCHW (the frontends' layout) against NHWC (the
convert-layout pass's), at ResNet's shapes: the per-convolution case for the layout pass.

    python bench/bench_conv_layout.py              # 1 thread, median of 9 interleaved samples
    python bench/bench_conv_layout.py --threads 2 --repeat 15

Each row builds ``nn.conv2d`` alone (constant weights, batch 1) in both layouts with
``dpl.build(..., "cpu")`` and times the plain call, CPU time (``time.process_time``) per call,
the two layouts sampled in turn; the outputs are checked against each other first. The host is
shared: the load average is printed beside the table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

# (label, input channels, output channels, kernel, stride, padding, size)
CONVS = [
    ("3x3 64->64 @56", 64, 64, 3, 1, 1, 56),
    ("7x7/2 stem 3->64 @224", 3, 64, 7, 2, 3, 224),
    ("3x3 128->128 @28", 128, 128, 3, 1, 1, 28),
    ("3x3 256->256 @14", 256, 256, 3, 1, 1, 14),
    ("1x1 64->256 @56", 64, 256, 1, 1, 0, 56),
]


def build(dpl, CpuBackend, layout: str, cin: int, cout: int, k: int, stride: int, pad: int, size: int, w: np.ndarray, threads: int):
    from dpl.ir.expr import Binding, Constant, Function, Module, Var
    from dpl.ir.types import TensorType
    from dpl.ops.registry import make_call

    nhwc = layout == "NHWC"
    x = Var("x", TensorType((1, size, size, cin) if nhwc else (1, cin, size, size), "float32"))
    weight = Constant(np.ascontiguousarray(w.transpose(0, 2, 3, 1)) if nhwc else w, name="w")
    attrs = {"strides": (stride, stride), "padding": (pad, pad)}
    if nhwc:
        attrs.update(data_layout="NHWC", kernel_layout="OHWI")
    call = make_call("nn.conv2d", [x, weight], attrs)
    y = Var("y", call.ty)
    mod = Module({"main": Function("main", (x,), (Binding(y, call),), y)})
    return dpl.build(dpl.apply(mod), [CpuBackend(cache_dir=tempfile.mkdtemp())], threads=threads, progress=False)


def per_call_ms(fn, seconds: float = 0.2) -> float:
    n, start = 0, time.process_time()
    while time.process_time() - start < seconds:
        fn()
        n += 1
    return (time.process_time() - start) / n * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=9)
    opts = parser.parse_args()
    import torch

    import dpl
    from dpl.backends.cpu.backend import CpuBackend

    torch.set_num_threads(opts.threads)
    rng = np.random.default_rng(0)
    print(f"one convolution, batch 1, {opts.threads} thread(s), CPU ms per call, median of {opts.repeat}; "
          f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"{'convolution':<24} {'NCHW':>8} {'NHWC':>8} {'NHWC/NCHW':>10}")
    for label, cin, cout, k, stride, pad, size in CONVS:
        w = rng.standard_normal((cout, cin, k, k)).astype("float32")
        x = rng.standard_normal((1, cin, size, size)).astype("float32")
        x_nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        nchw = build(dpl, CpuBackend, "NCHW", cin, cout, k, stride, pad, size, w, opts.threads)
        nhwc = build(dpl, CpuBackend, "NHWC", cin, cout, k, stride, pad, size, w, opts.threads)
        np.testing.assert_allclose(nhwc(x_nhwc), nchw(x).transpose(0, 2, 3, 1), rtol=1e-3, atol=1e-3)
        samples = {"NCHW": [], "NHWC": []}
        for _ in range(opts.repeat):
            samples["NCHW"].append(per_call_ms(lambda: nchw(x)))
            samples["NHWC"].append(per_call_ms(lambda: nhwc(x_nhwc)))
        a, b = (statistics.median(samples[t]) for t in ("NCHW", "NHWC"))
        print(f"{label:<24} {a:8.3f} {b:8.3f} {b / a:10.2f}")


if __name__ == "__main__":
    main()
