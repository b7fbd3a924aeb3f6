"""The linear compile pipeline's pieces: the use index behind FuseOpsByPattern (TVM's var_usages,
read lazily), outlining without a reorder when the order already holds, the ops a rewrite
needs before it tries a binding, CSE keys shared across rules, the scalar-constant fast path
of the matcher, and the collector paused only for the duration of a pass."""

import gc

import numpy as np
import pytest

import dpl
from dpl.ir.expr import Constant
from dpl.ir.simplify import eliminate_common_subexpr, simplify
from dpl.ops.registry import make_call
from dpl.pattern import FUNCTION_RETURN, is_const, is_op, rewrite_call, wildcard
from dpl.pattern.match import _same_constant
from dpl.pattern.nodes import required_ops
from dpl.transform.outline import CycleError, FunctionTable, Group, outline, outline_with_uses
from dpl.transform.uses import FunctionUses

TEXT = """
func main(x: f32[4, 4], w: f32[4, 4]) -> (f32[4, 4], f32[4, 4]) {
  a = matmul(x, w)
  b = add(a, x)
  c = exp(b)
  d = multiply(c, a)
  e = add(d, d)
  return (e, c)
}
"""


def parse(text=TEXT):
    return dpl.parse(text)["main"]


def brute_force_usages(func):
    """TVM's var_usages, written out: {var: users in program order}, the return last."""
    users = {p: [] for p in func.params}
    for b in func.bindings:
        users.setdefault(b.var, [])
        for leaf in dpl.ir.traverse.leaves(b.value):
            if isinstance(leaf, dpl.ir.Var) and b.var not in users.setdefault(leaf, []):
                users[leaf].append(b.var)
    for leaf in dpl.ir.traverse.leaves(func.ret):
        if isinstance(leaf, dpl.ir.Var):
            users[leaf].append(FUNCTION_RETURN)
    return {k: tuple(v) for k, v in users.items()}


def test_var_usages_read_from_the_index_are_tvms():
    func = parse()
    usages = FunctionUses(func).var_usages
    want = brute_force_usages(func)
    assert dict(usages.items()) == want
    assert list(usages) == list(want) and len(usages) == len(want)
    c = func.bindings[2].var
    assert usages[c][-1] is FUNCTION_RETURN and [v.name for v in usages[c][:-1]] == ["d"]
    assert [v.name for v in usages[func.bindings[3].var]] == ["e"]  # d read twice by e: listed once
    with pytest.raises(KeyError):
        usages[dpl.ir.Var("stranger", func.params[0].ty)]


def test_the_index_lists_bindings_by_op():
    uses = FunctionUses(parse())
    assert uses.with_ops(frozenset({"add"})) == [1, 4]
    assert uses.with_ops(frozenset({"add", "exp"})) == [1, 2, 4]
    assert uses.with_ops(frozenset({"tanh"})) == [] and uses.with_ops(None) == [0, 1, 2, 3, 4]


def test_outline_keeps_the_order_or_reorders_as_before():
    func = dpl.parse("""
func main(x: f32[4], y: f32[4]) -> f32[4] {
  a = exp(x)
  b = add(a, y)
  c = tanh(x)
  d = multiply(b, c)
  e = add(d, y)
  return e
}""")["main"]
    rng = np.random.default_rng(1)
    args = [rng.uniform(0.5, 1.5, 4).astype("float32") for _ in range(2)]
    want = dpl.interpret(dpl.Module([func]), *args)
    # {a, c}: b reads a before c, the group's last binding, is reached: b moves after the call
    table = FunctionTable(dpl.Module([func]))
    moved = outline(func, [Group((0, 2), {})], table, lift_constants=True)
    assert [b.var.name for b in moved.bindings] == ["lv0", "a", "c", "b", "d", "e"]
    np.testing.assert_allclose(dpl.interpret(table.module().with_function(moved), *args), want, rtol=1e-6)
    # {b, d}: every reader comes after d: the original order, the call where d was
    table = FunctionTable(dpl.Module([func]))
    kept = outline(func, [Group((1, 3), {})], table, lift_constants=True)
    assert [b.var.name for b in kept.bindings] == ["a", "c", "d", "e"]
    np.testing.assert_allclose(dpl.interpret(table.module().with_function(kept), *args), want, rtol=1e-6)
    with pytest.raises(CycleError):  # a is read by b, which d reads: {a, d} cannot be one call
        outline(func, [Group((0, 3), {})], FunctionTable(dpl.Module([func])), lift_constants=True)


def same_index(got: FunctionUses, func):
    want = FunctionUses(func)
    assert got.func is func
    assert got.index_of == want.index_of and list(got.users) == want.users and got.other_users == want.other_users
    assert got.position == want.position
    assert got.by_op == want.by_op and got.calls == want.calls and got.returned == want.returned
    assert dict(got.var_usages.items()) == brute_force_usages(func)


@pytest.mark.parametrize("groups", [
    [(0, 1)],  # one output (b), read by c and d
    [(0, 1), (3, 4)],  # two groups, the second reads the first's output
    [(1, 2)],  # two outputs (b read by d, c returned): a tuple and its items
    [(0,), (2, 3)],  # a single binding; a group with a returned output (c)
])
def test_the_outlined_use_index_is_derived_not_rescanned(groups):
    func = dpl.parse("""
func main(x: f32[4], y: f32[4]) -> (f32[4], f32[4]) {
  a = exp(x)
  b = add(a, y)
  c = tanh(b)
  d = multiply(b, c)
  e = add(d, y)
  return (e, c)
}""")["main"]
    table = FunctionTable(dpl.Module([func]))
    out, uses = outline_with_uses(func, [Group(g, {}) for g in groups], table, lift_constants=True, uses=FunctionUses(func))
    assert uses is not None and out.bindings != func.bindings
    same_index(uses, out)


def test_a_dead_group_leaves_the_derived_index_exact():
    func = dpl.parse("""
func main(x: f32[4], y: f32[4]) -> f32[4] {
  a = exp(x)
  b = tanh(y)
  c = add(a, x)
  return c
}""")["main"]
    out, uses = outline_with_uses(func, [Group((1,), {})], FunctionTable(dpl.Module([func])), lift_constants=True)
    assert [b.var.name for b in out.bindings] == ["a", "c"]  # b, read by nobody, is dropped
    same_index(uses, out)


def test_equal_groups_share_one_function_named_by_a_counter():
    func = dpl.parse("""
func main(x: f32[4]) -> f32[4] {
  a = exp(x)
  b = add(a, x)
  c = exp(b)
  d = add(c, b)
  e = exp(d)
  f = multiply(e, d)
  return f
}""")["main"]
    table = FunctionTable(dpl.Module([func]))
    out = outline(func, [Group((0, 1), {}), Group((2, 3), {}), Group((4, 5), {})], table, lift_constants=True)
    callees = [b.value.op.name for b in out.bindings]
    assert callees[0] == callees[1] != callees[2]
    assert sorted(n for n in table.functions if n != "main") == ["fused_exp_add", "fused_exp_multiply"]


def test_required_ops_of_alternatives_and_optionals():
    x = wildcard()
    p = is_op("multiply")(x, is_op("sigmoid")(x))
    assert required_ops(p) == {"multiply", "sigmoid"}
    either = is_op("exp")(x) | is_op("tanh")(is_op("exp")(x))
    assert required_ops(either) == {"exp"}
    assert required_ops(wildcard()) == frozenset()


def test_a_rewrite_whose_ops_are_absent_tries_no_binding(monkeypatch):
    import dpl.pattern.rewrite as rewrite

    func = parse()
    rounds, calls = [], []
    real_round = rewrite._round
    monkeypatch.setattr(rewrite, "_round", lambda *a: rounds.append(1) or real_round(*a))

    def rewriter(value, match):
        calls.append(value)
        return None

    x = wildcard()
    assert rewrite_call(is_op("multiply")(x, is_op("sigmoid")(x)), rewriter, func) is func
    assert rounds == [] and calls == []  # no sigmoid anywhere: not one binding tried
    # present: every multiply is offered to the rewriter
    assert rewrite_call(is_op("multiply")(x, wildcard()), rewriter, func) is func
    assert rounds == [1] and len(calls) == 1


def test_cse_keys_shared_between_calls_change_nothing():
    func = dpl.parse("func main(x: f32[4]) -> f32[4] { a = exp(x) b = exp(x) c = add(a, b) d = add(b, a) e = multiply(c, d) return e }")["main"]
    keys: dict = {}
    first = simplify(func, keys)
    assert len(keys) > 0 and [b.var.name for b in first.bindings] == ["a", "c", "e"]
    again = eliminate_common_subexpr(func, keys)
    assert [b.var.name for b in simplify(again, keys).bindings] == [b.var.name for b in first.bindings]


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_scalar_constants_compare_as_before(dtype):
    rng = np.random.default_rng(3)
    values = [0.5, 1e-6, 2.0, np.nan, np.inf, -0.0, 0.1, 0.7071067811865476]
    values += list(rng.standard_normal(20))
    for v in values:
        const = np.asarray(v).astype(dtype)
        for wanted in (np.asarray(v), np.asarray(float(np.float32(v))), np.asarray(v + 1e-3), np.asarray(2)):
            with np.errstate(all="ignore"):
                slow = bool(np.array_equal(const, wanted.astype(const.dtype), equal_nan=True))
            assert _same_constant(const, wanted) is slow, (dtype, v, wanted)
    assert _same_constant(np.asarray(0.5, "float32"), np.asarray(0.5))
    assert dpl.pattern.match(is_const(0.125), Constant(np.asarray(0.125, "float32")))


def test_passes_restore_the_collector():
    from dpl.apply import as_pattern_set

    mod = dpl.parse(TEXT)
    assert gc.isenabled()
    dpl.apply(mod, as_pattern_set(["rewrites", "cublas"]))
    assert gc.isenabled()
    gc.disable()
    try:
        dpl.apply(mod, as_pattern_set(["rewrites", "cublas"]))
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()


LAYER = """
func main(x: f32[8, 16], g: f32[16], w: f32[16, 16]) -> f32[8, 16] {
  a = astype(x, dtype="float32")
  b = power(a, 2.0)
  c = mean(b, axis=[-1], keepdims=true)
  d = add(c, 1e-6)
  e = rsqrt(d)
  f = multiply(a, e)
  n = multiply(g, f)
  m = matmul(n, w)
  s = sigmoid(m)
  t = multiply(m, s)
  u = matmul(t, w)
  v = add(u, x)
  return v
}
"""


def test_apply_leaves_no_cyclic_garbage():
    """Everything apply drops is freed by reference counting as it goes: nothing (use index,
    closure) is left for the cyclic collector, whose sweep of a large module's garbage cost
    more per binding the larger the module."""
    from dpl.apply import as_pattern_set

    mod, patterns = dpl.parse(LAYER), as_pattern_set(["rewrites", "llm", "cublas"])
    dpl.apply(mod, patterns)
    gc.collect()
    gc.disable()
    try:
        out = dpl.apply(mod, patterns)
        assert gc.collect() == 0
    finally:
        gc.enable()
    assert any("Composite" in f.attrs for f in out.functions.values())  # the patterns did match


BASE = """
func main(x: f32[4, 4], w: f32[4, 4]) -> f32[4, 4] {
  a = exp(x)
  b = add(a, w)
  c = multiply(b, x)
  d = subtract(c, a)
  return d
}
"""


@pytest.mark.parametrize("name, build, shortcut", [
    ("c", lambda v: make_call("tanh", [v["a"]]), True),  # nothing repeats, b dies: the shortcut
    ("c", lambda v: make_call("exp", [v["x"]]), False),  # repeats a: CSE must run
    ("c", lambda v: v["a"], False),  # a trivial binding: canonicalize must run
    ("d", lambda v: make_call("add", [v["a"], v["w"]]), False),  # repeats b, and c dies
])
def test_simplify_after_a_round_equals_simplify(monkeypatch, name, build, shortcut):
    """A rewrite round's result is simplified by looking at what it changed only when that
    gives what simplify gives (base is simplify's own result, the changed bindings are calls
    of values nothing else computes)."""
    import dpl.ir.simplify as simplify_module
    from dpl.ir.expr import Binding, replace
    from dpl.ir.simplify import simplify_changed

    full = []
    monkeypatch.setattr(simplify_module, "simplify", lambda f, k=None: full.append(f) or simplify(f, k))
    for counted in (False, True):  # dead bindings found by a walk, or from base's read counts
        keys: dict = {}
        base = simplify(dpl.parse(BASE)["main"], keys)
        names = {b.var.name: b.var for b in base.bindings} | {p.name: p for p in base.params}
        new = Binding(names[name], build(names))
        func = replace(base, bindings=tuple(new if b.var.name == name else b for b in base.bindings))
        old = [b for b in base.bindings if b.var.name == name] if counted else None
        got = simplify_changed(base, func, [new], keys, old, {b.var: b.value for b in base.bindings})
        assert dpl.ir.structural_equal(got, simplify(func), names=True)
        assert (not full) == shortcut
    if shortcut:  # the counts go on: a second change of the result, from the recorded ones
        names = {b.var.name: b.var for b in got.bindings} | {p.name: p for p in got.params}
        again = Binding(names["d"], make_call("exp", [names["c"]]))
        func2 = replace(got, bindings=tuple(again if b.var.name == "d" else b for b in got.bindings))
        old2 = [b for b in got.bindings if b.var.name == "d"]
        got2 = simplify_changed(got, func2, [again], keys, old2, {b.var: b.value for b in got.bindings})
        assert dpl.ir.structural_equal(got2, simplify(func2), names=True)
        assert [b.var.name for b in got2.bindings] == ["a", "c", "d"]  # a lost a read, and c still reads it
        assert not full


CHAIN = """
func main(x: f32[4], y: f32[4]) -> (f32[4], f32[4]) {
  a = exp(x)
  b = tanh(a)
  c = sqrt(b)
  u = add(a, y)
  d = multiply(c, u)
  e = sigmoid(a)
  return (d, e)
}
"""


def test_a_change_that_leaves_a_chain_unread_drops_all_of_it():
    from dpl.ir.expr import Binding, replace
    from dpl.ir.simplify import simplify_changed

    keys: dict = {}
    base = simplify(dpl.parse(CHAIN)["main"], keys)
    v = {b.var.name: b.var for b in base.bindings} | {p.name: p for p in base.params}
    new = Binding(v["d"], make_call("nn.silu", [v["u"]]))  # c, then b, lose their last reader; a is still read
    func = replace(base, bindings=tuple(new if b.var is v["d"] else b for b in base.bindings))
    got = simplify_changed(base, func, [new], keys, [b for b in base.bindings if b.var is v["d"]],
                           {b.var: b.value for b in base.bindings})
    assert [b.var.name for b in got.bindings] == ["a", "u", "d", "e"]
    assert dpl.ir.structural_equal(got, simplify(func), names=True)
    assert keys[("ops", id(got))][1] == {"exp", "add", "nn.silu", "sigmoid"}


def test_simplify_records_the_ops_its_result_calls():
    """The rewrite driver's required-ops test reads them instead of scanning the function."""
    from dpl.pattern.rewrite import _calls_all

    text = """
    func main(x: f32[4, 4]) -> f32[4, 4] {
      a = exp(x)
      b = exp(x)
      dead = tanh(a)
      c = add(a, sqrt(b))
      return c
    }
    """
    keys: dict = {}
    out = simplify(dpl.parse(text)["main"], keys)
    assert keys[("ops", id(out))] == (out, {"exp", "add", "sqrt"})
    assert _calls_all(out, frozenset({"sqrt", "exp"}), keys) and not _calls_all(out, frozenset({"tanh"}), keys)


REBUILD = """
func main(x: f32[4], y: f32[4]) -> f32[4] {
  a = tanh(x)
  s = sigmoid(a)
  m = multiply(a, s)
  b = exp(y)
  c = add(m, b)
  return c
}
"""


def rewritten_both_ways(func, rewriter, monkeypatch):
    """rewrite_call's result, and the same with every nested value looked up in the map of all
    bindings and the order checked over all positions (the rebuild before rounds told it what
    their matches read)."""
    import dpl.pattern.rewrite as rewrite

    x = wildcard()
    pattern = is_op("multiply")(x, is_op("sigmoid")(x))
    fast = rewrite_call(pattern, rewriter, func)
    real = rewrite._Rebuild.__init__
    monkeypatch.setattr(rewrite._Rebuild, "__init__", lambda self, f, r, *a, **k: real(self, f, r))
    return fast, rewrite_call(pattern, rewriter, func)


@pytest.mark.parametrize("case", ["matched value", "new nested call", "later binding"])
def test_a_round_rebuilds_from_what_its_matches_read(case, monkeypatch):
    from dpl.ir.printer import print_function

    func = dpl.parse(REBUILD)["main"]
    later = func.bindings[3].var  # b, bound after m

    def rewriter(value, match):
        a = next(e for e in match.values() if type(e) is dpl.ir.Call and e.op == "tanh")  # x's value: a's
        if case == "matched value":  # nests a's value: read as a, no new binding
            return make_call("nn.silu", [a])
        if case == "new nested call":  # a call of its own: a new binding before the replacement
            return make_call("nn.silu", [make_call("negative", [a])])
        return make_call("add", [a, later])  # reads b: b moves before m

    fast, full = rewritten_both_ways(func, rewriter, monkeypatch)
    assert print_function(fast) == print_function(full)
    want = {"matched value": ["a", "m", "b", "c"], "new nested call": ["a", "m_0", "m", "b", "c"],
            "later binding": ["a", "b", "m", "c"]}[case]
    assert [b.var.name for b in fast.bindings] == want
    args = [np.random.default_rng(1).standard_normal(4).astype("float32") for _ in range(2)]
    dpl.interpret(dpl.Module([fast]), *args)  # a well-ordered function


def test_a_replacement_that_reads_its_own_variable_is_a_cycle():
    from dpl.pattern import RewriteError

    func = dpl.parse(REBUILD)["main"]
    m = next(b for b in func.bindings if b.var.name == "m").var
    x = wildcard()
    with pytest.raises(RewriteError, match="depend on itself"):
        rewrite_call(is_op("multiply")(x, is_op("sigmoid")(x)), lambda v, mt: make_call("add", [mt[x], m]), func)
