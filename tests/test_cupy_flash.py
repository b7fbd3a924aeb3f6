"""Flash attention on the CUDA target without a GPU: ``kernel.attention`` composites run as the
CUDA flash kernel (backends/cuda/flash_attention.py) inside the CuPy backend, on the stand-in
CuPy (tests/fake_cupy.py: every source through NVRTC for sm_90, every launch run by the host
twin), equal to the interpreter with masks (fully masked rows included), GQA, a tensor scale
and 16-bit floats; the choice between flash and the segments, and a flash kernel that does not
compile, are recorded in ``exe.summary()``."""

import numpy as np
import pytest

import needs

import dpl
from dpl.backends.cuda.backend import CupyBackend
from dpl.backends.registry import BackendError

from fake_cupy import FakeCupy
from test_cpu_backend import ALWAYS
from test_flash_attention import CUDA_CASES, attention_module, check, inputs

THREADS = 8
TOLERANCE = {"f64": 1e-12, "f16": 5e-3, "bf16": 3e-2}


@pytest.fixture
def fake(nvrtc, cxx):
    return FakeCupy(nvrtc=nvrtc)


def build(fake, mod, attention="flash", block=THREADS):
    backend = CupyBackend(cupy=fake, block=block, attention=attention)
    return dpl.build(dpl.apply(mod, ["llm"]), [backend, "numpy"], config=ALWAYS)


def flash_launches(fake):
    return [launch for launch in fake.launches if launch[0] == "dpl_flash_attention"]


@pytest.mark.parametrize("name", list(CUDA_CASES))
def test_flash_on_the_cuda_target_equals_the_interpreter(fake, name):
    """Plain, causal mask, GQA (k/v heads broadcast, a mask broadcast over heads), one query,
    float64, float16, bfloat16; a fully masked row (NaN, as the interpreter's) and a first key
    tile all masked. Called three times: step by step, captured, replayed as a CUDA graph."""
    q, k, v, mask, dtype = CUDA_CASES[name]
    if dtype == "bf16":
        needs.package("ml_dtypes")  # bf16 arrays on the stand-in device; a skip here, a failure under CI
    mod = attention_module(q, k, v, mask, dtype=dtype)
    exe = build(fake, mod)
    for seed in (11, 12, 13):
        args = inputs(mod, seed, 8.0)
        if mask is not None:
            args[3][..., 0, :] = -np.inf
            args[3][..., -1, : min(THREADS, args[3].shape[-1] - 1)] = -np.inf
        with np.errstate(all="ignore"):
            want = dpl.interpret(mod, *args)
            got = exe(*args)
        check(want, got, TOLERANCE.get(dtype, 2e-5))
    summary = exe.summary()
    assert "flash attention, CUDA (attention='flash' asked for)" in summary, summary
    assert flash_launches(fake), fake.launches
    assert all(launch[2] == (THREADS,) for launch in flash_launches(fake))
    assert any("dpl_flash_attention" in s for s in fake.sources)  # compiled by NVRTC for sm_90


def test_a_tensor_scale_and_a_divided_scale(fake):
    for scale in ("multiply(s, sc)", "divide(s, 8.0)"):
        mod = attention_module((2, 5, 16), (2, 16, 9), (2, 9, 16), (5, 9), scale=scale)
        exe = build(fake, mod)
        args = inputs(mod, 3, 4.0)
        if "sc" in scale:
            args[-1] = np.array([0.3], np.float32)
        check(dpl.interpret(mod, *args), exe(*args))
        assert "flash attention, CUDA" in exe.summary()


def test_a_block_of_whole_warps(fake):
    """32 threads: key tiles of 32 and five-level reduction trees."""
    mod = attention_module((2, 3, 40, 16), (2, 1, 16, 70), (2, 1, 70, 16), (40, 70))
    exe = build(fake, mod, block=32)
    args = inputs(mod, 5, 6.0)
    check(dpl.interpret(mod, *args), exe(*args))
    assert flash_launches(fake)[-1][2] == (32,)


def test_auto_takes_flash_for_large_scores_and_says_why(fake, monkeypatch):
    """"auto": cuBLAS products unless the scores the segments would write are large (the
    threshold lowered here to 16 KiB, so that a small case crosses it)."""
    from dpl.backends.cuda import flash_attention as flash_attention_cuda

    mod = attention_module((2, 9, 16), (2, 16, 9), (2, 9, 16), (9, 9))
    exe = build(fake, mod, attention="auto")
    args = inputs(mod, 1)
    check(dpl.interpret(mod, *args), exe(*args))
    assert "segments (0.633 KiB of scores < 256 MiB: cuBLAS products)" in exe.summary(), exe.summary()
    assert not flash_launches(fake) and fake.matmuls >= 2
    monkeypatch.setattr(flash_attention_cuda, "SCORES_BYTES", 16 << 10)
    many = attention_module((2, 2, 40, 16), (2, 1, 16, 60), (2, 1, 60, 16), None)  # 2 x 2 x 40 x 60 floats: 37.5 KiB
    exe = build(fake, many, attention="auto")
    args = inputs(many, 2)
    check(dpl.interpret(many, *args), exe(*args))
    assert "flash attention, CUDA (37.5 KiB of scores >= 16 KiB)" in exe.summary(), exe.summary()
    assert flash_launches(fake)
    exe = build(fake, mod, attention="segments")
    exe(*inputs(mod, 1))
    assert "segments (attention='segments' asked for)" in exe.summary()


def test_the_scores_size_rule():
    from dpl.backends.cuda.flash_attention import choose, scores_bytes
    from dpl.kernel.attention import read_attention
    from test_flash_attention import composite

    mod = attention_module((16, 512, 64), (16, 64, 512), (16, 512, 64), (512, 512))
    spec = read_attention(composite(mod)[1])
    shapes = ((16, 512, 64), (16, 64, 512), (16, 512, 64), (512, 512))
    assert scores_bytes(spec, shapes) == 16 * 512 * 512 * 4
    assert choose(spec, shapes) == (False, "16 MiB of scores < 256 MiB: cuBLAS products")
    assert choose(spec, shapes, threshold=16 << 20) == (True, "16 MiB of scores >= 16 MiB")
    assert choose(spec, ((16, "n", 64),) + shapes[1:])[0] is False  # a symbolic length: unknown
    assert choose(spec, shapes, "flash") == (True, "attention='flash' asked for")


class FlashFailsToCompile(FakeCupy):
    def RawModule(self, code, options=()):  # noqa: N802
        if "dpl_flash_attention" in code:
            raise RuntimeError("NVRTC_ERROR_COMPILATION (a stand-in failure of the flash kernel)")
        return super().RawModule(code, options)


def test_a_flash_kernel_that_does_not_compile_falls_back_to_the_segments(nvrtc, cxx):
    fake = FlashFailsToCompile(nvrtc=nvrtc)
    mod = attention_module((2, 7, 16), (2, 16, 11), (2, 11, 16), (7, 11))
    exe = build(fake, mod)
    args = inputs(mod, 4)
    check(dpl.interpret(mod, *args), exe(*args))
    summary = exe.summary()
    assert "segments (the flash kernel did not compile: NVRTC_ERROR_COMPILATION" in summary, summary
    assert not flash_launches(fake) and fake.matmuls >= 2


def test_an_unknown_attention_mode_is_refused():
    with pytest.raises(BackendError, match="'auto', 'flash' or 'segments', got 'fast'"):
        CupyBackend(cupy=FakeCupy(), attention="fast")


def test_the_flash_module_is_compiled_once_per_source(fake):
    """The same attention at another shape, and a second Executable, reuse the compiled module."""
    mod = dpl.parse("""
func main(q: f32[2, n, 16], k: f32[2, 16, n], v: f32[2, n, 16]) -> f32[2, n, 16] {
  s = matmul(q, k)
  z = multiply(s, 0.25)
  p = nn.softmax(z)
  o = matmul(p, v)
  return o
}""")
    backend = CupyBackend(cupy=fake, block=THREADS, attention="flash")
    exes = [dpl.build(dpl.apply(mod, ["llm"]), [backend, "numpy"], config=ALWAYS) for _ in range(2)]
    for n, exe in zip((5, 12), exes):
        rng = np.random.default_rng(n)
        args = [rng.standard_normal(s).astype(np.float32) for s in [(2, n, 16), (2, 16, n), (2, n, 16)]]
        check(dpl.interpret(mod, *args), exe(*args))
    assert sum("dpl_flash_attention" in s for s in fake.sources) == 1
