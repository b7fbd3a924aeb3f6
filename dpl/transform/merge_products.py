"""Merged products: matrix products that read the same input with constant weights become one
wider product whose result is split (TVM's CombineParallelMatmul).

q/k/v projections and an MLP's gate/up products each read the normed hidden state; one GEMM
over the concatenated weight reads the input once and gives the matrix-product provider one
wide problem instead of several narrow ones. A bias added to every branch is concatenated too,
so the merged product keeps its epilogue (``matmul`` + ``add`` is still a
``cublas.matmul_bias``); each branch then reads its columns through a ``strided_slice`` of its
own (not one ``split`` and its items): a slice is one more index map for its consumer, so it
joins the branch's group (q's reshape, permute and rotary embedding) or its composite (SwiGLU
over the two halves of a gate/up product), where a ``split`` whose three users go to three
groups would stay alone, a kernel copying the product into three tensors.

A group is the products of one function that share the input value, the ``out_dtype``, the
weights' dtype and leading dimension (rank-2 constants), and whether each has a bias (a rank-1
constant that its lone user adds). Branches with a bias and without one form separate groups.
Only the weights are concatenated, at compile time; the numbers are the same products, column
for column. ``dpl.apply(..., merge_products=False)`` leaves products alone.
"""

from __future__ import annotations

import itertools
import logging

import attrs
import numpy as np

from dpl.ir.collector import paused_collector
from dpl.ir.expr import Binding, Call, Constant, Function, Module, Var
from dpl.ir.traverse import leaves
from dpl.ops.registry import make_call

log = logging.getLogger(__name__)

_FUNCTION_ATTRS = ("Composite", "Codegen", "Primitive")


@attrs.frozen
class _Branch:
    index: int  # the product's binding
    weight: Constant
    bias: Constant | None = None
    bias_index: int | None = None  # the binding that adds the bias: the branch's result

    @property
    def result(self) -> int:
        return self.index if self.bias_index is None else self.bias_index


def merge_products(mod: Module) -> Module:
    """``mod`` with each group of parallel products merged (the input is not changed)."""
    with paused_collector():  # see dpl.ir.collector
        functions = {name: merge_function(fn) for name, fn in mod.functions.items()}
    if all(functions[name] is fn for name, fn in mod.functions.items()):
        return mod
    return Module(functions)


def merge_function(func: Function) -> Function:
    if any(key in func.attrs for key in _FUNCTION_ATTRS):
        return func
    groups = _groups(func)
    if not groups:
        return func
    taken = {p.name for p in func.params} | {b.var.name for b in func.bindings}
    replaced: dict[int, list[Binding]] = {}  # binding index -> what takes its place
    for branches in groups:
        for br in branches:
            replaced.setdefault(br.index, [])
            if br.bias_index is not None:
                replaced.setdefault(br.bias_index, [])
        first = min(br.index for br in branches)
        replaced[first] = _merged(func, branches, taken)
        log.debug("merged %d products of '%s' into one", len(branches), func.name)
    out = []
    for i, b in enumerate(func.bindings):
        out.extend(replaced.get(i, [b]))
    return attrs.evolve(func, bindings=tuple(out))


def _groups(func: Function) -> list[list[_Branch]]:
    products = []  # products of a constant matrix: the only ones that merge
    for i, b in enumerate(func.bindings):
        v = b.value
        if not (type(v) is Call and v.op == "matmul" and len(v.args) == 2):
            continue
        x, w = v.args
        if isinstance(w, Constant) and w.value.ndim == 2 and isinstance(x, (Var, Constant)):
            products.append(i)
    if len(products) < 2:
        return []  # nothing to merge: the users need not be indexed
    users: dict[int, list[int]] = {}
    for i, b in enumerate(func.bindings):
        for leaf in set(map(id, leaves(b.value))):
            users.setdefault(leaf, []).append(i)
    returned = {id(v) for v in leaves(func.ret)}
    by_key: dict[tuple, list[_Branch]] = {}
    for i in products:
        b = func.bindings[i]
        v = b.value
        x, w = v.args
        branch = _with_bias(func, i, w, users.get(id(b.var), []), id(b.var) in returned)
        key = (id(x), v.attrs.get("out_dtype"), str(w.value.dtype), w.value.shape[0], branch.bias is not None,
               None if branch.bias is None else str(branch.bias.value.dtype))
        by_key.setdefault(key, []).append(branch)
    return [branches for branches in by_key.values() if len(branches) > 1]


def _with_bias(func: Function, i: int, w: Constant, users: list[int], returned: bool) -> _Branch:
    """The branch of product ``i``: with the bias its lone user adds, if that is what it is."""
    if returned or len(users) != 1:
        return _Branch(i, w)
    j = users[0]
    add = func.bindings[j].value
    if not (isinstance(add, Call) and add.op == "add" and len(add.args) == 2):
        return _Branch(i, w)
    var = func.bindings[i].var
    others = [a for a in add.args if a is not var]
    if len(others) != 1:
        return _Branch(i, w)
    b = others[0]
    if not (isinstance(b, Constant) and b.value.ndim == 1 and b.value.shape[0] == w.value.shape[1]):
        return _Branch(i, w)
    if add.ty != func.bindings[i].var.ty:  # the bias must not widen the dtype or the shape
        return _Branch(i, w)
    return _Branch(i, w, b, j)


def _fresh(taken: set[str], base: str) -> str:
    for k in itertools.count():
        name = base if k == 0 else f"{base}_{k}"
        if name not in taken:
            taken.add(name)
            return name
    raise AssertionError("unreachable")


def _merged(func: Function, branches: list[_Branch], taken: set[str]) -> list[Binding]:
    """The bindings that replace a group: the wide product (and bias), one slice per branch."""
    bindings = func.bindings
    first = bindings[branches[0].index]
    x = first.value.args[0]
    stem = "_".join(bindings[br.result].var.name for br in branches)
    weight = Constant(np.concatenate([br.weight.value for br in branches], axis=1), name=_fresh(taken, f"{stem}_weight"))
    product = make_call("matmul", [x, weight], dict(first.value.attrs))
    out = [Binding(Var(_fresh(taken, f"{stem}_merged"), product.ty), product)]
    if branches[0].bias is not None:
        bias = Constant(np.concatenate([br.bias.value for br in branches]), name=_fresh(taken, f"{stem}_bias"))
        add = make_call("add", [out[-1].var, bias], {})
        out.append(Binding(Var(_fresh(taken, f"{stem}_biased"), add.ty), add))
    whole, axis, start = out[-1].var, product.ty.ndim - 1, 0
    for br in branches:
        var = bindings[br.result].var
        width = int(br.weight.value.shape[1])
        part = make_call("strided_slice", [whole], {"axes": (axis,), "begin": (start,), "end": (start + width,),
                                                     "strides": (1,)})
        if part.ty != var.ty:
            raise AssertionError(f"merged product columns {start}:{start + width} are {part.ty}, the branch was {var.ty}")
        out.append(Binding(var, part))
        start += width
    return out
