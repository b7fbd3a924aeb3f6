"""Hand-built modules in the shapes the passes produce: single ops, Primitive groups (FuseOps),
composites and codegen wrappers (FuseOpsByPattern), tuple outputs, symbolic dims.

Each entry: name -> (module, input shapes with symbolic dims resolved by ``dims``).
"""

import numpy as np

from dpl.ir import FunctionBuilder, Module, Tuple, const


def group(name, params, body, attrs=None):
    """A function of the module: ``params`` is [(name, dtype, shape)], body(fb, *vars) -> ret vars."""
    fb = FunctionBuilder(name, attrs={"Primitive": True} if attrs is None else attrs)
    vs = [fb.param(n, d, s) for n, d, s in params]
    out = body(fb, *vs)
    return fb.ret(*out) if isinstance(out, tuple) else fb.ret(out)


def single_ops():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (8, 32))
    w = fb.param("w", "f32", (32, 16))
    b = fb.param("b", "f32", (16,))
    mm = fb.emit("matmul", x, w)
    y = fb.emit("add", mm, b)
    r = fb.emit("nn.relu", y)
    s = fb.emit("nn.softmax", r, axis=-1)
    c = fb.emit("concat", [s, y], axis=1)
    m = fb.emit("multiply", c, 0.5)
    return Module([fb.ret(m)])


def swiglu_group(n="n", name="fused_silu_multiply"):
    return group(name, [("gate", "f32", (n, 64)), ("up", "f32", (n, 64))],
                 lambda fb, g, u: fb.emit("multiply", fb.emit("nn.silu", g), u))


def primitive_groups():
    g1 = swiglu_group(64)
    g2 = group("fused_add_rms_norm", [("x", "f32", (64, 64)), ("r", "f32", (64, 64)), ("w", "f32", (64,))],
               lambda fb, x, r, w: fb.emit("nn.rms_norm", fb.emit("add", x, r), w, epsilon=1e-5))
    g3 = group("fused_scale_exp", [("x", "f32", (64, 64))],  # a group with a constant inside
               lambda fb, x: fb.emit("exp", fb.emit("multiply", x, const(np.full((64,), 0.25, np.float32), name="c"))))
    fb = FunctionBuilder("main")
    gate, up = fb.param("gate", "f32", (64, 64)), fb.param("up", "f32", (64, 64))
    w = fb.param("w", "f32", (64,))
    h = fb.call(g1, gate, up)
    n = fb.call(g2, h, gate, w)
    e = fb.call(g3, n)
    out = fb.emit("add", e, h)
    return Module([fb.ret(out), g1, g2, g3])


def composite(codegen: bool):
    comp = group("fused_matmul_add", [("x", "f32", (16, 32)), ("w", "f32", (32, 24)), ("b", "f32", (24,))],
                 lambda fb, x, w, b: fb.emit("add", fb.emit("matmul", x, w), b),
                 attrs={"Primitive": True, "Composite": "cublas.matmul_bias"})
    fns = [comp]
    callee = comp
    if codegen:
        callee = group("cublas_matmul_bias", [("x", "f32", (16, 32)), ("w", "f32", (32, 24)), ("b", "f32", (24,))],
                       lambda fb, x, w, b: fb.call(comp, x, w, b),
                       attrs={"Codegen": "cublas", "global_symbol": "cublas_matmul_bias"})
        fns.append(callee)
    fb = FunctionBuilder("main")
    x, w, b = fb.param("x", "f32", (16, 32)), fb.param("w", "f32", (32, 24)), fb.param("b", "f32", (24,))
    y = fb.call(callee, x, w, b)
    out = fb.emit("nn.gelu", y)
    return Module([fb.ret(out), *fns])


def tuple_outputs():
    g = group("fused_split_act", [("x", "f32", (32, 64))],
              lambda fb, x: (fb.emit("nn.relu", x), fb.emit("sigmoid", x)))
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (32, 64))
    t = fb.call(g, x)
    a, b = fb.item(t, 0), fb.item(t, 1)
    parts = fb.emit("split", b, indices_or_sections=2, axis=0)
    p0 = fb.item(parts, 0)
    p1 = fb.emit("tanh", fb.item(parts, 1))
    pair = fb.bind(Tuple((a, p0)))
    first = fb.item(pair, 0)
    return Module([fb.ret(first, p1, x, first), g])  # an input and a duplicate among the outputs


def symbolic():
    g = swiglu_group("n")
    fb = FunctionBuilder("main")
    gate, up = fb.param("gate", "f32", ("n", 64)), fb.param("up", "f32", ("n", 64))
    h = fb.call(g, gate, up)
    s = fb.emit("sum", h, axis=[1], keepdims=True)
    out = fb.emit("subtract", h, s)
    return Module([fb.ret(out), g])


def plain_subroutine():
    sub = group("helper", [("x", "f32", ("n", 8))], lambda fb, x: fb.emit("abs", fb.emit("negative", x)), attrs={})
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", 8))
    return Module([fb.ret(fb.emit("sqrt", fb.call(sub, x))), sub])


CORPUS = {
    "single_ops": (single_ops, {}),
    "primitive_groups": (primitive_groups, {}),
    "composite": (lambda: composite(False), {}),
    "codegen": (lambda: composite(True), {}),
    "tuple_outputs": (tuple_outputs, {}),
    "symbolic_n5": (symbolic, {"n": 5}),
    "symbolic_n48": (symbolic, {"n": 48}),
    "plain_subroutine": (plain_subroutine, {"n": 3}),
}


def inputs_for(mod, dims, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for p in mod["main"].params:
        shape = tuple(dims[d] if isinstance(d, str) else d for d in p.ty.shape)
        a = rng.standard_normal(shape).astype(np.float32)
        a[a == 0] = 0.5  # non-zero inputs
        out.append(a)
    return out
