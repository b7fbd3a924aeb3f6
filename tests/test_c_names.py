"""Generated code has a namespace of its own: a kernel's buffers, symbolic dims, loop variables
and locals are spelled by one allocator (backends/cgen/names.py), so no dpl name — ``i0`` (a
name the lowering gives loops), ``n``, a C keyword, a C library function, one of the
emitter's own ``dpl_`` names, or two names equal once made C identifiers — can make one C
identifier stand for two values. The reproducers of issue 20 run on ``cpu``; a hypothesis
property draws names from all of that space and checks the numbers on ``cpu`` and on the
CUDA kernels' host twin."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import needs

import dpl
from dpl.backends.cgen.emitter import emit_kernel
from dpl.backends.cgen.names import CNames, EmitError
from dpl.backends.cpu.backend import CpuBackend
from dpl.backends.cuda.emitter import emit_cuda
from dpl.ir import FunctionBuilder, Module
from dpl.kernel import lower_function
from dpl.kernel.ir import Buffer, Kernel, Let, Load, Loop, Store, Var

ALWAYS = dpl.FusionConfig(min_nodes_for_fusion=1, min_tensor_elements=0, fallback_on_error=False)

# names from the whole identifier space: the lowering's own hints (loops i<k>, reductions r,
# locals), dims, C keywords and library names, the emitter's names, and names that differ only
# in characters C does not allow
NAMES = ["i0", "i1", "i2", "i0_1", "r", "r_1", "n", "m", "x", "y", "acc", "rowsum", "out", "int", "for",
         "double", "return", "exp", "sqrt", "NAN", "INFINITY", "buffers", "dims", "dpl_n", "dpl_i", "dpl_row0",
         "dpl_nan0", "dpl_fold", "v_x", "v_i0", "a.b", "a_b", "a-b", "é", "_", "y_out"]


@pytest.fixture(scope="module")
def cpu(tmp_path_factory):
    needs.c_compiler()
    return CpuBackend(cache_dir=tmp_path_factory.mktemp("kernels"))


def run_on_cpu(cpu, mod, *args, config=ALWAYS):
    """What ``mod`` computes on ``cpu``, after checking that every function ran compiled there."""
    exe = dpl.build(mod, [cpu, "numpy"], config=config)
    got = exe(*args)
    for choice in exe.choices.values():
        assert choice.backend.name == "cpu" and not choice.by_fallback, exe.summary()
    return got


# -- the reproducers of issue 20 ------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3, 5), (20000, 2), (2, 20000)])
def test_dims_named_like_loop_variables(cpu, shape):
    mod = dpl.parse("func main(x: f32[i1, i0]) -> f32[i1, i0] {\n  y = exp(x)\n  return y\n}")
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(run_on_cpu(cpu, mod, x), dpl.interpret(mod, x), rtol=1e-6)


def test_binding_named_like_a_dim_under_default_apply(cpu):
    mod = dpl.parse("func main(x: i64[m, n], y: i64[m, 1]) -> i64[m, n] {\n  n = add(y, 1000)\n  a = add(x, n)\n"
                    "  b = multiply(a, n)\n  return b\n}")
    rng = np.random.default_rng(1)
    x, y = rng.integers(-50, 50, (1024, 6)), rng.integers(-50, 50, (1024, 1))
    got = run_on_cpu(cpu, dpl.apply(mod), x, y, config=None)
    np.testing.assert_array_equal(got, dpl.interpret(mod, x, y))


def test_onnx_input_with_dim_params_named_like_loop_variables(cpu):
    onnx = needs.package("onnx")
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["i1", "i0"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["i1", "i0"])
    nodes = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Mul", ["e", "x"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    mod = dpl.from_onnx(model)
    a = np.random.default_rng(2).standard_normal((5, 3)).astype(np.float32)
    got = run_on_cpu(cpu, dpl.apply(mod), a)
    np.testing.assert_allclose(got, np.exp(a) * a, rtol=1e-6)


# -- the allocator ----------------------------------------------------------------------------------


def test_names_equal_after_sanitising_stay_apart():
    body = [Loop(Var("i0"), Var("a.b"), [Let("a-b", Load("a_b", (Var("i0"),))),
                                         Store("out", (Var("i0"),), Var("a-b", "float32"))])]
    k = Kernel("k", [Buffer("a_b", ("a.b",))], [Buffer("out", ("a.b",))], body)
    names = CNames(k)
    spelled = [names["a.b"], names.buffer("a_b"), names.buffer("out"), names["i0"], names["a-b"]]
    assert len(set(spelled)) == len(spelled) and all(s.startswith("v_") for s in spelled)
    assert names.internal("row") != names.internal("row")


def test_a_buffer_may_be_named_like_a_dim():
    body = [Loop(Var("i"), Var("x"), [Store("y", (Var("i"),), Load("x", (Var("i"),)))])]
    k = Kernel("k", [Buffer("x", ("x",))], [Buffer("y", ("x",))], body)
    names = CNames(k)
    assert names["x"] != names.buffer("x")


def test_a_definition_shadowing_a_dim_is_refused():
    body = [Loop(Var("n"), Var("n"), [Store("y", (Var("n"),), Load("x", (Var("n"),)))])]
    k = Kernel("k", [Buffer("x", ("n",))], [Buffer("y", ("n",))], body)
    with pytest.raises(EmitError, match="defines 'n'"):
        emit_kernel(k)


def test_lowering_keeps_dims_out_of_its_names():
    fn = dpl.parse("func main(x: f32[i0, r], y: f32[i0, 1]) -> f32[i0, r] {\n  i1 = add(y, 1.0)\n"
                   "  s = sum(x, axis=[-1], keepdims=true)\n  o = multiply(add(x, i1), divide(i1, s))\n  return o\n}")["main"]
    k = lower_function(fn)
    CNames(k)  # raises on any shadowing
    defined = {s.name for s in _defs(k.body)} | {s.var.name for s in _loops(k.body)}
    assert not defined & set(k.dims)


def _defs(stmts):
    from dpl.kernel.ir import Reduce, walk

    return [s for s in walk(stmts) if isinstance(s, (Let, Reduce))]


def _loops(stmts):
    from dpl.kernel.ir import Reduce, walk

    out = [s for s in walk(stmts) if isinstance(s, Loop)]
    return out + [a for s in walk(stmts) if isinstance(s, Reduce) for a in s.axes]


# -- the property ---------------------------------------------------------------------------------


@st.composite
def named_module(draw):
    """A module with a broadcast, a twice-used local, a row reduction and a row loop, every
    parameter, binding and dim named from NAMES; and its input shapes."""
    dims = draw(st.lists(st.sampled_from(NAMES), min_size=2, max_size=2, unique=True))
    values = draw(st.lists(st.sampled_from(NAMES), min_size=7, max_size=7, unique=True))
    fb = FunctionBuilder("main")
    x = fb.param(values[0], "float32", dims)
    y = fb.param(values[1], "float32", [dims[0], 1])
    a = fb.emit("add", x, y, name=values[2])
    b = fb.emit("tanh", a, name=values[3])
    c = fb.emit("multiply", b, a, name=values[4])
    s = fb.emit("max", c, axis=[-1], keepdims=True, name=values[5])
    o = fb.emit("subtract", c, s, name=values[6])
    mod = Module([fb.ret(o)])
    shape = (draw(st.integers(1, 9)), draw(st.integers(1, 40)))
    return mod, shape


def _inputs(mod, shape, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(np.float32), rng.standard_normal((shape[0], 1)).astype(np.float32)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=named_module())
def test_any_names_give_the_interpreters_numbers_on_cpu(cpu, case):
    mod, shape = case
    args = _inputs(mod, shape)
    got = run_on_cpu(cpu, dpl.apply(mod), *args)  # one fused kernel per module
    np.testing.assert_allclose(got, dpl.interpret(mod, *args), rtol=1e-5, atol=1e-6)


def test_any_names_give_the_interpreters_numbers_on_the_cuda_twin(cxx):
    """The same property on the host twin of the CUDA kernels, 30 drawn modules built in one
    compiler run (a thread per row and a block per row)."""
    from dpl.backends.cuda.host import HostTwin

    cases = []

    @settings(max_examples=30, deadline=None, database=None)
    @given(case=named_module())
    def collect(case):
        cases.append(case)

    collect()
    sources = []
    for i, (mod, _) in enumerate(cases):
        kernel = lower_function(mod["main"])
        sources += [emit_cuda(kernel, f"k{i}_thread", 10**9), emit_cuda(kernel, f"k{i}_block", 0)]
    twin = HostTwin(sources, block=8)
    for i, (mod, shape) in enumerate(cases):
        args = _inputs(mod, shape, i)
        want = dpl.interpret(mod, *args)
        for mode in ("thread", "block"):
            out = np.full_like(want, np.nan)
            twin.run(f"k{i}_{mode}", list(args), [out])
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6, err_msg=f"{mod}\n{mode} at {shape}")
