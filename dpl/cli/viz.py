"""``dpl viz``: a module drawn before and after rewrite and fusion."""

from __future__ import annotations

import logging

from dpl.cli.common import applied, fusion_config, module_parser

log = logging.getLogger(__name__)


def cmd_viz(args) -> int:
    from dpl.viz.draw import draw

    _, trace = applied(args)
    drawing = draw(None, trace=trace, target=args.target, config=fusion_config(args), dims=dict(args.dim), title=f"dpl: {args.file}")
    log.info("wrote %s", drawing.save(args.output))  # on stderr, as fuse -o says it; -q silences it
    return 0


def add_viz_command(sub) -> None:
    p = module_parser(sub, "viz", "draw a module before and after rewrite + fusion, groups coloured by what claimed them "
                                   "(.html: self-contained, click a group for its IR and kernel; .svg: needs Graphviz)")
    p.add_argument("--output", "-o", required=True, metavar="OUT.html|OUT.svg")
    p.set_defaults(func=cmd_viz)
