"""The spellings real models emit, each claimed by the shipped libraries' composite meant for it:
each module is written in the exact ops a frontend gives (torch.export, torch.onnx.export with
dynamo), run through ``dpl.apply(mod, ["rewrites", "llm", "cublas", "cnn"])``, checked to hold the
composite, then built for "cpu" (compiled, no fall-back) and "numpy" and compared with the
interpreter on random inputs."""

import numpy as np
import pytest

import needs

import dpl
from dpl.ir import FunctionBuilder, Module, const
from dpl.ir.expr import Call, Function

# attention_onnx_guarded's masked row: the interpreter's softmax of all -inf is NaN before the where
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")

LIBRARIES = ["rewrites", "llm", "cublas", "cnn"]
ALWAYS = dpl.FusionConfig(min_nodes_for_fusion=1, max_graph_size=10_000, min_tensor_elements=0, fallback_on_error=False)
B, H, S, D = 2, 4, 8, 16  # batch, heads, sequence, head size
rng = np.random.default_rng(7)


def _weight(*shape, dtype="f32"):
    return const(rng.standard_normal(shape).astype(dpl.dtypes.to_numpy(dpl.dtypes.canonical(dtype))) * 0.2, dtype)


# -- attention -----------------------------------------------------------------------------------


def _qkv(fb, dtype="f32", seq=S):
    q, k, v = (fb.param(n, dtype, (B, H, seq, D)) for n in "qkv")
    return q, fb.emit("permute_dims", k, axes=[0, 1, 3, 2], name="kt"), v


def _finish(fb, scores, v, dtype="f32"):
    p = fb.emit("nn.softmax", scores, name="probs")
    return Module([fb.ret(fb.emit("matmul", p, v, name="ctx"))])


def attention_onnx_sdpa():
    """torch.onnx's SDPA: q and k^T each scaled by sqrt(scale) before the product, then the mask."""
    fb = FunctionBuilder("main")
    q, kt, v = _qkv(fb)
    c = float(np.sqrt(1 / np.sqrt(D)))
    s = fb.emit("matmul", fb.emit("multiply", q, c, name="qs"), fb.emit("multiply", kt, c, name="ks"), name="scores")
    return _finish(fb, fb.emit("add", s, fb.param("mask", "f32", (1, 1, S, S)), name="masked"), v)


def attention_onnx_sdpa_symbolic():
    """torch.onnx's SDPA with a symbolic sequence length (dynamic axes), mask broadcast over it."""
    fb = FunctionBuilder("main")
    q, kt, v = _qkv(fb, seq="s")
    c = float(np.sqrt(1 / np.sqrt(D)))
    s = fb.emit("matmul", fb.emit("multiply", q, c, name="qs"), fb.emit("multiply", kt, c, name="ks"), name="scores")
    return _finish(fb, fb.emit("add", s, fb.param("mask", "f32", (B, 1, 1, "s")), name="masked"), v)


def attention_onnx_guarded():
    """torch.onnx's SDPA as the zoo's models export it: q and k^T each scaled, the mask added,
    and the result guarded by where(max(scores) > -inf, ..., 0). The constant mask hides every
    key from the first query, whose row must come out 0, not NaN."""
    fb = FunctionBuilder("main")
    q, kt, v = _qkv(fb)
    c = float(np.sqrt(1 / np.sqrt(D)))
    mask = np.where(rng.random((1, 1, S, S)) < 0.3, -np.inf, 0.0).astype(np.float32)
    mask[..., 0, :] = -np.inf
    s = fb.emit("matmul", fb.emit("multiply", q, c, name="qs"), fb.emit("multiply", kt, c, name="ks"), name="scores")
    m = fb.emit("add", s, const(mask, "f32"), name="masked")
    o = fb.emit("matmul", fb.emit("nn.softmax", m, name="probs"), v, name="ctx")
    top = fb.emit("max", m, axis=[-1], keepdims=True, name="top")
    seen = fb.emit("greater", top, const(-np.inf, "f32"), name="seen")
    return Module([fb.ret(fb.emit("where", seen, o, 0.0, name="out"))])


def attention_opt():
    """OPT: the scale is folded into q's projection, nothing between the product and the mask."""
    fb = FunctionBuilder("main")
    q, kt, v = _qkv(fb)
    s = fb.emit("matmul", q, kt, name="scores")
    return _finish(fb, fb.emit("add", s, fb.param("mask", "f32", (B, 1, S, S)), name="masked"), v)


def attention_t5():
    """T5 through SDPA: scale 1.0, a position bias and a mask added one after the other."""
    fb = FunctionBuilder("main")
    q, kt, v = _qkv(fb)
    s = fb.emit("multiply", fb.emit("matmul", q, kt, name="scores"), 1.0, name="scaled")
    s = fb.emit("add", s, fb.param("bias", "f32", (1, H, S, S)), name="biased")
    return _finish(fb, fb.emit("add", s, fb.param("mask", "f32", (B, 1, 1, S)), name="masked"), v)


def attention_eager_f16():
    """transformers' eager attention in f16: the softmax runs in f32 between two casts, no dropout."""
    fb = FunctionBuilder("main")
    q, kt, v = _qkv(fb, "f16")
    s = fb.emit("multiply", fb.emit("matmul", q, kt, name="scores"), const(0.25, "f16"), name="scaled")
    s = fb.emit("add", s, fb.param("mask", "f16", (1, 1, S, S)), name="masked")
    p = fb.emit("nn.softmax", fb.emit("astype", s, dtype="f32", name="up"), name="probs")
    back = fb.emit("astype", p, dtype="f16", name="down")
    return Module([fb.ret(fb.emit("matmul", back, v, name="ctx"))])


def attention_merged_qkv():
    """q/k/v projections of one hidden state with constant weights: merged into one product and
    a split before the patterns run; attention is still claimed through the split's items."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (B, S, H * D))

    def heads(name):
        y = fb.emit("matmul", x, _weight(H * D, H * D), name=name)
        return fb.emit("permute_dims", fb.emit("reshape", y, shape=[B, S, H, D], name=f"{name}_r"), axes=[0, 2, 1, 3], name=f"{name}_h")

    q, k, v = heads("q"), heads("k"), heads("v")
    kt = fb.emit("permute_dims", k, axes=[0, 1, 3, 2], name="kt")
    s = fb.emit("divide", fb.emit("matmul", q, kt, name="scores"), 4.0, name="scaled")
    return _finish(fb, s, v)


# -- norms ---------------------------------------------------------------------------------------


def first_rms_norm():
    """A stack's first RMSNorm: no residual add before it."""
    fb = FunctionBuilder("main")
    x, w = fb.param("x", "f32", (B, S, 64)), fb.param("w", "f32", (64,))
    n = fb.emit("nn.rms_norm", x, w, axes=[-1], epsilon=1e-6, name="normed")
    return Module([fb.ret(fb.emit("matmul", n, _weight(64, 32), name="proj"))])


def qwen3_qk_norm():
    """Qwen3's per-head norm of q: the projection viewed as heads, an RMSNorm over the head size."""
    fb = FunctionBuilder("main")
    x, w = fb.param("x", "f32", (B, S, H * D)), fb.param("w", "f32", (D,))
    heads = fb.emit("reshape", x, shape=[B, S, H, D], name="heads")
    n = fb.emit("nn.rms_norm", heads, w, axes=[-1], epsilon=1e-6, name="q_norm")
    return Module([fb.ret(fb.emit("permute_dims", n, axes=[0, 2, 1, 3], name="q"))])


def residual_then_rms_norm():
    """A residual add before the norm: add_rms_norm takes both, not the lone rms_norm."""
    fb = FunctionBuilder("main")
    x, r, w = fb.param("x", "f32", (B, S, 64)), fb.param("r", "f32", (B, S, 64)), fb.param("w", "f32", (64,))
    s = fb.emit("add", x, r, name="s")
    n = fb.emit("nn.rms_norm", s, w, axes=[-1], epsilon=1e-6, name="normed")
    return Module([fb.ret(fb.emit("add", n, s, name="out"))])


def layer_norm():
    """nn.layer_norm as torch and ONNX (LayerNormalization) give it."""
    fb = FunctionBuilder("main")
    x, g, b = fb.param("x", "f32", (B, S, 64)), fb.param("g", "f32", (64,)), fb.param("b", "f32", (64,))
    n = fb.emit("nn.layer_norm", x, g, b, axes=[-1], epsilon=1e-5, name="ln")
    return Module([fb.ret(fb.emit("matmul", n, _weight(64, 32), name="proj"))])


def gpt2_ln_then_rows():
    """GPT-2: ln_1, then Conv1D's view of the normed value as rows before addmm."""
    fb = FunctionBuilder("main")
    x, g, b = fb.param("x", "f32", (B, S, 64)), fb.param("g", "f32", (64,)), fb.param("b", "f32", (64,))
    n = fb.emit("nn.layer_norm", x, g, b, axes=[-1], epsilon=1e-5, name="ln")
    rows = fb.emit("reshape", n, shape=[B * S, 64], name="rows")
    y = fb.emit("add", fb.emit("matmul", rows, _weight(64, 32), name="mm"), _weight(32), name="biased")
    return Module([fb.ret(fb.emit("reshape", y, shape=[B, S, 32], name="back"))])


def layer_norm_read_twice():
    """The normed value read as rows and as it is: the reshape cannot go into the norm's kernel
    (the norm would leak), and the norm alone is still claimed."""
    fb = FunctionBuilder("main")
    x, g, b = fb.param("x", "f32", (B, S, 64)), fb.param("g", "f32", (64,)), fb.param("b", "f32", (64,))
    n = fb.emit("nn.layer_norm", x, g, b, axes=[-1], epsilon=1e-5, name="ln")
    e = fb.emit("exp", fb.emit("reshape", n, shape=[B * S, 64], name="rows"), name="e")
    return Module([fb.ret(fb.emit("add", fb.emit("reshape", e, shape=[B, S, 64], name="back"), n, name="out"))])


# -- matrix-product epilogues --------------------------------------------------------------------


def gpt2_conv1d_mlp():
    """GPT-2's Conv1D: addmm on the rows (a view to 2-D, matmul, bias), a view back, then GELU."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (B, S, 32))
    rows = fb.emit("reshape", x, shape=[B * S, 32], name="rows")
    y = fb.emit("add", fb.emit("matmul", rows, _weight(32, 128), name="mm"), _weight(128), name="biased")
    back = fb.emit("reshape", y, shape=[B, S, 128], name="back")
    return Module([fb.ret(fb.emit("nn.gelu_tanh", back, name="act"))])


def conv1d_symbolic_rows():
    """GPT-2's Conv1D over a symbolic number of rows, viewed back with an axis of 1 added."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", 32))
    y = fb.emit("add", fb.emit("matmul", x, _weight(32, 128), name="mm"), _weight(128), name="biased")
    back = fb.emit("reshape", y, shape=["n", 1, 128], name="back")
    return Module([fb.ret(fb.emit("nn.gelu", back, name="act"))])


def bert_mlp():
    """BERT / ViT intermediate: product, bias, erf GELU (a lone kernel.gelu must not take it)."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (B, S, 32))
    y = fb.emit("add", fb.emit("matmul", x, _weight(32, 128), name="mm"), _weight(128), name="biased")
    return Module([fb.ret(fb.emit("nn.gelu", y, name="act"))])


def reshape_changing_rows():
    """A reshape that changes the last dimension is no row split: the epilogue stops at the add."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (S, 32))
    y = fb.emit("add", fb.emit("matmul", x, _weight(32, 64), name="mm"), _weight(64), name="biased")
    back = fb.emit("reshape", y, shape=[S, 2, 32], name="back")
    return Module([fb.ret(fb.emit("nn.gelu", back, name="act"))])


def pooler_tanh():
    """BERT's and ViT's pooler: the first token's row, product, bias, tanh (no cuBLASLt epilogue
    for tanh: the product and a generated epilogue)."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (B, S, 32))
    first = fb.emit("strided_slice", x, axes=[1], begin=[0], end=[1], name="first")
    rows = fb.emit("squeeze", first, axis=[1], name="rows")
    y = fb.emit("add", fb.emit("matmul", rows, _weight(32, 32), name="mm"), _weight(32), name="biased")
    return Module([fb.ret(fb.emit("tanh", y, name="pooled"))])


def t5_relu_no_bias():
    """T5's feed-forward: wi without a bias, ReLU, wo."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (B, S, 32))
    h = fb.emit("nn.relu", fb.emit("matmul", x, _weight(32, 128), name="wi"), name="act")
    return Module([fb.ret(fb.emit("matmul", h, _weight(128, 32), name="wo"))])


def swiglu_unmerged():
    """A SwiGLU MLP whose weights are parameters (no merged product): the gate's SiLU goes to
    llm's swiglu with the multiply, not to the gate product's epilogue."""
    fb = FunctionBuilder("main")
    x, wg, wu = fb.param("x", "f32", (B, S, 32)), fb.param("wg", "f32", (32, 64)), fb.param("wu", "f32", (32, 64))
    gate = fb.emit("nn.silu", fb.emit("matmul", x, wg, name="gate"), name="act")
    return Module([fb.ret(fb.emit("multiply", gate, fb.emit("matmul", x, wu, name="up"), name="h"))])


def gpt2_onnx_mlp():
    """GPT-2's MLP through torch.onnx: the zero-initialised Conv1D bias folded away, the product
    viewed back to [batch, seq, n], then the (tanh) GELU."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (B, "seq", 32))
    mm = fb.emit("matmul", x, _weight(32, 128), name="mm")
    back = fb.emit("reshape", mm, shape=[B, -1, 128], name="back")
    return Module([fb.ret(fb.emit("nn.gelu_tanh", back, name="act"))])


def gpt2_onnx_qkv():
    """GPT-2's q/k/v product through torch.onnx: no bias (folded away), viewed back to
    [batch, seq, 3n] and split: the view goes into the product's composite."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (B, "seq", 32))
    mm = fb.emit("matmul", x, _weight(32, 96), name="mm")
    rows = fb.emit("reshape", mm, shape=[B, -1, 96], name="rows")
    parts = fb.emit("split", rows, indices_or_sections=[32, 64], axis=2, name="parts")
    q, k, v = (fb.item(parts, i, name=n) for i, n in enumerate("qkv"))
    return Module([fb.ret(fb.emit("add", fb.emit("multiply", q, k, name="qk"), v, name="out"))])


def residual_after_projection():
    """A projection, its bias and the residual add after it (GPT-2, OPT, BERT, ViT), the sum
    read by the next norm and the next residual: the add is the product's epilogue."""
    fb = FunctionBuilder("main")
    x, r = fb.param("x", "f32", (B, S, 32)), fb.param("r", "f32", (B, S, 64))
    g, b = fb.param("g", "f32", (64,)), fb.param("b", "f32", (64,))
    y = fb.emit("add", fb.emit("matmul", x, _weight(32, 64), name="mm"), _weight(64), name="biased")
    s = fb.emit("add", r, y, name="residual")
    n = fb.emit("nn.layer_norm", s, g, b, axes=[-1], epsilon=1e-5, name="ln")
    return Module([fb.ret(fb.emit("add", n, s, name="out"))])


def gpt2_onnx_residual():
    """GPT-2's attention projection through torch.onnx: no bias (folded away), the product viewed
    back to [batch, seq, n] and added to the residual, which the next layer norm reads."""
    fb = FunctionBuilder("main")
    x, r = fb.param("x", "f32", (B, "seq", 32)), fb.param("r", "f32", (B, "seq", 64))
    g, b = fb.param("g", "f32", (64,)), fb.param("b", "f32", (64,))
    mm = fb.emit("matmul", x, _weight(32, 64), name="mm")
    s = fb.emit("add", fb.emit("reshape", mm, shape=[B, -1, 64], name="rows"), r, name="residual")
    n = fb.emit("nn.layer_norm", s, g, b, axes=[-1], epsilon=1e-5, name="ln")
    return Module([fb.ret(fb.emit("add", n, s, name="out"))])


def llama_o_proj_residual():
    """Llama's o_proj, the residual add and the next RMSNorm: llm's norm takes the add (with the
    norm), not cublas.matmul_residual."""
    fb = FunctionBuilder("main")
    x, r, w = fb.param("x", "f32", (B, S, 32)), fb.param("r", "f32", (B, S, 64)), fb.param("w", "f32", (64,))
    s = fb.emit("add", r, fb.emit("matmul", x, _weight(32, 64), name="o_proj"), name="residual")
    n = fb.emit("nn.rms_norm", s, w, axes=[-1], epsilon=1e-6, name="normed")
    return Module([fb.ret(fb.emit("add", n, s, name="out"))])


def residual_broadcast():
    """An add after the bias that broadcasts (not a residual of the product's shape) stays out of
    the epilogue: cuBLASLt's C operand has the product's shape."""
    fb = FunctionBuilder("main")
    x, r = fb.param("x", "f32", (B, S, 32)), fb.param("r", "f32", (B, 1, 64))
    y = fb.emit("add", fb.emit("matmul", x, _weight(32, 64), name="mm"), _weight(64), name="biased")
    return Module([fb.ret(fb.emit("add", y, r, name="shifted"))])


# -- convolutional networks (ResNet) ---------------------------------------------------------------

C, HW = 4, 8  # channels, height and width of the feature maps


def _conv_bn(fb, x, cin, cout, torch_spelling, name, **attrs):
    """A convolution, and torch.export's inference batch norm after it (torch.onnx folds it in)."""
    y = fb.emit("nn.conv2d", x, _weight(cout, cin, 3, 3), padding=[1, 1, 1, 1], name=name, **attrs)
    if not torch_spelling:
        return y
    y = fb.emit("subtract", y, _weight(1, cout, 1, 1), name=f"{name}_centred")
    y = fb.emit("multiply", y, _weight(1, cout, 1, 1), name=f"{name}_scaled")
    y = fb.emit("multiply", y, _weight(1, cout, 1, 1), name=f"{name}_weighted")
    return fb.emit("add", y, _weight(1, cout, 1, 1), name=f"{name}_bn")


def resnet_stem(torch_spelling=True):
    """ResNet's stem: convolution (batch norm), ReLU, 3x3 max pool of stride 2."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (B, 3, HW, HW))
    r = fb.emit("nn.relu", _conv_bn(fb, x, 3, C, torch_spelling, "conv"), name="act")
    return Module([fb.ret(fb.emit("nn.max_pool2d", r, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1], name="pool"))])


def resnet_projection_shortcut(torch_spelling=True):
    """A residual block's end: its last convolution and the strided projection shortcut summed, ReLU."""
    fb = FunctionBuilder("main")
    h, x = fb.param("h", "f32", (B, C, HW // 2, HW // 2)), fb.param("x", "f32", (B, C, HW, HW))
    main = _conv_bn(fb, h, C, 2 * C, torch_spelling, "main")
    short = _conv_bn(fb, x, C, 2 * C, torch_spelling, "shortcut", strides=[2, 2])
    return Module([fb.ret(fb.emit("nn.relu", fb.emit("add", main, short, name="sum"), name="out"))])


def resnet_head(torch_spelling=True):
    """ResNet's head: the last block's result, returned and globally average-pooled
    (torch: adaptive_avg_pool2d to 1x1; ONNX: GlobalAveragePool as a mean over H and W)."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (B, C, HW, HW))
    r = fb.emit("nn.relu", x, name="act")
    if torch_spelling:
        pooled = fb.emit("nn.adaptive_avg_pool2d", r, output_size=[1, 1], name="pooled")
    else:
        pooled = fb.emit("mean", r, axis=[-2, -1], keepdims=True, name="pooled")
    return Module([fb.ret(r, pooled)])

# -- merged products, splits, the mask (issue 16: nothing of these stays alone) ---------------------


def _gate_up(act):
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (B, S, 64))
    gate = fb.emit("matmul", x, _weight(64, 96), name="gate")
    up = fb.emit("matmul", x, _weight(64, 96), name="up")
    return Module([fb.ret(fb.emit("multiply", fb.emit(act, gate, name="act"), up, name="h"))])


def llama_gate_up():
    """Llama's MLP: gate and up read one hidden state (merged into one product, two slices)."""
    return _gate_up("nn.silu")


def gemma_gate_up():
    """Gemma's MLP: the tanh GELU of the gate times up; kernel.gelu must not take the GELU."""
    return _gate_up("nn.gelu_tanh")


def o_proj_residual_norm():
    """The attention output projection, the residual add and the next layer's RMSNorm; the sum
    is read again by the next residual add."""
    fb = FunctionBuilder("main")
    a, x = fb.param("a", "f32", (B, S, 32)), fb.param("x", "f32", (B, S, 64))
    s = fb.emit("add", x, fb.emit("matmul", a, _weight(32, 64), name="o_proj"), name="s")
    n = fb.emit("nn.rms_norm", s, _weight(64), axes=[-1], epsilon=1e-6, name="normed")
    return Module([fb.ret(fb.emit("add", fb.emit("matmul", n, _weight(64, 64), name="next"), s, name="out"))])


def gpt2_split_qkv():
    """GPT-2: c_attn's product and bias split into q, k and v, each viewed as heads."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (B, S, H * D))
    qkv = fb.emit("add", fb.emit("matmul", x, _weight(H * D, 3 * H * D), name="mm"), _weight(3 * H * D), name="c_attn")
    parts = fb.emit("split", qkv, indices_or_sections=[H * D, 2 * H * D], axis=2, name="parts")

    def heads(i, name):
        y = fb.item(parts, i, name=name)
        return fb.emit("permute_dims", fb.emit("reshape", y, shape=[B, S, H, D], name=f"{name}_r"), axes=[0, 2, 1, 3], name=f"{name}_h")

    q, k, v = heads(0, "q"), heads(1, "k"), heads(2, "v")
    kt = fb.emit("permute_dims", k, axes=[0, 1, 3, 2], name="kt")
    s = fb.emit("multiply", fb.emit("matmul", q, kt, name="scores"), 0.25, name="scaled")
    return _finish(fb, s, v)


def decoder_mask():
    """A decoder's mask: the padding test, where() of it (read by two layers' attention) and the
    guard of fully padded rows, which reads the test again."""
    fb = FunctionBuilder("main")
    q, v = (fb.param(n, "f32", (B, H, S, D)) for n in "qv")
    kt = fb.param("kt", "f32", (B, H, D, S))
    am = fb.param("attention_mask", "i64", (B, S))
    keep = fb.emit("expand_dims", fb.emit("astype", am, dtype="bool", name="keep0"), axis=[1, 2], name="keep")
    bias = fb.emit("where", keep, 0.0, -3.4028234663852886e38, name="bias")
    ctx = q
    for layer in range(2):
        s = fb.emit("add", fb.emit("multiply", fb.emit("matmul", ctx, kt, name=f"s{layer}"), 0.25, name=f"z{layer}"), bias, name=f"m{layer}")
        ctx = fb.emit("matmul", fb.emit("nn.softmax", s, name=f"p{layer}"), v, name=f"ctx{layer}")
    guard = fb.emit("max", fb.emit("astype", keep, dtype="f32", name="keepf"), axis=[-1], keepdims=True, name="guard")
    out = fb.emit("permute_dims", fb.emit("multiply", ctx, guard, name="guarded"), axes=[0, 2, 1, 3], name="out")
    return Module([fb.ret(out)])


CASES = {
    "attention_onnx_sdpa": (attention_onnx_sdpa, {"kernel.attention": 1}),
    "attention_onnx_sdpa_symbolic": (attention_onnx_sdpa_symbolic, {"kernel.attention": 1}),
    "attention_onnx_guarded": (attention_onnx_guarded, {"kernel.safe_attention": 1, "kernel.attention": 0}),
    "attention_opt": (attention_opt, {"kernel.attention": 1}),
    "attention_t5": (attention_t5, {"kernel.attention": 1}),
    "attention_eager_f16": (attention_eager_f16, {"kernel.attention": 1}),
    "attention_merged_qkv": (attention_merged_qkv, {"kernel.attention": 1}),
    "first_rms_norm": (first_rms_norm, {"kernel.rms_norm": 1}),
    "qwen3_qk_norm": (qwen3_qk_norm, {"kernel.rms_norm": 1}),
    "residual_then_rms_norm": (residual_then_rms_norm, {"kernel.add_rms_norm": 1, "kernel.rms_norm": 0}),
    "layer_norm": (layer_norm, {"kernel.layer_norm": 1}),
    "gpt2_ln_then_rows": (gpt2_ln_then_rows, {"kernel.layer_norm": 1, "cublas.matmul_bias": 1}),
    "layer_norm_read_twice": (layer_norm_read_twice, {"kernel.layer_norm": 1}),
    "gpt2_conv1d_mlp": (gpt2_conv1d_mlp, {"cublas.matmul_bias_act": 1, "kernel.gelu": 0}),
    "conv1d_symbolic_rows": (conv1d_symbolic_rows, {"cublas.matmul_bias_act": 1, "kernel.gelu": 0}),
    "bert_mlp": (bert_mlp, {"cublas.matmul_bias_act": 1, "kernel.gelu": 0}),
    "pooler_tanh": (pooler_tanh, {"cublas.matmul_bias_act": 1}),
    "t5_relu_no_bias": (t5_relu_no_bias, {"cublas.matmul_act": 1, "cublas.matmul": 1}),
    "swiglu_unmerged": (swiglu_unmerged, {"kernel.swiglu": 1, "cublas.matmul_act": 0}),
    "gpt2_onnx_mlp": (gpt2_onnx_mlp, {"cublas.matmul_act": 1, "kernel.gelu": 0}),
    "gpt2_onnx_qkv": (gpt2_onnx_qkv, {"cublas.matmul": 1}),
    "residual_after_projection": (residual_after_projection, {"cublas.matmul_bias_residual": 1, "kernel.layer_norm": 1}),
    "gpt2_onnx_residual": (gpt2_onnx_residual, {"cublas.matmul_residual": 1, "kernel.layer_norm": 1}),
    "llama_o_proj_residual": (llama_o_proj_residual, {"cublas.matmul_residual": 0}),  # llm takes it (add_rms_norm)
    "residual_broadcast": (residual_broadcast, {"cublas.matmul_bias_residual": 0, "cublas.matmul_bias": 1}),
    "resnet_stem_torch": (resnet_stem, {"kernel.conv2d_relu_max_pool": 1}),
    "resnet_stem_onnx": (lambda: resnet_stem(False), {"kernel.conv2d_relu_max_pool": 1}),
    "resnet_shortcut_torch": (resnet_projection_shortcut, {"kernel.conv2d_shortcut": 1}),
    "resnet_shortcut_onnx": (lambda: resnet_projection_shortcut(False), {"kernel.conv2d_shortcut": 1}),
    "resnet_head_torch": (resnet_head, {"kernel.global_avg_pool": 1}),
    "resnet_head_onnx": (lambda: resnet_head(False), {"kernel.global_avg_pool": 1}),
    "llama_gate_up": (llama_gate_up, {"kernel.matmul_glu": 1, "kernel.swiglu": 0}),
    "gemma_gate_up": (gemma_gate_up, {"kernel.matmul_glu": 1, "kernel.gelu": 0}),
    "o_proj_residual_norm": (o_proj_residual_norm, {"kernel.matmul_add_rms_norm": 1, "kernel.add_rms_norm": 0}),
    "gpt2_split_qkv": (gpt2_split_qkv, {"kernel.attention": 1}),
    "decoder_mask": (decoder_mask, {"kernel.attention": 1}),  # one function, called by both layers
    "reshape_changing_rows": (reshape_changing_rows, {"cublas.matmul_bias_act": 0, "cublas.matmul_bias": 1, "kernel.gelu": 1}),
}


def composites(mod: Module) -> dict[str, int]:
    """How many Composite functions of each name the module calls (wrapped or not)."""
    counts: dict[str, int] = {}

    def visit(fn: Function):
        name = fn.attrs.get("Composite")
        if name:
            counts[name] = counts.get(name, 0) + 1
        for b in fn.bindings:
            if isinstance(b.value, Call) and isinstance(b.value.op, Function):
                visit(b.value.op)

    for fn in mod.functions.values():
        if "Composite" not in fn.attrs and "Codegen" not in fn.attrs:
            visit(fn)
    for name, fn in mod.functions.items():
        if "Codegen" in fn.attrs or "Composite" in fn.attrs:
            visit(fn)
    return counts


def random_args(func):
    """Random arrays for the parameters; every symbolic dim is 6."""
    return [rng.standard_normal(tuple(6 if isinstance(d, str) else d for d in p.ty.shape)).astype(dpl.dtypes.to_numpy(p.ty.dtype))
            for p in func.params]


def assert_close(want, got):
    tol = 5e-3 if want.dtype == np.float16 else 1e-4
    scale = max(float(np.abs(want.astype(np.float64)).max()), 1.0)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol * scale)


@pytest.fixture(scope="module")
def fused():
    modules = {name: make() for name, (make, _) in CASES.items()}
    return {name: (mod, dpl.apply(mod, LIBRARIES)) for name, mod in modules.items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_spelling_is_claimed_by_its_composite(case, fused):
    _, mod = fused[case]
    found = composites(mod)
    for name, count in CASES[case][1].items():
        assert found.get(name, 0) == count, (name, found, str(mod))


@pytest.mark.parametrize("target", ["cpu", "numpy"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_spelling_builds_and_equals_the_interpreter(case, target, fused):
    if target == "cpu":
        needs.c_compiler()
    source, mod = fused[case]
    exe = dpl.build(mod, target, config=ALWAYS)
    args = random_args(source["main"])
    want, got = dpl.interpret(source, *args), exe(*args)
    for w, g in zip(*(v if isinstance(v, (tuple, list)) else [v] for v in (want, got))):
        assert_close(np.asarray(w), np.asarray(g))
    if target == "cpu":
        summary = exe.summary()
        assert "fall-back" not in summary.split("plan for")[0], summary


# what the merged products, the splits and the mask leave alone: nothing but the products no
# epilogue follows (gpt2_split_qkv's bias add is the product's epilogue, its slices join the heads)
ALONE = {"llama_gate_up": [], "gemma_gate_up": [], "o_proj_residual_norm": [], "gpt2_split_qkv": [], "decoder_mask": []}


@pytest.mark.parametrize("case", sorted(ALONE))
def test_merged_products_splits_and_masks_leave_nothing_alone(case):
    trace = dpl.Trace()
    dpl.apply(CASES[case][0](), ["rewrites", "llm"], trace=trace)
    alone = [(a.op, a.detail) for a in trace.coverage()["main"].alone]
    assert [op for op, _ in alone] == ALONE[case], alone
