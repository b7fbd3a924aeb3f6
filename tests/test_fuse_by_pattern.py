"""FuseOpsByPattern against TVM 0.27 (same graph, same patterns, same groups), dpl's safety
rules where TVM fails or leaks, and numerics of every result.

Each case is (graph spec, patterns). The spec and the pattern code are shared by both sides
through tests/_dpl_tvm.py: a pattern is a function of a namespace (dpl's or TVM's DPL).
"""

import numpy as np
import pytest

import dpl
from dpl.ir import Call, GlobalVar
from dpl.pattern import FusionPattern
from dpl.transform.fuse_by_pattern import fuse_ops_by_pattern

from _dpl_tvm import DplNS, TvmNS, build_dpl, build_tvm

F = "float32"


def P(name, shape, dtype=F):
    return ("param", name, shape, dtype)


# -- patterns, written once for both namespaces ----------------------------------------------


def matmul_bias_act(ns):
    x, w, b = ns.wildcard(), ns.wildcard(), ns.wildcard()
    y = ns.call(ns.is_op("add"), ns.call(ns.is_op("matmul"), x, w), b)
    act = ns.call(ns.is_op("nn.relu") | ns.is_op("nn.gelu") | ns.is_op("nn.silu"), y)
    return "cublas.matmul_bias_act", act


def matmul_bias(ns):
    x, w, b = ns.wildcard(), ns.wildcard(), ns.wildcard()
    return "cublas.matmul_bias", ns.call(ns.is_op("add"), ns.call(ns.is_op("matmul"), x, w), b)


def matmul(ns):
    return "cublas.matmul", ns.call(ns.is_op("matmul"), ns.wildcard(), ns.wildcard())


def relu_matmul(ns):
    return "a.mr", ns.call(ns.is_op("nn.relu"), ns.call(ns.is_op("matmul"), ns.wildcard(), ns.wildcard()))


def exp_add(ns):
    return "a.ea", ns.call(ns.is_op("add"), ns.call(ns.is_op("exp"), ns.wildcard()), ns.wildcard())


def add_relu(ns):
    return "a.ar", ns.call(ns.is_op("nn.relu"), ns.call(ns.is_op("add"), ns.wildcard(), ns.wildcard()))


def relu_relu(ns):
    return "a.rr", ns.call(ns.is_op("nn.relu"), ns.call(ns.is_op("nn.relu"), ns.wildcard()))


def exp_only(ns):
    return "a.e", ns.call(ns.is_op("exp"), ns.wildcard())


def diamond(ns):
    x = ns.wildcard()
    e = ns.call(ns.is_op("exp"), x)
    return "k.diamond", ns.call(ns.is_op("add"), ns.call(ns.is_op("nn.relu"), e), ns.call(ns.is_op("sigmoid"), e))


def silu_mul(ns):
    return "kernel.swiglu", ns.call(ns.is_op("multiply"), ns.call(ns.is_op("nn.silu"), ns.wildcard()), ns.wildcard())


def softmax_matmul(ns):
    s = ns.call(ns.is_op("nn.softmax"), ns.call(ns.is_op("multiply"), ns.call(ns.is_op("matmul"), ns.wildcard(), ns.wildcard()), ns.wildcard()))
    return "kernel.attention", ns.call(ns.is_op("matmul"), s, ns.wildcard())


def add_with_matmul(ns):
    w = ns.wildcard()
    return "a.am", ns.call(ns.is_op("add"), w, ns.call(ns.is_op("matmul"), w, ns.wildcard()))


def conv_bias_relu(ns):
    c = ns.call(ns.is_op("nn.conv2d"), ns.wildcard(), ns.wildcard())
    return "dnnl.conv_bias_relu", ns.call(ns.is_op("nn.relu"), ns.call(ns.is_op("add"), c, ns.wildcard()))


def item_add(ns):
    t = ns.wildcard()
    return "a.split_add", ns.call(ns.is_op("add"), ns.is_tuple_get_item(t, 0), ns.is_tuple_get_item(t, 1))


# -- graphs ------------------------------------------------------------------------------------

MLP = [P("x", (8, 16)), P("w", (16, 16)), P("b", (16,)), ("mm", "matmul", ["x", "w"]), ("y", "add", ["mm", "b"]), ("r", "nn.relu", ["y"])]
TWO_LAYERS = MLP + [P("w2", (16, 16)), ("m2", "matmul", ["r", "w2"]), ("y2", "add", ["m2", "b"]), ("g", "nn.gelu", ["y2"]),
                    ("m3", "matmul", ["g", "w2"]), ("o", "exp", ["m3"])]
SHARED_W = [P("x", (8, 16)), P("w", (16, 16)), ("a", "matmul", ["x", "w"]), ("b1", "matmul", ["a", "w"]), ("c", "nn.relu", ["b1"]),
            ("d", "add", ["c", "a"])]
RESIDUAL = [P("x", (8, 16)), P("w", (16, 16)), P("b", (16,)), ("mm", "matmul", ["x", "w"]), ("y", "add", ["mm", "b"]),
            ("r", "nn.silu", ["y"]), ("s", "add", ["r", "x"]), ("t", "nn.relu", ["s"])]
EXP_ADD_RELU = [P("x", (4, 4)), P("y", (4, 4)), ("e", "exp", ["x"]), ("a", "add", ["e", "y"]), ("r", "nn.relu", ["a"])]
RELU3 = [P("x", (4, 4)), ("r1", "nn.relu", ["x"]), ("r2", "nn.relu", ["r1"]), ("r3", "nn.relu", ["r2"])]
RELU5 = RELU3 + [("r4", "nn.relu", ["r3"]), ("r5", "nn.relu", ["r4"])]
DIAMOND = [P("x", (4, 4)), ("e", "exp", ["x"]), ("r", "nn.relu", ["e"]), ("s", "sigmoid", ["e"]), ("o", "add", ["r", "s"])]
DIAMOND_LEAK = DIAMOND + [("z", "multiply", ["o", "e"])]
LEAK = [P("x", (8, 8)), P("w", (8, 8)), ("m", "matmul", ["x", "w"]), ("r", "nn.relu", ["m"]), ("e", "exp", ["m"]), ("out", "add", ["r", "e"])]
CYCLE = [P("x", (8, 8)), P("w", (8, 8)), ("m", "matmul", ["x", "w"]), ("e", "exp", ["m"]), ("out", "add", ["m", "e"])]
SWIGLU = [P("x", (8, 16)), P("wg", (16, 32)), P("wu", (16, 32)), ("gate", "matmul", ["x", "wg"]), ("up", "matmul", ["x", "wu"]),
          ("act", "nn.silu", ["gate"]), ("h", "multiply", ["act", "up"])]
ATTENTION = [P("q", (2, 8, 4)), P("k", (2, 4, 8)), P("v", (2, 8, 4)), ("s", "matmul", ["q", "k"]), ("z", "multiply", ["s", 0.5]),
             ("p", "nn.softmax", ["z"]), ("c", "matmul", ["p", "v"]), ("o", "add", ["c", "q"])]
CONV = [P("x", (1, 4, 8, 8)), P("w", (4, 4, 3, 3)), P("b", (4, 1, 1)), ("c", "nn.conv2d", ["x", "w"], {"padding": [1, 1]}),
        ("y", "add", ["c", "b"]), ("r", "nn.relu", ["y"]), ("c2", "nn.conv2d", ["r", "w"], {"padding": [1, 1]}), ("y2", "add", ["c2", "b"]),
        ("r2", "nn.relu", ["y2"])]
SPLIT = [P("x", (4, 8)), ("t", "split", ["x"], {"indices_or_sections": 2, "axis": 1}), ("a", "item", "t", 0), ("b", "item", "t", 1),
         ("s", "add", ["a", "b"]), ("r", "nn.relu", ["s"])]
SCALAR_CONST = [P("x", (4, 4)), ("e", "exp", ["x"]), ("a", "add", ["e", 1.0]), ("r", "nn.relu", ["a"])]

CASES = {
    "mlp_priority": (MLP, [matmul_bias_act, matmul_bias, matmul]),
    "mlp_low_first": (MLP, [matmul, matmul_bias, matmul_bias_act]),
    "two_layers": (TWO_LAYERS, [matmul_bias_act, matmul_bias, matmul]),
    "shared_weights": (SHARED_W, [relu_matmul, matmul]),
    "residual": (RESIDUAL, [matmul_bias_act, add_relu]),
    "partition_order_ea_first": (EXP_ADD_RELU, [exp_add, add_relu]),
    "partition_order_ar_first": (EXP_ADD_RELU, [add_relu, exp_add]),
    "relu_chain3": (RELU3, [relu_relu]),
    "relu_chain5": (RELU5, [relu_relu]),
    "diamond": (DIAMOND, [diamond]),
    "diamond_single": (DIAMOND, [exp_only]),
    "leak": (LEAK, [relu_matmul]),
    "swiglu": (SWIGLU, [silu_mul, matmul]),
    "attention": (ATTENTION, [softmax_matmul]),
    "conv": (CONV, [conv_bias_relu]),
    "split_items": (SPLIT, [item_add]),
    "scalar_const": (SCALAR_CONST, [exp_add, add_relu]),
    "two_layers_reversed": (TWO_LAYERS, [matmul, matmul_bias_act]),
    "diamond_leak": (DIAMOND_LEAK, [diamond, exp_only]),
    "attention_matmul": (ATTENTION, [matmul, softmax_matmul]),
    "swiglu_only": (SWIGLU, [silu_mul]),
    "residual_relu": (RESIDUAL, [add_relu, relu_relu]),
    "conv_single": (CONV, [exp_only, conv_bias_relu]),
    "mlp_exp": (MLP, [exp_only]),
    "leak_two": (LEAK, [relu_matmul, matmul]),
    "cycle": (CYCLE, [matmul_bias]),
    "cycle_then_matmul": (CYCLE, [matmul_bias, matmul]),
}


def dpl_patterns(builders):
    return [FusionPattern(*b(DplNS)) for b in builders]


def _dpl_key(e, env):
    if isinstance(e, dpl.Var):
        return env[id(e)]
    if isinstance(e, dpl.Constant):
        return ("const",)
    if isinstance(e, dpl.Tuple):
        return ("tuple", tuple(_dpl_key(f, env) for f in e.fields))
    if isinstance(e, dpl.TupleGetItem):
        inner = _dpl_key(e.tuple_value, env)
        return inner[1][e.index] if inner[0] == "tuple" else ("item", inner, e.index)
    return (e.op, tuple(_dpl_key(a, env) for a in e.args))


def original_names(func):
    env = {id(p): ("param", p.name) for p in func.params}
    names = {}
    for b in func.bindings:
        env[id(b.var)] = _dpl_key(b.value, env)
        names[env[id(b.var)]] = b.var.name
    return names


def groups_dpl(mod, func):
    """{(composite, frozenset(original names))}, by structure (shared composites carry the
    names of their first group)."""
    names = original_names(func)
    main = mod["main"]
    env = {id(p): ("param", p.name) for p in main.params}
    out = set()
    for b in main.bindings:
        v = b.value
        if isinstance(v, Call) and isinstance(v.op, GlobalVar):
            fn = mod[v.op.name]
            if "Codegen" in fn.attrs:
                fn = mod[fn.bindings[0].value.op.name]
            inner = {id(p): _dpl_key(a, env) for p, a in zip(fn.params, v.args)}
            members = set()
            for ib in fn.bindings:
                inner[id(ib.var)] = _dpl_key(ib.value, inner)
                members.add(names[inner[id(ib.var)]])
            env[id(b.var)] = _dpl_key(fn.ret, inner)
            out.add((fn.attrs["Composite"], frozenset(members)))
        else:
            env[id(b.var)] = _dpl_key(v, env)
    return out


def groups_tvm(mod, func):
    """TVM renames the caller's result of a composite (``lv``) and the composite's output
    (``gv``): recover original names by structure — each binding is keyed by its op and the
    keys of its arguments, parameters by name (the recipe of tvm-semantics.md, section g)."""
    from tvm import relax

    names = original_names(func)

    def bindings_of(fn):
        return [b for blk in fn.body.blocks for b in blk.bindings]

    def tkey(e, tenv):
        if isinstance(e, relax.Var):
            return tenv.get(e.name, ("param", e.name))
        if isinstance(e, relax.Tuple):
            return ("tuple", tuple(tkey(f, tenv) for f in e.fields))
        if isinstance(e, relax.TupleGetItem):
            inner = tkey(e.tuple_value, tenv)
            return inner[1][e.index] if inner[0] == "tuple" else ("item", inner, e.index)
        if isinstance(e, relax.Call) and hasattr(e.op, "name") and str(e.op.name).startswith("relax."):
            return (str(e.op.name)[len("relax."):], tuple(tkey(a, tenv) for a in e.args))
        return ("const",)

    main = mod["main"]
    tenv = {p.name: ("param", p.name) for p in main.params}
    out = set()
    for b in bindings_of(main):
        v = b.value
        if isinstance(v, relax.Call) and isinstance(v.op, __import__("tvm").ir.GlobalVar):
            fn = mod[v.op]
            if fn.attrs is not None and "Codegen" in fn.attrs:
                fn = bindings_of(fn)[0].value
            inner_env = {p.name: tkey(a, tenv) for p, a in zip(fn.params, v.args)}
            members = set()
            for ib in bindings_of(fn):
                inner_env[ib.var.name] = tkey(ib.value, inner_env)
                members.add(names[inner_env[ib.var.name]])
            ret = fn.body.body
            tenv[b.var.name] = tkey(ret, inner_env)
            out.add((str(fn.attrs["Composite"]), frozenset(members)))
        else:
            tenv[b.var.name] = tkey(v, tenv)
    return out


def run_tvm(spec, builders, leaks_allowed, bind_constants=True):
    from tvm import relax
    from tvm.relax.backend.utils import has_leaking_intermediate_variables
    from tvm.relax.transform import FusionPattern as TvmFusionPattern

    fn, _ = build_tvm(spec)
    mod = __import__("tvm").IRModule({"main": fn})
    ns = TvmNS()
    pats = []
    for b in builders:
        name, p = b(ns)
        p = p.p if hasattr(p, "p") else p
        check = None if leaks_allowed else (lambda ctx: not has_leaking_intermediate_variables(ctx))
        pats.append(TvmFusionPattern(name, p, {}, check))
    return relax.transform.FuseOpsByPattern(pats, bind_constants=bind_constants)(mod)


def random_args(func, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(tuple(p.ty.shape)).astype(dpl.dtypes.to_numpy(p.ty.dtype)) for p in func.params]


@pytest.mark.oracle
@pytest.mark.parametrize("leaks", [True, False], ids=["allow_leaks", "default"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_groups_match_tvm(tvm, case, leaks):
    spec, builders = CASES[case]
    func, _ = build_dpl(spec)
    mod = dpl.Module([func])
    try:
        want = groups_tvm(run_tvm(spec, builders, leaks), func)
    except Exception as err:  # TVM raises on cyclic matches: dpl must reject them instead
        assert "cyclic" in str(err).lower(), err
        trace = dpl.Trace()
        got = fuse_ops_by_pattern(mod, dpl_patterns(builders), allow_leaks=leaks, trace=trace)
        assert any("cycle" in (e.reason or "") for e in trace.rejected()), trace.report()
        np.testing.assert_allclose(dpl.interpret(got, *random_args(func)), dpl.interpret(mod, *random_args(func)), rtol=1e-5)
        return
    got_mod = fuse_ops_by_pattern(mod, dpl_patterns(builders), allow_leaks=leaks)
    assert groups_dpl(got_mod, func) == want
    args = random_args(func)
    np.testing.assert_allclose(dpl.interpret(got_mod, *args), dpl.interpret(mod, *args), rtol=1e-5, atol=1e-6)


def test_enough_cases():
    assert len(CASES) >= 25


@pytest.mark.oracle
@pytest.mark.parametrize("case", ["scalar_const", "mlp_priority", "conv"])
def test_lifted_constants_match_tvm(tvm, case):
    spec, builders = CASES[case]
    func, _ = build_dpl(spec)
    mod = dpl.Module([func])
    want_mod = run_tvm(spec, builders, False, bind_constants=False)
    got = fuse_ops_by_pattern(mod, dpl_patterns(builders), bind_constants=False)
    assert groups_dpl(got, func) == groups_tvm(want_mod, func)
    for name, fn in got.functions.items():
        if "Composite" in fn.attrs:
            tvm_fn = [f for gv, f in want_mod.functions.items() if f.attrs is not None and "Composite" in f.attrs
                      and str(f.attrs["Composite"]) == fn.attrs["Composite"]][0]
            assert [p.name for p in fn.params] == [p.name for p in tvm_fn.params]
    args = random_args(func)
    np.testing.assert_allclose(dpl.interpret(got, *args), dpl.interpret(mod, *args), rtol=1e-5, atol=1e-6)


def test_cycle_is_rejected_with_the_edge_named():
    func, _ = build_dpl(CYCLE)
    trace = dpl.Trace()
    out = fuse_ops_by_pattern(dpl.Module([func]), dpl_patterns([matmul_bias]), allow_leaks=True, trace=trace)
    [event] = trace.rejected()
    assert event.reason == "fusing it would create a cycle: m leaves the match and comes back through e into out"
    assert dpl.structural_equal(out, dpl.Module([func]))
    trace = dpl.Trace()
    fuse_ops_by_pattern(dpl.Module([func]), dpl_patterns([matmul_bias]), trace=trace)
    assert trace.rejected()[0].reason == "its intermediate m is also used by e (allow_leaks=True exports it)"


def test_leaks_export_extra_outputs_only_when_allowed():
    func, _ = build_dpl(LEAK)
    mod = dpl.Module([func])
    kept = fuse_ops_by_pattern(mod, dpl_patterns([relu_matmul]))
    assert dpl.structural_equal(kept, mod)
    leaked = fuse_ops_by_pattern(mod, dpl_patterns([relu_matmul]), allow_leaks=True)
    [comp] = [f for f in leaked.functions.values() if "Composite" in f.attrs]
    assert isinstance(comp.ret, dpl.Tuple) and [v.name for v in comp.ret.fields] == ["m", "r"]  # as TVM: order of first outside use
    assert [b.var.name for b in leaked["main"].bindings] == ["lv0", "m", "r", "e", "out"]
    args = random_args(func)
    np.testing.assert_allclose(dpl.interpret(leaked, *args), dpl.interpret(mod, *args), rtol=1e-6)


def test_check_reasons_and_attrs_getter_in_the_trace():
    func, _ = build_dpl(MLP)
    x, w, b = dpl.wildcard(), dpl.wildcard(), dpl.wildcard()
    pat = dpl.is_op("add")(dpl.is_op("matmul")(x, w), b)
    no = FusionPattern("cublas.no", pat, {"bias": b}, check=lambda ctx: dpl.NoMatch(pat, ctx.matched_expr, "check", "bias too small"))
    yes = FusionPattern("cublas.yes", pat, {"bias": b, "lhs": x}, attrs_getter=lambda ann: {"bias_rank": ann["bias"].ty.ndim, "lhs": ann["lhs"].name})
    trace = dpl.Trace()
    out = fuse_ops_by_pattern(dpl.Module([func]), [no, yes], trace=trace)
    assert trace.rejected("cublas.no")[0].reason == "check said no: bias too small"
    [comp] = [f for f in out.functions.values() if "Composite" in f.attrs]
    assert dict(comp.attrs) == {"Primitive": True, "Composite": "cublas.yes", "bias_rank": 1, "lhs": "x"}
    assert "cublas.yes: 1 accepted, 0 rejected" in trace.report()


def test_annotate_codegen_wraps_and_is_idempotent():
    func, _ = build_dpl(TWO_LAYERS)
    mod = dpl.Module([func])
    out = fuse_ops_by_pattern(mod, dpl_patterns([matmul_bias_act, matmul_bias, matmul]), annotate_codegen=True)
    wrappers = {n: f for n, f in out.functions.items() if "Codegen" in f.attrs}
    assert sorted(wrappers) == ["fused_matmul_add_nn_gelu_cublas", "fused_matmul_add_nn_relu_cublas", "fused_matmul_cublas"]
    for name, f in wrappers.items():
        assert dict(f.attrs) == {"Codegen": "cublas", "global_symbol": name}
        inner = out[f.bindings[0].value.op.name]
        assert "Primitive" not in inner.attrs and inner.attrs["Composite"].startswith("cublas.")
    again = fuse_ops_by_pattern(out, dpl_patterns([matmul_bias_act, matmul_bias, matmul]), annotate_codegen=True)
    assert dpl.structural_equal(again, out)
    args = random_args(func)
    np.testing.assert_allclose(dpl.interpret(out, *args), dpl.interpret(mod, *args), rtol=1e-5, atol=1e-5)
    with pytest.raises(dpl.DplError, match="pattern 'nodot' has no codegen prefix"):
        fuse_ops_by_pattern(mod, [FusionPattern("nodot", dpl.is_op("exp")(dpl.wildcard()))], annotate_codegen=True)


@pytest.mark.oracle
def test_annotate_codegen_matches_tvm(tvm):
    from tvm import relax
    from tvm.relax.transform import FusionPattern as TvmFusionPattern

    fn, _ = build_tvm(TWO_LAYERS)
    pats = [TvmFusionPattern(*(lambda n, p: (n, p.p if hasattr(p, "p") else p))(*b(TvmNS()))) for b in [matmul_bias_act, matmul_bias, matmul]]
    want = relax.transform.FuseOpsByPattern(pats, annotate_codegen=True)(tvm.IRModule({"main": fn}))
    tvm_codegen = sorted(str(f.attrs["Codegen"]) for _, f in want.functions.items() if f.attrs is not None and "Codegen" in f.attrs)
    func, _ = build_dpl(TWO_LAYERS)
    got = fuse_ops_by_pattern(dpl.Module([func]), dpl_patterns([matmul_bias_act, matmul_bias, matmul]), annotate_codegen=True)
    assert sorted(f.attrs["Codegen"] for f in got.functions.values() if "Codegen" in f.attrs) == tvm_codegen
