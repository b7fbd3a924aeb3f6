"""What a call through torch.compile(backend="dpl") costs beyond its kernels (issue 31: at most
20 us of dpl's Python per compiled partition, so that a decode step is not dominated by it).

    python bench/bench_dispatch.py [--rounds 15] [--calls 2000] [--clock cpu] [--products dpl]

A model small enough that its kernels take a few microseconds (one 16x16 linear layer and a
GELU, batch 1, one thread), timed in one process, interleaved rounds, medians of the per-call
mean of each round:

- eager: the model in torch;
- dpl.compile: the compiled model called with a torch tensor, as a user calls it;
- DplCall: the partition's call module on the tensors the compiled graph hands it (weight
  checks, tensor <-> array views, the Executable);
- Executable: the partition's Executable called on a NumPy array (dpl's runtime and kernels);
- kernels: the partition's leaf calls alone, replayed in a loop on the arguments one call gave
  them (each generated C kernel's entry through ctypes, each torch product), recorded by
  wrapping those entries for one call of the general path (a prepared call runs the same entries
  on the same arguments from C); a leaf it does not record counts as dispatch.

``--products`` picks who computes the product (default ``dpl``, the packed routine: ``auto``
chooses by a measurement that flips between it and torch on a loaded host, and a torch product
is not a C call, so its plan runs the general path).

Then the split the acceptance reads: (a) kernels; (b) dpl's Python dispatch = DplCall - kernels
(of which the runtime, Executable - kernels, and the DplCall around it); (c) torch's part =
dpl.compile - DplCall (dynamo's guards and frame wrappers, AOTAutograd's runtime wrapper, the
graph module's call). ``--clock cpu`` times this thread's CPU time, which other processes on a
loaded host disturb far less than the wall clock.

Measured, second round (27 Nov, the same host at a load average of 4.7-5; ``--clock cpu
--rounds 9 --calls 1000``, products by the packed routine, this bench run on the tree before
the prepared call (commit 29bba5a) and after it, alternately, two runs each, their mean; us):

    variant        before   after
    eager            24.1    19.6
    dpl.compile     112.7    60.5
    DplCall          57.5    15.4
    Executable       40.7     8.2
    (a) kernels       2.8     2.7   (3 leaf calls: the product, the bias add, the GELU)
    (b) dispatch     54.7    12.6   (runtime 37.8 -> 5.5, DplCall around it 16.8 -> 7.1)
    (c) torch        55.2    45.1

The goal of 20 us is met: a plan whose steps are all C calls runs as one prepared call
(dpl/runtime/prepared.py): each step's C calls said once per arena, their arguments entries of
a table of addresses, run by one ctypes call into a C routine (backends/cpu/call_list.py); a
call writes its input's and output's addresses into the table and takes its output from the
pool. What is left of the 12.6: the Executable and the plan around the prepared call (the
latest plan's check, the arena, the output pool, the table) 5.5 less the kernels' own ctypes
cost that the replay counts; the DplCall around it 7.1 (the weights' checks, a NumPy view of the
input, a tensor over the output, and the torch objects made and freed per call). Not prepared,
so still the general path: products by torch or NumPy (``--products auto`` chose torch on this
host in one run, its measurement of the two within 10%: dispatch 34.7 us there), convolutions,
a raced attention, outputs that are copied (an input or a value returned twice), ``out=``.

First round (27 Nov, this 2-core host under a load average of 4-5 from other jobs, so ``--clock
cpu --rounds 9 --calls 1000``; the tree before the fast paths (commit 0a1f0c7) and after, run
alternately, two runs each, their mean; us):

    variant        before   after
    eager            28.3    29.1
    dpl.compile     157.7   140.5
    DplCall          96.3    73.1
    Executable       72.6    52.1
    (a) kernels       2.5     3.2   (3 leaf calls: the product, the bias add, the GELU)
    (b) dispatch     93.7    70.0   (runtime 70.0 -> 48.9, DplCall around it 23.7 -> 21.0)
    (c) torch        61.4    67.4

On the wall clock the same host gave dispatch 194.7 -> 95.2 us (eager 67.7 and 40.9: the load
moved between the runs; per eager call, 2.9 -> 2.3). What got it from 93.7 down: the Executable reuses the latest call's
plan at equal shapes and dtypes (Executable._last_plan), a call enters no thread-budget context
where it would change nothing (threads.budget_binds), kernels read an array's address in 0.45 us
instead of NumPy's 1.7 (backends/cpu/addresses.py) and their constants' once, the segment runner
binds each input signature's dims and value shapes once, DplCall skips nn.Module's call machinery
and the detach of a tensor that does not require grad. Torch's part, timed apart
(compiled / the callable AOTAutograd returned / the graph module): dynamo's guards and frame
wrappers 28-40 us, AOTAutograd's runtime wrapper 8-9 us, the graph module's own call about 4.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: this thread's CPU time, which other processes on a loaded host disturb less")
    parser.add_argument("--products", choices=("dpl", "auto", "torch", "numpy"), default="dpl",
                        help="who computes the linear layer's product (CpuBackend(products=...)); dpl: the packed routine, "
                             "whose call is C (auto chooses between it and torch by a measurement that flips on a loaded host)")
    args = parser.parse_args(argv)

    import torch

    import dpl
    from dpl.backends.cpu.backend import CpuBackend

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()).eval()
    x = torch.randn(1, 16)
    compiled = dpl.compile(model, threads=1, target=CpuBackend(products=args.products))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
        call = next(iter(_dpl_calls()), None)
        if call is None:
            raise SystemExit("no dpl partition was built: nothing to time")
        call_args = _arguments_of(call, lambda: compiled(x))
        exe, xa = call.exe, x.numpy()
        plan = exe.plan(xa)
        # the leaves as the general path calls them (a timer sends a call there): a prepared call
        # runs the same C entries on the same arguments from C (dpl/runtime/prepared.py)
        leaves, kept = _record_leaves(lambda: plan.run([xa], None, timer=lambda step, run: run()))
        if not leaves:
            raise SystemExit("no kernel call was recorded: nothing to split")

        def replay():
            for fn, a, kw in leaves:
                fn(*a, **kw)

        clock = time.perf_counter if args.clock == "wall" else time.thread_time

        def timed(fn) -> float:
            start = clock()
            for _ in range(args.calls):
                fn()
            return (clock() - start) / args.calls * 1e6

        variants = {"eager": lambda: model(x), "dpl.compile": lambda: compiled(x), "DplCall": lambda: call(*call_args),
                    "Executable": lambda: exe(xa), "kernels": replay}
        for fn in variants.values():  # warm
            timed(fn)
        samples = {name: [] for name in variants}
        for r in range(args.rounds):
            order = list(variants.items()) if r % 2 == 0 else list(reversed(variants.items()))
            for name, fn in order:
                samples[name].append(timed(fn))
        del kept
    med = {name: statistics.median(s) for name, s in samples.items()}
    print(f"per call, us of {args.clock} time (median of {args.rounds} interleaved rounds of {args.calls} calls, "
          f"one thread; {len(leaves)} kernel calls; products: {args.products}; "
          f"prepared call: {'yes' if getattr(plan, '_prepared', None) else 'no'})")
    print(f"{'variant':<14} {'us':>8} {'/ eager':>8}")
    for name, us in med.items():
        print(f"{name:<14} {us:8.2f} {us / med['eager']:8.2f}")
    kernels = med["kernels"]
    print("split of a dpl.compile call:")
    print(f"  (a) kernels            {kernels:8.2f}")
    print(f"  (b) dpl's dispatch     {med['DplCall'] - kernels:8.2f}   (DplCall - kernels; goal <= 20)")
    print(f"      runtime            {med['Executable'] - kernels:8.2f}   (Executable - kernels)")
    print(f"      DplCall around it  {med['DplCall'] - med['Executable']:8.2f}   (DplCall - Executable)")
    print(f"  (c) torch's part       {med['dpl.compile'] - med['DplCall']:8.2f}   (dpl.compile - DplCall)")
    return 0


def _dpl_calls():
    """The DplCall modules of the graphs dynamo compiled (one model here)."""
    from dpl.frontend.dynamo_call import DplCall

    return [o for o in gc.get_objects() if type(o) is DplCall]  # type(): a dead weak proxy raises on isinstance


def _arguments_of(call, run) -> tuple:
    """The arguments the compiled graph gives ``call`` when ``run`` runs it."""
    seen = []
    forward = call.forward
    call.forward = lambda *given: seen.append(given) or forward(*given)
    try:
        run()
    finally:
        del call.forward
    return seen[-1]


def _record_leaves(run):
    """The leaf calls one ``run()`` makes, as ``(function, args, kwargs)``: every loaded C
    kernel's entry, the packed product routine's entries and every torch product of the CPU
    backend (found among live objects, wrapped for the one call, then restored); and what
    ``run`` returned, which keeps the memory the recorded pointers address alive while they are
    replayed."""
    from dpl.backends.cpu.backend import _Library
    from dpl.backends.cpu.blas import TorchProducts
    from dpl.backends.cpu.packed_gemm import Routine

    leaves = []

    def recording(fn):
        def record(*a, **kw):
            leaves.append((fn, a, kw))
            return fn(*a, **kw)
        return record

    libraries = [o for o in gc.get_objects() if type(o) is _Library]
    products = [o for o in gc.get_objects() if type(o) is TorchProducts]
    routines = [(o, o._ready) for o in gc.get_objects() if type(o) is Routine and o._ready is not None]
    saved = [(lib, lib.resolve()) for lib in libraries]
    for lib, (entry, *rest) in saved:
        lib._resolved = (recording(entry), *rest)
    for routine, (kernel, batched, pack, width, glu) in routines:
        routine._ready = (recording(kernel), recording(batched), pack, width, recording(glu))
    for p in products:
        p._torch = _Recording(p.torch, {"matmul": recording(p.torch.matmul)})
    try:
        kept = run()
    finally:
        for lib, resolved in saved:
            lib._resolved = resolved
        for p in products:
            p._torch = p.torch.module
        for routine, ready in routines:
            routine._ready = ready
    return leaves, kept


class _Recording:
    """A module whose named functions are replaced by recording ones."""

    def __init__(self, module, replaced: dict):
        self.module, self._replaced = module, replaced

    def __getattr__(self, name):
        return self._replaced.get(name) or getattr(self.module, name)


if __name__ == "__main__":
    raise SystemExit(main())
