"""Device-resident runs and CUDA graphs, on the stand-in CuPy (tests/fake_cupy.py).

What is checked here is the host side of the design: which copies cross between host and
device per call, which arrays come back, that a DLPack tensor goes in and out without a copy,
and that the captured graph replays the very launches of one run. That the same holds on a
GPU is what ``pytest -m gpu`` (tests/test_gpu.py) checks where there is one.
"""

from pathlib import Path

import numpy as np
import pytest

import dpl
from dpl.backends.cuda import graph as cuda_graph
from dpl.backends.cuda.graph import GraphRunner
from dpl.backends.cuda.backend import CupyBackend

import fake_cupy
import needs
from fake_cublaslt import FakeCublasLt
from fake_cupy import DeviceArray, FakeCupy, Tensor
from test_cpu_backend import ALWAYS, assert_close, random_args

EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.fixture
def fake(cxx):
    return FakeCupy()


def build(fake, example="llama_mlp", libraries=("rewrites", "llm", "cublas"), graphs=True, cublaslt=True, **kw):
    """``cublaslt``: products by the stand-in cuBLASLt (captured into graphs), or False:
    ``cupy.matmul``, which CuPy refuses inside a capture."""
    backend = CupyBackend(cupy=fake, block=8, cublaslt=FakeCublasLt(fake) if cublaslt else False)
    backend.graphs = graphs
    mod = dpl.load(EXAMPLES / f"{example}.ir")
    return mod, dpl.build(dpl.apply(mod, list(libraries)), [backend, "numpy"], config=ALWAYS, **kw)


def leaves(value):
    return list(value) if isinstance(value, tuple) else [value]


@pytest.mark.parametrize("example", ["llama_mlp", "attention", "residual_rmsnorm"])
def test_numpy_in_numpy_out_crosses_once_at_each_edge(fake, example):
    mod, exe = build(fake, example)
    for seed in (0, 1, 2):  # step by step and captured, then replayed twice
        args = random_args(mod["main"], seed)
        before = (fake.to_device, fake.to_host)
        got = exe(*args)
        assert (fake.to_device - before[0], fake.to_host - before[1]) == (len(args), len(leaves(got)))
        assert all(type(g) is np.ndarray for g in leaves(got))
        assert_close(dpl.interpret(mod, *args), got)
    assert "device-resident" in exe.summary() and "CUDA graph captured, replayed 2 time(s)" in exe.summary(), exe.summary()


def test_products_by_cupy_matmul_run_step_by_step_and_say_why(fake):
    """CuPy refuses cuBLAS calls inside a stream capture, so products that only cupy.matmul can
    run keep the plan out of a graph; the results are right all the same."""
    mod, exe = build(fake, cublaslt=False)
    for seed in (0, 1, 2):
        args = random_args(mod["main"], seed)
        assert_close(dpl.interpret(mod, *args), exe(*args))
    assert "step by step: a step cannot be captured (NotImplementedError: calling cuBLAS API during stream capture" in exe.summary()
    assert fake.capturing is None


def test_a_plan_whose_edges_outweigh_its_launches_runs_on_the_callers_arrays(fake):
    """One kernel over 2048 x 4096 floats: copying 100 MB through a graph's buffers would cost
    more than the most one step could save, so no graph is captured, and the note says why."""
    mod = dpl.parse("func main(x: f32[2048, 4096], y: f32[2048, 4096]) -> f32[2048, 4096] {\n"
                    "  z = add(x, y)\n  w = multiply(z, x)\n  return w\n}")
    backend = CupyBackend(cupy=fake, block=8, cublaslt=False)
    exe = dpl.build(dpl.apply(mod, []), [backend, "numpy"], config=ALWAYS)
    for seed in (0, 1):
        args = random_args(mod["main"], seed)
        assert_close(dpl.interpret(mod, *args), exe(*args))
    assert not fake.graphs
    assert "step by step: 1 step(s) save at most 100 us, copying 100.7 MB in and out of a graph costs about 134 us" \
        in exe.summary(), exe.summary()
    assert cuda_graph.worth_capturing(40, 1 << 20) is None  # a decoder step: many launches, small edges


@pytest.mark.parametrize("steps_s, graph_s", [(1.0, 2.0), (2.0, 1.0)])
def test_the_second_call_times_the_steps_against_the_graph_and_keeps_the_faster(fake, monkeypatch, steps_s, graph_s):
    """A captured plan is timed once both ways (each to its synchronisation) on the call after
    the capture; the slower way is dropped for good, and the note gives both times."""
    ticks = iter(np.cumsum([0.0, steps_s, 0.0, graph_s]))
    monkeypatch.setattr(GraphRunner, "clock", staticmethod(lambda: float(next(ticks))))
    mod, exe = build(fake)
    for seed in (0, 1, 2, 3):
        args = random_args(mod["main"], seed)
        assert_close(dpl.interpret(mod, *args), exe(*args))
    assert len(fake.graphs) == 1  # captured once, on the first call
    note = exe.summary()
    if graph_s < steps_s:
        assert "CUDA graph captured, replayed 3 time(s) (a call timed 1000000 us replayed, 2000000 us step by step)" in note, note
    else:
        assert "step by step: measured faster than its CUDA graph (1000000 us a call, 2000000 us replayed with its copies)" in note, note
        assert fake.graphs[0].launches == 1  # the trial's replay only


def test_cupy_arrays_in_cupy_arrays_out_without_a_copy(fake):
    mod, exe = build(fake)
    args = random_args(mod["main"], 3)
    device = [fake.asarray(a) for a in args]
    copies = (fake.to_device, fake.to_host)
    for _ in range(3):
        got = exe(*device)
        assert isinstance(got, DeviceArray)
        assert_close(dpl.interpret(mod, *args), np.asarray(got))
    assert (fake.to_device, fake.to_host) == copies


def test_dlpack_tensors_in_the_same_framework_out_without_a_copy(fake):
    mod, exe = build(fake)
    args = random_args(mod["main"], 4)
    tensors = [Tensor(fake.asarray(a)) for a in args]
    copies = (fake.to_device, fake.to_host)
    for _ in range(2):
        got = exe(*tensors)
        assert isinstance(got, Tensor) and isinstance(got.array, DeviceArray)
        assert_close(dpl.interpret(mod, *args), np.asarray(got.array))
    assert (fake.to_device, fake.to_host) == copies
    assert fake.from_dlpacks == 2 * len(args)
    assert fake_cupy.from_dlpack(got.array).array is got.array  # the framework side takes it as is


def test_the_graph_replays_the_launches_of_one_run(fake):
    mod, exe = build(fake)
    exe(*random_args(mod["main"], 0))  # step by step, then the capture
    assert len(fake.graphs) == 1
    graph = fake.graphs[0]
    launches = len(fake.launches)
    assert graph.calls and launches > 0
    exe(*random_args(mod["main"], 4))  # the trial: step by step once more, and one replay
    trial = len(fake.launches) - launches
    assert 0 < trial < launches and graph.launches == 1
    for seed in (5, 6, 7):  # new inputs through the graph's fixed input buffers
        args = random_args(mod["main"], seed)
        assert_close(dpl.interpret(mod, *args), exe(*args))
    assert graph.launches == 4
    assert len(fake.launches) == launches + trial  # nothing launched outside the graph
    assert len(fake.graphs) == 1  # one capture per shape


def test_a_new_shape_gets_its_own_graph(fake):
    mod = dpl.parse("""
func main(x: f32[n, 64], w: f32[64]) -> f32[n, 64] {
  y = nn.rms_norm(x, w, axes=[1], epsilon=1e-5)
  return y
}""")
    backend = CupyBackend(cupy=fake, block=8)
    exe = dpl.build(dpl.apply(mod, ["rewrites", "llm"]), [backend, "numpy"], config=ALWAYS)
    rng = np.random.default_rng(0)
    for n in (3, 5, 3, 5):
        args = [rng.standard_normal((n, 64)).astype(np.float32), rng.standard_normal(64).astype(np.float32)]
        assert_close(dpl.interpret(mod, *args), exe(*args))
    assert len(fake.graphs) == 2 and [g.launches for g in fake.graphs] == [1, 1]


def test_steps_on_the_host_run_between_device_steps_and_no_graph_is_captured(cxx):
    fake = FakeCupy(fail_compile=True)  # every kernel falls back to NumPy
    mod, exe = build(fake, "residual_rmsnorm", ("rewrites", "llm"))
    for seed in (0, 1):
        args = random_args(mod["main"], seed)
        assert_close(dpl.interpret(mod, *args), exe(*args))
    assert not fake.graphs
    assert "step by step: steps on the host: " in exe.summary(), exe.summary()


def test_a_capture_that_fails_runs_step_by_step_and_says_why(fake):
    mod, exe = build(fake)
    plan = exe.plan(*random_args(mod["main"], 0))
    device_plan = exe._device_runner().device_plan(plan)
    calls = []

    def allocating(inputs, outs):  # as a kernel allocating inside the capture would
        calls.append(1)
        fake.empty((4,), np.float32)

    real = device_plan.run_steps
    device_plan.run_steps = lambda i, o: real(i, o) if len(calls) == 0 and not calls.append(0) else allocating(i, o)
    exe(*random_args(mod["main"], 0))
    assert device_plan.graph.graph is None and fake.capturing is None
    assert "a step cannot be captured (AllocationInCapture: an allocation of 16 bytes inside the captured plan)" in exe.summary(), exe.summary()
    assert fake.allocator is None  # the allocator is CuPy's again after the capture
    device_plan.run_steps = real
    args = random_args(mod["main"], 1)
    assert_close(dpl.interpret(mod, *args), exe(*args))  # step by step from then on


def test_graphs_off_and_the_note_before_the_first_call(fake):
    mod, exe = build(fake, graphs=False)
    assert exe._device_runner().note(exe.plan(*random_args(mod["main"], 0))) == "device-resident: not run yet"
    for seed in (0, 1):
        args = random_args(mod["main"], seed)
        assert_close(dpl.interpret(mod, *args), exe(*args))
    assert not fake.graphs and "step by step: CUDA graphs are off" in exe.summary()
    runner = GraphRunner(fake, None, "a reason")
    assert runner.note == "step by step: a reason"


def test_bad_inputs_are_errors_not_tracebacks(fake):
    mod, exe = build(fake)
    args = random_args(mod["main"], 0)
    with pytest.raises(dpl.DplError, match=f"takes {len(args)} inputs"):
        exe(*args[:-1])
    with pytest.raises(dpl.DplError, match="NumPy arrays, CuPy arrays or DLPack tensors, got str"):
        exe("x", *args[1:])
    with pytest.raises(dpl.DplError, match="dtype"):
        exe(args[0].astype(np.float64), *args[1:])


def test_out_takes_numpy_and_cupy_arrays(fake):
    mod, exe = build(fake)
    args = random_args(mod["main"], 0)
    want = dpl.interpret(mod, *args)
    out = np.empty_like(want)
    before = fake.to_host
    assert exe(*args, out=out) is out
    assert_close(want, out)
    assert fake.to_host == before + 1
    device_out = fake.empty(want.shape, want.dtype)
    assert exe(*[fake.asarray(a) for a in args], out=device_out) is device_out
    assert_close(want, np.asarray(device_out))
    with pytest.raises(dpl.DplError, match=r"out\[0\] must be a float32 NumPy or CuPy array of shape"):
        exe(*args, out=np.empty((1, 2), np.float32))
    with pytest.raises(dpl.DplError, match="out= needs 1 arrays, got 2"):
        exe(*args, out=(out, out))


def test_a_source_compiles_once_per_options_and_device(fake):
    backend = CupyBackend(cupy=fake, block=8)
    mod = dpl.load(EXAMPLES / "residual_rmsnorm.ir")
    lowered = dpl.apply(mod, ["rewrites", "llm"])
    dpl.build(lowered, [backend, "numpy"], config=ALWAYS)(*random_args(mod["main"], 0))
    compiles = backend.compiles
    assert compiles > 0
    dpl.build(lowered, [backend, "numpy"], config=ALWAYS, cache=dpl.runtime.KernelCache())(*random_args(mod["main"], 0))
    assert backend.compiles == compiles  # the same sources, options and device: the modules kept
    other = CupyBackend(cupy=fake, block=16)
    dpl.build(lowered, [other, "numpy"], config=ALWAYS, cache=dpl.runtime.KernelCache())(*random_args(mod["main"], 0))
    assert other.compiles == compiles  # another backend: its own modules



def test_a_device_of_another_architecture_compiles_again(fake):
    from types import SimpleNamespace

    backend = CupyBackend(cupy=fake, block=8)
    backend.module("extern \"C\" __global__ void k() {}", ("-DDPL_BLOCK=8",))
    backend.module("extern \"C\" __global__ void k() {}", ("-DDPL_BLOCK=8",))
    assert backend.compiles == 1
    fake.cuda.Device = lambda: SimpleNamespace(compute_capability="80")
    backend.module("extern \"C\" __global__ void k() {}", ("-DDPL_BLOCK=8",))
    assert backend.compiles == 2


@pytest.mark.parametrize("capability", ["80", "90"])
def test_kernels_compile_for_the_architecture_of_the_device(nvrtc, cxx, capability):
    """The stand-in compiles every source with NVRTC for its device's architecture, as CuPy does."""
    fake = FakeCupy(nvrtc=nvrtc, compute_capability=capability)
    mod, exe = build(fake, "llama_mlp")
    args = random_args(mod["main"], 0)
    assert_close(dpl.interpret(mod, *args), exe(*args))
    assert fake.sources and fake.arch == f"compute_{capability}"
    assert exe.target[0].available() == (True, f"1 CUDA device, sm_{capability}")


def test_the_cuda_benchmark_says_there_is_no_device():
    import subprocess
    import sys

    if CupyBackend().available()[0]:
        pytest.skip("this machine has a CUDA device (the GPU suite runs the benchmark's code)")
    done = subprocess.run([sys.executable, str(EXAMPLES.parent / "bench" / "bench_cuda.py")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "bench_cuda: no CUDA device" in done.stderr, done.stderr


def test_bfloat16_and_tuple_inputs_cross_as_bits(fake):
    ml_dtypes = needs.package("ml_dtypes")
    mod = dpl.parse("""
func main(p: (bf16[4, 64], bf16[64]), s: f32[]) -> (bf16[4, 64], f32[]) {
  y = multiply(add(p[0], p[1]), 2.0:bf16)
  t = multiply(s, 3.0)
  return (y, t)
}""")
    exe = dpl.build(dpl.apply(mod, []), [CupyBackend(cupy=fake, block=8), "numpy"], config=ALWAYS)
    rng = np.random.default_rng(0)
    x, b = rng.standard_normal((4, 64)).astype(ml_dtypes.bfloat16), rng.standard_normal(64).astype(ml_dtypes.bfloat16)
    for _ in range(2):
        y, t = exe((x, b), np.float32(1.5))
        assert y.dtype == ml_dtypes.bfloat16 and type(y) is np.ndarray
        want = dpl.interpret(mod, (x, b), np.float32(1.5))
        np.testing.assert_array_equal(y.view(np.uint16), want[0].view(np.uint16))
        assert float(t) == 4.5
    y_bits, _ = exe((fake.asarray(x.view(np.uint16)), fake.asarray(b.view(np.uint16))), fake.asarray(np.float32(1.5)))
    assert y_bits.dtype == np.uint16  # CuPy has no bfloat16: the bits
    np.testing.assert_array_equal(np.asarray(y_bits), want[0].view(np.uint16))


def test_threads_calling_at_once_get_their_own_results(fake):
    from concurrent.futures import ThreadPoolExecutor

    mod, exe = build(fake)
    cases = [random_args(mod["main"], seed) for seed in range(8)]
    wants = [dpl.interpret(mod, *args) for args in cases]
    with ThreadPoolExecutor(4) as pool:
        gots = list(pool.map(lambda args: exe(*args), cases))
    for got, want in zip(gots, wants):
        assert_close(want, got)
