"""The C toolchain the CPU kernels are built with: the compiler's flags (each kept only where
this compiler takes it), what identifies a binary (the compiler's version, the host CPU), and
:class:`KernelCache`, the compiled kernels on disk. Below the CPU backend and the products
choice, which both build C."""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from dpl.backends.registry import CompileError
from dpl.cache_dir import store_dir
from dpl.runtime.disk_cache import DEFAULT_MAX_BYTES, CacheError, LibraryCache

BASE_FLAGS = ["-O3", "-fPIC", "-shared", "-std=gnu11"]
# each kept only if the compiler takes it. The last two change no value: no kernel reads errno or
# the floating-point exception flags, and without traps GCC may compute both arms of a select and
# vectorize it (a conversion to an integer or a libm call under a condition, as in T5's buckets)
# -mprefer-vector-width=512: GCC vectorizes loops for AVX-512 hosts in 256-bit vectors unless told
# (the registers' width costs some older cores their clock); on the bench host's Xeon a GELU's
# erf ran 11% and a layer norm's rows 15% faster in 512 (the routines' explicit vectors are
# theirs either way); a build without AVX-512 has no 512-bit vectors to prefer
FAST_FLAGS = ["-march=native", "-mprefer-vector-width=512", "-fopenmp", "-fno-math-errno", "-fno-trapping-math"]
SYMBOL = "dpl_kernel"


def default_cache_dir() -> Path:
    """The kernels' folder in platformdirs' user cache directory (``~/.cache/dpl/kernels``)."""
    return store_dir("kernels")


@lru_cache(maxsize=None)
def compiler_version(cc: str) -> str:
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.splitlines()[0] if out.returncode == 0 and out.stdout else ""


@lru_cache(maxsize=1)
def cpu_identity() -> str:
    """What must match for a ``-march=native`` binary to run: the CPU model and its flags."""
    text = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features", "CPU part")):
                    text += line.strip() + "\n"
                if line.strip() == "":
                    break
    except OSError:
        pass
    return hashlib.sha256((platform.machine() + platform.processor() + text).encode()).hexdigest()


# the instruction sets a ``-march`` may use, by the macro GCC and Clang predefine for each, as
# /proc/cpuinfo names them: a build for one this CPU lacks would stop at its first such instruction
MARCH_MACROS = {
    "__SSSE3__": "ssse3", "__SSE4_1__": "sse4_1", "__SSE4_2__": "sse4_2", "__AVX__": "avx", "__AVX2__": "avx2",
    "__FMA__": "fma", "__F16C__": "f16c", "__BMI__": "bmi1", "__BMI2__": "bmi2", "__AVX512F__": "avx512f",
    "__AVX512CD__": "avx512cd", "__AVX512BW__": "avx512bw", "__AVX512DQ__": "avx512dq", "__AVX512VL__": "avx512vl",
    "__AVX512VNNI__": "avx512_vnni", "__AVX512BF16__": "avx512_bf16", "__AVX512FP16__": "avx512_fp16",
    "__AMX_TILE__": "amx_tile",
}
MARCH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


@lru_cache(maxsize=None)
def march_missing(cc: str, march: str) -> tuple[str, ...] | None:
    """The instruction sets a ``-march=march`` build may use that this CPU lacks (empty: it runs
    here), or None where the compiler does not take that ``-march``. Where /proc/cpuinfo names no
    flags (another system) nothing is known to be missing."""
    from dpl.host_cpu import cpu_flags

    if not MARCH_NAME.fullmatch(march):
        return None
    try:
        r = subprocess.run([cc, f"-march={march}", "-dM", "-E", "-x", "c", os.devnull], capture_output=True, text=True,
                           timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    have = cpu_flags()
    defined = {line.split()[1] for line in r.stdout.splitlines() if line.startswith("#define ")}
    return tuple(flag for macro, flag in MARCH_MACROS.items() if macro in defined and have and flag not in have)


@lru_cache(maxsize=None)
def usable_flags(cc: str) -> tuple[str, ...]:
    """The fast flags this compiler accepts (each tried on a tiny program)."""
    flags = []
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text("#include <math.h>\nfloat f(float x) { return expf(x); }\n")
        for flag in FAST_FLAGS:
            r = subprocess.run([cc, *BASE_FLAGS, *flags, flag, str(src), "-o", str(Path(tmp) / "probe.so")],
                               capture_output=True, text=True)
            if r.returncode == 0:
                flags.append(flag)
    return tuple(flags)


@lru_cache(maxsize=None)
def vector_math(cc: str) -> bool:
    """Whether glibc's vector math library links here (see cgen.emitter.VECTOR_MATH)."""
    from dpl.backends.cgen.emitter import PRELUDE, VECTOR_MATH

    body = "void f(float *restrict a, int n) {\n#pragma omp simd\n for (int i = 0; i < n; ++i) a[i] = exp(a[i]) + log(a[i]) + tanh(a[i]) + erf(a[i]) + sin(a[i]) + cos(a[i]) + pow(a[i], a[i]);\n}\n"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text(PRELUDE + VECTOR_MATH + body)
        r = subprocess.run([cc, *BASE_FLAGS, *usable_flags(cc), str(src), "-o", str(Path(tmp) / "probe.so"), "-lmvec", "-lm"],
                           capture_output=True, text=True)
    return r.returncode == 0


class KernelCache:
    """Compiled kernels on disk, keyed by everything that decides the binary (a
    :class:`~dpl.runtime.disk_cache.LibraryCache` of ``directory``, verified before loading)."""

    def __init__(self, directory: str | os.PathLike | None = None, cc: str = "cc", max_bytes: int = DEFAULT_MAX_BYTES,
                 march: str = "native"):
        self.store = LibraryCache(directory if directory is not None else default_cache_dir(), max_bytes)
        self.cc = cc
        self.march = march  # the instruction sets built for: this CPU's, or another's (``haswell``: AVX2 and FMA only)
        self.served: set[str] = set()  # the keys of every library this cache handed out (what a package must hold)

    @property
    def directory(self) -> Path:
        return self.store.directory

    @property
    def compiles(self) -> int:
        """How many times this cache ran the compiler (for tests and reports)."""
        return self.store.builds

    def flags(self) -> list[str]:
        """The compiler's flags, ``-march`` set to :attr:`march` (an AVX2 build measured on an
        AVX-512 host says what another host will run)."""
        march = f"-march={self.march}"
        return [*BASE_FLAGS, *(march if f == "-march=native" else f for f in usable_flags(self.cc))]

    def vector_math(self) -> bool:
        """Whether the kernels call glibc's vector math (it changes their source)."""
        return vector_math(self.cc)

    def compiler(self) -> str:
        return compiler_version(self.cc)

    def cpu(self) -> str:
        return cpu_identity()

    def toolchain(self) -> dict:
        """What decides the binaries besides their source: recorded by a package, so that the
        kernels' keys can be computed where no compiler is (backends/cpu/prebuilt.py)."""
        return {"flags": self.flags(), "compiler": self.compiler(), "vector_math": self.vector_math(), "cpu": self.cpu()}

    def key(self, source: str) -> str:
        parts = [source, " ".join(self.flags()), self.compiler(), self.cpu()]
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    def cached(self, source: str) -> ctypes.CDLL | None:
        """The verified library of ``source`` when the store has it (no compiling, no lock)."""
        key = self.key(source)
        lib = self.store._verified(key, SYMBOL)
        if lib is not None:
            self.served.add(key)
        return lib

    def load(self, source: str) -> ctypes.CDLL:
        about = {"cc": compiler_version(self.cc), "cpu": cpu_identity()}
        key = self.key(source)
        try:
            lib = self.store.load(key, lambda out: self._compile(source, out), SYMBOL, about)
        except CacheError as err:
            raise CompileError(err.message) from None
        self.served.add(key)
        return lib

    def _compile(self, source: str, out: Path) -> None:
        src = out.with_name("kernel.c")
        src.write_text(source)
        libs = ["-lmvec", "-lm"] if "omp declare simd" in source else ["-lm"]
        r = subprocess.run([self.cc, *self.flags(), str(src), "-o", str(out), *libs], capture_output=True, text=True)
        if r.returncode != 0:
            raise CompileError(f"the C compiler failed on a generated kernel:\n{r.stderr.strip()[:2000]}")
