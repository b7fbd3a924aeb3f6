"""FuseOps against TVM 0.27: the same graph through both, the same groups; every fused module
computes what the original does.

Scenarios mirrored from TVM's tests/python/relax/test_transform_fuse_ops.py (names kept):
test_fuse_simple, test_conv2d_fuse, test_concatenate, test_tuple_root, test_tuple_intermediate,
test_tuple_consecutive, test_inception_like, test_fuse_tuple_get_elemwise, test_tuple_get_root,
test_fuse_max, test_multiple_paths, test_dead_group, test_softmax (dpl op), test_layer_norm_silu,
test_matmul_bias_add (dpl form of the bias case), test_ew_used_by_matmul_and_relu.
Left out, with the reason: test_fuse_call_dps_packed / test_edge_with_call_dps_packed /
test_skip_call_dps_packed (dpl has no packed calls; calls of module functions are opaque and
covered by test_calls_of_functions_are_opaque), test_symbolic_shape_aware_fuse and
test_symbolic_var_in_call_tir_args (TIR symbolic vars; dpl's symbolic dims are checked
numerically only), test_partially_used_tuple_param (TVM-internal parameter splitting, covered in
the FuseOpsByPattern tests), test_packed_params / num_input (no such attribute in dpl),
test_skip_match_cast / test_dataflow_block_boundaries (dpl functions are one dataflow block).
"""

import numpy as np
import pytest

import dpl
from dpl.ir import FunctionBuilder, Module, const
from dpl.transform import fuse_ops, fusion_groups

from tvm_oracle import dpl_fusion_groups, tvm_fusion_groups


def names(func, groups):
    return {frozenset(func.bindings[i].var.name for i in g) for g in groups}


def check(func, max_depth=256, tvm=True):
    """dpl's groups (read back from the fused module) equal TVM's; numbers unchanged."""
    mod = Module([func])
    fused = fuse_ops(mod, max_depth=max_depth)
    got = dpl_fusion_groups(func, fused)
    assert got == names(func, fusion_groups(func, max_depth=max_depth))
    if tvm:
        assert got == tvm_fusion_groups(func, max_depth=max_depth)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(tuple(p.ty.shape)).astype(np.float32) for p in func.params]
    a, b = dpl.interpret(mod, *args), dpl.interpret(fused, *args)
    for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)
    return got


def chain(n_ops=4, op="exp"):
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4, 4))
    v = x
    for i in range(n_ops):
        v = fb.emit(op, v, name="abcdefghij"[i])
    return fb.ret(v)


@pytest.mark.oracle
def test_fuse_simple(tvm):
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (10, 20))
    a = fb.emit("add", x, 1.0, name="a")
    e = fb.emit("exp", a, name="e")
    s = fb.emit("squeeze", fb.emit("expand_dims", e, axis=[0], name="u"), axis=[0], name="s")
    assert check(fb.ret(s)) == {frozenset({"a", "e", "u", "s"})}


@pytest.mark.oracle
def test_conv2d_fuse(tvm):
    fb = FunctionBuilder("main")
    x, w, w2 = fb.param("x", "f32", (1, 16, 8, 8)), fb.param("w", "f32", (16, 16, 3, 3)), fb.param("w2", "f32", (16, 16, 3, 3))
    a = fb.emit("add", x, 1.0, name="a")
    c1 = fb.emit("nn.conv2d", a, w, padding=[1, 1], name="c1")
    y1 = fb.emit("add", c1, 1.0, name="y1")
    y2 = fb.emit("add", y1, c1, name="y2")
    c2 = fb.emit("nn.conv2d", y2, w, padding=[1, 1], name="c2")
    y3 = fb.emit("add", c2, 1.0, name="y3")
    c3 = fb.emit("nn.conv2d", y2, w2, padding=[1, 1], name="c3")
    out = fb.emit("add", c3, y3, name="out")
    # c2's epilogue y3 takes the anchor and then absorbs out, so c3 stays alone (TVM agrees)
    assert check(fb.ret(out)) == {frozenset({"c1", "y1", "y2"}), frozenset({"c2", "y3", "out"})}


@pytest.mark.oracle
def test_concatenate(tvm):
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (1, 16, 8, 8))
    p = fb.emit("nn.max_pool2d", x, pool_size=[2, 2], strides=[2, 2], name="p")
    u = fb.emit("broadcast_to", p, shape=[2, 1, 16, 4, 4], name="u")
    r = fb.emit("reshape", u, shape=[1, 32, 4, 4], name="r")
    c = fb.emit("concat", (r, r), axis=1, name="c")
    out = fb.emit("add", c, 1.0, name="out")
    check(fb.ret(out))


@pytest.mark.oracle
def test_tuple_root_and_intermediate(tvm):
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (1, 16, 8, 8))
    a = fb.emit("nn.relu", x, name="a")
    b = fb.emit("add", a, 1.0, name="b")
    c = fb.emit("exp", a, name="c")
    d = fb.emit("concat", (b, c), axis=1, name="d")
    e = fb.emit("add", d, 1.0, name="e")
    check(fb.ret(e))
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4, 4))
    a = fb.emit("exp", x, name="a")
    b = fb.emit("concat", (a, a), axis=0, name="b")
    check(fb.ret(b))


@pytest.mark.oracle
def test_tuple_consecutive(tvm):
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (1, 8, 4, 4))
    outs = [fb.emit("add", x, float(i), name=f"a{i}") for i in range(3)]
    c1 = fb.emit("concat", tuple(outs), axis=1, name="c1")
    c2 = fb.emit("concat", (c1, c1), axis=1, name="c2")
    p = fb.emit("nn.max_pool2d", c2, pool_size=[2, 2], strides=[2, 2], name="p")
    out = fb.emit("add", p, 1.0, name="out")
    check(fb.ret(out))


@pytest.mark.oracle
def test_inception_like(tvm):
    fb = FunctionBuilder("main")
    x, w = fb.param("x", "f32", (1, 4, 8, 8)), fb.param("w", "f32", (4, 4, 3, 3))
    c1 = fb.emit("nn.conv2d", x, w, padding=[1, 1], name="c1")
    r1 = fb.emit("nn.relu", c1, name="r1")
    c2 = fb.emit("nn.conv2d", x, w, padding=[0, 1, 2, 1], name="c2")
    r2 = fb.emit("nn.relu", c2, name="r2")
    cat = fb.emit("concat", (r1, r2), axis=1, name="cat")
    out = fb.emit("add", cat, 1.0, name="out")
    assert check(fb.ret(out)) == {frozenset({"c1", "r1"}), frozenset({"c2", "r2"}), frozenset({"cat", "out"})}


@pytest.mark.oracle
def test_fuse_tuple_get_elemwise_and_root(tvm):
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4, 8))
    t = fb.emit("split", x, indices_or_sections=2, axis=1, name="t")
    a = fb.item(t, 0, name="a")
    b = fb.item(t, 1, name="b")
    s = fb.emit("sigmoid", a, name="s")
    out = fb.emit("multiply", s, b, name="out")
    check(fb.ret(out))
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4, 8))
    t = fb.emit("split", x, indices_or_sections=2, axis=1, name="t")
    a = fb.item(t, 0, name="a")
    check(fb.ret(a))


@pytest.mark.oracle
@pytest.mark.parametrize("depth,expected", [
    (1, set()), (2, {frozenset("ab"), frozenset("cd")}), (3, {frozenset("abc")}), (4, {frozenset("abcd")}),
])
def test_fuse_max(tvm, depth, expected):
    assert check(chain(4), max_depth=depth) == expected


@pytest.mark.oracle
def test_multiple_paths(tvm):
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4, 8))
    t = fb.emit("permute_dims", x, name="t")
    s = fb.emit("sum", t, axis=[1], name="s")
    e = fb.emit("exp", x, name="e")
    m = fb.emit("sum", e, axis=[1], name="m")
    out = fb.emit("add", m, 1.0, name="out")
    assert check(fb.ret(s, out)) == {frozenset({"e", "m"})}


@pytest.mark.oracle
def test_extern_ref_in_the_middle(tvm):
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4, 4))
    a = fb.emit("exp", x, name="a")
    b = fb.emit("exp", a, name="b")
    c = fb.emit("add", a, b, name="c")
    d = fb.emit("nn.relu", c, name="d")
    assert check(fb.ret(b, d)) == {frozenset({"c", "d"})}


@pytest.mark.oracle
def test_softmax_and_layer_norm_silu(tvm):
    fb = FunctionBuilder("main")
    x, g = fb.param("x", "f32", (4, 8)), fb.param("g", "f32", (8,))
    a = fb.emit("add", x, 1.0, name="a")
    s = fb.emit("nn.softmax", a, name="s")
    ln = fb.emit("nn.layer_norm", s, g, g, name="ln")
    out = fb.emit("nn.silu", ln, name="out")
    check(fb.ret(out))


@pytest.mark.oracle
def test_ew_used_by_matmul_and_relu(tvm):
    fb = FunctionBuilder("main")
    x, w = fb.param("x", "f32", (8, 8)), fb.param("w", "f32", (8, 8))
    r = fb.emit("nn.relu", x, name="r")
    m = fb.emit("matmul", x, w, name="m")
    out = fb.emit("add", m, r, name="out")
    check(fb.ret(out))


@pytest.mark.oracle
def test_matmul_bias_add_and_pure_broadcast(tvm):
    for bias_shape, fused in [((8, 1), True), ((1, 8), False)]:
        fb = FunctionBuilder("main")
        x, w, c = fb.param("x", "f32", (8, 1)), fb.param("w", "f32", (1, 1)), fb.param("c", "f32", bias_shape)
        m = fb.emit("matmul", x, w, name="m")
        e = fb.emit("add", m, c, name="e")
        assert (check(fb.ret(e)) == {frozenset({"m", "e"})}) == fused


@pytest.mark.oracle
def test_dead_group(tvm):
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4, 4))
    fb.emit("nn.relu", fb.emit("exp", x, name="dead1"), name="dead2")
    out = fb.emit("add", x, 1.0, name="out")
    mod = Module([fb.ret(out)])
    fused = fuse_ops(mod)
    assert [b.var.name for b in fused["main"].bindings] == ["out"]  # TVM drops the dead group


def test_opt_level_zero_and_inputs_untouched():
    func = chain(4)
    mod = Module([func])
    before = mod.script()
    assert dpl.structural_equal(fuse_ops(mod, opt_level=0), mod)
    fuse_ops(mod)
    assert mod.script() == before


def test_calls_of_functions_are_opaque_and_primitive_functions_skipped():
    inner = FunctionBuilder("f", attrs={"Primitive": True})
    a = inner.param("a", "f32", (4,))
    f = inner.ret(inner.emit("nn.relu", inner.emit("exp", a)))
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4,))
    e = fb.emit("exp", x, name="e")
    c = fb.call(f, e, name="c")
    out = fb.emit("exp", c, name="out")
    mod = Module([f, fb.ret(out)])
    fused = fuse_ops(mod)
    assert dpl.structural_equal(fused["f"], f)
    assert [b.var.name for b in fused["main"].bindings] == ["e", "c", "out"]


def test_identical_groups_share_one_function():
    fused = fuse_ops(Module([chain(7)]), max_depth=2)
    main = fused["main"]
    callees = [b.value.op.name for b in main.bindings if isinstance(b.value.op, dpl.GlobalVar)]
    assert callees == ["fused_exp_exp"] * 3 and len(fused.functions) == 2


# -- random DAGs -------------------------------------------------------------------------------


class RandomDag:
    UNARY = ["exp", "nn.relu", "sigmoid", "tanh", "negative"]
    BINARY = ["add", "multiply", "subtract", "maximum"]

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def pick(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def build(self):
        r = self.rng
        fb = FunctionBuilder("main")
        pool = [fb.param("x", "f32", (8, 8)), fb.param("y", "f32", (8, 8))]
        if r.random() < 0.5:
            pool.append(fb.param("b", "f32", (8,)))
        if r.random() < 0.3:
            pool.append(fb.param("col", "f32", (8, 1)))
        seen = set()
        n = int(r.integers(3, 14))
        made = []
        for k in range(n * 3):
            if len(made) >= n:
                break
            try:
                v = self.op(fb, pool, seen, f"v{len(made)}")
            except dpl.DplError:
                continue
            if v is not None:
                pool.append(v)
                made.append(v)
        if not made:
            made.append(fb.emit("exp", pool[0], name="v0"))
        outs = [made[-1]]
        if r.random() < 0.4 and len(made) > 2:
            mid = made[int(r.integers(len(made) - 1))]
            outs.insert(0, mid)
        return fb.ret(*outs)

    def op(self, fb, pool, seen, name):
        r = self.rng
        recent = pool[-4:] if r.random() < 0.7 else pool
        x = self.pick(recent)
        y = self.pick(pool)
        kind = self.pick(["unary", "unary", "binary", "binary", "bias", "reduce", "inject", "matmul", "softmax", "concat", "split", "take", "slice"])
        if x.ty.ndim == 0 and kind not in ("unary", "binary"):
            return None
        if kind == "unary":
            key = (kind, id(x), self.pick(self.UNARY))
            op, args, attrs = key[2], (x,), {}
        elif kind in ("binary", "bias"):
            if kind == "bias":
                y = self.pick([p for p in pool if p.ty.ndim == 1] or [y])
            op, args, attrs = self.pick(self.BINARY), (x, y), {}
        elif kind == "reduce":
            op, args, attrs = self.pick(["sum", "max", "mean"]), (x,), {"axis": [x.ty.ndim - 1], "keepdims": bool(r.integers(2))}
        elif kind == "inject":
            choice = self.pick(["permute_dims", "reshape", "expand_squeeze"])
            if choice == "permute_dims":
                op, args, attrs = "permute_dims", (x,), {}
            elif choice == "reshape":
                op, args, attrs = "reshape", (x,), {"shape": [int(np.prod(x.ty.shape))]} if x.ty.ndim > 1 else {"shape": [1, x.ty.shape[0]]}
            else:
                op, args, attrs = "expand_dims", (x,), {"axis": [0]}
        elif kind == "matmul":
            op, args, attrs = "matmul", (x, y), {}
        elif kind == "softmax":
            op, args, attrs = "nn.softmax", (x,), {}
        elif kind == "concat":
            op, args, attrs = "concat", (dpl.Tuple((x, y)),), {"axis": 0}
        elif kind == "split":
            if x.ty.ndim == 0 or x.ty.shape[-1] % 2:
                return None
            t = fb.emit("split", x, indices_or_sections=2, axis=-1, name=name + "_t")
            return fb.item(t, int(r.integers(2)), name=name)
        elif kind == "take":
            op, args, attrs = "take", (x, const(np.array([0, 0], np.int64))), {"axis": 0}
        else:
            op, args, attrs = "strided_slice", (x,), {"axes": [0], "begin": [int(r.integers(0, 2))], "end": [4]}
        sig = (op, tuple(id(a) for a in args), repr(attrs))
        if sig in seen:
            return None
        seen.add(sig)
        return fb.emit(op, *args, name=name, **attrs)


@pytest.mark.oracle
def test_random_dags_match_tvm(tvm):
    mismatches = []
    with_groups = 0
    for seed in range(300):
        func = RandomDag(seed).build()
        mod = Module([func])
        fused = fuse_ops(mod)
        got = dpl_fusion_groups(func, fused)
        want = tvm_fusion_groups(func)
        with_groups += bool(want)
        if got != want:
            mismatches.append((seed, got, want))
            continue
        rng = np.random.default_rng(seed)
        args = [rng.standard_normal(tuple(p.ty.shape)).astype(np.float32) for p in func.params]
        a, b = dpl.interpret(mod, *args), dpl.interpret(fused, *args)
        for u, v in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
            np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-5)
    assert not mismatches, mismatches[:3]
    assert with_groups >= 150  # the corpus really exercises fusion (189 of 300 have live groups)


NESTED = """
func main(a: f32[1, 4, 8, 8], w: f32[4, 4, 3, 3], t: f32[1, 4, 6, 6]) -> (f32[1, 4, 3, 3], f32[1, 8, 6, 6]) {
  b = add(nn.adaptive_avg_pool2d(nn.relu(a), output_size=[3, 3]), 1.0)
  c = exp(b)
  s = split(exp(nn.conv2d(a, w)), indices_or_sections=2, axis=1)
  d = concat((multiply(s[0], 2.0), tanh(t), s[1]), axis=1)
  return (c, sigmoid(d))
}"""

FLAT = """
func main(a: f32[1, 4, 8, 8], w: f32[4, 4, 3, 3], t: f32[1, 4, 6, 6]) -> (f32[1, 4, 3, 3], f32[1, 8, 6, 6]) {
  b_0 = nn.relu(a)
  b_1 = nn.adaptive_avg_pool2d(b_0, output_size=[3, 3])
  b = add(b_1, 1.0)
  c = exp(b)
  s_0 = nn.conv2d(a, w)
  s_1 = exp(s_0)
  s = split(s_1, indices_or_sections=2, axis=1)
  d_0 = s[0]
  d_1 = multiply(d_0, 2.0)
  d_2 = tanh(t)
  d_3 = s[1]
  d = concat((d_1, d_2, d_3), axis=1)
  ret_0 = sigmoid(d)
  return (c, ret_0)
}"""


def test_nested_calls_are_bindings_of_their_own():
    """A nested call is its own node, as in Relax (whose BlockBuilder binds every nested call):
    an opaque op inside an elementwise binding stays out of the group, and FuseOps on the nested
    text equals FuseOps on its flat twin."""
    from dpl.transform.normalize import normalize_function

    nested, flat = dpl.parse(NESTED), dpl.parse(FLAT)
    assert dpl.structural_equal(normalize_function(nested["main"]), flat["main"])
    assert normalize_function(flat["main"]) is flat["main"]  # already flat: untouched
    fused = fuse_ops(nested)
    assert dpl.structural_equal(fused, fuse_ops(flat))
    assert not any("adaptive_avg_pool2d" in str(f) for f in fused.functions.values() if "Primitive" in f.attrs)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(tuple(p.ty.shape)).astype(np.float32) for p in nested["main"].params]
    for x, y in zip(dpl.interpret(nested, *args), dpl.interpret(fused, *args)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    assert dpl.structural_equal(nested, dpl.parse(NESTED))  # the input is not changed


@pytest.mark.oracle
def test_flat_twin_of_nested_calls_matches_tvm(tvm):
    check(dpl.parse(FLAT)["main"])
