"""``dpl.draw(mod, patterns)``: a module before and after ``dpl.apply``, as a self-contained
HTML page (``.html()``, no Graphviz needed) or an SVG laid out by Graphviz (``.svg()``, the
optional ``viz`` extra plus the ``dot`` program)."""

from __future__ import annotations

import os
from typing import Any

import attrs

from dpl.errors import DplError
from dpl.ir.expr import Module
from dpl.viz.coverage import Coverage
from dpl.viz.graph import View, after_view, before_view, claims_by_binding
from dpl.viz.html import STROKE, composite_fills, fill_of, legend_entries, page


class VizError(DplError):
    """A picture that cannot be made here (Graphviz missing, an unknown file type)."""


@attrs.frozen(eq=False)
class Drawing:
    title: str
    views: tuple[tuple[View | None, View], ...]  # per entry function: (before, after)
    coverage: Coverage

    def html(self) -> str:
        before, after = self.views[0]
        return page(self.title, before, after, self.coverage.table())

    def dot(self):
        """A ``graphviz.Digraph``: before and after side by side, a cluster each, and a legend
        saying what each colour means (what claimed a group)."""
        try:
            import graphviz
        except ImportError:
            raise VizError("drawing SVG needs the 'graphviz' package", hint="pip install 'dpl[viz]' (and the 'dot' program: "
                           "apt-get install graphviz), or write .html, which needs neither") from None
        before, after = self.views[0]
        views = [v for v in (before, after) if v is not None]
        fills = composite_fills(views)
        g = graphviz.Digraph("dpl", graph_attr={"rankdir": "TB", "fontname": "monospace", "label": self.title},
                             node_attr={"shape": "box", "style": "rounded,filled", "fontname": "monospace", "fontsize": "10"},
                             edge_attr={"fontname": "monospace", "fontsize": "8", "color": "#999999"})
        ids: dict[str, str] = {}  # dot reads "a:b" as node a, port b: plain names instead
        for k, view in enumerate(views):
            with g.subgraph(name=f"cluster_{k}", graph_attr={"label": view.title, "color": "#cccccc"}) as c:
                for n in view.nodes:
                    ids[n.id] = f"n{len(ids)}"
                    label = n.title + ("\\n" + "".join(f"{line}\\l" for line in n.lines) if n.lines else "")
                    c.node(ids[n.id], label=label, fillcolor=fill_of(n, fills),
                           color=STROKE.get(n.claim, "#888888"), tooltip=n.name,
                           style="rounded,filled,dashed" if n.rewritten else "rounded,filled")
                for e in view.edges:
                    if e.src in ids and e.dst in ids:
                        c.edge(ids[e.src], ids[e.dst], label=e.label)
        with g.subgraph(name="cluster_legend", graph_attr={"label": "legend: what claimed each box", "color": "#cccccc"}) as c:
            keys = []
            for i, (fill, stroke, words) in enumerate(legend_entries(fills)):
                keys.append(f"legend{i}")
                dashed = ",dashed" if words.startswith("not in the result") else ""
                c.node(keys[-1], label=words, fillcolor=fill, color=stroke, style="rounded,filled" + dashed)
            for a, b in zip(keys, keys[1:]):  # one column, in the legend's order
                c.edge(a, b, style="invis")
        return g

    def svg(self) -> str:
        g = self.dot()
        import graphviz

        try:
            return g.pipe(format="svg", encoding="utf-8")
        except graphviz.ExecutableNotFound:
            raise VizError("drawing SVG needs Graphviz's 'dot' program, which is not on PATH",
                           hint="apt-get install graphviz (or brew install graphviz), or write .html, which needs no Graphviz") from None

    def save(self, path: str | os.PathLike) -> str:
        """Write ``.html`` or ``.svg`` (by the suffix); returns the path."""
        path = os.fspath(path)
        suffix = os.path.splitext(path)[1].lower()
        if suffix not in (".html", ".htm", ".svg"):
            raise VizError(f"cannot draw to '{path}': the file must end in .html or .svg")
        text = self.svg() if suffix == ".svg" else self.html()
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as err:
            raise VizError(f"cannot write '{path}': {err.strerror}") from None
        return path


def draw(mod: Module, patterns: Any = (), *, target: Any = "cpu", config=None, dims=None, title: str | None = None,
         trace=None, sources: bool = True, coverage: Coverage | None = None) -> Drawing:
    """Apply ``patterns`` to ``mod`` (or take an applied ``trace``) and draw before and after.
    ``target``/``config``/``dims``: whose runtime heuristics colour the groups that fall back
    (or ``coverage``, made with the decisions of a real build); ``sources``: generate each
    group's C kernel source for the click panel."""
    from dpl.apply import apply
    from dpl.trace import Trace
    from dpl.viz.kernels import kernel_sources

    if trace is None:
        if not isinstance(mod, Module):
            raise DplError(f"dpl.draw takes a Module, got {type(mod).__name__}")
        trace = Trace()
        apply(mod, patterns, trace=trace)
    fused = trace.result
    cov = coverage if coverage is not None else trace.coverage(target=target, config=config, dims=dims)
    views = []
    for fc in cov.functions:
        fn = fused[fc.function]
        groups = [g.function for g in fc.groups]
        code = kernel_sources(fused, groups) if sources else {}
        after = after_view(fused, fn, cov, code, title=f"after apply: {fc.function}")
        before = None
        source = trace.source
        if source is not None and fc.function in source.functions:
            claims = claims_by_binding(fused, fn, cov, source[fc.function])
            kept = set()
            if trace.rewritten is not None and fc.function in trace.rewritten.functions:
                kept = {b.var.name for b in trace.rewritten[fc.function].bindings}
            before = before_view(source[fc.function], claims, kept, title=f"before apply: {fc.function}")
        views.append((before, after))
    if not views:
        raise DplError("the module has no entry function to draw")
    return Drawing(title or "dpl: what fusion did", tuple(views), cov)


__all__ = ["Drawing", "VizError", "draw"]
