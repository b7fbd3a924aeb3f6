"""Convolutions on the CPU backend run as one BLAS product (backends/cpu/im2col.py) or torch's own
(backends/cpu/blas.py), each of these tests on both: every stride,
padding, dilation and group count equals the interpreter, alone and with an epilogue the
generated C applies; what im2col does not take (float16, other layouts) stays with the kernel
IR's loops and is right too."""

import numpy as np
import pytest

import needs

import dpl
from dpl.backends.cpu.im2col import Conv2d, takes
from dpl.ir import FunctionBuilder, Module

FUSE_ALL = dpl.FusionConfig(min_nodes_for_fusion=1, min_tensor_elements=0, max_graph_size=1000, fallback_on_error=False)


@pytest.fixture(scope="module", params=["numpy", "torch"])
def cpu(request, tmp_path_factory):
    """The backend with im2col and NumPy's BLAS, and with torch's convolutions
    (``products="auto"`` takes either, by measurement: backends/cpu/products_choice.py)."""
    from dpl.backends.cpu.backend import CpuBackend

    needs.c_compiler()
    if request.param == "torch":
        needs.package("torch")
    return CpuBackend(cache_dir=tmp_path_factory.mktemp("kernels"), products=request.param)


# (input NCHW, weight OIHW, attributes)
CASES = {
    "3x3 same": ((1, 8, 10, 12), (6, 8, 3, 3), dict(padding=[1, 1, 1, 1])),
    "stride 2": ((2, 4, 11, 9), (5, 4, 3, 3), dict(strides=[2, 2], padding=[1, 1, 1, 1])),
    "asymmetric padding": ((1, 3, 7, 8), (4, 3, 3, 2), dict(padding=[0, 2, 1, 0])),
    "dilation": ((1, 3, 12, 12), (4, 3, 3, 3), dict(dilation=[2, 3], padding=[2, 1, 2, 1])),
    "groups": ((1, 6, 9, 9), (9, 2, 3, 3), dict(groups=3, padding=[1, 1, 1, 1])),
    "depthwise": ((1, 4, 8, 8), (4, 1, 3, 3), dict(groups=4, strides=[2, 1])),
    "1x1": ((2, 16, 7, 5), (8, 16, 1, 1), {}),
    "no padding 5x5": ((1, 2, 9, 9), (3, 2, 5, 5), {}),
}


def conv_module(x, w, attrs, dtype="f32", epilogue=False, **extra):
    fb = FunctionBuilder("main")
    xv, wv = fb.param("x", dtype, x), fb.param("w", dtype, w)
    y = fb.emit("nn.conv2d", xv, wv, **attrs, **extra)
    if epilogue:  # a per-channel bias and a ReLU, as a ResNet block's batch norm leaves them
        b = fb.param("b", dtype, (1, w[0], 1, 1))
        y = fb.emit("nn.relu", fb.emit("add", y, b))
    return Module([fb.ret(y)])


def args_for(mod, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(tuple(p.ty.shape)).astype(dpl.dtypes.to_numpy(p.ty.dtype)) for p in mod["main"].params]


def run_fused(cpu, mod, args):
    fused = dpl.apply(mod)
    exe = dpl.build(fused, [cpu, "numpy"], config=FUSE_ALL)
    out = exe(*args)
    kernels = [s.kernel for s in exe.plan(*args).steps]
    return out, kernels


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("epilogue", [False, True], ids=["alone", "epilogue"])
def test_convolutions_through_blas_equal_the_interpreter(cpu, case, epilogue):
    mod = conv_module(*CASES[case], epilogue=epilogue)
    args = args_for(mod)
    out, kernels = run_fused(cpu, mod, args)
    np.testing.assert_allclose(out, dpl.interpret(mod, *args), rtol=1e-5, atol=1e-4)
    assert len(kernels) == 1 and kernels[0].__qualname__.startswith("cpu-blas+c:")
    assert len(kernels[0].parts) == (1 if epilogue else 0)  # the epilogue is one C kernel after the product


def test_float64_through_blas(cpu):
    mod = conv_module(*CASES["stride 2"], dtype="f64")
    args = args_for(mod)
    out, kernels = run_fused(cpu, mod, args)
    np.testing.assert_allclose(out, dpl.interpret(mod, *args), rtol=1e-12, atol=1e-12)
    assert kernels[0].__qualname__.startswith("cpu-blas+c:")


def test_float16_stays_with_the_kernel_loops(cpu):
    mod = conv_module(*CASES["3x3 same"], dtype="f16")
    args = args_for(mod)
    out, kernels = run_fused(cpu, mod, args)
    np.testing.assert_allclose(out.astype(np.float64), dpl.interpret(mod, *args).astype(np.float64), rtol=5e-3, atol=5e-2)
    assert kernels[0].__qualname__.startswith("cpu:")


def test_what_im2col_takes():
    conv = conv_module(*CASES["3x3 same"])["main"].bindings[0].value
    assert takes(conv)
    half = conv_module(*CASES["3x3 same"], dtype="f16")["main"].bindings[0].value
    assert not takes(half)
    wider = conv_module(*CASES["1x1"], out_dtype="float64")["main"].bindings[0].value
    assert not takes(wider)  # accumulating into another dtype: the kernel loops
    assert not takes(conv_module(*CASES["1x1"], epilogue=True)["main"].bindings[-1].value)  # the ReLU


def test_the_workspace_is_reused_and_results_do_not_alias_it():
    mod = conv_module(*CASES["3x3 same"])
    call = mod["main"].bindings[0].value
    conv = Conv2d(call.attrs)
    x, w = args_for(mod)
    first = conv(x, w)
    second = conv(x * 2, w)
    np.testing.assert_allclose(second, 2 * first, rtol=1e-5, atol=1e-5)  # the first result was not overwritten
    np.testing.assert_allclose(first, dpl.interpret(mod, x, w), rtol=1e-5, atol=1e-4)
    strided = np.empty((1, 6, 10, 24), np.float32)[:, :, :, ::2]  # a non-contiguous destination
    conv(x, w, strided)
    np.testing.assert_allclose(strided, first, rtol=1e-6)
