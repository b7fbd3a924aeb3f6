"""dpl.build and the Executable over the corpus: every target equals the interpreter, fall-backs
are recorded, plans are cached per shape, inputs are never written, outputs are fresh."""

import numpy as np
import pytest

import dpl
from dpl.backends import BackendError
from dpl.errors import DplError
from dpl.runtime import FusionConfig, RunError, ShapeError
from runtime_corpus import CORPUS, composite, inputs_for, symbolic, swiglu_group

CONFIGS = {
    "default": FusionConfig(),
    "fuse_all": FusionConfig(min_tensor_elements=1, min_nodes_for_fusion=1),
    "no_fusion": FusionConfig(enable_fusion=False),
}


def as_tuple(r):
    return r if isinstance(r, tuple) else (r,)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("target", ["numpy", "cpu", "cuda"])
@pytest.mark.parametrize("case", list(CORPUS))
def test_every_target_equals_the_interpreter(case, target, config):
    make, dims = CORPUS[case]
    mod = make()
    args = inputs_for(mod, dims)
    before = [a.copy() for a in args]
    exe = dpl.build(mod, target, config=CONFIGS[config])
    got, want = as_tuple(exe(*args)), as_tuple(dpl.interpret(mod, *args))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if target == "numpy":
            np.testing.assert_array_equal(g, w)  # the same reference code
        else:  # generated C sums in float32 in another order than the reference (rtol 1e-5)
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=2e-5, atol=1e-6)
    for a, b in zip(args, before):  # inputs never written
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("case", list(CORPUS))
def test_cpu_target_without_a_compiler_runs_by_recorded_fallback(case, no_c_compiler):
    make, dims = CORPUS[case]
    exe = dpl.build(make(), "cpu")
    exe(*inputs_for(exe.module, dims))
    text = exe.summary()
    assert "cpu      unavailable: no C compiler ('dpl-no-such-compiler') on this machine" in text
    assert exe.choices and all(c.backend.name == "numpy" and c.by_fallback for c in exe.choices.values())
    assert "numpy by fall-back (cpu is unavailable" in text
    assert exe.fallbacks and all(f.skipped == "cpu" and f.runs_on == "numpy" for f in exe.fallbacks)


def test_cublas_composite_on_cuda_falls_back_with_each_reason(no_c_compiler):
    exe = dpl.build(composite(codegen=True), "cuda")
    choice = exe.choices["cublas_matmul_bias"]
    assert choice.backend.name == "numpy"
    assert [n for n, _ in choice.passed_over] == ["cupy", "cpu"]
    assert "CuPy is not installed" in dict(choice.passed_over)["cupy"] or "CUDA" in dict(choice.passed_over)["cupy"]
    assert "codegen 'cublas' (cublas_matmul_bias)" in exe.summary()


def test_numpy_only_target_is_a_first_choice():
    exe = dpl.build(composite(codegen=False), "numpy")
    assert exe.fallbacks == []
    assert "numpy (first choice)" in exe.summary()


def test_a_target_with_no_capable_backend_is_an_error():
    from dpl.backends import Backend, Capabilities

    class OpsOnly(Backend):
        name = "ops_only"
        capabilities = Capabilities(kinds=("op",))

    exe_error = pytest.raises(BackendError, dpl.build, composite(codegen=False), [OpsOnly()])
    assert "no backend of target [ops_only] can run composite 'cublas.matmul_bias'" in str(exe_error.value)
    assert "ops_only runs no composite functions" in str(exe_error.value)


def test_unknown_target_names_the_choices():
    with pytest.raises(BackendError) as err:
        dpl.build(composite(codegen=False), "tpu")
    assert "unknown backend 'tpu'" in str(err.value) and "named targets: numpy, cpu, cuda" in str(err.value)


def test_plans_are_made_per_input_shape_and_cached():
    mod = symbolic()
    exe = dpl.build(mod, "numpy")
    assert exe.plans == {}  # symbolic inputs: nothing planned until the first call
    for n in (4, 16, 4):
        args = inputs_for(mod, {"n": n})
        np.testing.assert_array_equal(exe(*args), dpl.interpret(mod, *args))
    assert sorted(sig[0][0] for sig in exe.plans) == [(4, 64), (16, 64)]
    assert exe.plan(*inputs_for(mod, {"n": 4})) is exe.plan(*inputs_for(mod, {"n": 4}, seed=1))


def test_static_modules_are_planned_at_build():
    exe = dpl.build(composite(codegen=False), "numpy")
    assert len(exe.plans) == 1


def test_identical_groups_compile_once():
    g1, g2 = swiglu_group(64, "group_a"), swiglu_group(64, "group_b")
    fb = dpl.FunctionBuilder("main")
    a, b = fb.param("a", "f32", (64, 64)), fb.param("b", "f32", (64, 64))
    mod = dpl.Module([fb.ret(fb.call(g2, fb.call(g1, a, b), b)), g1, g2])
    exe = dpl.build(mod, "numpy")
    decisions = exe.plan(*inputs_for(mod, {})).decisions
    assert [g.note for _, _, g in decisions][1].startswith("fused kernel from the cache")
    assert len(exe.scheduler.cache) == 1  # one fused kernel, and no single ops in this plan


def test_outputs_are_fresh_arrays_and_out_is_filled():
    mod = symbolic()
    exe = dpl.build(mod, "numpy")
    args = inputs_for(mod, {"n": 8})
    r1, r2 = exe(*args), exe(*args)
    assert r1 is not r2 and not np.shares_memory(r1, r2)
    np.testing.assert_array_equal(r1, r2)
    out = np.zeros((8, 64), np.float32)
    assert exe(*args, out=out) is out
    np.testing.assert_array_equal(out, r1)


def test_out_must_fit_and_not_overlap_inputs():
    mod = symbolic()
    exe = dpl.build(mod, "numpy")
    args = inputs_for(mod, {"n": 8})
    with pytest.raises(RunError, match=r"out\[0\] must be a float32 array of shape \(8, 64\)"):
        exe(*args, out=np.zeros((8, 63), np.float32))
    with pytest.raises(RunError, match="overlaps an input"):
        exe(*args, out=args[0])


def test_bad_inputs_are_named():
    mod = symbolic()
    exe = dpl.build(mod, "numpy")
    with pytest.raises(RunError, match=r"'main' takes 2 inputs \(gate, up\), got 1"):
        exe(np.zeros((2, 64), np.float32))
    with pytest.raises(ShapeError, match="input 'up' has 3 in dimension 0, but 'n' is already 2"):
        exe(np.zeros((2, 64), np.float32), np.zeros((3, 64), np.float32))
    with pytest.raises(ShapeError, match="input 'up' expects dtype f32, got float64"):
        exe(np.zeros((2, 64), np.float32), np.zeros((2, 64)))
    with pytest.raises(DplError, match="build takes a Module"):
        dpl.build("main")


def test_profile_gives_a_time_per_kernel(no_c_compiler):
    mod = CORPUS["primitive_groups"][0]()
    exe = dpl.build(mod, "cpu", config=CONFIGS["fuse_all"])
    report = exe.profile(*inputs_for(mod, {}), repeat=3)
    assert [r.label for r in report.rows] == ["fused fused_silu_multiply", "fused fused_add_rms_norm", "fused fused_scale_exp", "op add"]
    assert all(r.backend == "numpy" and r.min_ms > 0 and r.median_ms >= r.min_ms for r in report.rows)
    assert "total" in str(report)


def test_summary_lists_the_decisions_per_shape(no_c_compiler):
    mod = symbolic()
    exe = dpl.build(mod, "cpu", config=FusionConfig.seed())
    exe(*inputs_for(mod, {"n": 4}))
    exe(*inputs_for(mod, {"n": 64}))
    text = exe.summary()
    assert "group fused_silu_multiply at [4, 64] [4, 64]: do not fuse (rule 3: input 'gate' has 256 elements < min_tensor_elements 1024); runs op by op" in text
    assert "group fused_silu_multiply at [64, 64] [64, 64]: fuse (profile: missing data: no profile file; profile_fallback is 'fuse'); fused kernel compiled by numpy" in text
