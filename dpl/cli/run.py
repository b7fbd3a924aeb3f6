"""``dpl run``: run a module on random inputs; with ``--target`` / ``-p`` the built module
(``dpl.apply`` with the pattern libraries, then ``dpl.build``); ``--check`` compares it with the
interpreter on the unfused module, ``--time`` gives the median of several runs.

What ran is what is reported: every fall-back is a warning on stderr (a target whose first
backend is unavailable is said before any work), the text names the backends that ran, and
``--json`` gives ``ran_on`` per unit and the ``fallbacks``; ``--strict`` makes a fall-back an
error (exit 1).

Deployment: ``--save-package PATH`` writes what was built and run (``dpl.save_package``: the
module, its weights and its compiled CPU kernels, checked by hash); ``dpl run PATH.dplpkg`` loads
one (``dpl.load_package``, no C compiler needed) and runs it like a module. An option of ``run``
rather than a command of its own: a package is saved from an executable that has just run, so
its plans (and kernels) are the ones the run made and checked, and ``--check`` vouches for them."""

from __future__ import annotations

import logging
import statistics
import sys
import time

import numpy as np

from dpl.cli.common import (add_patterns_option, dim_arg, each_warning_once, early_target_check, entry_function, load_module, parse_dims,
                            print_json, random_inputs, target_arg)
from dpl.errors import DplError

log = logging.getLogger(__name__)

# default tolerances of --check by the output's dtype: (rtol, atol); atol is in units of the
# output's largest magnitude (at least 1), since a sum of many terms computed in another order
# is off by about that much times the machine epsilon, even where the result is near zero
PACKAGE_SUFFIX = ".dplpkg"

TOLERANCE = {"float16": (1e-2, 1e-2), "bfloat16": (5e-2, 5e-2), "float32": (1e-4, 1e-4), "float64": (1e-9, 1e-9)}


def add_run_command(sub) -> None:
    p = sub.add_parser("run", help="run a module file, model or compiled package on random inputs; print output shapes, "
                                   "dtypes, checksums",
                       description="Run a module on random inputs (the interpreter by default). With --target or -p, "
                                   "the module is fused (dpl.apply with the -p libraries) and built for the target; "
                                   "--save-package then writes it, kernels and all, to one file. A .dplpkg file (a "
                                   "compiled package) is loaded, its hashes checked, and run with its own kernels: no "
                                   "C compiler is needed.")
    p.add_argument("file", help="a module in the text form, an .onnx model, a compiled package (.dplpkg), or - for stdin")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--entry", default="main", help="the function to run (default main)")
    p.add_argument("--dim", action="append", default=[], type=dim_arg, metavar="NAME=SIZE", help="size of a symbolic dimension (default 8)")
    p.add_argument("--target", metavar="T", help="build for T (numpy, cpu, cuda, a backend name, or several: mylib,cpu); "
                                                "without it the interpreter runs the module (a package: its own target)")
    add_patterns_option(p)
    p.add_argument("--check", action="store_true", help="compare the outputs with the interpreter's on the unfused module; "
                                                       "exit 1 beyond the tolerance")
    p.add_argument("--rtol", type=float, help="relative tolerance of --check (default by dtype: 1e-4 for f32, 1e-2 for f16)")
    p.add_argument("--atol", type=float, help="absolute tolerance of --check, in units of the output's largest magnitude "
                                                      "(default by dtype: 1e-4 for f32, 1e-2 for f16)")
    p.add_argument("--time", action="store_true", help="time the run: the median of --repeat runs after a warm-up")
    p.add_argument("--repeat", type=int, default=10, metavar="N", help="timed runs of --time (default 10)")
    p.add_argument("--strict", action="store_true", help="a fall-back is an error (exit 1): a backend of the target that is "
                                                        "unavailable or fails to compile, a codegen prefix no backend owns")
    p.add_argument("--save-package", metavar="PATH", help="after the run, save the built module to PATH (a .dplpkg: "
                                                          "module, weights and compiled kernels; needs --target)")
    p.add_argument("--json", action="store_true", help="print the result as JSON (keys: file, entry, target, patterns, outputs, "
                                                       "ran_on, fallbacks, check, time, package)")
    p.set_defaults(func=cmd_run)


def _outputs(result) -> list[np.ndarray]:
    if isinstance(result, tuple):
        return [a for r in result for a in _outputs(r)]
    return [np.asarray(result)]


def _describe(outputs) -> list[dict]:
    return [{"shape": list(r.shape), "dtype": str(r.dtype), "checksum": float(np.sum(r.astype(np.float64)))} for r in outputs]


def compare(got: list[np.ndarray], want: list[np.ndarray], rtol: float | None, atol: float | None) -> dict:
    """Max absolute and relative error of ``got`` against ``want`` (the relative one over the
    elements whose |want| passes the absolute bound); ok when every element is within
    ``atol * max(1, max|want|) + rtol * |want|`` (integers and booleans must be equal).
    ``bounds``: per floating output, the bound used, ``abs + rtol * |want|`` with ``abs`` the
    scaled atol."""
    max_abs = max_rel = 0.0
    ok = len(got) == len(want)
    tolerances, bounds = [], []
    for i, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape:
            ok = False
            continue
        if w.dtype.kind not in "fc":
            ok = ok and bool(np.array_equal(g, w))
            continue
        r, a = TOLERANCE.get(str(w.dtype), TOLERANCE["float32"])
        r, a = (r if rtol is None else rtol), (a if atol is None else atol)
        tolerances.append((r, a))
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        same = (g64 == w64) | (np.isnan(g64) & np.isnan(w64))  # equal infinities and NaN for NaN agree
        with np.errstate(invalid="ignore"):
            diff = np.where(same, 0.0, np.abs(g64 - w64))
        diff = np.where(np.isnan(diff), np.inf, diff)
        if diff.size:
            finite = np.where(np.isfinite(w64), np.abs(w64), 0.0)
            scale = max(1.0, float(np.max(finite)))
            bounds.append({"output": i, "abs": a * scale, "rtol": r})
            max_abs = max(max_abs, float(np.max(diff)))
            # relative error where |want| passes the absolute bound: below it (a -0.0 against
            # -8e-38) the absolute bound governs, and a ratio would read as a 100% error
            large = finite > a * scale
            if np.any(large):
                max_rel = max(max_rel, float(np.max(diff[large] / finite[large])))
            ok = ok and bool(np.all(diff <= a * scale + r * finite))
    rtol_used, atol_used = tolerances[0] if tolerances else (rtol or 0.0, atol or 0.0)
    return {"ok": ok, "max_abs_error": max_abs, "max_rel_error": max_rel, "rtol": rtol_used, "atol": atol_used, "bounds": bounds}


def bound_text(check: dict) -> str:
    """The bound the comparison used, e.g. ``|got - want| <= 0.00032 + 0.0001 * |want|``."""
    bounds = check.get("bounds") or []
    texts = [f"|got - want| <= {b['abs']:.3g} + {b['rtol']:g} * |want|" for b in bounds]
    if len(set(texts)) == 1:
        return texts[0]
    if not texts:
        return "exact (no floating-point output)"
    return "; ".join(f"output {b['output']}: {t}" for b, t in zip(bounds, texts))


def _median_ms(run, repeat: int) -> dict:
    run()  # warm up: kernels compile, caches fill
    samples = []
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        run()
        samples.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": statistics.median(samples), "min_ms": min(samples), "runs": len(samples)}


def cmd_run(args) -> int:
    with each_warning_once():
        return _run(args)


def _run(args) -> int:
    from dpl.interpret import interpret

    target = None if args.target is None else target_arg(args.target)
    package = args.file.endswith(PACKAGE_SUFFIX)
    if args.save_package and target is None:
        raise DplError("--save-package needs --target: a package holds the module built for a target",
                       hint=f"dpl run {args.file} --target cpu --save-package {args.save_package}")
    if package and args.patterns:
        raise DplError(f"{args.file} is a compiled package, fused and built already: -p does not apply to it")
    if target is not None:
        early_target_check(target, args.strict)
    elif args.strict and not package:
        log.info("--strict without --target: the interpreter runs, it never falls back")
    if args.repeat < 1:
        raise DplError(f"--repeat takes a positive count, got {args.repeat}")
    exe = None
    if package:  # built already: its module is the fused one, its entry its own
        from dpl.package import load_package

        exe = load_package(args.file, target=target, strict=args.strict)
        mod, fn = exe.module, exe.entry
        if args.entry not in ("main", fn.name):
            raise DplError(f"{args.file} runs its entry '{fn.name}', not '{args.entry}'")
        args.entry = fn.name
    else:
        mod = load_module(args.file)
        fn = entry_function(mod, args.entry, args.file)
    inputs = random_inputs(fn, args.seed, parse_dims(args.dim, fn))
    if exe is not None:
        run = lambda: exe(*inputs)  # noqa: E731
    elif target is None and not args.patterns:
        run = lambda: interpret(mod, *inputs, entry=args.entry)  # noqa: E731
        what = "interpreter"
    else:
        from dpl.apply import apply

        fused = apply(mod, args.patterns)
        if target is None:
            run = lambda: interpret(fused, *inputs, entry=args.entry)  # noqa: E731
            what = "interpreter (fused module)"
        else:
            from dpl.runtime import build

            exe = build(fused, target, entry=args.entry, strict=args.strict)
            run = lambda: exe(*inputs)  # noqa: E731
    outputs = _outputs(run())
    report = {"file": args.file, "entry": args.entry, "target": args.target, "patterns": list(args.patterns),
              "outputs": _describe(outputs), "ran_on": None, "fallbacks": [], "check": None, "time": None, "package": None}
    if exe is not None:  # what ran, which is not always what the target asked for
        log.debug("%s", exe.summary())
        ran = dict.fromkeys(s.backend for plan in exe.plans.values() for s in plan.steps)
        what = f"target {args.target or exe.target_name} (ran on {', '.join(ran) or 'nothing: no kernel'})"
        report["ran_on"] = exe.ran_on()
        report["fallbacks"] = [f.as_dict() for f in exe.fallbacks]
    if args.check:
        report["check"] = compare(outputs, _outputs(interpret(mod, *inputs, entry=args.entry)), args.rtol, args.atol)
    if args.time:
        report["time"] = _median_ms(run, args.repeat)
    if args.save_package and (report["check"] is None or report["check"]["ok"]):
        from dpl.package import save_package

        report["package"] = str(save_package(exe, args.save_package))
    if args.json:
        print_json(report)
    else:
        print(_text(report, what))
    if report["check"] is not None and not report["check"]["ok"]:
        c = report["check"]
        print(f"dpl: error: {what} differs from the interpreter beyond the bound {bound_text(c)} "
              f"(max abs error {c['max_abs_error']:.3g}, max rel error {c['max_rel_error']:.3g})", file=sys.stderr)
        return 1
    return 0


def _text(report: dict, what: str) -> str:
    lines = [f"output {i}: shape {tuple(o['shape'])} dtype {o['dtype']} checksum {o['checksum']:.6g}"
             for i, o in enumerate(report["outputs"])]
    if report["check"] is not None:
        c = report["check"]
        verdict = "ok" if c["ok"] else "MISMATCH"
        lines.append(f"check: {what} vs the interpreter: max abs error {c['max_abs_error']:.3g}, "
                     f"max rel error {c['max_rel_error']:.3g} (bound {bound_text(c)}): {verdict}")
    if report["time"] is not None:
        t = report["time"]
        lines.append(f"time: {what}: median {t['median_ms']:.4g} ms, min {t['min_ms']:.4g} ms over {t['runs']} run{'s' if t['runs'] != 1 else ''}")
    if report["package"] is not None:
        lines.append(f"package: saved {report['package']}")
    return "\n".join(lines)
