"""The CUDA kernels without a GPU: every kernel of the automatic-fusion corpus (and its float16
and bfloat16 variants) compiles to PTX with NVRTC, and its host twin — the same kernel text
built for the CPU, each block's threads an OpenMP team — computes what dpl.interpret computes,
at several grid sizes, with one thread per row and with a block per row."""

import numpy as np
import pytest

import needs

import dpl
from dpl.backends.cgen.emitter import CpuEmitter, StatementEmitter, emit_kernel
from dpl.backends.cuda.emitter import (
    CUDA_PRELUDE, HELPERS, MAX_GRID, CudaEmitter, emit_cuda, launch_arguments, launch_config,
)
from dpl.backends.cuda.host import HostTwin
from dpl.kernel import lower_function

import cuda_corpus
from fake_cupy import CUPY_ADDS
from test_cpu_backend import random_args

THREADS = 8  # threads per block in the twin: a reduction tree of three levels, a cheap team
MODES = {"thread-rows": 10**9, "block-rows": 0}  # block_rows_from: never / always a block per row


def _kernels(groups, modes):
    """[(label, function, CudaSource)] with distinct symbols, one per group and mode."""
    out = []
    for i, (label, fn) in enumerate(groups):
        kernel = lower_function(fn)
        for mode in modes:
            out.append((f"{label}/{mode}", fn, emit_cuda(kernel, f"k{i}_{mode.replace('-', '_')}", MODES[mode])))
    return out


@pytest.fixture(scope="module")
def f32_kernels():
    return _kernels(cuda_corpus.automatic_groups() + cuda_corpus.corner_cases(), MODES)


@pytest.fixture(scope="module", params=["f16", "bf16"])
def half_kernels(request):
    return request.param, _kernels(cuda_corpus.sixteen_bit_groups(request.param), ["block-rows"])


# -- NVRTC --------------------------------------------------------------------------------------


def _compile_in_batches(nvrtc, sources, size=150):
    """Every kernel function through NVRTC to PTX, ``size`` kernels per program after one copy
    of the prelude (NVRTC's time is per kernel; a batch halves it). Returns the kernels compiled."""
    compiled = 0
    for k in range(0, len(sources), size):
        batch = sources[k:k + size]
        ptx = nvrtc.compile_ptx(CUDA_PRELUDE + HELPERS + "\n".join(s.function for s in batch), f"batch{k}.cu")
        assert all(f".entry {s.name}(" in ptx for s in batch)
        compiled += len(batch)
    return compiled


def test_every_corpus_kernel_compiles_with_nvrtc(nvrtc, f32_kernels):
    distinct = {}  # elementwise kernels come out the same in both modes: compiled once
    for _, _, s in f32_kernels:
        distinct.setdefault(s.function.replace(s.name, "k"), s)
    compiled = _compile_in_batches(nvrtc, list(distinct.values()))
    assert compiled >= 700, compiled


def test_every_half_and_bfloat16_kernel_compiles_with_nvrtc(nvrtc, half_kernels):
    short, kernels = half_kernels
    compiled = _compile_in_batches(nvrtc, [s for _, _, s in kernels])
    assert compiled >= 500, compiled


def test_whole_sources_compile_as_written(nvrtc):
    """The sources exactly as the backend hands them to CuPy, with the options CuPy adds, at a
    GPU's block size (warp shuffles) and the twin's (a shared-memory tree)."""
    for label, fn in cuda_corpus.corner_cases():
        for mode, rows in MODES.items():
            source = emit_cuda(lower_function(fn), block_rows_from=rows)
            for block in (256, THREADS):
                ptx = nvrtc.compile_ptx(source.code, f"{label}.cu", options=(f"-DDPL_BLOCK={block}", *CUPY_ADDS))
                assert ".entry dpl_kernel(" in ptx


def test_nvrtc_errors_carry_the_log(nvrtc):
    with pytest.raises(nvrtc.NvrtcError, match="undefined_thing"):
        nvrtc.compile_ptx('extern "C" __global__ void k(float *a) { a[0] = undefined_thing; }', "bad.cu")
    assert nvrtc.version() >= (12, 0)


# -- the host twin ------------------------------------------------------------------------------


def _run(twin, fn, source, seed, grid):
    args = random_args(fn, seed)
    want = dpl.interpret(fn, *args)
    wants = want if isinstance(want, tuple) else (want,)
    outs = [np.full_like(w, np.nan) if w.dtype.kind == "f" or w.dtype.name == "bfloat16" else np.zeros_like(w) for w in wants]
    twin.run(source.name, args, outs, grid=grid)
    return wants, outs


def test_twin_of_every_corpus_kernel_equals_the_interpreter(cxx, f32_kernels):
    """Grid sizes: the backend's own configuration (every element or row has a thread or block
    of its own), one block (every thread strides over many elements) and three blocks (the
    stride crosses blocks); outputs start as NaN, so an element no thread writes shows."""
    twin = HostTwin([s for _, _, s in f32_kernels], block=THREADS)
    runs = 0
    for label, fn, source in f32_kernels:
        for grid in (None, 1, 3):
            wants, outs = _run(twin, fn, source, runs, grid)
            for w, o in zip(wants, outs):
                scale = float(np.abs(w.astype(np.float64)).max()) if w.size else 1.0
                np.testing.assert_allclose(o.astype(np.float64), w.astype(np.float64), rtol=1e-4,
                                           atol=1e-5 * max(scale, 1), err_msg=f"{label} grid={grid}")
            runs += 1
    assert runs >= 3 * 1000, runs


def test_twin_of_every_half_and_bfloat16_kernel(cxx, half_kernels):
    """16-bit floats compute in float and round at every op, as the interpreter does; the row
    ops (norms, softmax) compute in float32 where the interpreter's references differ: the worst
    kernels (layer norms over two elements) differ by a few 16-bit ulps of the output's scale;
    nine in ten agree to one or two ulps (tests/test_exact_arithmetic.py holds the exact ops)."""
    short, kernels = half_kernels
    twin = HostTwin([s for _, _, s in kernels], block=THREADS)
    errors = []
    for label, fn, source in kernels:
        wants, outs = _run(twin, fn, source, len(errors), 3)
        error = 0.0
        for w, o in zip(wants, outs):
            if w.size:
                w64, o64 = w.astype(np.float64), o.astype(np.float64)
                assert not np.isnan(o64[~np.isnan(w64)]).any(), label
                error = max(error, float(np.abs(w64 - o64).max()) / max(1.0, float(np.abs(w64).max())))
        errors.append(error)
    ulp = {"f16": 2.0**-10, "bf16": 2.0**-7}[short]
    assert len(errors) >= 500
    assert np.percentile(errors, 90) <= 2 * ulp, np.percentile(errors, [50, 90, 99, 100])
    assert max(errors) <= 64 * ulp


WARP_ROWS = """
func softmax(x: f32[5, 300]) -> f32[5, 300] {
  y = nn.softmax(x)
  return y
}
func norms(x: f32[n, 100], w: f32[100], b: f32[100]) -> (f32[n, 100], f32[n, 100]) {
  y = nn.layer_norm(x, w, b)
  z = nn.rms_norm(x, w)
  return (y, z)
}
func extremes(x: f64[3, 4, 90]) -> (f64[3], f64[3], f64[3]) {
  a = max(x, axis=[1, 2])
  b = min(x, axis=[1, 2])
  c = variance(x, axis=[1, 2])
  return (a, b, c)
}
func counts(x: i64[7, 200]) -> i64[7] {
  s = sum(x, axis=[1])
  return s
}
func everything(x: f32[33, 65]) -> f32[] {
  s = sum(x)
  return s
}"""


@pytest.mark.parametrize("threads", [32, 64])
def test_twin_of_warp_shuffle_reductions(cxx, threads):
    """Blocks of whole warps reduce with shuffles (emulated on the host: an exchange through
    shared slots between barriers), then across warps in shared memory."""
    mod = dpl.parse(WARP_ROWS)
    sources = [emit_cuda(lower_function(fn), f"{fn.name}_{threads}") for fn in mod.functions.values()]
    assert all("dpl_shfl_down" in s.function for s in sources)
    twin = HostTwin(sources, block=threads)
    rng = np.random.default_rng(threads)
    for fn, source in zip(mod.functions.values(), sources):
        args = random_args(fn, threads)
        if fn.name == "counts":
            args = [rng.integers(-1000, 1000, (7, 200))]
        want = dpl.interpret(fn, *args)
        wants = want if isinstance(want, tuple) else (want,)
        for grid in (None, 2):
            outs = [np.full_like(w, -7) for w in wants]
            twin.run(source.name, args, outs, grid=grid)
            for w, o in zip(wants, outs):
                np.testing.assert_allclose(o, w, rtol=2e-5, atol=1e-5, err_msg=f"{fn.name} grid={grid}")


def test_half_and_bfloat16_conversions_are_bit_exact(cxx):
    """Loads widen exactly and stores round to nearest even like NumPy and ml_dtypes: ties,
    subnormals, the largest finite values, overflow to infinity, signed zeros, NaN."""
    ml_dtypes = needs.package("ml_dtypes")
    text = """
func to_f16(x: f32[n]) -> f16[n] {
  y = astype(x, dtype=f16)
  return y
}
func from_f16(x: f16[n]) -> f32[n] {
  y = astype(x, dtype=f32)
  return y
}
func to_bf16(x: f32[n]) -> bf16[n] {
  y = astype(x, dtype=bf16)
  return y
}
func through_f16(x: f32[n]) -> f32[n] {
  y = astype(astype(x, dtype=f16), dtype=f32)
  return y
}"""
    mod = dpl.parse(text)
    sources = [emit_cuda(lower_function(mod[name]), name) for name in ("to_f16", "from_f16", "to_bf16", "through_f16")]
    twin = HostTwin(sources, block=THREADS)
    rng = np.random.default_rng(7)
    specials = [np.nan, np.inf, -np.inf, 0.0, -0.0, 65504.0, 65519.99, 65520.0, -65520.0, 1e-8, 3e-8, 6.0e-8,
                2.0**-24, 2.0**-25, 1.5 * 2.0**-24, 2.0**-14, 2.0**-14 * (1 - 2.0**-11), 1 + 2.0**-11, 1 + 3 * 2.0**-11,
                3.4e38, 1.00390625, 1.01171875]
    x = np.concatenate([np.array(specials, np.float32), (rng.standard_normal(3000) * 10.0 ** rng.integers(-9, 5, 3000)).astype(np.float32)])
    bits = np.arange(1 << 16, dtype=np.uint16).view(np.float16)  # every half, NaNs included
    with np.errstate(over="ignore"):  # overflow to infinity is one of the cases
        cases = {"to_f16": (x, x.astype(np.float16)), "from_f16": (bits, bits.astype(np.float32)),
                 "to_bf16": (x, x.astype(ml_dtypes.bfloat16)), "through_f16": (x, x.astype(np.float16).astype(np.float32))}
    for name, (arg, want) in cases.items():
        out = np.empty_like(want)
        twin.run(name, [arg], [out], grid=3)
        nan = np.isnan(want.astype(np.float32))
        assert (np.isnan(out.astype(np.float32)) == nan).all(), name
        itemsize = want.dtype.itemsize
        as_bits = {2: np.uint16, 4: np.uint32}[itemsize]
        np.testing.assert_array_equal(out[~nan].view(as_bits), want[~nan].view(as_bits), err_msg=name)


def test_the_twin_catches_a_broken_mapping(cxx):
    """The twin is no rubber stamp: a reduction tree that skips levels, or a grid-stride loop
    that skips elements, gives wrong numbers or unwritten elements."""
    fn = dpl.parse("func f(x: f32[5, 300]) -> f32[5, 300] {\n  y = nn.softmax(x)\n  return y\n}")["f"]
    good = emit_cuda(lower_function(fn), "good", block_rows_from=0)
    tree = good.function.replace("dpl_s >>= 1", "dpl_s >>= 2").replace("void __launch_bounds__(DPL_BLOCK) good(", "void __launch_bounds__(DPL_BLOCK) tree(")
    stride = good.function.replace("dpl_i += gridDim.x", "dpl_i += gridDim.x + 1").replace("void __launch_bounds__(DPL_BLOCK) good(", "void __launch_bounds__(DPL_BLOCK) stride(")
    assert tree != good.function and stride != good.function
    import attrs

    broken = [attrs.evolve(good, name=n, function=f) for n, f in (("tree", tree), ("stride", stride))]
    twin = HostTwin([good, *broken], block=THREADS)
    x = np.random.default_rng(0).standard_normal((5, 300)).astype(np.float32)
    want = dpl.interpret(fn, x)
    outs = {}
    for name in ("good", "tree", "stride"):
        outs[name] = np.full_like(want, np.nan)
        twin.run(name, [x], [outs[name]], grid=2)
    np.testing.assert_allclose(outs["good"], want, rtol=1e-5, atol=1e-7)
    assert not np.allclose(outs["tree"], want, rtol=1e-3)
    assert np.isnan(outs["stride"]).any()
    # the same with whole warps: a shuffle tree that skips a level
    shuffle = good.function.replace("dpl_o >>= 1", "dpl_o >>= 2")
    assert shuffle != good.function
    twin = HostTwin([good, attrs.evolve(good, name="shuffle", function=shuffle.replace(" good(", " shuffle("))], block=32)
    for name in ("good", "shuffle"):
        outs[name] = np.full_like(want, np.nan)
        twin.run(name, [x], [outs[name]], grid=2)
    np.testing.assert_allclose(outs["good"], want, rtol=1e-5, atol=1e-7)
    assert not np.allclose(outs["shuffle"], want, rtol=1e-3)


# -- the emitter and the launch -------------------------------------------------------------------


NESTS = """
func rows(x: f32[n, 300]) -> f32[n, 300] {
  y = nn.softmax(x)
  return y
}
func flat(x: f32[n, 3, 5], b: f32[5]) -> f32[n, 3, 5] {
  y = tanh(add(x, b))
  return y
}
func total(x: f32[n, 7]) -> f32[] {
  s = sum(x)
  return s
}
func centred(x: f32[4, 70]) -> f32[4, 70] {
  m = mean(x)
  y = subtract(x, m)
  return y
}
func product(x: f32[n, 16], w: f32[16, 8]) -> f32[n, 8] {
  y = matmul(x, w)
  return y
}"""


def _source(name, **kw):
    return emit_cuda(lower_function(dpl.parse(NESTS)[name]), **kw)


def test_nests_map_onto_threads_blocks_or_one_block():
    rows, flat, total, centred, product = (_source(n) for n in ("rows", "flat", "total", "centred", "product"))
    assert [n.mode for n in rows.nests] == ["block"]
    assert [n.mode for n in flat.nests] == ["thread"] and len(flat.nests[0].extents) == 3  # collapsed
    assert [n.mode for n in total.nests] == ["grid"]
    assert [n.mode for n in centred.nests] == ["grid", "thread"]  # the mean by one block, then every element
    assert [n.mode for n in product.nests] == ["thread"]  # an anchor's reduction stays per thread
    for s in (rows, flat, total, centred, product):
        assert 'extern "C" __global__' in s.code and "#pragma omp" not in s.code and "#include" not in s.code
    assert "__shared__" in rows.code and "__shared__" not in flat.code
    assert [n.mode for n in _source("rows", block_rows_from=301).nests] == ["thread"]


def test_launch_configuration():
    rows, flat, total, centred, product = (_source(n) for n in ("rows", "flat", "total", "centred", "product"))
    assert launch_config(rows, {"n": 10}) == (10, 256)  # a block per row
    assert launch_config(rows, {"n": 10**6}) == (MAX_GRID, 256)  # capped: blocks stride over rows
    assert launch_config(flat, {"n": 100}) == (-(-100 * 15 // 256), 256)  # a thread per element
    assert launch_config(flat, {"n": 100}, block=8) == (-(-1500 // 8), 8)
    assert launch_config(flat, {"n": 0}) == (1, 256)  # nothing to do still launches validly
    assert launch_config(total, {"n": 10**6}) == (1, 256)
    assert launch_config(centred, {}) == (1, 256)
    assert launch_config(product, {"n": 33}) == (-(-33 * 8 // 256), 256)


def test_launch_arguments_follow_the_signature():
    source = emit_cuda(lower_function(dpl.parse("""
func f(x: f32[n, 4], w: f32[4]) -> (f32[n, 4], f32[n]) {
  y = multiply(x, w)
  s = sum(y, axis=[1])
  return (y, s)
}""")["f"]))
    assert source.code.count("*__restrict__") == 4 and "const int64_t v_n)" in source.code
    x, w = np.ones((3, 4), np.float32), np.ones(4, np.float32)
    y, s = np.empty((3, 4), np.float32), np.empty(3, np.float32)
    arrays, dims = launch_arguments(source, [x, w], [y, s])
    assert [a is b for a, b in zip(arrays, [x, w, y, s])] == [True] * 4 and dims == [3]
    with pytest.raises(dpl.DplError, match="takes 2 inputs and 2 outputs"):
        launch_arguments(source, [x], [y, s])
    with pytest.raises(dpl.DplError, match="dim n is 3 and 5"):
        launch_arguments(source, [x, w], [np.empty((5, 4), np.float32), s])


def test_cpu_and_cuda_share_the_statement_emitter():
    """The CUDA body is the CPU's statements under another loop wrapper: the same store."""
    assert issubclass(CudaEmitter, StatementEmitter) and issubclass(CpuEmitter, StatementEmitter)
    fn = dpl.parse("func f(x: f32[6, 5], b: f32[5]) -> f32[6, 5] {\n  y = nn.silu(add(x, b))\n  return y\n}")["f"]
    kernel = lower_function(fn)
    store = next(line.strip() for line in emit_kernel(kernel, stream_bytes=None).splitlines() if line.strip().startswith("v_y["))
    assert store in emit_cuda(kernel).code
