"""The generated C and CUDA compute what the IR defines, op by op, as the interpreter does:

- signed integers wrap (C leaves overflow undefined, and GCC folded ``x + 1 > x`` to true at
  INT_MAX);
- int8, uint8 and int16 results are values of their type at every op inside a fused kernel (C
  computes them in int: int8 ``x + x`` at 100 had been 200 for a later cast or compare, not -56);
- float16 and bfloat16 results are rounded to their type at every op (``x * x / x`` at 300 had
  kept float's range: 300, not inf).

Each class is a property over its dtype x op grid: one kernel per dtype computes every op of the
grid and exposes each result where an unnarrowed or unrounded value would show (widened to i64 or
f32, compared with an operand), built once for ``cpu`` and once for the CUDA host twin; hypothesis
then draws the operands, biased to the edges (MIN, MAX, 100, -128, overflowing squares, the
16-bit floats' largest values, ties and subnormals, every bit pattern). Integers must equal the
interpreter's; 16-bit floats too, except the ops computed through libm (exp, tanh, ...), which may
round the other way where float and float64 straddle a 16-bit tie: one 16-bit ulp, and always a
value of the 16-bit type.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpl
import needs
from dpl import dtypes
from dpl.backends.cgen.emitter import emit_kernel
from dpl.backends.cpu.backend import CpuBackend
from dpl.backends.cuda.emitter import emit_cuda
from dpl.ir import Module
from dpl.kernel import lower_function

N = 64  # elements a kernel runs on per example
INTS = ("i8", "u8", "i16", "i32", "i64")
INT_BINARY = ("add", "subtract", "multiply", "maximum", "minimum", "mod", "floor_mod")
INT_UNARY = ("negative", "abs", "square", "nn.relu", "sign")
FLOATS = ("f16", "bf16")
# computed in float and rounded once: the interpreter's float64 rounded to 16 bits, bit for bit
FLOAT_EXACT_BINARY = ("add", "subtract", "multiply", "divide", "maximum", "minimum", "mod", "floor_mod")
FLOAT_EXACT_UNARY = ("negative", "abs", "square", "sqrt", "nn.relu", "floor", "ceil", "round", "trunc", "sign")
# through libm in float: within one 16-bit ulp of the interpreter (float64 rounded)
FLOAT_LIBM_UNARY = ("exp", "log", "tanh", "sigmoid", "nn.silu", "nn.gelu", "nn.gelu_tanh", "rsqrt", "sin", "erf", "log1p",
                    "expm1", "nn.softplus")
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def numpy_dtype(short: str):
    return dtypes.to_numpy(dtypes.canonical(short))


def int_grid(t: str) -> str:
    """Every op of the integer grid on ``a`` (and ``b``), each result widened to i64 (an
    unnarrowed intermediate shows) and compared with ``a`` (GCC's folding of ``a + b > a`` to
    ``b > 0`` shows), and ``a + 1 > a`` with a constant."""
    lines, outs, types = [], [], []
    for op in INT_BINARY + INT_UNARY:
        name = op.split(".")[-1]
        lines.append(f"  {name} = {op}(a, b)" if op in INT_BINARY else f"  {name} = {op}(a)")
        lines.append(f"  {name}_wide = astype({name}, dtype=i64)")
        lines.append(f"  {name}_above = greater({name}, a)")
        outs += [f"{name}_wide", f"{name}_above"]
        types += ["i64[n]", "bool[n]"]
    lines.append(f"  next = add(a, 1:{t})")
    lines.append("  next_above = greater(next, a)")
    outs.append("next_above")
    types.append("bool[n]")
    return (f"@primitive\nfunc ints_{t}(a: {t}[n], b: {t}[n]) -> ({', '.join(types)}) {{\n" + "\n".join(lines)
            + f"\n  return ({', '.join(outs)})\n}}")


def float_grid(t: str, unary: tuple, binary: tuple = ()) -> str:
    """Every op given on ``a`` (and ``b``), each result widened to f32 exactly, so a value
    computed in float and not rounded to ``t`` shows."""
    lines, outs = [], []
    for op in binary + unary:
        name = op.split(".")[-1]
        lines.append(f"  {name} = {op}(a, b)" if op in binary else f"  {name} = {op}(a)")
        lines.append(f"  {name}_wide = astype({name}, dtype=f32)")
        outs.append(f"{name}_wide")
    types = ", ".join("f32[n]" for _ in outs)
    label = "exact" if binary else "libm"
    return (f"@primitive\nfunc {label}_{t}(a: {t}[n], b: {t}[n]) -> ({types}) {{\n" + "\n".join(lines)
            + f"\n  return ({', '.join(outs)})\n}}")


# the issue's chains: intermediates that overflow or lose precision in 16 bits
FLOAT_CHAINS = """
@primitive
func chains_{t}(a: {t}[n], b: {t}[n]) -> ({t}[n], {t}[n], {t}[n], f32[n]) {{
  sq = multiply(a, a)
  back = divide(sq, a)
  sum = add(a, b)
  lost = subtract(sum, a)
  scaled = multiply(a, 0.1:{t})
  twice = add(scaled, scaled)
  e = exp(a)
  ratio = divide(e, add(e, 1.0:{t}))
  ratio_wide = astype(ratio, dtype=f32)
  return (back, lost, twice, ratio_wide)
}}"""


def functions() -> dict:
    texts = [int_grid(t) for t in INTS]
    for t in FLOATS:
        texts += [float_grid(t, FLOAT_EXACT_UNARY, FLOAT_EXACT_BINARY), float_grid(t, FLOAT_LIBM_UNARY),
                  FLOAT_CHAINS.format(t=t)]
    return {name: fn for text in texts for name, fn in dpl.parse(text).functions.items()}


FUNCTIONS = functions()


@pytest.fixture(scope="module")
def cpu_kernels(tmp_path_factory):
    needs.c_compiler()
    backend = CpuBackend(cache_dir=tmp_path_factory.mktemp("exact") / "kernels")
    return {name: backend.compile(fn, module=Module([fn])) for name, fn in FUNCTIONS.items()}


@pytest.fixture(scope="module")
def twin(cxx):
    from dpl.backends.cuda.host import HostTwin

    return HostTwin([emit_cuda(lower_function(fn), name) for name, fn in FUNCTIONS.items()], block=8)


def run(where: str, name: str, kernels, a, b) -> list[np.ndarray]:
    fn = FUNCTIONS[name]
    outs = [np.zeros(tuple(N if d == "n" else d for d in r.ty.shape), dtypes.to_numpy(r.ty.dtype))
            for r in fn.ret.fields]
    if where == "cpu":
        kernels[name]([a, b], outs)
    else:
        kernels.run(name, [a, b], outs, grid=3)
    return outs


def interpreted(name: str, a, b) -> list[np.ndarray]:
    with np.errstate(all="ignore"):
        return list(dpl.interpret(FUNCTIONS[name], a, b))


# -- operands, biased to the edges -------------------------------------------------------------


def int_edges(dtype) -> list[int]:
    info = np.iinfo(dtype)
    edges = {info.min, info.min + 1, info.max, info.max - 1, 0, 1, 2, 100, 127, 128, 255, -1, -2, -128, -100,
             181, 182, 46341, -46341, 3037000500, 2**31, 2**16, 2**8}
    return sorted(v for v in edges if info.min <= v <= info.max)


def int_operands(dtype):
    info = np.iinfo(dtype)
    value = st.one_of(st.sampled_from(int_edges(dtype)), st.integers(int(info.min), int(info.max)))
    return st.lists(value, min_size=N, max_size=N).map(lambda xs: np.array(xs, dtype))


def float_operands(dtype):
    """Every bit pattern (NaN and infinity included), and values near the largest finite one,
    near 1 (ties of a sum), subnormals and the issue's 300."""
    bits = st.integers(0, 0xFFFF).map(lambda u: np.array(u, np.uint16).view(dtype).item())
    edges = [0.0, -0.0, 1.0, -1.0, 2.0, 300.0, -300.0, 1000.0, 0.1, 2048.0, 4096.0, 65504.0, -65504.0, 6e-8, 6.1e-5,
             3e38, -3e38, 256.0, 1e-30, float("inf"), float("-inf"), float("nan")]
    value = st.one_of(bits, st.sampled_from(edges))
    return st.lists(value, min_size=N, max_size=N).map(lambda xs: narrowed(xs, dtype))


def narrowed(values, dtype) -> np.ndarray:
    with np.errstate(over="ignore"):  # 3e38 is infinity in float16
        return np.array(values, np.float64).astype(dtype)


# -- integers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["cpu", "twin"])
@pytest.mark.parametrize("t", INTS)
def test_integer_ops_wrap_and_narrow_as_the_interpreter(request, where, t):
    kernels = request.getfixturevalue("cpu_kernels" if where == "cpu" else "twin")
    dtype = numpy_dtype(t)

    @SETTINGS
    @given(a=int_operands(dtype), b=int_operands(dtype))
    def check(a, b):
        for k, (got, want) in enumerate(zip(run(where, f"ints_{t}", kernels, a, b), interpreted(f"ints_{t}", a, b))):
            np.testing.assert_array_equal(got, want, err_msg=f"{where} {t} output {k} a={a.tolist()} b={b.tolist()}")

    check()


# -- 16-bit floats -----------------------------------------------------------------------------


def assert_rounded_like(got, want, short: str, ulps: int, what: str, near=None) -> None:
    """``got`` is a value of the 16-bit type ``short`` (as f32), NaN where ``want`` is NaN, and
    within ``ulps`` of ``want`` where ``near`` holds (everywhere by default)."""
    dtype = numpy_dtype(short)
    got32, want32 = got.astype(np.float32), want.astype(np.float32)
    nan = np.isnan(want32)
    assert (np.isnan(got32) == nan).all(), f"{what}: NaN where the interpreter has none, or none where it has"
    with np.errstate(over="ignore"):
        assert (got32[~nan].astype(dtype).astype(np.float32) == got32[~nan]).all(), f"{what}: a value not rounded to {short}"
    keep = ~nan if near is None else ~nan & near
    got32, want32 = got32[keep], want32[keep]
    if ulps == 0:
        np.testing.assert_array_equal(got32, want32, err_msg=what)
        return
    # the distance in units of the last place, by bit pattern (sign-magnitude onto a line)
    if short == "f16":
        g, w = (x.astype(np.float16).view(np.int16).astype(np.int32) for x in (got32, want32))
    else:
        g, w = ((x.view(np.int32) >> 16).astype(np.int32) for x in (got32, want32))
    g = np.where(g < 0, -(g & 0x7FFF), g)
    w = np.where(w < 0, -(w & 0x7FFF), w)
    far = np.abs(g - w) > ulps
    assert not far.any(), f"{what}: more than {ulps} ulp apart: {got32[far]} against {want32[far]}"


@pytest.mark.parametrize("where", ["cpu", "twin"])
@pytest.mark.parametrize("t", FLOATS)
def test_sixteen_bit_ops_round_at_every_op(request, where, t):
    kernels = request.getfixturevalue("cpu_kernels" if where == "cpu" else "twin")
    dtype = numpy_dtype(t)
    exact_names = [op.split(".")[-1] for op in FLOAT_EXACT_BINARY + FLOAT_EXACT_UNARY]
    libm_names = [op.split(".")[-1] for op in FLOAT_LIBM_UNARY]

    @SETTINGS
    @given(a=float_operands(dtype), b=float_operands(dtype))
    def check(a, b):
        for op, got, want in zip(exact_names, run(where, f"exact_{t}", kernels, a, b), interpreted(f"exact_{t}", a, b)):
            assert_rounded_like(got, want, t, 0, f"{where} {t} {op} a={a.tolist()} b={b.tolist()}")
        # libm in float, rounded once: one ulp from float64 rounded, for moderate operands; beyond,
        # float's own accuracy decides (1 + tanh(x) cancels, exp(89) is inf), not rounding
        near = np.abs(a.astype(np.float32)) <= 3
        for op, got, want in zip(libm_names, run(where, f"libm_{t}", kernels, a, b), interpreted(f"libm_{t}", a, b)):
            assert_rounded_like(got, want, t, 1, f"{where} {t} {op} a={a.tolist()}", near)

    check()


@pytest.mark.parametrize("where", ["cpu", "twin"])
@pytest.mark.parametrize("t", FLOATS)
def test_sixteen_bit_chains_overflow_and_lose_precision_as_the_interpreter(request, where, t):
    kernels = request.getfixturevalue("cpu_kernels" if where == "cpu" else "twin")
    dtype = numpy_dtype(t)
    big = 300.0 if t == "f16" else 3e38
    a = np.array([big, -big, 2048.0, 1.0, 0.5, 4096.0, 65504.0, 3.0] * (N // 8)).astype(dtype)
    b = np.array([1.0, 1.0, 1.0, 2.0 ** -12, 2.0 ** -12, 1.0, 1.0, 0.001] * (N // 8)).astype(dtype)
    name = f"chains_{t}"
    got, want = run(where, name, kernels, a, b), interpreted(name, a, b)
    assert np.isinf(want[0][:2]).all()  # the square overflows in 16 bits
    for k, (g, w) in enumerate(zip(got, want)):
        assert_rounded_like(g, w, t, 0 if k < 3 else 1, f"{where} {t} output {k}")


# -- the issue's reproducers, on the default path ----------------------------------------------


REPRODUCERS = [
    ("""func main(x: i8[4]) -> i32[4] {
  a = add(x, x)
  b = astype(a, dtype=i32)
  return b
}""", [np.array([100, -128, 1, 127], np.int8)]),
    ("""func main(x: i32[4]) -> bool[4] {
  a = add(x, 1:i32)
  b = greater(a, x)
  return b
}""", [np.array([2**31 - 1, 0, -1, 5], np.int32)]),
    ("""func main(x: i64[4], y: i64[4]) -> bool[4] {
  a = add(x, y)
  b = greater(a, x)
  return b
}""", [np.array([2**63 - 1, 0, -1, 5], np.int64), np.array([1, 1, 1, 1], np.int64)]),
    ("""func main(x: f16[4]) -> f16[4] {
  a = multiply(x, x)
  b = divide(a, x)
  return b
}""", [np.array([300, 1, 2, 1000], np.float16)]),
    ("""func main(x: bf16[4]) -> bf16[4] {
  a = add(x, 1.0:bf16)
  b = subtract(a, x)
  return b
}""", [np.array([256, 1, 2, 1000], np.float32).astype(numpy_dtype("bf16"))]),
    ("""func main(x: f16[4]) -> f16[4] {
  a = nn.silu(x)
  b = multiply(a, x)
  return b
}""", [np.array([300, 1, -2, 1000], np.float16)]),
]


@pytest.mark.parametrize("k", range(len(REPRODUCERS)))
def test_reproducers_on_the_default_path(k):
    needs.c_compiler()
    text, args = REPRODUCERS[k]
    mod = dpl.parse(text)
    with np.errstate(all="ignore"):
        want = dpl.interpret(mod, *args)
    exe = dpl.build(dpl.apply(mod, ["rewrites", "llm"]), "cpu")
    np.testing.assert_array_equal(np.asarray(exe(*args)), want)
    assert not exe.fallbacks


# -- what does not change ----------------------------------------------------------------------


def test_float32_and_wide_integer_selects_emit_as_before():
    """No cast where the C already computes the IR's type: float32 and float64 ops, int32 and
    int64 ops that select an operand."""
    fn = dpl.parse("""
@primitive
func f(x: f32[n], y: f32[n], i: i32[n], j: i64[n]) -> (f32[n], i32[n], i64[n]) {
  a = add(multiply(x, y), 1.5)
  b = maximum(i, nn.relu(i))
  c = minimum(j, 3:i64)
  return (a, b, c)
}""")["f"]
    source = emit_kernel(lower_function(fn))
    assert "((v_x[v_i0] * v_y[v_i0]) + 1.5f)" in source
    assert "uint" not in source.split("void dpl_kernel")[1]
    assert "dpl_bf16_round" not in source


def test_wide_integers_wrap_through_unsigned_arithmetic():
    fn = dpl.parse("""
@primitive
func f(x: i32[n], y: i64[n]) -> (i32[n], i64[n]) {
  a = add(x, 1:i32)
  s = sum(y, axis=[0], keepdims=true)
  b = multiply(y, s)
  return (a, b)
}""")["f"]
    for source in (emit_kernel(lower_function(fn)), emit_cuda(lower_function(fn)).function):
        assert "((int32_t)((uint32_t)(v_x[v_i0]) + (uint32_t)(1)))" in source
        assert "(uint64_t)" in source
