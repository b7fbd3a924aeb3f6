"""``dpl check``: validate pattern files and list what each pattern is."""

from __future__ import annotations

from typing import Sequence

from dpl.lang import _load


def check_report(sources: Sequence[str]) -> str:
    """One line per rule: kind, full name, root op, ops, codegen; and its doc's first line;
    then a warning for each rule left out because an earlier file defines its name (both
    places named). Raises the files' errors (all of them) when there are any."""
    rules, shadowed = _load(list(sources))
    width = max((len(r.name) for r in rules), default=0)
    lines = []
    for r in rules:
        codegen = f"codegen {r.codegen}" if r.kind == "pattern" else "rewrite"
        if r.priority:
            codegen += f" priority {r.priority}"
        line = f"{r.kind:<8} {r.name:<{width}}  root {r.root_op:<12} {r.variants:>4} variant{'s' if r.variants != 1 else ' '}  ops {'+'.join(r.ops):<40} {codegen}"
        if r.doc:
            line += f"  # {r.doc.splitlines()[0]}"
        lines.append(line.rstrip())
    for dropped, kept in shadowed:
        lines.append(f"{dropped.span}: warning: {dropped.kind} '{dropped.name}' is also defined at {kept.span}; "
                     "the earlier one wins and this one is left out")
    lines.append(f"{len(rules)} rule{'s' if len(rules) != 1 else ''} ok"
                 + (f", {len(shadowed)} shadowed by an earlier file" if shadowed else ""))
    return "\n".join(lines)
