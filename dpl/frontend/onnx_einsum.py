"""ONNX ``Einsum`` as a product and a sum: an entry of the op table (:data:`TABLE`, merged into
:data:`dpl.frontend.onnx_ops.ONNX_OPS`).

torch.onnx writes ``torch.einsum`` as one Einsum node (Mamba2's chunked scan,
``"bclhn,bcshn,bhcls,bcshp->bclhp"``). Each operand's axes are laid out in one order of every
letter (the output's, then the summed ones), with unit axes for the letters it lacks; the
operands are multiplied, broadcasting, and the letters not in the output summed away. FuseOps
groups the product with its sum as it groups any reduction with its prologue. An ellipsis
stands for the same trailing-aligned axes in every operand (broadcast like NumPy's); a letter
repeated within one operand (a diagonal) is refused.
"""

from __future__ import annotations

import string

from dpl.frontend.onnx_node import NodeContext


def _terms(ctx: NodeContext, equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """The operands' and the output's letters, each ellipsis spelled as upper-case letters."""
    equation = equation.replace(" ", "")
    inputs, arrow, output = equation.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(ranks):
        raise ctx.error(f"equation '{equation}' names {len(terms)} operands, the node has {len(ranks)}")
    spans = [rank - (len(t) - 3) if "..." in t else 0 for t, rank in zip(terms, ranks)]
    broadcast = string.ascii_uppercase[:max(spans, default=0)]
    spelled = []
    for t, rank, span in zip(terms, ranks, spans):
        t = t.replace("...", broadcast[len(broadcast) - span:])
        if len(t) != rank or not t.isalpha():
            raise ctx.error(f"term '{t}' of equation '{equation}' does not fit an operand of rank {rank}")
        if len(set(t)) != len(t):
            raise ctx.error(f"term '{t}' of equation '{equation}' repeats a letter (a diagonal), which dpl does not "
                            "translate")
        spelled.append(t)
    if arrow:
        output = output.replace("...", broadcast)
    else:  # implicit output: the ellipsis, then the letters used once, in alphabetical order
        counts = "".join(spelled)
        output = broadcast + "".join(sorted(c for c in set(counts) if c.islower() and counts.count(c) == 1))
    if any(c not in "".join(spelled) for c in output) or len(set(output)) != len(output):
        raise ctx.error(f"the output '{output}' of equation '{equation}' names a letter no operand has, or one twice")
    return spelled, output


def einsum(ctx: NodeContext):
    operands = [ctx.input(i) for i in range(ctx.num_inputs)]
    terms, output = _terms(ctx, ctx.attr("equation"), [x.ty.ndim for x in operands])
    summed = "".join(dict.fromkeys(c for t in terms for c in t if c not in output))
    letters = output + summed
    product = None
    for x, term in zip(operands, terms):
        order = sorted(range(len(term)), key=lambda axis: letters.index(term[axis]))
        if order != list(range(len(term))):
            x = ctx.emit("permute_dims", x, axes=order)
        missing = [i for i, c in enumerate(letters) if c not in term]
        if missing:
            x = ctx.emit("expand_dims", x, axis=missing)
        product = x if product is None else ctx.emit("multiply", product, x)
    if summed:
        product = ctx.emit("sum", product, axis=list(range(len(output), len(letters))), keepdims=False)
    return product


TABLE = {"Einsum": (einsum, 12, 12)}
