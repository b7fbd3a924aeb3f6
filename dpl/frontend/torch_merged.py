"""Reshapes that merge a symbolic dimension with others, as Hugging Face code writes them:
GPT-2's ``Conv1D`` computes ``addmm(b, x.view(-1, x.size(-1)), w).view(b, seq, n)`` and OPT's
decoder layer runs its MLP on ``hidden_states.reshape(-1, hidden)``. Torch's dimension there is
``2*seq``.

Such a value is carried as :class:`Merged`: the tensor as it was before the merge (``[2, seq,
64]``), with the count of leading axes torch merged into its first. The ops that act row by
row (elementwise arithmetic, linear layers, normalisations over the last axes, casts) are
translated on the unmerged tensor, giving a Merged again; a reshape that restores the leading
axes (``view(b, seq, n)``) ends it. Any other op meeting a Merged value, and a model output,
reads it flattened (:func:`flatten`): reshaped to torch's shape, whose first dimension is the
expression ``seq * 2``, as a dpl type holds it since dims are expressions (:mod:`dpl.ir.dims`).
The unmerged form stays the first choice: the patterns of ``llm.dpl`` claim a linear layer on
``[2, seq, 64]``, and a reshape of a symbolic input is Opaque to FuseOps.
"""

from __future__ import annotations

import attrs

from dpl.ir.expr import Expr

# view-like ops: they start, keep or end a merge
VIEWS = frozenset({"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"})

# ops whose result row i depends only on row i of their operands (elementwise, or acting on the
# trailing axes): translated on the unmerged tensor. Their translations count axes from the end.
ROW_OPS = frozenset({
    "aten.add.Tensor", "aten.add.Scalar", "aten.sub.Tensor", "aten.sub.Scalar", "aten.mul.Tensor", "aten.mul.Scalar",
    "aten.div.Tensor", "aten.div.Scalar", "aten.pow.Tensor_Scalar", "aten.neg.default", "aten.tanh.default",
    "aten.sigmoid.default", "aten.relu.default", "aten.gelu.default", "aten.silu.default", "aten.erf.default",
    "aten.exp.default", "aten.sqrt.default", "aten.rsqrt.default", "aten.linear.default", "aten.addmm.default",
    "aten.mm.default", "aten.matmul.default", "aten.layer_norm.default", "aten.rms_norm.default", "aten.clone.default",
    "aten.contiguous.default", "aten.alias.default", "aten.dropout.default", "aten._to_copy.default", "aten.to.dtype",
})


@attrs.frozen(eq=False)
class Merged:
    """``value`` with its first ``lead`` axes merged into one, as torch sees it."""

    value: Expr
    lead: int


def _tensors(arg):
    if isinstance(arg, (list, tuple)):
        for a in arg:
            yield from _tensors(a)
    elif hasattr(arg, "op") and hasattr(arg, "meta"):
        yield arg


def touches(importer, node) -> bool:
    """Whether ``node`` reads a Merged value or merges a symbolic dimension itself."""
    if any(isinstance(importer.env.get(a), Merged) for a in _tensors((node.args, list(node.kwargs.values())))):
        return True
    return str(node.target) in VIEWS and _merged_first(importer, node.meta.get("val"))


def _merged_first(importer, meta) -> bool:
    """Whether torch's first dimension of ``meta`` is an expression of symbols (``2*s27``)."""
    torch = importer.torch
    if not isinstance(meta, torch.Tensor) or meta.ndim == 0:
        return False
    d = meta.shape[0]
    if not isinstance(d, torch.SymInt):
        return False
    expr = d.node.expr
    return not (expr.is_Integer or expr.is_Symbol) and all(
        not isinstance(e, torch.SymInt) or e.node.expr.is_Integer or e.node.expr.is_Symbol for e in meta.shape[1:])


def translate(importer, node, translate_fn, invoke, context):
    """The value of ``node`` where it touches a Merged value (see the module docstring)."""
    name = str(node.target)
    meta = node.meta.get("val")
    source = importer.env.get(node.args[0]) if node.args and hasattr(node.args[0], "op") else None
    if name in VIEWS:
        return _view(importer, node, meta, source)
    leads = {_lead_key(importer.env[a]) for a in _tensors(node.args) if isinstance(importer.env.get(a), Merged)}
    firsts = [importer.env[a] for a in _tensors(node.args) if isinstance(importer.env.get(a), Merged)]
    if name not in ROW_OPS or len(leads) != 1 or not _merged_first(importer, meta) or _spans_rows(importer, node, meta):
        # not row-wise, operands merged differently, or a plain operand holding the merged rows
        # (MobileViT's residual add of an attention output to the unfolded patches): the op
        # reads them flattened
        args = [importer.value(a) for a in node.args]
        kwargs = {k: importer.value(v) for k, v in node.kwargs.items()}
        return importer.bind(invoke(translate_fn, context(importer, node), args, kwargs), node)
    first = firsts[0]
    lead_dims = tuple(first.value.ty.shape[:first.lead])
    unmerged = {a: importer.env[a] for a in _tensors(node.args)}
    swapped = {a: v.value for a, v in unmerged.items() if isinstance(v, Merged)}
    cx = context(importer, node)
    cx.leading = lead_dims
    args = [_value(importer, a, swapped) for a in node.args]
    kwargs = {k: _value(importer, v, swapped) for k, v in node.kwargs.items()}
    result = invoke(translate_fn, cx, args, kwargs)
    return Merged(importer.bind(result, node, check=False), first.lead)


def _spans_rows(importer, node, meta) -> bool:
    """Whether an operand of ``node`` that is not Merged has the merged first axis itself (of
    torch's rank and first dimension): it cannot broadcast against the unmerged form. Weights,
    biases and a row of scales have other ranks or a number first."""
    for a in _tensors(node.args):
        if isinstance(importer.env.get(a), Merged):
            continue
        val = a.meta.get("val")
        if getattr(val, "ndim", None) == meta.ndim and str(val.shape[0]) == str(meta.shape[0]):
            return True
    return False


def _lead_key(m: Merged) -> tuple:
    return tuple(m.value.ty.shape[:m.lead])


def flatten(importer, arg):
    """The Merged value of fx node ``arg`` reshaped to torch's shape of it (its first dimension
    the product of the merged axes), bound once and reused."""
    var = importer.flat.get(arg)
    if var is None:
        m = importer.env[arg]
        shape = importer.tensor_type(arg.meta.get("val"), f"the result of node '{arg.name}'").shape
        var = importer.fb.bind(_reshape(m.value, shape), importer.unique(f"{arg.name}_flat"))
        importer.flat[arg] = var
    return var


def _value(importer, arg, swapped):
    if isinstance(arg, (list, tuple)):
        return type(arg)(_value(importer, a, swapped) for a in arg)
    if arg in swapped if hasattr(arg, "op") else False:
        return swapped[arg]
    return importer.value(arg)


def _view(importer, node, meta, source):
    from dpl.ir.types import TensorType

    if isinstance(source, Merged):
        x = source.value
        if not _merged_first(importer, meta):  # the leading axes come back: a plain reshape
            shape = importer.tensor_type(meta, f"the result of node '{node.name}'").shape
            return importer.bind(_reshape(x, shape), node)
        first = importer.dim(meta.shape[0], f"dimension 0 of node '{node.name}'")
        if first == _product(x.ty.shape[:source.lead]):  # the same axes stay merged
            rest = tuple(importer.dim(d, f"dimension of node '{node.name}'") for d in meta.shape[1:])
            shape = tuple(x.ty.shape[:source.lead]) + rest
            return Merged(importer.bind(_reshape(x, shape), node, check=False), source.lead)
        x = flatten(importer, node.args[0])
    else:
        x = importer.env[node.args[0]]
    rest = tuple(importer.dim(d, f"dimension of node '{node.name}'") for d in meta.shape[1:])
    k = x.ty.ndim - len(rest)
    if k < 2 or tuple(x.ty.shape[k:]) != rest or not _same_product(importer, node.args[0].meta["val"].shape[:k], meta.shape[0]):
        # a merge the unmerged form cannot follow (batch with channels, 256 * batch): a plain
        # reshape, to torch's shape with its expression
        shape = importer.tensor_type(meta, f"the result of node '{node.name}'").shape
        return importer.bind(_reshape(x, shape), node)
    assert isinstance(x.ty, TensorType)
    return Merged(x, k)


def _same_product(importer, dims, merged) -> bool:
    import math

    torch = importer.torch
    product = math.prod(dims)
    expr = product.node.expr if isinstance(product, torch.SymInt) else product
    return bool((expr - merged.node.expr) == 0) or str(expr) == str(merged.node.expr)


def _product(shape) -> object:
    from dpl.ir import dims

    out = 1
    for d in shape:
        out = dims.mul(out, d)
    return out


def _reshape(x, shape):
    from dpl.ops.registry import make_call

    return x if tuple(shape) == tuple(x.ty.shape) else make_call("reshape", (x,), {"shape": list(shape)})



