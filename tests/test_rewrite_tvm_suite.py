"""TVM's own rewrite_call and leak-check tests, run on dpl and on TVM 0.27 live, compared.

Each case mirrors a test of apache/tvm (tests/python/relax/test_dataflow_pattern.py, and
test_transform_fuse_ops_by_pattern.py for the leak check). A case builds the same function on
both sides (a spec of tests/_dpl_tvm.py), runs the same pattern and rewriter written once per
side, and the two results must agree binding for binding: the same ops in the same order,
reading the same operands (parameters by name, bindings by position, constants by value).
Every dpl result is also checked against the interpreter on random inputs.

Mirrored: test_repeated_pattern_match, test_rewrite_without_trivial_binding,
test_iterative_rewrite_without_trivial_binding, test_iterative_rewrite_with_removed_intermediates,
test_backtrack_if_rewriter_returns_no_op, test_backtrack_for_no_op_rewriter_does_not_match_on_var,
test_rewrite_simple, test_commutative_pattern_match, test_wildcard_with_ty_updates_when_matching,
test_wildcard_with_ty_is_no_op_when_not_matching, test_wildcard_ty_for_unknown_dtype,
test_wildcard_ty_with_symbolic_vars; and has_leaking_intermediate_variables (relax.backend.utils) with
test_intermediate_var_to_var_binding plus a returned intermediate.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import pytest

import dpl
import dpl.pattern as dp
from dpl.ir import Constant, Function, GlobalVar, Tuple, TupleGetItem, Var, call, const
from dpl.ops import make_call
from dpl.transform.fuse_by_pattern import fuse_ops_by_pattern

from _dpl_tvm import build_dpl, build_tvm

F = "float32"


# -- one listing for both sides: ops in order, operands by position -----------------------------


def dpl_listing(fn: Function):
    env: dict[int, object] = {}

    def key(e):
        if isinstance(e, Var):
            return env.get(id(e), ("param", e.name))
        if isinstance(e, Constant):
            return ("const", float(e.value.reshape(-1)[0]) if e.value.size == 1 else e.value.tolist())
        if isinstance(e, Tuple):
            return ("tuple", tuple(key(f) for f in e.fields))
        if isinstance(e, TupleGetItem):
            return ("item", key(e.tuple_value), e.index)
        if isinstance(e, GlobalVar):
            return ("gv", e.name)
        return ("call", e.op, tuple(key(a) for a in e.args))

    rows = []
    for i, b in enumerate(fn.bindings):
        rows.append(key(b.value))
        env[id(b.var)] = ("b", i)
    return rows, key(fn.ret)


def tvm_listing(fn):
    from tvm import relax as rx

    env: dict = {}

    def key(e):
        if isinstance(e, rx.Var):
            return env.get(e, ("param", e.name))
        if isinstance(e, rx.Tuple):
            return ("tuple", tuple(key(f) for f in e.fields))
        if isinstance(e, rx.TupleGetItem):
            return ("item", key(e.tuple_value), e.index)
        if isinstance(e, rx.Call):
            args = [a for a in e.args if isinstance(a, (rx.Var, rx.Tuple, rx.TupleGetItem, rx.Call)) or _is_const(a)]
            return ("call", e.op.name.removeprefix("relax."), tuple(key(a) for a in args))
        if _is_const(e):
            v = _const_value(e)
            return ("const", float(v.reshape(-1)[0]) if v.size == 1 else v.tolist())
        return ("other", type(e).__name__)

    rows = []
    i = 0
    for blk in fn.body.blocks:
        for b in blk.bindings:
            rows.append(key(b.value))
            env[b.var] = ("b", i)  # TVM objects hash by handle (the Python wrappers change)
            i += 1
    return rows, key(fn.body.body)


def _is_const(e) -> bool:
    return type(e).__name__ in ("Constant", "GenericConst")


def _const_value(e) -> np.ndarray:
    data = getattr(e, "data", None)
    if data is None:
        data = e.value
    return data.numpy()


def random_inputs(fn, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.uniform(0.5, 2.0, p.ty.shape) * rng.choice([-1, 1], p.ty.shape)).astype(p.ty.dtype) for p in fn.params]


def assert_same_numbers(before: Function, after: Function):
    args = random_inputs(before)
    np.testing.assert_allclose(dpl.interpret(after, *args), dpl.interpret(before, *args), rtol=1e-5, atol=1e-6)


# -- the cases -------------------------------------------------------------------------------------


class Case(NamedTuple):
    mirrors: str
    spec: list
    dpl: Callable  # dpl function -> rewritten dpl function
    tvm: Callable  # TVM function -> rewritten TVM function
    expected_ops: list  # dpl's result, pinned (the oracle test compares with TVM besides)
    same_numbers: bool = True  # False where the rewrite changes the program on purpose


def _distribute_dpl(fn):
    lhs, rhs, c = dp.wildcard(), dp.wildcard(), dp.is_const()
    add = dp.is_op("add")(lhs, rhs)
    p = dp.is_op("multiply")(add, c)
    return dp.rewrite_call(p, lambda e, m: call("add", call("multiply", m[lhs], m[c]), call("multiply", m[rhs], m[c])), fn)


def _distribute_tvm(fn):
    from tvm.relax import dpl as t

    lhs, rhs, c = t.wildcard(), t.wildcard(), t.is_const()
    add = t.is_op("relax.add")(lhs, rhs)
    p = t.is_op("relax.multiply")(add, c)
    return t.rewrite_call(p, lambda e, m: (m[lhs] * m[c]) + (m[rhs] * m[c]), fn)


def _reshape_noop_dpl(fn):
    w = dp.wildcard()
    p = dp.is_op("reshape")(w)
    return dp.rewrite_call(p, lambda e, m: m[w] if tuple(m[w].ty.shape) == tuple(e.ty.shape) else e, fn)


def _reshape_noop_tvm(fn):
    import tvm_ffi
    from tvm.relax import dpl as t

    w, s = t.wildcard(), t.wildcard()
    p = t.is_op("relax.reshape")(w, s)
    return t.rewrite_call(p, lambda e, m: m[w] if tvm_ffi.structural_equal(m[w].ty.shape, m[s]) else e, fn)


def _slices_to_split_dpl(fn):
    w = dp.wildcard()
    p = dp.is_op("strided_slice")(w)

    def rewriter(e, m):
        a = e.attrs
        if tuple(a["axes"]) != (0,) or tuple(a["strides"] or (1,)) != (1,):
            return e
        size, begin, end = m[w].ty.shape[0], a["begin"][0], a["end"][0]
        g = np.gcd.reduce([begin, end, size])
        if (end - begin) // g != 1:
            return e
        return TupleGetItem(make_call("split", [m[w]], {"indices_or_sections": size // g, "axis": 0}), begin // g)

    return dp.rewrite_call(p, rewriter, fn)


def _slices_to_split_tvm(fn):
    from tvm import relax as rx
    from tvm import tirx
    from tvm.relax import dpl as t

    arg, axes, begin, end, strides = (t.wildcard() for _ in range(5))
    p = t.is_op("relax.strided_slice")(arg, axes, begin, end, strides)

    def rewriter(e, m):
        ax, b, en, st = m[axes][0], m[begin][0], m[end][0], m[strides][0]
        if not all(isinstance(v, tirx.IntImm) for v in (ax, b, en, st)) or ax.value != 0 or st.value != 1:
            return e
        size = m[arg].ty.shape[0].value
        g = int(np.gcd.reduce([b.value, en.value, size]))
        if (en.value - b.value) // g != 1:
            return e
        return rx.op.split(m[arg], size // g)[b.value // g]

    return t.rewrite_call(p, rewriter, fn)


def _unwrap_concat_split_dpl(fn):
    args = dp.wildcard()
    concat = dp.is_op("concat")(args).has_attr({"axis": 0})
    unwrap = dp.is_op("split")(concat).has_attr({"axis": 0, "indices_or_sections": 2})
    a = dp.wildcard()
    add_self = dp.is_op("add")(a, a)

    def rewriter(e, m):
        if unwrap in m:
            fields = m[args]
            if isinstance(fields, Tuple) and len(fields.fields) == 2 and fields.fields[0].ty == fields.fields[1].ty:
                return fields
        elif add_self in m:
            return call("multiply", m[a], const(2.0))
        return e

    return dp.rewrite_call(unwrap | add_self, rewriter, fn)


def _unwrap_concat_split_tvm(fn):
    import tvm_ffi
    from tvm import relax as rx
    from tvm import tirx
    from tvm.relax import dpl as t

    args = t.wildcard()
    concat = t.is_op("relax.concat")(args).has_attr({"axis": 0})
    unwrap = t.is_op("relax.split")(concat).has_attr({"axis": 0, "indices_or_sections": tirx.IntImm("int64", 2)})
    a = t.wildcard()
    add_self = t.is_op("relax.add")(a, a)

    def rewriter(e, m):
        if unwrap in m:
            fields = m[args]
            if len(fields) == 2 and tvm_ffi.structural_equal(fields[0].ty, fields[1].ty):
                return fields
        elif add_self in m:
            return m[a] * rx.const(2.0, "float32")
        return e

    return t.rewrite_call(unwrap | add_self, rewriter, fn)


def _backtrack_dpl(fn):
    any_add = dp.is_op("add")(dp.wildcard(), dp.wildcard())
    arg = dp.wildcard()
    add_zeros = dp.is_op("add")(arg, dp.is_op("zeros")())
    return dp.rewrite_call(any_add | add_zeros, lambda e, m: e if any_add in m else m[arg], fn)


def _backtrack_tvm(fn):
    from tvm.relax import dpl as t

    any_add = t.is_op("relax.add")(t.wildcard(), t.wildcard())
    arg = t.wildcard()
    add_zeros = t.is_op("relax.add")(arg, t.is_op("relax.zeros")(t.wildcard()))
    return t.rewrite_call(any_add | add_zeros, lambda e, m: e if any_add in m else m[arg], fn)


def _no_op_sees_value_dpl(fn):
    pa, pb = dp.is_op("add")(dp.wildcard(), dp.wildcard()), dp.is_op("add")(dp.wildcard(), dp.wildcard())
    pat = pa | pb

    def rewriter(e, m):
        assert isinstance(m[pat], dpl.ir.Call)
        return e

    return dp.rewrite_call(pat, rewriter, fn)


def _no_op_sees_value_tvm(fn):
    from tvm import relax as rx
    from tvm.relax import dpl as t

    pa, pb = t.is_op("relax.add")(t.wildcard(), t.wildcard()), t.is_op("relax.add")(t.wildcard(), t.wildcard())
    pat = pa | pb

    def rewriter(e, m):
        assert isinstance(m[pat], rx.Call)
        return e

    return t.rewrite_call(pat, rewriter, fn)


def _double_dpl(fn):
    w = dp.wildcard()
    return dp.rewrite_call(dp.is_op("add")(w, w), lambda e, m: call("multiply", m[w], const(2.0)), fn)


def _double_tvm(fn):
    from tvm import relax as rx
    from tvm.relax import dpl as t

    w = t.wildcard()
    return t.rewrite_call(t.is_op("relax.add")(w, w), lambda e, m: rx.op.multiply(m[w], rx.const(2.0, "float32")), fn)


def _commutative_dpl(fn):
    op, arg, c = dp.is_op("add") | dp.is_op("multiply"), dp.wildcard(), dp.is_const()

    def rewriter(e, m):
        if m[c].value.shape == () and float(m[c].value) == 1.0:
            return make_call(m[op], [m[arg], const(2.0)], {})
        return e

    return dp.rewrite_call(op(arg, c), rewriter, fn)


def _commutative_tvm(fn):
    from tvm import relax as rx
    from tvm.relax import dpl as t

    op, arg, c = t.is_op("relax.add") | t.is_op("relax.multiply"), t.wildcard(), t.is_const()

    def rewriter(e, m):
        v = _const_value(m[c])
        if v.shape == () and v[()] == 1.0:
            return rx.Call(m[op], [m[arg], rx.const(2.0, "float32")])
        return e

    return t.rewrite_call(op(arg, c), rewriter, fn)


def _typed_add_dpl(shape):
    def run(fn):
        lhs, rhs = dp.wildcard().has_shape(shape), dp.wildcard().has_shape(shape)
        return dp.rewrite_call(dp.is_op("add")(lhs, rhs), lambda e, m: call("multiply", m[lhs], m[rhs]), fn)

    return run


def _typed_add_tvm(shape):
    def run(fn):
        from tvm import relax as rx
        from tvm import tirx
        from tvm.relax import dpl as t
        from tvm.script import relax as R

        dims = [tirx.Var(d, "int64") if isinstance(d, str) else d for d in shape]
        lhs, rhs = t.wildcard().has_ty(R.Tensor(dims)), t.wildcard().has_ty(R.Tensor(dims))
        return t.rewrite_call(t.is_op("relax.add")(lhs, rhs), lambda e, m: rx.op.multiply(m[lhs], m[rhs]), fn)

    return run


def _zeros_ones(a, b, shape, dtype, shape_b=None):
    return [(a, "zeros", [], {"shape": list(shape), "dtype": dtype}), (b, "ones", [], {"shape": list(shape_b or shape), "dtype": dtype})]


V = ("param", "x", (1024,), F)
CASES = {
    "repeated_pattern_match": Case(
        "test_repeated_pattern_match",
        [V, ("param", "y", (1024,), F), ("param", "z", (1024,), F),
         ("a", "add", ["x", "y"]), ("b", "add", ["a", "z"]), ("out", "multiply", ["b", 5.0])],
        _distribute_dpl, _distribute_tvm, ["multiply", "multiply", "add", "multiply", "add"]),
    "rewrite_without_trivial_binding": Case(
        "test_rewrite_without_trivial_binding",
        [V, ("a", "add", ["x", "x"]), ("b", "reshape", ["a"], {"shape": [1024]})],
        _reshape_noop_dpl, _reshape_noop_tvm, ["add"]),
    "iterative_rewrite_without_trivial_binding": Case(
        "test_iterative_rewrite_without_trivial_binding",
        [V, ("a", "strided_slice", ["x"], {"axes": [0], "begin": [0], "end": [512], "strides": [1]}),
         ("b", "strided_slice", ["x"], {"axes": [0], "begin": [512], "end": [1024], "strides": [1]}),
         ("c", "add", ["a", "b"])],
        _slices_to_split_dpl, _slices_to_split_tvm, ["split", "TupleGetItem", "TupleGetItem", "add"]),
    "iterative_rewrite_with_removed_intermediates": Case(
        "test_iterative_rewrite_with_removed_intermediates",
        [("param", "a", (1024,), F), ("param", "b", (1024,), F),
         ("c", "concat", [("tuple", ["a", "b"])], {"axis": 0}),
         ("d", "split", ["c"], {"indices_or_sections": 2, "axis": 0}),
         ("e", "item", "d", 0), ("f", "item", "d", 1),
         ("g", "add", ["a", "e"]), ("h", "add", ["f", "g"])],
        _unwrap_concat_split_dpl, _unwrap_concat_split_tvm, ["multiply", "add"]),
    "backtrack_if_rewriter_returns_no_op": Case(
        "test_backtrack_if_rewriter_returns_no_op",
        [("A", "ones", [], {"shape": [64, 128], "dtype": "int32"}),
         ("B", "zeros", [], {"shape": [64, 128], "dtype": "int32"}), ("C", "add", ["A", "B"])],
        _backtrack_dpl, _backtrack_tvm, ["ones"]),
    "backtrack_for_no_op_rewriter_does_not_match_on_var": Case(
        "test_backtrack_for_no_op_rewriter_does_not_match_on_var",
        [("A", "ones", [], {"shape": [64, 128], "dtype": "int32"}),
         ("B", "zeros", [], {"shape": [64, 128], "dtype": "int32"}), ("C", "add", ["A", "B"])],
        _no_op_sees_value_dpl, _no_op_sees_value_tvm, ["ones", "zeros", "add"]),
    "commutative_pattern_match": Case(
        "test_commutative_pattern_match",
        [V, ("y", "add", ["x", "x"]), ("out", "add", [1.0, "y"])],
        _commutative_dpl, _commutative_tvm, ["add", "add"], same_numbers=False),
    "wildcard_with_ty_updates_when_matching": Case(
        "test_wildcard_with_ty_updates_when_matching",
        _zeros_ones("A", "B", (2, 3), "int32") + [("C", "add", ["A", "B"])],
        _typed_add_dpl([2, 3]), _typed_add_tvm([2, 3]), ["zeros", "ones", "multiply"], same_numbers=False),
    "wildcard_with_ty_is_no_op_when_not_matching": Case(
        "test_wildcard_with_ty_is_no_op_when_not_matching",
        _zeros_ones("A", "B", (16, 32), "int32") + [("C", "add", ["A", "B"])],
        _typed_add_dpl([2, 3]), _typed_add_tvm([2, 3]), ["zeros", "ones", "add"]),
    "wildcard_ty_for_unknown_dtype": Case(
        "test_wildcard_ty_for_unknown_dtype",
        _zeros_ones("A", "B", (2, 3), "int32") + [("C", "add", ["A", "B"])]
        + _zeros_ones("D", "E", (2, 3), F) + [("F", "add", ["D", "E"]), ("output", "tuple", ["C", "F"])],
        _typed_add_dpl([2, 3]), _typed_add_tvm([2, 3]), ["zeros", "ones", "multiply", "zeros", "ones", "multiply", "Tuple"], same_numbers=False),
    "wildcard_ty_with_symbolic_vars": Case(
        "test_wildcard_ty_with_symbolic_vars",
        _zeros_ones("A", "B", (64, 128), "int32") + [("C", "add", ["A", "B"])]
        + _zeros_ones("D", "E", (64, 128), F, (1, 128)) + [("F", "add", ["D", "E"]), ("output", "tuple", ["C", "F"])],
        _typed_add_dpl(["m", "n"]), _typed_add_tvm(["m", "n"]), ["zeros", "ones", "multiply", "zeros", "ones", "add", "Tuple"], same_numbers=False),
    "rewrite_simple": Case(
        "test_rewrite_simple",
        [("param", "x", (16, 16), F), ("x2", "add", ["x", "x"]), ("x4", "add", ["x2", "x2"])],
        _double_dpl, _double_tvm, ["multiply", "multiply"]),
}


def _ops(fn):
    return [getattr(b.value, "op", type(b.value).__name__) for b in fn.bindings]


@pytest.mark.parametrize("name", sorted(CASES))
def test_rewrite_case_dpl(name):
    case = CASES[name]
    fn, _ = build_dpl(case.spec)
    out = case.dpl(fn)
    assert _ops(out) == case.expected_ops
    if case.same_numbers:
        assert_same_numbers(fn, out)


@pytest.mark.oracle
@pytest.mark.parametrize("name", sorted(CASES))
def test_rewrite_case_matches_tvm(tvm, name):
    case = CASES[name]
    fn, _ = build_dpl(case.spec)
    tfn, _ = build_tvm(case.spec)
    assert dpl_listing(case.dpl(fn)) == tvm_listing(case.tvm(tfn))


# -- the leak check: TVM's has_leaking_intermediate_variables over dpl's CheckContext -------------


def has_leaking_intermediate_variables(ctx) -> bool:
    """relax.backend.utils.has_leaking_intermediate_variables, line for line, on dpl's context
    (dpl has no DataflowVar: a returned variable lists dp.FUNCTION_RETURN among its users)."""
    defined = set(ctx.matched_bindings)
    root = ctx.value_to_bound_var[ctx.matched_expr]
    intermediate = {v for v in ctx.matched_bindings if v is not root}
    return any(u not in defined for v in intermediate for u in ctx.var_usages[v])


def _mm(ns):
    return ns.call(ns.is_op("matmul"), ns.wildcard(), ns.wildcard())


LEAK_CASES = {
    # m is returned besides feeding relu: TVM's m is a non-dataflow (output) variable
    "returned_intermediate": (
        [("param", "x", (4, 4), F), ("param", "w", (4, 4), F), ("m", "matmul", ["x", "w"]), ("r", "nn.relu", ["m"])],
        ["m", "r"],
        [lambda ns: ("a.mr", ns.call(ns.is_op("nn.relu"), _mm(ns)))],
        []),
    # test_intermediate_var_to_var_binding: y1 = y reads the matmul outside the add's match
    "intermediate_var_to_var_binding": (
        [("param", "x", (1, 16), F), ("param", "w", (16, 16), F), ("w1", "permute_dims", ["w"]),
         ("y", "matmul", ["x", "w1"]), ("y1", "alias", "y"), ("out", "add", ["x", "y1"])],
        None,
        [lambda ns: ("cublas.matmul_transposed_bias", ns.call(ns.is_op("add"), ns.call(
            ns.is_op("matmul"), ns.wildcard(), ns.call(ns.is_op("permute_dims"), ns.wildcard())), ns.wildcard())),
         lambda ns: ("cublas.matmul_transposed", ns.call(
             ns.is_op("matmul"), ns.wildcard(), ns.call(ns.is_op("permute_dims"), ns.wildcard())))],
        [("cublas.matmul_transposed", ("matmul", "permute_dims"))]),
}


def _leak_dpl(spec, returned):
    fn, env = build_dpl(spec)
    if returned:
        fn = Function(fn.name, fn.params, fn.bindings, Tuple(tuple(env[n] for n in returned)), fn.attrs)
    return fn


def _leak_tvm(spec, returned):
    import tvm
    from tvm import relax as rx

    if not returned:
        fn, _ = build_tvm(spec)
        return tvm.IRModule({"main": fn})
    from tvm.script import relax as R

    params = [rx.Var(st[1], R.Tensor(st[2], st[3])) for st in spec if st[0] == "param"]
    env = {p.name: p for p in params}
    bb = rx.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            for st in spec:
                if st[0] == "param":
                    continue
                op = rx.op
                for part in st[1].split("."):
                    op = getattr(op, part)
                emit = bb.emit_output if st[0] in returned else bb.emit
                env[st[0]] = emit(op(*[env[a] for a in st[2]]), name_hint=st[0])
        bb.emit_func_output(rx.Tuple([env[n] for n in returned]))
    return bb.get()


def _composites_dpl(mod):
    out = []
    for b in mod["main"].bindings:
        if isinstance(b.value, dpl.ir.Call) and isinstance(b.value.op, GlobalVar):
            f = mod[b.value.op.name]
            out.append((f.attrs["Composite"], tuple(sorted(x.value.op for x in f.bindings))))
    return out


def _composites_tvm(mod):
    import tvm
    from tvm import relax as rx

    out = []
    for blk in mod["main"].body.blocks:
        for b in blk.bindings:
            if isinstance(b.value, rx.Call) and isinstance(b.value.op, tvm.ir.GlobalVar):
                f = mod[b.value.op]
                ops = [x.value.op.name.removeprefix("relax.") for fb in f.body.blocks for x in fb.bindings]
                out.append((str(f.attrs["Composite"]), tuple(sorted(ops))))
    return out


def _fuse_dpl(name):
    from _dpl_tvm import DplNS

    spec, returned, builders, _ = LEAK_CASES[name]
    fn = _leak_dpl(spec, returned)
    pats = [dp.FusionPattern(*b(DplNS()), check=lambda c: not has_leaking_intermediate_variables(c)) for b in builders]
    return fn, fuse_ops_by_pattern(dpl.Module([fn]), pats, allow_leaks=True)


@pytest.mark.parametrize("name", sorted(LEAK_CASES))
def test_leak_check_dpl(name):
    fn, out = _fuse_dpl(name)
    assert _composites_dpl(out) == LEAK_CASES[name][3]
    args = random_inputs(fn)
    got, want = dpl.interpret(out, *args), dpl.interpret(dpl.Module([fn]), *args)
    for g, w in zip(got if isinstance(got, (tuple, list)) else [got], want if isinstance(want, (tuple, list)) else [want]):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.oracle
@pytest.mark.parametrize("name", sorted(LEAK_CASES))
def test_leak_check_matches_tvm(tvm, name):
    from tvm import relax as rx
    from tvm.relax.backend.utils import has_leaking_intermediate_variables as tvm_leaks
    from tvm.relax.transform import FusionPattern as TvmFusionPattern

    from _dpl_tvm import TvmNS

    spec, returned, builders, _ = LEAK_CASES[name]
    pats = []
    for b in builders:
        pname, p = b(TvmNS())
        pats.append(TvmFusionPattern(pname, getattr(p, "p", p), {}, lambda c: not tvm_leaks(c)))
    theirs = rx.transform.FuseOpsByPattern(pats)(_leak_tvm(spec, returned))
    _, mine = _fuse_dpl(name)
    assert _composites_dpl(mine) == _composites_tvm(theirs)
