"""FuseOps: automatic fusion of everything no pattern claimed, exactly as TVM Relax does it.

Per function: build the IndexedForwardGraph, partition it with the post-dominator rules, and
turn each group of two or more bindings into a ``Primitive`` function (see
:mod:`dpl.transform.outline` for parameters, outputs, naming and sharing). Functions that are
already ``Primitive``, ``Composite`` or ``Codegen`` are left alone, and the input module is never changed.
"""

from __future__ import annotations

import attrs

from dpl.errors import DplError
from dpl.ir.collector import paused_collector
from dpl.ir.expr import Module
from dpl.transform.graph import build_graph
from dpl.transform.multi_output import join_producer_groups
from dpl.transform.normalize import normalize_function
from dpl.transform.outline import FunctionTable, Group, outline
from dpl.transform.partition import partition
from dpl.transform.rematerialize import copy_sources


def fusion_groups(func, opt_level: int = 2, max_depth: int = 256, *, views: bool = False,
                  multi_output: bool = False) -> list[list[int]]:
    """The groups FuseOps forms in ``func``: lists of binding indices, two or more each."""
    nodes = build_graph(func, views)
    groups = partition(nodes, opt_level, max_depth)
    if multi_output and opt_level > 0:
        join_producer_groups(nodes, groups, max_depth)
    members: dict[int, list[int]] = {}
    for node, group in zip(nodes, groups):
        if node.binding is not None:
            members.setdefault(id(group.root()), []).append(node.binding)
    return sorted((sorted(m) for m in members.values() if len(m) > 1), key=max)


@attrs.frozen
class FuseOps:
    """The pass as an object with its options (``FuseOps(max_depth=4)(mod)``)."""

    opt_level: int = 2
    max_depth: int = 256
    fuse_reductions: bool = False
    views: bool = False
    multi_output: bool = False
    rematerialize: bool = False

    def __call__(self, mod: Module) -> Module:
        return fuse_ops(mod, self.opt_level, self.max_depth, fuse_reductions=self.fuse_reductions, views=self.views,
                        multi_output=self.multi_output, rematerialize=self.rematerialize)


def fuse_ops(mod: Module, opt_level: int = 2, max_depth: int = 256, *, fuse_reductions: bool = False,
             views: bool = False, multi_output: bool = False, rematerialize: bool = False) -> Module:
    """TVM's FuseOps. ``fuse_reductions=True`` (beyond TVM, opt-in) first groups the row-wise
    chains TVM leaves apart — reductions over the last axis with the elementwise work around
    them, as in a decomposed softmax, RMSNorm or LayerNorm — into one row kernel each.

    ``views=True`` (beyond TVM, opt-in; ``dpl.apply`` turns it on) treats the ops that move no
    data — ``reshape``, ``squeeze``, ``expand_dims`` — as elementwise, symbolic shapes included,
    so they never break a group: GPT-2's ``matmul -> reshape -> add`` is one epilogue group where
    TVM ends the group at the reshape (Injective), and a reshape of a symbolic shape joins its
    neighbours where TVM leaves it alone (Opaque).

    ``multi_output=True`` (beyond TVM, opt-in; ``dpl.apply`` turns it on) lets a lone op that
    is at most injective join the group computing everything it reads, as one more output of
    that group (see :mod:`dpl.transform.multi_output`): a decoder's ``where(mask, 0, -inf)``,
    read by two attention composites, is computed by the mask's own kernel.

    ``rematerialize=True`` (beyond TVM, opt-in; ``dpl.apply`` turns it on) copies an op that
    reads no tensor (T5's ``arange(seq)``) once per reader when every copy then joins its
    reader's group (see :mod:`dpl.transform.rematerialize`). The default is TVM-exact."""
    if max_depth < 1:
        raise DplError(f"max_depth must be at least 1, got {max_depth}")
    with paused_collector():  # see dpl.ir.collector: the collector would make the pass superlinear
        return _fuse_ops(mod, opt_level, max_depth, fuse_reductions, views, multi_output, rematerialize)


def _fuse_ops(mod: Module, opt_level: int, max_depth: int, fuse_reductions: bool, views: bool, multi_output: bool,
              rematerialize: bool) -> Module:
    # one binding per call, as Relax's BlockBuilder makes it: a nested call is a node of its own
    mod = Module({name: fn if any(k in fn.attrs for k in ("Primitive", "Codegen", "Composite")) else normalize_function(fn)
                  for name, fn in mod.functions.items()})
    if fuse_reductions and opt_level > 0:
        from dpl.kernel.row_fusion import fuse_reductions as group_rows

        mod = group_rows(mod)
    table = FunctionTable(mod)
    for name, func in mod.functions.items():
        # kernels already (TVM: Primitive/Codegen; a composite is local to its Codegen wrapper there)
        if any(k in func.attrs for k in ("Primitive", "Codegen", "Composite")):
            continue
        members = fusion_groups(func, opt_level, max_depth, views=views, multi_output=multi_output)
        if rematerialize and opt_level > 0:
            func, members = _with_copied_sources(func, members, opt_level, max_depth, views, multi_output)
        groups = [Group(tuple(m), {}) for m in members]
        if groups:
            # tensor constants become parameters as in TVM; scalars stay inline, as TVM's
            # legalized kernels fold them
            table.functions[name] = outline(func, groups, table, lift_constants=True, lift_scalars=False)
    return table.module()


def _with_copied_sources(func, members, opt_level, max_depth, views, multi_output):
    """``func`` with its cheap sources copied per reader and its groups, when every copy is in a
    group; else ``func`` and ``members`` as they were."""
    copied, copies = copy_sources(func)
    if not copies:
        return func, members
    grouped = fusion_groups(copied, opt_level, max_depth, views=views, multi_output=multi_output)
    inside = {i for m in grouped for i in m}
    if not all(i in inside for c in copies for i in c):
        return func, members
    return copied, grouped
