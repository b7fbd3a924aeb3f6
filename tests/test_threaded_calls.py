"""One Executable called from 8 threads at once, 25 calls each: every result is the
interpreter's for that thread's own inputs (each thread has different inputs, so a temporary
shared between two calls shows up as a wrong answer)."""

import threading
from pathlib import Path

import numpy as np
import pytest

import needs

import dpl

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
THREADS, CALLS = 8, 25


def inputs_for(fn, seed, dims):
    rng = np.random.default_rng(seed)
    shape = lambda ty: tuple(dims[d] if isinstance(d, str) else d for d in ty.shape)  # noqa: E731
    return [(rng.standard_normal(shape(p.ty)) * 0.2).astype(np.float32) for p in fn.params]


@pytest.fixture(scope="module")
def cpu(tmp_path_factory):
    from dpl.backends.cpu.backend import CpuBackend

    needs.c_compiler()
    return CpuBackend(cache_dir=tmp_path_factory.mktemp("kernels"), products="numpy")  # im2col's per-thread workspaces


# llama_mlp: products through BLAS with C segments between them (cpu), attention: a BLAS
# segment with a softmax part, conv_block: im2col convolutions with their per-thread workspaces
CASES = {"llama_mlp": {"n": 24}, "attention": {}, "conv_block": {}}


@pytest.mark.parametrize("backend", ["cpu", "numpy"])
@pytest.mark.parametrize("example", list(CASES))
def test_one_executable_from_eight_threads(example, backend, request):
    mod = dpl.parse((EXAMPLES / f"{example}.ir").read_text(), filename=f"{example}.ir")
    exe = dpl.build(dpl.apply(mod), [request.getfixturevalue("cpu"), "numpy"] if backend == "cpu" else "numpy")
    inputs = [inputs_for(mod["main"], seed, CASES[example]) for seed in range(THREADS)]
    want = [dpl.interpret(mod, *args) for args in inputs]
    if backend == "cpu":
        assert any(s.backend == "cpu" for s in exe.plan(*inputs[0]).steps)
    start = threading.Barrier(THREADS)
    wrong, errors = [0] * THREADS, []

    def work(t):
        try:
            start.wait()
            for _ in range(CALLS):
                got = exe(*inputs[t])
                if not np.allclose(got, want[t], rtol=1e-4, atol=1e-4):
                    wrong[t] += 1
        except Exception as err:  # noqa: BLE001 - reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sum(wrong) == 0, f"{sum(wrong)} of {THREADS * CALLS} calls wrong"
    assert len(exe.plans) == 1


def test_first_calls_from_several_threads_plan_once():
    """Threads meeting an input signature nobody planned yet: one plan, one compile each."""
    mod = dpl.parse((EXAMPLES / "llama_mlp.ir").read_text())
    exe = dpl.build(dpl.apply(mod), "numpy")
    args = inputs_for(mod["main"], 0, {"n": 8})
    start = threading.Barrier(4)
    results = []

    def work():
        start.wait()
        results.append(exe(*args))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and len(exe.plans) == 1
    for r in results:
        np.testing.assert_allclose(r, dpl.interpret(mod, *args), rtol=1e-4, atol=1e-4)
