"""The GPU suite: ``pytest -m gpu`` runs dpl on a CUDA device against the interpreter.

Every test here needs a device (``needs.gpu``): where there is none (this project's machines,
CI) each one reports skipped with the reason, never passed. On a device: every kernel of the
CUDA corpus, every example (automatic fusion and the shipped patterns), the models of
``bench/bench_models.py`` and the Hugging Face zoo of ``tests/zoo.py``, the cuBLAS and cuBLASLt paths, the CUDA graph path and DLPack in and
out, all to the CPU tests' tolerances.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

import needs

import dpl
from dpl.backends.cuda.backend import CupyBackend
from dpl.ir import Module

import cuda_corpus
from test_cpu_backend import ALWAYS, assert_close, random_args

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.ir"))


@pytest.fixture(scope="module")
def cp():
    return needs.gpu()


@pytest.fixture
def backend(cp):
    return CupyBackend(cupy=cp)


def on_cuda(backend):
    return [backend, "numpy"]


def test_the_device_is_available_to_the_backend(cp, backend):
    ok, why = backend.available()
    assert ok, why
    assert f"sm_{cp.cuda.Device().compute_capability}" in why


# -- the kernel corpus --------------------------------------------------------------------------


def _run_group(backend, fn, seed):
    kernel = backend.compile(fn, module=Module([fn]))
    args = random_args(fn, seed)
    want = dpl.interpret(fn, *args)
    wants = want if isinstance(want, tuple) else (want,)
    outs = [np.empty_like(w) for w in wants]
    kernel(args, outs)
    return wants, outs


def test_every_f32_corpus_kernel_on_the_gpu_equals_the_interpreter(backend):
    """The corpus and the corner cases, to the host twin's tolerances (tests/test_cuda_kernels.py)."""
    groups = cuda_corpus.automatic_groups() + cuda_corpus.corner_cases()
    for i, (label, fn) in enumerate(groups):
        wants, outs = _run_group(backend, fn, i)
        for w, o in zip(wants, outs):
            scale = float(np.abs(w.astype(np.float64)).max()) if w.size else 1.0
            np.testing.assert_allclose(o.astype(np.float64), w.astype(np.float64), rtol=1e-4,
                                       atol=1e-5 * max(scale, 1), err_msg=label)


@pytest.mark.parametrize("short", ["f16", "bf16"])
def test_every_sixteen_bit_corpus_kernel_on_the_gpu(backend, short):
    """The bounds of the host twin's 16-bit test (tests/test_cuda_kernels.py)."""
    errors = []
    for i, (label, fn) in enumerate(cuda_corpus.sixteen_bit_groups(short)):
        wants, outs = _run_group(backend, fn, i)
        error = 0.0
        for w, o in zip(wants, outs):
            if w.size:
                w64, o64 = w.astype(np.float64), o.astype(np.float64)
                assert not np.isnan(o64[~np.isnan(w64)]).any(), label
                error = max(error, float(np.abs(w64 - o64).max()) / max(1.0, float(np.abs(w64).max())))
        errors.append(error)
    ulp = {"f16": 2.0**-10, "bf16": 2.0**-7}[short]
    assert np.percentile(errors, 90) <= 2 * ulp, np.percentile(errors, [50, 90, 99, 100])
    assert max(errors) <= 64 * ulp


# -- examples, device-resident, graphs, DLPack --------------------------------------------------


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
@pytest.mark.parametrize("libraries", [[], ["rewrites", "llm", "cublas"]], ids=["auto", "patterns"])
def test_every_example_on_the_gpu_equals_the_interpreter(cp, backend, example, libraries):
    mod = dpl.load(example)
    exe = dpl.build(dpl.apply(mod, libraries, fuse_reductions=True), on_cuda(backend), config=ALWAYS)
    for seed in (0, 1, 2):  # step by step and captured, then the graph twice
        args = random_args(mod["main"], seed)
        got = exe(*args)
        assert_close(dpl.interpret(mod, *args), got)
    if all(a.dtype.name != "bfloat16" for a in args):  # CuPy has no bfloat16 arrays
        device = exe(*[cp.asarray(a) for a in args])
        got = tuple(cp.asnumpy(d) for d in device) if isinstance(device, tuple) else cp.asnumpy(device)
        assert_close(dpl.interpret(mod, *args), got)
    assert "device-resident" in exe.summary(), exe.summary()


def test_a_plan_on_the_gpu_is_one_cuda_graph(cp, backend):
    mod = dpl.load(ROOT / "examples" / "llama_mlp.ir")
    exe = dpl.build(dpl.apply(mod, ["rewrites", "llm", "cublas"]), on_cuda(backend), config=ALWAYS)
    for seed in range(4):
        args = random_args(mod["main"], seed)
        assert_close(dpl.interpret(mod, *args), exe(*args))
    plan = exe.plan(*args)
    device_plan = exe._device_runner().device_plan(plan)
    assert device_plan.graph.graph is not None, device_plan.graph_note
    assert device_plan.graph.replays == 3


def test_torch_cuda_tensors_in_torch_cuda_tensors_out(cp, backend):
    torch = needs.package("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU: torch has no CUDA")
    mod = dpl.load(ROOT / "examples" / "llama_mlp.ir")
    exe = dpl.build(dpl.apply(mod, ["rewrites", "llm", "cublas"]), on_cuda(backend), config=ALWAYS)
    args = random_args(mod["main"], 0)
    tensors = [torch.from_numpy(a).cuda() for a in args]
    got = exe(*tensors)
    assert isinstance(got, torch.Tensor) and got.is_cuda
    assert_close(dpl.interpret(mod, *args), got.cpu().numpy())
    again = exe(*tensors)
    assert again.data_ptr() != got.data_ptr()  # fresh results, not the graph's output buffer


# -- cuBLAS(Lt) -----------------------------------------------------------------------------------

EPILOGUES = """
func relu(x: {t}[64, 256], w: {t}[256, 128], b: {t}[128]) -> {t}[64, 128] {{
  y = nn.relu(add(matmul(x, w), b))
  return y
}}
func gelu(x: {t}[64, 256], w: {t}[256, 128], b: {t}[128]) -> {t}[64, 128] {{
  y = nn.gelu_tanh(add(matmul(x, w), b))
  return y
}}
func bias(x: {t}[3, 64, 256], w: {t}[256, 128], b: {t}[128]) -> {t}[3, 64, 128] {{
  y = add(matmul(x, w), b)
  return y
}}
"""


@pytest.mark.parametrize("t", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("name", ["relu", "gelu", "bias"])
def test_cublas_epilogues_on_the_gpu(cp, backend, t, name):
    if t == "bf16":
        needs.package("ml_dtypes")
    mod = dpl.parse(EPILOGUES.format(t=t))
    mod = Module([_renamed(mod[name])])
    exe = dpl.build(dpl.apply(mod, ["cublas"]), on_cuda(backend), config=ALWAYS)
    args = random_args(mod["main"], 1)
    got = exe(*args)
    want = dpl.interpret(mod, *args)
    tol = {"f32": 1e-3, "f16": 2e-2, "bf16": 6e-2}[t]
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=tol, atol=tol)
    assert "one cuBLASLt GEMM with its epilogue" in exe.summary(), exe.summary()


def _renamed(fn):
    import attrs

    return attrs.evolve(fn, name="main")


# -- the model zoo ------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["llama128", "gpt2", "cnn"])
def test_the_model_zoo_on_the_gpu_equals_torch(cp, backend, key):
    torch = needs.package("torch")
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import bench_models
    finally:
        sys.path.remove(str(ROOT / "bench"))
    _, make_model, make_inputs = bench_models.workloads()[key]
    torch.manual_seed(0)
    model = make_model().eval()
    args = make_inputs()
    with torch.no_grad():
        expected = model(*args).numpy()
    mod = dpl.from_torch(model, args)
    exe = dpl.build(dpl.apply(mod, ["rewrites", "llm", "cublas"]), on_cuda(backend))
    got = exe(*[a.numpy() for a in args])
    np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("name", ["llama", "qwen2", "mistral", "phi3", "gpt2", "opt", "bert", "t5", "vit", "resnet"])
def test_the_hugging_face_zoo_on_the_gpu_equals_torch(cp, backend, name):
    """tests/zoo.py's models as tests/test_zoo.py imports them, on the device, to its tolerances."""
    import warnings

    needs.package("transformers")
    needs.package("torch")
    from zoo import ARCHS, torch_outputs

    arch = ARCHS[name]
    model = arch.build("sdpa")
    inputs = arch.inputs(8 if not arch.vision else 2, mask=arch.mask)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = dpl.from_torch(model, (), inputs, dynamic_shapes=arch.dynamic_shapes(inputs))
    exe = dpl.build(dpl.apply(mod, ["rewrites", "llm"]), on_cuda(backend))
    for seed in (10, 11):
        inputs = arch.inputs(8 if not arch.vision else 2, seed=seed, mask=arch.mask)
        want = torch_outputs(model, inputs)
        got = exe(*[v.numpy() for v in inputs.values()])
        got = list(got) if isinstance(got, (tuple, list)) else [got]
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-5, err_msg=f"{name} on the GPU")


# -- row kernels and flash attention (issue 21 item 4) --------------------------------------------


def _bench(name):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(ROOT / "bench"))


@pytest.mark.parametrize("t", ["f32", "f16", "f64"])
def test_row_kernels_on_the_gpu_equal_the_interpreter(cp, backend, t):
    """tests/test_cuda_rows.py's row kernels with a symbolic row length on the device: odd
    lengths, lengths past the shared-memory share, arrays at an offset (rows off the 16-byte
    boundary), to the host twin's tolerances."""
    from test_cuda_rows import KINDS, TOLERANCE, _inputs, numpy_dtype, row_functions

    functions = row_functions(t, "d")
    for kind in KINDS:
        kernel = backend.kernel(functions[kind])
        for rows, d, offset in ((3, 1, 0), (5, 7, 1), (4, 300, 0), (2, 4097, 3), (3, 9000, 0), (1, 20000, 1)):
            args = _inputs(functions[kind], rows, d, offset, rows * d, numpy_dtype(t))
            want = dpl.interpret(functions[kind], *args)
            wants = want if isinstance(want, tuple) else (want,)
            dev = [cp.asarray(np.zeros(a.size + offset, a.dtype))[offset:].reshape(a.shape) for a in args]
            for d_, a in zip(dev, args):
                d_[...] = cp.asarray(a)
            outs = [cp.full(w.size + offset, np.nan, w.dtype)[offset:].reshape(w.shape) for w in wants]
            kernel(dev, outs)
            for w, o in zip(wants, outs):
                w64, o64 = w.astype(np.float64), cp.asnumpy(o).astype(np.float64)
                scale = max(1.0, float(np.abs(w64).max()))
                np.testing.assert_allclose(o64, w64, rtol=TOLERANCE[t], atol=TOLERANCE[t] * scale,
                                           err_msg=f"{kind} {t} rows={rows} d={d} offset={offset}")


@pytest.mark.parametrize("t", ["f32", "f16"])
def test_row_kernels_reach_80_percent_of_the_copy_bandwidth(cp, backend, t):
    """Softmax, RMSNorm, LayerNorm, add+RMSNorm at 8192 x 4096, each kernel alone (CUDA events):
    bytes it must move over its time, against cupy.copyto of the same traffic."""
    cuda_rows = _bench("cuda_rows")
    small = cuda_rows.row_groups(t, 8, 4096)
    short = []
    for name, fn in cuda_rows.row_groups(t, 8192, 4096).items():
        m = cuda_rows.measure(cp, backend, fn, small[name])
        share = m["GB/s"] / m["copy GB/s"]
        if share < cuda_rows.FLOOR:
            short.append(f"{name}: {m['GB/s']:.0f} GB/s, {100 * share:.0f}% of the copy's {m['copy GB/s']:.0f}")
    assert not short, "; ".join(short)


def test_flash_attention_on_the_gpu_equals_the_interpreter(cp):
    """The CUDA flash kernel through the backend (attention="flash"): causal mask with fully
    masked rows, GQA, float16, at a GPU's block of 256 threads."""
    from test_flash_attention import CUDA_CASES, attention_module, check, inputs

    for name, (q, k, v, mask, dtype) in CUDA_CASES.items():
        if dtype == "bf16":
            continue  # CuPy has no bfloat16 arrays; the host twin covers it
        mod = attention_module(q, k, v, mask, dtype=dtype)
        exe = dpl.build(dpl.apply(mod, ["llm"]), [CupyBackend(cupy=cp, attention="flash"), "numpy"], config=ALWAYS)
        for seed in (1, 2, 3):
            args = inputs(mod, seed, 8.0)
            if mask is not None:
                args[3][..., 0, :] = -np.inf
            with np.errstate(all="ignore"):
                check(dpl.interpret(mod, *args), exe(*args), {"f64": 1e-12, "f16": 5e-3}.get(dtype, 2e-5))
        assert "flash attention, CUDA" in exe.summary(), exe.summary()


def test_kernels_are_compiled_once_for_the_architecture_of_the_device(cp, backend):
    """CuPy's NVRTC pins ``-arch`` to the device (sm_90 on Hopper, capped at what NVRTC knows);
    the backend keeps the module per (source, options, device)."""
    from cupy.cuda import compiler

    capability = cp.cuda.Device().compute_capability
    arch = min(capability, compiler._get_max_compute_capability(), key=int)
    assert compiler._get_arch() == arch
    assert compiler._get_arch_for_options_for_nvrtc()[0] in (f"-arch=sm_{arch}", f"-arch=compute_{arch}")
    code = 'extern "C" __global__ void k(float *a) { a[threadIdx.x] = 1.0f; }'
    first = backend.module(code, ("-DDPL_BLOCK=256",))
    assert backend.module(code, ("-DDPL_BLOCK=256",)) is first and backend.compiles == 1
    a = cp.zeros(32, cp.float32)
    first.get_function("k")((1,), (32,), (a,))
    assert float(a.sum()) == 32.0
