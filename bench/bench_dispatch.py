"""What a call through torch.compile(backend="dpl") costs beyond its kernels (issue 31: at most
20 us of dpl's Python per compiled partition, so that a decode step is not dominated by it).

    python bench/bench_dispatch.py [--rounds 15] [--calls 2000]

A model small enough that its kernels take a few microseconds (one 16x16 linear layer and a
GELU, batch 1, one thread), timed in one process, interleaved rounds, medians of the per-call
mean of each round:

- eager: the model in torch;
- dpl.compile: the compiled model called with a torch tensor, as a user calls it (dynamo's
  guards, the partition's DplCall: weight checks, tensor <-> array views, the Executable);
- Executable: the partition's Executable called on a NumPy array (dpl's runtime and kernels);
- overhead: dpl.compile minus Executable, the part of the call that is neither the kernels
  nor dpl's runtime (dynamo's guards and the DplCall around the Executable).

Measured (stop 30, this 2-core Xeon, quiet, ``--rounds 9 --calls 1000``): eager 17.1 us,
dpl.compile 104.9 us, the Executable alone 49.0 us, so 55.9 us of guards, AOTAutograd's
runtime wrapper and DplCall; the goal of 20 us is not met (a profile puts the largest shares in
torch's compile_wrapper and AOT runtime wrapper, then the plan's run loop and the segments'
product step). Then a plan leaves alone a BLAS none of its steps uses (threadpoolctl's cap and
restore, about 10 us): the same Executable, one process, 15 interleaved rounds of 2000 calls,
67.1 us against 75.5 with the cap (a slower hour of the same host: eager 22.7 us then).
"""

from __future__ import annotations

import argparse
import statistics
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)

    import torch

    import dpl

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()).eval()
    x = torch.randn(1, 16)
    compiled = dpl.compile(model, threads=1)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
        exe = next((c.exe for c in _dpl_calls()), None)
        if exe is None:
            raise SystemExit("no dpl partition was built: nothing to time")
        xa = x.numpy()

        def timed(fn) -> float:
            start = time.perf_counter()
            for _ in range(args.calls):
                fn()
            return (time.perf_counter() - start) / args.calls * 1e6

        variants = {"eager": lambda: model(x), "dpl.compile": lambda: compiled(x), "Executable": lambda: exe(xa)}
        for fn in variants.values():  # warm
            timed(fn)
        samples = {name: [] for name in variants}
        for r in range(args.rounds):
            order = list(variants.items()) if r % 2 == 0 else list(reversed(variants.items()))
            for name, fn in order:
                samples[name].append(timed(fn))
    med = {name: statistics.median(s) for name, s in samples.items()}
    print(f"per call, us (median of {args.rounds} interleaved rounds of {args.calls} calls, one thread)")
    print(f"{'variant':<14} {'us':>8} {'/ eager':>8}")
    for name, us in med.items():
        print(f"{name:<14} {us:8.2f} {us / med['eager']:8.2f}")
    print(f"{'overhead':<14} {med['dpl.compile'] - med['Executable']:8.2f}   (dpl.compile - Executable: guards and DplCall)")
    return 0


def _dpl_calls():
    """The DplCall modules of the graphs dynamo compiled (one model here)."""
    import gc

    from dpl.frontend.dynamo_call import DplCall

    return [o for o in gc.get_objects() if type(o) is DplCall]  # type(): a dead weak proxy raises on isinstance


if __name__ == "__main__":
    raise SystemExit(main())
