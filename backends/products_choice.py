"""``CpuBackend(products="auto")``: which library computes the matrix products and convolutions
on this machine, by measurement, once per machine and library versions.

The contenders are NumPy's BLAS (OpenBLAS, with im2col for convolutions: the floor, always
there) and torch (MKL's ``matmul``, oneDNN's convolution) when torch is installed. Each computes
a representative product (a short sequence's projection, 128 x 512 @ 512 x 1024) and a
representative convolution (3x3, 64 channels at 56x56), interleaved, the best of a few rounds,
on one thread, in the calling thread's CPU time (what a library can do, not what a busy
machine's scheduler let it do: at two threads on a loaded 2-core host the same product took 3
to 15 times its one-thread time, and even the best of 9 wall-clock rounds on one thread put
either library ahead from run to run). torch takes the products, and separately the
convolutions, where it is at least ``MARGIN`` faster: a tie stays with NumPy, the floor (with
the representative product a near tie, torch's products made the GPT-2 block and the Llama
decoder of bench/bench_models.py 5% and 9% slower, one thread, CPU time). The result is kept in
dpl's cache directory (``~/.cache/dpl/products``, :mod:`dpl.cache_dir`), keyed by the CPU, the
core count and the NumPy and torch versions, so a later build reads a small file and never
measures again; within a process it is read once. torch is imported only to measure, or at the
first product or convolution it won; never when it is absent or lost.

On the 2-core AVX-512 bench host (AMD EPYC, load average 7-12), one thread, CPU ms: products NumPy
1.61 vs torch 1.66-1.75 (NumPy kept), convolution im2col 3.3-3.6 vs torch 2.4-2.6 (torch taken).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import threading
import time

import attrs
import numpy as np

from dpl.cache_dir import private_dir, read_own_file, store_dir, write_private_file
from dpl.runtime.heap import keep_mapped
from dpl.runtime.threads import budget_threads

log = logging.getLogger(__name__)

MATMUL = (128, 512, 1024)  # m, k, n
CONV = ((1, 64, 56, 56), (64, 64, 3, 3))  # NCHW input, OIHW weights; padding 1 (a ResNet stage 1)
ROUNDS = 9
MARGIN = 0.95  # torch's time at most this fraction of NumPy's
VERSION = 5  # of the measurement: a change makes every cached choice stale

_lock = threading.Lock()
_chosen: dict[str, "Measured"] = {}


@attrs.frozen
class Measured:
    """The best times in ms of NumPy's and torch's product and convolution on one thread
    (torch's None: not installed)."""

    numpy_matmul: float
    numpy_conv: float
    torch_matmul: float | None = None
    torch_conv: float | None = None
    where: str = ""  # the cache file, or "" when just measured and not stored

    @property
    def torch_matmuls(self) -> bool:
        return self.torch_matmul is not None and self.torch_matmul <= MARGIN * self.numpy_matmul

    @property
    def torch_convolutions(self) -> bool:
        return self.torch_conv is not None and self.torch_conv <= MARGIN * self.numpy_conv

    def why(self) -> str:
        m, k, n = MATMUL
        (_, c, h, w), _ = CONV
        if self.torch_matmul is None:
            return "auto: torch is not installed, NumPy's BLAS"
        who = lambda won: "torch" if won else "NumPy"  # noqa: E731
        stored = f"; cached in {self.where}" if self.where else ""
        return (f"auto, the faster of each measured here: products by {who(self.torch_matmuls)} ({m}x{k} @ {k}x{n} "
                f"torch {self.torch_matmul:.2f} ms vs NumPy {self.numpy_matmul:.2f}), convolutions by "
                f"{'torch' if self.torch_convolutions else 'im2col'} (3x3 {c}x{h}x{w} torch {self.torch_conv:.2f} ms "
                f"vs im2col {self.numpy_conv:.2f}); one thread, best of {ROUNDS}{stored}")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _key(cpu: str) -> str:
    parts = [str(VERSION), cpu, str(os.cpu_count()), np.__version__, str(_version("torch"))]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def _best_ms(fns, rounds: int) -> list[float]:
    """Each of ``fns`` timed once per round, the rounds interleaved; the best of each, in ms."""
    for fn in fns:
        fn()  # warm: first-call allocations, thread pools starting
    times = [[] for _ in fns]
    for _ in range(rounds):
        for t, fn in zip(times, fns):
            start = time.thread_time()  # on one thread all the work is this thread's: CPU time,
            fn()                        # which a busy machine's other processes do not inflate
            t.append(time.thread_time() - start)
    return [min(t) * 1e3 for t in times]


def measure(cc: str = "cc", rounds: int = ROUNDS) -> Measured:
    """NumPy's and (when installed) torch's product and convolution, timed here on one thread."""
    from dpl.backends import blas
    from dpl.backends.im2col import Conv2d

    keep_mapped()  # as a build runs them: oneDNN's per-call buffers are not faulted in afresh
    rng = np.random.default_rng(0)
    m, k, n = MATMUL
    a, b, out = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32), np.empty((m, n), np.float32)
    xs, ws = CONV
    x, w = rng.standard_normal(xs, np.float32), rng.standard_normal(ws, np.float32)
    y = np.empty((xs[0], ws[0], xs[2], xs[3]), np.float32)
    im2col = Conv2d({"padding": [1, 1, 1, 1]})
    numpy = blas.NumpyProducts()
    fns = [lambda: numpy.matmul(a, b, out), lambda: im2col(x, w, y)]
    if importlib.util.find_spec("torch") is not None:
        torch = blas.TorchProducts(cc)
        conv = torch.convolution({"padding": [1, 1, 1, 1]}, np.float32)
        fns += [lambda: torch.matmul(a, b, out), lambda: conv(x, w, y)]
    with budget_threads(1):
        return Measured(*_best_ms(fns, rounds))


def choose(cc: str = "cc"):
    """The provider ``products="auto"`` takes: torch when installed and measured faster, else
    NumPy's; measured once per machine (cached on disk), its ``why`` saying what was measured."""
    from dpl.backends import blas

    if importlib.util.find_spec("torch") is None:
        provider = blas.NumpyProducts()
        provider.why = "auto: torch is not installed, NumPy's BLAS"
        return provider
    measured = _measured(cc)
    if measured.torch_matmuls or measured.torch_convolutions:
        return blas.TorchProducts(cc, why=measured.why(), matmuls=measured.torch_matmuls,
                                  convolutions=measured.torch_convolutions)
    provider = blas.NumpyProducts()
    provider.why = measured.why()
    return provider


def _measured(cc: str) -> Measured:
    from dpl.backends.cpu_backend import cpu_identity

    key = _key(cpu_identity())
    with _lock:
        found = _chosen.get(key)
        if found is not None:
            return found
        path = private_dir(store_dir("products"), "products") / f"{key}.json"
        try:
            found = Measured(**json.loads(read_own_file(path, limit=4096)), where=str(path))
        except (OSError, ValueError, TypeError):
            found = None  # absent, or not ours to trust: measured again
        if found is None:
            log.info("dpl: measuring NumPy's and torch's products for products='auto' (once per machine)")
            found = measure(cc)
            try:
                data = attrs.asdict(found, filter=lambda a, _: a.name != "where")
                write_private_file(path, json.dumps(data).encode())
                found = attrs.evolve(found, where=str(path))
            except OSError as err:
                log.warning("dpl: could not keep the products choice in %s: %s", path, err)
        _chosen[key] = found
        return found
