"""The post-dominator tree of an IndexedForwardGraph (TVM's DominatorTree::PostDom).

Nodes are visited consumers first. A node's parent is the least common ancestor of its
consumers; its ``pattern`` is the max of every edge on the way there, so it says how complex
the paths from the node to its post-dominator are. An ``extern_ref`` node has no parent (it is
used from outside), and any node whose paths reach such a node before they meet has none
either: it cannot be fused into anything.
"""

from __future__ import annotations

import attrs

from dpl.ops.registry import OpPatternKind
from dpl.transform.graph import Node


@attrs.define(eq=False)
class DomNode:
    node: Node
    parent: "DomNode | None"
    depth: int
    pattern: OpPatternKind


def _lca(lhs: DomNode | None, rhs: DomNode | None, pattern: OpPatternKind) -> tuple[DomNode | None, OpPatternKind]:
    while lhs is not rhs:
        if lhs is None or rhs is None:
            return None, pattern
        if lhs.depth < rhs.depth:
            pattern = max(pattern, rhs.pattern)
            rhs = rhs.parent
        elif rhs.depth < lhs.depth:
            pattern = max(pattern, lhs.pattern)
            lhs = lhs.parent
        else:
            pattern = max(pattern, lhs.pattern, rhs.pattern)
            lhs, rhs = lhs.parent, rhs.parent
    return lhs, pattern


def post_dominator_tree(nodes: list[Node]) -> list[DomNode]:
    tree: list[DomNode | None] = [None] * len(nodes)
    for node in reversed(nodes):
        if node.extern_ref:
            tree[node.index] = DomNode(node, None, 1, OpPatternKind.OPAQUE)
            continue
        pattern = OpPatternKind.ELEMWISE
        parent: DomNode | None = None
        for k, (out, edge_pattern) in enumerate(node.outputs):
            if k == 0:
                parent = tree[out.index]
            else:
                parent, pattern = _lca(parent, tree[out.index], pattern)
            pattern = max(pattern, edge_pattern)
        tree[node.index] = DomNode(node, parent, parent.depth + 1 if parent else 1, pattern)
    return tree  # type: ignore[return-value]
