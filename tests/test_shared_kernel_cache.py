"""One kernel cache folder shared by many processes at once (an NFS home that several machines
use): four processes building the same module into one new folder all succeed with the same
numbers, each kernel is compiled once, and the folder verifies afterwards (every entry's
library hashes to its manifest, no build or temporary file left). A lock that is never had (a
hung lock server) delays a build by ``LOCK_TIMEOUT``, never stops it."""

from __future__ import annotations

import logging
import multiprocessing
import shutil

import numpy as np
import pytest
from filelock import FileLock

import needs

from dpl.runtime import disk_cache
from dpl.runtime.disk_cache import LOCKS, LibraryCache

MODULE = """\
func main(x: f32[16, 32], w: f32[32, 16]) -> f32[16, 16] {
  y = matmul(x, w)
  z = nn.silu(y)
  a = exp(x)
  b = tanh(a)
  c = sum(b, axis=[1])
  return z
}
"""
PROCESSES = 4


@pytest.fixture(autouse=True)
def c_compiler():
    needs.c_compiler()


def build_and_run(directory: str, barrier) -> tuple[bytes, dict, int]:
    """In a fresh (spawned) process: build MODULE into the cache ``directory`` once every process
    is ready, run it; its output, what ran it, and how many compiles this process ran."""
    import dpl
    from dpl.backends.cpu.backend import CpuBackend

    mod = dpl.fuse_ops(dpl.parse(MODULE))
    backend = CpuBackend(cache_dir=directory, products="numpy")
    barrier.wait(timeout=120)
    exe = dpl.build(mod, [backend, "numpy"], progress=None)
    rng = np.random.default_rng(0)
    out = exe(rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal((32, 16)).astype(np.float32))
    return out.tobytes(), exe.ran_on(), backend.cache.compiles


def test_processes_building_into_one_folder_at_once(tmp_path):
    directory = tmp_path / "shared"
    ctx = multiprocessing.get_context("spawn")  # fresh processes, as separate machines would be
    with ctx.Manager() as manager:
        barrier = manager.Barrier(PROCESSES)
        with ctx.Pool(PROCESSES) as pool:
            results = pool.starmap(build_and_run, [(str(directory), barrier)] * PROCESSES, chunksize=1)
    outputs, ran_on, compiles = zip(*results)
    assert len(set(outputs)) == 1  # the same numbers everywhere
    assert all(r == ran_on[0] for r in ran_on) and set(ran_on[0].values()) == {"cpu"}
    store = LibraryCache(directory)
    entries = store.entries()
    assert entries and sum(compiles) == len(entries)  # each kernel compiled by one process, loaded by the others
    assert all(store.read(e.key) is not None for e in entries)  # every library is what its manifest says
    left = sorted(p.name for p in directory.iterdir() if p.name not in (LOCKS, "CACHEDIR.TAG")
                  and not p.name.endswith((".so", ".json")))
    assert left == []  # no build folder, no temporary file


def test_a_lock_never_had_delays_a_build_and_never_stops_it(tmp_path, monkeypatch, caplog):
    from dpl.backends.cpu.backend import CpuBackend

    backend = CpuBackend(cache_dir=tmp_path / "compiled")
    import dpl

    mod = dpl.parse("func main(x: f32[8]) -> f32[8] {\n  y = exp(x)\n  return y\n}")
    kernel = backend.compile(mod["main"], module=mod)
    library = backend.cache.directory / f"{backend.cache.key(kernel.source)}.so"
    monkeypatch.setattr(disk_cache, "LOCK_TIMEOUT", 0.2)
    store = LibraryCache(tmp_path / "store")
    key = "ab" + "0" * 62
    with FileLock(store.directory / LOCKS / "ab.lock"):  # held elsewhere, forever
        with caplog.at_level(logging.WARNING, logger="dpl.runtime.disk_cache"):
            lib = store.load(key, lambda out: shutil.copy(library, out), "dpl_kernel")
    assert lib is not None and store.read(key) is not None
    assert "building without it" in caplog.text
