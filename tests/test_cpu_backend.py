"""The generated-C CPU backend: every module of the corpus and every FuseOps group of the
random-DAG corpus, built for "cpu" with fusion always on and fall-back off, equals the
interpreter, and every kernel ran compiled on the CPU; the disk cache is safe."""

import ctypes
import multiprocessing
import shutil
from pathlib import Path

import attrs
import numpy as np
import pytest

import needs

import dpl
from dpl.backends.cgen.emitter import emit_kernel
from dpl.backends.cpu.backend import CpuBackend, KernelCache
from dpl.ir import FunctionBuilder, Module, const
from dpl.kernel import lower_function
from dpl.transform import fuse_ops

from runtime_corpus import CORPUS, inputs_for
from test_fuse_ops import RandomDag

@pytest.fixture(autouse=True)
def c_compiler():
    """These tests need the system C compiler: missing, they skip locally but fail under CI
    (as the TVM oracle does), so CI can never stop running them silently."""
    needs.c_compiler()

EXAMPLES = Path(__file__).parent.parent / "examples"
ALWAYS = dpl.FusionConfig(min_nodes_for_fusion=1, max_graph_size=10_000, min_tensor_elements=0, fallback_on_error=False)


@pytest.fixture(scope="module", params=["plain", "streamed"])
def cpu(request, tmp_path_factory):
    """A CPU backend with its own cache directory, registered for these tests; "streamed" writes
    every output with streaming stores, so the corpus checks that path on small shapes too."""
    from dpl.backends.registry import get_backend, register_backend

    old = get_backend("cpu")
    backend = CpuBackend(cache_dir=tmp_path_factory.mktemp("kernels"), stream_bytes=0 if request.param == "streamed" else None)
    register_backend(backend)
    yield backend
    register_backend(old)


def random_args(func, seed=0):
    rng = np.random.default_rng(seed)
    dims = {}
    return [rng.standard_normal(tuple(dims.setdefault(d, 6) if isinstance(d, str) else d for d in p.ty.shape))
            .astype(dpl.dtypes.to_numpy(p.ty.dtype)) for p in func.params]


def assert_close(want, got, dtype_tol=None):
    for w, g in zip(want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,)):
        # f32: rtol 1e-5; reductions and matrix products sum in float32 in another order than the
        # reference (the numerical contract fixes the accumulator, not the order), so the absolute
        # tolerance scales with the output's magnitude
        # (cancellation in long dot products); f16 gets its own precision
        scale = float(np.abs(w.astype(np.float64)).max()) if w.size else 1.0
        rtol, atol = (5e-3, 5e-3 * max(scale, 1)) if w.dtype == np.float16 else dtype_tol or (1e-5, 2e-6 * max(scale, 1))
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol)


def ran_compiled_on_cpu(exe):
    """Every function of the summary runs on cpu, none by fall-back."""
    summary = exe.summary()
    rows = summary.split("functions:")[1].split("plan for")[0].strip().splitlines()
    return bool(rows) and all("-> cpu (" in r and "fall-back" not in r for r in rows), summary


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.ir")), ids=lambda p: p.stem)
@pytest.mark.parametrize("libraries", [[], ["rewrites", "llm", "cublas"]], ids=["auto", "patterns"])
def test_examples_on_cpu_equal_the_interpreter(cpu, example, libraries):
    mod = dpl.load(example)
    fused = dpl.apply(mod, libraries, fuse_reductions=True)
    exe = dpl.build(fused, "cpu", config=ALWAYS)
    args = random_args(mod["main"])
    assert_close(dpl.interpret(mod, *args), exe(*args))
    ok, summary = ran_compiled_on_cpu(exe)
    assert ok, summary


def test_random_dag_groups_on_cpu(cpu):
    checked = 0
    for seed in range(0, 300, 3):
        func = RandomDag(seed).build()
        fused = fuse_ops(Module([func]))
        for fn in fused.functions.values():
            if "Primitive" not in fn.attrs:
                continue
            kernel = cpu.compile(fn, module=fused)
            args = random_args(fn, seed)
            want = dpl.interpret(fn, *args)
            wants = want if isinstance(want, tuple) else (want,)
            outs = [np.empty_like(w) for w in wants]
            kernel(args, outs)
            assert_close(want, tuple(outs) if isinstance(want, tuple) else outs[0])
            checked += 1
    assert checked >= 60


def elementwise_special_values():
    fb = FunctionBuilder("main", attrs={"Primitive": True})
    x = fb.param("x", "f32", (8,))
    e = fb.emit("exp", x)
    s = fb.emit("sigmoid", e)
    t = fb.emit("tanh", fb.emit("log", x))
    return fb.ret(fb.emit("add", s, t))


def test_transcendentals_keep_nan_and_inf(cpu):
    fn = elementwise_special_values()
    kernel = cpu.compile(fn, module=Module([fn]))
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -1.0, 1e-30, 88.7, -200.0], np.float32)
    out = np.empty(8, np.float32)
    with np.errstate(all="ignore"):
        want = dpl.interpret(fn, x)
    kernel([x], [out])
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    np.testing.assert_allclose(out[~np.isnan(want)], want[~np.isnan(want)], rtol=1e-5, atol=1e-6)


def streaming_kernels():
    """Row, elementwise and two-output groups, over static and symbolic shapes and both float types."""
    text = """
func row(x: f32[n, 37], w: f32[37]) -> f32[n, 37] {
  y = nn.rms_norm(x, w, epsilon=1e-05)
  return y
}
func flat(x: f64[m]) -> f64[m] {
  y = tanh(multiply(x, 3.0:f64))
  return y
}
func pair(x: f32[5, 203], b: f32[203]) -> (f32[5, 203], f32[5, 203]) {
  s = add(x, b)
  y = sigmoid(s)
  return (s, y)
}"""
    mod = dpl.parse(text)
    return [mod[name] for name in ("row", "flat", "pair")]


@pytest.mark.parametrize("stream_bytes", [0, 2048], ids=["always", "past-2KiB"])
def test_streaming_stores_equal_the_interpreter_at_any_alignment(tmp_path, stream_bytes):
    """Streamed outputs land at every alignment (views one element into a larger array), with
    heads and tails that are not whole vectors, and on both sides of a run-time size test."""
    backend = CpuBackend(cache_dir=tmp_path, stream_bytes=stream_bytes)
    for fn in streaming_kernels():
        kernel = backend.compile(fn, module=Module([fn]))
        assert "dpl_put_f" in kernel.source
        for rows, shift in [(1, 0), (3, 1), (64, 3), (200, 5)]:
            args = random_args(fn, rows)
            if fn.name != "pair":
                args = [np.resize(a, (rows, *a.shape[1:])) if a.shape[0] == 6 else a for a in args]
            want = dpl.interpret(fn, *args)
            wants = want if isinstance(want, tuple) else (want,)
            outs = []
            for w in wants:  # a view ``shift`` elements into a larger buffer: not vector-aligned
                backing = np.full(w.size + 8, np.nan, w.dtype)
                outs.append(backing[shift:shift + w.size].reshape(w.shape))
            kernel(args, outs)
            for w, o in zip(wants, outs):
                assert_close(w, o)
                assert np.isnan(o.base[:shift]).all() and np.isnan(o.base[shift + w.size:]).all()  # no stray writes


def test_streaming_only_past_the_threshold():
    row = streaming_kernels()[0]
    assert "dpl_put_f32" not in emit_kernel(lower_function(row), stream_bytes=None)
    assert "dpl_put_f32" in emit_kernel(lower_function(row), stream_bytes=0)
    source = emit_kernel(lower_function(row), stream_bytes=1 << 20)  # symbolic rows: tested at run time
    assert "if (v_n * 37LL * 4 >= 1048576LL)" in source
    static = dpl.parse("func f(x: f32[64, 64]) -> f32[64, 64] {\n  y = exp(x)\n  return y\n}")["f"]
    assert "dpl_put_f32" not in emit_kernel(lower_function(static), stream_bytes=64 * 64 * 4 + 1)
    assert "dpl_put_f32" in emit_kernel(lower_function(static), stream_bytes=64 * 64 * 4)


def test_flags_and_source():
    fn = elementwise_special_values()
    source = emit_kernel(lower_function(fn))
    assert "#pragma omp" in source and "tgmath.h" in source
    flags = KernelCache().flags()
    assert "-O3" in flags


def _compile_in_child(args):
    cache_dir, source = args
    lib = KernelCache(cache_dir).load(source)
    return bool(lib)


def test_cache_hit_miss_corrupt_foreign_and_concurrent(tmp_path):
    import json

    source = emit_kernel(lower_function(elementwise_special_values()))
    cache = KernelCache(tmp_path / "a")
    cache.load(source)
    assert cache.compiles == 1  # miss
    again = KernelCache(tmp_path / "a")
    again.load(source)
    assert again.compiles == 0  # hit on disk
    key = cache.key(source)
    corrupt = tmp_path / "b"
    corrupt.mkdir()
    (corrupt / f"{key}.so").write_bytes(b"not a shared object")
    (corrupt / f"{key}.json").write_text(json.dumps({"key": key}))
    rebuilt = KernelCache(corrupt)
    rebuilt.load(source)
    assert rebuilt.compiles == 1  # a corrupt entry is rebuilt, never trusted
    foreign = tmp_path / "c"
    foreign.mkdir()
    shutil.copy(tmp_path / "a" / f"{key}.so", foreign / f"{key}.so")
    (foreign / f"{key}.json").write_text(json.dumps({"key": "built-for-another-cpu"}))
    stranger = KernelCache(foreign)
    stranger.load(source)
    assert stranger.compiles == 1  # an entry whose manifest is not this host's key is rebuilt
    # the key itself covers the CPU: another CPU identity gives another key, so another entry
    import dpl.backends.cpu.toolchain as cb  # where the key is made

    original = cb.cpu_identity
    try:
        cb.cpu_identity = lambda: "another-cpu"
        assert KernelCache(tmp_path / "a").key(source) != key
    finally:
        cb.cpu_identity = original
    # two processes compiling the same new kernel at once both succeed
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        assert pool.map(_compile_in_child, [(str(tmp_path / "race"), source + "\n/* race */\n")] * 2) == [True, True]


def test_compile_errors_are_clear(tmp_path):
    fb = FunctionBuilder("main", attrs={"Primitive": True})
    x = fb.param("x", "f32", (4, 4))
    y = fb.emit("cumsum", x, axis=0)  # a scan: no kernel lowering (a lone one runs as NumPy's)
    fn = fb.ret(fb.emit("add", y, y))
    with pytest.raises(dpl.DplError, match="has no C kernel"):
        CpuBackend(cache_dir=tmp_path).compile(fn, module=Module([fn]))
    with pytest.raises(dpl.DplError, match="the C compiler failed"):
        KernelCache(tmp_path).load("this is not C;")


def test_no_compiler_means_numpy_with_one_warning():
    backend = CpuBackend(cc="dpl-no-such-compiler")
    with pytest.warns(RuntimeWarning, match="no C compiler .* runs on the NumPy backend") as record:
        assert backend.available() == (False, "no C compiler ('dpl-no-such-compiler') on this machine")
        backend.available()
    assert len(record) == 1


def test_blas_epilogue_runs_on_one_thread_and_restores_the_setting(tmp_path):
    """The epilogue after a BLAS call caps its OpenMP team at one thread (BLAS workers still spin
    on the other cores) and gives the calling thread its setting back."""
    import ctypes

    mod = dpl.parse("""
func main(x: f32[16, 32], w: f32[32, 24], u: f32[16, 24]) -> f32[16, 24] {
  g = matmul(x, w)
  h = multiply(nn.silu(g), u)
  return h
}""")
    fused = dpl.apply(mod)
    fn = next(f for f in fused.functions.values() if "Primitive" in f.attrs)
    # NumPy's BLAS named: "auto" takes whichever measured fastest here, cached from an earlier run
    kernel = CpuBackend(cache_dir=tmp_path, products="numpy").compile(fn, module=fused)
    assert kernel.__qualname__.startswith("cpu-blas+c:")
    assert [part.threads for part in kernel.parts] == [1]
    try:
        gomp = ctypes.CDLL("libgomp.so.1")  # the OpenMP runtime gcc's -fopenmp links
    except OSError:
        needs.missing("the kernels do not use GNU OpenMP (libgomp) here")
    before = gomp.omp_get_max_threads()
    gomp.omp_set_num_threads(3)
    try:
        args = random_args(fn)
        out = np.empty((16, 24), np.float32)
        kernel(args, [out])
        assert gomp.omp_get_max_threads() == 3
    finally:
        gomp.omp_set_num_threads(before)
    assert_close(dpl.interpret(fn, *args), out)


SOFTMAXES = """
func fused(x: f32[6, 300]) -> f32[6, 300] {
  y = nn.softmax(x)
  return y
}
func decomposed(x: f32[6, 300]) -> f32[6, 300] {
  m = max(x, axis=[-1], keepdims=true)
  e = exp(subtract(x, m))
  s = sum(e, axis=[-1], keepdims=true)
  y = divide(e, s)
  return y
}
func wide(x: f32[2, 20000]) -> f32[2, 20000] {
  y = nn.softmax(x)
  return y
}
func dynamic(x: f32[6, n]) -> f32[6, n] {
  y = nn.softmax(x)
  return y
}"""


@pytest.mark.parametrize("name, kept", [("fused", True), ("decomposed", True), ("wide", False), ("dynamic", False)])
def test_softmax_keeps_its_exponentials_in_a_row_buffer(tmp_path, name, kept):
    """exp(x - max) is computed once, in the sum, and read back by the normalising loop, for
    static rows of at most 64 KiB; wider or symbolic rows compute it twice."""
    mod = dpl.apply(dpl.parse(SOFTMAXES), fuse_reductions=True)
    fn = mod[mod["decomposed"].bindings[0].value.op.name] if name == "decomposed" else mod[name]  # its row group
    source = emit_kernel(lower_function(fn), stream_bytes=None)
    body = source[source.index("void dpl_kernel"):]
    assert ("dpl_row0[" in body) is kept
    assert body.count("exp(") == (1 if kept else 2)
    kernel = CpuBackend(cache_dir=tmp_path).compile(fn, module=mod)
    args = random_args(fn)
    args[0] *= 30  # a wide range: the max subtraction matters
    out = np.empty_like(dpl.interpret(fn, *args))
    kernel(args, [out])
    assert_close(dpl.interpret(fn, *args), out)


SEGMENTED = """
func attention(q: f32[2, 8, 4], k: f32[2, 4, 8], v: f32[2, 8, 4], mask: f32[8, 8]) -> f32[2, 8, 4] {
  s = matmul(q, k)
  z = add(multiply(s, 0.5), mask)
  p = nn.softmax(z)
  out = matmul(p, v)
  return out
}
func prologue(x: f32[n, 16], w: f32[16, 8], b: f32[8]) -> f32[n, 8] {
  h = nn.relu(x)
  y = matmul(h, w)
  out = add(y, b)
  return out
}
func both(x: f32[5, 6], w: f32[6, 7]) -> (f32[5, 7], f32[5, 7]) {
  y = matmul(x, w)
  t = tanh(y)
  return (y, t)
}
func chain(x: f32[4, 6], w1: f32[6, 6], w2: f32[6, 3]) -> f32[4, 3] {
  a = matmul(x, w1)
  b = matmul(a, w2)
  return b
}"""


@pytest.mark.parametrize("name", ["attention", "prologue", "both", "chain"])
def test_groups_with_products_run_blas_between_c_parts(tmp_path, name):
    """Each product goes to BLAS and each run of other bindings to one C kernel: two products
    with a softmax between them, a product whose operand the group computes, a product that is
    also a result, two products in a row; outputs written in place; symbolic rows."""
    mod = dpl.parse(SEGMENTED)
    fn = attrs.evolve(mod[name], attrs={"Primitive": True})
    kernel = CpuBackend(cache_dir=tmp_path).compile(fn, module=Module([fn]))
    assert kernel.__qualname__.startswith("cpu-blas+c:")
    expected_parts = {"attention": 1, "prologue": 2, "both": 1, "chain": 0}[name]
    assert len(kernel.parts) == expected_parts
    for seed in (1, 2):
        args = random_args(fn, seed)
        if name == "prologue":
            args[0] = np.resize(args[0], (3 + seed, 16))
        want = dpl.interpret(fn, *args)
        wants = want if isinstance(want, tuple) else (want,)
        outs = [np.empty_like(w) for w in wants]
        kernel(args, outs)
        assert_close(want, tuple(outs) if isinstance(want, tuple) else outs[0])


BF16 = """
func cast(x: f32[1000]) -> bf16[1000] {
  y = astype(x, dtype=bf16)
  return y
}
func widen(x: bf16[300]) -> f32[300] {
  y = astype(x, dtype=f32)
  return y
}
func chain(x: bf16[8, 64], w: bf16[64]) -> bf16[8, 64] {
  y = nn.rms_norm(x, w, epsilon=1e-05)
  z = nn.silu(y)
  return z
}"""


def test_bfloat16_is_stored_as_bits_and_computed_in_float(tmp_path):
    """bfloat16 compiles: loads widen exactly, stores round to nearest even (NaN stays NaN,
    overflow goes to infinity), bit for bit with ml_dtypes; a chain keeps its intermediates in
    float32 where the interpreter rounds each op to bfloat16, so it agrees to bfloat16 precision
    (rtol 2e-2, a couple of bfloat16 ulps)."""
    ml_dtypes = needs.package("ml_dtypes")
    mod = dpl.parse(BF16)
    backend = CpuBackend(cache_dir=tmp_path)
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(1000) * 10).astype(np.float32)
    x[:8] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 3.4e38, 1.00390625, 1.01171875]  # the last two: ties
    cases = {"cast": [x], "widen": [rng.standard_normal(300).astype(ml_dtypes.bfloat16)],
             "chain": [rng.standard_normal((8, 64)).astype(ml_dtypes.bfloat16), rng.standard_normal(64).astype(ml_dtypes.bfloat16)]}
    for name, args in cases.items():
        fn = attrs.evolve(mod[name], attrs={"Primitive": True})
        kernel = backend.compile(fn, module=Module([fn]))
        want = dpl.interpret(fn, *args)
        out = np.empty_like(want)
        kernel(args, [out])
        if name == "chain":
            np.testing.assert_allclose(out.astype(np.float32), want.astype(np.float32), rtol=2e-2, atol=2e-2)
        else:
            np.testing.assert_array_equal(out.view(np.uint16 if out.dtype.itemsize == 2 else np.uint32),
                                          want.view(np.uint16 if want.dtype.itemsize == 2 else np.uint32))
    exe = dpl.build(dpl.apply(dpl.parse(BF16.replace("func chain", "func main"))), "cpu", config=ALWAYS)
    ok, summary = ran_compiled_on_cpu(exe)  # no fall-back to NumPy for bfloat16
    assert ok, summary


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_runtime_corpus_on_cpu_runs_compiled(cpu, case):
    """The runtime corpus (single ops, groups, composites, codegen wrappers, tuples, symbolic
    dims), heuristics off and fall-back off: equal to the interpreter, every kernel compiled."""
    make, dims = CORPUS[case]
    mod = make()
    exe = dpl.build(mod, "cpu", config=ALWAYS)
    args = inputs_for(mod, dims)
    assert_close(dpl.interpret(mod, *args), exe(*args))
    ok, summary = ran_compiled_on_cpu(exe)
    assert ok, summary


def test_bool_buffers_are_bytes_and_stores_write_0_or_1(tmp_path):
    """Bool buffers are uint8_t in the C (GCC vectorises those loads, not _Bool's); a bool ->
    float max reads them as 0/1, and a float -> bool store of 0.5, -0.0, NaN and inf writes the
    bytes 1, 0, 1, 1, as NumPy's astype does."""
    mod = dpl.parse("""
func main(a: bool[3, 40], x: f32[3, 40]) -> (f32[3, 1], bool[3, 40], bool[3, 40]) {
  b = astype(a, dtype=f32)
  c = max(b, axis=[-1], keepdims=true)
  d = astype(x, dtype=bool)
  e = minimum(a, d)
  return (c, d, e)
}""")
    fused = fuse_ops(mod)
    group = next(f for n, f in fused.functions.items() if n != "main")
    source = emit_kernel(lower_function(group))
    assert "const uint8_t *restrict" in source and "const bool *" not in source
    exe = dpl.build(fused, [CpuBackend(cache_dir=tmp_path), "numpy"], config=ALWAYS)
    rng = np.random.default_rng(3)
    a = rng.random((3, 40)) > 0.5
    a[1] = False
    x = rng.choice(np.array([0.0, 0.5, -0.0, np.nan, np.inf, -2.0], np.float32), (3, 40))
    got, want = exe(a, x), dpl.interpret(mod, a, x)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert set(np.unique(got[1].view(np.uint8))) <= {0, 1} and set(np.unique(got[2].view(np.uint8))) <= {0, 1}
    assert "cpu" in exe.summary()


@pytest.mark.parametrize("march", ["native", "haswell", "x86-64"])
def test_a_tile_turned_in_registers_is_numpys_transpose_at_every_instruction_set(tmp_path, march):
    """``dpl_transpose16`` in each of its forms (AVX-512's 16-lane rows, the 8-lane pairs of
    AVX2 and of SSE's split vectors): bit for bit NumPy's transpose of random 16 x 16 tiles of
    4-byte values, NaN payloads and all, built for this CPU and for older ones it runs."""
    needs.c_compiler()
    from dpl.backends.cgen.emitter import TRANSPOSE16
    from dpl.backends.cpu.toolchain import march_missing

    if march != "native" and march_missing("cc", march) != ():
        pytest.skip(f"this CPU or compiler does not run -march={march}")
    source = ("#include <stdint.h>\n" + TRANSPOSE16 +
              "void dpl_kernel(void **b, const int64_t *d) { for (int64_t i = 0; i < d[0]; ++i) "
              "dpl_transpose16((uint32_t *)b[0] + 256 * i); }\n")
    lib = KernelCache(tmp_path, march=march).load(source)
    rng = np.random.default_rng(16)
    tiles = rng.integers(0, 2**32, (20, 16, 16), dtype=np.uint64).astype(np.uint32)
    want = tiles.transpose(0, 2, 1).copy()
    lib.dpl_kernel((ctypes.c_void_p * 1)(tiles.ctypes.data), (ctypes.c_int64 * 1)(len(tiles)))
    np.testing.assert_array_equal(tiles, want)


@pytest.mark.parametrize("dtype", ["f32", "i32", "f16", "bf16", "i64", "bool"])
@pytest.mark.parametrize("rows, cols", [(16, 16), (17, 33), (64, 130)])
def test_transposes_run_in_tiles_and_equal_the_interpreter(tmp_path, dtype, rows, cols):
    """A permute_dims that swaps the last two axes (with an elementwise op before it and a
    second output of the same transpose) is emitted in 16 x 16 tiles, ragged edges included,
    and equals the interpreter; a copy that does not transpose keeps the plain loops. Tiles of
    4-byte elements are turned in registers where they are full (``dpl_transpose16``)."""
    scalar = "1" if dtype in ("i64", "i32", "bool") else "1.5"
    op = "maximum" if dtype == "bool" else "add"
    mod = dpl.parse(f"""
func main(x: {dtype}[3, {rows}, {cols}], y: {dtype}[{cols}]) -> ({dtype}[3, {cols}, {rows}], {dtype}[3, {cols}, {rows}], {dtype}[3, {rows}, {cols}]) {{
  a = {op}(x, y)
  t = permute_dims(a, axes=[0, 2, 1])
  u = {op}(t, {scalar}:{dtype})
  c = {op}(x, x)
  return (t, u, c)
}}""")
    fused = fuse_ops(mod, dpl.FusionConfig(min_nodes_for_fusion=1, max_graph_size=10_000, min_tensor_elements=0))
    groups = [f for n, f in fused.functions.items() if n != "main"]
    sources = [emit_kernel(lower_function(g)) for g in groups]
    assert any("dpl_tile0" in s for s in sources), sources
    assert all("dpl_tile" not in s for g, s in zip(groups, sources) if "permute_dims" not in g.name)
    assert any("dpl_transpose16(dpl_tile" in s for s in sources) == (dtype in ("f32", "i32"))
    exe = dpl.build(fused, [CpuBackend(cache_dir=tmp_path), "numpy"], config=ALWAYS)
    rng = np.random.default_rng(rows * cols)
    args = []
    for p in mod["main"].params:
        np_dtype = dpl.dtypes.to_numpy(p.ty.dtype)
        v = rng.standard_normal(p.ty.shape) * 4
        args.append((v > 0) if np_dtype == np.bool_ else v.astype(np_dtype))
    for got, want in zip(exe(*args), dpl.interpret(mod, *args)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_rebuild_lowers_nothing_again_and_names_stay_its_own(tmp_path, monkeypatch):
    """The kernel IR and C of a group are remembered by structure, parameter types and emitter
    options: a second build of the same module lowers nothing, another shape lowers again,
    and a same-structure group under another name keeps its own name."""
    import dpl.kernel

    lowered = []
    real = dpl.kernel.lower_function
    monkeypatch.setattr(dpl.kernel, "lower_function", lambda fn, *a, **k: lowered.append(fn.name) or real(fn, *a, **k))

    def module(n, seed):
        return dpl.parse(f"""
func main(x: f32[{n}, 24]) -> f32[{n}, 24] {{
  a = multiply(x, {seed}.5)
  b = nn.silu(a)
  return b
}}""")

    backend = lambda: CpuBackend(cache_dir=tmp_path)  # noqa: E731
    x = np.random.default_rng(0).standard_normal((5, 24)).astype(np.float32)
    first = dpl.build(fuse_ops(module(5, 7919)), [backend(), "numpy"], config=ALWAYS)
    count = len(lowered)
    assert count >= 1  # constants no other test uses: nothing remembered yet
    again = dpl.build(fuse_ops(module(5, 7919)), [backend(), "numpy"], config=ALWAYS)
    assert len(lowered) == count
    np.testing.assert_array_equal(again(x), first(x))
    dpl.build(fuse_ops(module(6, 7919)), [backend(), "numpy"], config=ALWAYS)
    assert len(lowered) == count + 1  # another shape: another kernel
    dpl.build(fuse_ops(module(5, 7920)), [backend(), "numpy"], config=ALWAYS)
    assert len(lowered) == count + 2  # another constant: another kernel
    fn = fuse_ops(module(5, 7919))
    group = next(f for n, f in fn.functions.items() if n != "main")
    kernel = CpuBackend(cache_dir=tmp_path).compile(attrs.evolve(group, name="another_name"))
    assert len(lowered) == count + 2 and "another_name" in kernel.__qualname__


@pytest.mark.parametrize("axis", [0, 1])
def test_a_lone_take_runs_into_its_output_and_refuses_indices_out_of_range(tmp_path, axis):
    """An embedding lookup (a lone take along an axis, its table a parameter or a constant) runs
    on the CPU backend as NumPy's take into the output: negative indices in range wrap as NumPy's
    do, and one out of range raises NumPy's IndexError, as the reference backend does."""
    rng = np.random.default_rng(axis)
    table = rng.standard_normal((10, 12)).astype(np.float32)
    shape = [10, 12]
    out = [2, 5]
    out_shape = out + [12] if axis == 0 else [10] + out
    n = shape[axis]
    for constant in (False, True):
        fb = FunctionBuilder("main")
        t = const(table) if constant else fb.param("t", "f32", tuple(shape))
        i = fb.param("i", "i64", tuple(out))
        mod = Module([fb.ret(fb.emit("take", t, i, axis=axis))])
        exe = dpl.build(mod, [CpuBackend(cache_dir=tmp_path), "numpy"], config=ALWAYS, progress=False)
        assert "-> cpu" in exe.summary() and not exe.fallbacks
        idx = np.array([[0, 1, -1, n - 1, -n], [3, 3, 3, 3, 2]])
        args = [idx] if constant else [table, idx]
        got = exe(*args)
        assert got.shape == tuple(out_shape)
        np.testing.assert_array_equal(got, np.take(table, idx, axis=axis))
        with pytest.raises(IndexError, match=f"index {n} is out of bounds"):
            exe(*([np.array([[0, 1, 2, 3, n], [0] * 5])] if constant else [table, np.array([[0, 1, 2, 3, n], [0] * 5])]))


@pytest.mark.parametrize("dt, shape, axis, index_dtype", [
    ("f32", (5, 7, 3), 1, np.int32), ("f16", (9, 4), 0, np.uint8), ("i64", (6,), 0, np.int16), ("f64", (2, 3, 11), -1, np.int64),
])
def test_a_lone_take_is_one_c_call_at_every_width(tmp_path, monkeypatch, dt, shape, axis, index_dtype):
    """The lookup's C routine (backends/cpu/take.py), not NumPy's take: any element size, index
    widths from 8 to 64 bits, negative indices from the end, every call of the executable (the
    first and the prepared ones after it) the reference's bytes, and an index out of range
    NumPy's IndexError at every call, nothing written before the check."""
    from dpl.backends.cpu import take

    rng = np.random.default_rng(len(shape))
    table = (rng.standard_normal(shape) * 100).astype({"f32": np.float32, "f16": np.float16, "i64": np.int64, "f64": np.float64}[dt])
    n = shape[axis]
    idx = np.array([[0, n - 1, 1], [n - 1, 0, 2]], index_dtype)
    if np.issubdtype(index_dtype, np.signedinteger):
        idx[1, 2] = -n
    fb = FunctionBuilder("main")
    t, i = fb.param("t", dt, shape), fb.param("i", np.dtype(index_dtype).name.replace("int", "i").replace("ui", "u"), idx.shape)
    mod = Module([fb.ret(fb.emit("take", t, i, axis=axis))])
    want = np.take(table, idx, axis=axis)
    exe = dpl.build(mod, [CpuBackend(cache_dir=tmp_path), "numpy"], config=ALWAYS, progress=False)
    monkeypatch.setattr(take.np, "take", lambda *a, **k: pytest.fail("NumPy's take ran"))
    for _ in range(3):
        np.testing.assert_array_equal(exe(table, idx), want)
    bad = idx.copy()
    bad[0, 1] = n
    for _ in range(2):
        with pytest.raises(IndexError, match=f"index {n} is out of bounds for axis {axis % len(shape)} with size {n}"):
            exe(table, bad)
    np.testing.assert_array_equal(exe(table, idx), want)


def test_a_lone_cumsum_runs_on_cpu_into_its_output(tmp_path):
    """A scan is opaque to the kernel IR; a lone cumsum (OPT's positions from its padding mask)
    runs on the CPU backend as NumPy's cumsum into the output, bit for bit the reference's, in
    the dtype it asks for, instead of falling back to the next backend."""
    rng = np.random.default_rng(0)
    cases = [("i64", (2, 9), 1, None, rng.integers(0, 2, (2, 9))),
             ("f32", (3, 5, 7), 0, None, rng.standard_normal((3, 5, 7)).astype(np.float32)),
             ("f32", (4, 33), -1, "f64", rng.standard_normal((4, 33)).astype(np.float32)),
             ("f16", (6, 40), 1, None, rng.standard_normal((6, 40)).astype(np.float16))]
    for dt, shape, axis, out_dtype, x in cases:
        fb = FunctionBuilder("main")
        p = fb.param("x", dt, shape)
        mod = Module([fb.ret(fb.emit("cumsum", p, axis=axis, dtype=out_dtype))])
        exe = dpl.build(mod, [CpuBackend(cache_dir=tmp_path), "numpy"], config=ALWAYS, progress=False)
        assert not exe.fallbacks and "-> cpu" in exe.summary(), exe.summary()
        got = exe(x)
        want = dpl.interpret(mod, x)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_a_lone_index_put_runs_on_cpu_as_its_reference(tmp_path):
    """A static cache's update (index_put at the step's positions) runs on the CPU backend as the
    op's NumPy reference writing the output (no interpreter): the same values, repeated indices
    adding up with accumulate, an index out of range an error naming it."""
    from dpl.ir import Tuple as TupleExpr

    rng = np.random.default_rng(1)
    for accumulate in (False, True):
        fb = FunctionBuilder("main")
        cache, pos, new = fb.param("cache", "f32", ("n", 8)), fb.param("pos", "i64", (3,)), fb.param("new", "f32", (3, 8))
        mod = Module([fb.ret(fb.emit("index_put", cache, TupleExpr((pos,)), new, accumulate=accumulate))])
        exe = dpl.build(mod, CpuBackend(cache_dir=tmp_path), progress=False)
        for n, at in ((6, [4, -1, 4]), (9, [0, 8, 2])):
            args = [rng.standard_normal((n, 8)).astype(np.float32), np.array(at), rng.standard_normal((3, 8)).astype(np.float32)]
            got = exe(*args)
            np.testing.assert_array_equal(got, dpl.interpret(mod, *args))
            assert not np.array_equal(got, args[0])
        assert exe.ran_on() == {"op index_put": "cpu"}
        with pytest.raises(Exception, match="index 9 is out of range for axis 0"):
            exe(args[0], np.array([0, 9, 0]), args[2])
