"""The torch.export frontend: ``dpl.from_torch(model, example_args)`` -> a dpl Module.

Which graph is translated, and why. ``torch.export.export`` gives the training IR: ATen ops as
the user wrote them (``aten.linear``, ``aten.softmax``, ``aten.silu``, ``aten.matmul``), but not
functional (``add_``, ``detach_`` may appear). ``run_decompositions()`` with torch's default
table gives core ATen: functional, but ``linear`` becomes ``view/mm/view`` with a flattened
``2*seq`` batch dimension that dpl's shapes cannot express, ``matmul`` becomes
``expand/clone/bmm`` and softmax ``_softmax``, so the importer would have to undo torch's work
before a pattern could claim it. We take the middle road: ``run_decompositions`` with torch's
table *minus every op this frontend translates* (:data:`dpl.frontend.torch_ops.ATEN_OPS`).
The graph is functional, the ops we know stay as the user wrote them (close to what TVM's own
frontend emits once its Relax ops are built), and an op we do not know is decomposed into core
ATen ops we may know (``hardswish`` -> ``clamp``/``mul``/``div``). Only an op with neither a
translation nor a decomposition into translated ops is an error.

Weights. By default (``bind_params=True``) parameters, buffers and lifted tensor constants
become named Constants (named after their state-dict keys), so the module runs with the user's
inputs alone: ``dpl.interpret(mod, x)``, ``dpl.build(mod, "cpu")(x)``; the fusion passes see
them as constants (``dpl.apply(..., bind_constants=True)`` keeps them inside composites). With
``bind_params=False`` they are parameters after the user inputs, and ``from_torch`` returns
``(module, weights)`` with the arrays by parameter name, in parameter order, for a caller that
loads weights separately from the graph. The arrays are read-only views of the model's tensors,
not copies (a large model is not held twice); only a weight that is laid out anew at import
(``linear``'s, stored transposed as ``<name>_t``) is a copy. Import again after changing the
model's weights.

Outputs. A model exported from a ``torch.nn.Module`` returns its tensors; any other object it
returns is dropped (a forward hook filters the output while torch.export traces): a Hugging
Face model called the stock way, ``model(input_ids)`` with ``use_cache`` at its default,
returns its key/value cache as a ``DynamicCache``, state for the next call rather than a value
of this one, which torch.export could not return anyway. The model's other outputs
(``last_hidden_state``, ``pooler_output``) are the function's results, flattened in order.

Symbolic shapes. A ``torch.export.Dim("seq")`` in ``dynamic_shapes`` becomes the symbolic
dimension ``"seq"`` of the dpl parameter (any other dynamic dimension keeps torch's symbol
name, ``s27``). Torch's bounds (``min``/``max``) have no place in dpl's types and are dropped.
A dimension that is an expression of symbols (``2*seq``, ``(n - 3)//2 + 1``, ``Min(n, 64)``) is
the same expression over the Dim names in dpl (:mod:`dpl.ir.dims`, via
:mod:`dpl.frontend.torch_dims`); a part no dim expression holds (a true division) is an error
naming it. Where torch cannot prove a guard on a named Dim ("Constraints
violated"), dpl exports again with that guard deferred to a runtime assert and proves it
itself, with a warning; a guard that does not hold over the Dim's range stays an error naming
the Dim and the guard (:mod:`dpl.frontend.torch_guards`).
"""

from __future__ import annotations

import inspect
import logging
import warnings
from typing import Any, Mapping, Sequence

from dpl.frontend.errors import FrontendError
from dpl.frontend.torch_graph import GraphImporter, import_torch, sanitize

logger = logging.getLogger(__name__)


def from_torch(model, example_args: Sequence[Any] = (), example_kwargs: Mapping[str, Any] | None = None, *,
               dynamic_shapes: Any = None, bind_params: bool = True, name: str = "main"):
    """Export ``model`` with ``torch.export.export`` and translate it into a dpl Module.

    ``model`` is a ``torch.nn.Module`` (exported on ``example_args``/``example_kwargs`` with
    ``dynamic_shapes``) or an already exported ``torch.export.ExportedProgram``. Returns the
    Module, or ``(module, weights)`` when ``bind_params=False`` (see the module docstring).
    ``main`` takes the tensor inputs in torch's flattened order and returns the outputs
    flattened the same way (one output bare, several as a tuple).
    """
    torch = import_torch()
    if isinstance(model, torch.export.ExportedProgram):
        program, dim_names = model, {}
    elif isinstance(model, torch.nn.Module):
        args = tuple(example_args) if isinstance(example_args, (tuple, list)) else (example_args,)
        kwargs = dict(example_kwargs or {})
        try:
            program = _export(torch, model, args, kwargs, dynamic_shapes)
        except Exception as err:  # torch reports many kinds of failure; the user needs its message
            program = _export_past_unproved_guards(torch, model, args, kwargs, dynamic_shapes, err)
        dim_names = _dim_names(model, args, kwargs, dynamic_shapes, program)
    else:
        raise FrontendError(f"from_torch takes a torch.nn.Module or a torch.export.ExportedProgram, got {type(model).__name__}")
    return from_exported_program(program, bind_params=bind_params, dim_names=dim_names, name=name)


def load_exported(path, *, name: str = "main"):
    """The Module of an ExportedProgram saved with ``torch.export.save`` (a ``.pt2`` file).
    Its symbolic dimensions keep torch's names (``s27``): the Dim names are not saved.

    A program whose inputs or outputs are a container class (a transformers model saved with
    ``return_dict=True`` returns a ``ModelOutput``) names that class in the file; torch reads
    it back only once the class is defined in this process, so the transformers module that
    defines it is imported first (:func:`_define_saved_containers`)."""
    import os

    torch = import_torch()
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FrontendError(f"no saved ExportedProgram at '{path}'")
    import zipfile

    if not zipfile.is_zipfile(path):  # torch would log a traceback before raising
        raise FrontendError(f"'{path}' is not a readable torch.export program: it is no zip archive",
                            hint="write it with torch.export.save(torch.export.export(model, args), path)")
    _define_saved_containers(torch, path)
    try:
        with warnings.catch_warnings():  # torch's own deprecations inside its loader, not the user's
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            program = torch.export.load(path)
    except Exception as err:  # a zip that is no .pt2, a version mismatch: torch's message says which
        raise FrontendError(f"'{path}' is not a readable torch.export program: {_first_line(err)}",
                            hint=f"torch {torch.__version__} could not read it back (its log above may say why); a "
                                 "program saved by another torch release may need saving again with this one") from None
    return from_exported_program(program, name=name)


def _saved_container_types(path: str) -> set[str]:
    """The container classes (pytree node types, as torch serialises their names) of the
    inputs and outputs of the programs saved in ``path``; empty when the file cannot say."""
    import json
    import zipfile

    names: set[str] = set()

    def walk(spec) -> None:
        if isinstance(spec, dict):
            if isinstance(spec.get("type"), str):
                names.add(spec["type"])
            for child in spec.get("children_spec") or ():
                walk(child)

    try:
        with zipfile.ZipFile(path) as archive:
            models = [n for n in archive.namelist() if "/models/" in n and n.endswith(".json")]
            for name in models:
                program = json.loads(archive.read(name))
                for entry in program.get("graph_module", {}).get("module_call_graph", ()):
                    signature = entry.get("signature") or {}
                    for key in ("in_spec", "out_spec"):
                        if isinstance(signature.get(key), str):
                            walk(json.loads(signature[key])[1])  # [protocol, spec]
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError, zipfile.BadZipFile):
        return set()  # torch's loader says what is wrong with the file
    return names


def _define_saved_containers(torch, path: str) -> None:
    """Make torch able to read back the containers ``path`` names: a transformers class is
    defined by importing its module (transformers registers each ``ModelOutput`` with torch's
    pytree as it is defined); any other class torch does not know is refused, saying which."""
    import importlib

    known = torch.utils._pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE
    unknown = sorted(name for name in _saved_container_types(path) if name not in known)
    for name in unknown:
        module = name.rpartition(".")[0]
        if name.split(".")[0] != "transformers" or not module:
            continue  # dpl imports only transformers' modules, never a module a file names
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise FrontendError(f"'{path}' returns (or takes) a {name}, which needs transformers to read back: {err}",
                                hint="pip install transformers, or export the model with return_dict=False "
                                     "(its outputs a tuple of tensors)") from None
    missing = [name for name in unknown if name not in known]
    if missing:
        raise FrontendError(f"'{path}' returns (or takes) {', '.join(missing)}, a container class torch does not know "
                            "in this process, so it cannot read the program back",
                            hint="export the model so it returns tensors or tuples of them (a transformers model: "
                                 "return_dict=False), or load it with dpl.load after importing the module that "
                                 "registers the class with torch.utils._pytree")


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _export(torch, model, args, kwargs, dynamic_shapes, *, defer_guards: bool = False):
    """``torch.export.export`` of ``model`` with its non-tensor outputs dropped (see
    :func:`tensor_outputs`), through a forward hook: the model keeps its signature, its
    parameter names and its module paths. ``defer_guards`` records the guards torch cannot
    prove as runtime asserts (see :func:`_export_past_unproved_guards`)."""
    handle = model.register_forward_hook(lambda _module, _args, output: tensor_outputs(torch, output))
    defer = {"prefer_deferred_runtime_asserts_over_guards": True} if defer_guards else {}
    try:
        return torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes, **defer)
    finally:
        handle.remove()


def _export_past_unproved_guards(torch, model, args, kwargs, dynamic_shapes, err):
    """After torch's "Constraints violated" on a named Dim, which a torch release may raise for
    a guard that holds over the Dim's whole range (torch 2.11 on transformers' grouped-query
    attention): export again with the guards torch cannot prove recorded as runtime asserts,
    and prove them dpl's way (:mod:`dpl.frontend.torch_guards`), which raises for one that does
    not hold. Any other failure is the user's to see, as torch reported it."""
    from dpl.frontend import torch_guards

    name = type(model).__name__
    if not torch_guards.is_constraint_violation(err):
        raise _export_failed(name, _first_line(err)) from err
    failed = _export_failed(name, torch_guards.violations(err), torch_guards.suggestion(err))
    try:
        program = _export(torch, model, args, kwargs, dynamic_shapes, defer_guards=True)
    except Exception as again:  # a range or an equality of Dims torch found wrong: its first error says which
        logger.debug("exporting %s with its guards deferred failed too: %s", name, _first_line(again))
        raise failed from err
    proved = torch_guards.check(program, dynamic_shapes, _named_axes(model, args, kwargs, dynamic_shapes, program), name, err)
    if not proved:  # the guard torch could not prove is nowhere dpl can find it
        raise failed from err
    torch_guards.drop_runtime_asserts(torch, program)
    logger.warning("torch %s could not prove a guard on the Dims of %s (%s); dpl proved it over the Dims' ranges "
                   "(%s) and exported with prefer_deferred_runtime_asserts_over_guards=True",
                   torch.__version__, name, torch_guards.violations(err), "; ".join(proved))
    return program


def _export_failed(name: str, why: str, hint: str | None = None) -> FrontendError:
    return FrontendError(f"torch.export.export failed on {name}: {why}",
                         hint=hint or "dpl imports what torch.export can export; see the torch error chained below")


def tensor_outputs(torch, output):
    """``output`` without the values torch.export cannot return and dpl could not compute: a
    Hugging Face model called the stock way (``use_cache`` at its default) returns its key/value
    cache as a ``DynamicCache`` object, which is state for the next call, not a tensor the graph
    computes. Tensors, numbers, None and the containers torch's pytree knows (tuples, lists,
    dicts, transformers' ``ModelOutput``) stay; any other object is dropped, and logged."""
    from collections.abc import Mapping

    pytree = torch.utils._pytree
    if output is None or isinstance(output, (torch.Tensor, bool, int, float, str)):
        return output
    if type(output) not in pytree.SUPPORTED_NODES:
        logger.info("dropped the model output of type %s: dpl returns the tensors a graph computes", type(output).__name__)
        return _DROPPED
    if isinstance(output, Mapping):
        kept = {k: tensor_outputs(torch, v) for k, v in output.items()}
        kept = {k: v for k, v in kept.items() if v is not _DROPPED}
        if len(kept) == len(output):
            return output
        try:
            return type(output)(**kept)
        except TypeError:
            return dict(kept)
    if isinstance(output, (tuple, list)) and not hasattr(output, "_fields"):
        kept = [tensor_outputs(torch, v) for v in output]
        kept = [v for v in kept if v is not _DROPPED]
        return output if len(kept) == len(output) else type(output)(kept)
    return output


_DROPPED = object()


def from_exported_program(program, *, bind_params: bool = True, dim_names: Mapping[str, str] | None = None, name: str = "main"):
    """Translate an ExportedProgram (see :func:`from_torch`). ``dim_names`` renames torch's
    shape symbols (``{"s27": "seq"}``)."""
    from dpl.frontend.torch_ops import ATEN_OPS

    program = _functional(program, ATEN_OPS)
    importer = GraphImporter(program, ATEN_OPS, bind_params=bind_params, dim_names=dict(dim_names or {}), name=name)
    mod, weights = importer.run()
    return mod if bind_params else (mod, weights)


def _functional(program, table):
    """Functional ATen, with only the ops ``table`` does not translate decomposed. A program
    whose every op the table translates already (no in-place op, no higher-order op) is
    returned as it is: torch's decomposition pass retraces the whole program, most of an
    import's time (bench/bench_zoo_import.py)."""
    from dpl.frontend import torch_guards

    torch = import_torch()
    if _translated_as_is(program, table):
        return program
    decompositions = kept_decompositions(table)
    had_asserts = any(str(node.target) in torch_guards.ASSERT_OPS for node in program.graph.nodes)
    try:
        with warnings.catch_warnings():  # torch's own deprecations (its TreeSpec copies), not the user's
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            decomposed = program.run_decompositions(decompositions)
    except Exception as err:
        raise FrontendError(f"torch could not decompose the exported program: {str(err).strip().splitlines()[0]}") from err
    if not had_asserts:  # the retrace inserts again the asserts dpl proved and took out (_export_past_unproved_guards)
        torch_guards.drop_runtime_asserts(torch, decomposed)
    return decomposed


def kept_decompositions(table):
    """torch's default decomposition table without the ops ``table`` translates: what is left
    decomposes into core ATen, and the ops dpl knows stay as the user wrote them (the module
    docstring; the torch.compile backend, :mod:`dpl.frontend.dynamo`, decomposes the same way)."""
    decompositions = import_torch().export.default_decompositions()
    for op in list(decompositions.keys()):
        if str(op) in table:
            decompositions.pop(op)
    return decompositions


def _translated_as_is(program, table) -> bool:
    import operator

    from dpl.frontend.torch_graph import IGNORED_OPS

    torch = import_torch()
    for node in program.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op != "call_function":
            return False  # get_attr of a submodule: a higher-order op's body
        if node.target is operator.getitem or str(node.target) in IGNORED_OPS:
            continue
        if isinstance(node.target, torch._ops.OpOverload) and str(node.target) in table:
            continue
        if isinstance(node.meta.get("val"), torch.SymInt) and "sym_size" in str(node.target):
            continue
        return False
    return True


# -- names of symbolic dimensions ---------------------------------------------------------------


def _dim_names(model, args, kwargs, dynamic_shapes, program) -> dict[str, str]:
    """torch's shape symbols -> the names of the ``torch.export.Dim`` objects the user gave (of
    the root Dim, for a derived one such as ``4 * k``, whose axis torch sizes ``4*s6``)."""
    torch = import_torch()
    names: dict[str, str] = {}
    for dim, size in _named_axes(model, args, kwargs, dynamic_shapes, program):
        if not isinstance(size, torch.SymInt):
            continue
        expr, root = size.node.expr, getattr(dim, "root", None)
        if expr.is_Symbol:
            names.setdefault(str(expr), sanitize(dim.__name__))
        elif root is not None and len(expr.free_symbols) == 1 and getattr(root, "__name__", None):
            names.setdefault(str(next(iter(expr.free_symbols))), sanitize(root.__name__))
    return names


def _named_axes(model, args, kwargs, dynamic_shapes, program) -> list[tuple[Any, Any]]:
    """``(Dim, size)`` for every input axis the user gave a named ``torch.export.Dim``: the
    size is the program's (a SymInt, or an int where torch specialised it)."""
    if dynamic_shapes is None:
        return []
    try:
        bound = inspect.signature(model.forward).bind(*args, **kwargs)
        values = dict(bound.arguments)
    except (TypeError, ValueError):
        return []
    if isinstance(dynamic_shapes, Mapping):
        specs = [(values.get(key), spec) for key, spec in dynamic_shapes.items()]
    else:
        specs = list(zip(list(args) + list(kwargs.values()), dynamic_shapes))
    torch = import_torch()
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    user_nodes = [placeholders[s.arg.name] for s in program.graph_signature.input_specs
                  if s.kind.name == "USER_INPUT" and s.arg.name in placeholders]
    leaves = [v for v in torch.utils._pytree.tree_leaves((args, kwargs))]
    axes: list[tuple[Any, Any]] = []
    for value, spec in specs:
        if not isinstance(value, torch.Tensor) or spec is None:
            continue
        index = next((i for i, leaf in enumerate(leaves) if leaf is value), None)
        if index is None or index >= len(user_nodes):
            continue
        shape = user_nodes[index].meta["val"].shape
        for axis, dim in (spec.items() if isinstance(spec, Mapping) else enumerate(spec)):
            if getattr(dim, "__name__", None) is None or not isinstance(axis, int) or not -len(shape) <= axis < len(shape):
                continue
            axes.append((dim, shape[axis]))
    return axes
