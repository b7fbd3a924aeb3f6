"""The kernels the CUDA tests compile: every group of the automatic-fusion corpus (FuseOps on
the 300 random DAGs, the 300 random fused groups), their float16 and bfloat16 variants, and
the hand-written corner cases of the CPU backend's tests."""

import re
from functools import lru_cache

import dpl
from dpl.ir import Module
from dpl.transform import fuse_ops

import test_cpu_backend as cpu_cases
from test_fuse_ops import RandomDag
from test_kernel_random_groups import random_group


@lru_cache(maxsize=1)
def automatic_groups() -> tuple:
    """(label, function) for every FuseOps group of the random DAGs and every random group."""
    out = []
    for seed in range(300):
        fused = fuse_ops(Module([RandomDag(seed).build()]))
        out += [(f"dag{seed}.{fn.name}", fn) for fn in fused.functions.values() if "Primitive" in fn.attrs]
        out.append((f"group{seed}", random_group(seed)))
    return tuple(out)


@lru_cache(maxsize=1)
def corner_cases() -> tuple:
    """Softmaxes (static, wide, symbolic rows), streaming-store shapes and bfloat16 casts."""
    mod = dpl.apply(dpl.parse(cpu_cases.SOFTMAXES), fuse_reductions=True)
    fns = [fn for fn in mod.functions.values() if "Primitive" in fn.attrs]
    fns += cpu_cases.streaming_kernels()
    fns += list(dpl.parse(cpu_cases.BF16).functions.values())
    return tuple((f"case.{fn.name}", fn) for fn in fns)


_FLOAT_LITERAL = re.compile(r"(?<=[(, ])(-?\d+\.\d+(?:e[-+]?\d+)?)(?=[,)])")


def retyped(fn, short: str):
    """``fn`` with every f32 value (parameters, literals) as dtype ``short`` (f16, bf16), or
    None when the text does not type-check that way."""
    text = _FLOAT_LITERAL.sub(r"\1:" + short, str(fn).replace("f32", short))
    try:
        return next(iter(dpl.parse(text).functions.values()))
    except dpl.DplError:
        return None


@lru_cache(maxsize=2)
def sixteen_bit_groups(short: str) -> tuple:
    out = []
    for label, fn in automatic_groups():
        g = retyped(fn, short)
        if g is not None:
            out.append((f"{label}.{short}", g))
    return tuple(out)
