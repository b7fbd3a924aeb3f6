"""``dpl fuse``: rewrite and fuse a module with pattern files or libraries and print the result."""

from __future__ import annotations

import sys

from dpl.cli.common import add_patterns_option, load_module, print_json, write_module
from dpl.errors import DplError


def add_fuse_command(sub) -> None:
    p = sub.add_parser("fuse", help="rewrite and fuse a module file or model with pattern files or libraries; print the result")
    p.add_argument("file", help="a module in the text form, an .onnx model, or - for stdin")
    p.add_argument("-o", "--output", metavar="FILE", help="write the fused module to FILE (and FILE.npz) instead of stdout")
    add_patterns_option(p)
    p.add_argument("--report", action="store_true", help="also print which matches were accepted or rejected, and why")
    p.add_argument("--json", action="store_true", help="print JSON (keys: module, output, events; each event: pattern, "
                                                      "function, root, members, accepted, reason, composite; with --time-passes, "
                                                      "passes: pass, ms, changed)")
    p.add_argument("--no-codegen", action="store_true", help="leave composites unwrapped (no Codegen functions)")
    p.add_argument("--no-auto", action="store_true", help="skip automatic fusion of what no pattern claimed")
    p.add_argument("--fuse-reductions", action="store_true",
                   help="beyond TVM: also fuse row-wise chains (decomposed softmax, RMSNorm, LayerNorm) into one kernel")
    p.add_argument("--pipeline", metavar="PASSES",
                   help="the passes to run, in order, instead of the default list the switches above choose: names "
                        "separated by commas, options in braces, e.g. 'rewrites,fold,by-pattern,fuse-ops{views=false}' "
                        "(the passes: rewrites, fold, merge-products, split-slices, by-pattern, fuse-ops)")
    p.add_argument("--time-passes", action="store_true",
                   help="print on stderr the time each pass took (with --json: under the key passes)")
    p.set_defaults(func=cmd_fuse)


def cmd_fuse(args) -> int:
    import attrs

    from dpl.apply import apply
    from dpl.pipeline import PassTimings, as_pipeline
    from dpl.trace import Trace

    switches = [f for f, on in (("--no-codegen", args.no_codegen), ("--no-auto", args.no_auto),
                                ("--fuse-reductions", args.fuse_reductions)) if on]
    if args.pipeline is not None and switches:
        raise DplError(f"--pipeline gives the passes and their options; it cannot be combined with {', '.join(switches)}",
                       hint="write the option into the pipeline, e.g. by-pattern{annotate-codegen=false} or "
                            "fuse-ops{fuse-reductions=true}, or leave out a pass")
    pipeline = as_pipeline(args.pipeline) if args.pipeline is not None else None  # a bad pipeline fails before the model loads
    mod = load_module(args.file)
    trace, timings = Trace(), PassTimings()
    fused = apply(mod, args.patterns or (), annotate_codegen=not args.no_codegen, fuse=not args.no_auto,
                  fuse_reductions=args.fuse_reductions, trace=trace, pipeline=pipeline, instruments=[timings])
    if args.time_passes and not args.json:
        print(timings.table(), file=sys.stderr)
    to_file = args.output not in (None, "-")
    if to_file:
        write_module(fused, args.output)
    if args.json:
        report = {"module": None if to_file else fused.script(), "output": args.output if to_file else None,
                  "events": [attrs.asdict(e) for e in trace.events]}
        if args.time_passes:
            report["passes"] = [{"pass": name, "ms": s * 1e3, "changed": changed} for name, s, changed in timings.rows]
        print_json(report)
        return 0
    if not to_file:
        write_module(fused, None)
    if args.report:
        report = trace.report()
        print(report if to_file else "\n# report\n" + "\n".join(f"# {line}" for line in report.splitlines()))
    return 0
