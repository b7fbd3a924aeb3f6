"""TVM's GraphPartitioner: which nodes fuse with their post-dominator (Relax FuseOps rules).

Groups are union-find sets. Three phases visit the nodes producers first; a node joins the
group of its immediate post-dominator when its own group's kind allows it and every path to
the post-dominator passes the kind test of that rule (``check_path``); then every node on those
paths joins (``commit_fuse``):

* OutEWiseFusable (matmul, conv, softmax...): phase 0, if every edge to the post-dominator is
  elementwise and every node on the way, the sink included, is at most broadcast;
* ElemWise / Broadcast: any phase, if the path is at most injective (or a reduction) and the
  sink is at most broadcast, injective, a reduction or an OutEWiseFusable group;
* Injective: phase 1 only ("so conv2d always finishes fusing"), all at most injective;
* CommReduce: never a child; Opaque: never.

A group never grows past ``max_depth`` nodes. ``opt_level=0`` fuses nothing. Relax flattens
tuple arguments into edges, so the tuple rules of phase 2 never fire; they are kept for
faithfulness.
"""

from __future__ import annotations

from dpl.ops.registry import OpPatternKind as K
from dpl.transform.dominators import DomNode, post_dominator_tree
from dpl.transform.graph import Node


class Group:
    __slots__ = ("parent", "pattern", "anchor", "num_nodes")

    def __init__(self, pattern: K, anchor: bool):
        self.parent: Group | None = None
        self.pattern = pattern
        self.anchor = anchor  # holds an OutEWiseFusable op
        self.num_nodes = 1

    def root(self) -> "Group":
        g = self
        while g.parent is not None:
            g = g.parent
        node = self  # path compression
        while node.parent is not None and node.parent is not g:
            node.parent, node = g, node.parent
        return g


class PartitionError(Exception):
    pass


class Partitioner:
    def __init__(self, nodes: list[Node], opt_level: int = 2, max_depth: int = 256):
        self.nodes = nodes
        self.opt_level = opt_level
        self.max_depth = max_depth
        self.groups = [Group(n.pattern, n.pattern == K.OUT_EWISE_FUSABLE) for n in nodes]

    def run(self) -> list[Group]:
        if self.opt_level == 0:
            return self.groups
        tree = post_dominator_tree(self.nodes)
        for phase in range(3):
            self.run_fuse(tree, phase)
        return self.groups

    # -- union-find ----------------------------------------------------------------------------
    def merge(self, child: Group, parent: Group) -> None:
        child, parent = child.root(), parent.root()
        if child is parent:
            return
        parent.num_nodes += child.num_nodes
        child.parent = parent
        if child.anchor:
            if parent.anchor:
                raise PartitionError("cannot merge two complex groups together")
            parent.anchor = True
            parent.pattern = max(parent.pattern, child.pattern)

    # -- paths to the post-dominator -------------------------------------------------------------
    def check_path(self, src: Node, sink: Node, cond) -> bool:
        assert not src.extern_ref and src is not sink
        visited: set[int] = set()
        stack = [out for out, _ in reversed(src.outputs)]
        while stack:
            node = stack.pop()
            if node.index in visited:
                continue
            visited.add(node.index)
            if not cond(self.groups[node.index].root().pattern, node is sink):
                return False
            if node is not sink:
                stack.extend(out for out, _ in reversed(node.outputs))
        return True

    def commit_fuse(self, src: Node, sink: Node) -> None:
        target = self.groups[sink.index]
        visited: set[int] = set()
        stack = [src]
        while stack:
            node = stack.pop()
            if node is sink or node.index in visited:
                continue
            visited.add(node.index)
            self.merge(self.groups[node.index], target)
            stack.extend(out for out, _ in reversed(node.outputs))

    def count_with_new_child(self, child: Node, parent: Node) -> int:
        total = self.groups[parent.index].root().num_nodes
        visited: set[int] = set()
        stack = [child]
        while stack:
            node = stack.pop()
            if node is parent or node.index in visited:
                continue
            visited.add(node.index)
            total += self.groups[node.index].num_nodes
            stack.extend([out for out, _ in node.outputs])
        return total

    # -- the rules -------------------------------------------------------------------------------
    def run_fuse(self, tree: list[DomNode], phase: int) -> None:
        for node, dom, group in zip(self.nodes, tree, self.groups):
            if group.pattern == K.OPAQUE or dom.parent is None:
                continue
            sink = dom.parent.node
            if self.count_with_new_child(node, sink) > self.max_depth:
                continue
            sink_group = self.groups[sink.index]
            if phase == 2:
                if group.pattern > K.INJECTIVE:
                    continue
                sink_root = sink_group.root()
                if sink_root.pattern == K.TUPLE:
                    continue
                if sink_group.pattern == K.TUPLE and sink_root.pattern <= K.INJECTIVE:
                    if self.check_path(node, sink, lambda kind, is_sink: kind <= K.INJECTIVE):
                        self.commit_fuse(node, sink)
                continue
            if group.root() is sink_group.root() or sink_group.pattern == K.TUPLE:
                continue
            if group.pattern == K.OUT_EWISE_FUSABLE:
                if phase == 0 and dom.pattern == K.ELEMWISE and self.check_path(node, sink, lambda kind, is_sink: kind <= K.BROADCAST):
                    self.commit_fuse(node, sink)
            elif group.pattern <= K.BROADCAST:
                if dom.pattern <= K.INJECTIVE or dom.pattern == K.COMM_REDUCE:
                    def cond(kind, is_sink):
                        if not is_sink:
                            return kind <= K.INJECTIVE
                        return kind <= K.BROADCAST or kind in (K.COMM_REDUCE, K.INJECTIVE, K.OUT_EWISE_FUSABLE)

                    if self.check_path(node, sink, cond):
                        self.commit_fuse(node, sink)
            elif group.pattern in (K.INJECTIVE, K.TUPLE):
                if phase == 1 and self.check_path(node, sink, lambda kind, is_sink: kind <= K.INJECTIVE):
                    self.commit_fuse(node, sink)
            # CommReduce: never fused as a child


def partition(nodes: list[Node], opt_level: int = 2, max_depth: int = 256) -> list[Group]:
    return Partitioner(nodes, opt_level, max_depth).run()
