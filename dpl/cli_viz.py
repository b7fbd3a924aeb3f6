"""The commands that show what fusion did: ``dpl report``, ``dpl viz``, ``dpl explain`` and
``dpl demo``. Each ``add_*_command(sub)`` registers one subcommand on ``dpl``'s parser."""

from __future__ import annotations

import argparse

from dpl.errors import DplError


def _patterns_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--patterns", "-p", action="append", default=[], metavar="P",
                   help="a .dpl file or a shipped library (cublas, llm, rewrites); repeat it, earlier ones win")


def _dims_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                   help="size of a symbolic dimension for the runtime decisions (default 8)")


def _dims(texts) -> dict[str, int]:
    out = {}
    for text in texts:
        name, _, value = text.partition("=")
        if not name or not value.isdigit():
            raise DplError(f"--dim takes NAME=SIZE, got '{text}'")
        out[name] = int(value)
    return out


def _applied(args):
    """(module, trace) after dpl.apply of the file with the given patterns."""
    from dpl.apply import apply
    from dpl.frontend import load_model
    from dpl.trace import Trace

    mod = load_model(args.file)
    trace = Trace()
    apply(mod, args.patterns or (), trace=trace)
    return mod, trace


# -- dpl report ---------------------------------------------------------------------------------
def cmd_report(args) -> int:
    _, trace = _applied(args)
    cov = trace.coverage(target=args.target, dims=_dims(args.dim))
    print(cov.json() if args.json else cov.table())
    return 0


def add_report_command(sub) -> None:
    p = sub.add_parser("report", help="after rewrite + fusion: the share of ops in composites, in automatic groups and alone "
                                      "(with reasons), and what the runtime heuristics decide per group")
    p.add_argument("file")
    _patterns_option(p)
    _dims_option(p)
    p.add_argument("--target", default="cpu", help="the build target whose heuristics decide (default cpu)")
    p.add_argument("--json", action="store_true", help="print JSON for tools")
    p.set_defaults(func=cmd_report)
