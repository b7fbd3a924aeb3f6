"""CuPy + cuBLAS on CUDA: owns the ``cupy`` and ``cublas`` codegen prefixes.

Its kernels come with a later issue; until then, and on any machine without CuPy or a CUDA
device, it reports itself unavailable with the reason, and targets fall back past it.
"""

from __future__ import annotations

import importlib.util

from dpl.backends.registry import Backend, Capabilities, CompileError


class CupyBackend(Backend):
    name = "cupy"
    prefixes = ("cupy", "cublas")
    capabilities = Capabilities(composites=("cublas.*", "cupy.*", "kernel.*"), dtypes=("float16", "float32", "float64"))

    def available(self):
        if importlib.util.find_spec("cupy") is None:
            return False, "CuPy is not installed"
        try:
            import cupy

            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as err:  # the CUDA driver or runtime is missing or broken
            return False, f"no CUDA device ({type(err).__name__}: {err})"
        if count == 0:
            return False, "no CUDA device"
        return False, "the CuPy kernels are not built yet"

    def compile(self, function, *, module=None, shapes=()):
        raise CompileError(f"backend 'cupy' cannot compile '{function.name}' yet")
