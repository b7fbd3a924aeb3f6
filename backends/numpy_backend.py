"""The NumPy backend: runs every kind of function by reference, the baseline of all others.

Its kernels interpret the function with the op registry's NumPy references (the same code as
:func:`dpl.interpret`) and copy the results into the destination arrays. It owns no codegen
prefix but claims every composite, so any composite whose own backend is missing lands here.
"""

from __future__ import annotations

import numpy as np

from dpl.backends.registry import (KINDS, Backend, Capabilities, CompileError, flatten, leaf_types, unflatten,
                                   wrapped_composite)
from dpl.interpret import run_function
from dpl.ir.dim_binding import DimMismatch, bind_shapes
from dpl.ir.extent_symbols import with_extent_symbols
from dpl.ir.expr import GlobalVar
from dpl.runtime.threads import BLAS


class NumpyBackend(Backend):
    name = "numpy"
    prefixes = ()
    capabilities = Capabilities(kinds=KINDS, composites=("*",))
    dispatch_by_prefix = False
    shape_generic = True  # the interpreter binds every symbol from the arrays of each call

    def can_run(self, unit):
        if unit.kind == "codegen":  # the reference runs the wrapper and what it calls
            return True, "capable"
        return super().can_run(unit)

    def compile(self, function, *, module=None, shapes=()):
        # a wrapper's composite runs in its place (as on cpu): its symbols then bind from these
        # arrays, not from a caller's extent symbols that the composite does not know
        function = _unwrapped(function, module)
        # run alone, a function binds its symbols from its own arrays: an extent they do not
        # determine ((n + 1) // 2 - 1 with no n) gets a symbol of its own
        function = with_extent_symbols(function)
        types = [p.ty for p in function.params]
        out_types = leaf_types(function.ret.ty)

        def kernel(inputs, outputs):
            # dims only the results carry (arange(end=seq), full of [seq, seq]) are read off them
            out_dims = result_dims(out_types, outputs)
            result = run_function(module, function, unflatten(types, inputs), outer_dims=out_dims)
            for dst, src in zip(outputs, flatten(result)):
                np.copyto(dst, src, casting="no")

        kernel.__qualname__ = f"numpy:{function.name}"
        if _calls_matmul(function, module):
            kernel.thread_pools = frozenset({BLAS})  # NumPy's matmul runs on BLAS's threads
        return kernel


def result_dims(out_types, outputs) -> dict[str, int]:
    """The dims the results' sizes determine, for a group whose inputs do not: a lone symbol
    (``arange(end=seq)``), or one an expression linear in it solves (Swin's shifted-window
    mask, constants broadcast to ``[batch * 16, ...]``)."""
    dims: dict[str, int] = {}
    try:
        bind_shapes([(t.shape, o.shape, f"result {i}") for i, (t, o) in enumerate(zip(out_types, outputs))], dims)
    except DimMismatch:
        pass  # what the results leave unbound or contradict, the run reports against its inputs
    return dims


def _unwrapped(function, module):
    """The composite a plain ``Codegen`` wrapper calls, or ``function`` itself (any other
    wrapper runs as written, its calls and all)."""
    try:
        return wrapped_composite(function, module)
    except CompileError:
        return function


def _calls_matmul(function, module, depth=0) -> bool:
    for b in function.bindings:
        op = getattr(b.value, "op", None)
        if op == "matmul":
            return True
        if isinstance(op, GlobalVar) and module is not None and op.name in module.functions and depth < 64:
            if _calls_matmul(module[op.name], module, depth + 1):
                return True
    return False


class NumpyKernelBackend(Backend):
    """The kernel flavour: fused groups (and ``kernel.*`` composites) run through dpl's kernel
    IR, ``dpl.kernel.lower_function`` then its NumPy evaluator. It proves the kernel path on
    the numbers the reference computes; a group that does not lower is its compile error."""

    name = "numpy-kernel"
    prefixes = ("kernel",)
    capabilities = Capabilities(kinds=("primitive", "composite"))
    dispatch_by_prefix = False  # shipped backends share "kernel": the target picks among them

    def compile(self, function, *, module=None, shapes=()):
        from dpl.kernel import LoweringError, evaluate, lower_function

        try:
            lowered = lower_function(function)
        except LoweringError as err:
            raise CompileError(f"'{function.name}' does not lower to one kernel: {err.message}") from None

        out_types = leaf_types(function.ret.ty)

        def kernel(inputs, outputs):
            out_dims = result_dims(out_types, outputs)
            result = evaluate(lowered, *inputs, dims=out_dims)
            for dst, src in zip(outputs, flatten(result)):
                np.copyto(dst, src, casting="no")

        kernel.__qualname__ = f"numpy-kernel:{function.name}"
        return kernel
