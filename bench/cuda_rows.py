"""The row kernels' achieved bandwidth on a CUDA device, against a device-to-device copy.

    python bench/cuda_rows.py [ROWS] [COLS]      # default 8192 x 4096

Softmax, RMSNorm, LayerNorm and add+RMSNorm at float32 and float16, each one CUDA kernel of the
CuPy backend (``CupyBackend.kernel``: a block per row, the input rows staged in shared memory
by 16-byte vectors, 16-byte stores; ``backends/cuda/rows.py``), launched on CuPy arrays and
timed with CUDA events (the kernel alone: no host copies, no graph). Bytes moved are what the
kernel must read and write (its inputs once, its outputs once); the ceiling is ``cupy.copyto``
of a buffer as large as the kernel's traffic, timed the same way. ``bench/bench_cuda.py`` prints
these rows too, and ``tests/test_gpu.py`` asserts each reaches ``FLOOR`` of the copy.
Without a CUDA device the script says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys

import attrs
import numpy as np

import dpl

FLOOR = 0.8  # of the copy bandwidth (issue 21's acceptance)

ROWS = """
func softmax(x: {t}[{n}, {d}]) -> {t}[{n}, {d}] {{
  y = nn.softmax(x)
  return y
}}
func rms_norm(x: {t}[{n}, {d}], w: {t}[{d}]) -> {t}[{n}, {d}] {{
  y = nn.rms_norm(x, w)
  return y
}}
func layer_norm(x: {t}[{n}, {d}], w: {t}[{d}], b: {t}[{d}]) -> {t}[{n}, {d}] {{
  y = nn.layer_norm(x, w, b)
  return y
}}
func add_rms_norm(x: {t}[{n}, {d}], r: {t}[{n}, {d}], w: {t}[{d}]) -> ({t}[{n}, {d}], {t}[{n}, {d}]) {{
  s = add(x, r)
  y = nn.rms_norm(s, w)
  return (s, y)
}}
"""


def row_groups(t: str = "f32", n: int = 8192, d: int = 4096) -> dict:
    """name -> the row kernel's function (one op each, marked a group of its own)."""
    mod = dpl.parse(ROWS.format(t=t, n=n, d=d))
    return {name: attrs.evolve(fn, attrs={"Primitive": True}) for name, fn in mod.functions.items()}


def event_ms(cp, fn, repeat: int = 20, rounds: int = 5) -> float:
    """Best over ``rounds`` of the mean time of ``repeat`` back-to-back calls, by CUDA events."""
    fn()
    cp.cuda.Device().synchronize()
    best = float("inf")
    for _ in range(rounds):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(repeat):
            fn()
        end.record()
        end.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, end) / repeat)
    return best


def copy_gbs(cp, nbytes: int) -> float:
    """GB/s of ``cupy.copyto`` moving ``nbytes`` (half read, half written)."""
    src = cp.ones(max(1, nbytes // 8), cp.float32)
    dst = cp.empty_like(src)
    return 2 * src.nbytes / event_ms(cp, lambda: cp.copyto(dst, src)) / 1e6


def measure(cp, backend, fn, small=None, seed: int = 0) -> dict:
    """One row kernel on the device: its first rows checked against the interpreter running
    ``small`` (the same kernel at 8 rows), then timed; returns ms, bytes moved, GB/s and the
    copy's GB/s at the same traffic."""
    kernel = backend.kernel(fn)
    rng = np.random.default_rng(seed)
    host = [rng.standard_normal(tuple(p.ty.shape)).astype(dpl.dtypes.to_numpy(p.ty.dtype)) for p in fn.params]
    args = [cp.asarray(a) for a in host]
    rets = fn.ret.ty.fields if hasattr(fn.ret.ty, "fields") else [fn.ret.ty]
    outs = [cp.empty(tuple(r.shape), dpl.dtypes.to_numpy(r.dtype)) for r in rets]
    kernel(args, outs)
    if small is not None:
        want = dpl.interpret(small, *[a[:8] if a.ndim == 2 else a for a in host])
        for w, o in zip(want if isinstance(want, tuple) else (want,), outs):
            np.testing.assert_allclose(cp.asnumpy(o[:8]).astype(np.float64), w.astype(np.float64), rtol=2e-2, atol=2e-2,
                                       err_msg=f"{fn.name}: the device differs from the interpreter")
    moved = sum(a.nbytes for a in args) + sum(o.nbytes for o in outs)
    ms = event_ms(cp, lambda: kernel(args, outs))
    gbs = moved / ms / 1e6
    return {"ms": ms, "bytes": moved, "GB/s": gbs, "copy GB/s": copy_gbs(cp, moved)}


def device_cupy(script: str):
    """CuPy with a CUDA device, or None after saying on stderr why there is none."""
    try:
        import cupy as cp

        if cp.cuda.runtime.getDeviceCount() == 0:
            raise RuntimeError("no CUDA device")
    except Exception as err:  # noqa: BLE001 (no CuPy, no driver)
        print(f"{script}: no CUDA device ({type(err).__name__}: {err}); this benchmark needs a GPU", file=sys.stderr)
        return None
    return cp


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="?", type=int, default=8192, help="rows (default 8192)")
    parser.add_argument("d", nargs="?", type=int, default=4096, help="row length (default 4096)")
    opts = parser.parse_args(argv)
    n, d = opts.n, opts.d
    cp = device_cupy("cuda_rows")
    if cp is None:
        return 2
    from dpl.backends.cuda.backend import CupyBackend

    backend = CupyBackend(cupy=cp)
    print(report(cp, backend, n, d))
    return 0


def rows(cp, backend, n: int = 8192, d: int = 4096):
    """(dtype, kernel, measure()) for every row kernel at f32 and f16."""
    for t in ("f32", "f16"):
        small = row_groups(t, 8, d)
        for name, fn in row_groups(t, n, d).items():
            yield t, name, measure(cp, backend, fn, small[name])


def report(cp, backend, n: int = 8192, d: int = 4096) -> str:
    lines = [f"row kernels at {n} x {d}, one kernel each, CUDA events (the kernel alone)",
             f"{'kernel':<22} {'ms':>8} {'MB moved':>9} {'GB/s':>7} {'copy GB/s':>10} {'of copy':>8}"]
    for t, name, m in rows(cp, backend, n, d):
        share = m["GB/s"] / m["copy GB/s"]
        lines.append(f"{t + ' ' + name:<22} {m['ms']:>8.3f} {m['bytes'] / 1e6:>9.0f} {m['GB/s']:>7.0f} {m['copy GB/s']:>10.0f} "
                     f"{100 * share:>7.0f}%{'' if share >= FLOOR else '  < ' + str(int(100 * FLOOR)) + '%'}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
