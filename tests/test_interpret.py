"""The reference interpreter: whole blocks against NumPy written here, and input checking."""

import numpy as np
import pytest

import dpl
from dpl.errors import InterpretError
from dpl.ir import FunctionBuilder, Module, const

rng = np.random.default_rng(7)


def randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def llama_mlp_block():
    """RMSNorm -> gate/up projections -> SiLU(gate) * up -> down projection -> residual add."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", 32))
    norm_w = fb.param("norm_w", "f32", (32,))
    w_gate = fb.param("w_gate", "f32", (32, 48))
    w_up = fb.param("w_up", "f32", (32, 48))
    w_down = fb.param("w_down", "f32", (48, 32))
    h = fb.emit("nn.rms_norm", x, norm_w, epsilon=1e-6, name="h")
    gate = fb.emit("matmul", h, w_gate, name="gate")
    up = fb.emit("matmul", h, w_up, name="up")
    act = fb.emit("nn.silu", gate, name="act")
    prod = fb.emit("multiply", act, up, name="prod")
    down = fb.emit("matmul", prod, w_down, name="down")
    out = fb.emit("add", x, down, name="out")
    return Module([fb.ret(out)])


def test_llama_mlp_block_matches_numpy():
    mod = llama_mlp_block()
    x, nw = randn(5, 32), randn(32)
    wg, wu, wd = randn(32, 48) * 0.2, randn(32, 48) * 0.2, randn(48, 32) * 0.2
    got = dpl.interpret(mod, x, nw, wg, wu, wd)

    x64 = x.astype(np.float64)
    h = x64 / np.sqrt(np.mean(x64**2, axis=-1, keepdims=True) + 1e-6) * nw
    gate, up = h @ wg, h @ wu
    act = gate / (1 + np.exp(-gate))
    want = x64 + (act * up) @ wd
    assert got.dtype == np.float32 and got.shape == (5, 32)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_symbolic_dims_bind_from_inputs():
    mod = llama_mlp_block()
    args = [randn(32), randn(32, 48), randn(32, 48), randn(48, 32)]
    assert dpl.interpret(mod, randn(3, 32), *args).shape == (3, 32)
    assert dpl.interpret(mod, randn(11, 32), *args).shape == (11, 32)


def test_symbolic_dims_must_agree():
    fb = FunctionBuilder("main")
    a, b = fb.param("a", "f32", ("n", 4)), fb.param("b", "f32", ("n", 4))
    mod = Module([fb.ret(fb.emit("add", a, b))])
    with pytest.raises(InterpretError) as err:
        dpl.interpret(mod, randn(3, 4), randn(5, 4))
    assert err.value.message == "parameter 'b' of 'main' has 5 in dimension 0, but 'n' is already 3"


def test_symbolic_reshape_resolves_at_run_time():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", 6))
    r = fb.emit("reshape", x, shape=["n", 2, 3])
    mod = Module([fb.ret(fb.emit("sum", r, axis=[2]))])
    x_ = randn(4, 6)
    np.testing.assert_allclose(dpl.interpret(mod, x_), x_.reshape(4, 2, 3).sum(-1), rtol=1e-6)


@pytest.mark.parametrize(
    "arrays,message",
    [
        ((randn(2, 4),), "function 'main' takes 2 inputs (a, b), got 1"),
        ((randn(2, 4), randn(2, 4).astype(np.float64)), "parameter 'b' of 'main' expects dtype f32, got float64"),
        ((randn(2, 4), randn(4)), "parameter 'b' of 'main' expects rank 2 (f32[n, 4]), got shape (4,)"),
        ((randn(2, 4), randn(2, 5)), "parameter 'b' of 'main' expects shape f32[n, 4], got (2, 5)"),
        ((randn(2, 4), [1, 2]), "parameter 'b' of 'main' expects dtype f32, got int64"),
    ],
)
def test_bad_inputs_name_the_parameter(arrays, message):
    fb = FunctionBuilder("main")
    a, b = fb.param("a", "f32", ("n", 4)), fb.param("b", "f32", ("n", 4))
    mod = Module([fb.ret(fb.emit("add", a, b))])
    with pytest.raises(InterpretError) as err:
        dpl.interpret(mod, *arrays)
    assert err.value.message == message


def test_unknown_entry():
    with pytest.raises(InterpretError, match="module has no function 'nope' \\(it has: main\\)"):
        dpl.interpret(llama_mlp_block(), entry="nope")


def test_calls_between_functions_tuples_and_constants():
    inner = FunctionBuilder("scale_shift", attrs={"Primitive": True})
    v = inner.param("v", "f32", (4,))
    s = inner.emit("multiply", v, const(np.full(4, 3.0, np.float32), name="three"))
    e = inner.emit("exp", v)
    inner_fn = inner.ret(s, e)

    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4,))
    t = fb.call(inner_fn, x, name="t")
    a = fb.item(t, 0, name="a")
    b = fb.item(t, 1, name="b")
    c = fb.emit("concat", (a, b), axis=0, name="c")
    mod = Module([inner_fn, fb.ret(c, a)])

    x_ = randn(4)
    c_, a_ = dpl.interpret(mod, x_)
    np.testing.assert_allclose(a_, x_ * 3, rtol=1e-6)
    np.testing.assert_allclose(c_, np.concatenate([x_ * 3, np.exp(x_)]), rtol=1e-6)


def test_float16_chain_stays_float16():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f16", (8,))
    y = fb.emit("multiply", x, const(0.5, "f16"))
    mod = Module([fb.ret(fb.emit("nn.gelu", y))])
    x_ = randn(8).astype(np.float16)
    got = dpl.interpret(mod, x_)
    assert got.dtype == np.float16
    from math import erf, sqrt

    half = (x_ * np.float16(0.5)).astype(np.float64)
    want = np.array([0.5 * v * (1 + erf(v / sqrt(2))) for v in half])
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)


def test_interpreter_does_not_mutate_constants():
    c = const(np.arange(4, dtype=np.float32), name="w")
    assert not c.value.flags.writeable
