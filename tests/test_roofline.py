"""bench/roofline.py: the flops a module's products and convolutions compute, and the probe of
this machine's float32 FMA peak that bench_zoo.py measures each row against."""

import sys
from pathlib import Path

import needs
import numpy as np

from dpl.ir import FunctionBuilder, Module, const
from dpl.ir.expr import Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import roofline  # noqa: E402


def test_product_flops_counts_each_multiply_add_twice():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (2, 5, 7))
    y = fb.emit("matmul", x, const(np.ones((7, 3), np.float32)))  # 2 x 5 x 3 outputs of 7 products each
    img = fb.param("img", "f32", (2, 4, 9, 9))
    w = const(np.ones((6, 2, 3, 3), np.float32))  # two groups: each output sums 2 x 3 x 3 products
    c = fb.emit("nn.conv2d", img, w, strides=(2, 2), groups=2)  # 2 x 6 x 4 x 4 outputs
    s = fb.emit("add", fb.emit("sum", y), fb.emit("sum", c))  # no products
    t = fb.bind(Tuple((s, y)))  # a tuple binding: no products either
    mod = Module([fb.ret(fb.item(t, 0))])
    assert roofline.product_flops(mod) == 2 * (2 * 5 * 3 * 7) + 2 * (2 * 6 * 4 * 4 * 2 * 3 * 3)


def test_product_flops_counts_batched_products_by_their_result():
    fb = FunctionBuilder("main")
    q, k = fb.param("q", "f32", (3, 4, 8, 16)), fb.param("k", "f32", (3, 4, 16, 8))
    mod = Module([fb.ret(fb.emit("matmul", q, k))])
    assert roofline.product_flops(mod) == 2 * 3 * 4 * 8 * 8 * 16


def test_the_probe_measures_a_plausible_peak(tmp_path):
    needs.c_compiler()
    from dpl.backends.cpu.backend import KernelCache

    one = roofline.fma_peak(1, KernelCache(tmp_path), seconds=0.01, tries=2)
    assert 1e9 < one < 1e13  # a float32 vector unit of this century: between 1 GFLOP/s and 10 TFLOP/s a core
