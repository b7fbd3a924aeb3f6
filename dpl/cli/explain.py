"""``dpl explain``: per rule, where it matches and what fusion made of each match (used,
rejected and why, taken by a higher-priority rule, consumed by a rewrite), its closest misses
in the module, and the rewrites applied."""

from __future__ import annotations

from dpl.cli.common import load_module, module_parser, print_json
from dpl.errors import DplError


def cmd_explain(args) -> int:
    from dpl.viz.explain import explain_module

    if not args.patterns:
        raise DplError("dpl explain needs the rules to explain", hint="give pattern files or libraries with -p, e.g. -p rewrites -p llm")
    report = explain_module(load_module(args.file), args.patterns, rule=args.rule, at=args.at, top=args.top)
    if args.json:
        print_json(report.as_dict())
    else:
        print(report)
    return 0


def add_explain_command(sub) -> None:
    p = module_parser(sub, "explain", "for each rule, where it matches and what became of each match (used, rejected "
                                       "and why, taken by a higher-priority rule, consumed by a rewrite), its closest "
                                       "misses in the module (how much matched, the binding and sub-pattern that failed, "
                                       "the where conjunct and its values) and the rewrites applied",
                       runtime=False)
    p.add_argument("--rule", metavar="NAME", help="only this rule (its full name or the part after the prefix)")
    p.add_argument("--at", metavar="BINDING", help="only tries rooted at this binding (of the module after the rewrites, "
                                                   "or as given for a match a rewrite consumed)")
    p.add_argument("--top", type=int, default=3, help="closest misses shown per rule (default 3)")
    p.add_argument("--json", action="store_true",
                   help="print JSON (keys: rewrites, rules; each rule: rule, kind, origin, applied, sites, misses; "
                        "each site: function, binding, members, fate, detail, composite, by; each miss: function, at, "
                        "matched, total, failed_binding, sub_pattern, met, why, refused)")
    p.set_defaults(func=cmd_explain)
