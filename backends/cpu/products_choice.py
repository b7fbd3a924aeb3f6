"""``CpuBackend(products="auto")``: which library computes the matrix products and convolutions
on this machine, by measurement, once per machine and library versions.

The contenders are NumPy's BLAS (OpenBLAS, with im2col for convolutions: the floor, always
there), torch (MKL's ``matmul``, oneDNN's convolution) when torch is installed, and for float32
products dpl's own routine, a model's weights packed once (:mod:`dpl.backends.cpu.packed_gemm`),
when the C compiler builds it. Each computes a representative
layer's products (a short sequence, 128 rows, through a 512-wide decoder layer's four weights:
q/k/v, o, gate/up, down; 12.6 MB of weights, more than a core's L2, so each product meets its
weights as a model's call does) and a representative convolution (3x3, 64 channels at 56x56),
interleaved (each contender once per round, the rounds repeated), the median of the rounds, on
one thread, in the calling thread's CPU time (what a library can do, not what a busy machine's
scheduler let it do: at two threads on a loaded 2-core host the same product took 3 to 15 times
its one-thread time, and even the best of 9 wall-clock rounds on one thread put either library
ahead from run to run). torch takes the products, and
separately the convolutions, where it is at least ``MARGIN`` faster: a tie stays with NumPy, the
floor (with the representative product a near tie, torch's products made the GPT-2 block and the
Llama decoder of bench/bench_models.py 5% and 9% slower, one thread, CPU time); the packed
routine takes the float32 products (and im2col's) unless the library that took the products is
at least ``MARGIN`` faster than it: a tie goes to the routine, for one thread pool (see
:attr:`Measured.packs`).

The result is kept in dpl's cache directory (``~/.cache/dpl/products``, :mod:`dpl.cache_dir`),
keyed by everything that could change it (:func:`_key`): the CPU (model and instruction sets),
the core count, NumPy and its BLAS library (threadpoolctl's name and version), torch, the C
compiler, dpl's version and the packed routine's source, and where they are not the CPU's own, the
instruction sets the C is built for (``CpuBackend(march=...)``) and the libraries are held to
(:data:`ISA_ENVIRONMENT`); a change of any of them measures again.
A measurement whose rounds spread too far (the interquartile range over the median beyond
:data:`NOISY` for any contender: a machine busy enough to disturb even CPU time) is used by this
process only and not kept, so a one-off under load does not stick. A later build reads the small
file and never measures again; within a process it is read once. ``dpl cache info`` shows what
each kept choice holds, ``dpl cache reset-choices`` removes them. torch is imported only to
measure, or at the first product or convolution it won; never when it is absent or lost.

On the 2-core AVX-512 bench host (AMD EPYC, load average 7-12), one thread, CPU ms: products NumPy
1.61 vs torch 1.66-1.75 (NumPy kept), convolution im2col 3.3-3.6 vs torch 2.4-2.6 (torch taken)
(stop 24, one 128x512 @ 512x1024 product). Stop 25, the layer's products, load 0.9: torch
12.86 ms, NumPy 10.50, the packed routine 9.71 (taken). On another shared 2-core host (Intel
Xeon, AVX-512 and AMX) at load 5.8, three runs of 9 rounds: the rounds spread 3-13% of their
median, and the ratio of torch's median to NumPy's stayed within 0.76-0.80. There, at load 3-4,
with the routine tuned per instruction set (issue 30), two runs each: the AVX-512 build 5.90-6.11
ms against torch 5.91-6.18 and NumPy 7.18-7.51 (torch kept: a tie); an AVX2-only build
(``KernelCache(march="haswell")``, OpenBLAS and MKL on their AVX2 kernels) 8.61-9.25 against
NumPy 8.38-9.11 (NumPy kept, the routine within 3%; 7-9% slower before).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import statistics
import threading
import time
from datetime import datetime, timezone
from functools import lru_cache

import attrs
import numpy as np

from dpl.cache_dir import private_dir, read_own_file, store_dir, write_private_file
from dpl.runtime.heap import keep_mapped
from dpl.runtime.threads import budget_threads

log = logging.getLogger(__name__)

ROWS = 128
LAYER = ((512, 1536), (512, 512), (512, 2816), (1408, 512))  # (k, n) of a decoder layer's weights
CONV = ((1, 64, 56, 56), (64, 64, 3, 3))  # NCHW input, OIHW weights; padding 1 (a ResNet stage 1)
ROUNDS = 9
MARGIN = 0.95  # work moves from its default (NumPy for products, the packed routine for float32 ones) only to a median at most this fraction of it
NOISY = 0.2  # the most a kept measurement's rounds may spread: interquartile range / median
VERSION = 7  # of the measurement: a change makes every cached choice stale

_lock = threading.Lock()
_chosen: dict[str, "Measured"] = {}


@attrs.frozen
class Measured:
    """The median times in ms of NumPy's and torch's layer products and convolution and of the
    packed routine's layer products, on one thread (torch's None: not installed; the packed
    routine's None: it did not compile)."""

    numpy_matmul: float
    numpy_conv: float
    torch_matmul: float | None = None
    torch_conv: float | None = None
    packed_matmul: float | None = None
    spread: float | None = None  # the widest interquartile range over median of any contender's rounds
    rounds: int = ROUNDS
    when: str = ""  # when it was measured (UTC, ISO 8601), for people reading the cache
    machine: str = ""  # where it was measured, for people reading the cache (dpl cache info); the key decides
    where: str = ""  # the cache file, or "" when just measured and not stored

    @property
    def noisy(self) -> bool:
        """Whether its rounds spread too far to be kept for later processes."""
        return self.spread is not None and self.spread > NOISY

    @property
    def torch_matmuls(self) -> bool:
        return self.torch_matmul is not None and self.torch_matmul <= MARGIN * self.numpy_matmul

    @property
    def torch_convolutions(self) -> bool:
        return self.torch_conv is not None and self.torch_conv <= MARGIN * self.numpy_conv

    @property
    def packs(self) -> bool:
        """Whether float32 products go to the packed routine: unless the library that took the
        products beats it by the margin. A tie goes to the routine, which runs on the generated
        kernels' OpenMP team: one thread pool, no BLAS workers spinning beside the kernels
        (issue 30: two pools made two threads slower than one), and a plan of C calls only, which
        the runtime calls in one call into C (dpl.runtime.prepared)."""
        library = self.torch_matmul if self.torch_matmuls else self.numpy_matmul
        return self.packed_matmul is not None and MARGIN * self.packed_matmul <= library

    def choice(self) -> str:
        """What took each kind of work, in a few words."""
        products = "torch" if self.torch_matmuls else "NumPy"
        float32 = "the packed routine" if self.packs else products
        convolutions = "torch" if self.torch_convolutions else "im2col"
        return f"products by {products}, float32 ones by {float32}, convolutions by {convolutions}"

    def medians(self) -> str:
        """The medians it chose by, in a few words (``dpl cache info``)."""
        ms = lambda t: "-" if t is None else f"{t:.2f}"  # noqa: E731
        return (f"products NumPy {ms(self.numpy_matmul)} ms, torch {ms(self.torch_matmul)}, packed {ms(self.packed_matmul)}; "
                f"convolution im2col {ms(self.numpy_conv)}, torch {ms(self.torch_conv)}; "
                f"median of {self.rounds} rounds, " + ("spread not recorded" if self.spread is None else
                                                        f"spread {100 * self.spread:.0f}%"))

    def why(self) -> str:
        (_, c, h, w), _ = CONV
        stored = f"; cached in {self.where}" if self.where else ("; too noisy to keep" if self.noisy else "")
        layer = f"a {LAYER[0][0]}-wide layer's {len(LAYER)} products at {ROWS} rows"
        packed = ("the packed routine did not compile" if self.packed_matmul is None else
                  f"packed routine {self.packed_matmul:.2f} ms")
        if self.torch_matmul is None:
            return (f"auto, measured here: torch is not installed, NumPy's BLAS; float32 products by "
                    f"{'the packed routine' if self.packs else 'NumPy'} ({layer}: {packed} vs NumPy "
                    f"{self.numpy_matmul:.2f}); one thread, median of {self.rounds}{stored}")
        who = lambda won: "torch" if won else "NumPy"  # noqa: E731
        by_f32 = "the packed routine" if self.packs else who(self.torch_matmuls)
        return (f"auto, the faster of each measured here: products by {who(self.torch_matmuls)}, float32 ones "
                f"by {by_f32} ({layer}: torch {self.torch_matmul:.2f} ms vs NumPy {self.numpy_matmul:.2f} vs "
                f"{packed}), convolutions by {'torch' if self.torch_convolutions else 'im2col'} (3x3 {c}x{h}x{w} torch "
                f"{self.torch_conv:.2f} ms vs im2col {self.numpy_conv:.2f}); one thread, median of {self.rounds}{stored}")


@lru_cache(maxsize=None)
def _version(dist: str) -> str | None:
    """The installed version of ``dist`` (read once: reading a distribution's metadata took 2 ms
    of every warm build)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@lru_cache(maxsize=1)
def _blas() -> str:
    """NumPy's BLAS library in words (threadpoolctl's name, version, kernels and threading), or
    "unknown BLAS". Only the libraries NumPy loaded count: torch's, when imported, would make
    the key depend on what was imported first."""
    from threadpoolctl import threadpool_info

    libs = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    # a wheel's BLAS lies in numpy.libs; a NumPy linked to a system BLAS: every BLAS loaded
    ours = [i for i in libs if os.path.basename(os.path.dirname(str(i.get("filepath")))).startswith("numpy")] or libs
    words = sorted(f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')}, {i.get('threading_layer')})"
                   for i in ours)
    return ", ".join(words) or "unknown BLAS"


@lru_cache(maxsize=1)
def _kernel_digest() -> str:
    """The packed routine's C source (both variants: with and without glibc's vector math), hashed."""
    from dpl.backends.cpu import packed_gemm

    return hashlib.sha256((packed_gemm.source(True) + "\0" + packed_gemm.source(False)).encode()).hexdigest()[:16]


def _machine(compiler: str, march: str = "native") -> str:
    """The things :func:`_key` hashes, in words: the CPU model and instruction sets, its cores,
    the libraries, and the instruction sets the C and the libraries were restricted to."""
    from dpl.host_cpu import describe

    torch = _version("torch")
    restricted = "".join(f", {name}={os.environ[name]}" for name in ISA_ENVIRONMENT if name in os.environ)
    return (f"{describe()}; NumPy {np.__version__} with {_blas()}, {f'torch {torch}' if torch else 'no torch'}, "
            f"{compiler or 'no C compiler'}, dpl {_version('dpl')}"
            + ("" if march == "native" else f", C for -march={march}") + restricted)


def read_stored(path) -> Measured | None:
    """The choice kept in the file ``path`` (one of the store's), or None when it is not one."""
    try:
        return Measured(**json.loads(read_own_file(path, limit=4096)), where=str(path))
    except (OSError, ValueError, TypeError):
        return None


def stored_here(cc: str = "cc", march: str = "native") -> str:
    """The name of the file that holds this machine's choice (with the C compiler ``cc``, its
    C built for ``-march=march``)."""
    from dpl.backends.cpu.toolchain import compiler_version, cpu_identity

    return f"{_key(cpu_identity(), compiler_version(cc), march)}.json"


# what restricts the libraries to fewer instruction sets than the CPU's (an AVX2 host's run,
# measured on an AVX-512 one): OpenBLAS's kernels, MKL's, oneDNN's (torch's convolutions)
ISA_ENVIRONMENT = ("OPENBLAS_CORETYPE", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def _key(cpu: str, compiler: str = "", march: str = "native") -> str:
    """The name of the choice measured on the CPU ``cpu`` (``toolchain.cpu_identity``: its model
    and flags) with the C compiler ``compiler`` building for ``-march=march``, the libraries'
    instruction sets as the environment restricts them, and everything else a choice depends on."""
    parts = [str(VERSION), cpu, str(os.cpu_count()), np.__version__, _blas(), str(_version("torch")), compiler,
             str(_version("dpl")), _kernel_digest()]
    restricted = [f"{name}={os.environ[name]}" for name in ISA_ENVIRONMENT if name in os.environ]
    if march != "native" or restricted:  # the keys of native, unrestricted choices stay as they were
        parts += [march, *restricted]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def spread(times: list[float]) -> float:
    """How far ``times`` spread: their interquartile range over their median (0 for fewer than 2)."""
    if len(times) < 2:
        return 0.0
    low, _, high = statistics.quantiles(times, n=4, method="inclusive")
    return (high - low) / statistics.median(times)


def _rounds_ms(fns, rounds: int) -> list[list[float]]:
    """Each of ``fns`` timed once per round, the rounds interleaved (A, B, A, B, ...): every
    round's time of each, in ms."""
    for fn in fns:
        fn()  # warm: first-call allocations, thread pools starting
    times = [[] for _ in fns]
    for _ in range(rounds):
        for t, fn in zip(times, fns):
            start = time.thread_time()  # on one thread all the work is this thread's: CPU time,
            fn()                        # which a busy machine's other processes do not inflate
            t.append((time.thread_time() - start) * 1e3)
    return times


def _layer(cc: str, load, torch):
    """``(numpy, torch or None, packed or None)``: each a function computing :data:`LAYER`'s
    products in turn, by NumPy's BLAS, the ``torch`` provider (None: not installed) and the
    packed routine (None where it did not compile; ``load``: the kernel cache's, default the
    user cache's)."""
    from dpl.backends.cpu import blas, packed_gemm
    from dpl.backends.cpu.toolchain import KernelCache, vector_math
    from dpl.backends.registry import CompileError
    from dpl.ir.expr import Call, Constant, Var
    from dpl.ir.types import TensorType

    rng = np.random.default_rng(0)
    steps = []
    for k, n in LAYER:
        a, w = rng.standard_normal((ROWS, k), np.float32), rng.standard_normal((k, n), np.float32)
        w.flags.writeable = False  # as a build's constants are
        steps.append((a, w, np.empty((ROWS, n), np.float32)))

    def each(matmul):
        def run():
            for a, w, out in steps:
                matmul(a, w, out)
        return run

    packed = None
    try:
        lib = (load or KernelCache(cc=cc).load)(packed_gemm.source(vector_math(cc)))
    except (CompileError, OSError) as err:  # OSError: no compiler at all
        log.info("the packed product routine did not compile: %s", str(err)[:200])
        lib = None
    if lib is not None:
        routine = packed_gemm.Routine(lib)
        calls = {id(w): packed_gemm.runner(Call("matmul", (Var("a", TensorType(a.shape, "float32")), Constant(w)), {},
                                                 TensorType(out.shape, "float32")), routine, 1) for a, w, out in steps}
        packed = each(lambda a, w, out: calls[id(w)](a, w, out))
    return each(blas.NumpyProducts().matmul), torch and each(torch.matmul), packed


def measure(cc: str = "cc", rounds: int = ROUNDS, load=None) -> Measured:
    """NumPy's, (when installed) torch's and (when it compiles: ``load(source)`` gives its
    library) the packed routine's layer products, and NumPy's and torch's convolution, timed
    here on one thread."""
    from dpl.backends.cpu import blas
    from dpl.backends.cpu.im2col import Conv2d

    keep_mapped()  # as a build runs them: oneDNN's per-call buffers are not faulted in afresh
    rng = np.random.default_rng(0)
    torch = blas.TorchProducts(cc) if importlib.util.find_spec("torch") is not None else None
    numpy_layer, torch_layer, packed_layer = _layer(cc, load, torch)
    xs, ws = CONV
    x, w = rng.standard_normal(xs, np.float32), rng.standard_normal(ws, np.float32)
    y = np.empty((xs[0], ws[0], xs[2], xs[3]), np.float32)
    im2col = Conv2d({"padding": [1, 1, 1, 1]})
    fns = [numpy_layer, lambda: im2col(x, w, y)]
    if torch_layer is not None:
        conv = torch.convolution({"padding": [1, 1, 1, 1]}, np.float32)
        fns += [torch_layer, lambda: conv(x, w, y)]
    if packed_layer is not None:
        fns.append(packed_layer)
    with budget_threads(1):
        rounds_ms = _rounds_ms(fns, rounds)
    numpy_matmul, numpy_conv, *rest = [statistics.median(t) for t in rounds_ms]
    torch_matmul, torch_conv = rest[:2] if torch_layer is not None else (None, None)
    return Measured(numpy_matmul, numpy_conv, torch_matmul, torch_conv, rest[-1] if packed_layer is not None else None,
                    spread=max(spread(t) for t in rounds_ms), rounds=rounds,
                    when=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def choose(cc: str = "cc", load=None, march: str = "native"):
    """The provider ``products="auto"`` takes: torch when installed and measured faster, else
    NumPy's, with float32 products by the packed routine where it measured
    faster (``load(source)``: a C source's library, the CPU backend's kernel cache); measured
    once per machine (cached on disk), its ``why`` saying what was measured."""
    from dpl.backends.cpu import blas

    measured = _measured(cc, load, march)
    if measured.torch_matmuls or measured.torch_convolutions:
        provider = blas.TorchProducts(cc, why=measured.why(), matmuls=measured.torch_matmuls,
                                      convolutions=measured.torch_convolutions)
    else:
        provider = blas.NumpyProducts()
        provider.why = measured.why()
    provider.packs = measured.packs
    return provider


def _measured(cc: str, load=None, march: str = "native") -> Measured:
    from dpl.backends.cpu.toolchain import compiler_version, cpu_identity

    compiler = compiler_version(cc)
    key = _key(cpu_identity(), compiler, march)
    with _lock:
        found = _chosen.get(key)
        if found is not None:
            return found
        path = private_dir(store_dir("products"), "products") / f"{key}.json"
        found = read_stored(path)  # None: absent, or not ours to trust: measured again
        if found is not None and not found.noisy:
            _chosen[key] = found
            return found
        log.info("measuring the products' libraries for products='auto' (once per machine)")
        found = attrs.evolve(measure(cc, load=load), machine=_machine(compiler, march))
        if found.noisy:
            log.warning("the products choice's measurement spread %.0f%% (more than %.0f%%: the machine is busy): "
                        "used by this process only, not kept; the next process measures again",
                        100 * found.spread, 100 * NOISY)
        else:
            try:
                data = attrs.asdict(found, filter=lambda a, _: a.name != "where")
                write_private_file(path, json.dumps(data).encode())
                found = attrs.evolve(found, where=str(path))
            except OSError as err:
                log.warning("could not keep the products choice in %s: %s", path, err)
        _chosen[key] = found
        return found


def products(name: str, cc: str = "cc", load=None, march: str = "native"):
    """The provider called ``name``: ``"auto"`` (the fastest here, measured once and cached:
    :func:`dpl.backends.cpu.products_choice.choose`), ``"numpy"``, ``"torch"`` or ``"dpl"``
    (NumPy's, with the float32 products :mod:`dpl.backends.cpu.packed_gemm` takes by it).
    ``load(source)``: a C source's compiled library (the CPU backend's kernel cache, built for
    ``-march=march``), for measuring the packed routine."""
    from dpl.backends.cpu import blas

    if name in ("numpy", "dpl"):
        provider = blas.NumpyProducts()
        if name == "dpl":
            provider.packs, provider.why = True, "products='dpl' asked for"
        return provider
    if name == "torch":
        return blas.TorchProducts(cc)
    if name == "auto":
        return choose(cc, load, march)
    raise blas.BackendError(f"unknown products library {name!r}", hint="products='auto' (default), 'numpy', 'torch' or 'dpl'")
