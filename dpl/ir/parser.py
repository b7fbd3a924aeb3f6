"""Read the text form of the IR (grammar/ir.lark) back into a checked, typed Module.

Every call goes through the op registry, so a shape or dtype mismatch, an unknown op, a
wrong arity or an unknown attribute is reported where it was written, with the line and a
caret. Errors of different bindings are collected and reported together; a binding that
failed does not cause follow-up errors in the bindings that use it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping

import numpy as np
from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedInput

from dpl import dtypes
from dpl.errors import AttributeValueError, DplError, Span, UnknownAttributeError
from dpl.ir import dims as dimexpr
from dpl.ir.dims import Dim
from dpl.ir.expr import Binding, Call, Constant, Expr, Function, GlobalVar, Module, Tuple, TupleGetItem, Var
from dpl.ir.printer import DECORATORS, DEFAULT_LITERAL_DTYPE
from dpl.ir.types import TensorType, TupleType, Type
from dpl.limits import MAX_CALL_DEPTH, LimitError, check_int_digits
from dpl.syntax import Source as _Source, check_nesting, int_token, open_grammar, syntax_error, unescape_string
from dpl.ops.registry import call_function, make_call


class UndefinedNameError(DplError):
    pass


class DuplicateNameError(DplError):
    pass


class ReturnTypeError(DplError):
    pass


class ConstantValueError(DplError):
    pass


class CallError(DplError):
    """A call of a module function with the wrong arguments."""


class RecursionNotSupportedError(DplError):
    """A function that calls itself, directly or through others."""


class IRErrors(DplError):
    """Several errors of one text, reported together."""

    def __init__(self, errors: list[DplError]):
        self.errors = errors
        super().__init__(f"{len(errors)} errors")

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors) + f"\n{len(self.errors)} errors"


@lru_cache(maxsize=1)
def _lark() -> Lark:
    return open_grammar("ir.lark", propagate_positions=True, maybe_placeholders=False)


class _Poisoned(Exception):
    """An operand whose own binding already failed: skip without a second error."""


_POISON = object()
_DECORATOR_KEYS = {v: k for k, v in DECORATORS.items()}


_DIM_OPS = {"dim_add": dimexpr.add, "dim_sub": dimexpr.sub, "dim_mul": dimexpr.mul, "dim_floordiv": dimexpr.floordiv,
            "dim_mod": dimexpr.mod, "dim_neg": dimexpr.neg, "dim_min": dimexpr.dmin, "dim_max": dimexpr.dmax}


def _number(token, src: _Source) -> int | float:
    text = str(token)
    if text in ("inf", "-inf", "nan"):
        return float(text)
    if not any(c in text for c in ".eE"):
        check_int_digits(text, src.of(token))
        return int(text)
    return float(text)


class _Reader:
    def __init__(self, text: str, filename: str, constants: Mapping[str, np.ndarray] | None):
        self.src = _Source(text, filename)
        self.values = dict(constants or {})
        self.errors: list[DplError] = []
        self.consts: dict[str, Constant] = {}
        self.signatures: dict[str, tuple[list[Type], Type]] = {}
        self.calls: dict[str, list[tuple[str, Token]]] = {}  # function -> (callee, where), for recursion
        self.current: str | None = None

    # -- helpers -----------------------------------------------------------------------------
    def span(self, node) -> Span:
        return self.src.of(node)

    def error(self, cls, message: str, node, hint: str | None = None) -> None:
        self.errors.append(cls(message, self.span(node), hint))

    # -- module --------------------------------------------------------------------------------
    def module(self, tree: Tree) -> Module:
        funcs = [c for c in tree.children if c.data == "func_decl"]
        for c in tree.children:
            if c.data == "const_decl":
                self.const_decl(c)
        for f in funcs:  # signatures first: functions may call functions defined further down
            name = f.children[len(self._decorators(f))]
            if str(name) in self.signatures:
                self.error(DuplicateNameError, f"function '{name}' is defined twice", name)
                continue
            try:
                params, ret = self._signature(f)
            except DplError as err:
                self.errors.append(err.with_span(self.span(name)))
                continue
            self.signatures[str(name)] = (params, ret)
        functions = [fn for fn in (self.function(f) for f in funcs) if fn is not None]
        self.check_calls()
        if self.errors:
            raise self.errors[0] if len(self.errors) == 1 else IRErrors(self.errors)
        return Module({fn.name: fn for fn in functions})

    def const_decl(self, node: Tree) -> None:
        name, ty_node, *value = node.children
        ty = self.type(ty_node)
        if str(name) in self.consts:
            self.error(DuplicateNameError, f"constant '{name}' is defined twice", name)
            return
        if value:
            array = self.tensor_value(value[0], ty, name)
        elif str(name) in self.values:
            array = np.asarray(self.values[str(name)])
        else:
            self.error(ConstantValueError, f"constant '{name}' has no value", name,
                       hint="write '= [...]' after its type, or load the module with dpl.load so the .npz sidecar is read")
            self.consts[str(name)] = _POISON
            return
        if array is None:
            self.consts[str(name)] = _POISON
            return
        if array.shape != ty.shape or array.dtype != dtypes.to_numpy(ty.dtype):
            got = dtypes.short(array.dtype.name) if array.dtype.name in dtypes.SHORT_NAMES else array.dtype.name
            self.error(ConstantValueError, f"constant '{name}' is declared {ty} but its value is {got}[{', '.join(map(str, array.shape))}]", name)
            self.consts[str(name)] = _POISON
            return
        self.consts[str(name)] = Constant(array, ty, name=str(name))

    def tensor_value(self, node, ty: TensorType, name) -> np.ndarray | None:
        def values(n):
            if isinstance(n, Tree) and n.data == "value_list":
                return [values(c) for c in n.children]
            if isinstance(n, Tree) and n.data == "true":
                return True
            if isinstance(n, Tree) and n.data == "false":
                return False
            return _number(n.children[0], self.src) if isinstance(n, Tree) else _number(n, self.src)

        def flat(v):
            if isinstance(v, list):
                for x in v:
                    yield from flat(x)
            else:
                yield v

        try:
            nested = values(node)
        except DplError as err:
            self.errors.append(err)
            return None
        bad = next((why for why in map(lambda v: dtypes.literal_range_error(v, ty.dtype), flat(nested)) if why), None)
        if bad is not None:
            self.error(ConstantValueError, f"the value of constant '{name}': {bad}", name)
            return None
        try:
            return np.array(nested, dtype=dtypes.to_numpy(ty.dtype))
        except (ValueError, TypeError):
            self.error(ConstantValueError, f"the value of constant '{name}' is not a regular {ty} array", name)
            return None

    # -- types ---------------------------------------------------------------------------------
    def type(self, node: Tree) -> Type:
        if node.data == "tuple_type":
            return TupleType(tuple(self.type(c) for c in node.children))
        dtype, *dims = node.children
        shape = tuple(self.dim(d) for d in dims)
        try:
            return TensorType(shape, dtypes.canonical(str(dtype)))
        except DplError as err:
            raise err.with_span(self.span(node)) from None

    def dim(self, node: Tree) -> Dim:
        """A dimension as :mod:`dpl.ir.dims` builds it (canonical; check_nesting bounded the
        depth of the tree before anything walks it)."""
        kind = node.data
        if kind == "dim_int":
            return int_token(node.children[0], self.src, "dimension")
        if kind == "dim_sym":
            name = str(node.children[0])
            if name in ("min", "max"):
                raise DplError(f"'{name}' is no symbol name: min and max are the functions min(a, b) and max(a, b)",
                               self.span(node))
            return name
        args = [self.dim(c) for c in node.children]
        try:
            return _DIM_OPS[kind](*args)
        except DplError as err:  # a division by the constant 0, an expression past MAX_DIM_SIZE
            raise err.with_span(self.span(node)) from None

    def _decorators(self, f: Tree) -> list[Tree]:
        return [c for c in f.children if isinstance(c, Tree) and c.data == "decorator"]

    def _signature(self, f: Tree):
        parts = f.children[len(self._decorators(f)) + 1 :]
        params = [self.type(p.children[1]) for p in parts if isinstance(p, Tree) and p.data == "param"]
        ret_node = next(p for p in parts if isinstance(p, Tree) and p.data in ("tensor_type", "tuple_type"))
        return params, self.type(ret_node)

    # -- functions -----------------------------------------------------------------------------
    def function(self, f: Tree) -> Function | None:
        decorators = self._decorators(f)
        rest = f.children[len(decorators):]
        name = str(rest[0])
        self.current = name
        attrs = {}
        for d in decorators:
            key, value = self.decorator(d)
            if key is not None:
                attrs[key] = value
        params: list[Var] = []
        scope: dict[str, Any] = {}
        i = 1
        while isinstance(rest[i], Tree) and rest[i].data == "param":
            pname, pty = rest[i].children
            if str(pname) in scope:
                self.error(DuplicateNameError, f"parameter '{pname}' is declared twice", pname)
            var = Var(str(pname), self.type(pty))
            params.append(var)
            scope[str(pname)] = var
            i += 1
        ret_type_node = rest[i]
        bindings: list[Binding] = []
        n_errors = len(self.errors)
        for b in rest[i + 1 : -1]:
            bname, value_node = b.children
            if str(bname) in scope:
                self.error(DuplicateNameError, f"'{bname}' is already defined in function '{name}'", bname)
                continue
            try:
                value = self.expr(value_node, scope)
            except _Poisoned:
                scope[str(bname)] = _POISON
                continue
            var = Var(str(bname), value.ty)
            scope[str(bname)] = var
            bindings.append(Binding(var, value))
        try:
            ret = self.expr(rest[-1], scope)
        except _Poisoned:
            return None
        if len(self.errors) > n_errors:
            return None
        declared = self.type(ret_type_node)
        if ret.ty != declared:
            self.error(ReturnTypeError, f"function '{name}' is declared to return {declared} but returns {ret.ty}", ret_type_node)
            return None
        return Function(name, params, bindings, ret, attrs)

    def check_calls(self) -> None:
        """Functions may call functions defined anywhere in the module, but not themselves,
        directly or through others (nothing could run them), and calls may nest at most
        MAX_CALL_DEPTH deep. A depth-first walk with its own stack: the chain may be long."""
        state: dict[str, str] = {}  # "open" while on the walk's stack, then "done"
        depth: dict[str, int] = {}  # the longest chain of calls below a finished function
        for root in list(self.calls):
            if root in state:
                continue
            state[root], stack = "open", [(root, iter(self.calls.get(root, ())))]
            while stack:
                fn, pending = stack[-1]
                step = next(pending, None)
                if step is None:
                    stack.pop()
                    state[fn] = "done"
                    depth[fn] = max((depth[c] + 1 for c, _ in self.calls.get(fn, ())), default=0)
                    continue
                callee, where = step
                if state.get(callee) == "open":
                    path = [f for f, _ in stack]
                    cycle = " -> ".join(path[path.index(callee):] + [callee])
                    self.error(RecursionNotSupportedError, f"function '{fn}' calls '{callee}' recursively ({cycle})", where,
                               hint="dpl functions cannot be recursive")
                    return
                if callee not in state:
                    state[callee] = "open"
                    stack.append((callee, iter(self.calls.get(callee, ()))))
        deep = next((f for f in depth if depth[f] > MAX_CALL_DEPTH), None)
        if deep is not None:
            callee, where = max(self.calls[deep], key=lambda c: depth[c[0]])
            self.error(LimitError, f"calls of functions nest {depth[deep]} deep below '{deep}'; the limit is "
                       f"MAX_CALL_DEPTH = {MAX_CALL_DEPTH}", where)

    def decorator(self, d: Tree):
        name, *args = d.children
        key = _DECORATOR_KEYS.get(str(name))
        if str(name) == "primitive" and not args:
            return "Primitive", True
        if str(name) == "attr":
            if len(args) != 1 or not (isinstance(args[0], Tree) and args[0].data == "dec_kwarg"):
                self.error(DplError, "@attr takes one key=value argument", name)
                return None, None
            k, v = args[0].children
            return str(k), self.attr_value(v)
        if key is None or key == "Primitive":
            self.error(DplError, f"unknown decorator '@{name}'", name,
                       hint="decorators: @primitive, @composite(\"...\"), @codegen(\"...\"), @global_symbol(\"...\"), @attr(key=value)")
            return None, None
        if len(args) != 1 or (isinstance(args[0], Tree) and args[0].data == "dec_kwarg"):
            self.error(DplError, f"@{name} takes one value", name)
            return None, None
        return key, self.attr_value(args[0])

    # -- expressions -----------------------------------------------------------------------------
    def expr(self, node, scope) -> Expr:
        kind = node.data
        if kind == "ref":
            return self.ref(node.children[0], scope)
        if kind in ("scalar", "scalar_true", "scalar_false"):
            return self.scalar(node)
        if kind == "tuple_expr":
            return Tuple(tuple(self.expr(c, scope) for c in node.children))
        if kind == "item":
            base = self.expr(node.children[0], scope)
            try:
                index = int_token(node.children[1], self.src, "tuple index")
            except DplError as err:
                self.errors.append(err)
                raise _Poisoned from None
            try:
                return TupleGetItem(base, index)
            except DplError as err:
                self.errors.append(err.with_span(self.span(node)))
                raise _Poisoned from None
        if kind == "call":
            return self.call(node, scope)
        raise AssertionError(kind)

    def ref(self, token: Token, scope) -> Expr:
        name = str(token)
        value = scope.get(name)
        if value is _POISON:
            raise _Poisoned
        if value is not None:
            return value
        if name in self.consts:
            if self.consts[name] is _POISON:
                raise _Poisoned
            return self.consts[name]
        self.error(UndefinedNameError, f"undefined name '{name}'", token)
        raise _Poisoned

    def scalar(self, node: Tree) -> Constant:
        if node.data == "scalar":
            try:
                value = _number(node.children[0].children[0], self.src)
            except DplError as err:
                self.errors.append(err)
                raise _Poisoned from None
            rest = node.children[1:]
        else:
            value = node.data == "scalar_true"
            rest = node.children
        dtype = dtypes.canonical(str(rest[0])) if rest else DEFAULT_LITERAL_DTYPE[type(value)]
        why = dtypes.literal_range_error(value, dtype)
        if why is not None:
            self.error(ConstantValueError, why, node)
            raise _Poisoned
        with np.errstate(all="ignore"):
            return Constant(np.asarray(value, dtype=dtypes.to_numpy(dtype)))

    def call(self, node: Tree, scope) -> Expr:
        op_node, *arg_nodes = node.children
        op = ".".join(str(t) for t in op_node.children)
        args, kwargs, poisoned = [], {}, False
        key_nodes = {}
        for a in arg_nodes:
            if isinstance(a, Tree) and a.data == "kwarg":
                key, value = a.children
                key_nodes[str(key)] = key
                if str(key) in kwargs:
                    self.error(DuplicateNameError, f"attribute '{key}' is given twice", key)
                    poisoned = True
                kwargs[str(key)] = self.attr_value(value)
                continue
            try:
                args.append(self.expr(a, scope))
            except _Poisoned:
                poisoned = True
        if poisoned:
            raise _Poisoned
        if op in self.signatures:
            self.calls.setdefault(self.current, []).append((op, op_node))
            return self.call_function(op, args, kwargs, op_node)
        try:
            return make_call(op, args, kwargs)
        except (UnknownAttributeError, AttributeValueError) as err:
            # point at the attribute the message names, if it was written
            key = next((k for k in key_nodes if f"'{k}'" in err.message), None)
            self.errors.append(err.with_span(self.span(key_nodes[key] if key else op_node)))
            raise _Poisoned from None
        except DplError as err:
            self.errors.append(err.with_span(self.span(op_node)))
            raise _Poisoned from None

    def call_function(self, name: str, args: list[Expr], kwargs, node) -> Call:
        params, ret = self.signatures[name]
        if kwargs:
            self.error(CallError, f"function '{name}' takes no attributes", node)
            raise _Poisoned
        if len(args) != len(params):
            self.error(CallError, f"function '{name}' takes {len(params)} argument{'s' if len(params) != 1 else ''}, got {len(args)}", node)
            raise _Poisoned
        for i, (a, t) in enumerate(zip(args, params)):
            if a.ty != t:
                self.error(CallError, f"argument {i} of '{name}' must be {t}, got {a.ty}", node)
                raise _Poisoned
        return call_function(GlobalVar(name), args, ret)

    def attr_value(self, node) -> Any:
        kind = node.data
        if kind == "attr_number":
            return _number(node.children[0].children[0], self.src)
        if kind == "attr_true":
            return True
        if kind == "attr_false":
            return False
        if kind == "attr_none":
            return None
        if kind == "attr_string":
            return unescape_string(node.children[0], self.src)
        if kind == "attr_list":
            return tuple(self.attr_value(c) for c in node.children)
        if kind == "attr_name":
            return str(node.children[0])
        raise AssertionError(kind)


def parse(text: str, filename: str = "<string>", constants: Mapping[str, np.ndarray] | None = None) -> Module:
    """The module a text describes; ``constants`` supplies values of constants declared
    without one (dpl.load passes the sidecar .npz)."""
    reader = _Reader(text, filename, constants)
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as err:
        raise syntax_error(err, reader.src, _lark()) from None
    check_nesting(tree, reader.src)
    return reader.module(tree)
