"""The host's CPU in words: its model name and the instruction sets that decide which kernels are
fast here (AVX2 and FMA, AVX-512 and its bf16 and VNNI extensions, AMX), read from /proc/cpuinfo.

For people reading a measurement: a benchmark's tables and a kept products choice say on which
CPU they were measured. What must match for a compiled kernel to run is
``dpl.backends.cpu.toolchain.cpu_identity`` (every flag, hashed), not this summary.
"""

from __future__ import annotations

import os
import platform
from functools import lru_cache

# the flags that change which code is fast, in the order they are printed
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")


@lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset[str]]:
    """The first processor's model name and flags (x86's ``flags``, Arm's ``Features``)."""
    model, flags = "", frozenset()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                name, _, value = line.partition(":")
                name = name.strip()
                if name == "model name" and not model:
                    model = value.strip()
                elif name in ("flags", "Features") and not flags:
                    flags = frozenset(value.split())
                elif not line.strip() and (model or flags):
                    break  # the first processor's block is enough
    except OSError:
        pass
    return model or platform.processor() or platform.machine() or "unknown CPU", flags


def cpu_model() -> str:
    """The CPU's model name (``platform.machine()`` where /proc/cpuinfo has none)."""
    return _cpuinfo()[0]


def cpu_flags() -> frozenset[str]:
    """Every flag /proc/cpuinfo gives the first processor (empty where there is none)."""
    return _cpuinfo()[1]


def isa_flags() -> tuple[str, ...]:
    """Which of :data:`ISA_FLAGS` this CPU has, in that order."""
    flags = _cpuinfo()[1]
    return tuple(f for f in ISA_FLAGS if f in flags)


def describe() -> str:
    """The CPU in one line: model, cores, instruction sets."""
    isa = " ".join(isa_flags()) or "none of " + "/".join(ISA_FLAGS[:3])
    return f"{cpu_model()}, {os.cpu_count()} cores, {isa}"
