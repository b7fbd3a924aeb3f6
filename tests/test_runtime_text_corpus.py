"""The runtime on modules written in the text form: the shipped examples, calls nested inside
bindings and returns, outputs computed early, passed through or returned twice, and random
fused groups. Every target and fusion policy computes what dpl.interpret computes, never
writes an input, and returns arrays that alias nothing."""

import json
from pathlib import Path

import numpy as np
import pytest

import dpl
from dpl.cli import random_inputs
from dpl.ir import FunctionBuilder, Module
from dpl.runtime import FusionConfig, FusionHeuristics, compatible_key, exact_key, profile_module

from test_kernel_random_groups import random_group

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.ir"))

NESTED = """
@primitive
func fused_norm(x: f32[n, 64], w: f32[64]) -> f32[n, 64] {
  ms = mean(multiply(x, x), axis=[-1], keepdims=true)
  return multiply(multiply(x, rsqrt(add(ms, 1e-05))), w)
}

func main(x: f32[n, 64], w: f32[64]) -> f32[n, 64] {
  h = fused_norm(x, w)
  return exp(tanh(h))
}
"""

EARLY_AND_TWICE = """
func main(x: f32[4, 8], y: f32[4, 8]) -> (f32[4, 8], f32[4, 8], f32[4, 8], f32[4, 8]) {
  early = exp(x)
  a = tanh(early)
  b = tanh(add(a, y))
  c = tanh(b)
  return (early, c, c, x)
}
"""

TEXT = {"nested": NESTED, "early_and_twice": EARLY_AND_TWICE}
CONFIGS = {
    "default": FusionConfig(),
    "fuse": FusionConfig(min_tensor_elements=0, max_graph_size=100),
    "nofuse": FusionConfig(enable_fusion=False),
}


def modules():
    mods = {name: dpl.parse(text) for name, text in TEXT.items()}
    mods.update({f"example_{p.stem}": dpl.load(str(p)) for p in EXAMPLES})
    for seed in range(30):
        g = random_group(seed)
        fb = FunctionBuilder("main")
        mods[f"random_{seed}"] = Module([g, fb.ret(fb.call(g, *[fb.param(p.name, p.ty) for p in g.params]))])
    return mods


MODULES = modules()


def as_tuple(r):
    return r if isinstance(r, tuple) else (r,)


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("target", ["numpy", "cpu", "cuda", "numpy-kernel"])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_equals_the_interpreter_without_aliasing(name, target, config):
    mod = MODULES[name]
    exe = dpl.build(mod, target, config=CONFIGS[config])
    for n in (3, 16):
        args = random_inputs(mod["main"], seed=n, dims={"n": n})
        copies = [a.copy() for a in args]
        want = as_tuple(dpl.interpret(mod, *args))
        first = as_tuple(exe(*args))
        second = as_tuple(exe(*args))
        for got in (first, second):
            for g, w in zip(got, want):
                assert g.shape == w.shape and g.dtype == w.dtype
                # the absolute bound grows with the output's scale: a sum of terms in the
                # thousands that cancels to about 2 differs by 5e-3 between two BLAS kernels
                # (the Llama MLP on an AMD EPYC's OpenBLAS), each as exact as float32 allows
                scale = float(np.max(np.abs(w))) if w.size else 0.0
                np.testing.assert_allclose(g, w, rtol=2e-3, atol=1e-4 + 2e-6 * scale)
        for a, c in zip(args, copies):
            np.testing.assert_array_equal(a, c)
        arrays = [*first, *second]
        for i, a in enumerate(arrays):
            assert not any(np.shares_memory(a, x) for x in args)
            assert not any(np.shares_memory(a, b) for b in arrays[i + 1:])


def test_nested_calls_are_ops_of_the_group():
    fn = MODULES["nested"]["fused_norm"]
    assert compatible_key(fn) == "multiply+mean+add+rsqrt+multiply+multiply"
    heuristics = FusionHeuristics(FusionConfig(max_graph_size=5))
    decision = heuristics.should_fuse(fn, [(32, 64), (64,)], ["float32", "float32"])
    assert not decision and decision.rule == "rule 2" and "6" in decision.reason


def test_profile_times_nested_calls(tmp_path):
    mod = MODULES["nested"]
    path = tmp_path / "profile.json"
    data = profile_module(mod, path, target="numpy", dims={"n": 32}, repeat=2, progress=False)
    raw = json.loads(path.read_text())
    assert set(raw["single"]) == {"multiply", "mean", "add", "rsqrt"}
    key = exact_key(mod["fused_norm"], [(32, 64), (64,)], ["float32", "float32"])
    (group,) = [g for g in data.groups if g["exact_key"] == key]
    assert group["ops"] == ["multiply", "mean", "add", "rsqrt", "multiply", "multiply"]
    assert group["separate"] > 0 and raw["fused"]["multiply+mean+add+rsqrt+multiply+multiply"] > 0


KERNEL_FLAVOUR = """
@primitive
func fused_norm(x: f32[n, 64], w: f32[64]) -> f32[n, 64] {
  ms = mean(multiply(x, x), axis=[-1], keepdims=true)
  return multiply(multiply(x, rsqrt(add(ms, 1e-05))), w)
}

@composite("kernel.swiglu")
@primitive
func kernel_swiglu(g: f32[n, 64], u: f32[n, 64]) -> f32[n, 64] {
  s = nn.silu(g)
  p = multiply(s, u)
  return p
}

@primitive
func fused_take_exp(x: f32[n, 64], i: i64[4]) -> f32[4, 64] {
  t = take(x, i, axis=0)
  return exp(t)
}

func main(x: f32[n, 64], w: f32[64], i: i64[4]) -> (f32[n, 64], f32[4, 64]) {
  h = fused_norm(x, w)
  k = kernel_swiglu(h, x)
  t = fused_take_exp(k, i)
  return (k, t)
}
"""


def test_the_kernel_flavour_runs_groups_through_the_kernel_ir():
    mod = dpl.parse(KERNEL_FLAVOUR)
    exe = dpl.build(mod, "numpy-kernel", config=FusionConfig(min_tensor_elements=0))
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal(64).astype(np.float32)
    i = np.array([0, 2, 4, 7])
    for g, want in zip(exe(x, w, i), dpl.interpret(mod, x, w, i)):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)
    steps = [(s.function, s.backend) for s in exe.plan(x, w, i).steps]
    assert steps == [("fused_norm", "numpy-kernel"), ("kernel_swiglu", "numpy-kernel"),
                     ("fused_take_exp", "numpy"), ("fused_take_exp", "numpy")]
    summary = exe.summary()
    assert "compile error on numpy-kernel ('fused_take_exp' does not lower to one kernel" in summary
    assert "runs op by op" in summary


def test_bad_arguments_are_named_errors_not_tracebacks():
    from dpl.backends import BackendError
    from dpl.runtime import RunError

    mod = MODULES["early_and_twice"]
    exe = dpl.build(mod, "numpy")
    x, y = random_inputs(mod["main"])
    frozen = [np.empty((4, 8), np.float32) for _ in range(4)]
    frozen[2].flags.writeable = False
    with pytest.raises(RunError, match=r"out\[2\] is read-only"):
        exe(x, y, out=tuple(frozen))
    with pytest.raises(BackendError, match="a target is a name, a Backend or a list of them, got 3"):
        dpl.build(mod, 3)
    for bad, message in [({"margin": "a"}, "margin must be a number >= 0"), ({"margin": -0.5}, "margin must be a number >= 0"),
                         ({"max_graph_size": 2.5}, "max_graph_size must be a non-negative integer"),
                         ({"min_tensor_elements": -1}, "min_tensor_elements must be a non-negative integer"),
                         ({"enable_fusion": "yes"}, "enable_fusion must be True or False")]:
        with pytest.raises(dpl.DplError, match=message):
            FusionConfig(**bad)
