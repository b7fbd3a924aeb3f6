"""The CPU backend's matrix products by another library (backends/cpu/blas.py): with
``products="torch"`` every product, batched, broadcast, with an epilogue, of a constant
read-only weight, and the product of an im2col convolution equal the interpreter; dtypes torch
does not take run through NumPy; the kernels name the pool their products run on."""

import warnings

import numpy as np
import pytest

import needs

import dpl
from dpl.backends.cpu import blas
from dpl.backends.cpu.blas import NumpyProducts
from dpl.backends.cpu.products_choice import products
from dpl.ir import FunctionBuilder, Module, const


@pytest.fixture(scope="module")
def torch_cpu(tmp_path_factory):
    from dpl.backends.cpu.backend import CpuBackend

    needs.package("torch")
    needs.c_compiler()
    return CpuBackend(cache_dir=tmp_path_factory.mktemp("kernels"), products="torch")


def run(backend, mod, args):
    exe = dpl.build(dpl.apply(mod, ["llm"]), [backend, "numpy"], config=dpl.FusionConfig(min_nodes_for_fusion=1, min_tensor_elements=0, fallback_on_error=False))
    return exe(*args), exe


def rand(*shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed + len(shape)).standard_normal(shape).astype(dtype)


CASES = {
    "epilogue": ("""
func main(x: f32[16, 32], w: f32[32, 24], b: f32[24]) -> f32[16, 24] {
  m = matmul(x, w)
  y = nn.silu(add(m, b))
  return y
}""", [(16, 32), (32, 24), (24,)]),
    "attention": ("""
func main(q: f32[2, 4, 8, 16], k: f32[2, 4, 16, 8], v: f32[2, 4, 8, 16], mask: f32[1, 1, 8, 8]) -> f32[2, 4, 8, 16] {
  s = matmul(q, k)
  z = multiply(s, 0.25)
  m = add(z, mask)
  p = nn.softmax(m)
  o = matmul(p, v)
  return o
}""", [(2, 4, 8, 16), (2, 4, 16, 8), (2, 4, 8, 16), (1, 1, 8, 8)]),
    "broadcast batch": ("""
func main(x: f32[3, 5, 7], w: f32[7, 4]) -> f32[3, 5, 4] {
  y = matmul(x, w)
  return y
}""", [(3, 5, 7), (7, 4)]),
    "float64": ("""
func main(x: f64[6, 9], w: f64[9, 3]) -> f64[6, 3] {
  y = matmul(x, w)
  return y
}""", [(6, 9), (9, 3)]),
    "float16 (by NumPy)": ("""
func main(x: f16[6, 9], w: f16[9, 3]) -> f16[6, 3] {
  y = matmul(x, w)
  return y
}""", [(6, 9), (9, 3)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_products_by_torch_equal_the_interpreter(torch_cpu, case):
    text, shapes = CASES[case]
    mod = dpl.parse(text)
    dtypes = [dpl.dtypes.to_numpy(p.ty.dtype) for p in mod["main"].params]
    args = [rand(*s, dtype=d) for s, d in zip(shapes, dtypes)]
    got, exe = run(torch_cpu, mod, args)
    tol = 1e-2 if case.startswith("float16") else 1e-5
    np.testing.assert_allclose(got.astype(np.float64), dpl.interpret(mod, *args).astype(np.float64), rtol=tol, atol=tol)
    pools = set().union(*(getattr(s.kernel, "thread_pools", ()) for s in exe.plan(*args).steps))
    assert torch_cpu.products.thread_pool in pools and "blas" not in pools


def test_torch_shares_the_kernels_openmp_team_when_it_says_so(torch_cpu):
    """When the provider names the kernels' OpenMP pool, torch's libgomp and the kernels' are one
    library in this process (threadpoolctl sees one OpenMP runtime), so the plan keeps its threads."""
    from threadpoolctl import threadpool_info

    text, shapes = CASES["epilogue"]
    mod = dpl.parse(text)
    args = [rand(*s) for s in shapes]
    _, exe = run(torch_cpu, mod, args)
    openmp = {i["filepath"] for i in threadpool_info() if i["user_api"] == "openmp"}
    if torch_cpu.products.thread_pool == "openmp":
        assert len(openmp) == 1
        assert exe.plan(*args).threads_note is None  # nothing capped
    else:
        assert torch_cpu.products.thread_pool == "torch"


def test_a_read_only_constant_weight_is_wrapped_once_without_a_warning(torch_cpu):
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4, 8))
    w = rand(8, 5)
    w.setflags(write=False)  # as dpl.from_torch binds a model's weights
    y = fb.emit("matmul", x, const(w, name="w"))
    mod = Module([fb.ret(y)])
    args = [rand(4, 8)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            got, _ = run(torch_cpu, mod, args)
    np.testing.assert_allclose(got, args[0] @ w, rtol=1e-5, atol=1e-5)
    assert len(torch_cpu.products._kept) >= 1


def test_convolution_product_by_torch(torch_cpu):
    fb = FunctionBuilder("main")
    x, w = fb.param("x", "f32", (1, 4, 9, 9)), fb.param("w", "f32", (6, 4, 3, 3))
    mod = Module([fb.ret(fb.emit("nn.conv2d", x, w, padding=[1, 1, 1, 1]))])
    args = [rand(1, 4, 9, 9), rand(6, 4, 3, 3)]
    got, exe = run(torch_cpu, mod, args)
    np.testing.assert_allclose(got, dpl.interpret(mod, *args), rtol=1e-5, atol=1e-4)
    assert exe.plan(*args).steps[0].kernel.__qualname__.startswith("cpu-blas+c:")


def test_numpy_products_cast_into_a_narrower_output():
    a, b = rand(3, 4, dtype=np.float64), rand(4, 2, dtype=np.float64)
    out = np.empty((3, 2), np.float32)
    NumpyProducts().matmul(a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-6)


def test_an_unknown_library_is_an_error():
    with pytest.raises(dpl.DplError, match="unknown products library 'mkl'"):
        products("mkl")


def test_float32_products_run_in_torch(tmp_path, monkeypatch):
    """Attention as its segments (its two products and the softmax between them; "auto" would
    take the flash kernel, which has no product to give torch)."""
    import torch

    from dpl.backends.cpu.backend import CpuBackend

    needs.package("torch")
    needs.c_compiler()
    calls = []
    real = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda *a, **k: calls.append(1) or real(*a, **k))
    text, shapes = CASES["attention"]
    mod = dpl.parse(text)
    args = [rand(*s) for s in shapes]
    got, _ = run(CpuBackend(cache_dir=tmp_path, products="torch", attention="segments"), mod, args)
    np.testing.assert_allclose(got, dpl.interpret(mod, *args), rtol=1e-5, atol=1e-5)
    assert len(calls) >= 2  # both products of the attention (each call of the plan)


@pytest.mark.parametrize("case", ["3x3 same", "stride 2", "asymmetric padding", "dilation", "groups", "depthwise", "1x1"])
def test_convolutions_by_torch_equal_the_interpreter(torch_cpu, case):
    """torch's own convolution (symmetric padding) or im2col and torch's matmul (the rest), with
    a bias-and-ReLU epilogue in the generated C, as a ResNet block's batch norm leaves it."""
    from test_cpu_conv import CASES as CONV, args_for, conv_module

    x, w, attrs = CONV[case]
    mod = conv_module(x, w, attrs, epilogue=True)
    args = args_for(mod)
    got, exe = run(torch_cpu, mod, args)
    np.testing.assert_allclose(got, dpl.interpret(mod, *args), rtol=1e-4, atol=1e-4)
    assert exe.plan(*args).steps[0].kernel.__qualname__.startswith("cpu-blas+c:")


def test_a_torch_convolution_keeps_nan_where_padding_meets_a_nonfinite_weight(torch_cpu):
    """oneDNN skips the padding; the interpreter multiplies it: 0 * inf and 0 * NaN are NaN there."""
    from test_cpu_conv import args_for, conv_module

    mod = conv_module((1, 2, 6, 6), (3, 2, 3, 3), dict(padding=[1, 1, 1, 1]))
    x, w = args_for(mod)
    w[0, 0, 0, 0], w[1, 1, 2, 2] = np.inf, np.nan
    got, _ = run(torch_cpu, mod, [x, w])
    want = dpl.interpret(mod, x, w)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-4)


def test_a_1x1_convolution_is_a_product_not_a_onednn_convolution():
    """A 1x1 window (strided or not) goes to im2col and the provider's matmul, which beats
    oneDNN's reorder-then-convolve; a wider window goes to torch's convolution."""
    needs.package("torch")
    from test_cpu_conv import conv_module

    torch = blas.TorchProducts()
    conv = lambda x, w, attrs: conv_module(x, w, attrs)["main"].bindings[0].value  # noqa: E731
    assert torch.conv2d(conv((1, 16, 8, 8), (8, 16, 1, 1), {})) is None
    assert torch.conv2d(conv((1, 16, 8, 8), (8, 16, 1, 1), dict(strides=[2, 2]))) is None
    assert callable(torch.conv2d(conv((1, 16, 8, 8), (8, 16, 3, 3), dict(padding=[1, 1, 1, 1]))))
