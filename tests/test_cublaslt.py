"""cuBLASLt epilogues for ``cublas.matmul_bias(_act)``, without a GPU: the ctypes binding runs
against a stand-in library (tests/fake_cublaslt.py) that computes what cuBLASLt's column-major
API means at the addresses it is given, inside the stand-in CuPy. What runs on a real
libcublasLt is checked by ``pytest -m gpu`` (tests/test_gpu.py) where there is a device."""

import attrs
import numpy as np
import pytest

import needs

import dpl
from dpl.backends.cuda import cublaslt
from dpl.backends.cuda.backend import CupyBackend
from dpl.ir import Module

from fake_cublaslt import FakeCublasLt
from fake_cupy import FakeCupy
from test_cpu_backend import ALWAYS, random_args

EPILOGUES = """
func relu(x: {t}[6, 32], w: {t}[32, 24], b: {t}[24]) -> {t}[6, 24] {{
  y = nn.relu(add(matmul(x, w), b))
  return y
}}
func gelu_tanh(x: {t}[6, 32], w: {t}[32, 24], b: {t}[24]) -> {t}[6, 24] {{
  y = nn.gelu_tanh(add(matmul(x, w), b))
  return y
}}
func bias(x: {t}[2, 5, 32], w: {t}[32, 24], b: {t}[24]) -> {t}[2, 5, 24] {{
  y = add(b, matmul(x, w))
  return y
}}
func gelu(x: {t}[6, 32], w: {t}[32, 24], b: {t}[24]) -> {t}[6, 24] {{
  y = nn.gelu(add(matmul(x, w), b))
  return y
}}
"""
TOLERANCE = {"f32": 1e-5, "f16": 2e-2, "bf16": 8e-2}


@pytest.fixture
def fake(cxx):
    return FakeCupy()


def run(fake, t, name, lib, seed=0):
    if t == "bf16":
        needs.package("ml_dtypes")
    fn = attrs.evolve(dpl.parse(EPILOGUES.format(t=t))[name], name="main")
    mod = Module([fn])
    backend = CupyBackend(cupy=fake, block=8, cublaslt=lib)
    exe = dpl.build(dpl.apply(mod, ["cublas"]), [backend, "numpy"], config=ALWAYS)
    for s in (seed, seed + 1):
        args = random_args(mod["main"], s)
        got, want = exe(*args), dpl.interpret(mod, *args)
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=TOLERANCE[t], atol=TOLERANCE[t])
    return exe, backend


@pytest.mark.parametrize("t", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("name", ["relu", "gelu_tanh", "bias"])
def test_epilogues_in_one_cublaslt_gemm(fake, t, name):
    lib = FakeCublasLt(fake)
    exe, _ = run(fake, t, name, lib)
    activation = {"relu": "nn.relu", "gelu_tanh": "nn.gelu_tanh", "bias": None}[name]
    dtype = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[t]
    assert f"one cuBLASLt GEMM with its epilogue ({activation or 'bias'}, {dtype})" in exe.summary(), exe.summary()
    assert fake.matmuls == 0 and not fake.launches  # no cupy.matmul, no epilogue kernel
    assert [c for c in lib.calls if c[0] == "matmul"]


def test_the_row_major_product_as_cublaslt_column_major_layouts(fake):
    lib = FakeCublasLt(fake)
    run(fake, "f16", "bias", lib)  # x [2, 5, 32] @ w [32, 24]: m = 10, k = 32, n = 24
    layouts = [c[1:] for c in lib.calls if c[0] == "layout"]
    code = cublaslt.CUDA_R_16F
    assert layouts == [(code, 24, 32, 24), (code, 32, 10, 32), (code, 24, 10, 24)]  # A = w^T, B = x^T, D = out^T
    desc = next(iter(lib.descs.values()))
    assert desc[cublaslt.DESC_EPILOGUE] == cublaslt.EPILOGUE_BIAS
    assert desc["compute"] == cublaslt.CUBLAS_COMPUTE_32F and desc["scale"] == cublaslt.CUDA_R_32F
    assert len([c for c in lib.calls if c[0] == "desc"]) == 1  # kept from call to call
    assert len([c for c in lib.calls if c[0] == "matmul"]) == 3  # the first run, its capture, the trial's steps


def test_erf_gelu_has_no_epilogue_and_runs_as_product_and_kernel(fake):
    lib = FakeCublasLt(fake)
    exe, _ = run(fake, "f32", "gelu", lib)
    assert "not cuBLASLt (cuBLASLt's GELU epilogue is the tanh approximation" in exe.summary()
    # the product a plain cuBLASLt GEMM, the epilogue one kernel: run once, captured once, run
    # once more by the trial against the graph's replay
    assert fake.matmuls == 0 and len(fake.launches) == 3
    plain = [c for c in lib.calls if c[0] == "matmul" and lib.descs[c[1]][cublaslt.DESC_EPILOGUE] == cublaslt.EPILOGUE_DEFAULT]
    assert len(plain) == 3 and "CUDA graph captured, replayed 1 time(s)" in exe.summary(), exe.summary()


def test_without_the_library_the_fall_back_is_recorded(fake, monkeypatch):
    def missing(cuda_major=None):
        raise cublaslt.CublasLtError("libcublasLt is not installed")

    monkeypatch.setattr(cublaslt, "load_library", missing)
    exe, _ = run(fake, "f32", "relu", None)
    assert "cupy.matmul and a generated epilogue kernel, not cuBLASLt (libcublasLt is not installed)" in exe.summary(), exe.summary()
    # CuPy refuses cuBLAS inside a capture: the plan runs step by step, and says why
    assert "step by step: a step cannot be captured (NotImplementedError: calling cuBLAS API during stream capture" in exe.summary()
    assert fake.matmuls == 3  # the first run, the capture that refused, the second run
    exe, _ = run(FakeCupy(), "f32", "relu", False)
    assert "not cuBLASLt (cuBLASLt is off)" in exe.summary()


def test_a_gemm_cublaslt_refuses_falls_back_at_its_first_call(fake):
    lib = FakeCublasLt(fake, fail_matmul=15)  # CUBLAS_STATUS_NOT_SUPPORTED
    exe, _ = run(fake, "f32", "relu", lib)
    assert "not cuBLASLt (cublasLtMatmul failed with cuBLAS status 15)" in exe.summary()
    epilogue = [c for c in lib.calls if c[0] == "matmul" and lib.descs[c[1]][cublaslt.DESC_EPILOGUE] == cublaslt.EPILOGUE_RELU_BIAS]
    assert len(epilogue) == 1  # not asked again
    assert fake.matmuls >= 2 and fake.launches  # the plain GEMM refused too: cupy.matmul runs the product


def test_composites_the_binding_cannot_take_say_why():
    mod = dpl.parse("""
func computed(x: f32[4, 8], w: f32[8, 3], b: f32[3]) -> f32[4, 3] {
  y = add(matmul(exp(x), w), b)
  return y
}
func silu(x: f32[4, 8], w: f32[8, 3], b: f32[3]) -> f32[4, 3] {
  y = nn.silu(add(matmul(x, w), b))
  return y
}
func wide(x: f64[4, 8], w: f64[8, 3], b: f64[3]) -> f64[4, 3] {
  y = add(matmul(x, w), b)
  return y
}
func swapped(x: f32[4, 8], w: f32[8, 3], b: f32[3]) -> f32[4, 3] {
  y = add(b, matmul(x, w))
  return y
}""")
    assert cublaslt.plan_of(mod["computed"]) == "an operand is computed inside the composite"
    assert cublaslt.plan_of(mod["silu"]) == "cuBLASLt has no SiLU epilogue"
    assert "f32, f16 or bf16" in cublaslt.plan_of(mod["wide"])
    assert cublaslt.plan_of(mod["swapped"]) == cublaslt.LtPlan(0, 1, 2, None, "float32")


def test_the_library_of_cupys_cuda_comes_first(monkeypatch):
    tried = []

    def cdll(name):
        tried.append(name)
        raise OSError("not here")

    monkeypatch.setattr(cublaslt.ctypes, "CDLL", cdll)
    monkeypatch.setattr(cublaslt, "_wheel_libraries", lambda: ["/w/libcublasLt.so.12", "/w/libcublasLt.so.13"])
    with pytest.raises(cublaslt.CublasLtError, match="libcublasLt is not installed"):
        cublaslt.load_library(13)
    assert tried[:2] == ["/w/libcublasLt.so.13", "libcublasLt.so.13"] and len(tried) == 5
