"""Property: the pattern built from a random expression matches it; one mutation (another op,
attribute or dtype) makes it fail, and ``explain`` names the mutated node."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from dpl.ir import Call, Constant, FunctionBuilder, Var
from dpl.pattern import Matcher, explain, is_const, is_op, is_var, match

UNARY = ["exp", "tanh", "sigmoid", "nn.relu", "negative"]
BINARY = ["add", "multiply", "subtract", "maximum"]
OTHER_DTYPE = {"float32": "float16", "float16": "float32"}


@st.composite
def functions(draw):
    fb = FunctionBuilder("main")
    values = [fb.param("x", "f32", (4, 6)), fb.param("y", "f32", (4, 6))]
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["unary", "binary", "binary", "astype", "mean", "clip"]))
        a = draw(st.sampled_from(values))
        if kind == "unary":
            values.append(fb.emit(draw(st.sampled_from(UNARY)), a))
        elif kind == "binary":
            same = [v for v in values if v.ty.dtype == a.ty.dtype
                    and (v.ty.shape == a.ty.shape or {v.ty.shape, a.ty.shape} <= {(4, 6), (4, 1)})]
            values.append(fb.emit(draw(st.sampled_from(BINARY)), a, draw(st.sampled_from(same))))
        elif kind == "astype":
            values.append(fb.emit("astype", a, dtype=OTHER_DTYPE[a.ty.dtype]))
        elif kind == "mean" and a.ty.ndim == 2:
            values.append(fb.emit("mean", a, axis=[-1], keepdims=draw(st.booleans())))
        elif kind == "clip":
            values.append(fb.emit("clip", a, min=-1.0, max=draw(st.sampled_from([0.5, 1.0, 2.0]))))
        else:
            values.append(fb.emit("exp", a))
    root = values[-1]
    return fb.ret(root), root


def pattern_of(e, fn, mutate=None, how=None, memo=None):
    """The pattern that describes ``e`` exactly (ops, attributes, dtypes, shared values
    shared); ``mutate``/``how`` change one call node."""
    memo = {} if memo is None else memo
    matcher = Matcher(fn)
    e = matcher.unwrap(e)
    if id(e) in memo:
        return memo[id(e)]
    if isinstance(e, Var):
        p = is_var(e.name)
    elif isinstance(e, Constant):
        p = is_const(e.value)
    else:
        op, attrs, dtype = e.op, dict(e.attrs), e.ty.dtype
        if e is mutate:
            if how == "op":
                group = UNARY if op in UNARY else BINARY if op in BINARY else None
                op = next(o for o in (group or []) if o != op) if group else op
                if group is None:  # astype/mean/clip: swap in another op of one argument
                    op, attrs = "exp", {}
            elif how == "attr":
                if op == "astype":
                    attrs["dtype"] = OTHER_DTYPE[attrs["dtype"]]
                elif op == "mean":
                    attrs["keepdims"] = not attrs["keepdims"]
                elif op == "clip":
                    attrs["max"] = attrs["max"] + 10.0
                else:
                    how = "dtype"
            if how == "dtype":
                dtype = OTHER_DTYPE[dtype]
        args = [pattern_of(a, fn, mutate, how, memo) for a in e.args]
        constraints = {k: v for k, v in attrs.items() if v is not None}
        p = is_op(op)(*args, **constraints).has_dtype(dtype)
    memo[id(e)] = p
    return p


def calls_of(fn):
    return [b.value for b in fn.bindings if isinstance(b.value, Call)]


@settings(max_examples=80, deadline=None)
@given(functions())
def test_the_pattern_of_an_expression_matches_it(case):
    fn, root = case
    assert match(pattern_of(root, fn), root, fn)


@settings(max_examples=120, deadline=None)
@given(functions(), st.data(), st.sampled_from(["op", "attr", "dtype"]))
def test_one_mutation_fails_and_explain_names_the_mutated_node(case, data, how):
    fn, root = case
    matcher = Matcher(fn)
    reachable = []

    def walk(e):
        e = matcher.unwrap(e)
        if isinstance(e, Call) and all(e is not r for r in reachable):
            reachable.append(e)
            for a in e.args:
                walk(a)

    walk(root)
    target = data.draw(st.sampled_from(reachable))
    mutated = pattern_of(root, fn, target, how)
    report = explain(mutated, root, fn)
    assert not report
    failure = report.failure
    assert matcher.unwrap(failure.expr) is target
    name = next(b.var.name for b in fn.bindings if b.value is target)
    assert f"{name} = " in str(report)
