"""The mylib backend: owns codegen prefix ``mylib`` and compiles its composites to C.

It keeps to dpl's kernel convention (docs/writing-a-backend.md): ``compile`` gets the function
(a ``Codegen`` wrapper or the composite itself), the module it lives in and the concrete
shapes of its flat inputs, and returns ``kernel(inputs, outputs)`` that reads the inputs and
writes every output in place. A composite it cannot compile is a CompileError; dpl then runs
it on the next backend of the target and records why.
"""

from __future__ import annotations

import ctypes
import os
import shutil

import numpy as np

from dpl.backends import Backend, Capabilities, KernelCache, read_composite

from dpl_mylib.emit import emit


class MyLibBackend(Backend):
    name = "mylib"
    prefixes = ("mylib",)
    # the defaults claim composites and Codegen wrappers of the own prefix; float32 only
    capabilities = Capabilities(dtypes=("float32",))

    def __init__(self, cc: str | None = None, cache_dir: str | os.PathLike | None = None):
        self.cc = cc or os.environ.get("CC") or "cc"
        self.cache = KernelCache(cache_dir, self.cc)  # dpl's disk cache of compiled C, keyed by the source
        self.compiled: list[str] = []  # composites this backend compiled (for tests and curious users)

    def available(self) -> tuple[bool, str]:
        if shutil.which(self.cc) is None:
            return False, f"no C compiler ('{self.cc}') on this machine"
        return True, "available"

    def compile(self, function, *, module=None, shapes=()):
        composite = read_composite(function, module)  # the composite a Codegen wrapper calls, as plain data
        emitted = emit(composite)
        lib = self.cache.load(emitted.source)
        entry = lib.dpl_kernel
        entry.restype = None
        entry.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64)]
        constants, row = emitted.constants, emitted.row
        self.compiled.append(composite.name)  # "mylib.dense_relu"

        def kernel(inputs, outputs):
            (out,) = outputs
            arrays = [np.ascontiguousarray(a) for a in inputs]  # inputs may be strided views
            target = out if out.flags.c_contiguous else np.empty_like(out, order="C")
            buffers = [*arrays, *constants, target]
            pointers = (ctypes.c_void_p * len(buffers))(*[a.ctypes.data for a in buffers])
            rows = out.size // row if row else 0  # symbolic dims: read off the output at each call
            entry(pointers, (ctypes.c_int64 * 1)(rows))
            if target is not out:
                np.copyto(out, target)

        kernel.__qualname__ = f"mylib:{function.name}"
        kernel.source = emitted.source  # what it runs, for the curious
        return kernel
