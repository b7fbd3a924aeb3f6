"""``dpl demo``: a shipped decoder block through the whole flow, checked, timed and drawn."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def cmd_demo(args) -> int:
    import os

    import numpy as np

    from dpl.apply import apply, as_pattern_set
    from dpl.cli.common import random_inputs
    from dpl.interpret import interpret
    from dpl.runtime import build
    from dpl.trace import Trace
    from dpl.viz.coverage import coverage, entry_functions
    from dpl.viz.runtime import from_executable
    from dpl.viz.demo import best_time_ms, decoder_block
    from dpl.viz.draw import draw

    mod = decoder_block()
    main = mod["main"]
    n_ops = _count_ops(mod)
    print(f"model: a Llama-style decoder block shipped with dpl (RMSNorm, causal attention, SwiGLU MLP, residuals),"
          f" input {main.params[0].ty}, {_ops(n_ops)} written out as user code writes them")
    patterns = as_pattern_set(["rewrites", "llm"])
    trace = Trace()
    fused = apply(mod, patterns, trace=trace)
    print(f"1. rewrites (patterns/rewrites.dpl): {_ops(n_ops)} -> {_count_ops(trace.rewritten)} "
          f"(spelled-out RMSNorm, softmax and SiLU become nn.rms_norm, nn.softmax, nn.silu)")
    cov = trace.coverage(target="cpu")
    fc = cov[entry_functions(fused)[0]]
    comps = ", ".join(f"{name} ({_ops(count)})" for name, count in fc.by_composite().items())
    print(f"2. composites (patterns/llm.dpl): {comps}")
    autos = sum(g.claim == "automatic" for g in fc.groups)
    print(f"3. automatic fusion (FuseOps): {autos} group{'s' if autos != 1 else ''}, {_ops(fc.in_automatic)}; "
          f"{_ops(len(fc.alone))} alone")
    x = random_inputs(main, args.seed)
    want = interpret(mod, *x)
    fused_exe = build(fused, "cpu")
    unfused_exe = build(trace.rewritten, "cpu")  # the same ops, one kernel each
    got = fused_exe(*x)
    err = float(np.max(np.abs(got - want)))
    ok = np.allclose(got, want, rtol=1e-4, atol=1e-4)
    backends = sorted({s.backend for p in fused_exe.plans.values() for s in p.steps})
    print(f"4. built for cpu (kernels on: {', '.join(backends)}); checked against the interpreter: "
          f"max |difference| {err:.2e} -> {'OK' if ok else 'MISMATCH'}")
    ok_cpu, why_not = fused_exe.target[0].available()
    if not ok_cpu:
        print(f"   note: {why_not}: the cpu target fell back to NumPy, which runs every group by reference, "
              "so the times below compare nothing fused; install a C compiler (cc) to see fused kernels")
    t_fused = best_time_ms(lambda: fused_exe(*x), args.budget)
    t_unfused = best_time_ms(lambda: unfused_exe(*x), args.budget)
    steps = lambda exe: sum(len(p.steps) for p in exe.plans.values())  # noqa: E731
    print(f"5. time (best of repeated runs): fused {t_fused:.3f} ms in {_calls(steps(fused_exe))}; "
          f"op by op {t_unfused:.3f} ms in {_calls(steps(unfused_exe))} (the same ops after the rewrites, one kernel each); "
          f"speed-up {t_unfused / t_fused:.2f}x")
    # what the runtime did when it planned the run above (compile errors included)
    cov = coverage(fused, trace, patterns, from_executable(fused_exe))
    print()
    print(cov.table())
    out = draw(None, trace=trace, title="dpl demo: a decoder block, before and after fusion", coverage=cov).save(args.output)
    log.info("wrote the picture: %s (open it in a browser; click a box for its IR and generated C)", os.path.abspath(out))
    return 0 if ok else 1


def _ops(n: int) -> str:
    return f"{n} op{'s' if n != 1 else ''}"


def _calls(n: int) -> str:
    return f"{n} kernel call{'s' if n != 1 else ''}"


def _count_ops(mod) -> int:
    from dpl.backends.registry import function_ops

    return len(function_ops(mod["main"], mod))


def add_demo_command(sub) -> None:
    p = sub.add_parser("demo", help="take a shipped decoder block through rewrites, composites, automatic fusion and the "
                                    "cpu build; check, time, print the coverage and write demo.html")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", "-o", default="demo.html", help="where to write the picture (default demo.html)")
    p.add_argument("--budget", type=float, default=0.5, help="seconds of timing per variant (default 0.5)")
    p.set_defaults(func=cmd_demo)
