"""The NumPy backend: runs every kind of function by reference, the baseline of all others.

Its kernels interpret the function with the op registry's NumPy references (the same code as
:func:`dpl.interpret`) and copy the results into the destination arrays. It owns no codegen
prefix but claims every composite, so any composite whose own backend is missing lands here.
"""

from __future__ import annotations

import numpy as np

from dpl.backends.registry import Backend, Capabilities, flatten, unflatten
from dpl.interpret import run_function


class NumpyBackend(Backend):
    name = "numpy"
    prefixes = ()
    capabilities = Capabilities(composites=("*",))

    def can_run(self, unit):
        if unit.kind == "codegen":  # the reference runs the wrapper and what it calls
            return True, "capable"
        return super().can_run(unit)

    def compile(self, function, *, module=None, shapes=()):
        types = [p.ty for p in function.params]

        def kernel(inputs, outputs):
            result = run_function(module, function, unflatten(types, inputs))
            for dst, src in zip(outputs, flatten(result)):
                np.copyto(dst, src, casting="no")

        kernel.__qualname__ = f"numpy:{function.name}"
        return kernel
