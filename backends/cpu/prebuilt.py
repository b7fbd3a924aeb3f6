"""The CPU backend's side of a compiled package (``dpl.save_package``): what its kernels need to
be called again without a compiler, and :class:`PackagedCpuBackend`, which runs a package's
kernels and never compiles.

A kernel's disk-cache key hashes its source, the compiler's flags and version, and the CPU
(:class:`~dpl.backends.cpu.toolchain.KernelCache`); where no compiler is, none of those can be
asked of it. So a package records them (:func:`describe`), and :class:`PrebuiltKernels` computes
the same keys from the record: the same plan emits the same sources, finds each one's library
among the package's, and a source the package lacks is a compile error, which falls back along
the target like any other (visibly: ``exe.fallbacks``). The products provider is pinned to the
one the saving backend chose (``products="auto"`` would measure), and so is the attention path.

Which kernels a plan needs is found by building the executable again with a :func:`replica` of
its CPU backend, whose cache notes every key it hands out (``KernelCache.served``): exactly the
kernels a load will ask for, where the saving backend's own cache served every build of the
process.
"""

from __future__ import annotations

import hashlib
import logging
import platform
import re

from dpl.backends.cpu import blas
from dpl.backends.cpu.backend import CpuBackend
from dpl.backends.cpu.toolchain import SYMBOL, KernelCache
from dpl.backends.registry import BackendError, CompileError
from dpl.cache_dir import store_dir
from dpl.runtime.disk_cache import DEFAULT_MAX_BYTES, CacheError
from dpl.runtime.heap import keep_mapped

log = logging.getLogger(__name__)

# the cpuinfo flags that name instruction-set extensions (x86); what -march=native may use. The
# others (tsc_known_freq, hypervisor, ...) differ between machines that run the same code
_X86_ISA = re.compile(r"(sse|ssse|avx|fma|f16c|bmi|popcnt|movbe|aes|pclmul|vpclmul|sha|adx|abm|lzcnt|gfni|vaes|amx|xsave|"
                      r"rdrand|rdseed|cx16|cx8|lahf|prefetchw|mmx|fxsr|cmov|vnni)")


def isa() -> dict:
    """This machine's architecture and the instruction-set extensions its CPU reports."""
    features: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() in ("flags", "Features"):
                    features = set(value.split())
                    break
    except OSError:
        pass
    machine = platform.machine()
    if machine in ("x86_64", "AMD64", "i686"):
        features = {f for f in features if _X86_ISA.match(f)}
    return {"machine": machine, "features": sorted(features)}


def isa_mismatch(recorded: dict, flags: list[str]) -> str | None:
    """Why kernels built on the ``recorded`` machine with ``flags`` cannot run here, or None."""
    here = isa()
    if recorded.get("machine") != here["machine"]:
        return f"its kernels are {recorded.get('machine')} code and this machine is {here['machine']}"
    if "-march=native" not in flags:
        return None
    missing = sorted(set(recorded.get("features", ())) - set(here["features"]))
    if missing:
        shown = ", ".join(missing[:12]) + (f" and {len(missing) - 12} more" if len(missing) > 12 else "")
        return f"its kernels were built with -march=native on a CPU with {shown}, which this CPU lacks"
    return None


def describe(backend: CpuBackend) -> dict:
    """What a package records of ``backend``: what decided its binaries and its plans' choices
    (a loaded package's backend: the machine its kernels were built on, not this one)."""
    built_on = backend.record["isa"] if isinstance(backend, PackagedCpuBackend) else isa()
    return {"toolchain": backend.cache.toolchain(), "isa": built_on, "products": _products_record(backend._products),
            "attention": backend.attention, "stream_bytes": backend.stream_bytes}


def _products_record(provider) -> dict | None:
    if provider is None:  # no product was built: none will be asked for
        return None
    torch = isinstance(provider, blas.TorchProducts)
    return {"library": "torch" if torch else "numpy", "matmuls": bool(getattr(provider, "matmuls", False)),
            "convolutions": bool(getattr(provider, "convolutions", False)), "packs": bool(provider.packs)}


def _provider(record: dict | None, cc: str):
    """The products provider a package recorded (NumPy's where it recorded none)."""
    if record is None or record.get("library") == "numpy":
        provider = blas.NumpyProducts()
        provider.packs = bool(record and record.get("packs"))
    else:
        try:
            provider = blas.TorchProducts(cc, why="", matmuls=bool(record.get("matmuls")),
                                          convolutions=bool(record.get("convolutions")))
        except BackendError:  # the same products by NumPy's BLAS and im2col: no kernel of the package changes
            log.warning("the package's products ran on torch, which is not installed here: NumPy's BLAS computes them")
            provider = blas.NumpyProducts()
        provider.packs = bool(record.get("packs"))
    provider.why = "as the package recorded it (dpl.save_package)"
    return provider


def replica(backend: CpuBackend) -> CpuBackend:
    """A backend of ``backend``'s options, products and cache folder whose cache has served
    nothing yet: building with it tells which kernels a plan needs."""
    if isinstance(backend, PackagedCpuBackend):
        return PackagedCpuBackend(backend.cache.kernels, backend.record, cache_dir=backend.cache.store.requested)
    twin = CpuBackend(cache_dir=backend.cache.store.requested, cc=backend.cc, stream_bytes=backend.stream_bytes,
                      products=backend.products_name, cache_max_bytes=backend.cache.store.max_bytes, attention=backend.attention)
    if backend._products is not None:  # the provider it chose ("auto" measured once), not a new choice
        twin._products, twin._heap = backend._products, backend._heap
    return twin


def served_kernels(backend: CpuBackend) -> dict[str, bytes]:
    """The verified bytes of every library ``backend``'s cache handed out, by key."""
    out = {}
    for key in sorted(backend.cache.served):
        found = backend.cache.store.read(key)
        if found is None:
            raise CompileError(f"kernel {key[:16]} left the cache {backend.cache.directory} while it was read "
                               "(evicted or cleared meanwhile)")
        out[key] = found[0]
    return out


class PrebuiltKernels(KernelCache):
    """A package's kernels by key, under keys computed from the package's toolchain record; it
    never compiles. Each library is written once into a private store (``packaged`` in dpl's
    cache directory, or ``directory``), checked against the package's SHA-256, and loaded."""

    def __init__(self, kernels: dict[str, bytes], toolchain: dict, directory=None, max_bytes: int = DEFAULT_MAX_BYTES):
        super().__init__(directory if directory is not None else store_dir("packaged"), max_bytes=max_bytes)
        self.kernels = kernels
        self.recorded = toolchain
        self._hashes = {key: hashlib.sha256(data).hexdigest() for key, data in kernels.items()}

    def flags(self) -> list[str]:
        return list(self.recorded["flags"])

    def vector_math(self) -> bool:
        return bool(self.recorded["vector_math"])

    def compiler(self) -> str:
        return self.recorded["compiler"]

    def cpu(self) -> str:
        return self.recorded["cpu"]

    def cached(self, source: str):
        key = self.key(source)
        if key not in self.kernels:
            return None
        lib = self.store._verified(key, SYMBOL, self._hashes[key])
        if lib is not None:
            self.served.add(key)
        return lib

    def load(self, source: str):
        key = self.key(source)
        data = self.kernels.get(key)
        if data is None:
            raise CompileError(f"the package holds no kernel for this source (key {key[:16]}); a package runs the kernels "
                               "it was saved with, and compiles none")
        try:
            lib = self.store.load(key, lambda out: out.write_bytes(data), SYMBOL, {"from": "a package"}, sha256=self._hashes[key])
        except CacheError as err:  # a full disk, a store made read-only: the target's next backend runs the unit
            raise CompileError(err.message) from None
        self.served.add(key)
        return lib


class PackagedCpuBackend(CpuBackend):
    """The CPU backend of a loaded package: its kernels prebuilt, its products provider and
    attention path as recorded; available without a C compiler."""

    def __init__(self, kernels: dict[str, bytes], record: dict, cache_dir=None):
        super().__init__(stream_bytes=record["stream_bytes"], products="numpy", attention=record["attention"])
        self.record = record
        self.cache = PrebuiltKernels(kernels, record["toolchain"], cache_dir)

    @property
    def products(self):
        if self._products is None:
            self._heap = keep_mapped()
            self._products = _provider(self.record.get("products"), self.cc)
        return self._products

    def available(self) -> tuple[bool, str]:
        return True, "available (a package's prebuilt kernels)"
