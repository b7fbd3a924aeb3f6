"""Issue 32's acceptance: a module with expression shapes prints, parses, fuses and runs the same
as its static instances. Random chains over x: f32[n, 6] and y: f32[m, 6] make dims such as
``n + m``, ``(n + 3) // 2``, ``n * 2`` and ``(n + 2) * 2 - 1`` (concat, pad, strided slices,
merging reshapes, a resize, row and column reductions); the same code with ints for n and m
builds the static instance. The symbolic module, fused by ``dpl.apply`` and built for the CPU,
computes at a binding what the fused static instance built for the CPU computes, and what the
interpreter computes; the fused symbolic module prints and parses back to itself."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

import needs

import dpl
from dpl.ir import FunctionBuilder, Module, const
from dpl.ir import dims as D
from dpl.ir.printer import print_module

ALWAYS = dpl.FusionConfig(min_nodes_for_fusion=1, max_graph_size=10_000, min_tensor_elements=0, fallback_on_error=False)
OPS = ("tanh", "concat", "pad", "even_rows", "merge", "resize", "softmax", "column_sum")


def build_chain(ops, n, m):
    """The chain of ``ops`` over x: f32[n, 6] and y: f32[m, 6]; ``n`` and ``m`` are symbols or
    ints, and the same code builds the symbolic module and its static instance."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (n, 6))
    y = fb.param("y", "f32", (m, 6))
    cur = x
    for op in ops:
        rows = cur.ty.shape[0]
        if op == "tanh":
            cur = fb.emit("tanh", cur)
        elif op == "concat":  # rows + m
            cur = fb.emit("concat", [cur, fb.emit("sigmoid", y)], axis=0)
        elif op == "pad":  # rows + 3
            cur = fb.emit("nn.pad", cur, pad_width=[1, 2, 0, 0], pad_value=0.5)
        elif op == "even_rows":  # (rows + 1) // 2
            cur = fb.emit("strided_slice", cur, axes=[0], begin=[0], end=[2**40], strides=[2])
        elif op == "merge":  # [rows, 6] -> [rows * 2, 3] -> [rows, 6]
            cur = fb.emit("negative", fb.emit("reshape", cur, shape=[D.mul(rows, 2), 3]))
            cur = fb.emit("reshape", cur, shape=[rows, 6])
        elif op == "resize":  # rows * 2 - 1 rows, columns kept: corner-aligned linear
            cur = fb.emit("image.resize", cur, size=[D.sub(D.mul(rows, 2), 1), 6], method="linear",
                          coordinate_transformation_mode="align_corners")
        elif op == "softmax":
            cur = fb.emit("nn.softmax", cur, axis=-1)
        elif op == "column_sum":  # a reduction over the symbolic axis, broadcast back
            cur = fb.emit("subtract", cur, fb.emit("mean", cur, axis=[0], keepdims=True))
    return Module([fb.ret(fb.emit("multiply", cur, const(1.5, "f32")))])


def _run(mod, x, y):
    return np.asarray(dpl.build(dpl.apply(mod), "cpu", config=ALWAYS)(x, y))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=6), n=st.integers(1, 12), m=st.integers(0, 5))
def test_a_fused_symbolic_module_runs_what_its_fused_static_instance_runs(ops, n, m):
    needs.c_compiler()
    symbolic, static = build_chain(ops, "n", "m"), build_chain(ops, n, m)
    fused = dpl.apply(symbolic)
    assert dpl.structural_equal(dpl.parse(print_module(fused, inline_limit=None)), fused)  # prints and parses back
    bindings = {"n": n, "m": m}
    out = static["main"].ret_type.shape
    assert tuple(D.evaluate(d, bindings) for d in symbolic["main"].ret_type.shape) == out
    rng = np.random.default_rng(n * 10 + m)
    x, y = rng.standard_normal((n, 6)).astype("float32"), rng.standard_normal((m, 6)).astype("float32")
    want = np.asarray(dpl.interpret(symbolic, x, y))
    np.testing.assert_allclose(np.asarray(dpl.interpret(static, x, y)), want, rtol=1e-6, atol=1e-6)
    for label, got in (("symbolic on cpu", _run(symbolic, x, y)), ("static instance on cpu", _run(static, x, y))):
        assert got.shape == out, label
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{label}: {ops} n={n} m={m}")
