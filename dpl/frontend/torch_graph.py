"""The graph walk of the torch.export frontend: an ExportedProgram's functional ATen graph in,
a dpl Module out. Each node goes through its entry in :data:`dpl.frontend.torch_ops.ATEN_OPS`
(which graph that is, and what becomes of weights and shapes: :mod:`dpl.frontend.torch_export`).

A translation gets a :class:`NodeContext`: torch's metadata of the node and helpers to build
calls. What it returns is bound under the node's name (nested calls as ``name_1``, ``name_2``),
a value computed before is reused, and the result's type is checked against torch's metadata.
"""

from __future__ import annotations

import inspect
import itertools
import linecache
import os
import re
from typing import Any, Callable, Mapping

import numpy as np

from dpl import dtypes
from dpl.errors import DplError, Span
from dpl.frontend import torch_merged
from dpl.frontend.errors import FrontendError, short_path, unsupported_ops
from dpl.frontend.torch_dims import sympy_dim
from dpl.ir import dims
from dpl.ir.builder import FunctionBuilder, const
from dpl.ir.expr import Call, Constant, Expr, Module, Tuple, TupleGetItem, Var, replace
from dpl.ir.types import TensorType

# torch dtype name (without "torch.") -> dpl dtype
TORCH_DTYPES = {
    "float32": "float32", "float16": "float16", "bfloat16": "bfloat16", "float64": "float64",
    "int64": "int64", "int32": "int32", "int16": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool",
}

# ops that check or constrain at run time and produce nothing dpl needs
IGNORED_OPS = frozenset({
    "aten._assert_tensor_metadata.default", "aten._assert_scalar.default", "aten._assert_async.msg",
    "aten.sym_constrain_range_for_size.default", "aten.sym_constrain_range.default",
})

_RESERVED_NAMES = frozenset({"func", "return", "const", "true", "false", "none", "inf", "nan"}) | set(dtypes.SHORT_NAMES) | set(
    dtypes.SHORT_NAMES.values())

ADD_OP_HINT = ("add a translation to dpl/frontend/torch_ops.py: a function decorated @aten(\"{name}\") that builds "
               "the dpl ops for it (dpl.frontend.torch_ops.supported_ops() lists those translated)")


def import_torch():
    """torch, or a FrontendError saying how to install it (torch is an optional extra)."""
    try:
        import torch
    except ImportError:
        raise FrontendError("the torch.export frontend needs PyTorch", hint="pip install 'dpl[torch]' (pinned torch==2.13.0)") from None
    return torch


# -- names -------------------------------------------------------------------------------------


def sanitize(name: str) -> str:
    """A name the text form reads back: ``layers.0.weight`` -> ``layers_0_weight``."""
    text = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if not text or text[0].isdigit() or text in _RESERVED_NAMES:
        text = "_" + text
    return text


# -- the graph walk ----------------------------------------------------------------------------


class Unavailable:
    """A result of a multi-output op that dpl does not compute (max_pool2d's indices): an error
    when a later node uses it."""

    def __init__(self, what: str):
        self.what = what


class NodeContext:
    """What a translation function sees of the node it translates, and the helpers it builds
    dpl calls with. Calls it builds may nest; the importer binds them in order."""

    def __init__(self, importer: "GraphImporter", node):
        self.importer = importer
        self.node = node
        # the leading axes of the result where torch merged them into one (dpl.frontend.torch_merged)
        self.leading: tuple | None = None

    # -- torch metadata of the node
    @property
    def out_type(self) -> TensorType:
        meta = self.node.meta.get("val")
        where = f"the result of node '{self.node.name}'"
        if self.leading is None:
            return self.importer.tensor_type(meta, where)
        rest = tuple(self.importer.dim(d, f"dimension {i + 1} of {where}") for i, d in enumerate(meta.shape[1:]))
        return TensorType(tuple(self.leading) + rest, self.dtype(meta.dtype))

    @property
    def out_dtype(self) -> str:
        return self.dtype(self.node.meta["val"].dtype)

    @property
    def out_shape(self) -> tuple:
        return self.out_type.shape

    def dtype(self, torch_dtype) -> str:
        return self.importer.dtype(torch_dtype)

    def result_dtype(self, a_index: int = 0, b_index: int = 1) -> str:
        """torch's promoted dtype of two operands of the node (tensors, 0-d tensors, scalars)."""
        torch = import_torch()
        a, b = (self._meta_value(self.node.args[i]) for i in (a_index, b_index))
        return self.dtype(torch.result_type(a, b) if isinstance(a, torch.Tensor) else torch.result_type(b, a))

    @staticmethod
    def _meta_value(arg):
        return arg.meta["val"] if hasattr(arg, "meta") else arg

    # -- building calls
    def call(self, op: str, *args: Expr, **attrs: Any) -> Call:
        from dpl.ops.registry import make_call

        return make_call(op, args, attrs)

    def scalar(self, value, dtype: str) -> Constant:
        return const(value, dtype)

    def cast(self, x: Expr, dtype: str) -> Expr:
        return x if x.ty.dtype == dtype else self.call("astype", x, dtype=dtype)

    def operand(self, value, dtype: str) -> Expr:
        """A tensor operand cast to ``dtype``, or a Python scalar as a constant of ``dtype``."""
        if isinstance(value, (bool, int, float)):
            return self.scalar(value, dtype)
        return self.cast(self.tensor(value), dtype)

    def tensor(self, value) -> Expr:
        if isinstance(value, Unavailable):
            raise FrontendError(f"uses {value.what}, which dpl does not compute")
        if not hasattr(value, "ty") or not isinstance(value.ty, TensorType):
            raise FrontendError(f"expected a tensor operand, got {value!r}")
        return value

    def producer(self, x: Expr, op: str) -> Call | None:
        """The call of ``op`` that computed ``x`` (a variable bound by an earlier node, or a
        call built by this one), or None: for translations that see through what torch wrote
        (attention over repeated key/value heads)."""
        call = x if isinstance(x, Call) else self.importer.defined.get(id(x)) if isinstance(x, Var) else None
        return call if call is not None and call.op == op else None

    def reshape(self, x: Expr, shape) -> Expr:
        """Reshape; a constant (a weight) is reshaped now rather than at every run."""
        if isinstance(x, Constant) and all(isinstance(d, int) for d in shape):
            return Constant(x.value.reshape(shape), name=x.name)
        return x if tuple(shape) == x.ty.shape else self.call("reshape", x, shape=list(shape))

    def permute(self, x: Expr, axes) -> Expr:
        """Transpose; a constant (a weight) is laid out now rather than at every run."""
        if list(axes) == list(range(x.ty.ndim)):
            return x
        if isinstance(x, Constant):
            return Constant(_permuted(x.value, axes), name=f"{x.name}_t" if x.name else None)
        return self.call("permute_dims", x, axes=list(axes))

    def static(self, dim, what: str) -> int:
        if not isinstance(dim, int):
            raise FrontendError(f"{what} is the symbolic dimension '{dim}'; dpl needs a static size here")
        return dim


class GraphImporter:
    """Translates one functional ATen graph. ``program`` is an ExportedProgram, whose signature
    says which placeholders are the user's inputs and which are weights, or a GraphModule whose
    placeholders are all inputs (AOTAutograd's forward graph, a partition of it: the torch.compile
    backend, :mod:`dpl.frontend.dynamo`); there ``weights`` names the placeholders that are
    weights, ``{placeholder name: (weight name, tensor)}``, and every other placeholder is a
    parameter of the function, in order."""

    def __init__(self, program, table: Mapping[str, Callable], *, bind_params: bool, dim_names: dict[str, str], name: str,
                 weights: Mapping[str, tuple[str, Any]] | None = None):
        self.program = program
        exported = hasattr(program, "graph_signature")
        self.given_weights = None if exported else dict(weights or {})  # None: the signature says
        self.table = table
        self.bind_params = bind_params
        self.dim_names = dim_names
        self.fb = FunctionBuilder(name)
        self.env: dict[Any, Any] = {}  # fx node -> dpl expression, dimension, tuple or Python value
        self.bound: dict[int, Expr] = {}  # id of an unbound expression -> the variable it was bound to
        self.keep: list[Any] = []  # keeps bound expressions alive so their ids stay unique
        # what each bound value computes -> its variable: torch does not share repeated work
        # (``x - mu`` written twice is two nodes), and a pattern that uses a value twice needs it
        self.computed: dict[tuple, Var] = {}
        self.defined: dict[int, Call] = {}  # id of a bound variable -> the call it names (NodeContext.producer)
        self.names: set[str] = set()
        self.torch = import_torch()
        self.weights: dict[str, np.ndarray] = {}
        self.flat: dict[Any, Var] = {}  # fx node of a Merged value -> its reshape to torch's shape

    # -- metadata conversions
    def dtype(self, torch_dtype) -> str:
        name = str(torch_dtype).removeprefix("torch.")
        if name not in TORCH_DTYPES:
            raise FrontendError(f"dtype {torch_dtype} is not supported (dpl has {', '.join(TORCH_DTYPES)})")
        return TORCH_DTYPES[name]

    def dim(self, value, where: str):
        """An int, a SymInt or a node holding one -> a dpl dimension: an int, a symbol name, or
        an expression over them (``256*s99`` as ``batch * 256``, :mod:`dpl.frontend.torch_dims`)."""
        torch = import_torch()
        if hasattr(value, "meta"):
            value = value.meta.get("val")
        if isinstance(value, bool):
            raise FrontendError(f"{where}: expected a dimension, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, torch.SymInt):
            expr = value.node.expr
            if expr.is_Integer:
                return int(expr)
            return sympy_dim(expr, self.symbol, where, value.node.shape_env.var_to_range)
        raise FrontendError(f"{where}: expected a dimension, got {value!r}")

    def symbol(self, name: str) -> str:
        """The dpl name of torch's shape symbol ``name``: the user's Dim name, else torch's."""
        return self.dim_names.get(name, sanitize(name))

    def tensor_type(self, meta, where: str) -> TensorType:
        torch = import_torch()
        if not isinstance(meta, torch.Tensor):
            raise FrontendError(f"{where} is not a tensor ({type(meta).__name__})")
        shape = tuple(self.dim(d, f"dimension {i} of {where}") for i, d in enumerate(meta.shape))
        return TensorType(shape, self.dtype(meta.dtype))

    def unique(self, base: str) -> str:
        name = sanitize(base)
        candidate, k = name, 0
        while candidate in self.names:
            k += 1
            candidate = f"{name}_{k}"
        self.names.add(candidate)
        return candidate

    # -- the walk
    def run(self):
        self.check_pure()
        self.check_ops()
        lifted = []
        for node, kind, target in self.inputs():  # user inputs first: they are the function's leading parameters
            if kind == "USER_INPUT":
                self.user_input(node)
            elif kind in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
                lifted.append((node, kind, target))
            else:
                raise FrontendError(f"input '{node.name}' of kind {kind} is not supported")
        for node, kind, target in lifted:
            self.lifted_input(node, kind, target)
        for node in self.program.graph.nodes:
            if node.op == "call_function":
                self.call_function(node)
            elif node.op == "output":
                return self.output(node)
            elif node.op != "placeholder":
                raise self.error(node, f"{node.op} node '{node.name}' ({node.target}) is not supported",
                                 "control flow (torch.cond, loops) and submodule calls are not translated")
        raise FrontendError("the exported graph has no output")

    def inputs(self):
        """``(placeholder, kind, weight name)`` of each placeholder, in order: the kind is the
        ExportedProgram's (``USER_INPUT``, ``PARAMETER``, ...), or for a GraphModule
        ``PARAMETER`` where ``weights`` names the placeholder and ``USER_INPUT`` elsewhere."""
        placeholders = [n for n in self.program.graph.nodes if n.op == "placeholder"]
        if self.given_weights is not None:
            for node in placeholders:
                weight = self.given_weights.get(node.name)
                yield (node, "USER_INPUT", None) if weight is None else (node, "PARAMETER", weight[0])
            return
        specs = {s.arg.name: s for s in self.program.graph_signature.input_specs if hasattr(s.arg, "name")}
        for node in placeholders:
            spec = specs.get(node.name)
            yield (node, "USER_INPUT", None) if spec is None else (node, spec.kind.name, spec.target)

    def weight_tensor(self, node, target: str):
        """The tensor of weight ``target`` (placeholder ``node``), or None."""
        if self.given_weights is not None:
            return self.given_weights[node.name][1]
        value = self.program.state_dict.get(target)
        return self.program.constants.get(target) if value is None else value

    def check_ops(self) -> None:
        """Every op the table does not translate, listed in one error before any is translated:
        the user sees the whole gap at once (each op, how often, and the first source line)."""
        import operator

        missing: dict[str, list] = {}
        for node in self.program.graph.nodes:
            if node.op != "call_function" or node.target is operator.getitem or not node.users:
                continue
            name = str(node.target)
            if name in IGNORED_OPS or name in self.table or self._is_symbolic_scalar(node.meta.get("val")):
                continue
            missing.setdefault(name, []).append(node)
        if not missing:
            return
        if len(missing) == 1:
            (name, nodes), = missing.items()
            count = f" ({len(nodes)} uses)" if len(nodes) > 1 else ""
            raise self.error(nodes[0], f"{name} is not supported by dpl's torch.export frontend{count}",
                             ADD_OP_HINT.format(name=name.removeprefix("aten.")))
        entries = []
        for name, nodes in sorted(missing.items(), key=lambda item: (-len(item[1]), item[0])):
            span = _source_span(nodes[0])
            where = f"{short_path(span.file)}:{span.line}: {span.source_line.strip()}" if span else f"node '{nodes[0].name}'"
            entries.append((name, len(nodes), where))
        raise unsupported_ops(f"{len(missing)} ops are not supported by dpl's torch.export frontend:", entries,
                              hint=ADD_OP_HINT.format(name="<op>") + " for each")

    def user_input(self, node) -> None:
        torch = import_torch()
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            self.env[node] = value  # a Python value torch specialised the graph for
            return
        ty = self.tensor_type(value, f"input '{node.name}'")
        self.env[node] = self.fb.param(self.unique(node.name), ty.dtype, ty.shape)

    def lifted_input(self, node, kind: str, target: str) -> None:
        torch = import_torch()
        value = self.weight_tensor(node, target)
        if not isinstance(value, torch.Tensor):
            raise FrontendError(f"weight '{target}' ({kind.lower()}) is not a tensor")
        array = to_numpy(value, self.dtype(value.dtype))
        name = self.unique(target)
        if self.bind_params:
            self.env[node] = Constant(array, name=name)
        else:
            self.env[node] = self.fb.param(name, dtypes.from_numpy(array.dtype), array.shape)
            self.weights[name] = array

    def call_function(self, node) -> None:
        import operator

        target = node.target
        op_name = str(target)
        if op_name in IGNORED_OPS or not node.users:
            return
        if target is operator.getitem:
            self.env[node] = self.getitem(node)
            return
        meta = node.meta.get("val")
        if self._is_symbolic_scalar(meta):  # sizes and their arithmetic: the value is a dimension
            self.env[node] = meta
            return
        translate = self.table.get(op_name)
        if translate is None:
            raise self.error(node, f"{_op_label(node)} is not supported by dpl's torch.export frontend",
                             ADD_OP_HINT.format(name=op_name.removeprefix("aten.")))
        cx = NodeContext(self, node)
        try:
            if torch_merged.touches(self, node):
                self.env[node] = torch_merged.translate(self, node, translate, _invoke, NodeContext)
                return
            args = [self.value(a) for a in node.args]
            kwargs = {k: self.value(v) for k, v in node.kwargs.items()}
            result = _invoke(translate, cx, args, kwargs)
            self.env[node] = self.bind(result, node)
        except DplError as err:
            raise self.error(node, f"{_op_label(node)}: {err.message}", err.hint) from None

    @staticmethod
    def _is_symbolic_scalar(meta) -> bool:
        """A size or its arithmetic; a SymFloat too (``trunc(h * 1.5)``: the size is the
        SymInt at its end, which reads it back as a dim, :func:`torch_dims.sympy_dim`)."""
        torch = import_torch()
        return isinstance(meta, (torch.SymInt, torch.SymFloat, int)) and not isinstance(meta, bool)

    def value(self, arg):
        """An fx argument as a translation function sees it."""
        if isinstance(arg, (list, tuple)):
            return type(arg)(self.value(a) for a in arg)
        if hasattr(arg, "op") and hasattr(arg, "meta"):  # an fx Node
            value = self.env[arg]
            if isinstance(value, torch_merged.Merged):
                return torch_merged.flatten(self, arg)
            torch = import_torch()
            if isinstance(value, torch.SymInt):
                return self.dim(value, f"size '{arg.name}'")
            if isinstance(value, torch.SymFloat):
                raise FrontendError(f"'{arg.name}' is the symbolic float {value}; dpl's sizes are integers",
                                    hint="compute sizes with integer arithmetic, or truncate the float to a size")
            return value
        return arg

    def getitem(self, node):
        source, index = node.args
        value = self.env[source]
        if not isinstance(value, tuple):
            raise self.error(node, f"node '{node.name}' takes item {index} of '{source.name}', which is not a tuple")
        item = value[index]
        if isinstance(item, Unavailable):
            return item
        try:
            return self.bind(item, node)
        except DplError as err:
            raise self.error(node, err.message, err.hint) from None

    def bind(self, result, node, check: bool = True):
        """Bind what a translation returned: nested calls in order, named after the node; its
        type is checked against torch's unless ``check`` is false (an unmerged value,
        :mod:`dpl.frontend.torch_merged`)."""
        if isinstance(result, (tuple, list)):
            return tuple(result)  # bound item by item when a getitem uses it
        if isinstance(result, Unavailable):
            return result
        fresh = itertools.count(1)

        def visit(e, root: bool):
            if isinstance(e, (Var, Constant)):
                return e
            if id(e) in self.bound:
                return self.bound[id(e)]
            if isinstance(e, Tuple):
                return Tuple(tuple(visit(f, False) for f in e.fields))
            if isinstance(e, TupleGetItem):
                new = TupleGetItem(visit(e.tuple_value, False), e.index)
            elif isinstance(e, Call):
                args = tuple(visit(a, False) for a in e.args)
                new = e if all(a is b for a, b in zip(args, e.args)) else replace(e, args=args)
            else:
                raise FrontendError(f"a translation returned {type(e).__name__}, not a dpl expression")
            key = _value_key(new)
            var = self.computed.get(key)
            if var is None:
                var = self.fb.bind(new, self.unique(node.name if root else f"{node.name}_{next(fresh)}"))
                self.computed[key] = var
                if isinstance(new, Call):
                    self.defined[id(var)] = new
            self.bound[id(e)] = var
            self.keep.append(e)
            return var

        var = visit(result, True)
        if check:
            self.check_type(var, node)
        return var

    def check_type(self, value: Expr, node) -> None:
        """A translation must give what torch computed: its shape and dtype are compared with
        torch's metadata, so a wrong translation fails here rather than giving wrong numbers."""
        torch = import_torch()
        meta = node.meta.get("val")
        if not isinstance(meta, torch.Tensor) or not isinstance(value.ty, TensorType):
            return
        try:
            want = self.tensor_type(meta, "")
        except FrontendError:
            return  # a shape dpl cannot write; the ops that use it will say so
        if want != value.ty and not self._same_at_example(want, value.ty, meta):
            raise FrontendError(f"translated to {value.ty}, but torch computes {want} (a bug in the translation)")

    def _same_at_example(self, want: TensorType, have: TensorType, meta) -> bool:
        """Whether two types differ only in dim expressions that agree at the sizes torch
        exported with: torch simplifies with what it knows of its symbols' ranges (``Max(1, n)``
        is ``n`` for ``n >= 2``), dpl only that they are >= 0, so equal sizes may be written
        differently."""
        if want.dtype != have.dtype or len(want.shape) != len(have.shape):
            return False
        shape_env = next((d.node.shape_env for d in meta.shape if isinstance(d, self.torch.SymInt)), None)
        if shape_env is None:
            return False
        example = {self.symbol(str(k)): int(v) for k, v in shape_env.var_to_val.items()}
        try:
            return all(a == b or dims.evaluate(a, example) == dims.evaluate(b, example) for a, b in zip(want.shape, have.shape))
        except dims.DimError:
            return False

    def check_pure(self) -> None:
        """A model that updates its state (BatchNorm's statistics in training mode, an in-place
        update of an input) is no pure function; the signature says so before any op is read. A
        GraphModule has no signature: AOTAutograd returns an input's update as an output."""
        if not hasattr(self.program, "graph_signature"):
            return
        for spec in self.program.graph_signature.output_specs:
            if spec.kind.name != "USER_OUTPUT":
                what = getattr(spec, "target", None) or spec.arg.name
                raise FrontendError(f"the model updates '{what}' in place ({spec.kind.name.lower().replace('_', ' ')}); "
                                    "dpl modules are pure functions",
                                    hint="export the model in eval mode (model.eval()) so BatchNorm keeps its statistics")

    def output(self, node):
        values = []
        for i, arg in enumerate(node.args[0]):
            value = self.env.get(arg) if hasattr(arg, "op") else arg
            if isinstance(value, torch_merged.Merged):
                value = torch_merged.flatten(self, arg)
            if not hasattr(value, "ty"):
                raise FrontendError(f"output {i} of the model is {value!r}, not a tensor; dpl functions return tensors")
            values.append(value)
        # torch.export keeps nodes whose value nothing reads (an unsqueeze of BERT's mask
        # builder): they would run for nothing, so they go, as in the ONNX importer
        from dpl.ir.simplify import remove_dead_bindings

        fn = remove_dead_bindings(self.fb.ret(*values))
        return Module([fn]), dict(self.weights)

    # -- errors
    def error(self, node, message: str, hint: str | None = None) -> FrontendError:
        module = _module_path(node)
        where = f" (node '{node.name}'" + (f" in {module}" if module else "") + ")"
        origin = node.meta.get("original_aten")
        if origin is not None and str(origin) != str(node.target):
            where += f", from torch's decomposition of {origin}"
        return FrontendError(message + where, span=_source_span(node), hint=hint)


def _value_key(e) -> tuple:
    """Equal keys compute equal values (dpl ops are pure): the op, the attributes and the
    operands, variables by identity and scalar constants by value."""
    if isinstance(e, Var):
        return ("var", id(e))
    if isinstance(e, Constant):
        if e.is_scalar:
            return ("scalar", e.ty.dtype, e.value.tobytes())
        return ("constant", id(e))
    if isinstance(e, Tuple):
        return ("tuple",) + tuple(_value_key(f) for f in e.fields)
    if isinstance(e, TupleGetItem):
        return ("item", _value_key(e.tuple_value), e.index)
    return ("call", e.op, tuple(_value_key(a) for a in e.args), tuple(sorted(e.attrs.items())))


def _op_label(node) -> str:
    return str(node.target)


def _invoke(translate, cx, args, kwargs):
    """Call a translation with the node's arguments; an argument it does not accept (a keyword
    or a positional beyond its signature) is reported by name rather than raising TypeError."""
    signature = _signature(translate)
    params = list(signature.parameters.values())[1:]
    names = {p.name for p in params}
    takes_var = any(p.kind == p.VAR_KEYWORD for p in params)
    for key in kwargs:
        if key not in names and not takes_var and key not in _IGNORED_KWARGS:
            raise FrontendError(f"argument '{key}={kwargs[key]!r}' is not supported")
    kwargs = {k: v for k, v in kwargs.items() if k in names or takes_var}
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(args) > len(positional) and not any(p.kind == p.VAR_POSITIONAL for p in params):
        extra = ", ".join(repr(a) for a in args[len(positional):])
        raise FrontendError(f"more arguments than the translation takes ({extra})")
    return translate(cx, *args, **kwargs)


# keyword arguments that place or lay out a tensor but never change its values
_IGNORED_KWARGS = frozenset({"device", "pin_memory", "layout", "memory_format", "non_blocking"})

_SIGNATURES: dict[Callable, inspect.Signature] = {}


def _signature(fn) -> inspect.Signature:
    if fn not in _SIGNATURES:
        _SIGNATURES[fn] = inspect.signature(fn)
    return _SIGNATURES[fn]


def _module_path(node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path, kind = list(stack.values())[-1]
    if not path:
        return ""
    return f"module '{path}' ({str(kind).rsplit('.', 1)[-1]})"


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in [^\n]*\n(?P<code>[^\n]*)')


def _source_span(node) -> Span | None:
    """Where the user's code created the node: the innermost frame of the stack torch recorded
    that is not inside torch itself."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    frames = list(_FRAME.finditer(trace))
    if not frames:
        return None
    torch_dir = os.path.dirname(import_torch().__file__)
    user = [f for f in frames if not os.path.abspath(f["file"]).startswith(torch_dir + os.sep)]
    frame = (user or frames)[-1]
    line = int(frame["line"])
    source = linecache.getline(frame["file"], line).rstrip("\n") or frame["code"].strip()
    col = len(source) - len(source.lstrip()) + 1
    return Span(frame["file"], line, col, len(source.rstrip()) + 1, source)


def _permuted(array: np.ndarray, axes) -> np.ndarray:
    """A contiguous permuted copy. A 2-D transpose is copied in bands of rows, each of which
    stays in cache while it is scattered: ten times faster than NumPy's copy of the strided
    view on a weight matrix, the difference between a fast and a slow import."""
    if array.ndim != 2 or list(axes) != [1, 0]:
        return np.ascontiguousarray(np.transpose(array, axes))
    out = np.empty(array.shape[::-1], array.dtype)
    for i in range(0, array.shape[0], 64):
        out[:, i:i + 64] = array[i:i + 64].T
    return out


def to_numpy(tensor, dtype: str) -> np.ndarray:
    """A read-only NumPy view of a CPU tensor's memory, as the dpl dtype (bfloat16 through
    ml_dtypes). Nothing is copied: fresh memory costs more to touch than the import itself
    (copying 0.8 GB of weights took 2.8 s here), and a large model must not be held twice."""
    torch = import_torch()
    t = tensor.detach().cpu().contiguous()
    array = t.view(torch.int16).numpy().view(dtypes.to_numpy("bfloat16")) if dtype == "bfloat16" else t.numpy()
    array.setflags(write=False)
    return array
