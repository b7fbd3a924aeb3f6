"""Random fused groups of the shapes FuseOps makes (an optional matmul anchor, an elementwise /
broadcast / injective body, an optional reduction or row-op sink with an epilogue, one or two
outputs) all lower to one kernel that computes what dpl.interpret computes."""

import numpy as np
import pytest

from dpl.ir import FunctionBuilder, const

from test_kernel_lower import check

UNARY = ["exp", "tanh", "sigmoid", "negative", "nn.relu", "nn.gelu", "nn.silu", "abs", "square", "sin"]
BINARY = ["add", "subtract", "multiply", "maximum", "minimum"]


def random_group(seed: int):
    r = np.random.default_rng(seed)
    A = "n" if r.random() < 0.3 else int(r.integers(2, 5))
    B = int(r.choice([2, 4, 6]))
    fb = FunctionBuilder(f"group{seed}", attrs={"Primitive": True})
    params = iter(range(100))

    def param(shape):
        return fb.param(f"p{next(params)}", "f32", shape)

    if r.random() < 0.3:
        K = int(r.integers(2, 6))
        v = fb.emit("matmul", param((A, K)), param((K, B)))
    else:
        v = param((A, B))
    values = [v]
    for _ in range(int(r.integers(1, 6))):
        action = r.choice(["unary", "binary", "transpose", "reshape", "split_concat", "slice"])
        if action == "unary":
            op = str(r.choice(UNARY))
            if op in ("exp", "square"):  # keep values in range: f32 kernels vs an f64 reference
                v = fb.emit("tanh", v)
            v = fb.emit(op, v)
        elif action == "binary":
            other = r.choice(["same", "row", "col", "scalar", "value"])
            if other == "same":
                o = param((A, B))
            elif other == "row":
                o = param((B,))
            elif other == "col":
                o = param((A, 1))
            elif other == "scalar":
                o = const(float(r.uniform(0.5, 2.0)))
            else:
                o = values[int(r.integers(len(values)))]
            args = (v, o) if r.random() < 0.5 else (o, v)
            v = fb.emit(str(r.choice(BINARY)), *args)
        elif action == "transpose":
            t = fb.emit("add", fb.emit("permute_dims", v), param((B, A)))
            v = fb.emit("permute_dims", fb.emit("tanh", t))
        elif action == "reshape" and isinstance(A, int):
            flat = fb.emit("reshape", v, shape=[A * B])
            v = fb.emit("reshape", fb.emit("multiply", flat, 0.5), shape=[A, B // 2, 2])
            v = fb.emit("reshape", v, shape=[A, B])
        elif action == "split_concat":
            parts = fb.emit("split", v, indices_or_sections=2, axis=1)
            v = fb.emit("concat", [fb.item(parts, 1), fb.emit("sigmoid", fb.item(parts, 0))], axis=1)
        elif action == "slice":
            s = fb.emit("strided_slice", v, axes=[1], begin=[B - 1], end=[-B - 1], strides=[-1])
            v = fb.emit("add", s, v)
        values.append(v)
    sink = r.choice(["none", "reduce", "reduce_epilogue", "softmax", "layer_norm"])
    if sink.startswith("reduce"):
        op = str(r.choice(["sum", "max", "mean", "min", "variance"]))
        axis = [int(r.integers(2))] if r.random() < 0.8 else None
        v = fb.emit(op, v, axis=axis, keepdims=bool(r.random() < 0.5))
        if sink == "reduce_epilogue":
            v = fb.emit("add", fb.emit("tanh", v), 1.0)
    elif sink == "softmax":
        v = fb.emit("nn.softmax", v, axis=int(r.integers(2)))
    elif sink == "layer_norm":
        v = fb.emit("nn.layer_norm", v, param((B,)), param((B,)))
    outs = [v]
    if r.random() < 0.3 and len(values) > 1:
        outs.append(values[int(r.integers(len(values) - 1))])
    return fb.ret(*outs)


@pytest.mark.parametrize("seed", range(300))
def test_random_group(seed):
    check(random_group(seed), rtol=1e-4, atol=1e-4, trials=1)
