"""NaN, the infinities and -0.0 mean in every backend what they mean in the interpreter: the
inputs mix them with ordinary numbers and go through every elementwise op, every reduction, the
row ops, pooling and a convolution block, on ``cpu`` (generated C, checked to have run
compiled and never by fall-back), ``numpy`` and the host twin of the CUDA kernels. NaN lands
where the interpreter's NaN lands, infinities are the same infinities, the other numbers
agree to float32 rounding."""

import numpy as np
import pytest

import needs

import dpl
from dpl.backends.cpu.backend import CpuBackend
from dpl.backends.cuda.emitter import emit_cuda
from dpl.kernel import lower_function
from dpl.ir import FunctionBuilder, Module
from dpl.ops.registry import all_ops

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy warns on the very values tested
ALWAYS = dpl.FusionConfig(min_nodes_for_fusion=1, min_tensor_elements=0, fallback_on_error=False)
R, C = 8, 40  # rows long enough for the C compiler's vector loops, with a tail
X = f"f32[{R}, {C}]"

XY = {"x": (R, C), "y": (R, C)}
IMG = (2, 2, 8, 10)
NAN, INF = float("nan"), float("inf")
# ops with a C template, each with the arguments it takes here: (args, attrs); the other
# template ops take x (and y)
TEMPLATE_CALLS = {
    "clip": [(("x",), {"min": -1.5, "max": 2.0}), (("x",), {"min": -INF, "max": INF}), (("x",), {"min": 0.0, "max": INF})],
    "astype": [(("x",), {"dtype": "f64"}), (("x",), {"dtype": "f16"})],
}
CONSTANTS = [("multiply", ("x", NAN)), ("add", ("x", INF)), ("subtract", ("x", -INF)), ("multiply", ("x", -0.0)),
             ("add", ("x", -0.0)), ("maximum", ("x", NAN)), ("minimum", ("x", -INF)), ("maximum", ("x", 0.0)),
             ("minimum", (NAN, "x")), ("divide", ("x", 0.0)), ("divide", (-0.0, "x"))]
REDUCTIONS = ["sum", "prod", "max", "min", "mean", "variance"]


def _cases():
    """(label, parameters {name: shape}, steps [(op, args, attrs)]): the last step is returned;
    an argument is a parameter, an earlier step (``s<k>``) or a float constant."""
    out = []
    for name, op in sorted(all_ops().items()):
        if op.c_expr is None or name == "where":
            continue
        for args, attrs in TEMPLATE_CALLS.get(name, [(tuple("xy"[:op.num_args[0]]), {})]):
            label = f"{name}({', '.join(args)}{''.join(f', {k}={v}' for k, v in attrs.items())})"
            out.append((label, XY, [(name, args, attrs)]))
    for name, args in CONSTANTS:
        out.append((f"{name}{args}", XY, [(name, args, {})]))
    out.append(("where(x < y, x, y)", XY, [("less", ("x", "y"), {}), ("where", ("s0", "x", "y"), {})]))
    out.append(("where(x == x, x, nan)", XY, [("equal", ("x", "x"), {}), ("where", ("s0", "x", NAN), {})]))
    for name in REDUCTIONS:
        for axis in ([-1], [0], [0, 1]):
            out.append((f"{name}(axis={axis})", XY, [(name, ("x",), {"axis": axis})]))
    rows = {"x": (R, C), "w": (C,), "b": (C,)}
    out += [("nn.softmax", rows, [("nn.softmax", ("x",), {})]),
            ("nn.log_softmax", rows, [("nn.log_softmax", ("x",), {})]),
            ("nn.softmax(axis=0)", rows, [("nn.softmax", ("x",), {"axis": 0})]),
            ("nn.rms_norm", rows, [("nn.rms_norm", ("x", "w"), {"axes": [-1], "epsilon": 1e-6})]),
            ("nn.layer_norm", rows, [("nn.layer_norm", ("x", "w", "b"), {"epsilon": 1e-5})])]
    pool = {"pool_size": 3, "strides": 2, "padding": 1}
    out += [("nn.max_pool2d", {"x": IMG}, [("nn.max_pool2d", ("x",), pool)]),
            ("nn.avg_pool2d", {"x": IMG}, [("nn.avg_pool2d", ("x",), pool)]),
            ("conv block", {"x": IMG, "w": (3, 2, 3, 3), "b": (1, 3, 1, 1)},
             [("nn.conv2d", ("x", "w"), {"padding": 1}), ("add", ("s0", "b"), {}), ("nn.relu", ("s1",), {})])]
    return out


def build_module(params, steps):
    fb = FunctionBuilder("main")
    env = {name: fb.param(name, "float32", shape) for name, shape in params.items()
           if any(name in args for _, args, _ in steps)}
    for k, (op, args, attrs) in enumerate(steps):
        env[f"s{k}"] = fb.emit(op, *(env[a] if isinstance(a, str) else a for a in args), name=f"s{k}", **attrs)
    return Module([fb.ret(env[f"s{len(steps) - 1}"])])


CASES = _cases()


def special(shape, seed: int) -> np.ndarray:
    """Normal numbers with NaN, +-inf, -0.0 and 0.0 mixed in; in 2-D the first row is issue 20's
    [nan, 1, -1, inf, -inf, 0, 2, -3] repeated, the second only finite numbers and signed zeros,
    the third +inf without NaN, the fourth -inf without NaN."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 2).astype(np.float32)
    flat = x.reshape(-1)
    mask = rng.random(flat.size) < 0.15
    flat[mask] = rng.choice(np.array([np.nan, np.inf, -np.inf, -0.0, 0.0], np.float32), int(mask.sum()))
    if x.ndim == 2 and x.shape[0] >= 4:
        x[0] = np.resize(np.array([np.nan, 1, -1, np.inf, -np.inf, 0, 2, -3], np.float32), x.shape[1])
        x[1] = np.where(rng.random(x.shape[1]) < 0.3, np.float32(-0.0), x[1])
        x[1][~np.isfinite(x[1])] = 1.0
        x[2] = np.where(np.isnan(x[2]) | (x[2] == -np.inf), np.float32(np.inf), x[2])
        x[3] = np.where(np.isnan(x[3]) | (x[3] == np.inf), np.float32(-np.inf), x[3])
    return x


def inputs(mod, seed: int = 0) -> list[np.ndarray]:
    return [special(tuple(p.ty.shape), seed + k) for k, p in enumerate(mod["main"].params)]


def assert_same(got, want, label: str, signed_zeros: bool = False) -> None:
    """NaN where the interpreter has NaN, the same infinities, the rest to float32 rounding;
    with ``signed_zeros`` (elementwise ops, where no summation order decides it) -0.0 where
    the interpreter has -0.0."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (label, got.dtype, want.dtype)
    if want.dtype == np.bool_:
        np.testing.assert_array_equal(got, want, err_msg=label)
        return
    g, w = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"{label}: NaN positions\n got {g}\nwant {w}")
    inf = np.isinf(w) | np.isinf(g)
    np.testing.assert_array_equal(g[inf], w[inf], err_msg=f"{label}: infinities")
    finite = np.isfinite(w) & np.isfinite(g)
    tol = 2e-3 if want.dtype == np.float16 else 1e-5
    scale = max(1.0, float(np.abs(w[finite]).max(initial=0.0)))
    np.testing.assert_allclose(g[finite], w[finite], rtol=tol, atol=tol * scale, err_msg=label)
    if signed_zeros:
        zero = (g == 0) & (w == 0)
        np.testing.assert_array_equal(np.signbit(g[zero]), np.signbit(w[zero]), err_msg=f"{label}: signed zeros")


def elementwise(steps) -> bool:
    return all(all_ops()[op].c_expr is not None for op, _, _ in steps)


@pytest.fixture(scope="module")
def cpu(tmp_path_factory):
    needs.c_compiler()
    return CpuBackend(cache_dir=tmp_path_factory.mktemp("kernels"))


def test_the_inputs_hold_every_special_value():
    x = special((R, C), 0)
    assert np.isnan(x).any() and np.isposinf(x).any() and np.isneginf(x).any()
    assert (np.signbit(x) & (x == 0)).any() and (~np.signbit(x) & (x == 0)).any()


def test_the_sweep_covers_every_template_op_and_reduction():
    labels = " ".join(label for label, _, _ in CASES)
    for name, op in all_ops().items():
        if op.c_expr is not None or name in REDUCTIONS:
            assert f"{name}(" in labels, name


@pytest.mark.parametrize("label, params, steps", CASES, ids=[c[0] for c in CASES])
def test_cpu(cpu, label, params, steps):
    """Generated C, fused as ``dpl.apply`` fuses, every function compiled for cpu (no fall-back)."""
    mod = build_module(params, steps)
    args = inputs(mod)
    exe = dpl.build(dpl.apply(mod), [cpu, "numpy"], config=ALWAYS)
    got = exe(*args)
    for choice in exe.choices.values():
        assert choice.backend.name == "cpu" and not choice.by_fallback, exe.summary()
    assert_same(got, dpl.interpret(mod, *args), label, elementwise(steps))


@pytest.mark.parametrize("label, params, steps", CASES, ids=[c[0] for c in CASES])
def test_numpy(label, params, steps):
    mod = build_module(params, steps)
    args = inputs(mod)
    assert_same(dpl.build(mod, "numpy")(*args), dpl.interpret(mod, *args), label, elementwise(steps))


def test_cuda_host_twin(cxx):
    """Every case as one CUDA kernel (a thread per row and a block per row), built in one
    compiler run for the host, at the launch the CUDA backend would use and on one block."""
    from dpl.backends.cuda.host import HostTwin

    kernels = []
    for i, (label, params, steps) in enumerate(CASES):
        mod = build_module(params, steps)
        kernel = lower_function(mod["main"])
        for mode, rows_from in (("thread", 10**9), ("block", 0)):
            kernels.append((f"{label} [{mode}]", mod, emit_cuda(kernel, f"k{i}_{mode}", rows_from), elementwise(steps)))
    twin = HostTwin([k[2] for k in kernels], block=8)
    for label, mod, source, zeros in kernels:
        args = inputs(mod)
        want = dpl.interpret(mod, *args)
        for grid in (None, 1):
            out = np.zeros_like(want)
            twin.run(source.name, args, [out], grid=grid)
            assert_same(out, want, f"{label} grid={grid}", zeros)


def test_cuda_sources_compile_with_nvrtc(nvrtc):
    """The sweep's CUDA kernels (NAN and INFINITY literals, NaN-propagating folds) through NVRTC."""
    from dpl.backends.cuda.emitter import CUDA_PRELUDE, HELPERS

    sources = [emit_cuda(lower_function(build_module(params, steps)["main"]), f"k{i}", 0)  # block rows: shuffles
               for i, (_, params, steps) in enumerate(CASES)]
    ptx = nvrtc.compile_ptx(CUDA_PRELUDE + HELPERS + "\n".join(s.function for s in sources), "sweep.cu")
    assert all(f".entry {s.name}(" in ptx for s in sources)
