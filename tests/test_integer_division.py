"""Integer ``divide`` means one thing everywhere: C's truncation toward zero, 0 for a zero
divisor and the most negative value over -1 wrapping to itself. C leaves the last two undefined
and x86 traps on them, so a zero in the divisor had killed the process (SIGFPE) on ``cpu``. The
interpreter, the generated C, ``numpy`` and the host twin of the CUDA kernels (and NVRTC) agree,
and all of them agree with a definition written here in Python integers."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpl
import needs
from dpl.backends.cpu.backend import CpuBackend
from dpl.backends.cuda.emitter import emit_cuda
from dpl.kernel import lower_function

ALWAYS = dpl.FusionConfig(min_nodes_for_fusion=1, min_tensor_elements=0, fallback_on_error=False)
DTYPES = {"i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64, "u8": np.uint8}


def truncated(a: int, b: int, dtype) -> int:
    """The definition, in Python's unbounded integers, wrapped to ``dtype``."""
    if b == 0:
        return 0
    q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
    bits = np.iinfo(dtype).bits
    q &= (1 << bits) - 1
    return q - (1 << bits) if np.iinfo(dtype).min < 0 and q >= 1 << (bits - 1) else q


def module(dt: str, n: int):
    return dpl.parse(f"""
func main(a: {dt}[{n}], b: {dt}[{n}]) -> {dt}[{n}] {{
  q = divide(a, b)
  y = add(q, a)
  return y
}}""")


def operands(dtype, n: int, seed: int):
    """Values over the whole range, with the divisors C leaves undefined (0, and -1 under the
    most negative dividend) placed at the front."""
    info, rng = np.iinfo(dtype), np.random.default_rng(seed)
    a = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    b = rng.integers(max(info.min, -3), 4, n).astype(dtype)
    a[:4] = [info.min, info.min, info.max, 0]
    b[:4] = [0, -1 if info.min < 0 else 1, 0, 0]
    b[rng.random(n) < 0.1] = 0
    return a, b


def expected(a, b, dtype):
    q = np.array([truncated(int(x), int(y), dtype) for x, y in zip(a, b)], dtype)
    return (q + a).astype(dtype)  # add wraps as the dtype's arithmetic does


@pytest.mark.parametrize("dt", list(DTYPES))
def test_the_interpreter_and_numpy_follow_the_definition(dt):
    dtype = DTYPES[dt]
    a, b = operands(dtype, 200, 0)
    mod = module(dt, 200)
    np.testing.assert_array_equal(dpl.interpret(mod, a, b), expected(a, b, dtype))
    np.testing.assert_array_equal(dpl.build(mod, "numpy")(a, b), expected(a, b, dtype))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dt=st.sampled_from(list(DTYPES)), n=st.integers(4, 70), seed=st.integers(0, 2**16))
def test_generated_c_divides_by_zero_without_a_trap(tmp_path_factory, dt, n, seed):
    needs.c_compiler()
    dtype = DTYPES[dt]
    a, b = operands(dtype, n, seed)
    mod = module(dt, n)
    exe = dpl.build(dpl.fuse_ops(mod, ALWAYS), [CpuBackend(cache_dir=tmp_path_factory.getbasetemp() / "kernels"), "numpy"],
                    config=ALWAYS)
    np.testing.assert_array_equal(exe(a, b), expected(a, b, dtype))
    assert not exe.fallbacks


def test_float_division_is_unchanged():
    mod = dpl.parse("""
func main(a: f32[4], b: f32[4]) -> f32[4] {
  q = divide(a, b)
  return q
}""")
    a, b = np.array([1, -1, 0, 3], np.float32), np.array([0, 0, 0, 2], np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        got = dpl.interpret(mod, a, b)
    np.testing.assert_array_equal(got[[0, 1, 3]], [np.inf, -np.inf, 1.5])
    assert np.isnan(got[2])


def test_cuda_host_twin_divides_as_the_interpreter(cxx):
    from dpl.backends.cuda.host import HostTwin

    sources = {dt: emit_cuda(lower_function(module(dt, 64)["main"]), f"div_{dt}") for dt in DTYPES}
    twin = HostTwin(list(sources.values()), block=8)
    for dt, source in sources.items():
        a, b = operands(DTYPES[dt], 64, 1)
        out = np.zeros(64, DTYPES[dt])
        twin.run(source.name, [a, b], [out])
        np.testing.assert_array_equal(out, expected(a, b, DTYPES[dt]), err_msg=dt)


def test_cuda_sources_compile_with_nvrtc(nvrtc):
    sources = [emit_cuda(lower_function(module(dt, 64)["main"]), f"div_{dt}") for dt in DTYPES]
    assert all(f"dpl_div_{np.dtype(DTYPES[dt]).name}(" in s.function for dt, s in zip(DTYPES, sources))
    ptx = nvrtc.compile_ptx(sources[0].code.replace(sources[0].function, "") + "\n".join(s.function for s in sources), "div.cu")
    assert all(f".entry {s.name}(" in ptx for s in sources)
