"""What an op computes where NumPy, C and the kernels could each answer their own way (see
"Numerical contract" in docs/architecture.md): ``clip`` with min > max, integer and bool
``mean``/``variance``, float32 accumulation near FLT_MAX, and the registry sweep — every op x
dtype its type rule accepts, the interpreter computes. Each checks the interpreter against a
definition, then the default CPU path and the CUDA host twin against the interpreter."""

import itertools
import math
import warnings
from fractions import Fraction

import numpy as np
import pytest

import needs

import dpl
from dpl import dtypes
from dpl.backends.cuda.emitter import emit_cuda
from dpl.backends.cuda.host import HostTwin
from dpl.errors import DplError, TypeInferenceError
from dpl.ir import FunctionBuilder
from dpl.ir.expr import Tuple
from dpl.kernel import LoweringError, lower_function
from dpl.ops.registry import all_ops, make_call

DTYPES = ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"]
INTS = ["bool", "int8", "uint8", "int16", "int32", "int64"]


def default_cpu(text: str, *args, compiled: bool = True):
    """``text`` on the default path, ``build(apply(mod, ["rewrites", "llm"]), "cpu")``, beside
    the interpreter: (interpreter, cpu). ``compiled``: every group ran on cpu, none by fall-back."""
    needs.c_compiler()
    mod = dpl.parse(text)
    exe = dpl.build(dpl.apply(mod, ["rewrites", "llm"]), "cpu")
    got = exe(*args)
    if compiled:
        assert "fall-back" not in exe.summary(), exe.summary()
    return dpl.interpret(mod, *args), got


def twin_run(cxx, cases):
    """Each ``(function, args)`` through its CUDA kernel on the host twin, all built at once: a
    result per case, or None where the function has no kernel (a LoweringError)."""
    sources, runs = [], []
    for i, (fn, args) in enumerate(cases):
        try:
            kernel = lower_function(fn)
        except LoweringError:
            runs.append(None)
            continue
        for mode, rows_from in (("t", 10**9), ("b", 0)):  # a thread per row, a block per row
            sources.append(emit_cuda(kernel, f"k{i}_{mode}", rows_from))
        runs.append(i)
    if not sources:
        return runs
    twin = HostTwin(sources, block=8)
    results = []
    for i, (fn, args) in zip(runs, cases):
        if i is None:
            results.append(None)
            continue
        want = dpl.interpret(fn, *args)
        per_mode = []
        for mode in "tb":
            out = np.full_like(want, np.nan) if dtypes.is_float_numpy(want.dtype) else np.zeros_like(want)
            twin.run(f"k{i}_{mode}", args, [out], grid=3)
            per_mode.append(out)
        results.append(per_mode)
    return results


def _dims(shape) -> str:
    return ", ".join(map(str, shape))


def unary_text(op: str, dtype: str, shape, out_shape, attrs: str = "") -> str:
    short = dtypes.short(dtype)
    return f"func main(x: {short}[{_dims(shape)}]) -> {short}[{_dims(out_shape)}] {{\n  y = {op}(x{attrs})\n  return y\n}}\n"


def calls_text(op: str, dtype: str, calls) -> str:
    """One function of several ``op`` calls, each ``(operand shape, attributes, result shape)``
    on an operand of its own, returning them all: one build for a whole table of cases."""
    t = dtypes.short(dtype)
    params = ", ".join(f"x{i}: {t}[{_dims(shape)}]" for i, (shape, _, _) in enumerate(calls))
    results = ", ".join(f"{t}[{_dims(out)}]" for _, _, out in calls)
    body = "".join(f"  y{i} = {op}(x{i}{attrs})\n" for i, (_, attrs, _) in enumerate(calls))
    names = ", ".join(f"y{i}" for i in range(len(calls)))
    return f"func main({params}) -> ({results}) {{\n{body}  return ({names})\n}}\n"


def same(a, b) -> bool:
    """Equal values, zeros of the same sign, NaN where NaN, same dtype."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if dtypes.is_float_numpy(a.dtype):
        a, b = a.astype(np.float64), b.astype(np.float64)
        return bool(np.all(((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b))))
    return bool(np.all(a == b))


# -- clip: NumPy's minimum(maximum(x, min), max) --------------------------------------------------

CLIP_BOUNDS = [(2.0, 1.0), (1.0, 2.0), (0.5, 0.5), (-1.5, -3.0), (0.0, -0.0), (-0.0, 0.0), (float("nan"), 1.0),
               (0.0, float("nan"))]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "int8"])
def test_clip_is_numpy_clip_even_with_min_above_max(dtype, cxx):
    np_dtype = dtypes.to_numpy(dtype)
    x = np.array([-4, -2, 0, 0.5, 1, 1.5, 2, 3, 7, -0.0], np.float64)
    if dtypes.is_float(dtype):
        x = np.concatenate([x, [np.nan, np.inf, -np.inf]])
    x = x.astype(np_dtype)
    bounds = [b for b in CLIP_BOUNDS if dtypes.is_float(dtype) or not any(map(math.isnan, b))]
    calls = [(x.shape, f", min={lo!r}, max={hi!r}", x.shape) for lo, hi in bounds]
    refs, cpus = default_cpu(calls_text("clip", dtype, calls), *[x] * len(calls))
    for (lo, hi), ref, cpu in zip(bounds, refs, cpus):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = np.clip(x, lo, hi).astype(np_dtype)
        if lo > hi:  # NumPy's definition, not an accident of np.clip
            assert np.all(want[~np.isnan(x)] == np.asarray(hi).astype(np_dtype))
        assert same(ref, want), (lo, hi, ref, want)
        assert same(cpu, ref), (lo, hi, cpu, ref)
    cases = [(dpl.parse(unary_text("clip", dtype, shape, out, attrs))["main"], [x]) for shape, attrs, out in calls]
    for (lo, hi), (fn, _), outs in zip(bounds, cases, twin_run(cxx, cases)):
        for out in outs:
            assert same(out, dpl.interpret(fn, x)), (lo, hi, out)


# -- integer and bool mean / variance --------------------------------------------------------------


def exact_moment(op: str, values, dtype: str):
    """The IR's definition, in exact rationals: the real mean (population variance) rounded
    toward zero and wrapped into the dtype; for bool, whether it is not 0; over nothing, 0."""
    values = [int(v) for v in values]
    if not values:
        real = Fraction(0)
    else:
        mean = Fraction(sum(values), len(values))
        real = mean if op == "mean" else sum((v - mean) ** 2 for v in values) / len(values)
    if dtype == "bool":
        return real != 0
    info = np.iinfo(dtype)
    span = int(info.max) - int(info.min) + 1
    return (int(real) - int(info.min)) % span + int(info.min)  # int() truncates toward zero


def moment_rows(dtype: str, rng) -> dict[int, np.ndarray]:
    """Rows of 4 and of 9 values, by length: small ones (means and variances that are not
    integers), the dtype's extremes, the issue's [-1, -2, 0, 0], and a variance of exactly 2
    whose float64 form is not."""
    np_dtype = dtypes.to_numpy(dtype)
    if dtype == "bool":
        fours = [[1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 0]]
        return {4: np.array(fours, bool), 9: rng.random((4, 9)) < 0.5}
    info = np.iinfo(np_dtype)
    lo, hi = int(info.min), int(info.max)
    fours = [[lo, hi, 0, 0], [hi, hi, hi - 1, hi]] + [rng.integers(max(lo, -9), 10, 4) for _ in range(2)]
    nines = [rng.integers(max(lo, -9), 10, 9) for _ in range(2)]
    if lo < 0:
        fours += [[-1, -2, 0, 0], [lo, lo, lo + 1, -1]]
        nines += [[4, 1, -1, -1, 0, 0, 0, 0, 0]]
    return {4: np.array(fours).astype(np_dtype), 9: np.array(nines).astype(np_dtype)}


@pytest.mark.parametrize("op", ["mean", "variance"])
@pytest.mark.parametrize("dtype", INTS)
def test_integer_mean_and_variance(op, dtype, cxx):
    """Along the last axis of each table of rows, over a whole row (the issue's 1-D reproducer),
    and down the columns with keepdims: the interpreter against the definition, then the default
    CPU path and the host twin against the interpreter."""
    rows = moment_rows(dtype, np.random.default_rng(INTS.index(dtype)))
    grid = np.resize(rows[4], (4, 6))
    args = [rows[4], rows[9], rows[4][-1], grid]
    calls = [(rows[4].shape, ", axis=[1]", rows[4].shape[:1]), (rows[9].shape, ", axis=[1]", rows[9].shape[:1]),
             ((4,), "", ()), ((4, 6), ", axis=[0], keepdims=true", (1, 6))]
    wide = dtype == "int64" or (op == "variance" and dtype == "int32")  # exact only past 64 bits
    refs, cpus = default_cpu(calls_text(op, dtype, calls), *args, compiled=not wide)
    for arg, (_, attrs, _), ref, cpu in zip(args, calls, refs, cpus):
        lines = arg.T if "axis=[0]" in attrs else arg.reshape(-1, arg.shape[-1])
        assert ref.dtype == arg.dtype
        assert [v.item() for v in ref.ravel()] == [exact_moment(op, r.tolist(), dtype) for r in lines], (arg, ref)
        assert same(cpu, ref), (arg, cpu, ref)
    empty = np.zeros((3, 0), dtypes.to_numpy(dtype))
    assert same(dpl.interpret(dpl.parse(unary_text(op, dtype, (3, 0), (3,), ", axis=[1]")), empty),
                np.zeros(3, empty.dtype))
    cases = [(dpl.parse(unary_text(op, dtype, shape, out, attrs))["main"], [arg]) for (shape, attrs, out), arg in zip(calls, args)]
    for (fn, fn_args), outs in zip(cases, twin_run(cxx, cases)):
        if wide:  # no kernel: the group runs on the reference
            assert outs is None
            continue
        for out in outs:
            assert same(out, dpl.interpret(fn, *fn_args)), (fn_args, out)


# -- the accumulation contract ---------------------------------------------------------------------

BIG = 2e19  # its square, 4e38, is past FLT_MAX (3.4e38); 3e38 + 3e38 is too

# (IR text, inputs, what float32 accumulation gives, what a float64 reference would have given)
CONTRACT = [
    ("func main(x: f32[1, 4], w: f32[4]) -> f32[1, 4] {\n  y = nn.rms_norm(x, w)\n  return y\n}\n",
     [np.array([[BIG, BIG, 1, 1]], np.float32), np.ones(4, np.float32)],
     np.zeros((1, 4), np.float32), "x^2 overflows: x / inf"),
    ("func main(x: f32[2]) -> f32[] {\n  y = variance(x)\n  return y\n}\n",
     [np.array([BIG, -BIG], np.float32)], np.float32(np.inf), "(x - mean)^2 overflows"),
    ("func main(x: f32[2]) -> f32[] {\n  y = mean(x)\n  return y\n}\n",
     [np.array([3e38, 3e38], np.float32)], np.float32(np.inf), "the sum overflows"),
    ("func main(x: f32[1, 1, 2, 2]) -> f32[1, 1, 1, 1] {\n  y = nn.avg_pool2d(x, pool_size=[2, 2])\n  return y\n}\n",
     [np.full((1, 1, 2, 2), 3e38, np.float32)], np.full((1, 1, 1, 1), np.inf, np.float32), "the window's sum overflows"),
    ("func main(a: f32[1, 2], b: f32[2, 1]) -> f32[1, 1] {\n  y = matmul(a, b)\n  return y\n}\n",
     [np.array([[1e20, 1e20]], np.float32), np.array([[1e19], [-1e19]], np.float32)],
     None, "each product overflows: inf or inf - inf"),
    ("func main(x: f16[2]) -> f16[] {\n  y = mean(x)\n  return y\n}\n",
     [np.array([60000, 60000], np.float16)], np.float16(60000), "f16 sums in float32: 120000 fits"),
]


@pytest.mark.parametrize("case", CONTRACT, ids=[c[3] for c in CONTRACT])
def test_float32_accumulates_in_float32_everywhere(case):
    """float32 (and the 16-bit floats) sum, multiply and take row statistics in float32: the
    interpreter, the CPU kernels and torch agree past FLT_MAX, where a float64 reference would not."""
    text, args, want, _ = case
    with np.errstate(all="ignore"):
        ref, cpu = default_cpu(text, *args)
    if want is None:  # inf, or NaN where an order adds -inf (or a multiply-add keeps the inf): not 0
        assert not np.isfinite(ref).any() and not np.isfinite(cpu).any(), (ref, cpu)
        return
    assert same(ref, np.asarray(want)), (ref, want)
    assert same(cpu, ref), (cpu, ref)


def test_torch_computes_the_contract():
    torch = needs.package("torch")
    checks = {
        "rms_norm": lambda x, w: torch.nn.functional.rms_norm(x, (4,), w, eps=1e-5),
        "variance": lambda x: x.var(unbiased=False),
        "mean": lambda x: x.mean(),
        "avg_pool": lambda x: torch.nn.functional.avg_pool2d(x, 2),
        "matmul": lambda a, b: a @ b,
        "f16 mean": lambda x: x.mean(),
    }
    for (text, args, want, why), fn in zip(CONTRACT, checks.values()):
        if why.startswith("f16"):  # torch's CPU f16 mean accumulates in float32 too
            args = [a.astype(np.float32) for a in args]
            got = fn(*[torch.from_numpy(a) for a in args]).numpy().astype(np.float16)
        else:
            got = fn(*[torch.from_numpy(a) for a in args]).numpy()
        if want is None:
            assert not np.isfinite(got).any(), (why, got)
        else:
            assert same(got.astype(np.asarray(want).dtype), np.asarray(want)), (why, got)


def test_twin_computes_the_contract(cxx):
    cases = [(dpl.parse(text)["main"], args) for text, args, _, why in CONTRACT if "matmul" not in text]
    with np.errstate(all="ignore"):
        for (fn, args), outs in zip(cases, twin_run(cxx, cases)):
            for out in outs:
                assert same(out, dpl.interpret(fn, *args)), (fn.name, out)


# -- the registry sweep: what a type rule accepts, the reference computes --------------------------

X4 = (2, 3, 4, 4)
# op -> (operand shapes, attributes); an inner tuple of shapes is a tuple operand. Ops not named
# take operands of (3, 4) and their default attributes. "{d}" is the swept dtype.
SAMPLES = {
    "clip": (((3, 4),), dict(min=-0.5, max=0.5)),
    "astype": (((3, 4),), dict(dtype="{d}")),
    "reshape": (((3, 4),), dict(shape=(4, 3))),
    "concat": ((((3, 4), (2, 4)),), {}),
    "split": (((4, 4),), dict(indices_or_sections=2)),
    "strided_slice": (((4, 4),), dict(axes=(0,), begin=(1,), end=(3,))),
    "take": (((3, 4), (2,)), dict(axis=1)),
    "broadcast_to": (((1, 4),), dict(shape=(3, 4))),
    "expand_dims": (((3, 4),), dict(axis=(0,))),
    "squeeze": (((1, 4),), {}),
    "full": (((),), dict(shape=(2, 3))),
    "zeros": ((), dict(shape=(2, 3), dtype="{d}")),
    "ones": ((), dict(shape=(2, 3), dtype="{d}")),
    "arange": ((), dict(end=5, dtype="{d}")),
    "cumsum": (((3, 4),), dict(axis=1)),
    "matmul": (((3, 4), (4, 5)), {}),
    "nn.rms_norm": (((3, 4), (4,)), {}),
    "nn.layer_norm": (((3, 4), (4,), (4,)), {}),
    "nn.conv2d": ((X4, (5, 3, 3, 3)), dict(padding=1)),
    "nn.max_pool2d": ((X4,), dict(pool_size=2, padding=1)),
    "nn.avg_pool2d": ((X4,), dict(pool_size=2, padding=1)),
    "nn.adaptive_avg_pool2d": ((X4,), dict(output_size=3)),
    "nn.pad": (((3, 4),), dict(pad_width=(1, 2, 2, 1), pad_mode="reflect")),
    # indexing (dpl/ops/indexing.py): the swept int64 indices lie in -3..3, within 4
    "topk": (((3, 4),), dict(k=2)),
    "gather_nd": (((4, 5), (2, 1)), {}),
    "gather_elements": (((4, 4), (2, 4)), {}),
    "scatter_elements": (((4, 4), (2, 4), (2, 4)), {}),
    "scatter_nd": (((4, 5), (2, 1), (2, 5)), {}),
    "index_put": (((4, 5), ((2,),), (2, 5)), {}),
    "slice_scatter": (((4, 4), (4, 2)), dict(axes=(1,), begin=(1,), end=(3,))),
    # dpl/ops/image.py
    "image.resize": (((1, 2, 3, 4),), dict(size=(5, 2))),
    "nn.conv1d": (((1, 2, 5), (3, 2, 2)), {}),
    "nn.conv3d": (((1, 2, 3, 3, 3), (2, 2, 2, 2, 2)), {}),
    "nn.conv1d_transpose": (((1, 2, 5), (2, 3, 2)), dict(strides=2)),
    "nn.conv2d_transpose": (((1, 2, 3, 3), (2, 3, 2, 2)), {}),
    "nn.conv3d_transpose": (((1, 2, 2, 2, 2), (2, 1, 2, 2, 2)), {}),
    "nn.group_norm": (((2, 4, 3), (4,), (4,)), dict(num_groups=2)),
}
FIXED_DTYPE = {("where", 0): "bool", ("take", 1): "int64"}  # operands whose dtype is not swept
FIXED_DTYPE.update({(op, 1): "int64" for op in ("gather_nd", "gather_elements", "scatter_elements", "scatter_nd",
                                                 "index_put")})
# the op x dtype pairs whose reference has no answer: their type rules reject them
REJECTED = {("subtract", "bool"), ("negative", "bool"), ("square", "bool"), ("nn.max_pool2d", "bool")}
REJECTED |= {("mod", "bool"), ("floor_mod", "bool"), ("sign", "bool")}  # a bool's sign is itself; no remainder


def random_value(shape, dtype: str, rng) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in ("int8", "uint8", "int16", "int32", "int64"):
        return rng.integers(0 if dtype == "uint8" else -3, 4, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtypes.to_numpy(dtype))


def sample_call(name: str, dtype: str, rng):
    """(function, inputs) of one call of op ``name`` with operands of ``dtype``, or the type
    error its rule gives."""
    op = all_ops()[name]
    shapes, attrs = SAMPLES.get(name, (((3, 4),) * op.num_args[0], {}))
    fb, operands, values = FunctionBuilder("main"), [], []
    for i, shape in enumerate(shapes):
        ty = FIXED_DTYPE.get((name, i), dtype)
        if shape and isinstance(shape[0], tuple):
            fields = [fb.param(f"p{i}_{k}", ty, s) for k, s in enumerate(shape)]
            operands.append(Tuple(tuple(fields)))
            values += [random_value(s, ty, rng) for s in shape]
        else:
            operands.append(fb.param(f"p{i}", ty, shape))
            values.append(random_value(shape, ty, rng))
    attrs = {k: v.format(d=dtype) if isinstance(v, str) else v for k, v in attrs.items()}
    call = make_call(name, operands, attrs)  # raises the rule's type error
    return fb.ret(fb.bind(call)), values


def test_every_op_and_dtype_its_type_rule_accepts_the_interpreter_computes():
    rng = np.random.default_rng(0)
    accepted, rejected = 0, set()
    for name, dtype in itertools.product(sorted(all_ops()), DTYPES):
        try:
            fn, values = sample_call(name, dtype, rng)
        except TypeInferenceError as err:
            rejected.add((name, dtype))
            assert err.message.startswith(f"op '{name}'"), err.message
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # log of a negative: NaN, an answer
            try:
                dpl.interpret(fn, *values)
            except DplError as err:
                pytest.fail(f"{name} on {dtype}: the type rule accepts what the interpreter cannot compute: {err}")
            except Exception as err:  # NumPy's own refusal: what the type rule must catch
                pytest.fail(f"{name} on {dtype}: the reference raised {type(err).__name__}: {err}")
        accepted += 1
    assert REJECTED <= rejected
    assert accepted > 400, accepted


def test_astype_between_every_pair_of_dtypes_computes():
    rng = np.random.default_rng(1)
    for source, target in itertools.product(DTYPES, DTYPES):
        fb = FunctionBuilder("main")
        x = fb.param("x", source, (3, 4))
        fn = fb.ret(fb.emit("astype", x, dtype=target))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            assert dpl.interpret(fn, random_value((3, 4), source, rng)).dtype == dtypes.to_numpy(target)


@pytest.mark.parametrize("name, dtype", sorted(REJECTED))
def test_bool_arithmetic_is_a_located_type_error(name, dtype):
    call = {"subtract": "subtract(x, x)", "mod": "mod(x, x)", "floor_mod": "floor_mod(x, x)",
            "nn.max_pool2d": "nn.max_pool2d(x)"}.get(name, f"{name}(x)")
    shape = "1, 1, 2, 2" if name == "nn.max_pool2d" else "4"
    text = f"func main(x: bool[{shape}]) -> bool[{shape}] {{\n  y = {call}\n  return y\n}}\n"
    with pytest.raises(TypeInferenceError) as info:
        dpl.parse(text, "bools.ir")
    err = info.value
    assert str(err).startswith("bools.ir:2:7: error: op '"), str(err)
    assert "bool" in err.message and err.hint
