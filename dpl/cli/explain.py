"""``dpl explain``: each rule's closest misses in a module and the rewrites applied."""

from __future__ import annotations

from dpl.cli.common import load_module, module_parser
from dpl.errors import DplError


def cmd_explain(args) -> int:
    from dpl.viz.explain import explain_module

    if not args.patterns:
        raise DplError("dpl explain needs the rules to explain", hint="give pattern files or libraries with -p, e.g. -p rewrites -p llm")
    report = explain_module(load_module(args.file), args.patterns, rule=args.rule, at=args.at, top=args.top)
    print(report)
    return 0


def add_explain_command(sub) -> None:
    p = module_parser(sub, "explain", "for each rule, its closest misses in the module (how much matched, the binding "
                                       "and sub-pattern that failed, the where conjunct and its values) and the rewrites applied",
                       runtime=False)
    p.add_argument("--rule", metavar="NAME", help="only this rule (its full name or the part after the prefix)")
    p.add_argument("--at", metavar="BINDING", help="only tries rooted at this binding (of the module after the rewrites)")
    p.add_argument("--top", type=int, default=3, help="closest misses shown per rule (default 3)")
    p.set_defaults(func=cmd_explain)
