"""Splits as slices: ``parts = split(x); a = parts[0]; b = parts[1]`` becomes one
``strided_slice`` of ``x`` per item read (``a = x[..., 0:n]``, ``b = x[..., n:]``).

A ``split`` computes every piece in one kernel, so FuseOps can fuse it only into a group that
all its pieces reach; GPT-2's ``c_attn(x).split(n, dim=2)`` sends q, k and v to three different
groups (three reshapes and permutes on their way to attention), and the split stays alone, a
kernel copying the product into three tensors. A slice is an index map onto ``x``: each joins
its own consumer's group, and nothing is copied on the way. The numbers are the same elements.

Only a split whose every use is a binding that takes one item (``v = parts[i]``) is rewritten;
one returned, or read as a tuple, stays a split. ``dpl.apply(..., split_slices=False)`` keeps
every split.
"""

from __future__ import annotations

import attrs

from dpl.ir.collector import paused_collector
from dpl.ir.expr import Binding, Call, Function, Module, TupleGetItem, Var
from dpl.ir.traverse import leaves
from dpl.ops.registry import make_call

_FUNCTION_ATTRS = ("Composite", "Codegen", "Primitive")


def split_slices(mod: Module) -> Module:
    """``mod`` with each split whose items are only taken one by one as slices (the input is not changed)."""
    with paused_collector():  # see dpl.ir.collector
        functions = {name: slice_function(fn) for name, fn in mod.functions.items()}
    if all(functions[name] is fn for name, fn in mod.functions.items()):
        return mod
    return Module(functions)


def slice_function(func: Function) -> Function:
    if any(key in func.attrs for key in _FUNCTION_ATTRS):
        return func
    splits = {id(b.var): b for b in func.bindings if isinstance(b.value, Call) and b.value.op == "split"}
    if not splits:
        return func
    kept = {id(v) for v in leaves(func.ret) if id(v) in splits}  # a split returned stays one
    for b in func.bindings:
        item = b.value
        if isinstance(item, TupleGetItem) and isinstance(item.tuple_value, Var):
            continue
        kept.update(id(v) for v in leaves(item) if id(v) in splits)
    sliced = {key for key in splits if key not in kept}
    if not sliced:
        return func
    out = []
    for b in func.bindings:
        if id(b.var) in sliced:
            continue  # its items read x directly now
        item = b.value
        if isinstance(item, TupleGetItem) and id(item.tuple_value) in sliced:
            out.append(Binding(b.var, _slice(splits[id(item.tuple_value)].value, item.index, b.var)))
        else:
            out.append(b)
    return attrs.evolve(func, bindings=tuple(out))


def _slice(split: Call, index: int, var: Var) -> Call:
    x = split.args[0]
    fields = split.ty.fields
    index %= len(fields)
    axis = split.attrs["axis"] % x.ty.ndim
    start = sum(int(f.shape[axis]) for f in fields[:index])
    width = int(fields[index].shape[axis])
    part = make_call("strided_slice", [x], {"axes": (axis,), "begin": (start,), "end": (start + width,), "strides": (1,)})
    if part.ty != var.ty:
        raise AssertionError(f"split item {index} is {var.ty}, its slice {part.ty}")
    return part
