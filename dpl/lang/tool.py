"""``dpl check``: validate pattern files and list what each pattern is."""

from __future__ import annotations

from typing import Sequence

from dpl.lang import load_rules


def check_report(sources: Sequence[str]) -> str:
    """One line per rule: kind, full name, root op, ops, codegen; and its doc's first line.
    Raises the files' errors (all of them) when there are any."""
    rules = load_rules(list(sources))
    width = max((len(r.name) for r in rules), default=0)
    lines = []
    for r in rules:
        codegen = f"codegen {r.codegen}" if r.kind == "pattern" else "rewrite"
        line = f"{r.kind:<8} {r.name:<{width}}  root {r.root_op:<12} {r.variants:>4} variant{'s' if r.variants != 1 else ' '}  ops {'+'.join(r.ops):<40} {codegen}"
        if r.doc:
            line += f"  # {r.doc.splitlines()[0]}"
        lines.append(line.rstrip())
    lines.append(f"{len(rules)} rule{'s' if len(rules) != 1 else ''} ok")
    return "\n".join(lines)
