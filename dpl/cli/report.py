"""``dpl report``: the share of ops each claim took after rewrite and fusion, and the runtime's decisions."""

from __future__ import annotations

from dpl.cli.common import applied, fusion_config, module_parser


def cmd_report(args) -> int:
    _, trace = applied(args)
    cov = trace.coverage(target=args.target, config=fusion_config(args), dims=dict(args.dim))
    print(cov.json() if args.json else cov.table())
    return 0


def add_report_command(sub) -> None:
    p = module_parser(sub, "report", "after rewrite + fusion: the share of ops in composites, in automatic groups and alone "
                                      "(with reasons), and what the runtime heuristics decide per group")
    p.add_argument("--json", action="store_true", help="print JSON for tools")
    p.set_defaults(func=cmd_report)
