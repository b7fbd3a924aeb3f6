"""The grouped matrix products of mixture-of-experts layers, for the torch.export table
(:mod:`dpl.frontend.torch_ops`, which imports this module).

transformers 5 computes experts with ``grouped_mm`` (``transformers.integrations.moe``): the
routed rows sorted by expert, one product per expert over its run of rows, the runs given by
``offs``, the cumulative row counts. On a CPU, and whenever torch.export traces it in float32,
that product is the custom op ``transformers::grouped_mm_fallback`` (torch's own
``_grouped_mm`` where it can run); both read ``input [S, K]``, ``weight [E, K, N]`` and
``offs [E]`` and give ``[S, N]``, zero in the rows past ``offs[-1]``.

dpl has no grouped product: each row's expert is the number of offsets at or below the row
(``sum(offs <= row)``), the expert's weight is gathered for the row (``take``, opaque as any
gather) and one batched product takes every row with its own weight. Rows past the last
offset belong to no expert and are zero, as in torch.
"""

from __future__ import annotations

from dpl.frontend.errors import FrontendError

# op overload -> translation; torch_ops merges this table into its own (the import goes that way)
TORCH_OPS: dict = {}


def _register(*names: str):
    def register(fn):
        for name in names:
            TORCH_OPS[name] = fn
        return fn

    return register


@_register("transformers.grouped_mm_fallback.default", "aten._grouped_mm.default")
def _grouped_mm(cx, input, weight, offs=None, bias=None, out_dtype=None):
    x, w = cx.tensor(input), cx.tensor(weight)
    if offs is None or bias is not None:
        raise FrontendError("a grouped product without offsets, or with a bias, has no dpl translation",
                            hint="dpl translates the 2-D input by 3-D weight form transformers' experts use")
    offs = cx.tensor(offs)
    if x.ty.ndim != 2 or w.ty.ndim != 3 or offs.ty.ndim != 1:
        raise FrontendError(f"a grouped product of {x.ty} by {w.ty} with offsets {offs.ty}: dpl translates the "
                            "[rows, K] by [experts, K, N] form with [experts] offsets")
    experts = w.ty.shape[0]
    rows = cx.call("arange", start=0, end=x.ty.shape[0], step=1, dtype=offs.ty.dtype)
    at_or_below = cx.call("less_equal", cx.call("expand_dims", offs, axis=[0]), cx.call("expand_dims", rows, axis=[1]))
    expert = cx.call("sum", cx.call("astype", at_or_below, dtype="int64"), axis=[1], keepdims=False)
    weights = cx.call("take", w, cx.call("minimum", expert, cx.scalar(experts - 1, "int64")), axis=0)
    product = cx.call("matmul", cx.call("expand_dims", cx.cast(x, w.ty.dtype), axis=[1]), weights)
    product = cx.call("squeeze", product, axis=[1])
    routed = cx.call("expand_dims", cx.call("less", expert, cx.scalar(experts, "int64")), axis=[1])
    return cx.cast(cx.call("where", routed, product, cx.scalar(0, w.ty.dtype)), cx.out_dtype)
