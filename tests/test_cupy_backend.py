"""The CuPy backend without a GPU.

Availability: without CuPy, or with CuPy but no device (the case on this project's machines),
the backend says why and the "cuda" target falls back visibly to the CPU. Everything else runs
on a stand-in CuPy (tests/fake_cupy.py) whose kernels are NVRTC-checked and executed as the
host twin: the whole path — segments with products for cuBLAS, kernels compiled by RawModule,
launch configuration, argument marshalling, host/device copies — from a model in to numbers out.
"""

import importlib.util
from pathlib import Path

import attrs
import numpy as np
import pytest

import needs

import dpl
from dpl.backends.cuda.backend import CudaKernel, CupyBackend
from dpl.backends.cuda.emitter import emit_cuda
from dpl.backends.registry import Unit
from dpl.ir import Module
from dpl.kernel import lower_function

from fake_cupy import DeviceArray, FakeCupy
from test_cpu_backend import ALWAYS, BF16, SEGMENTED, assert_close, random_args

EXAMPLES = Path(__file__).parent.parent / "examples"
THREADS = 8


@pytest.fixture
def fake(nvrtc, cxx):
    return FakeCupy(nvrtc=nvrtc)


def on_fake_cuda(fake):
    """A "cuda"-like target whose first backend is CuPy on the stand-in."""
    return [CupyBackend(cupy=fake, block=THREADS), "numpy"]


def rows_of(exe):
    summary = exe.summary()
    return summary.split("functions:")[1].split("plan for")[0].strip().splitlines(), summary


# -- availability and the visible fall-back -------------------------------------------------------


def test_without_cupy_the_cuda_target_falls_back_to_the_cpu(monkeypatch):
    import dpl.backends.cuda.backend as module

    real = importlib.util.find_spec
    monkeypatch.setattr(module.importlib.util, "find_spec", lambda name, *a: None if name == "cupy" else real(name, *a))
    backend = CupyBackend()
    assert backend.available() == (False, "CuPy is not installed")
    _check_cuda_falls_back(backend, "CuPy is not installed")


def test_with_cupy_but_no_device_the_cuda_target_falls_back_to_the_cpu():
    """Real CuPy imports without a driver (the test extra installs it) and reports no device."""
    if importlib.util.find_spec("cupy") is None:
        needs.missing("cupy-cuda12x (in the test extra) is not installed")
    backend = CupyBackend()
    ok, why = backend.available()
    if ok:
        pytest.skip(f"this machine has a CUDA device: {why}")
    assert why.startswith("no CUDA device")
    _check_cuda_falls_back(backend, "no CUDA device")


def test_zero_devices_is_unavailable():
    assert CupyBackend(cupy=FakeCupy(devices=0)).available() == (False, "no CUDA device")
    assert CupyBackend(cupy=FakeCupy(devices=2)).available() == (True, "2 CUDA devices, sm_90")


def _check_cuda_falls_back(backend, reason):
    from dpl.backends.registry import get_backend, register_backend

    old = get_backend("cupy")
    register_backend(backend)
    try:
        mod = dpl.load(EXAMPLES / "llama_mlp.ir")
        exe = dpl.build(dpl.apply(mod, ["rewrites", "llm", "cublas"]), "cuda", config=ALWAYS)
        args = random_args(mod["main"])
        assert_close(dpl.interpret(mod, *args), exe(*args))
    finally:
        register_backend(old)
    rows, summary = rows_of(exe)
    assert f"cupy     unavailable: {reason}" in summary
    assert rows and all("by fall-back (cupy is unavailable: " + reason in r for r in rows), summary
    assert all("-> cpu by fall-back" in r or "-> numpy by fall-back" in r for r in rows), summary


def test_a_kernel_that_does_not_compile_falls_back_with_the_reason(cxx):
    mod = dpl.load(EXAMPLES / "residual_rmsnorm.ir")
    exe = dpl.build(dpl.apply(mod, ["rewrites", "llm"]), [CupyBackend(cupy=FakeCupy(fail_compile=True)), "numpy"], config=ALWAYS)
    args = random_args(mod["main"])
    assert_close(dpl.interpret(mod, *args), exe(*args))
    summary = exe.summary()
    assert "the CUDA kernel does not compile: NVRTC_ERROR_COMPILATION" in summary, summary


# -- models in, numbers out, on the stand-in -------------------------------------------------------


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.ir")), ids=lambda p: p.stem)
@pytest.mark.parametrize("libraries", [[], ["rewrites", "llm", "cublas"]], ids=["auto", "patterns"])
def test_examples_on_cuda_equal_the_interpreter(fake, example, libraries):
    mod = dpl.load(example)
    exe = dpl.build(dpl.apply(mod, libraries, fuse_reductions=True), on_fake_cuda(fake), config=ALWAYS)
    for seed in (0, 1):
        args = random_args(mod["main"], seed)
        assert_close(dpl.interpret(mod, *args), exe(*args))
    rows, summary = rows_of(exe)
    assert rows and all("-> cupy (first choice)" in r for r in rows), summary
    assert fake.launches and fake.sources  # every source went through NVRTC in RawModule
    if "cublas" in libraries and example.stem in ("llama_mlp", "attention"):
        assert fake.matmuls >= 2  # the products went to cuBLAS


@pytest.mark.parametrize("name", ["attention", "prologue", "both", "chain"])
def test_products_go_to_cublas_between_cuda_kernels(fake, name):
    fn = attrs.evolve(dpl.parse(SEGMENTED)[name], attrs={"Primitive": True})
    kernel = CupyBackend(cupy=fake, block=THREADS).compile(fn, module=Module([fn]))
    assert kernel.device.__qualname__.startswith("cupy-cublas+cuda:")
    assert len(kernel.parts) == {"attention": 1, "prologue": 2, "both": 1, "chain": 0}[name]
    for seed in (1, 2):
        args = random_args(fn, seed)
        if name == "prologue":
            args[0] = np.resize(args[0], (3 + seed, 16))
        want = dpl.interpret(fn, *args)
        wants = want if isinstance(want, tuple) else (want,)
        outs = [np.empty_like(w) for w in wants]
        kernel(args, outs)
        assert_close(want, tuple(outs) if isinstance(want, tuple) else outs[0])
    products = {"attention": 2, "prologue": 1, "both": 1, "chain": 2}[name]
    assert fake.matmuls == 2 * products
    assert fake.to_host == 2 * len(fn.ret.fields if hasattr(fn.ret, "fields") else [fn.ret])


def test_bfloat16_crosses_as_bits_and_runs_as_one_kernel(fake):
    ml_dtypes = needs.package("ml_dtypes")
    mod = dpl.parse(BF16)
    backend = CupyBackend(cupy=fake, block=THREADS)
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(1000) * 10).astype(np.float32)
    x[:6] = [np.nan, np.inf, -np.inf, -0.0, 1.00390625, 1.01171875]
    for name, args in {"cast": [x], "chain": [rng.standard_normal((8, 64)).astype(ml_dtypes.bfloat16),
                                              rng.standard_normal(64).astype(ml_dtypes.bfloat16)]}.items():
        fn = attrs.evolve(mod[name], attrs={"Primitive": True})
        want = dpl.interpret(fn, *args)
        out = np.empty_like(want)
        backend.compile(fn, module=Module([fn]))(args, [out])
        if name == "cast":
            np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))
        else:
            np.testing.assert_allclose(out.astype(np.float32), want.astype(np.float32), rtol=2e-2, atol=2e-2)
    assert all(kind == "uint16[1000]" for kind in fake.launches[0][3][1:])  # the bf16 output, as bits
    fb = dpl.parse("func mm(x: bf16[4, 8], w: bf16[8, 3]) -> bf16[4, 3] {\n  y = matmul(x, w)\n  return y\n}")["mm"]
    kernel = backend.compile(fb, module=Module([fb]))
    assert kernel.parts and isinstance(kernel.parts[0], CudaKernel)  # a bf16 product is no cuBLAS call


def test_launch_arguments_and_configuration_on_device_arrays(fake):
    fn = dpl.parse("""
func f(x: f32[n, 300], c: f32[300]) -> (f32[n, 300], f32[n]) {
  y = nn.softmax(add(x, c))
  s = max(y, axis=[1])
  return (y, s)
}""")["f"]
    fn = attrs.evolve(fn, attrs={"Primitive": True})
    backend = CupyBackend(cupy=fake, block=THREADS, block_rows_from=64)
    kernel = backend.kernel(fn)
    x, c = fake.asarray(np.ones((5, 300), np.float32)), fake.asarray(np.ones(300, np.float32))
    y, s = fake.empty((5, 300), np.float32), fake.empty((5,), np.float32)
    (grid, block), args = kernel.arguments([x, c], [y, s])
    assert (grid, block) == (5, THREADS)  # a block per row
    assert args[:4] == (x, c, y, s) and args[4] == np.int64(5) and isinstance(args[4], np.int64)
    kernel([x, c], [y, s])
    assert fake.launches[-1] == ("dpl_kernel", (5,), (THREADS,), ("float32[5, 300]", "float32[300]", "float32[5, 300]", "float32[5]", "int64"))
    np.testing.assert_allclose(np.asarray(y), 1 / 300, rtol=1e-6)
    # host arrays never reach a launch
    with pytest.raises(AssertionError, match="host array"):
        kernel.function((1,), (THREADS,), (np.ones((5, 300), np.float32), c, y, s, np.int64(5)))


def test_constants_are_copied_to_the_device_once(fake):
    from dpl.ir import FunctionBuilder, const

    fb = FunctionBuilder("f", attrs={"Primitive": True})
    x = fb.param("x", "f32", (3, 4))
    fn = fb.ret(fb.emit("add", x, const(np.arange(4, dtype=np.float32))))
    kernel = CupyBackend(cupy=fake, block=THREADS).compile(fn, module=Module([fn]))
    copies = fake.to_device
    assert len(kernel.device.constants) == 1 and isinstance(kernel.device.constants[0], DeviceArray)
    for _ in range(2):
        out = np.empty((3, 4), np.float32)
        x_host = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
        kernel([x_host], [out])
        np.testing.assert_allclose(out, x_host + np.arange(4, dtype=np.float32))
    assert fake.to_device == copies + 2  # only the input, each call


def test_the_backend_claims_its_prefixes_and_kernel_composites():
    backend = CupyBackend(cupy=FakeCupy())
    fn = dpl.parse("func f(x: f32[4]) -> f32[4] {\n  y = exp(x)\n  return y\n}")["f"]
    for kind, name in [("composite", "cublas.matmul_bias"), ("composite", "kernel.rms_norm"), ("codegen", "kernel"),
                       ("codegen", "cupy"), ("primitive", "f")]:
        assert backend.can_run(Unit(kind, name, fn, ("exp",), frozenset({"float32"})))[0], (kind, name)
    with pytest.raises(dpl.DplError, match="power of two"):
        CupyBackend(block=100)
    source = emit_cuda(lower_function(fn))
    assert source.nests[0].mode == "thread"


def test_scalar_inputs_and_results_keep_their_rank(fake):
    """0-d arrays cross to the device and back as 0-d (``ascontiguousarray`` would make them 1-d)."""
    fn = dpl.parse("""
func f(x: f32[n, 70], s: f32[]) -> (f32[n, 70], f32[]) {
  y = multiply(x, s)
  t = sum(y)
  return (y, t)
}""")["f"]
    kernel = CupyBackend(cupy=fake, block=THREADS).compile(fn, module=Module([fn]))
    args = [np.random.default_rng(1).standard_normal((5, 70)).astype(np.float32), np.array(0.5, np.float32)]
    want = dpl.interpret(fn, *args)
    outs = [np.empty((5, 70), np.float32), np.empty((), np.float32)]
    kernel(args, outs)
    assert_close(want, tuple(outs))
    assert fake.launches[-1][3][1] == "float32[]" and fake.launches[-1][3][3] == "float32[]"


def test_a_slice_end_beyond_its_buffer_is_an_error_on_cuda(fake):
    """A kernel's size requirements (``[0:T]`` of a 32-row buffer needs T <= 32) are checked
    before the launch, as on the CPU: never a read past the buffer on the device."""
    from test_masks_and_pooling import SLICED_BUFFER, args_for

    mod = dpl.parse(SLICED_BUFFER)
    exe = dpl.build(dpl.apply(mod, []), on_fake_cuda(fake), config=dpl.FusionConfig(
        min_nodes_for_fusion=1, max_graph_size=10_000, min_tensor_elements=0, fallback_on_error=False))
    x, mask = args_for(mod["main"], T=8)
    for got, want in zip(exe(x, mask), dpl.interpret(mod, x, mask)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    x, mask = args_for(mod["main"], T=40)
    with pytest.raises(dpl.errors.DplError, match="T"):
        exe(x, mask)
