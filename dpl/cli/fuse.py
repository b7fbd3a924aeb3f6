"""``dpl fuse``: rewrite and fuse a module with pattern files or libraries and print the result."""

from __future__ import annotations

from dpl.cli.common import add_patterns_option, load_module, print_json, write_module


def add_fuse_command(sub) -> None:
    p = sub.add_parser("fuse", help="rewrite and fuse a module file or model with pattern files or libraries; print the result")
    p.add_argument("file", help="a module in the text form, an .onnx model, or - for stdin")
    p.add_argument("-o", "--output", metavar="FILE", help="write the fused module to FILE (and FILE.npz) instead of stdout")
    add_patterns_option(p)
    p.add_argument("--report", action="store_true", help="also print which matches were accepted or rejected, and why")
    p.add_argument("--json", action="store_true", help="print JSON (keys: module, output, events; each event: pattern, "
                                                      "function, root, members, accepted, reason)")
    p.add_argument("--no-codegen", action="store_true", help="leave composites unwrapped (no Codegen functions)")
    p.add_argument("--no-auto", action="store_true", help="skip automatic fusion of what no pattern claimed")
    p.add_argument("--fuse-reductions", action="store_true",
                   help="beyond TVM: also fuse row-wise chains (decomposed softmax, RMSNorm, LayerNorm) into one kernel")
    p.set_defaults(func=cmd_fuse)


def cmd_fuse(args) -> int:
    import attrs

    from dpl.apply import apply
    from dpl.trace import Trace

    mod = load_module(args.file)
    trace = Trace()
    fused = apply(mod, args.patterns or (), annotate_codegen=not args.no_codegen, fuse=not args.no_auto,
                  fuse_reductions=args.fuse_reductions, trace=trace)
    to_file = args.output not in (None, "-")
    if to_file:
        write_module(fused, args.output)
    if args.json:
        print_json({"module": None if to_file else fused.script(), "output": args.output if to_file else None,
                    "events": [attrs.asdict(e) for e in trace.events]})
        return 0
    if not to_file:
        write_module(fused, None)
    if args.report:
        report = trace.report()
        print(report if to_file else "\n# report\n" + "\n".join(f"# {line}" for line in report.splitlines()))
    return 0
