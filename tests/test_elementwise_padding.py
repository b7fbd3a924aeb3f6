"""Remainders, roundings, the other elementwise functions, and padding: what each means, the same
everywhere (interpreter, generated C, the NumPy backend, the CUDA host twin and NVRTC), how a pad
fuses (as TVM's FuseOps fuses it) and lowers (index arithmetic with clamps, mirrors and a select),
and what torch computes for the models that use them.

- ``mod`` truncates (C's fmod, torch's fmod, ONNX Mod fmod=1), ``floor_mod`` floors (torch's
  remainder, ONNX Mod fmod=0, Python's %). An integer over 0 gives 0, as integer ``divide``
  defines it (docs/architecture.md, numerical contract), and the most negative value over -1
  gives its true remainder, 0: C leaves both undefined and x86 traps on them.
- ``round`` is half to even, ``sign`` NumPy's (NaN for NaN; torch's 0 comes from its frontend).
- ``nn.pad`` reads output index i at ``i - before`` brought into the axis by the mode.
"""


import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpl
import needs
from dpl.backends.cpu.backend import CpuBackend
from dpl.backends.cuda.emitter import emit_cuda
from dpl.errors import TypeInferenceError
from dpl.kernel import lower_function

ALWAYS = dpl.FusionConfig(min_nodes_for_fusion=1, min_tensor_elements=0, fallback_on_error=False)
INTS = {"i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64, "u8": np.uint8}
MODES = ("constant", "reflect", "replicate", "circular")
NUMPY_MODE = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


@pytest.fixture(scope="module")
def cpu(tmp_path_factory):
    needs.c_compiler()
    return CpuBackend(cache_dir=tmp_path_factory.mktemp("kernels"))


def compiled(mod, cpu):
    """``mod`` through ``dpl.apply`` and built for cpu, every function compiled (no fall-back)."""
    exe = dpl.build(dpl.apply(mod), [cpu, "numpy"], config=ALWAYS)
    for choice in exe.choices.values():
        assert choice.backend.name == "cpu" and not choice.by_fallback, exe.summary()
    return exe


# -- integer remainders: one definition, in Python integers --------------------------------------


def remainder(a: int, b: int, floor: bool) -> int:
    """The definition: a - trunc(a / b) * b (the sign of a), moved to b's sign when ``floor``;
    0 for b == 0. It always fits the dtype (|r| < |b|)."""
    if b == 0:
        return 0
    r = abs(a) % abs(b) * (1 if a >= 0 else -1)
    return r + b if floor and r != 0 and (r < 0) != (b < 0) else r


def remainders_module(dt: str, n: int):
    return dpl.parse(f"""
func main(a: {dt}[{n}], b: {dt}[{n}]) -> ({dt}[{n}], {dt}[{n}]) {{
  m = mod(a, b)
  f = floor_mod(a, b)
  return (m, f)
}}""")


def operands(dtype, n: int, seed: int):
    """Values over the whole range, the divisors C leaves undefined (0, and -1 under the most
    negative dividend) at the front, small divisors of both signs after."""
    info, rng = np.iinfo(dtype), np.random.default_rng(seed)
    a = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    b = rng.integers(max(info.min, -7), 8, n).astype(dtype)
    a[:6] = [info.min, info.min, info.max, 0, info.max, info.min]
    b[:6] = [0, -1 if info.min < 0 else 1, 0, 0, info.max, info.max]
    b[rng.random(n) < 0.1] = 0
    return a, b


def expected(a, b, dtype):
    return tuple(np.array([remainder(int(x), int(y), floor) for x, y in zip(a, b)], dtype) for floor in (False, True))


@pytest.mark.parametrize("dt", list(INTS))
def test_integer_remainders_follow_the_definition_in_the_interpreter_and_numpy(dt):
    dtype = INTS[dt]
    a, b = operands(dtype, 300, 0)
    mod = remainders_module(dt, 300)
    for got in (dpl.interpret(mod, a, b), dpl.build(mod, "numpy")(a, b)):
        for g, w in zip(got, expected(a, b, dtype)):
            np.testing.assert_array_equal(g, w)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dt=st.sampled_from(list(INTS)), n=st.integers(6, 70), seed=st.integers(0, 2**16))
def test_generated_c_takes_remainders_by_zero_without_a_trap(tmp_path_factory, dt, n, seed):
    needs.c_compiler()
    dtype = INTS[dt]
    a, b = operands(dtype, n, seed)
    exe = dpl.build(dpl.fuse_ops(remainders_module(dt, n), ALWAYS),
                    [CpuBackend(cache_dir=tmp_path_factory.getbasetemp() / "kernels"), "numpy"], config=ALWAYS)
    for g, w in zip(exe(a, b), expected(a, b, dtype)):
        np.testing.assert_array_equal(g, w)
    assert not exe.fallbacks


def test_cuda_host_twin_takes_remainders_as_the_definition(cxx):
    from dpl.backends.cuda.host import HostTwin

    sources = {dt: emit_cuda(lower_function(remainders_module(dt, 64)["main"]), f"rem_{dt}") for dt in INTS}
    twin = HostTwin(list(sources.values()), block=8)
    for dt, source in sources.items():
        a, b = operands(INTS[dt], 64, 1)
        outs = [np.zeros(64, INTS[dt]) for _ in range(2)]
        twin.run(source.name, [a, b], outs)
        for g, w in zip(outs, expected(a, b, INTS[dt])):
            np.testing.assert_array_equal(g, w, err_msg=dt)


def test_cuda_remainders_compile_with_nvrtc(nvrtc):
    sources = [emit_cuda(lower_function(remainders_module(dt, 64)["main"]), f"rem_{dt}") for dt in INTS]
    assert all(f"dpl_floor_mod_{np.dtype(INTS[dt]).name}(" in s.function for dt, s in zip(INTS, sources))
    ptx = nvrtc.compile_ptx(sources[0].code.replace(sources[0].function, "") + "\n".join(s.function for s in sources), "rem.cu")
    assert all(f".entry {s.name}(" in ptx for s in sources)


# -- float remainders and roundings, against torch -----------------------------------------------

EDGES = np.array([5, -5, 5, -5, 0, -0.0, 6, -6, np.inf, 5, -5, 5, np.nan, -6, 0, -0.0, 7.5, -7.5, 1e30, 3],
                 np.float32)
DIVISORS = np.array([3, 3, -3, -3, 3, 3, 3, 3, 3, np.inf, np.inf, 0, 1, -3, -np.inf, np.inf, 2, 2, 7, 1e-30],
                    np.float32)


def float_module(n: int) -> dpl.Module:
    return dpl.parse(f"""
func main(a: f32[{n}], b: f32[{n}]) -> (f32[{n}], f32[{n}], f32[{n}], f32[{n}], f32[{n}], f32[{n}], f32[{n}]) {{
  m = mod(a, b)
  f = floor_mod(a, b)
  r = round(a)
  lo = floor(a)
  hi = ceil(a)
  t = trunc(a)
  s = sign(a)
  return (m, f, r, lo, hi, t, s)
}}""")


def test_float_remainders_and_roundings_are_torchs(cpu):
    torch = needs.package("torch")
    a = np.concatenate([EDGES, np.float32([0.5, 1.5, 2.5, -0.5, -2.5, 3.5, 0.49999997, -1e-8])])
    b = np.concatenate([DIVISORS, np.ones(8, np.float32)])
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    want = [torch.fmod(ta, tb), torch.remainder(ta, tb), torch.round(ta), torch.floor(ta), torch.ceil(ta), torch.trunc(ta),
            torch.sign(ta)]
    mod = float_module(a.size)
    with np.errstate(all="ignore"):
        interpreted = dpl.interpret(mod, a, b)
    for got in (interpreted, compiled(mod, cpu)(a, b)):
        for name, g, w in zip(["mod", "floor_mod", "round", "floor", "ceil", "trunc", "sign"], got, want):
            w = w.numpy()
            if name == "sign":  # NumPy's sign of NaN is NaN, torch's 0 (its frontend selects 0)
                w = np.where(np.isnan(a), np.nan, w)
            np.testing.assert_array_equal(g, w, err_msg=name)
            zero = (g == 0) & (w == 0)
            if name == "floor_mod":  # a zero remainder takes the divisor's sign (NumPy's), torch's the dividend's
                assert (np.signbit(g[zero]) == np.signbit(b[zero])).all()
            else:
                np.testing.assert_array_equal(np.signbit(g[zero]), np.signbit(w[zero]), err_msg=f"{name}: signed zeros")


def test_floor_mod_is_numpys_remainder_to_the_sign_of_zero():
    with np.errstate(all="ignore"):
        got = dpl.interpret(float_module(EDGES.size), EDGES, DIVISORS)[1]
        want = np.remainder(EDGES, DIVISORS)
    np.testing.assert_array_equal(got, want)
    assert (np.signbit(got) == np.signbit(want)).all()


# -- padding ---------------------------------------------------------------------------------------

# (shape, pad_width): plain, every axis, wider than the axis (reflect and wrap repeat), crops, a
# one-element axis
PADS = [
    ((2, 3, 5), [0, 0, 1, 2, 3, 1]),
    ((2, 3, 5), [1, 1, 2, 2, 4, 4]),
    ((2, 3, 5), [0, 0, 5, 7, 9, 11]),
    ((2, 3, 5), [0, 0, -1, 2, 2, -3]),
    ((2, 1, 4), [0, 0, 2, 3, 0, 0]),
]


def pad_module(shape, widths, mode, dtype="f32", value=None) -> dpl.Module:
    out = [d + widths[2 * i] + widths[2 * i + 1] for i, d in enumerate(shape)]
    value = "" if value is None else f", pad_value={value}"
    return dpl.parse(f"""
func main(x: {dtype}[{', '.join(map(str, shape))}]) -> {dtype}[{', '.join(map(str, out))}] {{
  e = multiply(x, x)
  p = nn.pad(e, pad_width={widths}, pad_mode="{mode}"{value})
  r = add(p, x_bias)
  return r
}}""".replace("x_bias", "1.0" if dtype.startswith(("f", "bf")) else f"1:{dtype}"))


def numpy_pad(x, widths, mode, value=0.0):
    """np.pad, with negative widths as crops first."""
    pairs = list(zip(widths[0::2], widths[1::2]))
    x = x[tuple(slice(max(-b, 0), x.shape[k] - max(-a, 0)) for k, (b, a) in enumerate(pairs))]
    pairs = [(max(b, 0), max(a, 0)) for b, a in pairs]
    if mode == "constant":
        return np.pad(x, pairs, constant_values=value)
    return np.pad(x, pairs, NUMPY_MODE[mode])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape, widths", PADS, ids=[str(w) for _, w in PADS])
def test_pad_fuses_and_compiles_as_numpy_pads(cpu, mode, shape, widths):
    if mode != "constant" and any(w < 0 for w in widths):
        widths = [max(w, 0) for w in widths]  # NumPy crops nothing for the other modes
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    mod = pad_module(shape, widths, mode, value=0.5)
    want = numpy_pad(x * x, widths, mode, 0.5) + 1
    np.testing.assert_allclose(dpl.interpret(mod, x), want, rtol=1e-6)
    fused = dpl.apply(mod)
    groups = [f for f in fused.functions.values() if "Primitive" in f.attrs]
    assert len(groups) == 1 and [b.value.op for b in groups[0].bindings] == ["multiply", "nn.pad", "add"]
    np.testing.assert_allclose(compiled(mod, cpu)(x), want, rtol=1e-6)


@pytest.mark.parametrize("dtype", ["i32", "u8", "f16", "bf16", "bool"])
def test_pad_of_other_dtypes_keeps_their_values(cpu, dtype):
    text = f"""
func main(x: {dtype}[3, 4]) -> ({dtype}[5, 7], {dtype}[5, 9]) {{
  c = nn.pad(x, pad_width=[1, 1, 2, 1], pad_value={1 if dtype in ("bool", "u8") else -3})
  r = nn.pad(x, pad_width=[2, 0, 2, 3], pad_mode="reflect")
  return (c, r)
}}"""
    mod = dpl.parse(text)
    rng = np.random.default_rng(1)
    x = np.asarray(rng.standard_normal((3, 4)) * 4).astype(dpl.dtypes.to_numpy(dpl.dtypes.canonical(dtype)))
    want = dpl.interpret(mod, x)
    value = want[0].dtype.type(1 if dtype in ("bool", "u8") else -3)
    np.testing.assert_array_equal(want[0], np.pad(x, [(1, 1), (2, 1)], constant_values=value))
    np.testing.assert_array_equal(want[1], np.pad(x, [(2, 0), (2, 3)], "reflect"))
    for g, w in zip(compiled(mod, cpu)(x), want):
        np.testing.assert_array_equal(g, w)


def test_a_constant_pad_of_an_empty_axis_is_the_value(cpu):
    mod = dpl.parse("""
func main(x: f32[0, 3]) -> f32[2, 5] {
  p = nn.pad(x, pad_width=[1, 1, 1, 1], pad_value=2.5)
  return p
}""")
    x = np.zeros((0, 3), np.float32)
    np.testing.assert_array_equal(dpl.interpret(mod, x), np.full((2, 5), 2.5, np.float32))
    np.testing.assert_array_equal(compiled(mod, cpu)(x), np.full((2, 5), 2.5, np.float32))


def test_the_pad_kernel_is_index_arithmetic_with_a_select():
    """A constant pad: the load clamped into bounds, the value selected outside; reflect: the
    mirrored index a local of its own loop; a wide reflect: modulo the period."""
    def kernel(mode, widths):
        fused = dpl.apply(pad_module((2, 3, 5), widths, mode))
        return str(lower_function(next(f for f in fused.functions.values() if "Primitive" in f.attrs)))

    text = kernel("constant", [0, 0, 1, 0, 0, 2])
    assert "i64 pad1 = (((i1 - 1) < 0) ? 0 : (i1 - 1))" in text and "i64 pad2 = ((i2 > 4) ? 4 : i2)" in text
    assert "((((i1 - 1) >= 0) && (i2 < 5)) ? (x[i0, pad1, pad2] * x[i0, pad1, pad2]) : 0.0f)" in text
    reflect = kernel("reflect", [0, 0, 1, 1, 2, 2])
    assert "i64 pad1 = " in reflect and "i64 pad2 = " in reflect and "%" not in reflect
    assert "% 8" in kernel("reflect", [0, 0, 0, 0, 9, 0])  # period 2 * (5 - 1)


def test_cuda_pad_kernels_on_the_host_twin_and_nvrtc(cxx, nvrtc):
    from dpl.backends.cuda.emitter import CUDA_PRELUDE, HELPERS
    from dpl.backends.cuda.host import HostTwin

    cases = [(shape, widths, mode) for shape, widths in PADS for mode in MODES
             if mode == "constant" or min(widths) >= 0]
    sources = []
    for k, (shape, widths, mode) in enumerate(cases):
        fused = dpl.apply(pad_module(shape, widths, mode, value=0.5))
        fn = next(f for f in fused.functions.values() if "Primitive" in f.attrs)
        sources.append((emit_cuda(lower_function(fn), f"pad{k}"), shape, widths, mode))
    twin = HostTwin([s for s, *_ in sources], block=8)
    x = np.random.default_rng(2).standard_normal((2, 3, 5)).astype(np.float32)
    for source, shape, widths, mode in sources:
        xi = x[: shape[0], : shape[1], : shape[2]].copy()
        want = numpy_pad(xi * xi, widths, mode, 0.5) + 1
        out = np.zeros_like(want)
        twin.run(source.name, [xi], [out])
        np.testing.assert_allclose(out, want, rtol=1e-6, err_msg=f"{mode} {widths}")
    ptx = nvrtc.compile_ptx(CUDA_PRELUDE + HELPERS + "\n".join(s.function for s, *_ in sources), "pads.cu")
    assert all(f".entry {s.name}(" in ptx for s, *_ in sources)


@pytest.mark.oracle
def test_pads_fuse_as_tvm_fuses(tvm):
    """The pad is Injective: it joins the elementwise ops on both sides, never a convolution
    after it (FuseOps fuses an injective producer only into injective consumers): here
    {e, p}, {c, r}, {q, s, z}."""
    from tvm_oracle import dpl_fusion_groups, tvm_fusion_groups

    mod = dpl.parse("""
func main(x: f32[1, 4, 8, 8], w: f32[4, 4, 3, 3]) -> f32[1, 4, 10, 10] {
  e = exp(x)
  p = nn.pad(e, pad_width=[0, 0, 0, 0, 1, 1, 1, 1], pad_mode="reflect")
  c = nn.conv2d(p, w)
  r = nn.relu(c)
  q = nn.pad(r, pad_width=[0, 0, 0, 0, 2, 2, 2, 2], pad_value=-1.0)
  s = multiply(q, 2.0)
  z = nn.pad(s, pad_width=[0, 0, 0, 0, -1, -1, -1, -1], pad_mode="replicate")
  return z
}""")
    fn = mod["main"]
    assert dpl_fusion_groups(fn, dpl.fuse_ops(mod)) == tvm_fusion_groups(fn)


def test_a_symbolic_batch_pads_and_runs_where_tvm_would_not_fuse(cpu):
    """A constant pad of a tensor with a symbolic batch fuses (Injective); a reflect pad is
    Opaque to TVM there, a kernel of its own; both compile and run at any batch."""
    mod = dpl.parse("""
func main(x: f32[n, 3, 4]) -> (f32[n, 5, 4], f32[n, 3, 9]) {
  e = exp(x)
  c = nn.pad(e, pad_width=[0, 0, 1, 1, 0, 0], pad_value=1.0)
  a = add(c, 1.0)
  r = nn.pad(e, pad_width=[0, 0, 0, 0, 2, 3], pad_mode="reflect")
  b = add(r, 1.0)
  return (a, b)
}""")
    assert dpl.op_kind(mod["main"].bindings[1].value) == dpl.OpPatternKind.INJECTIVE
    assert dpl.op_kind(mod["main"].bindings[3].value) == dpl.OpPatternKind.OPAQUE
    exe = compiled(mod, cpu)
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 4)).astype(np.float32)
        for g, w in zip(exe(x), dpl.interpret(mod, x)):
            np.testing.assert_allclose(g, w, rtol=1e-6)


def test_a_symbolic_axis_pads_by_clamps_and_a_select_and_refuses_to_wrap(cpu):
    """Padding the symbolic axis itself (n + 3 rows): a constant or replicate pad compares and
    clamps against n at run time; a reflect or circular pad would wrap by n, and has no kernel."""
    text = """
func main(x: f32[n, 4]) -> (f32[n + 3, 4], f32[n + 3, 4]) {{
  e = exp(x)
  c = nn.pad(e, pad_width=[1, 2, 0, 0], pad_value=0.5)
  r = nn.pad(e, pad_width=[2, 1, 0, 0], pad_mode="{mode}")
  return (c, r)
}}"""
    mod = dpl.parse(text.format(mode="replicate"))
    exe = compiled(mod, cpu)
    for rows in (1, 5):
        x = np.random.default_rng(rows).standard_normal((rows, 4)).astype(np.float32)
        e = np.exp(x)
        want = (np.pad(e, [(1, 2), (0, 0)], constant_values=0.5), np.pad(e, [(2, 1), (0, 0)], "edge"))
        for got in (dpl.interpret(mod, x), exe(x)):
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-6)
    reflect = dpl.parse(text.format(mode="reflect"))
    with pytest.raises(dpl.kernel.LoweringError, match="a reflect pad of axis 0, of the symbolic size n, has no kernel"):
        lower_function(reflect["main"])


@pytest.mark.parametrize("padding", [[1, 2], [0, 2, 1, 0]])
def test_a_zero_pad_before_a_convolution_becomes_its_padding(cpu, padding):
    """``rewrites``' conv2d_zero_pad: a zero pad of the spatial axes only, no crop; any other
    pad stays a pad."""
    rules = dpl.load_patterns("rewrites")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    for widths, value, folds in (([0, 0, 0, 0, 1, 2, 3, 0], 0.0, True), ([0, 0, 0, 0, 1, 2, 3, 0], 0.5, False),
                                 ([0, 0, 0, 0, 1, -1, 0, 0], 0.0, False), ([0, 0, 2, 2, 1, 1, 1, 1], 0.0, False)):
        channels = 4 + widths[2] + widths[3]
        w = rng.standard_normal((6, channels // 2, 3, 3)).astype(np.float32)
        fb = dpl.ir.FunctionBuilder("main")
        px, pw = fb.param("x", "f32", x.shape), fb.param("w", "f32", w.shape)
        p = fb.emit("nn.pad", px, pad_width=widths, pad_value=value, name="p")
        fn = fb.ret(fb.emit("nn.conv2d", p, pw, padding=padding, strides=2, groups=2, name="c"))
        new = rules.apply_rewrites(fn)
        assert [b.value.op for b in new.bindings] == (["nn.conv2d"] if folds else ["nn.pad", "nn.conv2d"]), widths
        np.testing.assert_allclose(dpl.interpret(new, x, w), dpl.interpret(fn, x, w), rtol=1e-5, atol=1e-5)
    torch = needs.package("torch")
    model = torch.nn.Sequential(torch.nn.ZeroPad2d((1, 2, 0, 1)), torch.nn.Conv2d(4, 6, 3, padding=1)).eval()
    xt = torch.from_numpy(x)
    mod = dpl.apply(dpl.from_torch(model, (xt,)), ["rewrites"])
    assert not any(b.value.op == "nn.pad" for f in mod.functions.values() for b in f.bindings
                   if isinstance(b.value, dpl.Call) and isinstance(b.value.op, str))
    got = dpl.build(mod, [cpu, "numpy"], config=ALWAYS)(x)
    np.testing.assert_allclose(got, model(xt).detach().numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("call, message", [
    ('nn.pad(x, pad_width=[1, 1])', "a (before, after) pair for each of the 2 axes"),
    ('nn.pad(x, pad_width=[0, 0, -5, 0])', "would have a negative size"),
    ('nn.pad(x, pad_width=[0, 0, 1, 0], pad_mode="edge")', "pad_mode 'edge' is not one of"),
    ('nn.pad(e, pad_width=[0, 0, 1, 0], pad_mode="reflect")', "axis 1 is empty"),
    ('nn.pad(i, pad_width=[0, 0, 1, 0], pad_value=0.5)', "0.5 is no value of int32"),
    ('nn.pad(i, pad_width=[0, 0, 1, 0], pad_value=3000000000)', "outside the range of int32"),
    ("mod(b, b)", "'mod' has no boolean form"),
    ("floor(i)", "must have a floating-point dtype"),
])
def test_bad_calls_are_located_type_errors(call, message):
    text = f"""func main(x: f32[n, 4], e: f32[2, 0], i: i32[2, 3], b: bool[3]) -> f32[n, 4] {{
  y = {call}
  return x
}}"""
    with pytest.raises(TypeInferenceError) as info:
        dpl.parse(text, "bad.ir")
    assert str(info.value).startswith("bad.ir:2:7: error: op '"), str(info.value)
    assert message in info.value.message


# -- torch -----------------------------------------------------------------------------------------


def test_torch_models_using_them_compute_torchs_numbers(cpu):
    torch = needs.package("torch")
    import torch.nn.functional as F
    from torch import nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.pad = nn.ReflectionPad2d((1, 1, 2, 2))
            self.zero = nn.ZeroPad2d((1, 0, 0, 1))
            self.edge = nn.ReplicationPad1d(2)

        def forward(self, x):
            y = F.hardswish(self.conv(self.pad(x)))
            z = self.zero(y)
            flat = z.flatten(2)
            return (F.mish(z) + F.softplus(z, beta=2, threshold=3) + F.hardsigmoid(z), torch.fmod(z, 0.7),
                    torch.remainder(z, -0.6), torch.round(z * 4), torch.round(z, decimals=1), torch.floor(z),
                    torch.ceil(z), torch.trunc(z * 3), torch.sign(z), torch.log1p(z.abs()), torch.expm1(z),
                    self.edge(flat), F.pad(flat, (3, 1), mode="circular"), F.pad(z, (-1, 2, 1, -1), value=0.5),
                    torch.tile(z, (1, 2, 1, 1)))

    torch.manual_seed(0)
    model = Model().eval()
    x = torch.randn(2, 3, 7, 7) * 2
    mod = dpl.from_torch(model, (x,))
    ops = {b.value.op for b in mod["main"].bindings if isinstance(b.value, dpl.Call)}
    assert {"nn.pad", "nn.softplus", "mod", "floor_mod", "round", "log1p", "expm1", "sign"} <= ops
    want = [w.detach().numpy() for w in model(x)]
    for got in (dpl.interpret(mod, x.numpy()), compiled(mod, cpu)(x.numpy())):
        for k, (g, w) in enumerate(zip(got, want)):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"output {k}")


def test_torch_integer_remainders_and_the_zero_divisor(cpu):
    """torch's integer fmod and remainder where torch defines them; over 0 torch's CPU kernels
    raise, and dpl gives 0 (the value of an integer ``divide`` by 0)."""
    torch = needs.package("torch")
    from torch import nn

    class Model(nn.Module):
        def forward(self, a, b):
            return torch.fmod(a, b), torch.remainder(a, b), torch.remainder(a, 3), torch.sign(a), torch.floor(a)

    a = torch.arange(-12, 12, dtype=torch.int32).reshape(4, 6)
    b = torch.tensor([[5, -5, 3, -3, 7, -1]], dtype=torch.int32).expand(4, 6).contiguous()
    mod = dpl.from_torch(Model(), (a, b))
    for got in (dpl.interpret(mod, a.numpy(), b.numpy()), compiled(mod, cpu)(a.numpy(), b.numpy())):
        for g, w in zip(got, Model()(a, b)):
            np.testing.assert_array_equal(g, w.numpy())
    zero = b.numpy().copy()
    zero[:, 0] = 0
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        Model()(a, torch.from_numpy(zero))
    got = compiled(mod, cpu)(a.numpy(), zero)
    assert (got[0][:, 0] == 0).all() and (got[1][:, 0] == 0).all()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_hard_activations_in_16_bits_compute_in_float_as_torch_does(dtype):
    torch = needs.package("torch")
    import torch.nn.functional as F
    from torch import nn

    class Model(nn.Module):
        def forward(self, x):
            return F.hardswish(x), F.hardsigmoid(x), F.mish(x), F.softplus(x)

    x = (torch.randn(64) * 4).to(getattr(torch, dtype))
    mod = dpl.from_torch(Model(), (x,))
    if dtype == "bfloat16":
        import ml_dtypes

        arg = x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    else:
        arg = x.numpy()
    for g, w in zip(dpl.interpret(mod, arg), Model()(x)):
        w = w.float().numpy()
        ulp = 2.0 ** (-7 if dtype == "bfloat16" else -10)
        np.testing.assert_allclose(g.astype(np.float32), w, rtol=ulp, atol=ulp)
