"""The channels-last layout pass (dpl/transform/convert_layout.py) and the NHWC forms of the
convolution and pools: the printed result on small chains, the ops' types, references and
kernels, and random CNN-like modules computing the same numbers converted or not."""

import numpy as np
import pytest

import dpl
from dpl.errors import DplError
from dpl.ir.expr import Binding, Constant, Function, Module, Var
from dpl.ir.types import TensorType
from dpl.kernel import evaluate, lower_function
from dpl.ops.registry import make_call
from dpl.pipeline import parse_pipeline
from dpl.transform.convert_layout import convert_layout

rng = np.random.default_rng(30)


def _const(name, shape):
    return Constant(rng.standard_normal(shape).astype("float32"), name=name)


# -- the pass's output, printed ----------------------------------------------------------------

CHAIN = """func main(x: f32[n, 3, 8, 8], w: f32[4, 3, 3, 3], v: f32[4, 4, 1, 1]) -> (f32[n, 4, 4, 4], f32[n, 4]) {
  c = nn.conv2d(x, w, padding=[1, 1])
  r = nn.relu(c)
  p = nn.max_pool2d(r, pool_size=[2, 2], strides=[2, 2])
  d = nn.conv2d(p, v)
  s = add(d, p)
  g = mean(s, axis=[2, 3], keepdims=true)
  f = reshape(g, shape=[n, 4])
  return (s, f)
}"""

CHAIN_NHWC = """func main(x: f32[n, 3, 8, 8], w: f32[4, 3, 3, 3], v: f32[4, 4, 1, 1]) -> (f32[n, 4, 4, 4], f32[n, 4]) {
  x_nhwc = permute_dims(x, axes=[0, 2, 3, 1])
  w_nhwc = permute_dims(w, axes=[0, 2, 3, 1])
  c_nhwc = nn.conv2d(x_nhwc, w_nhwc, padding=[1, 1], data_layout="NHWC", kernel_layout="OHWI")
  r_nhwc = nn.relu(c_nhwc)
  p_nhwc = nn.max_pool2d(r_nhwc, pool_size=[2, 2], strides=[2, 2], layout="NHWC")
  v_nhwc = permute_dims(v, axes=[0, 2, 3, 1])
  d_nhwc = nn.conv2d(p_nhwc, v_nhwc, data_layout="NHWC", kernel_layout="OHWI")
  s_nhwc = add(d_nhwc, p_nhwc)
  s = permute_dims(s_nhwc, axes=[0, 3, 1, 2])
  g = mean(s, axis=[2, 3], keepdims=true)
  f = reshape(g, shape=["n", 4])
  return (s, f)
}
"""


def test_chain_printed():
    """Permutes only where the chain starts and where its value leaves it (returned); a global
    pool of a returned map reads the NCHW copy the return makes."""
    assert str(convert_layout(dpl.parse(CHAIN))) == CHAIN_NHWC


def test_global_pool_and_flatten_stay_channels_last():
    text = CHAIN.replace("return (s, f)", "return f").replace("-> (f32[n, 4, 4, 4], f32[n, 4])", "-> f32[n, 4]")
    out = str(convert_layout(dpl.parse(text)))
    assert '  g_nhwc = mean(s_nhwc, axis=[1, 2], keepdims=true)\n  f = reshape(g_nhwc, shape=["n", 4])\n' in out
    assert out.count("permute_dims") == 3  # the input and the two weights


def test_permute_pair_cancelled_and_constants_transposed():
    """An NHWC input the model permutes to NCHW is read as it lies; a constant weight and a
    batch norm's (C, 1, 1) scale are transposed by the pass itself."""
    x = Var("x", TensorType((1, 6, 6, 2), "float32"))
    w, scale = _const("w", (3, 2, 3, 3)), _const("scale", (3, 1, 1))
    xp = make_call("permute_dims", [x], {"axes": (0, 3, 1, 2)})
    xv = Var("xp", xp.ty)
    c = make_call("nn.conv2d", [xv, w], {"padding": (1, 1)})
    cv = Var("c", c.ty)
    m = make_call("multiply", [cv, scale])
    mv = Var("m", m.ty)
    mod = Module({"main": Function("main", (x,), (Binding(xv, xp), Binding(cv, c), Binding(mv, m)), mv)})
    out = convert_layout(mod)
    text = str(out["main"])
    assert "c_nhwc = nn.conv2d(x, w_nhwc," in text
    assert "m_nhwc = multiply(c_nhwc, scale_nhwc)" in text
    assert text.count("permute_dims") == 2  # the model's own (now unused) and the one back
    assert out["main"].ret.ty == mod["main"].ret.ty
    a = rng.standard_normal((1, 6, 6, 2)).astype("float32")
    np.testing.assert_allclose(dpl.interpret(out, a), dpl.interpret(mod, a), rtol=1e-5, atol=1e-5)


def test_input_not_changed_and_nothing_to_do():
    mod = dpl.parse(CHAIN)
    before = str(mod)
    out = convert_layout(mod)
    assert out is not mod and str(mod) == before
    plain = dpl.parse("func main(x: f32[2, 3]) -> f32[2, 3] {\n  y = nn.relu(x)\n  return y\n}")
    assert convert_layout(plain) is plain


def test_pipeline_text_and_errors():
    (p,) = parse_pipeline("convert-layout{layout=NHWC}")
    assert p.text() == "convert-layout"
    with pytest.raises(DplError, match="converts to NHWC, not 'NCHW'"):
        dpl.apply(dpl.parse(CHAIN), pipeline="convert-layout{layout=NCHW}")
    with pytest.raises(DplError, match="takes true or false"):
        parse_pipeline("fuse-ops{views=NHWC}")
    steps = [p.text() for p in parse_pipeline("rewrites,convert-layout,fold")]
    assert steps == ["rewrites", "convert-layout", "fold"]


# -- the NHWC ops ------------------------------------------------------------------------------

NHWC_OPS = """func main(x: f32[n, 9, 10, 4], w: f32[8, 3, 3, 2]) -> (f32[n, 5, 5, 8], f32[n, 3, 3, 8], f32[n, 5, 5, 8], f32[n, 2, 2, 8]) {
  y = nn.conv2d(x, w, strides=[2, 2], padding=[1, 1], groups=2, data_layout="NHWC", kernel_layout="OHWI")
  p = nn.max_pool2d(y, pool_size=[3, 3], strides=[2, 2], padding=[1, 1], layout="NHWC")
  a = nn.avg_pool2d(y, pool_size=[2, 2], padding=[0, 0, 1, 1], ceil_mode=true, layout="NHWC")
  g = nn.adaptive_avg_pool2d(y, output_size=[2, 2], layout="NHWC")
  return (y, p, a, g)
}
"""


def _nchw_twin(x, w):
    """The same ops in NCHW, run by the interpreter, transposed back to NHWC."""
    mod = dpl.parse(NHWC_OPS.replace(', data_layout="NHWC", kernel_layout="OHWI"', "").replace(', layout="NHWC"', "")
                    .replace("x: f32[n, 9, 10, 4], w: f32[8, 3, 3, 2]", "x: f32[n, 4, 9, 10], w: f32[8, 2, 3, 3]")
                    .replace("-> (f32[n, 5, 5, 8], f32[n, 3, 3, 8], f32[n, 5, 5, 8], f32[n, 2, 2, 8])",
                             "-> (f32[n, 8, 5, 5], f32[n, 8, 3, 3], f32[n, 8, 5, 5], f32[n, 8, 2, 2])"))
    outs = dpl.interpret(mod, x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2))
    return [o.transpose(0, 2, 3, 1) for o in outs]


def test_nhwc_ops_round_trip_and_reference():
    mod = dpl.parse(NHWC_OPS)
    assert str(mod) == str(dpl.parse(str(mod)))
    x, w = rng.standard_normal((2, 9, 10, 4)).astype("float32"), rng.standard_normal((8, 3, 3, 2)).astype("float32")
    for got, want in zip(dpl.interpret(mod, x, w), _nchw_twin(x, w)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_nhwc_ops_kernel_ir():
    """Each NHWC op lowered alone to the kernel IR computes what the interpreter does."""
    x, w = rng.standard_normal((2, 9, 10, 4)).astype("float32"), rng.standard_normal((8, 3, 3, 2)).astype("float32")
    mod = dpl.parse(NHWC_OPS)
    want = dict(zip("ypag", dpl.interpret(mod, x, w)))
    calls = {b.var.name: b.value for b in mod["main"].bindings}
    for name in "ypag":
        call = calls[name]
        params = [Var("x", call.args[0].ty), Var("w", call.args[1].ty)] if name == "y" else [Var("y", call.args[0].ty)]
        out = Var(name, call.ty)
        fn = Function("f", tuple(params), (Binding(out, make_call(call.op, params, call.attrs)),), out)
        got = evaluate(lower_function(fn), *((x, w) if name == "y" else (want["y"],)))
        np.testing.assert_allclose(got, want[name], rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("bad, message", [
    ('kernel_layout="OHWI"', 'data_layout="NCHW" takes kernel_layout="OIHW", got "OHWI"'),
    ('data_layout="NCWH"', 'data_layout="NCWH" is not supported; data_layout is "NCHW" or "NHWC"'),
])
def test_layout_errors(bad, message):
    text = f"func main(x: f32[1, 3, 8, 8], w: f32[4, 3, 3, 3]) -> f32[1, 4, 6, 6] {{\n  y = nn.conv2d(x, w, {bad})\n  return y\n}}"
    with pytest.raises(DplError) as err:
        dpl.parse(text)
    assert message in str(err.value)


# -- random CNN-like modules: converted or not, the same numbers ------------------------------


def _random_cnn(seed: int) -> Module:
    """conv / bias / relu / residual / pools with constant weights, ending in a global pool and
    a reshape (or a returned map), over a symbolic batch and height."""
    r = np.random.default_rng(seed)
    x = Var("x", TensorType(("n", 4, "h", 12), "float32"))
    bindings, cur, i = [], x, 0

    def bind(call):
        nonlocal i
        i += 1
        v = Var(f"v{i}", call.ty)
        bindings.append(Binding(v, call))
        return v

    def weight(shape):
        return Constant((r.standard_normal(shape) * 0.3).astype("float32"), name=f"w{len(bindings)}")

    for _ in range(int(r.integers(3, 6))):
        c = cur.ty.shape[1]
        kind = r.choice(["conv3", "conv1", "depthwise", "residual", "maxpool", "avgpool"])
        if kind == "conv3":
            o = int(r.choice([4, 8]))
            cur = bind(make_call("nn.conv2d", [cur, weight((o, c, 3, 3))], {"padding": (1, 1)}))
            cur = bind(make_call("add", [cur, weight((o, 1, 1))]))
            cur = bind(make_call("nn.relu", [cur]))
        elif kind == "conv1":
            cur = bind(make_call("nn.conv2d", [cur, weight((8, c, 1, 1))], {}))
        elif kind == "depthwise":
            cur = bind(make_call("nn.conv2d", [cur, weight((c, 1, 3, 3))], {"padding": (1, 1), "groups": c}))
        elif kind == "residual":
            y = bind(make_call("nn.conv2d", [cur, weight((c, c, 3, 3))], {"padding": (1, 1)}))
            y = bind(make_call("multiply", [y, weight((1, c, 1, 1))]))
            cur = bind(make_call("nn.relu", [bind(make_call("add", [y, cur]))]))
        elif kind == "maxpool":
            cur = bind(make_call("nn.max_pool2d", [cur], {"pool_size": (3, 3), "strides": (1, 1), "padding": (1, 1)}))
        else:
            cur = bind(make_call("nn.avg_pool2d", [cur], {"pool_size": (3, 3), "padding": (1, 1), "count_include_pad": True}))
    if r.random() < 0.5:
        g = bind(make_call("mean", [cur], {"axis": (2, 3), "keepdims": True}))
        cur = bind(make_call("reshape", [g], {"shape": ("n", g.ty.shape[1])}))
    return Module({"main": Function("main", (x,), tuple(bindings), cur)})


@pytest.mark.parametrize("seed", range(6))
def test_random_cnn_same_numbers(seed):
    mod = _random_cnn(seed)
    converted = convert_layout(mod)
    assert "NHWC" in str(converted)
    plain = {t: dpl.build(dpl.apply(mod), t) for t in ("numpy", "cpu")}
    nhwc = {t: dpl.build(dpl.apply(mod, convert_layout=True), t) for t in ("numpy", "cpu")}
    for n, h in ((1, 7), (3, 10)):
        x = rng.standard_normal((n, 4, h, 12)).astype("float32")
        want = dpl.interpret(mod, x)
        np.testing.assert_allclose(dpl.interpret(converted, x), want, rtol=1e-4, atol=1e-4)
        for t in ("numpy", "cpu"):
            np.testing.assert_allclose(plain[t](x), want, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(nhwc[t](x), want, rtol=1e-4, atol=1e-4, err_msg=t)
