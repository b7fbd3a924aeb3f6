"""The experts' grouped product of mixture-of-experts layers (dpl/ops/experts.py) and the
``llm.grouped_matmul_glu`` composite on the CPU (backends/cpu/experts.py): each expert's run of
rows times its weight, rows past the last offset zero, memory of the result's size, and the
composite equal to the reference at odd sizes on both of the CPU's paths."""

import tracemalloc

import numpy as np
import pytest

import needs

import dpl
from dpl.errors import InterpretError, TypeInferenceError
from dpl.ir import FunctionBuilder, Module
from dpl.ir.builder import const
from dpl.ir.expr import Var
from dpl.ir.types import TensorType
from dpl.ops import make_call

rng = np.random.default_rng(32)


def by_row(x, w, offsets):
    """Each row times the weight of its expert, written independently of the op: row ``r``
    belongs to expert ``sum(offsets <= r)``, none when that is every expert."""
    out = np.zeros((x.shape[0], w.shape[2]), np.float64)
    for r in range(x.shape[0]):
        e = int((np.asarray(offsets) <= r).sum())
        if e < w.shape[0]:
            out[r] = x[r].astype(np.float64) @ w[e].astype(np.float64)
    return out


def grouped(s, k, n, e, weight=None):
    """``main(x, offsets) = grouped_matmul(x, w, offsets)``, ``w`` a constant unless ``weight="param"``."""
    fb = FunctionBuilder("main")
    x, offs = fb.param("x", "f32", (s, k)), fb.param("offsets", "i32", (e,))
    w = fb.param("w", "f32", (e, k, n)) if isinstance(weight, str) else const(weight)
    return Module([fb.ret(fb.emit("grouped_matmul", x, w, offs))])


def gated(s, k, f, w, weight_param=False):
    """transformers' experts' first half: the grouped product, split, ``silu(gate) * up``."""
    fb = FunctionBuilder("main")
    x, offs = fb.param("x", "f32", (s, k)), fb.param("offsets", "i32", (w.shape[0],))
    wv = fb.param("w", "f32", w.shape) if weight_param else const(w)
    parts = fb.emit("split", fb.emit("grouped_matmul", x, wv, offs), indices_or_sections=[f], axis=1)
    return Module([fb.ret(fb.emit("multiply", fb.emit("nn.silu", fb.item(parts, 0)), fb.item(parts, 1)))])


# offsets over 11 rows and 4 experts: a zero-row expert, rows past the last offset, one expert
# with every row, no rows routed at all, an offset past the last row
OFFSETS = {"expert without rows": [0, 4, 4, 9], "one expert has all": [0, 0, 11, 11], "none routed": [0, 0, 0, 0],
           "past the last row": [3, 3, 7, 40], "every expert": [2, 5, 8, 11]}


@pytest.mark.parametrize("case", list(OFFSETS))
def test_each_expert_multiplies_its_rows(case):
    x, w = rng.standard_normal((11, 6)).astype(np.float32), rng.standard_normal((4, 6, 5)).astype(np.float32)
    offsets = np.array(OFFSETS[case], np.int32)
    got = dpl.interpret(grouped(11, 6, 5, 4, weight="param"), x, offsets, w)
    np.testing.assert_allclose(got, by_row(x, w, offsets), rtol=1e-5, atol=1e-5)


def test_offsets_that_decrease_are_an_error():
    x, w = np.ones((4, 2), np.float32), np.ones((2, 2, 3), np.float32)
    with pytest.raises(InterpretError, match="non-decreasing"):
        dpl.interpret(grouped(4, 2, 3, 2, weight="param"), x, np.array([3, 1], np.int32), w)


def test_the_type_keeps_the_symbolic_rows_and_refuses_bad_operands():
    x, w, offs = Var("x", TensorType(("s", 8), "float32")), Var("w", TensorType((4, 8, 6), "float32")), Var("o", TensorType((4,), "int32"))
    assert make_call("grouped_matmul", [x, w, offs]).ty == TensorType(("s", 6), "float32")
    bad = {"reduction": (Var("x", TensorType(("s", 7), "float32")), w, offs),
           "one offset per expert": (x, w, Var("o", TensorType((3,), "int32"))),
           "integer dtype": (x, w, Var("o", TensorType((4,), "float32"))),
           "different dtypes": (x, Var("w", TensorType((4, 8, 6), "float16")), offs),
           r"\[S, K\]": (x, Var("w", TensorType((8, 6), "float32")), offs)}
    for message, args in bad.items():
        with pytest.raises(TypeInferenceError, match=message):
            make_call("grouped_matmul", list(args))


def test_peak_memory_is_the_result_not_each_rows_weights():
    """256 rows, K=128, N=256, 8 experts: the gather of each row's weight held S*K*N floats
    (32 MiB); the runs hold the result (256 KiB) and one run's product."""
    s, k, n, e = 256, 128, 256, 8
    x, w = rng.standard_normal((s, k)).astype(np.float32), rng.standard_normal((e, k, n)).astype(np.float32)
    offsets = np.array(np.linspace(s / e, s, e), np.int32)
    mod = grouped(s, k, n, e, weight="param")
    dpl.interpret(mod, x, offsets, w)  # warm: the interpreter's own first-call allocations
    tracemalloc.start()
    try:
        dpl.interpret(mod, x, offsets, w)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    result = s * n * 4
    assert peak < 2 * result < s * k * n * 4 // 32, f"peak {peak} bytes, the result {result}"


def test_the_gated_unit_is_claimed_with_its_grouped_product():
    w = rng.standard_normal((4, 8, 128)).astype(np.float32)
    fused = dpl.apply(gated("s", 8, 64, w), ["llm"])
    composites = [f for f in fused.functions.values() if f.attrs.get("Composite")]
    assert [f.attrs["Composite"] for f in composites] == ["kernel.grouped_matmul_glu"]
    assert [b.value.op for b in composites[0].bindings][0] == "grouped_matmul"
    assert not any(getattr(b.value, "op", None) == "grouped_matmul" for b in fused["main"].bindings)


def _cpu(mod, products):
    from dpl.backends.cpu.backend import CpuBackend

    fused = dpl.apply(mod, ["llm"])
    exe = dpl.build(fused, [CpuBackend(products=products), "numpy"], config=dpl.FusionConfig(fallback_on_error=False),
                    progress=False)
    return exe


# (K, F, the weight a parameter, products) -> the runner the CPU backend picks: the packed
# routine's gated unit, or the segments (the grouped product by the BLAS, the gated unit in C)
PATHS = {(40, 64, False, "dpl"): "cpu:packed-grouped-matmul", (300, 64, False, "dpl"): "cpu:packed-grouped-matmul",
         (40, 24, False, "dpl"): "cpu-blas+c:", (40, 64, True, "dpl"): "cpu-blas+c:", (300, 64, False, "numpy"): "cpu-blas+c:"}


@pytest.mark.parametrize("k, f, weight_param, products", list(PATHS), ids=["one K-block", "two K-blocks", "half not whole panels",
                                                                            "variable weight", "numpy's products"])
def test_the_composite_on_the_cpu_equals_the_reference(k, f, weight_param, products):
    """Both of the CPU's paths (the packed routine's gated unit; the segments: the BLAS's runs,
    then the gated unit's C) at every case of OFFSETS, ragged row blocks, against the interpreter."""
    needs.c_compiler()
    w = (rng.standard_normal((4, k, 2 * f)) / 8).astype(np.float32)
    mod = gated("s", k, f, w, weight_param)
    exe = _cpu(mod, products)
    x = (rng.standard_normal((11, k)) * 2).astype(np.float32)
    for case, offsets in OFFSETS.items():
        args = (x, np.array(offsets, np.int32), *((w,) if weight_param else ()))
        np.testing.assert_allclose(exe(*args), dpl.interpret(mod, *args), rtol=1e-4, atol=1e-5, err_msg=case)
    kernels = [s.kernel.__qualname__ for s in exe.plan(*args).steps]
    assert len(kernels) == 1 and kernels[0].startswith(PATHS[k, f, weight_param, products]), kernels
    assert not exe.fallbacks


def test_a_lone_grouped_product_runs_on_the_cpu():
    """The experts' down projection, alone: the CPU's own runner, no fall-back."""
    needs.c_compiler()
    w = rng.standard_normal((4, 9, 7)).astype(np.float32)
    mod = grouped("s", 9, 7, 4, weight=w)
    exe = _cpu(mod, "auto")
    x = rng.standard_normal((11, 9)).astype(np.float32)
    for offsets in OFFSETS.values():
        offsets = np.array(offsets, np.int32)
        np.testing.assert_allclose(exe(x, offsets), by_row(x, w, offsets), rtol=1e-4, atol=1e-5)
    assert [s.kernel.__qualname__.split(":")[0] for s in exe.plan(x, offsets).steps] == ["cpu-blas-grouped-matmul"]
    assert not exe.fallbacks
