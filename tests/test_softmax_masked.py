"""Softmax kernels of masked scores: entries far below their row's maximum (a causal mask's
-3.4e38 or -inf) are exactly 0 and computed on the vector path; every other entry, NaN and
infinity equal the interpreter. On the CPU (generated C) and the kernel IR's NumPy evaluator."""

import attrs
import numpy as np
import pytest

import needs

import dpl


def softmax_module(dtype, op="nn.softmax"):
    return dpl.parse(f"func main(x: {dtype}[6, 40]) -> {dtype}[6, 40] {{\n  y = {op}(x)\n  return y\n}}")


def masked_scores(np_dtype):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((6, 40)) * 4).astype(np_dtype)
    x[0, 20:] = np.finfo(np_dtype).min  # a causal mask as Hugging Face adds it
    x[1, ::3] = -np.inf  # as others add it
    x[2, 5] = x[2].max() - 87.5  # just past the float32 floor
    x[2, 6] = x[2].max() - 86.5  # just inside it
    x[3, 7] = np.nan
    x[4, :] = -np.inf  # a fully masked row: NaN, as exp(-inf - -inf) is
    x[5, 9] = np.inf
    return x


@pytest.fixture(params=["cpu", "kernel evaluator"])
def run(request, tmp_path):
    """``run(mod, x)``: the softmax's kernel, compiled as C or run by the kernel IR's evaluator."""
    if request.param == "kernel evaluator":
        from dpl.kernel import evaluate, lower_function

        return lambda mod, x: evaluate(lower_function(attrs.evolve(mod["main"], attrs={"Primitive": True})), x)
    from dpl.backends.cpu.backend import CpuBackend

    needs.c_compiler()
    backend = CpuBackend(cache_dir=tmp_path)

    def on_cpu(mod, x):
        exe = dpl.build(mod, [backend, "numpy"], config=dpl.FusionConfig(fallback_on_error=False))
        assert "-> cpu (first choice)" in exe.summary()
        return exe(x)

    return on_cpu


@pytest.mark.parametrize("op", ["nn.softmax", "nn.log_softmax"])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_masked_rows_equal_the_interpreter(run, dtype, op):
    np_dtype = {"f32": np.float32, "f64": np.float64}[dtype]
    mod = softmax_module(dtype, op)
    x = masked_scores(np_dtype)
    with np.errstate(all="ignore"):
        want = dpl.interpret(mod, x)
        got = run(mod, x)
    tol = 1e-6 if dtype == "f32" else 1e-13
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)  # NaN where the interpreter has NaN
    if op == "nn.softmax":
        assert (got[0, 20:] == 0).all() and (got[1, ::3] == 0).all()
        assert got[2, 5] == 0 if dtype == "f32" else got[2, 5] > 0  # float64 keeps it (its floor is 708)
        assert got[2, 6] > 0
        assert np.isnan(got[3]).any() and np.isnan(got[4]).all()
