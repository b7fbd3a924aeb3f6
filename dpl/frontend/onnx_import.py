"""Import an ONNX model as a dpl :class:`~dpl.ir.Module`: ``dpl.from_onnx(model_or_path)``.

The model is checked (``onnx.checker``), its input shapes are overridden where the caller asks,
and the nodes (already in topological order in a valid model) are translated one by one through
the op table of :mod:`dpl.frontend.onnx_ops`. Initializers become constants, or parameters after
the graph inputs with ``keep_params_as_inputs=True``; symbolic input dimensions (``dim_param``)
become dpl symbolic dimensions. Every output's dpl type must agree with the type the model
declares for it (its outputs, the exporter's ``value_info``). Then ONNX shape inference gives a
second opinion on the rest, as warnings: it runs after translation because dpl validates
attributes first, and ONNX's shape functions crash the process on some invalid ones (a Conv
with stride 0).

onnx is imported only when a model is imported: ``import dpl`` never loads it.
"""

from __future__ import annotations

import difflib
import os
import re
import warnings
from typing import Any, Mapping, Sequence

import numpy as np

from dpl.errors import DplError
from dpl.frontend.errors import FrontendError, short_path, unsupported_ops
from dpl.ir.builder import FunctionBuilder
from dpl.ir.expr import Call, Constant, Expr, Function, Module, Tuple, TupleGetItem, Var, replace
from dpl.ir.types import TensorType

# words the text form reserves; a name that sanitises to one of them gets a trailing underscore
_RESERVED = {"func", "return", "const", "true", "false", "none", "inf", "nan",
             "f64", "f32", "f16", "bf16", "i64", "i32", "i16", "i8", "u8", "bool"}


def from_onnx(model: Any, *, shapes: Mapping[str, Sequence[int | str]] | None = None,
              keep_params_as_inputs: bool = False, entry: str = "main") -> Module:
    """Translate an ONNX model (a ``ModelProto`` or a path to a ``.onnx`` file) into a Module
    whose function ``entry`` takes the graph inputs in order.

    ``shapes`` overrides input shapes by input name (ints, or names for symbolic dimensions).
    With ``keep_params_as_inputs`` each initializer of more than one element is a parameter after
    the inputs (:func:`onnx_params` gives their values); scalars stay constants, since epsilons,
    exponents and scales are part of the program the rewrites read.
    """
    onnx = _import_onnx()
    model, weights = _prepare(onnx, _load(onnx, model), shapes)
    importer = _GraphImporter(onnx, model, weights, keep_params_as_inputs)
    mod = importer.run(entry)
    importer.compare_with_shape_inference()
    return mod


def onnx_params(model: Any, mod: Module, entry: str = "main") -> list[np.ndarray]:
    """The values of the parameters ``from_onnx(model, keep_params_as_inputs=True)`` added after
    the graph inputs of ``mod[entry]``, in order: ``dpl.interpret(mod, *inputs, *params)``."""
    onnx = _import_onnx()
    model = _load(onnx, model)
    graph = model.graph
    names = _Names()
    inits = {t.name: t for t in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in inits]
    for name in inputs:
        names.claim(name)
    by_param = {names.claim(t.name): t for t in graph.initializer}
    from dpl.frontend.onnx_node import tensor_to_array

    out = []
    for p in mod[entry].params[len(inputs):]:
        if p.name not in by_param:
            raise FrontendError(f"parameter '{p.name}' of '{entry}' is no initializer of this model")
        out.append(tensor_to_array(by_param[p.name], f"initializer '{by_param[p.name].name}'"))
    return out


# -- loading and preparing --------------------------------------------------------------------


def _import_onnx():
    try:
        import onnx
    except ImportError:
        raise FrontendError("importing ONNX models needs the 'onnx' package", hint="pip install 'dpl[onnx]'") from None
    return onnx


def _load(onnx, model: Any):
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (str, os.PathLike)):
        try:
            return onnx.load(os.fspath(model))
        except FileNotFoundError:
            raise FrontendError(f"no ONNX model at '{os.fspath(model)}'") from None
        except Exception as err:  # protobuf's decode errors have no common base worth naming
            raise FrontendError(f"'{os.fspath(model)}' is not a readable ONNX model: {err}") from None
    raise FrontendError(f"from_onnx takes an onnx.ModelProto or a path, got {type(model).__name__}")


# initializers up to this many elements stay in the skeleton: shape inference reads their values
_SKELETON_ELEMENTS = 64

# what marks a dim_param as an expression rather than a name ("seq-len" is a name; sympy writes
# "n - 1" with spaces)
_DIM_EXPRESSION = re.compile(r"[*/%()+]| - ")


def _prepare(onnx, model, shapes):
    """The model's skeleton, checked, with ``shapes`` applied and local functions inlined, and its
    initializers by name. The skeleton has every node and the small initializers; the large ones
    are only declared, so the checker and shape inference never copy or serialise the weights
    (and a model past protobuf's 2 GB limit still imports). The caller's model is not changed."""
    weights = {t.name: t for t in model.graph.initializer}
    light = _skeleton(onnx, model)
    try:
        onnx.checker.check_model(light)
    except Exception as err:  # ValidationError, or ValueError for some malformed protos
        raise FrontendError(f"the model is not valid ONNX: {_first_line(err)}") from None
    if shapes:
        _override_shapes(light.graph, shapes, weights)
    if light.functions:
        if not hasattr(onnx, "inliner"):
            raise FrontendError("the model has local functions, and inlining them needs onnx >= 1.16")
        light = onnx.inliner.inline_local_functions(light)
    return light, weights


def _skeleton(onnx, model):
    light = onnx.ModelProto(ir_version=model.ir_version)
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph, source = light.graph, model.graph
    graph.name = source.name
    for field in ("node", "input", "output", "value_info", "sparse_initializer"):
        getattr(graph, field).extend(getattr(source, field))
    declared = {i.name for i in source.input}
    for t in source.initializer:
        if int(np.prod(t.dims)) <= _SKELETON_ELEMENTS:
            graph.initializer.append(t)
        elif t.name not in declared:
            graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return light


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _override_shapes(graph, shapes: Mapping[str, Sequence[int | str]], weights) -> None:
    inputs = {i.name: i for i in graph.input if i.name not in weights}
    for name, dims in shapes.items():
        if name not in inputs:
            raise FrontendError(f"shapes= names '{name}', which is no input of the graph (inputs: {', '.join(inputs) or 'none'})")
        tensor = inputs[name].type.tensor_type
        dims = list(dims)
        if tensor.HasField("shape") and len(tensor.shape.dim) != len(dims):
            raise FrontendError(f"shapes['{name}'] = {dims} has rank {len(dims)}, but the model declares rank {len(tensor.shape.dim)}")
        old = list(tensor.shape.dim) if tensor.HasField("shape") else [None] * len(dims)
        for axis, (d, was) in enumerate(zip(dims, old)):
            fixed = was is not None and was.HasField("dim_value")
            if isinstance(d, bool) or not isinstance(d, (int, str)) or (isinstance(d, int) and d < 0):
                raise FrontendError(f"shapes['{name}'] dimension {axis} must be a size or a symbolic name, got {d!r}")
            if fixed and d != was.dim_value:
                raise FrontendError(f"shapes['{name}'] sets dimension {axis} to {d}, but the model fixes it at {was.dim_value}")
        tensor.shape.Clear()
        for d in dims:
            dim = tensor.shape.dim.add()
            if isinstance(d, str):
                dim.dim_param = d
            else:
                dim.dim_value = d


# -- names ------------------------------------------------------------------------------------


class _Names:
    """ONNX names made into unique dpl identifiers (``/fc1/Gemm_output_0`` -> ``fc1_Gemm_output_0``)."""

    def __init__(self):
        self.taken: set[str] = set()
        self.counter = 0

    def claim(self, onnx_name: str) -> str:
        base = re.sub(r"_+", "_", re.sub(r"\W", "_", onnx_name, flags=re.ASCII)).strip("_") or "v"
        if base[0].isdigit():
            base = "v" + base
        if base in _RESERVED:
            base += "_"
        name, i = base, 1
        while name in self.taken:
            name, i = f"{base}_{i}", i + 1
        self.taken.add(name)
        return name

    def fresh(self) -> str:
        while f"lv{self.counter}" in self.taken:
            self.counter += 1
        name = f"lv{self.counter}"
        self.taken.add(name)
        return name


# -- the graph --------------------------------------------------------------------------------


class _GraphImporter:
    def __init__(self, onnx, model, weights, keep_params_as_inputs: bool):
        self.onnx = onnx
        self.model = model
        self.graph = model.graph
        self.weights = weights  # initializer name -> TensorProto, in the model's order
        self.opset = self._opset()
        self.keep_params = keep_params_as_inputs
        self.names = _Names()
        self.dim_names = _Names()
        self.dim_symbols: dict[str, str] = {}
        self.values: dict[str, Any] = {}
        self.param_of: dict[str, str] = {}  # initializer -> parameter name, for those that may become params
        self.params: dict[str, Var] = {}
        self.bound: dict[int, tuple[Expr, Var]] = {}  # id(unbound call) -> (the call, its variable)
        self.flat: dict[str, Var] = {}  # ONNX name of a MergedValue -> its flattened reshape
        # the types the model states (its outputs, the exporter's value_info): a contract
        self.declared = _tensor_types(list(self.graph.value_info) + list(self.graph.output))
        # a dim with neither a dim_param nor a dim_value is unknown (None), not 0
        self.declared_params = {vi.name: [d.dim_param or (d.dim_value if d.HasField("dim_value") else None)
                                          for d in vi.type.tensor_type.shape.dim]
                                for vi in list(self.graph.value_info) + list(self.graph.output)
                                if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")}
        self.translated: dict[str, tuple[str, TensorType]] = {}  # output -> (node, its dpl type)
        self.fb = FunctionBuilder("main")

    def _opset(self) -> int:
        for o in self.model.opset_import:
            if o.domain in ("", "ai.onnx"):
                return o.version
        raise FrontendError("the model imports no version of the default ONNX domain (ai.onnx)")

    def run(self, entry: str) -> Module:
        if len(self.graph.sparse_initializer):
            raise FrontendError("sparse initializers are not supported")
        inputs = [self._input(i) for i in self.graph.input if i.name not in self.weights]
        # every initializer's name is claimed now, in order (onnx_params relies on it); its data
        # is read when a node first uses it, so unused ones cost nothing and may be of any type
        self.weight_names = {t.name: self.names.claim(t.name) for t in self.weights.values()}
        used = frozenset([n for node in self.graph.node for n in node.input] + [o.name for o in self.graph.output])
        self.producers = {name: node for node in self.graph.node for name in node.output}
        self._check_ops()
        for index, node in enumerate(self.graph.node):
            self._node(index, node, used)
        outputs = [self._output(o.name) for o in self.graph.output]
        order = {name: k for k, name in enumerate(self.weights)}
        params = [self.params[k] for k in sorted(self.params, key=order.__getitem__)]
        ret = outputs[0] if len(outputs) == 1 else Tuple(tuple(outputs))
        from dpl.ir.simplify import remove_dead_bindings

        fn = remove_dead_bindings(Function(entry, inputs + params, self.fb.bindings, ret))
        return Module([fn])

    # -- inputs and outputs --------------------------------------------------------------------

    def _input(self, value_info) -> Var:
        from dpl.frontend.onnx_node import dtype_of

        what = f"graph input '{value_info.name}'"
        ttype = value_info.type.tensor_type if value_info.type.HasField("tensor_type") else None
        if ttype is None:
            raise FrontendError(f"{what} is not a tensor (sequences, maps and optionals are not supported)")
        dtype = dtype_of(ttype.elem_type, what)
        if not ttype.HasField("shape"):
            raise FrontendError(f"{what} has no shape", hint=f"give one with from_onnx(..., shapes={{'{value_info.name}': [...]}})")
        name = self.names.claim(value_info.name)
        dims = []
        for axis, d in enumerate(ttype.shape.dim):
            if d.HasField("dim_value"):
                dims.append(d.dim_value)
            elif d.HasField("dim_param"):
                dims.append(self._dim_param(d.dim_param))
            else:
                dims.append(self._symbol(f"{name}_dim{axis}"))
        var = self.fb.param(name, dtype, dims)
        self.values[value_info.name] = var
        return var

    def _dim_param(self, text: str):
        """A dim_param: a name, or an expression over names where torch.onnx writes a derived
        Dim (``2*batch``, sympy's text): the expression over the names' symbols. Text that does
        not parse as one (``floor(n/2)``) is a name of its own, as any other dim_param."""
        from dpl.ir import dims

        if _DIM_EXPRESSION.search(text):
            try:
                d = dims.parse(text.replace("Min(", "min(").replace("Max(", "max("))
            except DplError:
                d = None
            if d is not None and not isinstance(d, int):
                return dims.substitute(d, {s: self._symbol(s) for s in dims.free_symbols(d)})
        return self._symbol(text)

    def _declared_shape(self, name: str) -> tuple | None:
        """The shape the model declares for ONNX value ``name`` (the exporter's value_info) in
        dpl dims; None where it declares none, or a dim over a name no graph input has (a
        dim_param that stands for nothing dpl knows)."""
        from dpl.ir import dims

        declared = self.declared_params.get(name)
        if declared is None:
            return None
        out = []
        for d in declared:
            if d is None:  # unknown: the model declares no shape to hold to
                return None
            if isinstance(d, int):
                out.append(d)
                continue
            try:
                parsed = dims.parse(d.replace("Min(", "min(").replace("Max(", "max("))
            except DplError:
                return None
            if not all(s in self.dim_symbols for s in dims.free_symbols(parsed)):
                return None
            out.append(self._dim_param(d))
        return tuple(out)

    def _symbol(self, dim_param: str) -> str:
        if dim_param not in self.dim_symbols:
            self.dim_symbols[dim_param] = self.dim_names.claim(dim_param)
        return self.dim_symbols[dim_param]

    def _lookup(self, name: str) -> Any:
        """The value of an ONNX name: a translated output, an input, or an initializer (read now)."""
        if name in self.values or name not in self.weights:
            return self.values.get(name)
        from dpl.frontend.onnx_node import tensor_to_array

        array = tensor_to_array(self.weights[name], f"initializer '{name}'")
        self.values[name] = Constant(array, name=self.weight_names[name])
        if self.keep_params and array.size > 1:
            self.param_of[name] = self.weight_names[name]
        return self.values[name]

    def _output(self, name: str) -> Expr:
        from dpl.frontend.onnx_node import ShapeValue

        v = self._lookup(name)
        if v is None:
            raise FrontendError(f"graph output '{name}' is not computed by any node")
        if isinstance(v, ShapeValue):
            if not v.is_static:
                raise FrontendError(f"graph output '{name}' is a shape with symbolic dimensions {v}")
            return Constant(v.dims.astype(np.int64))
        return self._tensor_of(name, v)

    def _tensor_of(self, name: str, v: Expr) -> Expr:
        """An initializer read as a tensor is a parameter when the caller keeps them as inputs;
        a MergedValue read as a tensor is reshaped to the shape ONNX gives it (once)."""
        from dpl.frontend.onnx_node import MergedValue, flat_shape
        from dpl.ops.registry import make_call

        if isinstance(v, MergedValue):
            if name not in self.flat:
                call = make_call("reshape", (v.value,), {"shape": flat_shape(v)})
                self.flat[name] = self._bind(call, f"{name}_flat")
            return self.flat[name]
        if name not in self.param_of:
            return v
        if name not in self.params:
            self.params[name] = Var(self.param_of[name], v.ty)
        return self.params[name]

    # -- nodes ---------------------------------------------------------------------------------

    def _check_ops(self) -> None:
        """Every op type the table does not translate, in one error before any node is: each
        with its count and its first node (and the user's source line, where the exporter
        recorded one)."""
        from dpl.frontend.onnx_ops import ONNX_OPS

        missing: dict[tuple[str, str], list[int]] = {}
        for index, node in enumerate(self.graph.node):
            if node.domain in ("", "ai.onnx") and node.op_type in ONNX_OPS:
                continue
            missing.setdefault((node.domain, node.op_type), []).append(index)
        if not missing:
            return
        if len(missing) == 1:
            index = next(iter(missing.values()))[0]
            node = self.graph.node[index]
            self._node(index, node, frozenset())  # raises the error of the one op, as a single error
        entries = []
        for (domain, op_type), indices in sorted(missing.items(), key=lambda item: (-len(item[1]), item[0])):
            node = self.graph.node[indices[0]]
            label = f"'{op_type}'" + (f" of domain '{domain}'" if domain not in ("", "ai.onnx") else "")
            where = f"node #{indices[0]}{f' {node.name!r}' if node.name else ''}"
            source = _source_line(node)
            entries.append((label, len(indices), where + (f" ({source})" if source else "")))
        raise unsupported_ops(f"{len(missing)} op types are not supported by dpl's ONNX frontend:", entries,
                              hint="add an entry to ONNX_OPS in dpl/frontend/onnx_ops.py for each")

    def _node(self, index: int, node, used: frozenset[str]) -> None:
        from dpl.frontend.onnx_node import NodeContext
        from dpl.frontend.onnx_ops import ONNX_OPS

        where = f"ONNX node #{index}{f' {node.name!r}' if node.name else ''} ({node.op_type}, opset {self.opset})"
        if node.domain not in ("", "ai.onnx"):
            raise FrontendError(f"{where}: op type '{node.op_type}' of domain '{node.domain}' is not supported; "
                                "dpl translates the default ONNX domain")
        entry = ONNX_OPS.get(node.op_type)
        if entry is None:
            close = difflib.get_close_matches(node.op_type, list(ONNX_OPS), n=3)
            hint = f"did you mean {', '.join(close)}?" if close else f"supported: {', '.join(sorted(ONNX_OPS))}"
            source = _source_line(node)
            raise FrontendError(f"{where}: op type '{node.op_type}' is not supported" + (f" ({source})" if source else ""),
                                hint=hint)
        try:
            version = self.onnx.defs.get_schema(node.op_type, self.opset, "").since_version
        except self.onnx.defs.SchemaError:
            raise FrontendError(f"{where}: the installed onnx {self.onnx.__version__} does not define "
                                f"{node.op_type} at opset {self.opset}") from None
        if not entry.first <= version <= entry.last:
            raise FrontendError(f"{where}: {node.op_type} version {version} (selected by opset {self.opset}) is not supported; "
                                f"dpl translates versions {entry.first} to {entry.last} of {node.op_type}")
        from dpl.frontend.onnx_node import MergedValue, unmerged_lookup

        lookup, lead = self._lookup, None
        if node.op_type not in ("Reshape", "Transpose") and any(
                isinstance(self.values.get(n), MergedValue) for n in node.input if n):
            # row-wise ops run on the unmerged tensors; any other reads them flattened
            lookup, lead = unmerged_lookup(where, node, self._lookup) or (self._lookup, None)
        ctx = NodeContext(node, index, self.opset, version, lookup, self._tensor_of, used,
                          producer=self.producers.get, is_initializer=self.weights.__contains__,
                          declared=self._declared_shape)
        try:
            result = entry.translate(ctx)
            if lead is not None:
                result = [MergedValue(r, lead) for r in (result if isinstance(result, list) else [result])]
            unread = ctx.unread_attributes()
            if unread:
                raise ctx.error(f"attribute {unread[0]} is not supported")
        except FrontendError as err:
            raise _with_source(err, node) from None
        except DplError as err:
            raise _with_source(FrontendError(f"{where}: {err.message}", hint=err.hint), node) from None
        results = result if isinstance(result, list) else [result]
        for i, name in enumerate(node.output):
            if name and i < len(results):
                self.values[name] = self._bind(results[i], name)
                self._check_declared(where, name, self.values[name])

    def _bind(self, e: Any, name: str | None = None) -> Any:
        """Bind each call inside ``e`` (inner calls under fresh names, ``e`` under ``name``)."""
        from dpl.frontend.onnx_node import MergedValue

        if isinstance(e, MergedValue):
            return MergedValue(self._bind(e.value, name), e.lead)
        if isinstance(e, (Var, Constant)) or not isinstance(e, (Call, Tuple, TupleGetItem)):
            return e
        if id(e) in self.bound:
            return self.bound[id(e)][1]
        if isinstance(e, Tuple):
            return Tuple(tuple(self._bind(f) for f in e.fields))
        if isinstance(e, TupleGetItem):
            value = TupleGetItem(self._bind(e.tuple_value), e.index)
        else:
            args = tuple(self._bind(a) for a in e.args)
            value = e if all(a is b for a, b in zip(args, e.args)) else replace(e, args=args)
        var = self.fb.bind(value, self.names.claim(name) if name else self.names.fresh())
        self.bound[id(e)] = (e, var)  # holding e keeps its id from being reused
        return var

    def _check_declared(self, where: str, name: str, value: Any) -> None:
        """dpl's type of an output must agree with the type the model declares for it."""
        if not isinstance(getattr(value, "ty", None), TensorType):
            return
        self.translated[name] = (where, value.ty)
        if name in self.declared and not _agrees(value.ty, *self.declared[name]):
            raise FrontendError(f"{where}: output '{name}' translates to {value.ty}, but the model declares "
                                f"{_show_type(*self.declared[name])}",
                                hint="if the model is right, this is a bug in dpl's ONNX frontend")

    def compare_with_shape_inference(self) -> None:
        """ONNX's shape inference as a second opinion on the types the model does not declare:
        a disagreement is a warning, since ONNX's shape functions for some older op versions
        differ from the spec (a ceil_mode pool keeping a window the spec drops). Not strict, so
        such a disagreement never stops a valid model."""
        try:
            inferred = self.onnx.shape_inference.infer_shapes(self.model, check_type=True, strict_mode=False, data_prop=True)
        except Exception as err:  # InferenceError, or ValueError for some malformed attributes
            raise FrontendError(f"ONNX shape inference failed: {_first_line(err)}") from None
        for name, (elem, dims) in _tensor_types(inferred.graph.value_info).items():
            if name in self.translated and name not in self.declared and not _agrees(self.translated[name][1], elem, dims):
                where, ty = self.translated[name]
                warnings.warn(f"{where}: output '{name}' translates to {ty}, but ONNX shape inference gives "
                              f"{_show_type(elem, dims)}", stacklevel=3)


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def _with_source(err: FrontendError, node) -> FrontendError:
    """``err`` naming the user's source line of ``node`` too, where the exporter recorded one."""
    source = _source_line(node)
    if not source or source in err.message:
        return err
    return type(err)(f"{err.message} ({source})", span=err.span, hint=err.hint)


def _source_line(node) -> str:
    """``file:line: code`` of the innermost frame of the stack the exporter recorded for the
    node (torch.onnx's ``pkg.torch.onnx.stack_trace``), or ''."""
    for prop in node.metadata_props:
        if prop.key != "pkg.torch.onnx.stack_trace":
            continue
        frames = list(_FRAME.finditer(prop.value))
        if not frames:
            return ""
        import linecache

        file, line = frames[-1]["file"], int(frames[-1]["line"])
        code = linecache.getline(file, line).strip()
        return f"{short_path(file)}:{line}" + (f": {code}" if code else "")
    return ""


def _tensor_types(value_infos) -> dict[str, tuple[int, list[int | None] | None]]:
    """Element type and dims (None where unknown or symbolic) of each tensor value_info."""
    out = {}
    for vi in value_infos:
        if not vi.type.HasField("tensor_type"):
            continue
        t = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim] if t.HasField("shape") else None
        out[vi.name] = (t.elem_type, dims)
    return out


def _agrees(ty: TensorType, elem: int, dims) -> bool:
    from dpl.frontend.onnx_node import ONNX_DTYPES

    if elem and ONNX_DTYPES.get(elem) != ty.dtype:
        return False
    if dims is None:
        return True
    return len(dims) == ty.ndim and all(want is None or not isinstance(have, int) or want == have for want, have in zip(dims, ty.shape))


def _show_type(elem: int, dims) -> str:
    from dpl.frontend.onnx_node import onnx_dtype_name

    return onnx_dtype_name(elem) + ("" if dims is None else "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]")
