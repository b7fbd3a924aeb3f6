"""Write the decoder block `dpl demo` runs: dpl/viz/data/decoder_block.ir (+ .ir.npz weights).

A Llama-style decoder layer written as user code writes it (RMSNorm, softmax and SiLU spelled
out op by op, as Hugging Face does), so the demo shows every stage: the rewrites turn the
spelled-out forms into nn.rms_norm / nn.softmax / nn.silu, the shipped `llm` patterns claim
attention, Add+RMSNorm and SwiGLU as composites, FuseOps takes the rest. Built with dpl's own
builder, so neither torch nor a download is needed; run it again after changing the model:

    python scripts/make_demo_model.py
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

import dpl
from dpl.ir import FunctionBuilder, Module, const

SEQ, DIM, HEADS, FFN = 64, 128, 4, 256
HEAD = DIM // HEADS
OUT = Path(__file__).resolve().parent.parent / "dpl" / "viz" / "data" / "decoder_block.ir"


def rms_norm(fb: FunctionBuilder, x, weight: np.ndarray, tag: str):
    """LlamaRMSNorm, spelled out: x * rsqrt(mean(x^2) + eps) * w."""
    sq = fb.emit("power", x, const(np.float32(2.0)), name=f"{tag}_sq")
    var = fb.emit("mean", sq, axis=[-1], keepdims=True, name=f"{tag}_var")
    ve = fb.emit("add", var, const(np.float32(1e-6)), name=f"{tag}_eps")
    inv = fb.emit("rsqrt", ve, name=f"{tag}_inv")
    normed = fb.emit("multiply", x, inv, name=f"{tag}_normed")
    return fb.emit("multiply", const(weight, name=f"{tag}_w"), normed, name=tag)


def heads(fb: FunctionBuilder, x, tag: str, axes):
    r = fb.emit("reshape", x, shape=[SEQ, HEADS, HEAD], name=f"{tag}_heads")
    return fb.emit("permute_dims", r, axes=axes, name=f"{tag}_t")


def decoder_block(seed: int = 0) -> Module:
    rng = np.random.default_rng(seed)

    def weight(*shape):
        return (rng.standard_normal(shape) / math.sqrt(shape[0])).astype(np.float32)

    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (SEQ, DIM))
    h = rms_norm(fb, x, (1 + 0.1 * rng.standard_normal(DIM)).astype(np.float32), "attn_norm")
    q = heads(fb, fb.emit("matmul", h, const(weight(DIM, DIM), name="wq"), name="q"), "q", [1, 0, 2])
    k = heads(fb, fb.emit("matmul", h, const(weight(DIM, DIM), name="wk"), name="k"), "k", [1, 2, 0])
    v = heads(fb, fb.emit("matmul", h, const(weight(DIM, DIM), name="wv"), name="v"), "v", [1, 0, 2])
    scores = fb.emit("matmul", q, k, name="scores")
    scaled = fb.emit("multiply", scores, const(np.float32(1 / math.sqrt(HEAD))), name="scaled")
    mask = np.triu(np.full((SEQ, SEQ), -1e9, np.float32), 1)
    masked = fb.emit("add", scaled, const(mask, name="causal_mask"), name="masked")
    # softmax spelled out
    mx = fb.emit("max", masked, axis=[-1], keepdims=True, name="row_max")
    e = fb.emit("exp", fb.emit("subtract", masked, mx, name="shifted"), name="e")
    probs = fb.emit("divide", e, fb.emit("sum", e, axis=[-1], keepdims=True, name="row_sum"), name="probs")
    ctx = fb.emit("matmul", probs, v, name="ctx")
    merged = fb.emit("reshape", fb.emit("permute_dims", ctx, axes=[1, 0, 2], name="ctx_t"), shape=[SEQ, DIM], name="merged")
    attn = fb.emit("matmul", merged, const(weight(DIM, DIM), name="wo"), name="attn")
    resid = fb.emit("add", x, attn, name="resid")
    h2 = rms_norm(fb, resid, (1 + 0.1 * rng.standard_normal(DIM)).astype(np.float32), "mlp_norm")
    gate = fb.emit("matmul", h2, const(weight(DIM, FFN), name="w_gate"), name="gate")
    act = fb.emit("multiply", gate, fb.emit("sigmoid", gate, name="gate_sig"), name="act")  # SiLU spelled out
    up = fb.emit("matmul", h2, const(weight(DIM, FFN), name="w_up"), name="up")
    down = fb.emit("matmul", fb.emit("multiply", act, up, name="swiglu"), const(weight(FFN, DIM), name="w_down"), name="down")
    out = fb.emit("add", resid, down, name="out")
    return Module([fb.ret(out)])


if __name__ == "__main__":
    dpl.save(decoder_block(), OUT)
    print(f"wrote {OUT} and {OUT}.npz")
