"""The C a fused group becomes on the ``cpu`` backend, generated without compiling it: the
kernel IR lowered and emitted as the CPU backend does; a group with matrix products is cut
into segments as the backend cuts it (products go to the products provider, each run between
them is one C kernel), with what a float32 product of a weight takes into its tiles when dpl's
packed routine computes it (bias, residual, activation, gated unit), or a convolution of a weight
when dpl's direct routine does (per-channel steps, residual, activation), said beside it."""

from __future__ import annotations

from dpl.errors import DplError
from dpl.ir.expr import Call, Constant, Function, GlobalVar, Module


def kernel_source(fn: Function, mod: Module) -> str:
    """The generated C of module function ``fn`` (a Primitive group, a composite or its Codegen
    wrapper), or a line saying why it has none."""
    from dpl.backends.cpu import backend as cpu
    from dpl.backends.cpu import conv_direct, packed_gemm
    from dpl.backends.cpu.segments import Part, Product, fold_epilogues, segment
    from dpl.ir.traverse import vars_in

    def _packed(p) -> bool:  # as CpuBackend._packs and its folding _direct, where the routines are available
        return p.call is not None and (packed_gemm.takes(p.call) or conv_direct.takes(p.call)) and isinstance(p.args[1], Constant)

    if "Codegen" in fn.attrs:
        for b in fn.bindings:
            if isinstance(b.value, Call) and isinstance(b.value.op, GlobalVar) and b.value.op.name in mod.functions:
                fn = mod[b.value.op.name]
    try:
        if any(cpu._blas_product(b) for b in fn.bindings):
            try:
                steps = fold_epilogues(segment(fn, cpu._blas_product, starts_part=cpu._pool), _packed,
                                   vars_in(fn.ret), glu=lambda p: _packed(p) and packed_gemm.takes_glu(p.call),
                                   acts=packed_gemm.ACTS)
            except cpu.NotSegmentable:
                return _c(fn)
            parts = []
            for s in steps:
                if isinstance(s, Product):
                    op = s.call.op if s.call is not None else "matmul"
                    if s.epilogue and op == "nn.conv2d":
                        parts.append(f"/* {s.var.name} = {op}(...): a convolution, computed by dpl's direct routine, "
                                     f"which applies {_epilogue(s.epilogue)} to each tile as it stores it */")
                    elif s.epilogue:
                        parts.append(f"/* {s.var.name} = {op}(...): a matrix product, computed by dpl's packed routine "
                                     f"(the CPU backend's float32 products), which applies {_epilogue(s.epilogue)} "
                                     "to each tile as it stores it */")
                    else:
                        parts.append(f"/* {s.var.name} = {op}(...): a matrix product, computed by BLAS */")
                elif isinstance(s, Part):
                    parts.append(_c(s.function))
            return "\n\n".join(parts)
        return _c(fn)
    except DplError as err:
        return f"/* no C kernel: {err.message} (runs on the next backend of the target) */"


def _c(fn: Function) -> str:
    from dpl.backends.cgen.emitter import emit_kernel
    from dpl.backends.cpu.backend import SYMBOL
    from dpl.kernel import lower_function

    source = emit_kernel(lower_function(fn), SYMBOL, vector_math=False)
    # the prelude every kernel shares (includes, 16-bit float helpers) says nothing about this one
    blocks = [b for b in source.split("\n\n") if not b.startswith("#include") and "dpl_bf16_load(uint16_t" not in b]
    return f"/* {fn.name}: generated C (shared includes and helpers left out) */\n" + "\n\n".join(blocks)


def kernel_sources(mod: Module, names) -> dict[str, str]:
    return {name: kernel_source(mod[name], mod) for name in names if name in mod.functions}


def _epilogue(epilogue: tuple) -> str:
    """A product's folded epilogue in words: ``+ bias, + residual, gelu`` or ``silu(gate) * up``."""
    words = []
    for step in epilogue:
        if step[0] == "glu":
            words.append("silu(first half) * second half" if step[1] else "first half * silu(second half)")
        elif step[0] == "act":
            words.append(step[1])
        elif step[0] == "channel":
            words.append(f"{step[1]} per channel")
        else:
            words.append(f"+ {step[0]}")
    return ", ".join(words)
