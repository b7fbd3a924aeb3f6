"""Multi-output fusion (beyond TVM, opt-in): a lone cheap op joins the group that computes all
it reads, as one more output of that group's kernel.

TVM fuses a node only into its post-dominator, so a value read by two places ends its group
there. The attention mask of a decoder is the case: ``and_2`` (the causal and padding test, one
group) is read by ``where(and_2, 0, -inf)``, whose users are two ``kernel.attention``
composites, and by the guard of the padded rows; ``where`` has no post-dominator it could join
and runs as a kernel of its own, re-reading ``and_2``. Here it joins ``and_2``'s group: the
group's kernel writes both values in the same pass over the index space, and the mask costs no
launch and no second read.

A node joins when it is alone after partitioning, is at most injective, reads (besides
parameters and constants) only values of one group whose kind is at most injective, and the
group stays within ``max_depth``. Nothing else can depend on the node's inputs through it, so
no cycle can form; the group's other outputs are unchanged.
"""

from __future__ import annotations

from dpl.ops.registry import OpPatternKind as K
from dpl.transform.graph import Node
from dpl.transform.partition import Group


def join_producer_groups(nodes: list[Node], groups: list[Group], max_depth: int = 256) -> None:
    """Merge each lone cheap node into the group of its producers (``groups`` is updated)."""
    producers: dict[int, list[Node]] = {}
    for node in nodes:
        for out, _ in node.outputs:
            producers.setdefault(out.index, []).append(node)
    for node, group in zip(nodes, groups):
        if node.binding is None or node.pattern > K.INJECTIVE or group.root().num_nodes != 1:
            continue
        computed = [p for p in producers.get(node.index, []) if p.binding is not None]
        roots = {id(groups[p.index].root()): groups[p.index].root() for p in computed}
        if len(roots) != 1:
            continue  # reads nothing computed (parameters, constants), or two groups
        (target,) = roots.values()
        if target.pattern > K.INJECTIVE or target.num_nodes + 1 > max_depth:
            continue
        root = group.root()
        root.parent = target
        target.num_nodes += 1
