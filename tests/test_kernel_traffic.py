"""The traffic model on cases computed by hand."""

import pytest

from dpl.errors import DplError
from dpl.ir import FunctionBuilder, Module
from dpl.kernel import lower_function
from dpl.kernel.row_fusion import fuse_reductions
from dpl.kernel.traffic import Traffic, function_traffic, kernel_traffic, minimum_traffic, module_traffic, unfused_traffic

MB4 = 1024 * 1024 * 4  # one f32[1024, 1024]


def exp_add(fb):
    x = fb.param("x", "f32", (1024, 1024))
    y = fb.param("y", "f32", (1024, 1024))
    return fb.ret(fb.emit("add", fb.emit("exp", x), y))


def test_exp_add_fused_vs_unfused():
    prim = exp_add(FunctionBuilder("fused_exp_add", attrs={"Primitive": True}))
    main = FunctionBuilder("main")
    x = main.param("x", "f32", (1024, 1024))
    y = main.param("y", "f32", (1024, 1024))
    fused = Module([main.ret(main.call(prim, x, y)), prim])
    unfused = Module([exp_add(FunctionBuilder("main"))])

    # fused: read x and y once, write the sum once; exp and add per element
    assert module_traffic(fused) == Traffic(read=2 * MB4, written=MB4, flops=2 * 1024 * 1024)
    # unfused: exp reads x, writes e; add reads e and y, writes the sum
    assert module_traffic(unfused) == Traffic(read=3 * MB4, written=2 * MB4, flops=2 * 1024 * 1024)
    assert unfused_traffic(unfused["main"]) == module_traffic(unfused)
    assert minimum_traffic(unfused["main"]) == Traffic(read=2 * MB4, written=MB4, flops=0)
    assert module_traffic(fused).bytes == 12 * 1024 * 1024


def test_row_reduction_with_symbolic_rows():
    fb = FunctionBuilder("f", attrs={"Primitive": True})
    x = fb.param("x", "f32", ("n", 128))
    f = fb.ret(fb.emit("sum", fb.emit("exp", x), axis=[-1], keepdims=True))
    # per element: exp and one add into the accumulator
    assert function_traffic(f, {"n": 64}) == Traffic(read=64 * 128 * 4, written=64 * 4, flops=2 * 64 * 128)
    with pytest.raises(DplError, match="symbolic dimension 'n'"):
        function_traffic(f)


def test_softmax_f16_row_kernel():
    fb = FunctionBuilder("f", attrs={"Primitive": True})
    x = fb.param("x", "f16", (8, 256))
    t = function_traffic(fb.ret(fb.emit("nn.softmax", x)))
    n = 8 * 256
    # max pass: 1 op/elt; per row: the exp floor max - 87; sum pass: the floor test (in the
    # clamp and in the select: counted twice), subtract, exp, add; output: the same with divide
    # (casts and selects free)
    assert t == Traffic(read=n * 2, written=n * 2, flops=11 * n + 8)


def test_matmul_bias_epilogue():
    fb = FunctionBuilder("f", attrs={"Primitive": True})
    x = fb.param("x", "f32", ("n", 64))
    w = fb.param("w", "f32", (64, 16))
    b = fb.param("b", "f32", (16,))
    f = fb.ret(fb.emit("add", fb.emit("matmul", x, w), b))
    t = function_traffic(f, {"n": 32})
    assert t.read == (32 * 64 + 64 * 16 + 16) * 4
    assert t.written == 32 * 16 * 4
    assert t.flops == 2 * 32 * 16 * 64 + 32 * 16  # multiply-add per k, then the bias add
    assert t.intensity == pytest.approx(t.flops / (t.read + t.written))


def test_row_statistic_and_row_share_one_read():
    fb = FunctionBuilder("f", attrs={"Primitive": True})
    x = fb.param("x", "f32", (4, 6))
    s = fb.emit("sum", x, axis=[1], keepdims=True)
    t = function_traffic(fb.ret(fb.emit("divide", x, s), s))
    assert (t.read, t.written, t.flops) == (4 * 6 * 4, (4 * 6 + 4) * 4, 2 * 4 * 6)


def test_nests_of_unrelated_shapes_each_read_the_input():
    fb = FunctionBuilder("f", attrs={"Primitive": True})
    x = fb.param("x", "f32", (4, 6))
    e = fb.emit("exp", x)
    k = lower_function(fb.ret(e, fb.emit("permute_dims", e)))
    assert len(k.body) == 2
    assert kernel_traffic(k) == Traffic(read=2 * 4 * 6 * 4, written=2 * 4 * 6 * 4, flops=2 * 4 * 6)


def test_decomposed_softmax_before_and_after_row_fusion():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (128, 1024))
    m = fb.emit("max", x, axis=[-1], keepdims=True)
    e = fb.emit("exp", fb.emit("subtract", x, m))
    mod = Module([fb.ret(fb.emit("divide", e, fb.emit("sum", e, axis=[-1], keepdims=True)))])
    B, r = 128 * 1024 * 4, 128 * 4
    before = module_traffic(mod)
    assert (before.read, before.written) == (5 * B + 2 * r, 3 * B + 2 * r)
    after = module_traffic(fuse_reductions(mod))
    assert (after.read, after.written) == (B, B)
    assert (after.read, after.written) == (minimum_traffic(mod["main"]).read, minimum_traffic(mod["main"]).written)


def test_softmax_over_a_middle_axis_reduces_once_per_row():
    fb = FunctionBuilder("f", attrs={"Primitive": True})
    x = fb.param("x", "f32", (5, 3, 4))
    t = function_traffic(fb.ret(fb.emit("nn.softmax", x, axis=1)))
    # 20 rows of 3: max 1 op, sum 5 ops, output 5 ops per element of a row (the exp floor's
    # test counted twice, see test_softmax_f16_row_kernel), and the floor once per row
    assert t.flops == 20 * 3 * 11 + 20
