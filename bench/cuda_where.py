"""Where the CUDA time goes, for tuning on a device (not a contender table):

    python bench/cuda_where.py

1. Each row kernel of ``cuda_rows.py`` (8192 x 4096, f32 and f16) at 128, 256, 512 and 1024
   threads per block: ms and share of a copy of the same bytes (the block size is
   ``CupyBackend(block=...)``; 256 is the default).
2. The 8-op chain and softmax of ``bench_cpu.py`` at 8192 x 8192: the Executable called on CuPy
   arrays against its kernels alone (CUDA events), and what a 4 TB/s copy of its bytes would take;
   and how the plan ran (one CUDA graph, or step by step and why).
Needs CuPy with a CUDA device.
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

import dpl

sys.path.insert(0, str(Path(__file__).parent))
import cuda_rows  # noqa: E402
from cuda_rows import device_cupy  # noqa: E402
from dpl.backends.cuda.backend import CupyBackend


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    cp = device_cupy("cuda_where")
    if cp is None:
        return 2
    print("== row kernels by block size (GB/s, % of copy)")
    for t in ("f32", "f16"):
        small = cuda_rows.row_groups(t, 8, 4096)
        for name, fn in cuda_rows.row_groups(t, 8192, 4096).items():
            cells = []
            for block in (128, 256, 512, 1024):
                m = cuda_rows.measure(cp, CupyBackend(cupy=cp, block=block), fn, small[name])
                cells.append(f"b{block} {m['ms']:.3f}ms {100 * m['GB/s'] / m['copy GB/s']:.0f}%")
            print(f"{t} {name:<14}", " | ".join(cells), flush=True)

    print("== 8192^2 f32: kernel alone vs Executable on CuPy arrays")
    sys.argv = ["bench_cpu", "8192"]
    import bench_cpu as cpu  # noqa: E402 (reads its size from argv)
    for label, mod, pats in (("8-op chain", cpu.CHAIN, []), ("softmax", cpu.SOFTMAX, ["llm"])):
        fused = dpl.apply(mod, pats)
        backend = CupyBackend(cupy=cp)
        exe = dpl.build(fused, [backend, "numpy"])
        host = cpu.arrays(mod)
        dev = [cp.asarray(a) for a in host]
        got = exe(*dev)
        ms_exe = cuda_rows.event_ms(cp, lambda: exe(*dev), repeat=10, rounds=3)
        t0 = time.perf_counter(); [exe(*dev) for _ in range(10)]; cp.cuda.Device().synchronize(); wall = (time.perf_counter() - t0) * 100
        groups = [f for f in fused.functions.values() if f.attrs.get("Primitive")]
        alone = []
        for g in groups:
            k = backend.kernel(g)
            ins = [cp.asarray(np.random.default_rng(0).standard_normal(tuple(p.ty.shape)).astype(np.float32)) for p in g.params]
            outs = [cp.empty(tuple(g.ret.ty.shape), np.float32)]
            alone.append(round(cuda_rows.event_ms(cp, lambda: k(ins, outs)), 3))
        moved = sum(a.nbytes for a in host) + got.nbytes
        print(f"{label}: exe {ms_exe:.3f} ms (wall {wall:.3f}), kernel alone {alone}, ideal at 4 TB/s {moved / 4e9:.3f} ms")
        print("  ", [l.strip() for l in exe.summary().splitlines() if "device-resident" in l or "group" in l][:3])
    return 0


if __name__ == "__main__":
    sys.exit(main())
