"""The CPU twin of the CUDA kernels: the very text ``cuda.emitter`` writes, built for the host
by the system C++ compiler and run block by block, each block's threads as an OpenMP team.

A small prelude stands in for CUDA: ``threadIdx``/``blockIdx`` are thread-local, ``blockDim``
and ``gridDim`` are set per launch, ``__shared__`` arrays are statics (blocks run one at a time,
so a block's threads share them as on a GPU), ``__syncthreads()`` is an OpenMP barrier and a
warp shuffle is an exchange through a shared slot between two barriers. So a
twin run checks, without a GPU, what a GPU run depends on: the arithmetic (the same statement
emitter), the mapping of loops onto blocks and threads (grid-stride bounds, flat-index
decomposition, strided row loops) and the block reductions with their barriers.

Several kernels build into one library (one compiler run for a whole corpus); each gets a host
launcher ``dpl_launch_<symbol>(args, grid)`` taking its arguments as CUDA's launch API does.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

import numpy as np

from dpl.backends.cuda.emitter import CUDA_PRELUDE, CudaSource, launch_arguments, launch_config
from dpl.backends.registry import CompileError
from dpl.cache_dir import store_dir
from dpl.runtime.disk_cache import CacheError, LibraryCache

HOST_PRELUDE = """\
/* CUDA stand-ins for the host twin of dpl's CUDA kernels */
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <omp.h>
#define DPL_BLOCK {block}
#define __global__
#define __device__
#define __forceinline__
#define __launch_bounds__(n)
#define __shared__ static
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
struct uint4 {{ unsigned x, y, z, w; }};
static inline void __stcg(uint4 *p, uint4 v) {{ *p = v; }}
#define DPL_INLINE inline
#define __syncthreads() _Pragma("omp barrier")
struct dpl_dim3 {{ unsigned x, y, z; }};
static thread_local dpl_dim3 threadIdx, blockIdx;
static dpl_dim3 blockDim, gridDim;
static inline float dpl_float_of_bits(uint32_t u) {{ float f; memcpy(&f, &u, 4); return f; }}
static inline uint32_t dpl_bits_of_float(float f) {{ uint32_t u; memcpy(&u, &f, 4); return u; }}
/* __shfl_down_sync over a whole block's warps, as every thread of the block calls it at once */
template <typename T> static inline T dpl_shfl_down(T v, unsigned o) {{
  static T slots[DPL_BLOCK];
  slots[threadIdx.x] = v;
  __syncthreads();
  const T r = threadIdx.x % 32 + o < 32 ? slots[threadIdx.x + o] : v;
  __syncthreads();
  return r;
}}
"""

FLAGS = ["-std=c++17", "-O0", "-fPIC", "-shared", "-fopenmp"]  # semantics, not speed: -O0 builds a corpus 2.5x faster


_SIGNATURE = re.compile(r'extern "C" __global__ void __launch_bounds__\(DPL_BLOCK\) (\w+)\(([^)]*)\) \{')


def signature(code: str, name: str) -> list[tuple[str, bool]]:
    """(C type, is a pointer) of each parameter of kernel ``name`` in ``code``."""
    for m in _SIGNATURE.finditer(code):
        if m.group(1) == name:
            params = [p.strip() for p in m.group(2).split(",") if p.strip()]
            return [(p.rsplit(" ", 1)[0].replace("__restrict__", "").strip(), "*" in p) for p in params]
    raise CompileError(f"host twin: no kernel '{name}' in the source")


def launcher(name: str, code: str) -> str:
    """``int dpl_launch_<name>(void **args, unsigned grid)``: ``args[i]`` points at the i-th
    argument's value (CUDA's kernelParams convention); runs the grid's blocks in turn, each as an
    OpenMP team of DPL_BLOCK threads; returns 0 when a team is short of threads."""
    args = ", ".join(f"*({ctype} *)args[{i}]" for i, (ctype, _) in enumerate(signature(code, name)))
    return f"""
extern "C" int dpl_launch_{name}(void **args, unsigned grid) {{
  gridDim = dpl_dim3{{grid, 1, 1}};
  blockDim = dpl_dim3{{DPL_BLOCK, 1, 1}};
  int ok = 1;
  for (unsigned b = 0; b < grid && ok; ++b) {{
    #pragma omp parallel num_threads(DPL_BLOCK)
    {{
      if (omp_get_num_threads() != DPL_BLOCK) {{
        #pragma omp atomic write
        ok = 0;
      }} else {{
        blockIdx = dpl_dim3{{b, 0, 0}};
        threadIdx = dpl_dim3{{(unsigned)omp_get_thread_num(), 0, 0}};
        {name}({args});
      }}
    }}
  }}
  return ok;
}}
"""


def host_source(kernels: Sequence[tuple[str, str]], helpers: str, block: int) -> str:
    """One C++ translation unit: the host prelude, the shared ``helpers`` once, then each
    ``(name, function text)`` with its launcher (names must differ)."""
    names = [name for name, _ in kernels]
    if len(set(names)) != len(names):
        raise CompileError("host twin: kernels built together need distinct symbols")
    if block < 1 or block & (block - 1):
        raise CompileError(f"host twin: threads per block must be a power of two, got {block}")
    parts = [HOST_PRELUDE.format(block=block), helpers]
    for name, function in kernels:
        parts += [function, launcher(name, function)]
    return "\n".join(parts)


class HostTwin:
    """CUDA kernels built for the host, ``block`` threads per block (a small power of two keeps a
    block's team cheap on a few cores while the reductions still take several levels)."""

    def __init__(self, sources: Sequence[CudaSource], block: int = 8, cxx: str | None = None,
                 directory: str | os.PathLike | None = None):
        self.sources = {s.name: s for s in sources}
        helpers = sources[0].helpers if sources else ""
        self._build(host_source([(s.name, s.function) for s in sources], helpers, block), block, cxx, directory)

    @classmethod
    def from_code(cls, name: str, code: str, block: int = 8, cxx: str | None = None) -> "HostTwin":
        """The twin of one whole CUDA source as ``cuda.emitter`` writes it (its CUDA prelude is
        swapped for the host one), for launches by argument list (see :meth:`launch`)."""
        if not code.startswith(CUDA_PRELUDE):
            raise CompileError("host twin: not a source written by dpl's CUDA emitter")
        twin = cls.__new__(cls)
        twin.sources = {}
        body = code[len(CUDA_PRELUDE):]
        twin._build(host_source([], "", block) + body + launcher(name, body), block, cxx, None)
        return twin

    def _build(self, text: str, block: int, cxx: str | None, directory) -> None:
        self.block = block
        self.cxx = cxx or os.environ.get("CXX") or "c++"
        if shutil.which(self.cxx) is None:
            raise CompileError(f"host twin: no C++ compiler ('{self.cxx}')")
        from dpl.backends.cpu.backend import compiler_version

        key = hashlib.sha256("\0".join([text, self.cxx, compiler_version(self.cxx), *FLAGS]).encode()).hexdigest()

        def compile_to(out: Path) -> None:
            src = out.with_name("twin.cpp")
            src.write_text(text)
            r = subprocess.run([self.cxx, *FLAGS, str(src), "-o", str(out)], capture_output=True, text=True)
            if r.returncode != 0:
                raise CompileError(f"host twin: the C++ compiler failed:\n{r.stderr.strip()[:4000]}")

        # the verified disk cache of dpl.runtime.disk_cache (a shared /tmp folder would let
        # anyone plant a library here)
        store = LibraryCache(directory if directory is not None else store_dir("cuda-twin"))
        try:
            self.lib = store.load(key, compile_to)
        except CacheError as err:
            raise CompileError(f"host twin: {err.message}") from None

    def launch(self, name: str, grid: int, args: Sequence) -> None:
        """Launch kernel ``name`` on ``grid`` blocks with CUDA-style arguments: arrays (their data
        pointers, C-contiguous) and integers (``int64_t`` dims), in the kernel's order."""
        values = [ctypes.c_void_p(a.ctypes.data) if isinstance(a, np.ndarray) else ctypes.c_int64(int(a)) for a in args]
        pointers = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
        entry = getattr(self.lib, f"dpl_launch_{name}")
        entry.restype = ctypes.c_int
        entry.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        if not entry(pointers, grid):
            raise CompileError(f"host twin: OpenMP gave fewer than {self.block} threads for a block")

    def run(self, name: str, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray], grid: int | None = None) -> int:
        """Run kernel ``name`` on host arrays (outputs written in place) with ``grid`` blocks (by
        default the launch configuration the CUDA backend would use); returns the grid used."""
        source = self.sources[name]
        targets = [o if o.flags.c_contiguous else np.empty_like(o, order="C") for o in outputs]
        arrays, dims = launch_arguments(source, [np.require(a, requirements="C") for a in inputs], targets)
        if grid is None:
            grid, _ = launch_config(source, dict(zip(source.dims, dims)), block=self.block)
        self.launch(name, grid, [*(np.require(a, requirements="C") for a in arrays), *dims])
        for o, t in zip(outputs, targets):
            if o is not t:
                np.copyto(o, t)
        return grid
