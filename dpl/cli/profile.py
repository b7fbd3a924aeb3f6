"""``dpl profile``: read a model, fuse it first when it has no groups yet, and time each group
op by op and fused (:func:`dpl.runtime.profile_module`); the profile file goes where ``-o`` says."""

from __future__ import annotations

import logging
import sys

from dpl.cli.common import (add_patterns_option, dim_arg, each_warning_once, early_target_check, entry_function, load_module, parse_dims,
                            print_json, target_arg)

log = logging.getLogger(__name__)

GROUP_ATTRS = ("Primitive", "Composite", "Codegen")


def add_profile_command(sub) -> None:
    p = sub.add_parser("profile", help="time each fused group op by op and fused on this machine; write the profile file with -o",
                       description="Time each group of a module op by op and as one fused kernel. A module with no "
                                   "groups yet is fused first (dpl.apply with the -p libraries, then automatic fusion).")
    p.add_argument("module", help="a module in the text form, an .onnx model (any format dpl reads), or - for stdin")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="the profile file to write or merge into (FusionConfig(profile_path=...) reads it); "
                        "without it nothing is written")
    p.add_argument("--target", default="cpu", help="numpy, cpu, cuda or a backend name (default cpu)")
    add_patterns_option(p)
    p.add_argument("--dim", action="append", default=[], type=dim_arg, metavar="NAME=SIZE", help="size of a symbolic dim (default 1024)")
    p.add_argument("--repeat", type=int, default=20, help="timed runs per kernel (the median is kept)")
    p.add_argument("--strict", action="store_true", help="a fall-back is an error (exit 1): a backend of the target that is "
                                                        "unavailable or fails to compile, a codegen prefix no backend owns")
    p.add_argument("--json", action="store_true", help="print the result as JSON (keys: module, output, fused_first, groups)")
    p.set_defaults(func=cmd_profile)


def is_fused(mod) -> bool:
    """Whether some function of ``mod`` is a group (Primitive, Composite or Codegen)."""
    return any(key in fn.attrs for fn in mod.functions.values() for key in GROUP_ATTRS)


def cmd_profile(args) -> int:
    with each_warning_once():
        return _profile(args)


def _profile(args) -> int:
    from dpl.runtime import profile_module

    target = target_arg(args.target)
    early_target_check(target, args.strict)
    mod = load_module(args.module)
    dims = parse_dims(args.dim, entry_function(mod, "main", args.module))
    fuse_first = bool(args.patterns) or not is_fused(mod)
    if fuse_first:
        from dpl.apply import apply

        why = "fusing it with " + " ".join(f"-p {p}" for p in args.patterns) if args.patterns else "it has no fused groups: fusing it"
        log.info("%s: %s first (dpl.apply, then automatic fusion)", args.module, why)
        mod = apply(mod, args.patterns)
    quiet = logging.getLogger("dpl").getEffectiveLevel() > logging.INFO
    data = profile_module(mod, args.output, target=target, dims=dims, repeat=args.repeat, strict=args.strict,
                          progress=sys.stderr if sys.stderr.isatty() and not (quiet or args.json) else None)
    if not data.groups:
        log.warning("%s: no group to profile (every op runs alone)", args.module)
    if args.json:
        print_json({"module": args.module, "output": args.output, "fused_first": fuse_first, "groups": list(data.groups)})
    else:
        print(format_profile(data))
    if args.output is not None:
        log.info("wrote %s", args.output)
    else:
        log.info("not saved: give -o FILE to write the profile")
    return 0


def format_profile(data) -> str:
    lines = [f"{'group':<28} {'shapes':<24} {'ops':<28} {'separate ms':>12} {'fused ms':>10}"]
    for g in data.groups:
        shapes = " ".join("x".join(map(str, s)) for s in g["input_shapes"])
        fused = "-" if g.get("fused") is None else f"{g['fused']:.4f}"
        lines.append(f"{g['function'][:28]:<28} {shapes[:24]:<24} {g['compatible_key'][:28]:<28} {g['separate']:>12.4f} {fused:>10}")
    return "\n".join(lines)
