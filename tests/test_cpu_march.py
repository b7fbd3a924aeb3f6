"""``CpuBackend(march=...)``: the C built for another CPU's instruction sets than this one's own
(an AVX2 host's, measured on an AVX-512 one), refused where this CPU could not run it or the
compiler does not know it; the numbers are the interpreter's either way."""

import numpy as np
import pytest

import needs

import dpl
from dpl.backends.cpu import toolchain
from dpl.backends.registry import BackendError

HASWELL_FLAGS = frozenset("sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma f16c bmi1 bmi2".split())


@pytest.fixture
def haswell_host(monkeypatch):
    """This process sees a CPU with AVX2 and FMA and no AVX-512."""
    import dpl.host_cpu

    monkeypatch.setattr(dpl.host_cpu, "cpu_flags", lambda: HASWELL_FLAGS)
    toolchain.march_missing.cache_clear()
    yield
    toolchain.march_missing.cache_clear()


def test_what_a_march_uses_that_this_cpu_lacks(haswell_host):
    needs.c_compiler()
    assert toolchain.march_missing("cc", "haswell") == ()
    missing = toolchain.march_missing("cc", "skylake-avx512")
    assert "avx512f" in missing and "avx512bw" in missing and "avx2" not in missing
    assert toolchain.march_missing("cc", "no-such-cpu") is None
    assert toolchain.march_missing("cc", "native -O0") is None  # one -march, not more flags


def test_a_march_this_cpu_cannot_run_is_refused_by_name(haswell_host):
    needs.c_compiler()
    from dpl.backends.cpu.backend import CpuBackend

    with pytest.raises(BackendError, match=r"-march=skylake-avx512 builds code this CPU cannot run: it lacks avx512f"):
        CpuBackend(march="skylake-avx512")
    with pytest.raises(BackendError, match=r"does not take -march=no-such-cpu"):
        CpuBackend(march="no-such-cpu")


def test_a_model_built_for_avx2_equals_the_interpreter(tmp_path):
    """A product with its bias and GELU (the packed routine's AVX2 tile) and a softmax (a
    generated kernel), built for -march=haswell: the compiler ran with that -march, the summary
    says so, and the numbers are the interpreter's."""
    needs.c_compiler()
    needs.build_runs_here("haswell")
    from dpl.backends.cpu.backend import CpuBackend

    rng = np.random.default_rng(0)
    w = rng.standard_normal((96, 200)).astype(np.float32) / 8
    b = rng.standard_normal(200).astype(np.float32)
    mod = dpl.parse("""
func main(x: f32[37, 96], w: f32[96, 200], b: f32[200]) -> f32[37, 200] {
  y = matmul(x, w)
  z = add(y, b)
  g = nn.gelu_tanh(z)
  s = nn.softmax(g, axis=-1)
  return s
}""")
    x = rng.standard_normal((37, 96)).astype(np.float32)
    cpu = CpuBackend(cache_dir=tmp_path, products="dpl", march="haswell")
    assert "-march=haswell" in cpu.cache.flags() and "-march=native" not in cpu.cache.flags()
    exe = dpl.build(dpl.apply(mod, ["cublas"]), [cpu, "numpy"], progress=False)
    np.testing.assert_allclose(exe(x, w, b), dpl.interpret(mod, x, w, b), rtol=1e-5, atol=1e-6)
    assert "C built for -march=haswell" in exe.summary()
