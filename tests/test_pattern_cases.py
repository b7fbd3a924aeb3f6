"""Matcher cases run on dpl and, where TVM 0.27 is installed, on TVM's Relax DPL too.

Each case is written once: a pattern function over a vocabulary ``ns`` (dpl's or TVM's), the
binding it is matched against, the expected answer, and the TVM test of
tests/python/relax/test_dataflow_pattern.py (apache/tvm) it mirrors. ``test_node_dpl`` /
``test_graph_dpl`` pin dpl's answers; ``test_node_oracle`` / ``test_graph_oracle`` run the very
same case through ``tvm.relax.dpl`` and compare (answer, and what the probes bound).

Mirrored TVM tests: test_wildcard_pattern, test_call_pattern, test_var_pattern,
test_commutative_pattern_match, test_or_pattern, test_and_pattern, test_not_pattern,
test_dtype_pattern, test_shape_pattern, test_tuple_pattern, test_unordered_tuple_pattern,
test_tuple_get_item_pattern, test_op_attr, test_varg_default_wildcard, test_rewrite (the
repeated-pattern callbacks), test_simple_used_by, test_simple_call_tir_edge, test_simple_oub,
test_diamond, test_diamond_counter_oub, test_distinguish_diamond_and_parallel,
test_single_cbr, test_counter_single_crb, test_two_cbr, test_two_matmul,
test_concat_mm_split, test_nested_diamond, test_rewrite_simple,
test_repeated_pattern_match, test_backtrack_if_rewriter_returns_no_op.
(TVM writes ``is_call_dps_packed("name")`` where we write an op call with
``varg_default_wildcard``; the graph semantics are the same.)
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import pytest

import dpl.pattern as dp
from _dpl_tvm import DplNS, TvmNS, build_dpl, build_tvm

# -- one function for the node cases ---------------------------------------------------------
FN = [
    ("param", "x", (4, 4), "float32"), ("param", "w", (4, 4), "float32"),
    ("m", "matmul", ["x", "w"]),
    ("r", "nn.relu", ["m"]),
    ("e1", "exp", ["r"]), ("e2", "exp", ["r"]),
    ("s", "add", ["e1", "e1"]), ("t", "add", ["e1", "e2"]),
    ("c", "add", ["x", 1.0]), ("mc", "multiply", [2.0, "x"]), ("sub", "subtract", [1.0, "x"]),
    ("y1", "alias", "m"), ("a2", "add", ["y1", "w"]),
    ("q", "add", ["e1", "r"]), ("q2", "add", ["r", "e1"]),
    ("cc", "concat", [("tuple", ["e1", "r"])], {"axis": 0}),
    ("sp", "split", ["x"], {"indices_or_sections": 2, "axis": 0}),
    ("g0", "item", "sp", 0), ("g1", "item", "sp", 1),
    ("gadd", "add", ["g0", "g1"]), ("gsub", "subtract", ["g0", "g1"]),
    ("mn", "mean", ["x"], {"axis": [-1], "keepdims": True}),
    ("gl", "nn.gelu", ["m"]), ("h", "sigmoid", ["gl"]),
    ("out", "add", ["s", "t"]),
]


class Case(NamedTuple):
    name: str
    mirrors: str
    target: str
    expected: bool
    build: Callable  # ns -> {"root": pattern, probe name: sub-pattern, ...}
    probes: dict = {}


def op(ns, name, *args, **kw):
    return ns.call(ns.is_op(name), *args, **kw)


def _split_items(ns, i, j, outer="add"):
    sp = op(ns, "split", ns.wildcard())
    return {"root": op(ns, outer, ns.is_tuple_get_item(sp, i), ns.is_tuple_get_item(sp, j))}


def _rep(ns, outer, inner_first):
    w = ns.wildcard()
    e = op(ns, "exp", w)
    args = (e, w) if inner_first else (w, e)
    return {"root": op(ns, outer, *args), "w": w}


def _two_exp(ns):
    v = ns.wildcard()
    return {"root": op(ns, "add", op(ns, "exp", v), op(ns, "exp", v)), "v": v}


def _alt_inside(ns, outer, first, second):
    v = ns.wildcard()
    return {"root": op(ns, outer, op(ns, first, v) | op(ns, second, v)), "v": v}


def _ww(ns, n=2, target="add", varg=False):
    w = ns.wildcard()
    return {"root": op(ns, target, *([w] * n), varg_default_wildcard=varg), "w": w}


NODE_CASES = [
    Case("wildcard", "test_wildcard_pattern", "m", True, lambda ns: {"root": ns.wildcard()}),
    Case("call_two_wildcards", "test_call_pattern", "s", True, lambda ns: {"root": op(ns, "add", ns.wildcard(), ns.wildcard())}),
    Case("repeated_same_binding", "test_rewrite", "s", True, _ww, {"w": "e1"}),
    Case("repeated_two_equal_bindings_fail", "test_rewrite", "t", False, _ww),
    Case("repeated_inner_var_through_two_exps", "test_rewrite", "t", True, _two_exp, {"v": "r"}),
    Case("var_names", "test_var_pattern", "m", True, lambda ns: {"root": op(ns, "matmul", ns.is_var("x"), ns.is_var("w"))}),
    Case("matmul_not_commutative", "test_var_pattern", "m", False, lambda ns: {"root": op(ns, "matmul", ns.is_var("w"), ns.is_var("x"))}),
    Case("is_var_fails_on_bound_var", "test_var_pattern", "e1", False, lambda ns: {"root": op(ns, "exp", ns.is_var())}),
    Case("add_commutative_const", "test_commutative_pattern_match", "c", True, lambda ns: {"root": op(ns, "add", ns.is_const(), ns.wildcard())}),
    Case("multiply_commutative_const", "test_commutative_pattern_match", "mc", True, lambda ns: {"root": op(ns, "multiply", ns.wildcard(), ns.is_const())}),
    Case("subtract_not_commutative", "test_commutative_pattern_match", "sub", False, lambda ns: {"root": op(ns, "subtract", ns.wildcard(), ns.is_const())}),
    Case("alias_look_through", "test_commutative_pattern_match", "a2", True,
         lambda ns: {"root": op(ns, "add", op(ns, "matmul", ns.wildcard(), ns.wildcard()), ns.is_var("w"))}),
    Case("bound_var_then_commute", "test_commutative_pattern_match", "a2", True,
         lambda ns: {"root": op(ns, "add", ns.is_var("w"), ns.wildcard())}),
    Case("or_callee", "test_or_pattern", "e1", True, lambda ns: {"root": ns.call(ns.is_op("nn.relu") | ns.is_op("exp"), ns.wildcard())}),
    Case("or_callee_fails", "test_or_pattern", "e1", False, lambda ns: {"root": ns.call(ns.is_op("nn.relu") | ns.is_op("nn.gelu"), ns.wildcard())}),
    Case("alternatives_inside_call", "test_or_pattern", "e1", True, lambda ns: _alt_inside(ns, "exp", "nn.gelu", "nn.relu"), {"v": "m"}),
    Case("alternatives_inside_call_second", "test_or_pattern", "h", True, lambda ns: _alt_inside(ns, "sigmoid", "nn.relu", "nn.gelu"), {"v": "m"}),
    Case("alternatives_inside_call_fail", "test_or_pattern", "h", False, lambda ns: _alt_inside(ns, "sigmoid", "nn.relu", "exp")),
    Case("and_shape_dtype", "test_and_pattern", "m", True, lambda ns: {"root": ns.wildcard().has_shape([4, 4]) & ns.has_dtype("float32")}),
    Case("and_shape_wrong", "test_and_pattern", "m", False, lambda ns: {"root": ns.wildcard().has_shape([2, 4]) & ns.has_dtype("float32")}),
    Case("not_other_op", "test_not_pattern", "r", True, lambda ns: {"root": ~op(ns, "exp", ns.wildcard())}),
    Case("not_same_op", "test_not_pattern", "e1", False, lambda ns: {"root": ~op(ns, "exp", ns.wildcard())}),
    Case("dtype_wrong", "test_dtype_pattern", "m", False, lambda ns: {"root": ns.has_dtype("float16")}),
    Case("dtype_right_on_call", "test_dtype_pattern", "mn", True, lambda ns: {"root": op(ns, "mean", ns.wildcard()).has_dtype("float32")}),
    Case("shape_after_reduce", "test_shape_pattern", "mn", True, lambda ns: {"root": op(ns, "mean", ns.wildcard()).has_shape([4, 1])}),
    Case("tuple_ordered", "test_tuple_pattern", "cc", True,
         lambda ns: {"root": op(ns, "concat", ns.is_tuple([op(ns, "exp", ns.wildcard()), ns.wildcard()]))}),
    Case("tuple_ordered_fails_swapped", "test_tuple_pattern", "cc", False,
         lambda ns: {"root": op(ns, "concat", ns.is_tuple([op(ns, "nn.relu", ns.wildcard()), op(ns, "exp", ns.wildcard())]))}),
    Case("tuple_unordered", "test_unordered_tuple_pattern", "cc", True,
         lambda ns: {"root": op(ns, "concat", ns.is_tuple([op(ns, "nn.relu", ns.wildcard()), op(ns, "exp", ns.wildcard())], unordered=True))}),
    Case("tuple_wrong_size", "test_tuple_pattern", "cc", False,
         lambda ns: {"root": op(ns, "concat", ns.is_tuple([ns.wildcard()]))}),
    Case("tuple_get_item", "test_tuple_get_item_pattern", "gadd", True, lambda ns: _split_items(ns, 0, 1)),
    Case("tuple_get_item_commuted", "test_tuple_get_item_pattern", "gadd", True, lambda ns: _split_items(ns, 1, 0)),
    Case("tuple_get_item_not_commuted", "test_tuple_get_item_pattern", "gsub", False, lambda ns: _split_items(ns, 1, 0, "subtract")),
    Case("tuple_get_item_wildcard_index", "test_tuple_get_item_pattern", "gsub", True, lambda ns: _split_items(ns, None, None, "subtract")),
    Case("tuple_get_item_same_index_fails", "test_tuple_get_item_pattern", "gadd", False, lambda ns: _split_items(ns, 0, 0)),
    Case("attr_keepdims", "test_op_attr", "mn", True, lambda ns: {"root": op(ns, "mean", ns.wildcard()).has_attr({"keepdims": True})}),
    Case("attr_keepdims_wrong", "test_op_attr", "mn", False, lambda ns: {"root": op(ns, "mean", ns.wildcard()).has_attr({"keepdims": False})}),
    Case("attr_unknown_key", "test_op_attr", "m", False, lambda ns: {"root": ns.wildcard().has_attr({"keepdims": True})}),
    Case("varg_default_wildcard", "test_varg_default_wildcard", "s", True, lambda ns: _ww(ns, 1, varg=True)),
    Case("varg_needs_enough_args", "test_varg_default_wildcard", "s", False, lambda ns: _ww(ns, 3, varg=True)),
    Case("arity_exact", "test_varg_default_wildcard", "s", False, lambda ns: {"root": op(ns, "add", ns.wildcard())}),
    Case("commutative_repeated_sub_pattern", "test_commutative_pattern_match", "q", True, lambda ns: _rep(ns, "add", False), {"w": "r"}),
    Case("commutative_repeated_sub_pattern_2", "test_commutative_pattern_match", "q", True, lambda ns: _rep(ns, "add", True), {"w": "r"}),
    Case("commutative_repeated_sub_pattern_3", "test_commutative_pattern_match", "q2", True, lambda ns: _rep(ns, "add", False), {"w": "r"}),
    Case("two_exps_on_exp_and_relu", "test_commutative_pattern_match", "q", False, _two_exp),
    Case("deep_chain", "test_call_pattern", "e2", True,
         lambda ns: {"root": op(ns, "exp", op(ns, "nn.relu", op(ns, "matmul", ns.is_var("x"), ns.is_var("w"))))}),
]


def _matched_name(value, names, values):
    for name, v in names.items():
        if v is value:
            return name
    for name, v in values.items():
        if v is value:
            return name
    return type(value).__name__


@pytest.fixture(scope="module")
def dpl_fn():
    return build_dpl(FN)


@pytest.mark.parametrize("case", NODE_CASES, ids=lambda c: c.name)
def test_node_dpl(case, dpl_fn):
    fn, env = dpl_fn
    pats = case.build(DplNS)
    target = next(b for b in fn.bindings if b.var.name == case.target)
    result = dp.match(pats["root"], target.value, fn)
    assert bool(result) is case.expected, str(result)
    values = {b.var.name: b.value for b in fn.bindings}
    for probe, want in case.probes.items():
        assert _matched_name(result[pats[probe]], env, values) == want
    # the bound variable matches the same way as its value (look-through)
    assert bool(dp.match(pats["root"], target.var, fn)) is case.expected or isinstance(target.value, dp.Pattern)


@pytest.mark.oracle
@pytest.mark.parametrize("case", NODE_CASES, ids=lambda c: c.name)
def test_node_oracle(case, tvm, dpl_fn):
    from tvm.relax.analysis import get_var2val

    fn, env = dpl_fn
    tfn, tenv = build_tvm(FN)
    block = tfn.body.blocks[0]
    tvalues = {b.var.name: b.value for b in block.bindings}
    tpats = case.build(TvmNS())
    got = tpats["root"].extract_matched_expr(tvalues[case.target], get_var2val(tfn))
    assert (got is not None) is case.expected
    pats = case.build(DplNS)
    target = next(b for b in fn.bindings if b.var.name == case.target)
    mine = dp.match(pats["root"], target.value, fn)
    assert bool(mine) == (got is not None)
    if got is not None:
        values = {b.var.name: b.value for b in fn.bindings}
        for probe in pats:
            if probe == "root":
                continue
            theirs = _tvm_name(got[tpats[probe]], tenv, tvalues)
            assert _matched_name(mine[pats[probe]], env, values) == theirs


def _tvm_name(value, names, values):
    for name, v in names.items():
        if v.same_as(value):
            return name
    for name, v in values.items():
        if v.same_as(value):
            return name
    return type(value).__name__


# -- graph cases ---------------------------------------------------------------------------
DIAMOND = [("param", "x", (8, 8), "float32"), ("param", "w", (8, 8), "float32"),
           ("lv0", "matmul", ["x", "w"]), ("lv1", "nn.relu", ["lv0"]), ("lv2", "sigmoid", ["lv0"]),
           ("lv3", "add", ["lv1", "lv2"])]
SMALL_DIAMOND = [("param", "x", (8, 8), "float32"), ("lv0", "nn.relu", ["x"]), ("lv1", "add", ["lv0", "lv0"])]
SMALL_PARALLEL = [("param", "x", (8, 8), "float32"), ("lv0", "nn.relu", ["x"]), ("lv1", "nn.relu", ["x"]),
                  ("lv2", "add", ["lv0", "lv1"])]
CBR2 = [("param", "x", (8, 8), "float32"), ("param", "w0", (8, 8), "float32"), ("param", "b0", (8, 8), "float32"),
        ("param", "w1", (8, 8), "float32"), ("param", "b1", (8, 8), "float32"),
        ("lv0", "matmul", ["x", "w0"]), ("lv1", "add", ["lv0", "b0"]), ("lv2", "nn.relu", ["lv1"]),
        ("lv3", "matmul", ["x", "w1"]), ("lv4", "add", ["lv3", "b1"]), ("lv5", "nn.relu", ["lv4"]),
        ("lv6", "concat", [("tuple", ["lv2", "lv5"])], {"axis": 1})]
MM2 = [("param", "a", (32, 16), "float32"), ("param", "b", (16, 48), "float32"), ("param", "c", (48, 32), "float32"),
       ("lv0", "matmul", ["a", "b"]), ("lv1", "matmul", ["lv0", "c"])]
CMS = [("param", "a", (32, 32), "float32"), ("param", "b", (16, 32), "float32"), ("param", "c", (16, 32), "float32"),
       ("lv0", "concat", [("tuple", ["b", "c"])], {"axis": 0}), ("lv1", "matmul", ["a", "lv0"]),
       ("lv2", "split", ["lv1"], {"indices_or_sections": 2, "axis": 0}),
       ("lv3", "item", "lv2", 0), ("lv4", "item", "lv2", 1), ("lv5", "add", ["lv3", "lv4"])]
NESTED = [("param", "x", (8, 8), "float32"), ("param", "w", (8, 8), "float32"),
          ("lv0", "matmul", ["x", "w"]), ("lv1", "matmul", ["x", "w"]), ("lv2", "sigmoid", ["lv0"]),
          ("lv3", "sigmoid", ["lv1"]), ("lv4", "add", ["lv0", "lv1"]), ("lv5", "add", ["lv2", "lv4"]),
          ("lv6", "add", ["lv3", "lv4"]), ("lv7", "add", ["lv5", "lv6"])]


def any_call(ns, name):
    return ns.call(ns.is_op(name), varg_default_wildcard=True)


class GraphCase(NamedTuple):
    name: str
    mirrors: str
    spec: list
    expected: bool
    build: Callable  # ns -> (patterns dict, [(producer, consumer, "^" or ">>", index)])
    assignment: dict = {}


def _chain(ns, *ops, kind=">>"):
    pats = {f"p{i}": any_call(ns, o) for i, o in enumerate(ops)}
    names = list(pats)
    return pats, [(pats[a], pats[b], kind, -1) for a, b in zip(names, names[1:])]


def _diamond(ns, first=("^", "^")):
    n = {"n0": any_call(ns, "matmul"), "n1": any_call(ns, "nn.relu"), "n2": any_call(ns, "sigmoid"), "n3": any_call(ns, "add")}
    return n, [(n["n0"], n["n1"], first[0], -1), (n["n0"], n["n2"], first[1], -1),
               (n["n1"], n["n3"], ">>", -1), (n["n2"], n["n3"], ">>", -1)]


def _fork_join(ns):
    n = {"fork": any_call(ns, "nn.relu"), "join": any_call(ns, "add")}
    return n, [(n["fork"], n["join"], ">>", 0), (n["fork"], n["join"], ">>", 1)]


def _parallel(ns):
    n = {"r0": any_call(ns, "nn.relu"), "r1": any_call(ns, "nn.relu"), "join": any_call(ns, "add")}
    return n, [(n["r0"], n["join"], ">>", -1), (n["r1"], n["join"], ">>", -1)]


def _two_cbr(ns, root):
    n = {"in": ns.is_var(root)}
    edges = []
    for k in (0, 1):
        chain = [any_call(ns, o) for o in ("matmul", "add", "nn.relu")]
        n.update({f"c{k}{i}": p for i, p in enumerate(chain)})
        edges += [(chain[0], chain[1], ">>", -1), (chain[1], chain[2], ">>", -1), (n["in"], chain[0], "^", -1)]
    return n, edges


def _mm2_shapes(ns):
    n = {"m0": any_call(ns, "matmul").has_shape([32, 48]), "m1": any_call(ns, "matmul").has_shape([32, 32])}
    return n, [(n["m0"], n["m1"], ">>", -1)]


def _cms_items(ns):
    split = any_call(ns, "split")
    i0 = ns.is_tuple_get_item(split, 0).has_shape([16, 32])
    i1 = ns.is_tuple_get_item(split, 1).has_shape([16, 32])
    add = op(ns, "add", i0, i1)
    n = {"split": split, "i0": i0, "i1": i1, "add": add}
    return n, [(split, i0, "^", -1), (split, i1, "^", -1), (i0, add, ">>", -1), (i1, add, ">>", -1)]


def _nested(ns, left_kind):
    sig, add4, add5 = any_call(ns, "sigmoid"), any_call(ns, "add"), any_call(ns, "add")
    mm = any_call(ns, "matmul")
    n = {"mm": mm, "sig": sig, "add4": add4, "add5": add5}
    return n, [(mm, sig, "^", -1), (mm, add4, "^", -1), (sig, add5, ">>", -1), (add4, add5, left_kind, -1)]


def _nested_adds(ns):
    a4, a5, a6, a7 = (any_call(ns, "add") for _ in range(4))
    n = {"a4": a4, "a5": a5, "a6": a6, "a7": a7}
    return n, [(a4, a5, "^", -1), (a4, a6, "^", -1), (a5, a7, ">>", -1), (a6, a7, ">>", -1)]


def _indexed(ns, index):
    n = {"x": ns.is_var("x"), "mm": any_call(ns, "matmul")}
    return n, [(n["x"], n["mm"], "^", index)]


GRAPH_CASES = [
    GraphCase("simple_used_by", "test_simple_used_by", DIAMOND, True,
              lambda ns: (lambda n: (n, [(n["x"], n["any"], "^", -1)]))({"x": ns.is_var("x"), "any": ns.wildcard()}),
              {"x": "x", "any": "lv0"}),
    GraphCase("call_edge", "test_simple_call_tir_edge", DIAMOND, True, lambda ns: _chain(ns, "matmul", "nn.relu", kind="^"),
              {"p0": "lv0", "p1": "lv1"}),
    GraphCase("only_used_by_fails_on_fork", "test_simple_oub", DIAMOND, False, lambda ns: _chain(ns, "matmul", "nn.relu")),
    GraphCase("diamond", "test_diamond", DIAMOND, True, _diamond, {"n0": "lv0", "n1": "lv1", "n2": "lv2", "n3": "lv3"}),
    GraphCase("diamond_counter_oub", "test_diamond_counter_oub", DIAMOND, False, lambda ns: _diamond(ns, (">>", ">>"))),
    GraphCase("fork_join_on_diamond", "test_distinguish_diamond_and_parallel", SMALL_DIAMOND, True, _fork_join,
              {"fork": "lv0", "join": "lv1"}),
    GraphCase("fork_join_on_parallel", "test_distinguish_diamond_and_parallel", SMALL_PARALLEL, False, _fork_join),
    GraphCase("parallel_on_parallel", "test_distinguish_diamond_and_parallel", SMALL_PARALLEL, True, _parallel,
              {"r0": "lv0", "r1": "lv1", "join": "lv2"}),
    GraphCase("parallel_on_diamond", "test_distinguish_diamond_and_parallel", SMALL_DIAMOND, False, _parallel),
    GraphCase("single_cbr_first_answer", "test_single_cbr", CBR2, True, lambda ns: _chain(ns, "matmul", "add", "nn.relu"),
              {"p0": "lv0", "p1": "lv1", "p2": "lv2"}),
    GraphCase("counter_single_crb", "test_counter_single_crb", CBR2, False, lambda ns: _chain(ns, "matmul", "nn.relu", "add")),
    GraphCase("two_cbr", "test_two_cbr", CBR2, True, lambda ns: _two_cbr(ns, "x"),
              {"in": "x", "c00": "lv0", "c01": "lv1", "c02": "lv2", "c10": "lv3", "c11": "lv4", "c12": "lv5"}),
    GraphCase("two_cbr_wrong_input", "test_two_cbr", CBR2, False, lambda ns: _two_cbr(ns, "w0")),
    GraphCase("two_matmul", "test_two_matmul", MM2, True, lambda ns: _chain(ns, "matmul", "matmul"), {"p0": "lv0", "p1": "lv1"}),
    GraphCase("two_matmul_shapes", "test_two_matmul", MM2, True, _mm2_shapes, {"m0": "lv0", "m1": "lv1"}),
    GraphCase("three_matmul_fails", "test_two_matmul", MM2, False, lambda ns: _chain(ns, "matmul", "matmul", "matmul")),
    GraphCase("concat_mm_split", "test_concat_mm_split", CMS, True, lambda ns: _chain(ns, "concat", "matmul", "split"),
              {"p0": "lv0", "p1": "lv1", "p2": "lv2"}),
    GraphCase("split_items_add", "test_concat_mm_split", CMS, True, _cms_items,
              {"split": "lv2", "i0": "lv3", "i1": "lv4", "add": "lv5"}),
    GraphCase("nested_diamond_left", "test_nested_diamond", NESTED, True, lambda ns: _nested(ns, "^"),
              {"mm": "lv0", "sig": "lv2", "add4": "lv4", "add5": "lv5"}),
    GraphCase("nested_diamond_counter", "test_nested_diamond", NESTED, False, lambda ns: _nested(ns, ">>")),
    GraphCase("nested_diamond_adds", "test_nested_diamond", NESTED, True, _nested_adds,
              {"a4": "lv4", "a5": "lv5", "a6": "lv6", "a7": "lv7"}),
    GraphCase("used_by_index_0", "test_distinguish_diamond_and_parallel", DIAMOND, True, lambda ns: _indexed(ns, 0),
              {"x": "x", "mm": "lv0"}),
    GraphCase("used_by_index_1_fails", "test_distinguish_diamond_and_parallel", DIAMOND, False, lambda ns: _indexed(ns, 1)),
]


def _dpl_graph(case):
    fn, env = build_dpl(case.spec)
    pats, edges = case.build(DplNS)
    graph = dp.GraphPattern.union(*[(a >> b if k == ">>" else a ^ b) if i == -1 else
                                    (a.only_used_by(b, i) if k == ">>" else a.used_by(b, i))
                                    for a, b, k, i in edges])
    return fn, pats, dp.match_graph(graph, fn)


@pytest.mark.parametrize("case", GRAPH_CASES, ids=lambda c: c.name)
def test_graph_dpl(case):
    fn, pats, result = _dpl_graph(case)
    assert bool(result) is case.expected, str(result)
    if result:
        assert {k: result[p].name for k, p in pats.items()} == case.assignment


@pytest.mark.oracle
@pytest.mark.parametrize("case", GRAPH_CASES, ids=lambda c: c.name)
def test_graph_oracle(case, tvm):
    from tvm.relax.dpl import PatternContext

    tfn, _ = build_tvm(case.spec)
    tpats, edges = case.build(TvmNS())
    with PatternContext() as ctx:
        for a, b, k, i in edges:
            (a.only_used_by(b, i) if k == ">>" else a.used_by(b, i))
        got = ctx.match_dfb(tfn.body.blocks[0])
    _, pats, mine = _dpl_graph(case)
    assert bool(got) == bool(mine) == case.expected
    if got:
        assert {k: mine[p].name for k, p in pats.items()} == {k: got[p].name for k, p in tpats.items()}
