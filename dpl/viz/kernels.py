"""The C a fused group becomes on the ``cpu`` backend, generated without compiling it: the
kernel IR lowered and emitted as the CPU backend does; a group with matrix products is cut
into segments as the backend cuts it (products go to BLAS, each run between them is one C
kernel)."""

from __future__ import annotations

from dpl.errors import DplError
from dpl.ir.expr import Call, Function, GlobalVar, Module


def kernel_source(fn: Function, mod: Module) -> str:
    """The generated C of module function ``fn`` (a Primitive group, a composite or its Codegen
    wrapper), or a line saying why it has none."""
    from dpl.backends import cpu_backend as cpu
    from dpl.backends.segments import Part, Product, segment

    if "Codegen" in fn.attrs:
        for b in fn.bindings:
            if isinstance(b.value, Call) and isinstance(b.value.op, GlobalVar) and b.value.op.name in mod.functions:
                fn = mod[b.value.op.name]
    try:
        if any(cpu._blas_product(b) for b in fn.bindings):
            try:
                steps = segment(fn, cpu._blas_product)
            except cpu.NotSegmentable:
                return _c(fn)
            parts = []
            for s in steps:
                if isinstance(s, Product):
                    op = s.call.op if s.call is not None else "matmul"
                    parts.append(f"/* {s.var.name} = {op}(...): a matrix product, computed by BLAS */")
                elif isinstance(s, Part):
                    parts.append(_c(s.function))
            return "\n\n".join(parts)
        return _c(fn)
    except DplError as err:
        return f"/* no C kernel: {err.message} (runs on the next backend of the target) */"


def _c(fn: Function) -> str:
    from dpl.backends.c_emitter import emit_kernel
    from dpl.backends.cpu_backend import SYMBOL
    from dpl.kernel import lower_function

    source = emit_kernel(lower_function(fn), SYMBOL, vector_math=False)
    # the prelude every kernel shares (includes, 16-bit float helpers) says nothing about this one
    blocks = [b for b in source.split("\n\n") if not b.startswith("#include") and "dpl_bf16_load(uint16_t" not in b]
    return f"/* {fn.name}: generated C (shared includes and helpers left out) */\n" + "\n\n".join(blocks)


def kernel_sources(mod: Module, names) -> dict[str, str]:
    return {name: kernel_source(mod[name], mod) for name in names if name in mod.functions}
