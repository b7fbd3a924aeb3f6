"""The grouped matrix products of mixture-of-experts layers, for the torch.export table
(:mod:`dpl.frontend.torch_ops`, which imports this module).

transformers 5 computes experts with ``grouped_mm`` (``transformers.integrations.moe``): the
routed rows sorted by expert, one product per expert over its run of rows, the runs given by
``offs``, the cumulative row counts. On a CPU, and whenever torch.export traces it in float32,
that product is the custom op ``transformers::grouped_mm_fallback`` (torch's own
``_grouped_mm`` where it can run); both read ``input [S, K]``, ``weight [E, K, N]`` and
``offs [E]`` and give ``[S, N]``, zero in the rows past ``offs[-1]``.

Both translate to dpl's ``grouped_matmul`` (dpl/ops/experts.py), which multiplies each
expert's run of rows by its weight: no per-row copy of the weights (``S * K * N`` of them).
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
    return cx.cast(cx.call("grouped_matmul", cx.cast(x, w.ty.dtype), w, offs), cx.out_dtype)
