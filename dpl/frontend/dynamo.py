"""The torch.compile backend: ``torch.compile(model, backend="dpl")``, or ``dpl.compile(model)``.

Partial support that never fails: dpl runs what it can translate and torch runs the rest, in
between, eagerly.

How a graph comes in. Dynamo gives the backend a torch-level FX graph of each piece of Python
it captured (a graph break gives several). AOTAutograd traces it to functional ATen with the
decompositions of the torch.export frontend (:func:`~dpl.frontend.torch_export.kept_decompositions`:
torch's default table minus the ops dpl translates; the composite ops dpl translates, such as
``linear`` and ``scaled_dot_product_attention``, are kept as written, the way
``run_decompositions`` keeps them), so the frontend's op table serves unchanged.

What runs where. The forward graph is partitioned by what the frontend can translate
(:mod:`dpl.frontend.dynamo_partition`); each partition worth a call is translated by the
frontend's ``GraphImporter``, rewritten and fused (``dpl.apply`` with ``patterns``: by default
every shipped library whose kernels the target can build) and built (``dpl.build``), then called
in the graph in place of its nodes (:class:`~dpl.frontend.dynamo_call.DplCall`). Whatever fails
on the way (an op without a translation, a size dpl cannot write, a failed build, an error at
run time) stays in torch, with the reason in the report (:mod:`dpl.frontend.dynamo_report`) and
a warning on the ``dpl`` logger for a failure; never an exception to the user.

Weights. Parameters and buffers are inputs of dynamo's graph; dpl builds them in as constants
(its patterns and constant folding need them), read where they lie, and checks at each call
that they are unchanged (see :mod:`dpl.frontend.dynamo_call`).

Shapes. Dynamo's symbolic sizes (``s27``) become dpl's symbolic dimensions of that name, and
its expressions of them (``2*s27``, ``(s27 - 1)//2``) dpl's dimension expressions
(:mod:`dpl.frontend.torch_dims`); one build serves every size dynamo's guards let through. A size
dpl cannot write, or an equality only torch's guards know (a flattened ``4*(h//2)**2`` that is
the weight's 64), sends the nodes that need it to torch, saying which. Attention's key and value
lengths, which dynamo may trace as two symbols (a decoder's key and value caches), are guarded
equal first (:mod:`dpl.frontend.dynamo_guards`).

Generation. ``model.forward = torch.compile(model.forward, backend="dpl")`` (or Hugging Face's
``generate(compile_config=CompileConfig(backend="dpl"))``) compiles a decoder's prefill and
decode steps: dynamo's graph takes the cache tensors as inputs and returns the new ones (the
dynamic cache's concatenations), and a static cache's in-place writes (``index_copy_``) come out
of AOTAutograd as functional copies that it writes back into the cache tensors after the call
(tests/test_generate.py, bench/bench_generate.py).

Autograd. With grad enabled and an input (a parameter, say) that requires grad, the graph runs
in torch as dynamo captured it, so gradients are torch's (logged once); under
``torch.no_grad()`` or ``torch.inference_mode()`` dpl runs the forward.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import re
from collections import Counter
from typing import Any, Sequence

import attrs

from dpl.errors import DplError
from dpl.frontend.dynamo_guards import equate_attention_lengths
from dpl.frontend.dynamo_report import GraphRecord, PartitionRecord, Report, count_ops
from dpl.frontend.torch_graph import GraphImporter, import_torch, sanitize
from dpl.ir import dims
from dpl.ir.dim_binding import undetermined
from dpl.ir.expr import Function, Var
from dpl.ir.types import TensorType

logger = logging.getLogger(__name__)

DEFAULT_TARGET = "cpu"  # the tensors this backend takes are CPU tensors
LIBRARY_ORDER = ("rewrites", "llm", "cublas", "cnn")  # the shipped libraries, in the order they apply

_REPORT = Report()  # every graph this process compiled
_GRAPHS = itertools.count()
_told_grad = False


@attrs.frozen
class Options:
    """The backend's options: ``patterns`` (libraries or ``.dpl`` files for ``dpl.apply``;
    None: :func:`default_patterns`), ``target`` (for ``dpl.build``), ``threads`` (the thread
    budget of each call), ``report`` (a :class:`Report` the graphs are added to)."""

    patterns: Any = None
    target: Any = None
    threads: int | None = None
    report: Report | None = None

    @classmethod
    def of(cls, given: dict) -> "Options":
        unknown = sorted(set(given) - {f.name for f in attrs.fields(cls)})
        if unknown:
            raise DplError(f"the dpl torch.compile backend has no option {', '.join(map(repr, unknown))}",
                           hint="it takes patterns, target and threads")
        return cls(**given)


def compile(model_or_fn, *, patterns=None, target=None, threads: int | None = None, dynamic: bool | None = None):
    """``torch.compile(model_or_fn, backend="dpl", dynamic=dynamic)`` with these options (see
    :class:`Options`). The result runs as torch.compile's does; its ``dpl_report`` attribute
    says, per graph compiled so far, what ran in dpl and what stayed in torch, and why."""
    torch = import_torch()
    report = Report()
    options = {"patterns": patterns, "target": target, "threads": threads, "report": report}
    compiled = torch.compile(model_or_fn, backend=backend, dynamic=dynamic, options=options)
    compiled.dpl_report = report
    return compiled


def reports() -> Report:
    """Every graph the backend compiled in this process (``torch.compile(m, backend="dpl")``)."""
    return _REPORT


def backend(gm, example_inputs: Sequence[Any], *, options: dict | None = None, mode: str | None = None, **more):
    """The torch.compile backend (registered as ``dpl`` by the ``torch_dynamo_backends`` entry
    point): dynamo's graph ``gm`` and its inputs in; a callable that runs it out. ``mode`` is
    inductor's (``"reduce-overhead"``: CUDA graphs), which Hugging Face's ``CompileConfig``
    passes to every backend; dpl has no modes and takes it without a change."""
    torch = import_torch()
    settings = Options.of({**(options or {}), **more})
    record = GraphRecord(next(_GRAPHS), _describe(gm, example_inputs))
    for report in {id(r): r for r in (_REPORT, settings.report) if r is not None}.values():
        report.add(record)
    if torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in example_inputs):
        _grad_in_torch(record, gm)
        return gm.forward
    try:
        equate_attention_lengths(gm)
        return _aot(gm, example_inputs, settings, record)
    except (torch._dynamo.exc.RestartAnalysis, torch._dynamo.exc.SkipFrame):
        for report in (_REPORT, settings.report):  # dynamo's own control flow (a scalar made a tensor): it traces again
            if report is not None and record in report.graphs:
                report.graphs.remove(record)
        raise
    except Exception as err:  # partial support never fails: the graph is torch's
        _whole_in_torch(record, gm, f"AOTAutograd could not trace it: {_first_line(err)}")
        return gm.forward


def default_patterns(target: Any = DEFAULT_TARGET) -> list[str]:
    """Every shipped library whose kernels ``target`` can build: one without a ``codegen``
    line, or whose codegen prefix an available backend of the target owns (``cublas`` only
    where CUDA is)."""
    from dpl.backends.registry import resolve_target
    from dpl.lang import shipped_libraries
    from dpl.lang.libraries import read_library

    prefixes = {p for b in resolve_target(target) if b.available()[0] for p in b.prefixes}
    shipped = shipped_libraries()
    names = [n for n in LIBRARY_ORDER if n in shipped] + [n for n in shipped if n not in LIBRARY_ORDER]
    chosen = []
    for name in names:
        found = re.search(r"^codegen\s+(\w+)", read_library(name)[0], re.M)
        if found is None or found.group(1) in prefixes:
            chosen.append(name)
    return chosen


# -- the graph -----------------------------------------------------------------------------------


def _convert_element_type(cx, a, dtype):
    return cx.cast(cx.tensor(a), cx.out_dtype)


def op_table() -> dict:
    """The frontend's table, and the prims AOTAutograd's decompositions leave where export's
    do not (a dynamic float scalar's cast)."""
    from dpl.frontend.torch_ops import ATEN_OPS

    return {**ATEN_OPS, "prims.convert_element_type.default": _convert_element_type}


def _aot(gm, example_inputs, settings: Options, record: GraphRecord):
    from torch._dynamo.backends.common import aot_autograd

    from dpl.frontend.torch_ops import ATEN_OPS

    weights = _weights_of(gm, example_inputs)

    def forward(fw_gm, _fw_inputs):
        placeholders = [n.name for n in fw_gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(weights):  # AOTAutograd added or merged inputs: bind no weight
            by_name = {}
        else:
            by_name = {p: w for p, w in zip(placeholders, weights) if w is not None}
        return _compile_forward(fw_gm, by_name, settings, record, _written_back())

    keep, decompositions = _keeping(ATEN_OPS)
    with keep:
        return aot_autograd(fw_compiler=forward, decompositions=decompositions)(gm, example_inputs)


def _written_back() -> list[tuple[int, int]]:
    """(output, input) positions of the forward graph whose output AOTAutograd copies into that
    input after the call (a data mutation of the input, its new value among the first outputs),
    read off the graph's metadata; none where this torch does not say."""
    try:
        from torch._guards import TracingContext

        meta = TracingContext.try_get().fw_metadata
        mutated = list(meta.mutated_inp_runtime_indices)
        infos = meta.input_info
    except Exception:  # noqa: BLE001 (another torch's private metadata: no input written in place)
        return []
    return [(m, i) for m, i in enumerate(mutated)
            if infos[i].mutates_data and not infos[i].mutates_metadata and not getattr(infos[i], "mutates_storage_metadata", False)]


def _in_place(fw_gm, part, tensor_at: list[int], written_back) -> list[tuple[int, int, int]]:
    """(output of the partition, input of its Executable, argument of its call) of each input
    AOTAutograd writes back from one of the partition's outputs, where nothing outside the
    partition reads the input (a torch node after the call would see the new values)."""
    placeholders = [n for n in fw_gm.graph.nodes if n.op == "placeholder"]
    (returned,) = [n.args[0] for n in fw_gm.graph.nodes if n.op == "output"]
    inside = set(part.nodes)
    found = []
    for m, i in written_back:
        if m >= len(returned) or i >= len(placeholders):
            continue
        node, given = returned[m], placeholders[i]
        if node in part.outputs and given in part.inputs and all(u in inside for u in given.users):
            arg = list(part.inputs).index(given)
            if arg in tensor_at:
                found.append((list(part.outputs).index(node), tensor_at.index(arg), arg))
    return found


def _keeping(table):
    """(a context in which AOTAutograd keeps the composite ops ``table`` translates, the
    decompositions of the rest): what ``ExportedProgram.run_decompositions`` does. Without
    torch's private helpers (another torch release), composite ops decompose."""
    from dpl.frontend.torch_export import kept_decompositions

    decompositions = kept_decompositions(table)
    try:
        from torch.export.exported_program import (
            _override_composite_implicit_decomp, _split_decomp_table_to_cia_and_python_decomp,
        )
    except ImportError:
        logger.info("this torch has no way to keep composite ops in AOTAutograd's graph; they decompose")
        return contextlib.nullcontext(), decompositions
    composite, python = _split_decomp_table_to_cia_and_python_decomp(decompositions)
    return _override_composite_implicit_decomp(composite), python


def _weights_of(gm, example_inputs) -> list:
    """Per input of dynamo's graph: ``(name, tensor)`` where it is a parameter or a buffer of
    the model (named like its state-dict key), else None."""
    torch = import_torch()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out = []
    for node, value in zip(placeholders, example_inputs):
        weight = isinstance(value, torch.nn.Parameter) or "_buffers_" in node.name
        out.append((_weight_name(node.name), value) if weight and isinstance(value, torch.Tensor) else None)
    return out if len(placeholders) == len(example_inputs) else [None] * len(example_inputs)


def _weight_name(name: str) -> str:
    """``l_self_modules_layers_modules_0_parameters_weight_`` -> ``layers_0_weight``."""
    text = re.sub(r"^l_(self_|fn_)?", "", name).rstrip("_")
    return sanitize(re.sub(r"(modules|parameters|buffers)_", "", text)) or name


def _compile_forward(fw_gm, weights: dict, settings: Options, record: GraphRecord, written_back=()):
    """AOTAutograd's forward compiler: ``fw_gm`` with each dpl partition in place of its nodes."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    try:
        with unset_fake_temporarily():  # AOTAutograd calls it in its fake mode; the weights are real
            return _partition(fw_gm, weights, settings, record, written_back)
    except Exception as err:  # a bug of dpl's: the graph is torch's, said loudly
        _whole_in_torch(record, fw_gm, f"dpl failed to partition it: {_first_line(err)}")
        return fw_gm


def _partition(fw_gm, weights: dict, settings: Options, record: GraphRecord, written_back=()):
    from dpl.apply import apply
    from dpl.frontend import dynamo_partition as dp
    from dpl.frontend.dynamo_call import DplCall
    from dpl.runtime import build

    torch = import_torch()
    target = settings.target or DEFAULT_TARGET
    patterns = default_patterns(target) if settings.patterns is None else settings.patterns
    table = op_table()
    parts, left = dp.propose(fw_gm, table, lambda sub: _translate(sub, weights, table))
    inside = {n for part in parts for n in part.nodes}
    record.parts.extend(_torch_records(fw_gm, inside, left, table))
    built = []
    for part in parts:
        name = f"dpl_{len(built)}" if not part.why else "torch"
        entry = PartitionRecord(name, "torch", part.ops, part.why, module=part.module)
        record.parts.append(entry)
        if part.why:
            continue
        try:
            fused = apply(part.module, patterns)
            exe = build(fused, target, threads=settings.threads, progress=None)
        except Exception as err:  # a build failing is a reason to stay in torch, not to fail
            entry.name, entry.why = "torch", f"dpl could not build it: {_first_line(err)}"
            logger.warning("a partition of graph %d (%d ops) stays in torch: %s", record.index, entry.op_count, entry.why)
            continue
        entry.runs = "dpl"
        entry.composites = dict(Counter(f.attrs["Composite"] for f in fused.functions.values() if "Composite" in f.attrs))
        placeholders = [n for n in part.sub.graph.nodes if n.op == "placeholder"]
        tensor_at = [i for i, n in enumerate(placeholders)
                     if n.name not in weights and isinstance(n.meta.get("val"), torch.Tensor)]
        bound = [(i, weights[n.name][0], weights[n.name][1]) for i, n in enumerate(placeholders) if n.name in weights]
        params = {p.name for p in part.module["main"].params}
        size_at = [i for i, symbol in _size_arguments(part.sub) if _carrier_name(symbol) in params]
        in_place = _in_place(fw_gm, part, tensor_at, written_back)
        built.append((part, DplCall(exe, part.sub, tensor_at, bound, entry, size_at, in_place)))
    record.parts.sort(key=lambda p: p.runs != "dpl")
    if not built:
        logger.info("%s", record.text())
        return fw_gm
    backup = torch.fx.GraphModule(fw_gm, copy.deepcopy(fw_gm.graph))
    try:
        moved: dict = {}
        for part, call in built:
            dp.install(fw_gm, part, call.record.name, call, moved)
        dp.finish(fw_gm)
    except Exception as err:
        for entry in record.parts:
            if entry.runs == "dpl":
                entry.to_torch(f"dpl failed to put its call in the graph: {_first_line(err)}")
        logger.warning("graph %d stays in torch: %s", record.index, _first_line(err))
        return backup
    logger.info("%s", record.text())
    return fw_gm


def _torch_records(gm, inside: set, left: dict, table) -> list[PartitionRecord]:
    """The ops outside every partition, grouped by why they stay in torch (sizes and checks,
    which are Python arithmetic rather than tensor ops, left out)."""
    from dpl.frontend.dynamo_partition import why_unsupported

    by_reason: dict[str, list] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node in inside:
            continue
        why = left.get(node) or why_unsupported(node, table)
        if why is None or why in ("computes a size, not a tensor", "a run-time check"):
            continue
        by_reason.setdefault(why, []).append(node)
    return [PartitionRecord("torch", "torch", count_ops(nodes), why) for why, nodes in by_reason.items() if count_ops(nodes)]


class _Importer(GraphImporter):
    """The frontend's importer, remembering the node it works on: a failure names it."""

    at = None

    def user_input(self, node) -> None:
        self.at = node
        super().user_input(node)

    def call_function(self, node) -> None:
        self.at = node
        super().call_function(node)

    def output(self, node):
        self.at = None
        return super().output(node)


def _translate(sub, weights: dict, table):
    from dpl.frontend.dynamo_partition import Untranslated

    names = {n.name for n in sub.graph.nodes if n.op == "placeholder"}
    importer = _Importer(sub, table, bind_params=True, dim_names={}, name="main",
                         weights={k: v for k, v in weights.items() if k in names})
    try:
        mod, _ = importer.run()
    except Exception as err:  # a FrontendError names what dpl cannot write; anything else is a bug, as torch's
        raise Untranslated(err.message if isinstance(err, DplError) else _first_line(err),
                           [importer.at] if importer.at is not None else []) from None
    mod = _with_size_carriers(mod, [symbol for _, symbol in _size_arguments(sub)])
    unbound = _symbols(mod["main"].ret.ty) - set().union(*(_symbols(p.ty) for p in mod["main"].params))
    if unbound:  # the nodes that make a tensor of a size argument (arange(s27)) go to torch, and their results come in
        makers = [n for n in sub.graph.nodes if n.op == "call_function" and any(_symbols_of(a) & unbound for a in n.all_input_nodes)]
        raise Untranslated(f"an output has size {', '.join(sorted(unbound))}, which no tensor input carries", makers)
    return mod


def _size_arguments(sub) -> list[tuple[int, str]]:
    """(placeholder position, symbol) of each size argument of ``sub`` that is one symbol of
    dynamo's (``s70``), the first of each symbol."""
    torch = import_torch()
    found: dict[str, int] = {}
    for i, node in enumerate(n for n in sub.graph.nodes if n.op == "placeholder"):
        value = node.meta.get("val")
        if isinstance(value, torch.SymInt) and value.node.expr.is_Symbol:
            found.setdefault(str(value.node.expr), i)
    return [(i, symbol) for symbol, i in found.items()]


def _carrier_name(symbol: str) -> str:
    return f"size_{symbol}"


def _with_size_carriers(mod, symbols: list[str]):
    """``mod`` with a parameter ``u8[s, 0]`` (no elements) for each size argument ``s`` in
    ``symbols`` that its values use and its tensor parameters do not determine (a chunk count
    ``(s + 3 * s % 4) // 4``, which a padded length of 8 gives for s = 5 to 8): the plan binds
    ``s`` from that parameter's shape, which :class:`~dpl.frontend.dynamo_call.DplCall` makes
    of the size argument at every call, and plans each value of it apart."""
    main = mod["main"]
    shapes = [p.ty.shape for p in main.params]
    determined = set().union(*(_symbols(p.ty) for p in main.params)) - set(undetermined(shapes))
    used = set().union(_symbols(main.ret.ty), *(_symbols(b.var.ty) for b in main.bindings))
    taken = {p.name for p in main.params} | {b.var.name for b in main.bindings}
    carriers = [Var(_carrier_name(s), TensorType((s, 0), "uint8")) for s in symbols
                if s in used - determined and _carrier_name(s) not in taken]
    if not carriers:
        return mod
    return mod.with_function(Function(main.name, (*main.params, *carriers), main.bindings, main.ret, main.attrs))


def _symbols_of(node) -> set[str]:
    """The symbols of a size argument (a SymInt placeholder), else none."""
    torch = import_torch()
    value = node.meta.get("val")
    if node.op != "placeholder" or not isinstance(value, torch.SymInt):
        return set()
    return {str(s) for s in value.node.expr.free_symbols}


def _symbols(ty) -> set[str]:
    fields = getattr(ty, "fields", None)
    if fields is not None:
        return set().union(*(_symbols(f) for f in fields))
    return set().union(*(dims.free_symbols(d) for d in getattr(ty, "shape", ())))


# -- whole graphs in torch -----------------------------------------------------------------------


def _grad_in_torch(record: GraphRecord, gm) -> None:
    global _told_grad
    record.note = "grad is enabled and an input requires grad: torch runs it, so gradients are torch's"
    record.parts.append(PartitionRecord("torch", "torch", count_ops(gm.graph.nodes), record.note))
    if not _told_grad:
        _told_grad = True
        logger.info("dpl runs inference only: with grad enabled and inputs that require grad, torch runs the graph "
                    "(call the model under torch.no_grad() or torch.inference_mode() to run it in dpl)")


def _whole_in_torch(record: GraphRecord, gm, why: str) -> None:
    record.note = why
    record.parts[:] = [PartitionRecord("torch", "torch", count_ops(gm.graph.nodes), why)]
    logger.warning("graph %d stays in torch: %s", record.index, why)


def _describe(gm, example_inputs) -> str:
    torch = import_torch()
    shown = []
    for node, value in zip([n for n in gm.graph.nodes if n.op == "placeholder"], example_inputs):
        if isinstance(value, torch.nn.Parameter) or "_buffers_" in node.name:
            continue
        meta = node.meta.get("example_value", value)
        if isinstance(meta, torch.Tensor):
            shown.append(f"{str(meta.dtype).removeprefix('torch.')}{list(meta.shape)}")
    return ", ".join(shown) or "no tensor input"


def _first_line(err: Exception) -> str:
    text = str(getattr(err, "message", None) or err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__
