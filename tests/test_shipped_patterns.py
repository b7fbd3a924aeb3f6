"""The shipped libraries (patterns/*.dpl): each pattern against its hand-written Python DPL
twin on a corpus of modules (same bindings matched and accepted), each pattern matching the
graph it is meant for, and each rewrite checked numerically with the interpreter."""

import numpy as np
import pytest

import dpl
from dpl.ir import FunctionBuilder, Module, const
from dpl.lang import load_patterns
from dpl.lang.matching import find_matches
from dpl.pattern import FusionPattern, is_const, is_op, wildcard

from test_model_spellings import CASES as SPELLINGS

rng = np.random.default_rng(0)

# -- the corpus --------------------------------------------------------------------------------


def mlp(act=None, bias=True, dtype="f32"):
    fb = FunctionBuilder("main")
    x = fb.param("x", dtype, ("n", 64))
    w = fb.param("w", dtype, (64, 32))
    y = fb.emit("matmul", x, w, name="mm")
    if bias:
        y = fb.emit("add", y, fb.param("b", dtype, (32,)), name="biased")
    if act:
        y = fb.emit(act, y, name="act")
    return fb.ret(y)


def batched():
    fb = FunctionBuilder("main")
    a, b = fb.param("a", "f32", (4, 8, 16)), fb.param("b", "f32", (4, 16, 8))
    return fb.ret(fb.emit("matmul", a, b, name="bmm"))


def int_matmul():
    fb = FunctionBuilder("main")
    a, b = fb.param("a", "i32", (8, 16)), fb.param("b", "i32", (16, 8))
    return fb.ret(fb.emit("matmul", a, b, name="imm"))


def swiglu_block():
    fb = FunctionBuilder("main")
    x, wg, wu = fb.param("x", "f32", ("n", 64)), fb.param("wg", "f32", (64, 96)), fb.param("wu", "f32", (64, 96))
    gate = fb.emit("matmul", x, wg, name="gate")
    up = fb.emit("matmul", x, wu, name="up")
    act = fb.emit("nn.silu", gate, name="act")
    return fb.ret(fb.emit("multiply", up, act, name="h"))


def merged_glu(act="nn.silu"):
    """A merged gate/up product (dpl.apply's merge_products): one product, its halves as slices."""
    fb = FunctionBuilder("main")
    x, w = fb.param("x", "f32", ("n", 64)), fb.param("w", "f32", (64, 192))
    p = fb.emit("matmul", x, w, name="gate_up")
    gate = fb.emit("strided_slice", p, axes=[1], begin=[0], end=[96], name="gate")
    up = fb.emit("strided_slice", p, axes=[1], begin=[96], end=[192], name="up")
    return fb.ret(fb.emit("multiply", fb.emit(act, gate, name="act"), up, name="h"))


def experts_glu():
    """Mixtral's experts' first half: the grouped gate/up product, its halves, silu(gate) * up."""
    fb = FunctionBuilder("main")
    x, w, offs = fb.param("x", "f32", ("s", 64)), fb.param("w", "f32", (4, 64, 192)), fb.param("offsets", "i32", (4,))
    p = fb.emit("grouped_matmul", x, w, offs, name="gate_up")
    gate = fb.emit("strided_slice", p, axes=[1], begin=[0], end=[96], name="gate")
    up = fb.emit("strided_slice", p, axes=[1], begin=[96], end=[192], name="up")
    return fb.ret(fb.emit("multiply", fb.emit("nn.silu", gate, name="act"), up, name="h"))


def product_residual_rmsnorm():
    fb = FunctionBuilder("main")
    x, r, w = fb.param("x", "f32", ("n", 32)), fb.param("r", "f32", ("n", 64)), fb.param("w", "f32", (64,))
    mm = fb.emit("matmul", x, fb.param("wo", "f32", (32, 64)), name="o_proj")
    s = fb.emit("add", r, mm, name="s")
    normed = fb.emit("nn.rms_norm", s, w, name="normed")
    return fb.ret(fb.emit("add", normed, s, name="out"))


def residual_rmsnorm(sum_used_later=False):
    fb = FunctionBuilder("main")
    x, r, w = fb.param("x", "f32", ("n", 64)), fb.param("r", "f32", ("n", 64)), fb.param("w", "f32", (64,))
    s = fb.emit("add", x, r, name="s")
    normed = fb.emit("nn.rms_norm", s, w, name="normed")
    out = fb.emit("add", normed, s, name="out") if sum_used_later else normed
    return fb.ret(out)


def attention(mask=True, scale_by="multiply"):
    fb = FunctionBuilder("main")
    q, k, v = fb.param("q", "f32", (2, 8, 16)), fb.param("k", "f32", (2, 16, 8)), fb.param("v", "f32", (2, 8, 16))
    s = fb.emit("matmul", q, k, name="scores")
    z = fb.emit(scale_by, s, 0.25, name="scaled")
    if mask:
        z = fb.emit("add", z, fb.param("mask", "f32", (8, 8)), name="masked")
    p = fb.emit("nn.softmax", z, name="probs")
    return fb.ret(fb.emit("matmul", p, v, name="ctx"))


def gelus():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4, 8))
    a = fb.emit("nn.gelu", x, name="g1")
    b = fb.emit("nn.gelu_tanh", a, name="g2")
    return fb.ret(fb.emit("nn.relu", b, name="r"))


CORPUS = {
    "mlp_relu": mlp("nn.relu"), "mlp_gelu": mlp("nn.gelu"), "mlp_silu_f16": mlp("nn.silu", dtype="f16"),
    "mlp_tanh": mlp("tanh"), "mlp_nobias": mlp(bias=False), "mlp_bias": mlp(), "batched": batched(),
    "int_matmul": int_matmul(), "swiglu": swiglu_block(), "residual": residual_rmsnorm(),
    "residual_reused": residual_rmsnorm(True), "attention": attention(), "attention_nomask": attention(False, "divide"),
    "gelus": gelus(), "merged_swiglu": merged_glu(), "merged_geglu": merged_glu("nn.gelu_tanh"),
    "product_residual": product_residual_rmsnorm(), "experts_glu": experts_glu(),
    # the spellings of real models (tests/test_model_spellings.py), before any rewrite
    **{f"model_{name}": make()["main"] for name, (make, _) in SPELLINGS.items()},
}

# -- the Python twins --------------------------------------------------------------------------

FLOATS = ("float16", "bfloat16", "float32")


def _rank(e):
    return e.ty.ndim


def _twin_cublas():
    def floats(ctx, x):
        return ctx.annotated_expr[x].ty.dtype in FLOATS

    x, w, b = wildcard(), wildcard(), wildcard()
    mm = is_op("matmul")(x, w)
    y = is_op("add")(mm, b)
    r = y.optional(lambda t: is_op("reshape")(t))
    def activation(t):
        return is_op("nn.relu")(t) | is_op("nn.gelu")(t) | is_op("nn.gelu_tanh")(t) | is_op("nn.silu")(t) | is_op("tanh")(t)
    act = activation(r)
    ann = {"lhs": x, "rhs": w, "bias": b}
    bias_ok = lambda c: _rank(c.annotated_expr["rhs"]) == 2 and _rank(c.annotated_expr["bias"]) == 1 and floats(c, "lhs")

    def rows_only(c):  # a reshape between the bias add and the activation keeps the last dimension
        root = c.annotated_expr["root"]
        return bias_ok(c) and root.args[0].ty.shape[-1] == c.annotated_expr["bias"].ty.shape[-1]
    x5, w5 = wildcard(), wildcard()
    mm5 = is_op("matmul")(x5, w5)
    r5 = mm5.optional(lambda t: is_op("reshape")(t))
    act5 = is_op("nn.relu")(r5) | is_op("nn.gelu")(r5) | is_op("nn.gelu_tanh")(r5) | is_op("tanh")(r5)

    def act_rows_only(c):
        root = c.annotated_expr["root"]
        return (_rank(c.annotated_expr["rhs"]) == 2 and floats(c, "lhs")
                and root.args[0].ty.shape[-1] == c.annotated_expr["rhs"].ty.shape[-1])
    x6, w6, b6, res6 = wildcard(), wildcard(), wildcard(), wildcard()
    resid = is_op("add")(is_op("add")(is_op("matmul")(x6, w6), b6), res6)

    def residual_ok(c):
        e = c.annotated_expr
        return (_rank(e["rhs"]) == 2 and _rank(e["bias"]) == 1 and floats(c, "lhs")
                and tuple(e["residual"].ty.shape) == tuple(e["root"].ty.shape))
    x7, w7, res7 = wildcard(), wildcard(), wildcard()
    mm7 = is_op("matmul")(x7, w7)
    resid_nobias = is_op("add")(mm7.optional(lambda t: is_op("reshape")(t)), res7)

    def residual_nobias_ok(c):
        e = c.annotated_expr
        return (_rank(e["rhs"]) == 2 and floats(c, "lhs") and e["root"].args[0].ty.shape[-1] == e["rhs"].ty.shape[-1]
                and tuple(e["residual"].ty.shape) == tuple(e["root"].ty.shape))
    x2, w2, b2 = wildcard(), wildcard(), wildcard()
    x3, w3 = wildcard(), wildcard()
    x4, w4 = wildcard(), wildcard()
    viewed = is_op("matmul")(x4, w4).optional(lambda t: is_op("reshape")(t))
    return [
        FusionPattern("cublas.matmul_bias_act", act, {**ann, "root": act}, rows_only),
        FusionPattern("cublas.matmul_act", act5, {"lhs": x5, "rhs": w5, "root": act5}, act_rows_only),
        FusionPattern("cublas.matmul_bias_residual", resid, {"lhs": x6, "rhs": w6, "bias": b6, "residual": res6, "root": resid},
                      residual_ok),
        FusionPattern("cublas.matmul_residual", resid_nobias, {"lhs": x7, "rhs": w7, "residual": res7, "root": resid_nobias},
                      residual_nobias_ok),
        FusionPattern("cublas.matmul_bias", is_op("add")(is_op("matmul")(x2, w2), b2), {"lhs": x2, "rhs": w2, "bias": b2}, bias_ok),
        FusionPattern("cublas.batch_matmul", is_op("matmul")(x3, w3), {"lhs": x3, "rhs": w3},
                      lambda c: _rank(c.annotated_expr["lhs"]) >= 3 and _rank(c.annotated_expr["rhs"]) >= 3 and floats(c, "lhs")),
        FusionPattern("cublas.matmul", viewed, {"lhs": x4, "rhs": w4, "root": viewed},
                      lambda c: _rank(c.annotated_expr["lhs"]) >= 2 and _rank(c.annotated_expr["rhs"]) == 2 and floats(c, "lhs")
                      and c.annotated_expr["root"].ty.shape[-1] == c.annotated_expr["rhs"].ty.shape[-1]),
    ]


def _twin_llm():
    merged = is_op("matmul")(wildcard(), wildcard()).optional(lambda t: is_op("add")(t, wildcard()))
    half = is_op("strided_slice")(merged)
    glu = is_op("multiply")(is_op("nn.silu")(half) | is_op("nn.gelu")(half) | is_op("nn.gelu_tanh")(half),
                            is_op("strided_slice")(merged))
    grouped = is_op("grouped_matmul")(wildcard(), wildcard(), wildcard())
    grouped_glu = is_op("multiply")(is_op("nn.silu")(is_op("strided_slice")(grouped)), is_op("strided_slice")(grouped))
    residual = is_op("add")(wildcard(), is_op("matmul")(wildcard(), wildcard()))
    product_add_rms = is_op("nn.rms_norm")(residual, wildcard())
    gate, up = wildcard(), wildcard()
    swiglu = is_op("multiply")(is_op("nn.silu")(gate), up)
    a, b, w = wildcard(), wildcard(), wildcard()
    add_rms = is_op("nn.rms_norm")(is_op("add")(a, b), w)
    rms = is_op("nn.rms_norm")(wildcard(), wildcard())
    ln_n = is_op("nn.layer_norm")(wildcard(), wildcard(), wildcard())
    ln = ln_n.optional(lambda t: is_op("reshape")(t))

    def rows_kept(c):  # a reshape after the norm keeps the last dimension
        return c.annotated_expr["out"].ty.shape[-1] == c.annotated_expr["n"].ty.shape[-1]
    x = wildcard()
    gelu = is_op("nn.gelu")(x) | is_op("nn.gelu_tanh")(x)
    q, k, cq, ck, scale, bias, mask, v = (wildcard() for _ in range(8))
    s = is_op("matmul")(q.optional(lambda t: is_op("multiply")(t, cq)), k.optional(lambda t: is_op("multiply")(t, ck)))
    z = is_op("multiply")(s, scale) | is_op("divide")(s, scale) | s
    m = z.optional(lambda t: is_op("add")(t, mask)) | is_op("add")(is_op("add")(z, bias), mask)
    p = is_op("nn.softmax")(m.optional(lambda t: is_op("astype")(t))).optional(lambda t: is_op("astype")(t))
    att = is_op("matmul")(p, v)
    top = is_op("max")(m).has_attr({"axis": [-1], "keepdims": True})
    safe = is_op("where")(is_op("greater")(top, is_const(-np.inf)), att, is_const(0.0))
    return [
        FusionPattern("kernel.matmul_glu", glu),
        FusionPattern("kernel.grouped_matmul_glu", grouped_glu),
        FusionPattern("kernel.matmul_add_rms_norm", product_add_rms, outputs=(residual,)),
        FusionPattern("kernel.swiglu", swiglu),
        FusionPattern("kernel.add_rms_norm", add_rms),
        FusionPattern("kernel.rms_norm", rms),
        FusionPattern("kernel.layer_norm", ln, {"out": ln, "n": ln_n}, rows_kept),
        FusionPattern("kernel.gelu", gelu),
        FusionPattern("kernel.safe_attention", safe, {"q": q}, lambda c: True),
        FusionPattern("kernel.attention", att, {"q": q}, lambda c: True),
    ]


def _twin_cnn():
    def conv_bn():
        c = is_op("nn.conv2d")(wildcard(), wildcard())
        bn = is_op("add")(is_op("multiply")(is_op("multiply")(is_op("subtract")(c, wildcard()), wildcard()), wildcard()), wildcard())
        return bn | c
    stem = is_op("nn.max_pool2d")(is_op("nn.relu")(conv_bn()))
    shortcut = is_op("nn.relu")(is_op("add")(conv_bn(), conv_bn()))
    block = is_op("nn.relu")(is_op("add")(conv_bn(), wildcard())) | is_op("nn.relu")(conv_bn())
    x = wildcard()
    pooled = is_op("mean")(x).has_attr({"axis": [-2, -1], "keepdims": True}) | is_op("nn.adaptive_avg_pool2d")(x)

    def one_by_one(c):
        out = c.annotated_expr["root"]
        return c.annotated_expr["x"].ty.ndim == 4 and tuple(out.ty.shape[-2:]) == (1, 1)
    return [
        FusionPattern("kernel.conv2d_relu_max_pool", stem),
        FusionPattern("kernel.conv2d_shortcut", shortcut),
        FusionPattern("kernel.global_avg_pool", pooled, {"x": x, "root": pooled}, one_by_one),
        FusionPattern("kernel.conv2d_bn_relu", block),
    ]


TWINS = {"cublas": _twin_cublas, "llm": _twin_llm, "cnn": _twin_cnn}


def summary(found):
    return sorted((f.pattern, f.binding, f.bindings, f.accepted) for f in found)


@pytest.mark.parametrize("library", sorted(TWINS))
@pytest.mark.parametrize("module", sorted(CORPUS))
def test_library_matches_its_python_twin(library, module):
    func = CORPUS[module]
    assert summary(find_matches(load_patterns(library), func)) == summary(find_matches(TWINS[library](), func))


def test_every_shipped_pattern_has_a_twin():
    for library, twin in TWINS.items():
        assert [p.name for p in load_patterns(library)] == [p.name for p in twin()]


def accepted_roots(library, module):
    return {(f.pattern, f.binding) for f in find_matches(load_patterns(library), CORPUS[module]) if f.accepted}


@pytest.mark.parametrize(
    "library,module,expected",
    [
        ("cublas", "mlp_relu", {("cublas.matmul_bias_act", "act"), ("cublas.matmul_bias", "biased"), ("cublas.matmul", "mm")}),
        ("cublas", "mlp_tanh", {("cublas.matmul_bias_act", "act"), ("cublas.matmul_bias", "biased"), ("cublas.matmul", "mm")}),
        ("cublas", "model_t5_relu_no_bias", {("cublas.matmul_act", "act"), ("cublas.matmul", "wi"), ("cublas.matmul", "wo")}),
        ("cublas", "model_residual_after_projection",
         {("cublas.matmul_bias_residual", "residual"), ("cublas.matmul_bias", "biased"), ("cublas.matmul", "mm")}),
        ("cublas", "batched", {("cublas.batch_matmul", "bmm")}),
        ("cublas", "int_matmul", set()),
        ("llm", "swiglu", {("kernel.swiglu", "h")}),
        ("llm", "residual", {("kernel.add_rms_norm", "normed"), ("kernel.rms_norm", "normed")}),
        ("llm", "gelus", {("kernel.gelu", "g1"), ("kernel.gelu", "g2")}),
        ("llm", "attention", {("kernel.attention", "ctx")}),
        ("llm", "attention_nomask", {("kernel.attention", "ctx")}),
        ("llm", "mlp_relu", set()),
        # the block pattern matches inside both; the earlier pattern claims them first (fusion)
        ("cnn", "model_resnet_stem_torch", {("kernel.conv2d_relu_max_pool", "pool"), ("kernel.conv2d_bn_relu", "act")}),
        ("cnn", "model_resnet_shortcut_onnx", {("kernel.conv2d_shortcut", "out"), ("kernel.conv2d_bn_relu", "out")}),
        ("cnn", "model_resnet_head_onnx", {("kernel.global_avg_pool", "pooled")}),
        ("cnn", "model_gpt2_onnx_mlp", set()),
        ("llm", "merged_swiglu", {("kernel.matmul_glu", "h"), ("kernel.swiglu", "h")}),
        ("llm", "merged_geglu", {("kernel.matmul_glu", "h"), ("kernel.gelu", "act")}),
        ("llm", "experts_glu", {("kernel.grouped_matmul_glu", "h"), ("kernel.swiglu", "h")}),
        ("llm", "product_residual", {("kernel.matmul_add_rms_norm", "normed"), ("kernel.add_rms_norm", "normed"),
                                     ("kernel.rms_norm", "normed")}),
    ],
)
def test_patterns_match_what_they_are_meant_for(library, module, expected):
    assert accepted_roots(library, module) == expected


# -- rewrites: numerics --------------------------------------------------------------------------


def llama_rmsnorm(dtype="f16", square="power", w_first=True, cast=True):
    fb = FunctionBuilder("main")
    x, w = fb.param("x", dtype, ("n", 64)), fb.param("w", dtype, (64,))
    h = fb.emit("astype", x, dtype="f32", name="h32") if cast else x
    sq = fb.emit("power", h, const(2.0, "f32" if cast else dtype), name="sq") if square == "power" else fb.emit("multiply", h, h, name="sq")
    var = fb.emit("mean", sq, axis=[-1], keepdims=True, name="var")
    r = fb.emit("rsqrt", fb.emit("add", var, const(1e-6, "f32" if cast else dtype), name="ve"), name="r")
    n = fb.emit("multiply", h, r, name="normed")
    back = fb.emit("astype", n, dtype=dtype, name="back") if cast else n
    out = fb.emit("multiply", w, back, name="out") if w_first else fb.emit("multiply", back, w, name="out")
    return fb.ret(out)


def erf_gelu():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4, 32))
    e = fb.emit("erf", fb.emit("divide", x, 1.4142135623730951, name="xs"), name="e")
    a = fb.emit("add", e, 1.0, name="a")
    return fb.ret(fb.emit("multiply", fb.emit("multiply", x, 0.5, name="half"), a, name="out"))


def tanh_gelu():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4, 32))
    cube = fb.emit("power", x, 3.0, name="cube")
    inner = fb.emit("add", x, fb.emit("multiply", cube, 0.044715, name="c"), name="inner")
    t = fb.emit("tanh", fb.emit("multiply", inner, 0.7978845608028654, name="s"), name="t")
    a = fb.emit("add", t, 1.0, name="a")
    return fb.ret(fb.emit("multiply", fb.emit("multiply", x, 0.5, name="half"), a, name="out"))


def silu_by_hand():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4, 32))
    return fb.ret(fb.emit("multiply", x, fb.emit("sigmoid", x, name="s"), name="out"))


def softmax_by_hand(stable=True):
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4, 32))
    src = fb.emit("subtract", x, fb.emit("max", x, axis=[-1], keepdims=True, name="m"), name="d") if stable else x
    e = fb.emit("exp", src, name="e")
    return fb.ret(fb.emit("divide", e, fb.emit("sum", e, axis=[-1], keepdims=True, name="s"), name="out"))


def layer_norm_by_hand():
    fb = FunctionBuilder("main")
    x, g, b = fb.param("x", "f32", (4, 32)), fb.param("g", "f32", (32,)), fb.param("b", "f32", (32,))
    mu = fb.emit("mean", x, axis=[-1], keepdims=True, name="mu")
    d = fb.emit("subtract", x, mu, name="d")
    var = fb.emit("mean", fb.emit("multiply", d, d, name="dd"), axis=[-1], keepdims=True, name="var")
    n = fb.emit("divide", d, fb.emit("sqrt", fb.emit("add", var, 1e-5, name="ve"), name="sd"), name="n")
    return fb.ret(fb.emit("add", fb.emit("multiply", n, g, name="ng"), b, name="out"))


REWRITES = [
    ("rms_norm f16 power w*x", llama_rmsnorm(), "nn.rms_norm"),
    ("rms_norm f16 square x*w", llama_rmsnorm(square="mul", w_first=False), "nn.rms_norm"),
    ("rms_norm f32 no casts", llama_rmsnorm("f32", cast=False), "nn.rms_norm"),
    ("gelu erf", erf_gelu(), "nn.gelu"),
    ("gelu tanh", tanh_gelu(), "nn.gelu_tanh"),
    ("silu", silu_by_hand(), "nn.silu"),
    ("softmax stable", softmax_by_hand(), "nn.softmax"),
    ("softmax plain", softmax_by_hand(False), "nn.softmax"),
    ("layer_norm", layer_norm_by_hand(), "nn.layer_norm"),
]


def inputs(func):
    arrays = []
    for p in func.params:
        shape = tuple(5 if isinstance(d, str) else d for d in p.ty.shape)
        arrays.append(rng.standard_normal(shape).astype(dpl.dtypes.to_numpy(p.ty.dtype)))
    return arrays


@pytest.mark.parametrize("name,func,op", REWRITES, ids=[r[0] for r in REWRITES])
def test_rewrite_to_standard_op(name, func, op):
    new = load_patterns("rewrites").apply_rewrites(func)
    assert [b.value.op for b in new.bindings] == [op]
    args = inputs(func)
    want, got = dpl.interpret(func, *args), dpl.interpret(new, *args)
    tol = 2e-3 if want.dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)


def test_rewrites_leave_other_code_alone():
    for module in ["mlp_relu", "attention", "swiglu", "residual"]:
        func = CORPUS[module]
        assert dpl.structural_equal(load_patterns("rewrites").apply_rewrites(func), func)


def patch_embedding(image=(2, 3, 12, 16), patch=4, strides=None, padding=(0, 0), bias_shape=None, batch="n"):
    """ViT's patch embedding as torch.export spells it: conv (stride = window), + bias, flatten(2),
    transpose(1, 2); the batch symbolic."""
    n, c, h, w = image
    o = 5
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (batch, c, h, w))
    weight = const(rng.standard_normal((o, c, patch, patch)).astype(np.float32))
    bias = const(rng.standard_normal(bias_shape or (o, 1, 1)).astype(np.float32))
    conv = fb.emit("nn.conv2d", x, weight, strides=list(strides or (patch, patch)), padding=list(padding), name="c")
    b = fb.emit("add", conv, bias, name="b")
    oh, ow = conv.ty.shape[2], conv.ty.shape[3]
    f = fb.emit("reshape", b, shape=[batch, o, oh * ow], name="f")
    return fb.ret(fb.emit("permute_dims", f, axes=[0, 2, 1], name="out"))


def test_a_patch_embedding_becomes_one_product_of_its_patches():
    """Each patch a row of a product by the weights as a matrix (its transpose folded once),
    the bias added: the numbers of the convolution, flattened and transposed, at any batch."""
    func = patch_embedding()
    new = load_patterns("rewrites").apply_rewrites(func)
    ops = [b.value.op for b in new.bindings]
    assert "nn.conv2d" not in ops and ops.count("matmul") == 1, ops
    for batch in (1, 3):
        x = rng.standard_normal((batch, 3, 12, 16)).astype(np.float32)
        np.testing.assert_allclose(dpl.interpret(new, x), dpl.interpret(func, x), rtol=1e-5, atol=1e-5)
    fused = dpl.apply(Module([func]), ["rewrites"])
    assert "nn.conv2d" not in str(fused)
    x = rng.standard_normal((2, 3, 12, 16)).astype(np.float32)
    np.testing.assert_allclose(dpl.build(fused, ["cpu", "numpy"])(x), dpl.interpret(func, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", [dict(strides=(2, 2)), dict(padding=(1, 1)), dict(image=(2, 3, 13, 16)),
                                  dict(bias_shape=(5, 1, 4))], ids=["overlapping", "padded", "remainder", "bias"])
def test_what_is_not_a_patch_embedding_stays(case):
    """Windows that overlap, padding, an image the patches do not tile, a bias not per channel."""
    func = patch_embedding(**case)
    assert dpl.structural_equal(load_patterns("rewrites").apply_rewrites(func), func)
