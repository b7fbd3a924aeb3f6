"""``fuse_ops(mod, views=True)``: reshape, squeeze and expand_dims move no data, so they never
break an automatic group (symbolic shapes included); the default stays TVM-exact, and
``dpl.apply`` turns views on. Each module is built for cpu (compiled, no fall-back) and numpy
and compared with the interpreter on random inputs."""

import numpy as np
import pytest

import needs

import dpl
from dpl.ir import FunctionBuilder, Module
from dpl.ir.expr import Call
from dpl.ops.registry import OpPatternKind
from dpl.transform import fuse_ops
from dpl.transform.graph import binding_kind

ALWAYS = dpl.FusionConfig(min_nodes_for_fusion=1, max_graph_size=10_000, min_tensor_elements=0, fallback_on_error=False)


def epilogue_through_a_reshape(n="n"):
    """GPT-2's Conv1D: the product's rows viewed back as heads before the bias and the GELU,
    then an axis added and dropped around an exp."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (n, 32))
    mm = fb.emit("matmul", x, fb.param("w", "f32", (32, 64)), name="mm")
    back = fb.emit("reshape", mm, shape=[n, 4, 16], name="back")
    y = fb.emit("add", back, fb.param("b", "f32", (4, 16)), name="biased")
    g = fb.emit("nn.gelu", y, name="act")
    e = fb.emit("exp", fb.emit("expand_dims", g, axis=[1], name="up"), name="ex")
    return Module([fb.ret(fb.emit("squeeze", e, axis=[1], name="down"))])


def calls(mod: Module) -> list[str]:
    return [b.value.op if isinstance(b.value.op, str) else b.value.op.name for b in mod["main"].bindings
            if isinstance(b.value, Call)]


def group_bodies(mod: Module) -> list[list[str]]:
    return [[b.value.op for b in fn.bindings] for fn in mod.functions.values() if "Primitive" in fn.attrs]


@pytest.mark.parametrize("n", ["n", 6], ids=["symbolic", "static"])
def test_views_join_the_group_tvm_ends(n):
    mod = epilogue_through_a_reshape(n)
    exact, viewed = fuse_ops(mod), fuse_ops(mod, views=True)
    # TVM: the product stays alone (a reshape is Injective: no product epilogue), and with a
    # symbolic n the reshape too (Opaque); views: one group from the product to the squeeze
    assert calls(exact)[0] == "matmul"
    assert (calls(exact)[1] == "reshape") == isinstance(n, str)
    assert group_bodies(viewed) == [["matmul", "reshape", "add", "nn.gelu", "expand_dims", "exp", "squeeze"]]
    assert dpl.structural_equal(fuse_ops(mod, views=False), exact)


def test_view_kinds():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", 4, 8))
    r = fb.emit("reshape", x, shape=["n", 32], name="r")
    p = fb.emit("permute_dims", x, axes=[0, 2, 1], name="p")
    func = fb.ret(fb.emit("add", r, fb.emit("reshape", p, shape=["n", 32], name="rp"), name="s"))
    reshape, permute = func.bindings[0].value, func.bindings[1].value
    assert binding_kind(reshape) == OpPatternKind.OPAQUE  # TVM: symbolic reshape
    assert binding_kind(reshape, views=True) == OpPatternKind.ELEMWISE
    assert binding_kind(permute, views=True) == binding_kind(permute) == OpPatternKind.INJECTIVE  # moves data


def test_apply_turns_views_on_and_off():
    mod = epilogue_through_a_reshape()
    assert dpl.structural_equal(dpl.apply(mod), fuse_ops(mod, views=True))
    assert dpl.structural_equal(dpl.apply(mod, views=False), fuse_ops(mod))


@pytest.mark.parametrize("target", ["cpu", "numpy"])
@pytest.mark.parametrize("views", [False, True])
@pytest.mark.parametrize("n", ["n", 6], ids=["symbolic", "static"])
def test_views_build_and_equal_the_interpreter(n, views, target):
    if target == "cpu":
        needs.c_compiler()
    mod = epilogue_through_a_reshape(n)
    exe = dpl.build(fuse_ops(mod, views=views), target, config=ALWAYS)
    rng = np.random.default_rng(3)
    args = [rng.standard_normal(tuple(6 if isinstance(d, str) else d for d in p.ty.shape)).astype("float32")
            for p in mod["main"].params]
    np.testing.assert_allclose(exe(*args), dpl.interpret(mod, *args), rtol=1e-4, atol=1e-4)
    if target == "cpu":
        summary = exe.summary()
        assert "fall-back" not in summary.split("plan for")[0], summary


def test_a_lone_symbolic_view_is_not_reported_opaque():
    """Between two composites a reshape of a symbolic shape stays alone; coverage says why (a
    view the runtime aliases), not "opaque by nature" as TVM's kind would have it."""
    fb = FunctionBuilder("main")
    x, w = fb.param("x", "f32", ("n", 64)), fb.param("w", "f32", (16,))
    heads = fb.emit("reshape", fb.emit("nn.rms_norm", x, fb.param("g", "f32", (64,)), name="n1"), shape=["n", 4, 16], name="heads")
    mod = Module([fb.ret(fb.emit("nn.rms_norm", heads, w, name="n2"))])
    trace = dpl.Trace()
    dpl.apply(mod, ["llm"], trace=trace)
    [lone] = trace.coverage()["main"].alone
    assert (lone.binding, lone.op, lone.reason) == ("heads", "reshape", "view"), lone
