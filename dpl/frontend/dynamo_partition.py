"""Partitions of an ATen graph by what dpl can translate, for the torch.compile backend.

The operator-support predicate is the frontend's own table (:data:`~dpl.frontend.torch_ops.ATEN_OPS`)
plus what a translation needs of the node's metadata (a dtype dpl has, CPU memory, a tensor
rather than a size). torch's ``CapabilityBasedPartitioner`` groups the supported nodes into
partitions without cycles; each is lifted out as a GraphModule and translated by the frontend's
``GraphImporter``. A translation that fails names the node it failed on: that node goes to
torch and the partitions are proposed again (a few rounds at most; after that a partition that
still fails stays in torch whole). A partition too small to be worth a call (views only, or
one cheap op) stays in torch.
"""

from __future__ import annotations

import operator
from typing import Callable, Mapping

import attrs

from dpl.frontend.dynamo_report import count_ops
from dpl.frontend.torch_graph import IGNORED_OPS, TORCH_DTYPES

# ops that move no data (or only copy it): a partition of these alone is not worth a call
VIEW_OPS = frozenset(f"aten.{name}" for name in (
    "view.default", "_unsafe_view.default", "reshape.default", "flatten.using_ints", "permute.default", "transpose.int",
    "t.default", "numpy_T.default", "unsqueeze.default", "squeeze.dim", "squeeze.dims", "squeeze.default",
    "expand.default", "slice.Tensor", "select.int", "alias.default", "detach.default", "clone.default",
    "contiguous.default", "lift_fresh_copy.default", "split.Tensor", "split_with_sizes.default", "chunk.default",
    "_to_copy.default", "to.dtype", "to.dtype_layout", "to.device", "type_as.default",
))

ROUNDS = 8  # proposals at most: each round takes the nodes whose translation failed out
SIZE = "computes a size, not a tensor"  # not an op of the model's: the report leaves these out


class Untranslated(Exception):
    """A partition the frontend could not translate: ``reason``, and the nodes (of the
    original graph) responsible, when the failure points at them."""

    def __init__(self, reason: str, culprits=()):
        super().__init__(reason)
        self.reason, self.culprits = reason, tuple(culprits)


@attrs.define
class Part:
    """A proposed partition: its nodes in graph order and, translated, the lifted GraphModule,
    its inputs and outputs in the original graph and the dpl Module; else ``why`` it stays in torch."""

    nodes: list
    why: str = ""
    sub: object = None
    inputs: tuple = ()
    outputs: tuple = ()
    module: object = None

    @property
    def ops(self) -> dict[str, int]:
        return count_ops(self.nodes)


def why_unsupported(node, table: Mapping[str, Callable]) -> str | None:
    """Why dpl does not take ``node``, or None where it may."""
    import torch

    if node.op != "call_function":
        return f"{node.op} node"
    if node.target is operator.getitem:
        source = node.args[0]
        return why_unsupported(source, table) if hasattr(source, "op") else "an item of a Python value"
    name = str(node.target)
    if name in IGNORED_OPS:
        return "a run-time check"
    value = node.meta.get("val")
    values = value if isinstance(value, (tuple, list)) else (value,)
    if values and all(isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)) for v in values):
        return SIZE  # sym_size, a product of sizes: Python arithmetic whichever table it is in
    if name not in table:
        return "no dpl translation (dpl/frontend/torch_ops.py)"
    if not any(isinstance(v, torch.Tensor) for v in values):
        return SIZE
    for v in values:
        if not isinstance(v, torch.Tensor):
            continue
        if str(v.dtype).removeprefix("torch.") not in TORCH_DTYPES:
            return f"dtype {v.dtype}, which dpl does not have"
        if v.device.type != "cpu":
            return f"a tensor on {v.device} (dpl's torch.compile backend takes CPU tensors)"
    if name in VIEW_OPS and any(user.op == "output" for user in node.users):
        return "a view the graph returns (torch keeps its aliasing)"
    return None


def too_small(nodes) -> str | None:
    """Why a partition is not worth a call into dpl, or None where it is: views alone, or a
    single cheap op (elementwise, a view) beside them."""
    ops = [str(n.target) for n in nodes if n.op == "call_function" and n.target is not operator.getitem]
    compute = [op for op in ops if op not in VIEW_OPS]
    if not compute:
        return "views only: not worth a call"
    if len(compute) == 1 and compute[0] in CHEAP_OPS:
        return f"a single {compute[0].removeprefix('aten.')}: not worth a call"
    return None


# single ops that cost less than the call into dpl around them
CHEAP_OPS = frozenset(f"aten.{name}" for name in (
    "add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar", "mul.Tensor", "mul.Scalar", "div.Tensor", "div.Scalar",
    "neg.default", "rsub.Scalar", "rsub.Tensor", "where.self", "where.ScalarSelf", "where.ScalarOther", "eq.Scalar",
    "eq.Tensor", "ne.Scalar", "ne.Tensor", "gt.Scalar", "lt.Scalar", "ge.Scalar", "le.Scalar", "relu.default",
    "full.default", "zeros.default", "ones.default", "arange.default", "arange.start", "arange.start_step",
    "scalar_tensor.default", "masked_fill.Scalar", "bitwise_not.default", "logical_not.default", "cat.default",
    "full_like.default", "zeros_like.default", "ones_like.default", "new_zeros.default", "new_ones.default",
))


def propose(gm, table: Mapping[str, Callable], translate: Callable, rounds: int = ROUNDS):
    """``(parts, left)``: the partitions, each translated or with the reason it stays in torch,
    and the supported nodes a failed translation sent to torch, with the reason."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupportBase

    left: dict = {}

    class Support(OperatorSupportBase):
        def is_node_supported(self, submodules, node) -> bool:
            return node not in left and why_unsupported(node, table) is None

    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for attempt in range(rounds):
        proposed = CapabilityBasedPartitioner(gm, Support(), allows_single_node_partition=True).propose_partitions()
        parts, again = [], False
        for p in proposed:
            part = Part(sorted(p.nodes, key=order.__getitem__))
            parts.append(part)
            part.why = too_small(part.nodes) or ""
            if part.why:
                continue
            try:
                _translate(gm, part, translate)
            except Untranslated as err:
                if err.culprits and attempt < rounds - 1:
                    left.update({n: err.reason for n in err.culprits})
                    again = True
                else:
                    part.why = f"not translated: {err.reason}"
        if not again:
            return sorted(parts, key=lambda part: order[part.nodes[0]]), left
    raise AssertionError("unreachable: the last round keeps every failure")


def _translate(gm, part: Part, translate: Callable) -> None:
    from torch.fx.passes.utils.fuser_utils import fuse_as_graphmodule

    lookup = dict.fromkeys(part.nodes)
    sub, inputs, outputs = fuse_as_graphmodule(gm, part.nodes, "dpl_partition", lookup, always_return_tuple=True)
    by_name = {n.name: n for n in part.nodes}
    try:
        module = translate(sub)
    except Untranslated as err:  # its culprits are nodes of ``sub``: those of ``gm`` are named alike
        culprits = []
        for at in err.culprits:
            if at.op == "placeholder":  # an input dpl cannot take: its readers in the partition go to torch
                culprits.extend(n for n in part.nodes if any(a.name == at.name for a in n.all_input_nodes))
            elif at.name in by_name:
                culprits.append(by_name[at.name])
        raise Untranslated(err.reason, culprits) from None
    part.sub, part.inputs, part.outputs, part.module = sub, inputs, outputs, module


def install(gm, part: Part, name: str, runner, moved: dict) -> None:
    """Replace the partition's nodes in ``gm`` by a call of ``runner`` (a torch.nn.Module that
    returns a tuple, one item per output of the partition). ``moved`` maps the outputs of the
    partitions installed before to the items that replace them (a later partition may read them)."""
    gm.add_submodule(name, runner)
    with gm.graph.inserting_after(part.nodes[-1]):
        call = gm.graph.call_module(name, args=tuple(moved.get(n, n) for n in part.inputs))
    last = call
    for i, out in enumerate(part.outputs):
        with gm.graph.inserting_after(last):
            item = gm.graph.call_function(operator.getitem, (call, i))
        item.meta = dict(out.meta)
        out.replace_all_uses_with(item)
        moved[out] = item
        last = item
    for node in reversed(part.nodes):
        gm.graph.erase_node(node)


def finish(gm) -> None:
    """Order the graph again after :func:`install` (a partition's call sits after its last
    node; a reader outside it may have come earlier) and regenerate its code."""
    from torch.fx.passes.tools_common import stable_topological_sort

    stable_topological_sort(gm)
    gm.graph.lint()
    gm.recompile()
