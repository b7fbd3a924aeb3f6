import os

import pytest

import needs


@pytest.fixture(autouse=True)
def steady_graph_clock(request, monkeypatch):
    """The CUDA graph runner's trial (steps against a replay) timed by a clock that ticks once
    a reading, so on the stand-in CuPy both take one tick and the graph is kept, whatever the
    host's load; on a device (test_gpu.py) the real clock decides."""
    if request.module.__name__ != "test_gpu":
        from itertools import count

        from dpl.backends.cuda.graph import GraphRunner

        monkeypatch.setattr(GraphRunner, "clock", staticmethod(count().__next__))


@pytest.fixture(scope="session")
def tvm():
    """TVM 0.27, the oracle. Missing TVM skips locally but fails under CI, so an oracle test
    can never silently stop running."""
    tvm = needs.package("tvm")
    needs.package("tvm.relax")
    return tvm


@pytest.fixture
def no_c_compiler():
    """The CPU backend as on a machine without a C compiler: unavailable, so "cpu" targets run
    on the NumPy backend by recorded fall-back (the runtime tests that check fall-back and the
    NumPy baseline use this)."""
    from dpl.backends.cpu.backend import CpuBackend
    from dpl.backends.registry import get_backend, register_backend

    old = get_backend("cpu")
    register_backend(CpuBackend(cc="dpl-no-such-compiler"))
    yield
    register_backend(old)


@pytest.fixture(scope="session")
def nvrtc():
    """NVRTC (the nvidia-cuda-nvrtc-cu12 wheel of the test extra), which compiles the CUDA
    kernels without a GPU. Missing, it skips locally but fails under CI."""
    from dpl.backends.cuda import nvrtc as module

    ok, why = module.available()
    if not ok:
        needs.missing(f"NVRTC: {why}")
    return module


@pytest.fixture(scope="session")
def cxx():
    """The system C++ compiler with OpenMP, which builds the host twin of the CUDA kernels.
    Missing, it skips locally but fails under CI."""
    import shutil
    import subprocess
    import tempfile

    cxx = os.environ.get("CXX") or "c++"
    why = None
    if shutil.which(cxx) is None:
        why = f"no C++ compiler ('{cxx}')"
    else:
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "probe.cpp")
            with open(src, "w") as f:
                f.write("#include <omp.h>\nint f() { return omp_get_max_threads(); }\n")
            r = subprocess.run([cxx, "-fopenmp", "-fPIC", "-shared", src, "-o", os.path.join(tmp, "p.so")], capture_output=True)
            if r.returncode != 0:
                why = f"the C++ compiler '{cxx}' has no OpenMP"
    if why:
        needs.missing(f"{why}: the CUDA host twin cannot be built")
    return cxx
