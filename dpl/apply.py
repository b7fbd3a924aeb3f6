"""``dpl.apply``: the one call that runs the whole flow on a module.

    rewrites (.dpl ``rewrite`` rules, to a fixed point)
      -> constant folding (bindings over bound weights computed once, as TVM's FoldConstant)
      -> merged products (q/k/v, gate/up: one wider product over concatenated constant weights,
         each branch a slice of it)
      -> splits as slices (a split whose items are taken one by one: one strided_slice per item,
         so each joins its consumer's group)
      -> FuseOpsByPattern (fusion patterns in priority order, Composite functions,
         optionally wrapped in Codegen functions)
      -> automatic fusion (FuseOps) of whatever no pattern claimed, views joining groups
         (``fuse_ops(..., views=True)``; ``views=False`` is TVM's grouping exactly)

Each step is a named pass of :mod:`dpl.pipeline`; the switches mirror TT-XLA's options so a user
can bisect a problem, ``pipeline=`` gives the list outright, and ``trace`` collects every
decision. Applying ``dpl.apply`` to its own output changes nothing.
"""

from __future__ import annotations

import os
from typing import Sequence, Union

from dpl.errors import DplError
from dpl.ir.expr import Module
from dpl.pattern.fusion import FusionPattern, PatternSet
from dpl.pipeline import PassContext, PassInstrument, PipelineLike, as_pipeline, default_pipeline, run_pipeline
from dpl.trace import Trace

PatternsLike = Union[PatternSet, FusionPattern, str, os.PathLike, Sequence["PatternsLike"]]


def as_pattern_set(patterns: PatternsLike) -> PatternSet:
    """A PatternSet from a set, a path, a shipped library name, a FusionPattern, or a list of
    these (earlier entries take priority)."""
    if isinstance(patterns, PatternSet):
        return patterns
    if isinstance(patterns, FusionPattern):
        return PatternSet((patterns,))
    if isinstance(patterns, (str, os.PathLike)):
        from dpl.lang import load_patterns

        return load_patterns(os.fspath(patterns))
    if isinstance(patterns, Sequence):
        # consecutive files and library names load together, so a rule's ``priority N`` orders
        # it across them (cublas.matmul_bias_act ahead of llm's kernel.gelu), as in ``dpl fuse``
        result, files = PatternSet(), []
        for item in [*patterns, None]:
            if isinstance(item, (str, os.PathLike)):
                files.append(os.fspath(item))
                continue
            if files:
                from dpl.lang import load_patterns

                result, files = result + load_patterns(files), []
            if item is not None:
                result = result + as_pattern_set(item)
        return result
    raise DplError(f"patterns must be a PatternSet, a FusionPattern, a .dpl path, a library name or a list of these, got {type(patterns).__name__}")


def apply(mod: Module, patterns: PatternsLike = (), *, rewrites: bool = True, composites: bool = True,
          annotate_codegen: bool = True, fuse: bool = True, bind_constants: bool = True, allow_leaks: bool = False,
          fuse_reductions: bool = False, fold: bool = True, merge_products: bool = True, split_slices: bool = True,
          views: bool = True, multi_output: bool = True, rematerialize: bool = True, convert_layout: bool = False,
          trace: Trace | None = None, pipeline: PipelineLike | None = None,
          instruments: Sequence[PassInstrument] = ()) -> Module:
    """Rewrite, fuse by pattern, then fuse the rest automatically (see the module docstring).
    The switches choose the passes of :func:`dpl.pipeline.default_pipeline`; ``pipeline``
    replaces that list (passes, their names, or the text form ``"rewrites,fold,by-pattern,
    fuse-ops{views=false}"``), and ``instruments`` see every pass (``dpl.pipeline.PassTimings``).
    ``views`` (on here, off in ``fuse_ops`` itself): reshapes, squeezes and expand_dims move no
    data and never break an automatic group, symbolic shapes included; ``views=False`` gives
    TVM's grouping exactly. ``multi_output`` (on here, off in ``fuse_ops``): a lone op at most
    injective joins the group that computes what it reads, as one more output of it (a
    decoder's ``where`` over the attention mask); ``multi_output=False`` leaves it alone, as TVM.
    ``rematerialize`` (on here, off in ``fuse_ops``): an op that reads no tensor (T5's
    ``arange``), read by several groups, is computed in each of them. ``convert_layout`` (off by
    default): NCHW convolutions and what lies between them channels-last (NHWC), before ``fold``
    (dpl/transform/convert_layout.py)."""
    if not isinstance(mod, Module):
        raise DplError(f"dpl.apply takes a Module, got {type(mod).__name__}")
    patterns = as_pattern_set(patterns)
    if pipeline is None:
        passes = default_pipeline(rewrites=rewrites, fold=fold, merge_products=merge_products, split_slices=split_slices,
                                  composites=composites, fuse=fuse, bind_constants=bind_constants,
                                  annotate_codegen=annotate_codegen, allow_leaks=allow_leaks, fuse_reductions=fuse_reductions,
                                  views=views, multi_output=multi_output, rematerialize=rematerialize,
                                  convert_layout=convert_layout)
    else:
        passes = as_pipeline(pipeline)
    return run_pipeline(mod, passes, PassContext(patterns, trace, tuple(instruments)))
