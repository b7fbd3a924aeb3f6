"""A module's C kernels compile in parallel while its plan is made (dpl.runtime.build_pool):
two compiles run at once, a failed build falls back as a serial one would, the progress line
is drawn only where asked and only when something compiles."""

import io
import threading

import numpy as np
import pytest

import needs

import dpl
from dpl.backends.cpu.backend import CpuBackend, KernelCache
from dpl.backends.registry import CompileError
from runtime_corpus import CORPUS, inputs_for

ALWAYS = dpl.FusionConfig(min_nodes_for_fusion=1)


@pytest.fixture
def single_ops():
    needs.c_compiler()
    make, dims = CORPUS["single_ops"]  # five distinct C kernels
    return make(), dims


def check(exe, mod, dims):
    args = inputs_for(mod, dims)
    np.testing.assert_allclose(exe(*args), dpl.interpret(mod, *args), rtol=1e-5, atol=1e-6)


def test_two_compiles_run_at_once(single_ops, tmp_path, monkeypatch):
    mod, dims = single_ops
    met, threads = threading.Barrier(2, timeout=20), []
    real = KernelCache._compile

    def compile_(self, source, out):
        threads.append(threading.current_thread().name)
        if len(threads) <= 2:
            met.wait()  # the first two compiles meet here: only if they run side by side
        real(self, source, out)

    monkeypatch.setattr(KernelCache, "_compile", compile_)
    cpu = CpuBackend(cache_dir=tmp_path)
    exe = dpl.build(mod, [cpu, "numpy"], config=ALWAYS, progress=None)
    routine = cpu._packed is not None and cpu.products.packs  # the packed product routine, where products="auto" took it
    assert cpu.cache.compiles == 5 + routine and all(t.startswith("dpl-build") for t in threads)
    assert not met.broken
    assert all(s.backend == "cpu" for s in exe.plan(*inputs_for(mod, dims)).steps)
    check(exe, mod, dims)


def test_a_failed_build_falls_back_as_in_turn(single_ops, tmp_path, monkeypatch):
    mod, dims = single_ops
    real = KernelCache._compile

    def compile_(self, source, out):
        if "exp" in source.split("dpl_kernel")[-1]:  # the softmax kernel's compiler fails
            raise CompileError("the C compiler failed on a generated kernel: planted")
        real(self, source, out)

    monkeypatch.setattr(KernelCache, "_compile", compile_)
    exe = dpl.build(mod, [CpuBackend(cache_dir=tmp_path), "numpy"], config=ALWAYS, progress=None)
    backends = {s.label: s.backend for s in exe.plan(*inputs_for(mod, dims)).steps}
    assert backends["op nn.softmax"] == "numpy" and backends["op nn.relu"] == "cpu"
    assert sum("planted" in str(f) for f in exe.fallbacks) == 1
    check(exe, mod, dims)


def test_progress_is_drawn_where_asked_and_only_for_compiles(single_ops, tmp_path):
    mod, dims = single_ops
    stream = io.StringIO()
    cpu = CpuBackend(cache_dir=tmp_path)
    dpl.build(mod, [cpu, "numpy"], config=ALWAYS, progress=stream)
    text = stream.getvalue()
    done = 5 + (cpu._packed is not None and cpu.products.packs)  # with the packed product routine, where it was taken
    assert "dpl: compiling kernels" in text and f"{done}/{done}" in text and text.endswith("\n") and text.count("\n") == 1
    warm = io.StringIO()
    dpl.build(mod, [CpuBackend(cache_dir=tmp_path), "numpy"], config=ALWAYS, progress=warm)
    assert warm.getvalue() == ""
