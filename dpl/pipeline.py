"""The flow of ``dpl.apply`` as data: a list of named passes, each a Module -> Module step.

    rewrites, [convert-layout,] fold, merge-products, split-slices, by-pattern, fuse-ops

:func:`default_pipeline` builds that list from ``dpl.apply``'s switches; a user may pass their
own list (or the default, edited) as ``dpl.apply(mod, patterns, pipeline=...)``, or its text
form, ``"rewrites,fold,by-pattern,fuse-ops{views=false}"`` (options in braces, as xDSL's
pipelines and MLIR's pass options spell them). Every pass runs under one :class:`PassContext`
(the patterns, the trace, the instruments): an instrument sees each pass before and after it
runs, and :class:`PassTimings` is the one that ``dpl fuse --time-passes`` prints.

Passes never change their input module (each returns a new one, or the same object when it had
nothing to do), so a pipeline can be cut and re-run at any point.
"""

from __future__ import annotations

import difflib
import re
import time
from typing import ClassVar, Sequence, Union

import attrs

from dpl.errors import DplError
from dpl.ir.collector import paused_collector
from dpl.ir.expr import Module
from dpl.pattern.fusion import PatternSet
from dpl.trace import Trace, rewrite_events
from dpl.transform.convert_layout import convert_layout
from dpl.transform.fold_constants import fold_constants
from dpl.transform.fuse_by_pattern import fuse_ops_by_pattern
from dpl.transform.fuse_ops import fuse_ops
from dpl.transform.merge_products import merge_products
from dpl.transform.split_slices import split_slices


class PassInstrument:
    """Told about every pass of a run: override either method (TVM's ``PassInstrument``)."""

    def before(self, pass_: "Pass", mod: Module) -> None:
        pass

    def after(self, pass_: "Pass", mod: Module, result: Module, seconds: float) -> None:
        pass


@attrs.define
class PassTimings(PassInstrument):
    """The wall time of each pass, in the order they ran, and a table of them."""

    rows: list[tuple[str, float, bool]] = attrs.field(factory=list)  # (pass, seconds, changed the module)

    def after(self, pass_, mod, result, seconds) -> None:
        self.rows.append((pass_.text(), seconds, result is not mod))

    def table(self) -> str:
        total = sum(s for _, s, _ in self.rows) or 1e-12
        width = max([len("pass"), *(len(name) for name, _, _ in self.rows)])
        lines = [f"{'pass':<{width}}  {'ms':>9}  {'share':>6}  changed"]
        lines += [f"{name:<{width}}  {s * 1e3:9.3f}  {s / total:6.1%}  {'yes' if changed else 'no'}"
                  for name, s, changed in self.rows]
        lines.append(f"{'total':<{width}}  {total * 1e3:9.3f}")
        return "\n".join(lines)


@attrs.define
class PassContext:
    """What every pass of one run shares: the rules, the trace (or None) and the instruments."""

    patterns: PatternSet = attrs.field(factory=PatternSet)
    trace: Trace | None = None
    instruments: Sequence[PassInstrument] = ()


@attrs.frozen
class Pass:
    """One step of a pipeline. Subclasses set ``name`` (the text form's word) and ``fuses``
    (whether it groups bindings into functions: the trace's ``rewritten`` module is the one
    the first such pass starts from), and implement :meth:`run`. Their attrs fields are the
    pass's options."""

    name: ClassVar[str] = ""
    fuses: ClassVar[bool] = False

    def run(self, mod: Module, ctx: PassContext) -> Module:
        raise NotImplementedError

    def text(self) -> str:
        """The pass in the text form, with the options that differ from their defaults."""
        changed = [f"{f.name.replace('_', '-')}={_word(getattr(self, f.name))}" for f in attrs.fields(type(self))
                   if getattr(self, f.name) != f.default]
        return self.name + (f"{{{','.join(changed)}}}" if changed else "")


@attrs.frozen
class Rewrites(Pass):
    """The patterns' ``rewrite`` rules, each to its fixed point, in priority order."""

    name: ClassVar[str] = "rewrites"

    def run(self, mod, ctx):
        if not ctx.patterns.rewrites:
            return mod
        if ctx.trace is None:
            return ctx.patterns.apply_rewrites(mod)
        for rule in ctx.patterns.rewrites:  # the same rules in the same order, each one's changes recorded
            new = rule.apply(mod)
            if new is not mod:
                ctx.trace.rewrites.extend(rewrite_events(rule.name, rule.origin, mod, new))
            mod = new
        return mod


@attrs.frozen
class ConvertLayout(Pass):
    """NCHW convolutions, and what lies between them, channels-last (TVM's ConvertLayout):
    permutes only where a chain starts and where its values leave it, constants transposed."""

    name: ClassVar[str] = "convert-layout"
    layout: str = "NHWC"

    def run(self, mod, ctx):
        return convert_layout(mod, self.layout)


@attrs.frozen
class Fold(Pass):
    """Bindings over bound weights computed once (TVM's FoldConstant)."""

    name: ClassVar[str] = "fold"

    def run(self, mod, ctx):
        return fold_constants(mod)


@attrs.frozen
class MergeProducts(Pass):
    """Parallel products of one input (q/k/v, gate/up) as one wider product over concatenated
    constant weights, each branch a slice of it."""

    name: ClassVar[str] = "merge-products"

    def run(self, mod, ctx):
        return merge_products(mod)


@attrs.frozen
class SplitSlices(Pass):
    """A split whose items are taken one by one as one strided_slice per item, so each joins
    its consumer's group."""

    name: ClassVar[str] = "split-slices"

    def run(self, mod, ctx):
        return split_slices(mod)


@attrs.frozen
class ByPattern(Pass):
    """FuseOpsByPattern: the fusion patterns in priority order, as Composite functions, wrapped
    in Codegen functions unless ``annotate_codegen`` is off."""

    name: ClassVar[str] = "by-pattern"
    fuses: ClassVar[bool] = True
    bind_constants: bool = True
    annotate_codegen: bool = True
    allow_leaks: bool = False

    def run(self, mod, ctx):
        if not ctx.patterns.patterns:
            return mod
        return fuse_ops_by_pattern(mod, ctx.patterns.patterns, bind_constants=self.bind_constants,
                                   annotate_codegen=self.annotate_codegen, allow_leaks=self.allow_leaks, trace=ctx.trace)


@attrs.frozen
class FuseOpsPass(Pass):
    """FuseOps: automatic fusion of what no pattern claimed. ``views``, ``multi_output`` and
    ``rematerialize`` go beyond TVM (see ``dpl.apply``); all three off is TVM's grouping."""

    name: ClassVar[str] = "fuse-ops"
    fuses: ClassVar[bool] = True
    fuse_reductions: bool = False
    views: bool = True
    multi_output: bool = True
    rematerialize: bool = True

    def run(self, mod, ctx):
        return fuse_ops(mod, fuse_reductions=self.fuse_reductions, views=self.views, multi_output=self.multi_output,
                        rematerialize=self.rematerialize)


PASSES: dict[str, type[Pass]] = {p.name: p for p in (Rewrites, ConvertLayout, Fold, MergeProducts, SplitSlices, ByPattern,
                                                      FuseOpsPass)}

PipelineLike = Union[str, Sequence[Union[Pass, str]]]


def default_pipeline(*, rewrites: bool = True, fold: bool = True, merge_products: bool = True, split_slices: bool = True,
                     composites: bool = True, fuse: bool = True, bind_constants: bool = True, annotate_codegen: bool = True,
                     allow_leaks: bool = False, fuse_reductions: bool = False, views: bool = True, multi_output: bool = True,
                     rematerialize: bool = True, convert_layout: bool = False) -> list[Pass]:
    """The passes ``dpl.apply`` runs for these switches (its keywords), in order."""
    steps: list[tuple[bool, Pass]] = [
        (rewrites, Rewrites()), (convert_layout, ConvertLayout()), (fold, Fold()), (merge_products, MergeProducts()), (split_slices, SplitSlices()),
        (composites, ByPattern(bind_constants=bind_constants, annotate_codegen=annotate_codegen, allow_leaks=allow_leaks)),
        (fuse, FuseOpsPass(fuse_reductions=fuse_reductions, views=views, multi_output=multi_output, rematerialize=rematerialize)),
    ]
    return [p for on, p in steps if on]


_ITEM = re.compile(r"\s*([a-z][a-z-]*)\s*(?:\{([^{}]*)\})?\s*(?:,|$)")


def parse_pipeline(text: str) -> list[Pass]:
    """The passes of a pipeline's text form: names separated by commas, each with options in
    braces (``fuse-ops{views=false,fuse-reductions=true}``)."""
    passes, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _ITEM.match(text, pos)
        if m is None or m.end() == pos:
            raise DplError(f"cannot read the pipeline {text!r} at column {pos + 1}",
                           hint=f"write pass names separated by commas, options in braces: {_example()}")
        passes.append(make_pass(m.group(1), _options(m.group(1), m.group(2) or "")))
        pos = m.end()
    if not passes:
        raise DplError("the pipeline names no pass", hint=f"e.g. {_example()}")
    return passes


def make_pass(name: str, options: dict | None = None) -> Pass:
    """The pass called ``name`` (its text-form word), with ``options`` (attrs field names)."""
    cls = PASSES.get(name)
    if cls is None:
        close = difflib.get_close_matches(name, list(PASSES), n=1)
        guess = f"; did you mean {close[0]!r}?" if close else ""
        raise DplError(f"unknown pass {name!r}{guess}", hint=f"the passes: {', '.join(PASSES)}")
    fields = {f.name: f for f in attrs.fields(cls)}
    for key, value in (options or {}).items():
        if key not in fields:
            known = ", ".join(k.replace("_", "-") for k in fields) or "none"
            raise DplError(f"pass {name!r} has no option {key.replace('_', '-')!r}", hint=f"its options: {known}")
        want = type(fields[key].default)
        if not isinstance(value, want):
            spelled = "true or false" if want is bool else "a word"
            raise DplError(f"option {key.replace('_', '-')!r} of pass {name!r} takes {spelled}, got {_word(value)!r}")
    return cls(**(options or {}))


_WORD = re.compile(r"[A-Za-z0-9_]+")


def _options(name: str, text: str) -> dict:
    """KEY=true, KEY=false (booleans) and KEY=WORD (strings: ``convert-layout{layout=NHWC}``)."""
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, eq, value = item.partition("=")
        value = value.strip()
        if not eq or not _WORD.fullmatch(value):
            raise DplError(f"cannot read the option {item!r} of pass {name!r}", hint="options are KEY=true, KEY=false or KEY=WORD")
        out[key.strip().replace("-", "_")] = value.lower() == "true" if value.lower() in ("true", "false") else value
    return out


def _word(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _example() -> str:
    return ",".join(p.text() for p in default_pipeline())


def as_pipeline(pipeline: PipelineLike) -> list[Pass]:
    """A list of passes from a list (of passes or their names) or the text form."""
    if isinstance(pipeline, str):
        return parse_pipeline(pipeline)
    out = []
    for item in pipeline:
        if isinstance(item, Pass):
            out.append(item)
        elif isinstance(item, str):
            out.extend(parse_pipeline(item))
        else:
            raise DplError(f"a pipeline holds passes or their names, got {type(item).__name__}")
    return out


def run_pipeline(mod: Module, passes: Sequence[Pass], ctx: PassContext) -> Module:
    """Run ``passes`` over ``mod`` in order, each seen by ``ctx``'s instruments; the trace (if
    any) records the source, the module the first fusing pass started from, and the result."""
    trace = ctx.trace
    if trace is not None:
        trace.source, trace.patterns, trace.rewritten = mod, ctx.patterns, None
    with paused_collector():  # once around every pass, not only within each (see dpl.ir.collector)
        for p in passes:
            if trace is not None and p.fuses and trace.rewritten is None:
                trace.rewritten = mod  # what the fusion passes start from
            for inst in ctx.instruments:
                inst.before(p, mod)
            start = time.perf_counter()
            result = p.run(mod, ctx)
            seconds = time.perf_counter() - start
            for inst in ctx.instruments:
                inst.after(p, mod, result, seconds)
            mod = result
    if trace is not None:
        if trace.rewritten is None:
            trace.rewritten = mod
        trace.result = mod
    return mod

