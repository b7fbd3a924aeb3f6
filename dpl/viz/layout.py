"""A layered top-to-bottom layout computed in Python, so the HTML needs neither Graphviz nor
a layout library: each node's layer is its longest path from an input, nodes within a layer
are ordered by the mean position of what they read (one barycentre sweep), boxes grow with
their text."""

from __future__ import annotations

import attrs

from dpl.viz.graph import View

CHAR_W, LINE_H, PAD, GAP_X, GAP_Y = 7.0, 15.0, 8.0, 24.0, 46.0


@attrs.frozen
class Box:
    x: float
    y: float
    w: float
    h: float


def node_size(title: str, lines) -> tuple[float, float]:
    longest = max([len(title)] + [len(s) for s in lines])
    return longest * CHAR_W + 2 * PAD, (1 + len(lines)) * LINE_H + 2 * PAD


def layout(view: View) -> tuple[dict[str, Box], float, float]:
    """Node id -> box, and the drawing's width and height."""
    preds: dict[str, list[str]] = {n.id: [] for n in view.nodes}
    for e in view.edges:
        if e.src in preds and e.dst in preds:
            preds[e.dst].append(e.src)
    layer: dict[str, int] = {}
    for n in view.nodes:  # nodes come in a topological order (bindings, then the return)
        layer[n.id] = 1 + max((layer[p] for p in preds[n.id] if p in layer), default=-1)
    # an input (a weight) sits just above its first reader, not in one long row at the top
    succs: dict[str, list[str]] = {}
    for e in view.edges:
        succs.setdefault(e.src, []).append(e.dst)
    for n in view.nodes:
        if n.claim == "input" and succs.get(n.id):
            layer[n.id] = max(0, min(layer[d] for d in succs[n.id] if d in layer) - 1)
    rows: dict[int, list[str]] = {}
    for n in view.nodes:
        rows.setdefault(layer[n.id], []).append(n.id)
    sizes = {n.id: node_size(n.title, n.lines) for n in view.nodes}
    boxes: dict[str, Box] = {}
    y = GAP_Y / 2
    width = 0.0
    order_x: dict[str, float] = {}
    for depth in sorted(rows):
        ids = rows[depth]
        if depth > 0:
            ids.sort(key=lambda i: sum(order_x[p] for p in preds[i]) / len(preds[i]) if preds[i] else 0.0)
        x = GAP_X / 2
        height = 0.0
        for i in ids:
            w, h = sizes[i]
            boxes[i] = Box(x, y, w, h)
            order_x[i] = x + w / 2
            x += w + GAP_X
            height = max(height, h)
        width = max(width, x)
        y += height + GAP_Y
    # centre each row in the widest one
    for depth, ids in rows.items():
        right = max(boxes[i].x + boxes[i].w for i in ids)
        shift = (width - GAP_X / 2 - right) / 2
        for i in ids:
            boxes[i] = attrs.evolve(boxes[i], x=boxes[i].x + shift)
    return boxes, width, y
