"""Row kernels that know the hardware (backends/cuda/rows.py) without a GPU: which rows are
staged in shared memory and which loops store by 16-byte vectors; NVRTC compiles the kernels
for sm_80 and sm_90; and their host twin (the same text on the CPU, each block's threads an
OpenMP team, warp shuffles emulated) equals the interpreter over row lengths, dtypes and
array offsets drawn by hypothesis: odd lengths, symbolic lengths past the shared-memory
capacity (the global-memory fall-back), rows and views off the 16-byte boundary."""

import re

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import needs

import dpl
from dpl.backends.cuda.emitter import emit_cuda
from dpl.backends.cuda.host import HostTwin
from dpl.backends.cuda.rows import STAGE_BYTES, staged_rows, vector_stores
from dpl.kernel import lower_function
from dpl.kernel.ir import Loop

from fake_cupy import CUPY_ADDS

ROWS = """
func softmax(x: {t}[n, {d}]) -> {t}[n, {d}] {{
  y = nn.softmax(x)
  return y
}}
func rms(x: {t}[n, {d}], w: {t}[{d}]) -> {t}[n, {d}] {{
  y = nn.rms_norm(x, w)
  return y
}}
func layer(x: {t}[n, {d}], w: {t}[{d}], b: {t}[{d}]) -> {t}[n, {d}] {{
  y = nn.layer_norm(x, w, b)
  return y
}}
func addrms(x: {t}[n, {d}], r: {t}[n, {d}], w: {t}[{d}]) -> ({t}[n, {d}], {t}[n, {d}]) {{
  s = add(x, r)
  y = nn.rms_norm(s, w)
  return (s, y)
}}
func decomposed(x: {t}[n, {d}], w: {t}[{d}]) -> {t}[n, {d}] {{
  sq = multiply(x, x)
  ms = mean(sq, axis=[-1], keepdims=true)
  r = rsqrt(add(ms, 1e-06:{t}))
  y = multiply(multiply(x, r), w)
  return y
}}
"""
KINDS = ("softmax", "rms", "layer", "addrms", "decomposed")
DTYPES = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "bf16": "bfloat16"}
# what each kind stages: the inputs read by two or more passes over the row
STAGES = {"softmax": ["x"], "rms": ["x"], "layer": ["x"], "addrms": ["x", "r"], "decomposed": ["x"]}


def row_functions(t: str, d) -> dict:
    """The row kernels' groups at dtype ``t`` and row length ``d`` (an int or a name)."""
    mod = dpl.apply(dpl.parse(ROWS.format(t=t, d=d)), fuse_reductions=True)
    out = {}
    for kind in KINDS:  # the group fuse_reductions made, or the one op as a group of its own
        fn = mod[kind]
        called = [b.value.op.name for b in fn.bindings if hasattr(b.value.op, "name") and b.value.op.name in mod.functions]
        out[kind] = mod[called[0]] if called else attrs.evolve(fn, attrs={"Primitive": True})
    return out


def sources(t: str, d, tag: str) -> dict:
    return {k: emit_cuda(lower_function(fn), f"{k}_{t}_{tag}", block_rows_from=0) for k, fn in row_functions(t, d).items()}


def numpy_dtype(t):
    if t == "bf16":
        return needs.package("ml_dtypes").bfloat16
    return DTYPES[t]


# -- what is staged and vectorised --------------------------------------------------------------


@pytest.mark.parametrize("d", [4096, "d"])
def test_rows_read_by_several_passes_are_staged(d):
    for kind, source in sources("f32", d, "s").items():
        kernel = source.kernel
        loops = [s for s in kernel.body if isinstance(s, Loop)]
        assert len(loops) == 1 and source.nests[0].mode == "block", kind
        staged = staged_rows(kernel, [loops[0]], loops[0].body, _Names())
        assert sorted(s.buffer for s in staged) == sorted(_param(kernel, n) for n in STAGES[kind]), kind
        assert all(s.capacity * 4 <= STAGE_BYTES for s in staged)
        assert (all(s.fits == "1" for s in staged)) == isinstance(d, int)
        code = source.function
        assert code.count("((uint4 *)dpl_row") == len(staged), kind  # the vector copy into shared memory
        assert "__stcg((uint4 *)&v_" in code, kind  # the vector stores
        assert code.count("__syncthreads();  /* the row is staged") == 1


def _param(kernel, name):
    return next(b.name for b in kernel.params if b.name == name or b.name.startswith(name))


class _Names:
    def internal(self, hint):
        return f"dpl_{hint}"


def test_static_rows_of_four_byte_elements_walk_by_the_block_size():
    """Static f32 rows step by DPL_BLOCK with int counters (the compiler unrolls them: measured
    faster on an H100); 16-bit and symbolic rows keep blockDim.x and int64 (measured slower, or
    not measured)."""
    for kind, source in sources("f32", 4096, "w").items():
        code = source.function
        assert "+= DPL_BLOCK" in code and "blockDim" not in code and "for (int64_t dpl_r" not in code, kind
    for t, d in (("f16", 4096), ("f32", "d")):
        for kind, source in sources(t, d, "w").items():
            code = source.function
            assert "+= blockDim.x" in code and "+= DPL_BLOCK" not in code and "DPL_BLOCK *" not in code, (t, d, kind)


def test_what_is_not_staged():
    """One pass over the row (a plain sum), a row too long for shared memory, a load of another
    row (a shifted index) and a weight read once stay in global memory."""
    mod = dpl.parse("""
func total(x: f32[n, 500]) -> f32[n] {
  s = sum(x, axis=[1])
  return s
}
func wide(x: f32[n, 20000]) -> f32[n, 20000] {
  y = nn.softmax(x)
  return y
}""")
    total = emit_cuda(lower_function(mod["total"]), block_rows_from=0)
    wide = emit_cuda(lower_function(mod["wide"]), block_rows_from=0)
    assert total.nests[0].mode == "block" and "dpl_row" not in total.function
    assert wide.nests[0].mode == "block" and "dpl_row" not in wide.function  # 80 KB: past the budget
    assert "__stcg((uint4 *)&v_y" in wide.function  # its stores are still vectors
    rms = sources("f32", 300, "w")["rms"]
    assert "dpl_row0[v_i1]" in rms.function and "v_w[v_i1]" in rms.function  # w is read once: not staged
    # an output of bools is stored element by element (eight-byte-or-less lanes only)
    mask = lower_function(dpl.parse("""
func m(x: f32[n, 300]) -> bool[n, 300] {
  y = nn.softmax(x)
  z = greater(y, 0.01)
  return z
}""")["m"])
    loop = next(s for s in mask.body if isinstance(s, Loop))
    last = [s for s in loop.body if isinstance(s, Loop)][-1]
    assert vector_stores(mask, last) == []


# -- NVRTC --------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["compute_80", "compute_90"])
def test_row_kernels_compile_for_ampere_and_hopper(nvrtc, arch):
    """Every row kernel, every dtype, static and symbolic lengths (odd, a whole number of
    vectors, past the shared-memory budget), at a GPU's block and the twin's, with the options
    CuPy adds; the 16-byte loads and stores are vector instructions in the PTX."""
    compiled = 0
    for t in DTYPES:
        for d in (7, 1024, 12289, "d"):
            for kind, source in sources(t, d, "c").items():
                for block in (256, 8):
                    ptx = nvrtc.compile_ptx(source.code, f"{kind}.cu", arch=arch, options=(f"-DDPL_BLOCK={block}", *CUPY_ADDS))
                    assert f".entry {source.name}(" in ptx
                    compiled += 1
                    if d == 7 and t in ("f16", "bf16"):
                        continue  # 14 bytes: not one whole vector (the compiler drops the vector paths)
                    if "dpl_row" in source.function:  # a staged row: copied by 16-byte vector loads
                        assert re.search(r"ld\.global(\.nc)?\.v(4\.u32|2\.f64|2\.u64)", ptx), (t, d, kind)
                    assert re.search(r"st\.global(\.cg)?\.v(4\.u32|2\.f64|2\.u64)", ptx), (t, d, kind)
    assert compiled == 4 * 4 * len(KINDS) * 2


# -- the host twin against the interpreter -------------------------------------------------------


@pytest.fixture(scope="module")
def twins(cxx):
    """One twin per block size (8: shared-memory trees; 32: one warp's shuffles; 64: two warps)
    holding every kind at every dtype with a symbolic row length (the hypothesis test's), plus
    static lengths (odd, short, whole vectors) at 8 and 32."""
    needs.package("ml_dtypes")
    built = {}
    for block in (8, 32, 64):
        srcs = {}
        for t in DTYPES:
            for d in ("d", 1, 3, 300, 4097) if block < 64 else ("d",):  # 64: two warps, symbolic rows only
                for kind, s in sources(t, d, f"{d}_{block}").items():
                    srcs[(kind, t, d)] = s
        built[block] = (HostTwin(list(srcs.values()), block=block), srcs)
    return built


TOLERANCE = {"f32": 1e-5, "f64": 1e-12, "f16": 4 * 2.0**-10, "bf16": 4 * 2.0**-7}


def _inputs(fn, rows, d, offset, seed, dtype):
    """Random inputs at ``offset`` elements into a larger buffer (a view off any boundary)."""
    rng = np.random.default_rng(seed)
    out = []
    for p in fn.params:
        shape = tuple(rows if s == "n" else d if s == "d" else s for s in p.ty.shape)
        size = int(np.prod(shape))
        base = (rng.standard_normal(size + offset) * 2).astype(dtype)
        out.append(base[offset:].reshape(shape))
    return out


def _check_twin(twin, source, fn, rows, d, offset, seed, t, grid=None):
    dtype = numpy_dtype(t)
    args = _inputs(fn, rows, d, offset, seed, dtype)
    with np.errstate(all="ignore"):
        want = dpl.interpret(fn, *args)
    wants = want if isinstance(want, tuple) else (want,)
    outs = []
    for w in wants:
        buf = np.full(w.size + offset, np.nan, dtype=w.dtype)
        outs.append(buf[offset:].reshape(w.shape))
    twin.run(source.name, args, outs, grid=grid)
    for w, o in zip(wants, outs):
        w64, o64 = w.astype(np.float64), o.astype(np.float64)
        scale = max(1.0, float(np.abs(w64).max())) if w.size else 1.0
        np.testing.assert_allclose(o64, w64, rtol=TOLERANCE[t], atol=TOLERANCE[t] * scale,
                                   err_msg=f"{source.name} rows={rows} d={d} offset={offset} grid={grid}")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS), t=st.sampled_from(list(DTYPES)), block=st.sampled_from([8, 32, 64]),
       rows=st.integers(1, 4), d=st.one_of(st.integers(1, 70), st.integers(70, 9000)),
       offset=st.integers(0, 9), grid=st.sampled_from([None, 1, 3]), seed=st.integers(0, 2**16))
def test_twin_equals_the_interpreter_over_lengths_dtypes_and_offsets(twins, kind, t, block, rows, d, offset, grid, seed):
    twin, srcs = twins[block]
    source = srcs[(kind, t, "d")]
    fn = row_functions(t, "d")[kind]
    _check_twin(twin, source, fn, rows, d, offset, seed, t, grid)


@pytest.mark.parametrize("block", [8, 32])
def test_twin_of_static_lengths(twins, block):
    """Static rows: one element, three (shorter than a vector), 300, 4097 (a vector and one);
    aligned and off by one element; one block striding over every row and a block each."""
    twin, srcs = twins[block]
    runs = 0
    for (kind, t, d), source in srcs.items():
        if d == "d":
            continue
        fn = row_functions(t, d)[kind]
        for offset, grid in ((0, None), (1, 1)):
            _check_twin(twin, source, fn, 3, d, offset, runs, t, grid)
            runs += 1
    assert runs >= 2 * 4 * len(KINDS) * 3
    for (kind, t, d), source in srcs.items():  # a symbolic row longer than its shared-memory share
        capacity = int(re.search(r"<= (\d+);", source.function).group(1)) if d == "d" and t in ("f32", "f64") else None
        if capacity:
            _check_twin(twin, source, row_functions(t, "d")[kind], 2, capacity + 3, 1, runs, t, None)
            runs += 1
    assert runs >= 2 * 4 * len(KINDS) * 3 + 2 * len(KINDS)


def test_the_twin_catches_a_broken_copy_or_tail(cxx):
    """The twin is no rubber stamp for the new paths: a staging copy that drops the last
    element of a row, or a store tail that drops a lane, gives wrong or unwritten elements."""
    source = sources("f32", 301, "good")["softmax"]
    code = source.function
    copy = code.replace("dpl_k < 301; dpl_k += DPL_BLOCK) dpl_row", "dpl_k < 300; dpl_k += DPL_BLOCK) dpl_row")
    tail = code.replace("\n            if (dpl_b + dpl_l >= 301) break;", "\n            if (dpl_b + dpl_l >= 300) break;")
    assert copy != code and tail != code
    broken = [attrs.evolve(source, name=n, function=f.replace(f" {source.name}(", f" {n}(")) for n, f in (("copy", copy), ("tail", tail))]
    twin = HostTwin([source, *broken], block=8)
    fn = row_functions("f32", 301)["softmax"]
    x = np.random.default_rng(1).standard_normal((6, 301)).astype(np.float32)
    want = dpl.interpret(fn, x)
    outs = {}
    for name in (source.name, "copy", "tail"):
        outs[name] = np.full_like(want, np.nan)
        twin.run(name, [x], [outs[name]], grid=2)
    np.testing.assert_allclose(outs[source.name], want, rtol=1e-5, atol=1e-7)
    assert not np.allclose(outs["copy"], want, rtol=1e-5, atol=1e-7)
    assert np.isnan(outs["tail"]).any()  # the last element of a row: the element tail


# -- the bandwidth benchmark's plumbing, on the stand-in ---------------------------------------------


def test_the_row_bandwidth_benchmark_runs_on_the_stand_in(nvrtc, cxx):
    """bench/cuda_rows.py (which test_gpu.py and bench_cuda.py use on a device) end to end on
    the stand-in CuPy with a clock that says 1 ms: every kernel checked against the
    interpreter, bytes counted as inputs plus outputs."""
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    from dpl.backends.cuda.backend import CupyBackend
    from fake_cupy import FakeCupy

    sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
    try:
        import cuda_rows
    finally:
        sys.path.pop(0)

    class Timed(FakeCupy):
        float32 = np.float32

        def __init__(self):
            super().__init__(nvrtc=nvrtc)
            event = lambda: SimpleNamespace(record=lambda: None, synchronize=lambda: None)  # noqa: E731
            self.cuda.Event, self.cuda.get_elapsed_time = event, lambda a, b: 1.0
            self.cuda.Device = lambda: SimpleNamespace(compute_capability="90", synchronize=lambda: None)

        def ones(self, n, dtype):
            return self.asarray(np.ones(n, dtype))

        def empty_like(self, a):
            return self.empty(a.shape, a.dtype)

    fake = Timed()
    found = list(cuda_rows.rows(fake, CupyBackend(cupy=fake, block=8), 16, 300))
    assert [(t, name) for t, name, _ in found] == [(t, n) for t in ("f32", "f16") for n in
                                                    ("softmax", "rms_norm", "layer_norm", "add_rms_norm")]
    f32 = {name: m for t, name, m in found if t == "f32"}
    assert f32["softmax"]["bytes"] == 2 * 16 * 300 * 4 and f32["add_rms_norm"]["bytes"] == (4 * 16 * 300 + 300) * 4
    assert all(m["ms"] == 1.0 / 20 for _, _, m in found)  # 20 calls a round on the stand-in clock
    assert "of copy" in cuda_rows.report(fake, CupyBackend(cupy=fake, block=8), 16, 300)


# -- ptxas, inside NVRTC: shared memory, registers, spills -----------------------------------------

_PTXAS = re.compile(r"Used (\d+) registers.*?(\d+) bytes smem")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_row_kernels_assemble_within_the_limits(nvrtc, arch):
    """CUBINs for Ampere and Hopper (ptxas runs in NVRTC): every row kernel's static shared
    memory within 48 KiB, no register arrays in local memory (at most a few bytes spilled) at a
    block of 256; two softmaxes in one kernel share
    the staging budget (each nest's rows are staged while the kernel's budget lasts)."""
    two = dpl.parse("""
func two(x: f32[n, 4096], z: f32[n, 8192]) -> (f32[n, 4096], f32[n, 8192]) {
  y = nn.softmax(x)
  w = nn.softmax(z)
  return (y, w)
}""")["two"]
    kernels = [s for t in ("f32", "f16") for d in (4096, "d") for s in sources(t, d, "a").values()]
    kernels.append(emit_cuda(lower_function(two), "two", block_rows_from=0))
    assert kernels[-1].function.count("__shared__ __align__(16)") == 1  # 16 KiB, then 32 more would pass 32
    for source in kernels:
        _, log = nvrtc.compile_cubin(source.code, f"{source.name}.cu", arch=arch,
                                     options=("-DDPL_BLOCK=256", *CUPY_ADDS, "--ptxas-options=-v"))
        registers, smem = map(int, _PTXAS.search(log).groups())
        assert smem <= 48 << 10 and registers <= 255, (source.name, log)
        spills = int(re.search(r"(\d+) bytes spill stores", log).group(1))
        assert spills <= 16, (source.name, log)  # ptxas trades a few bytes for full occupancy at 256 threads
    with pytest.raises(nvrtc.NvrtcError, match="too much shared data"):
        nvrtc.compile_cubin('extern "C" __global__ void k(float *a) { __shared__ float s[13000]; s[threadIdx.x] = 1; '
                            '__syncthreads(); a[threadIdx.x] = s[threadIdx.x + 1]; }', arch=arch)
