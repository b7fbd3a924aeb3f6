"""Sizes an op requires equal that dynamo traced as separate symbols, made one by a guard.

Why. Dynamo gives each dynamic size of each input a symbol of its own; torch unifies two only
where an op's shape function compares them. Scaled dot-product attention's does not compare the
key's length with the value's (its kernels would fail at run time instead), so the key and value
caches of a Hugging Face decoder arrive with lengths ``s53`` and ``s40``, and dpl, whose types
must say that the softmax's columns meet the values' rows, cannot translate the attention.

What this does. For each attention call in dynamo's graph, it asks torch whether the key's and
the value's lengths are equal at the example sizes. The question is a guard: torch records it
(dynamo recompiles should a later call's lengths differ, which torch would reject anyway) and
makes the two symbols one, so AOTAutograd's trace, and dpl's types, see one length.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def equate_attention_lengths(gm) -> list[str]:
    """Guard the key and value lengths of every attention call of dynamo's graph ``gm`` equal
    where they are equal now; the equalities made, as ``"s53 == s40"``."""
    import torch
    from torch.fx.experimental.symbolic_shapes import guard_or_false

    attention = {torch._C._nn.scaled_dot_product_attention, torch.nn.functional.scaled_dot_product_attention}
    made = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in attention:
            continue
        key, value = (_example(node, i, name) for i, name in ((1, "key"), (2, "value")))
        if not (isinstance(key, torch.Tensor) and isinstance(value, torch.Tensor)) or min(key.ndim, value.ndim) < 2:
            continue
        a, b = key.shape[-2], value.shape[-2]
        if not (isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt)) or str(a) == str(b):
            continue
        before = f"{a} == {b}"
        if guard_or_false(a == b):  # a guard: from here on torch knows them as one symbol (never one on data)
            made.append(before)
    if made:
        logger.info("attention's key and value lengths guarded equal: %s", ", ".join(made))
    return made


def _example(node, index: int, name: str):
    arg = node.args[index] if len(node.args) > index else node.kwargs.get(name)
    return arg.meta.get("example_value") if hasattr(arg, "meta") else None
