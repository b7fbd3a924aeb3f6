"""The CPU's flash attention kernel (backends/cpu/flash_attention.py) equals the interpreter on
kernel.attention composites: query/key lengths 1, 7, 64, 129, head dims 16 and 64, batches and
heads, with and without an additive mask (-inf, float32's minimum, fully masked rows), GQA
(k/v heads broadcast over q's), large-magnitude scores, a divided scale, a scale passed as a
tensor, float64 and float16; and the build records which path each attention took."""

import attrs
import numpy as np
import pytest

import needs

import dpl
from dpl.kernel.attention import NotAttention, read_attention


def short(shape):
    return "[" + ", ".join(map(str, shape)) + "]"


def attention_module(q, k, v, mask=None, dtype="f32", scale="multiply(s, 0.125)"):
    """q @ k [* scale] [+ mask] softmax @ v with k given as [..., D, Sk]."""
    out = np.broadcast_shapes(q[:-2], k[:-2], v[:-2], *([] if mask is None else [tuple(mask[:-2])])) + (q[-2], v[-1])
    params = [f"q: {dtype}{short(q)}", f"k: {dtype}{short(k)}", f"v: {dtype}{short(v)}"]
    if mask is not None:
        params.append(f"mask: {dtype}{short(mask)}")
    if "sc" in scale.split("(")[1]:
        params.append(f"sc: {dtype}[1]")
    if dtype != "f32":
        scale = scale.replace(")", f":{dtype})") if scale[-2].isdigit() else scale
    body = ["s = matmul(q, k)", f"z = {scale}"]
    body += ["m = add(z, mask)", "p = nn.softmax(m)"] if mask is not None else ["p = nn.softmax(z)"]
    body += ["o = matmul(p, v)", "return o"]
    text = f"func main({', '.join(params)}) -> {dtype}{short(out)} {{\n  " + "\n  ".join(body) + "\n}"
    return dpl.parse(text)


def composite(mod):
    fused = dpl.apply(mod, ["llm"])
    found = [f for f in fused.functions.values() if f.attrs.get("Composite") == "kernel.attention"]
    assert len(found) == 1, fused
    return fused, found[0]


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    from dpl.backends.cpu.backend import CpuBackend

    needs.c_compiler()
    return CpuBackend(cache_dir=tmp_path_factory.mktemp("kernels"), attention="flash")


def run_flash(backend, mod, args):
    """The flash kernel of ``mod``'s attention composite on ``args`` (given in ``mod``'s order)."""
    fused, fn = composite(mod)
    names = [p.name for p in mod["main"].params]
    call = next(b.value for b in fused["main"].bindings if b.value.op.name.endswith("_kernel"))
    order = [names.index(a.name) for a in call.args]  # the composite's parameter order
    kernel = backend.compile(fn, module=fused, shapes=tuple(args[i].shape for i in order))
    one_row = fn.ret.ty.shape[-2] == 1  # one query row: the decode kernel (tests/test_decode_attention.py)
    assert kernel.__qualname__.startswith("cpu-decode:" if one_row else "cpu-flash:"), kernel.__qualname__
    out = np.empty(fn.ret.ty.shape, args[0].dtype)
    with np.errstate(all="ignore"):
        kernel([args[i] for i in order], [out])
    return out


def inputs(mod, seed, magnitude=1.0):
    rng = np.random.default_rng(seed)
    out = []
    for p in mod["main"].params:
        dtype = dpl.dtypes.to_numpy(p.ty.dtype)
        x = rng.standard_normal(p.ty.shape)
        out.append((x * magnitude if p.name == "q" else x).astype(dtype))
    return out


def check(want, got, rtol=2e-5):
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    scale = max(1.0, float(np.abs(want[ok]).max())) if ok.any() else 1.0
    np.testing.assert_allclose(got[ok].astype(np.float64), want[ok].astype(np.float64), rtol=rtol, atol=rtol * scale)


def causal(sq, sk, fill):
    return np.where(np.tril(np.ones((sq, sk), bool), sk - sq), 0.0, fill).astype(np.float32)


SEQS = [1, 7, 64, 129]


@pytest.mark.parametrize("head", [16, 64])
@pytest.mark.parametrize("seq", SEQS)
@pytest.mark.parametrize("masked", [False, True])
def test_equals_the_interpreter(backend, head, seq, masked):
    keys = {1: 7, 7: 129, 64: 64, 129: 1}[seq] if masked else seq  # query and key lengths differ too
    q, k, v = (2, 3, seq, head), (2, 3, head, keys), (2, 3, keys, head)
    mask = (seq, keys) if masked else None
    mod = attention_module(q, k, v, mask)
    for seed, magnitude in [(0, 1.0), (1, 40.0)]:  # 40: scores in the hundreds, the max matters
        args = inputs(mod, seed, magnitude)
        if masked:
            args[3] = np.where(np.random.default_rng(seed).random(mask) < 0.3, -np.inf, args[3]).astype(np.float32)
        with np.errstate(invalid="ignore"):  # a row of one key, masked: NaN
            want = dpl.interpret(mod, *args)
        check(want, run_flash(backend, mod, args))


@pytest.mark.parametrize("fill", [-np.inf, np.finfo(np.float32).min, -1e9])
def test_causal_masks_and_fully_masked_rows(backend, fill):
    """A causal mask as the torch frontend builds it (-inf above the diagonal), Hugging Face's
    float32 minimum, a large negative; row 3 fully masked: NaN for -inf (exp(-inf - -inf)), a
    uniform average for finite fills, as the interpreter's softmax gives."""
    seq = 70  # two key tiles: the first tile of a row may be all masked
    mod = attention_module((4, seq, 16), (4, 16, seq), (4, seq, 16), (1, seq, seq))
    args = inputs(mod, 3, 10.0)
    mask = causal(seq, seq, fill)
    mask[3, :] = fill
    mask[10, :66] = fill  # only the second tile has keys
    args[3] = mask[None]
    with np.errstate(all="ignore"):
        want = dpl.interpret(mod, *args)
    assert np.isnan(want).any() == (fill == -np.inf)
    check(want, run_flash(backend, mod, args))


def test_nan_and_inf_scores_make_their_rows_nan(backend):
    mod = attention_module((1, 9, 16), (1, 16, 80), (1, 80, 16), (9, 80))
    args = inputs(mod, 4)
    args[3][0, 70] = np.nan  # in the second tile: the row is NaN even though the first had values
    args[3][1, 3] = np.inf
    args[3][2, :64] = -np.inf
    args[3][2, 65] = np.nan  # the first tile all -inf, then a NaN
    with np.errstate(all="ignore"):
        want = dpl.interpret(mod, *args)
    assert np.isnan(want[0, :3]).all()
    check(want, run_flash(backend, mod, args))


@pytest.mark.parametrize("seq", [7, 129])
def test_gqa_heads_broadcast(backend, seq):
    """k/v with one head per group of q heads (q [B, Hkv, G, S, D], k [B, Hkv, 1, D, S]) and a
    mask per batch entry broadcast over heads."""
    q, k, v = (2, 2, 4, seq, 64), (2, 2, 1, 64, seq), (2, 2, 1, seq, 64)
    mod = attention_module(q, k, v, (2, 1, 1, seq, seq))
    args = inputs(mod, 5, 5.0)
    args[3] = np.broadcast_to(causal(seq, seq, -np.inf), (2, 1, 1, seq, seq)).copy()
    check(dpl.interpret(mod, *args), run_flash(backend, mod, args))


@pytest.mark.parametrize("mask", [(1, 33), (33,), (5, 1, 33), (5, 20, 1)])
def test_masks_of_broadcast_shapes(backend, mask):
    """Row, key and per-batch masks (strides of 0 along what they broadcast)."""
    mod = attention_module((5, 20, 16), (5, 16, 33), (5, 33, 16), mask)
    args = inputs(mod, 6, 3.0)
    check(dpl.interpret(mod, *args), run_flash(backend, mod, args))


@pytest.mark.parametrize("scale", ["divide(s, 8.0)", "multiply(s, sc)", "divide(s, sc)"])
def test_divided_and_tensor_scales(backend, scale):
    mod = attention_module((3, 20, 16), (3, 16, 20), (3, 20, 16), (20, 20), scale=scale)
    args = inputs(mod, 7, 4.0)
    if "sc" in scale:
        args[4] = np.array([0.3], np.float32)
    check(dpl.interpret(mod, *args), run_flash(backend, mod, args))


def symbolic_attention(heads: int, keys: str):
    """Masked attention over ``n`` queries and ``keys`` keys (both symbolic), scale 0.25."""
    return dpl.parse(f"""
func main(q: f32[{heads}, n, 16], k: f32[{heads}, 16, {keys}], v: f32[{heads}, {keys}, 16], mask: f32[n, {keys}]) -> f32[{heads}, n, 16] {{
  s = matmul(q, k)
  z = multiply(s, 0.25)
  w = add(z, mask)
  p = nn.softmax(w)
  o = matmul(p, v)
  return o
}}""")


def test_symbolic_lengths(backend):
    mod = symbolic_attention(4, "m")
    fused, fn = composite(mod)
    kernel = backend.compile(fn, module=fused)
    for n, m in [(5, 70), (33, 3)]:
        rng = np.random.default_rng(n)
        args = [rng.standard_normal(s).astype(np.float32) for s in [(4, n, 16), (4, 16, m), (4, m, 16), (n, m)]]
        out = np.empty((4, n, 16), np.float32)
        named = dict(zip(["q", "k", "v", "mask"], args))
        kernel([named[p.name] for p in fn.params], [out])
        check(dpl.interpret(mod, *args), out)


@pytest.mark.parametrize("dtype, rtol", [("f64", 1e-12), ("f16", 5e-3), ("bf16", 3e-2)])
def test_other_float_dtypes(backend, dtype, rtol):
    """float64 accumulates in double; float16 and bfloat16 are widened and accumulated in float
    (closer to the exact result than the interpreter's, which rounds each step to 16 bits)."""
    mod = attention_module((2, 40, 16), (2, 16, 70), (2, 70, 16), (40, 70), dtype=dtype)
    args = inputs(mod, 8)
    args[3][:, 50:] = -np.inf
    check(dpl.interpret(mod, *args), run_flash(backend, mod, args), rtol)


def test_non_attention_composites_are_refused_with_a_reason():
    mod = attention_module((2, 8, 16), (2, 16, 8), (2, 8, 16), (8, 8))
    _, fn = composite(mod)
    axis = attrs.evolve(fn, attrs={**fn.attrs, "Composite": "kernel.other"})
    with pytest.raises(NotAttention, match="not a kernel.attention"):
        read_attention(axis)
    assert read_attention(fn).head_dim == 16


@pytest.mark.parametrize("mode", ["flash", "segments"])
def test_the_build_records_the_path_it_took(tmp_path, mode):
    from dpl.backends.cpu.backend import CpuBackend

    needs.c_compiler()
    mod = attention_module((2, 30, 16), (2, 16, 30), (2, 30, 16), (30, 30))
    backend = CpuBackend(cache_dir=tmp_path, attention=mode)
    exe = dpl.build(dpl.apply(mod, ["llm"]), [backend, "numpy"], config=dpl.FusionConfig(fallback_on_error=False))
    args = inputs(mod, 9)
    check(dpl.interpret(mod, *args), exe(*args))
    summary = exe.summary()
    assert ("flash attention" in summary) == (mode == "flash"), summary
    assert ("segments (attention='segments'" in summary) == (mode == "segments"), summary


@pytest.mark.parametrize("keys", [4, 64])
def test_auto_takes_flash_from_min_keys(tmp_path, keys):
    from dpl.backends.cpu import flash_attention
    from dpl.backends.cpu.backend import CpuBackend
    from dpl.runtime import timed_choice

    needs.c_compiler()
    mod = attention_module((2, 4, 16), (2, 16, keys), (2, keys, 16), (4, keys))
    backend = CpuBackend(cache_dir=tmp_path)
    # one thread: every call meets the same attention kernel (a plan choosing its thread count
    # keeps a one-thread copy of its kernels, timed apart)
    exe = dpl.build(dpl.apply(mod, ["llm"]), [backend, "numpy"], config=dpl.FusionConfig(fallback_on_error=False), threads=1)
    args = inputs(mod, 10)
    want = dpl.interpret(mod, *args)
    for _ in range(2 * (timed_choice.WARM_UP + timed_choice.SAMPLES)):  # from flash keys on, every call of both kernels' turns
        check(want, exe(*args))
    flash = keys >= flash_attention.MIN_KEYS
    assert ("flash attention" in exe.summary()) == flash, exe.summary()
    assert (f"{keys} keys" in exe.summary())
    # flash or segments by timing: which is faster depends on the mask's values
    assert ("attention: flash now, the faster" in exe.summary() or "attention: segments now, the faster" in exe.summary()) == flash


# -- the CUDA kernel: NVRTC, and its host twin on the CPU ----------------------------------------

TWIN_BLOCK = 8  # threads per block in the twin: tiles of 8 keys, a reduction tree of three levels

CUDA_CASES = {
    "plain": ((2, 3, 7, 16), (2, 3, 16, 20), (2, 3, 20, 16), None, "f32"),
    "causal": ((4, 19, 64), (4, 64, 19), (4, 19, 64), (19, 19), "f32"),
    "gqa": ((2, 2, 3, 9, 16), (2, 2, 1, 16, 9), (2, 2, 1, 9, 16), (2, 1, 1, 9, 9), "f32"),
    "seq1": ((3, 1, 16), (3, 16, 1), (3, 1, 16), None, "f32"),
    "f64": ((2, 11, 16), (2, 16, 13), (2, 13, 16), (11, 13), "f64"),
    "f16": ((2, 11, 16), (2, 16, 13), (2, 13, 16), (11, 13), "f16"),
    "bf16": ((2, 11, 16), (2, 16, 13), (2, 13, 16), (11, 13), "bf16"),
}


def cuda_case(name):
    from dpl.backends.cuda.flash_attention import emit_flash_cuda

    q, k, v, mask, dtype = CUDA_CASES[name]
    mod = attention_module(q, k, v, mask, dtype=dtype)
    _, fn = composite(mod)
    spec = read_attention(fn)
    return mod, fn, spec, emit_flash_cuda(spec, f"flash_{name}")


def run_twin(twin, name, mod, fn, spec, args, grid):
    from dpl.backends.cpu.flash_attention import batch_layout
    from dpl.backends.cuda.flash_attention import bits

    named = dict(zip([p.name for p in mod["main"].params], args))
    ordered = [np.ascontiguousarray(named[p.name]) for p in fn.params]
    q, k, v = (ordered[s.index] for s in (spec.q, spec.k, spec.v))
    mask = None if spec.mask is None else ordered[spec.mask.index]
    out = np.full(fn.ret.ty.shape, np.nan, q.dtype)
    offs, dims = batch_layout(spec, q.shape, k.shape, v.shape, None if mask is None else mask.shape, out.shape)
    dummy = np.zeros(1, q.dtype)
    arrays = [bits(a) for a in (q, k, v, dummy if mask is None else mask, dummy, out)]
    twin.launch(name, grid, [*arrays, *offs, *dims])
    return out


@pytest.mark.parametrize("name", list(CUDA_CASES))
def test_cuda_twin_equals_the_interpreter(cxx, name):
    """The CUDA kernel's text built for the host (each block an OpenMP team): one block per
    query row, and two blocks striding over all rows; outputs start as NaN."""
    from dpl.backends.cuda.host import HostTwin
    from dpl.backends.cuda.flash_attention import launch_grid

    mod, fn, spec, code = cuda_case(name)
    twin = HostTwin.from_code(f"flash_{name}", code, block=TWIN_BLOCK, cxx=cxx)
    args = inputs(mod, 11, 8.0)
    if spec.mask is not None:
        mask = args[3]
        mask[..., 0, :] = -np.inf  # a fully masked row: NaN
        mask[..., -1, : min(TWIN_BLOCK, mask.shape[-1] - 1)] = -np.inf  # a first tile all masked
    with np.errstate(all="ignore"):
        want = dpl.interpret(mod, *args)
    rows = int(np.prod(fn.ret.ty.shape[:-1]))
    for grid in (launch_grid(rows // fn.ret.ty.shape[-2], fn.ret.ty.shape[-2]), 2):
        got = run_twin(twin, f"flash_{name}", mod, fn, spec, args, grid)
        check(want, got, {"f64": 1e-12, "f16": 5e-3, "bf16": 3e-2}.get(CUDA_CASES[name][-1], 2e-5))


@pytest.mark.parametrize("name", list(CUDA_CASES))
def test_cuda_kernel_compiles_with_nvrtc(nvrtc, name):
    from fake_cupy import CUPY_ADDS

    *_, code = cuda_case(name)
    for block in (256, TWIN_BLOCK):
        ptx = nvrtc.compile_ptx(code, f"{name}.cu", options=(f"-DDPL_BLOCK={block}", *CUPY_ADDS))
        assert f".entry flash_{name}(" in ptx


def test_an_unknown_attention_mode_is_refused():
    from dpl.backends.cpu.backend import CpuBackend
    from dpl.backends.registry import BackendError

    with pytest.raises(BackendError, match="'auto', 'flash' or 'segments', got 'fast'"):
        CpuBackend(attention="fast")


@pytest.mark.parametrize("head, value", [(24, 24), (8, 40), (3, 5)])
def test_head_dims_that_are_not_whole_vectors(backend, head, value):
    """D and Dv off the vector width: the value product's plain loop, q's rows of any length."""
    mod = attention_module((3, 21, head), (3, head, 70), (3, 70, value), (21, 70))
    args = inputs(mod, 12, 6.0)
    check(dpl.interpret(mod, *args), run_flash(backend, mod, args))


def test_a_thread_capped_copy_keeps_its_note(backend):
    mod = attention_module((2, 8, 16), (2, 16, 8), (2, 8, 16), (8, 8))
    fused, fn = composite(mod)
    kernel = backend.compile(fn, module=fused)
    capped = kernel.with_threads(1)
    assert capped is not kernel and capped.threads == 1 and capped.note == kernel.note
    assert kernel.note.startswith("flash attention")


def test_calls_from_several_threads_at_once(tmp_path):
    """The runner's per-shape layouts are shared, its arrays are not: 4 threads x 5 calls at two
    shapes each equal the interpreter."""
    from concurrent.futures import ThreadPoolExecutor

    from dpl.backends.cpu.backend import CpuBackend

    needs.c_compiler()
    mod = symbolic_attention(2, "n")
    exe = dpl.build(dpl.apply(mod, ["llm"]), [CpuBackend(cache_dir=tmp_path, attention="flash"), "numpy"],
                    config=dpl.FusionConfig(fallback_on_error=False))

    def call(seed):
        n = 9 if seed % 2 else 70
        rng = np.random.default_rng(seed)
        args = [rng.standard_normal(s).astype(np.float32) for s in [(2, n, 16), (2, 16, n), (2, n, 16), (n, n)]]
        return dpl.interpret(mod, *args), exe(*args)

    with ThreadPoolExecutor(4) as pool:
        for want, got in pool.map(call, range(20)):
            check(want, got)
    assert "flash attention" in exe.summary()


def test_the_vector_exp_is_within_two_ulp_of_exp(tmp_path):
    """The kernel's own exp of x <= 0 (flash_attention.VEXP) on every float32 spacing of
    [-87.3, 0] sampled densely, the reduction's edges (multiples of ln 2 / 2) and the special
    values: within 2 ulp of exp in float64, 0 below -87.3 and at -inf, NaN kept."""
    import ctypes
    import subprocess

    from dpl.backends.cpu import flash_attention as fa
    from dpl.backends.cpu.backend import BASE_FLAGS, usable_flags

    needs.c_compiler()
    src = tmp_path / "vexp.c"
    src.write_text("#include <stdint.h>\n#include <string.h>\ntypedef float acc_t;\n"
                   "typedef float vec_t __attribute__((vector_size(64)));\n"
                   "typedef int32_t ivec_t __attribute__((vector_size(64)));\n#define LANES 16\n"
                   "static inline vec_t vzero(void) { vec_t v = {0}; return v; }\n" + fa.VEXP +
                   "void run(const float *x, float *y, int64_t n) {\n"
                   "  for (int64_t i = 0; i < n; i += LANES) { vec_t v; memcpy(&v, x + i, sizeof v);"
                   " v = vexp(v); memcpy(y + i, &v, sizeof v); }\n}\n")
    subprocess.run(["cc", *BASE_FLAGS, *usable_flags("cc"), str(src), "-o", str(tmp_path / "vexp.so")], check=True)
    lib = ctypes.CDLL(str(tmp_path / "vexp.so"))
    rng = np.random.default_rng(0)
    edges = np.log(2) / 2 * np.arange(-252, 1)
    x = np.concatenate([rng.uniform(-87.3, 0, 1 << 20), np.linspace(-87.3, 0, 1 << 18), edges,
                        np.nextafter(edges, 0), np.nextafter(edges, -np.inf), -np.logspace(-30, 0, 4096),
                        [0.0, -0.0, -1e-45, -87.29, -87.31, -88, -100, -1e30, -np.inf, np.nan]]).astype(np.float32)
    x = np.concatenate([x, np.zeros(-len(x) % 16, np.float32)])
    y = np.empty_like(x)
    lib.run(x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(len(x)))
    live = x >= np.float32(-87.3)
    want = np.exp(x[live].astype(np.float64))
    ulp = np.abs(y[live] - want) / np.spacing(want.astype(np.float32)).astype(np.float64)
    assert ulp.max() <= 2.0, (ulp.max(), x[live][ulp.argmax()])
    assert (y[~live & ~np.isnan(x)] == 0).all() and np.isnan(y[np.isnan(x)]).all()
    assert y[x == 0].tolist() == [1.0] * int((x == 0).sum())


@pytest.mark.parametrize("threads", [None, 1, 2])
def test_the_segments_say_why_at_any_thread_budget(tmp_path, threads):
    """The segments' note (the path an attention took, and why) stays with them when a plan caps
    them at its budget (dpl's packed products: the segments take the budget on OpenMP)."""
    from dpl.backends.cpu.backend import CpuBackend

    needs.c_compiler()
    mod = attention_module((2, 4, 16), (2, 16, 32), (2, 32, 16), (4, 32))
    backend = CpuBackend(cache_dir=tmp_path, attention="segments", products="dpl")
    exe = dpl.build(dpl.apply(mod, ["llm"]), [backend, "numpy"], progress=False, threads=threads)
    args = inputs(mod, 10)
    check(dpl.interpret(mod, *args), exe(*args))
    assert "attention='segments'" in exe.summary(), exe.summary()


def test_heads_too_wide_for_the_stack_run_as_the_segments(backend):
    """The flash kernel keeps a task's rows of q and of the output on its thread's stack; heads
    past MAX_STACK_BYTES (a head of 262,144 float32s had crashed the process with SIGSEGV) run as
    the segments even where flash is asked for, say why, and give the interpreter's numbers."""
    from dpl.backends.cpu import flash_attention as fa

    wide = 40_000
    mod = attention_module((2, 8, wide), (2, wide, 8), (2, 8, wide), mask=(8, 8))
    fused, fn = composite(mod)
    spec = read_attention(fn)
    assert fa.stack_bytes(spec) > fa.MAX_STACK_BYTES
    use, why = fa.choose(spec, (), "flash")
    assert not use and "KiB of stack" in why
    exe = dpl.build(fused, [backend, "numpy"], progress=False)
    assert "segments (heads of 40000 x 40000 need" in exe.summary()
    args = inputs(mod, 3, magnitude=0.01)
    check(dpl.interpret(mod, *args), exe(*args))

    # the heads models use stay well inside, 16-bit ones with their widened tiles included
    for dtype, head in (("float32", 256), ("float16", 256), ("bfloat16", 256), ("float64", 256)):
        assert fa.stack_bytes(attrs.evolve(spec, dtype=dtype, head_dim=head, value_dim=head)) <= fa.MAX_STACK_BYTES


@pytest.fixture(scope="module", params=list(needs.BUILDS))
def isa_backend(request, tmp_path_factory):
    """A flash-only CPU backend whose kernels are built for each of :data:`needs.BUILDS` this CPU runs."""
    from dpl.backends.cpu.backend import CpuBackend, KernelCache
    needs.c_compiler()
    march = request.param
    needs.build_runs_here(march)
    backend = CpuBackend(attention="flash")
    backend.cache = KernelCache(tmp_path_factory.mktemp(f"kernels-{march}"), march=march)
    return backend, march


def test_each_build_has_its_own_vectors(isa_backend):
    """The register blocks are the build's vectors: 16 float lanes on AVX-512, 8 on AVX2 (a
    64-byte vector on AVX2 had split into spilled register pairs: 4 GFLOP/s)."""
    import ctypes

    from dpl.backends.cpu import flash_attention as fa
    from dpl.host_cpu import isa_flags

    backend, march = isa_backend
    _, fn = composite(attention_module((1, 8, 64), (1, 64, 8), (1, 8, 64)))
    lanes = backend.cache.load(fa.emit_flash(read_attention(fn), backend.cache.vector_math())).dpl_vector_lanes
    lanes.restype = ctypes.c_int
    assert lanes() == (16 if march == "native" and "avx512f" in isa_flags() else 8)


MASK_KINDS = ["none", "causal", "padding"]


def random_case(rng, head, mask_kind):
    """A random attention for the micro-kernels' edges: batch and GQA groups, query and key
    lengths that are rarely multiples of a vector or a tile (1 query row: the decode kernel),
    and a mask of ``mask_kind``: none, causal (-inf or float32's minimum above the diagonal), or padding (each batch
    entry's last keys at float32's minimum, broadcast over heads and rows, as Hugging Face's)."""
    batch, kv_heads, group = int(rng.integers(1, 3)), int(rng.integers(1, 3)), int(rng.choice([1, 3]))
    sq = int(rng.choice([1, 5, 13, 63, 77, 130]))
    sk = sq if mask_kind == "causal" else int(rng.choice([3, 17, 64, 95, 150]))
    q, k, v = (batch, kv_heads, group, sq, head), (batch, kv_heads, 1, head, sk), (batch, kv_heads, 1, sk, head)
    mask = {"none": None, "causal": (sq, sk), "padding": (batch, 1, 1, 1, sk)}[mask_kind]
    mod = attention_module(q, k, v, mask)
    args = inputs(mod, int(rng.integers(1 << 30)), float(rng.choice([1.0, 8.0])))
    if mask_kind == "causal":  # the torch frontend's -inf, or Hugging Face's float minimum (trimmed from the first tile)
        args[3] = causal(sq, sk, float(rng.choice([-np.inf, np.finfo(np.float32).min])))
    elif mask_kind == "padding":
        pad = np.zeros(mask, np.float32)
        for b in range(batch):
            pad[b, ..., sk - int(rng.integers(0, sk)):] = np.finfo(np.float32).min
        args[3] = pad
    return mod, args


@pytest.mark.parametrize("mask_kind", MASK_KINDS)
@pytest.mark.parametrize("head", [32, 64, 80, 128])
def test_micro_kernels_equal_the_interpreter_per_build(isa_backend, head, mask_kind):
    """Both products' register blocks at each instruction set, on random shapes (odd lengths,
    GQA groups, batches) and each mask kind, against the interpreter."""
    backend, march = isa_backend
    rng = np.random.default_rng([head, MASK_KINDS.index(mask_kind), len(march)])
    for _ in range(3):
        mod, args = random_case(rng, head, mask_kind)
        check(dpl.interpret(mod, *args), run_flash(backend, mod, args))


def shifted(a, offset):
    """``a``'s values in memory ``offset`` bytes past a 64-byte boundary (NumPy's and the runtime's
    buffers are 16-byte aligned: the kernel copies k and v where their vectors straddle lines)."""
    raw = np.empty(a.nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


@pytest.mark.parametrize("offset", [0, 16, 32])
@pytest.mark.parametrize("keys, mask_kind", [(129, "padding"), (256, "none"), (200, "causal")])
@pytest.mark.parametrize("threads", [1, 2])
def test_k_and_v_at_any_alignment_and_row_stride(isa_backend, offset, keys, mask_kind, threads):
    """k and v at 0, 16 and 32 bytes past a cache line, key counts whose rows of k are not whole
    vectors (129), are a 1 KiB multiple (256) or neither (200), GQA groups sharing one k/v
    matrix (each thread's copy of it reused), one and two threads: the interpreter's results."""
    backend, _ = isa_backend
    sq = keys if mask_kind == "causal" else 40
    q, k, v = (2, 2, 3, sq, 64), (2, 2, 1, 64, keys), (2, 2, 1, keys, 64)
    mask = {"none": None, "causal": (sq, keys), "padding": (2, 1, 1, 1, keys)}[mask_kind]
    mod = attention_module(q, k, v, mask)
    args = inputs(mod, offset + keys, 4.0)
    if mask_kind == "causal":
        args[3] = causal(sq, keys, -np.inf)
    elif mask_kind == "padding":
        args[3] = np.zeros(mask, np.float32)
        args[3][1, ..., keys - 7:] = np.finfo(np.float32).min  # a partial vector of live keys
    args[1], args[2] = shifted(args[1], offset), shifted(args[2], offset)
    fused, fn = composite(mod)
    names = [p.name for p in mod["main"].params]
    call = next(b.value for b in fused["main"].bindings if b.value.op.name.endswith("_kernel"))
    order = [names.index(a.name) for a in call.args]
    kernel = backend.compile(fn, module=fused, shapes=tuple(args[i].shape for i in order)).with_threads(threads)
    out = np.empty(fn.ret.ty.shape, np.float32)
    kernel([args[i] for i in order], [out])
    check(dpl.interpret(mod, *args), out)
