"""The commands that show what fusion did: ``dpl report``, ``dpl viz``, ``dpl explain`` and
``dpl demo``. Each ``add_*_command(sub)`` registers one subcommand on ``dpl``'s parser."""

from __future__ import annotations

import argparse

from dpl.cli_common import add_patterns_option as _patterns_option
from dpl.cli_common import dim_arg, load_module
from dpl.errors import DplError


def _module_parser(sub, name: str, help: str, *, runtime: bool = True) -> argparse.ArgumentParser:
    """The subcommand ``name`` over one model file and the rules given with -p; with ``runtime``,
    the options that say which target's runtime decisions to show."""
    p = sub.add_parser(name, help=help)
    p.add_argument("file")
    _patterns_option(p)
    if runtime:
        _runtime_options(p)
    return p


def _dims_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dim", action="append", default=[], type=dim_arg, metavar="NAME=SIZE",
                   help="size of a symbolic dimension for the runtime decisions (default 8)")


def _runtime_options(p: argparse.ArgumentParser) -> None:
    _dims_option(p)
    p.add_argument("--target", default="cpu", help="the build target whose backends and heuristics decide (default cpu)")
    p.add_argument("--profile", metavar="FILE", help="a profile written by `dpl profile`, for the heuristics' stage two")


def _config(args):
    from dpl.runtime.config import FusionConfig

    return FusionConfig(profile_path=args.profile) if args.profile else None


def _dims(pairs) -> dict[str, int]:
    return dict(pairs)  # dim_arg checked the syntax as argparse read them


def _applied(args):
    """(module, trace) after dpl.apply of the file with the given patterns."""
    from dpl.apply import apply
    from dpl.trace import Trace

    mod = load_module(args.file)
    trace = Trace()
    apply(mod, args.patterns or (), trace=trace)
    return mod, trace


# -- dpl report ---------------------------------------------------------------------------------
def cmd_report(args) -> int:
    _, trace = _applied(args)
    cov = trace.coverage(target=args.target, config=_config(args), dims=_dims(args.dim))
    print(cov.json() if args.json else cov.table())
    return 0


def add_report_command(sub) -> None:
    p = _module_parser(sub, "report", "after rewrite + fusion: the share of ops in composites, in automatic groups and alone "
                                      "(with reasons), and what the runtime heuristics decide per group")
    p.add_argument("--json", action="store_true", help="print JSON for tools")
    p.set_defaults(func=cmd_report)


# -- dpl viz ------------------------------------------------------------------------------------
def cmd_viz(args) -> int:
    from dpl.viz.draw import draw

    _, trace = _applied(args)
    drawing = draw(None, trace=trace, target=args.target, config=_config(args), dims=_dims(args.dim), title=f"dpl: {args.file}")
    print(f"wrote {drawing.save(args.output)}")
    return 0


def add_viz_command(sub) -> None:
    p = _module_parser(sub, "viz", "draw a module before and after rewrite + fusion, groups coloured by what claimed them "
                                   "(.html: self-contained, click a group for its IR and kernel; .svg: needs Graphviz)")
    p.add_argument("--output", "-o", required=True, metavar="OUT.html|OUT.svg")
    p.set_defaults(func=cmd_viz)


# -- dpl demo -----------------------------------------------------------------------------------
def cmd_demo(args) -> int:
    import os

    import numpy as np

    from dpl.apply import apply, as_pattern_set
    from dpl.cli_common import random_inputs
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
          f" input {main.params[0].ty}, {n_ops} ops written out as user code writes them")
    patterns = as_pattern_set(["rewrites", "llm"])
    trace = Trace()
    fused = apply(mod, patterns, trace=trace)
    print(f"1. rewrites (patterns/rewrites.dpl): {n_ops} ops -> {_count_ops(trace.rewritten)} "
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
    print(f"5. time (best of repeated runs): fused {t_fused:.3f} ms in {steps(fused_exe)} kernel calls; "
          f"op by op {t_unfused:.3f} ms in {steps(unfused_exe)} kernel calls (the same ops after the rewrites, one kernel each); "
          f"speed-up {t_unfused / t_fused:.2f}x")
    # what the runtime did when it planned the run above (compile errors included)
    cov = coverage(fused, trace, patterns, from_executable(fused_exe))
    print()
    print(cov.table())
    out = draw(None, trace=trace, title="dpl demo: a decoder block, before and after fusion", coverage=cov).save(args.output)
    print(f"\nthe picture: {os.path.abspath(out)} (open it in a browser; click a box for its IR and generated C)")
    return 0 if ok else 1


def _ops(n: int) -> str:
    return f"{n} op{'s' if n != 1 else ''}"


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


# -- dpl explain --------------------------------------------------------------------------------
def cmd_explain(args) -> int:
    from dpl.viz.explain import explain_module

    if not args.patterns:
        raise DplError("dpl explain needs the rules to explain", hint="give pattern files or libraries with -p, e.g. -p rewrites -p llm")
    report = explain_module(load_module(args.file), args.patterns, rule=args.rule, at=args.at, top=args.top)
    print(report)
    return 0


def add_explain_command(sub) -> None:
    p = _module_parser(sub, "explain", "for each rule, its closest misses in the module (how much matched, the binding "
                                       "and sub-pattern that failed, the where conjunct and its values) and the rewrites applied",
                       runtime=False)
    p.add_argument("--rule", metavar="NAME", help="only this rule (its full name or the part after the prefix)")
    p.add_argument("--at", metavar="BINDING", help="only tries rooted at this binding (of the module after the rewrites)")
    p.add_argument("--top", type=int, default=3, help="closest misses shown per rule (default 3)")
    p.set_defaults(func=cmd_explain)
