"""Convolutions in channels-last layout (TVM's ConvertLayout, for NHWC): each NCHW ``nn.conv2d``
becomes an NHWC one with OHWI weights, and the layout travels on through what lies between
convolutions, so a chain of them pays for one ``permute_dims`` where it starts and one where
its values leave it, not two per convolution.

Why: the CPU's convolutions run faster on channels-last data (torch's oneDNN, one thread, 3x3
64 -> 64 at 56x56: 1.17 ms against 1.98 in NCHW; ResNet's 7x7 stem 1.33 against 3.02), and a
1x1 convolution over NHWC data is one matrix product of the data as it lies.

What carries the layout: convolutions and pools (``layout="NHWC"``), elementwise ops whose
other operands are constants (broadcast shapes transposed: a batch norm's (1, C, 1, 1)
becomes (1, 1, 1, C); a Constant is transposed here, a value computed from constants by a
``permute_dims`` that ``fold`` computes), a mean over the spatial axes, and the reshapes that
read the same elements in either layout (a global pool's (N, C, 1, 1) flattened; a patch
embedding's ``(N, C, H*W)`` transposed to ``(N, H*W, C)``). Anything else reads the NCHW value,
made by one ``permute_dims`` where first needed and bound to the variable the input module
used, so outputs and later ops keep their names and types. A ``permute_dims`` back to NCHW of
a channels-last value is cancelled where the layout wants it again. Results are unchanged:
every rewrite computes the same elements, in another order in memory.

The input module is not changed.
"""

from __future__ import annotations

from typing import Callable

import attrs
import numpy as np

from dpl.errors import DplError
from dpl.ir.collector import paused_collector
from dpl.ir.expr import Binding, Call, Constant, Expr, Function, Module, Var
from dpl.ir.traverse import leaves, substitute
from dpl.ir.types import TensorType
from dpl.ops.registry import get_op, make_call

LAYOUTS = ("NHWC",)  # what the pass converts to (the ops also take NCHW, the frontends' layout)
TO_NHWC = (0, 2, 3, 1)  # permute_dims axes: NCHW -> NHWC, and OIHW -> OHWI
TO_NCHW = (0, 3, 1, 2)
POOLS = ("nn.max_pool2d", "nn.avg_pool2d", "nn.adaptive_avg_pool2d")
REDUCTIONS = ("mean", "sum", "max")
# a global pool of a returned map reads the NCHW copy the return makes: each channel's map in
# one pass (ResNet's pooler: 0.02 ms against 0.10 for the channels-last reduction)
GLOBAL_POOLS = ("nn.adaptive_avg_pool2d", *REDUCTIONS)
_FUNCTION_ATTRS = ("Composite", "Codegen", "Primitive")


def convert_layout(mod: Module, layout: str = "NHWC") -> Module:
    """``mod`` with its NCHW convolutions (and what lies between them) in ``layout``."""
    if layout not in LAYOUTS:
        raise DplError(f"convert-layout converts to {', '.join(LAYOUTS)}, not {layout!r}",
                       hint="NCHW is the frontends' layout: leave the pass out to keep it")
    with paused_collector():  # see dpl.ir.collector
        functions = {name: convert_function(fn) for name, fn in mod.functions.items()}
    if all(functions[name] is fn for name, fn in mod.functions.items()):
        return mod
    return Module(functions)


def convert_function(func: Function) -> Function:
    """``func`` with its NCHW convolutions channels-last (itself where it has none)."""
    if any(key in func.attrs for key in _FUNCTION_ATTRS):
        return func
    if not any(_is_nchw_conv(b.value) for b in func.bindings):
        return func
    return _Converter(func).run()


def _is_nchw_conv(value) -> bool:
    return (isinstance(value, Call) and value.op == "nn.conv2d" and value.attrs.get("data_layout", "NCHW") == "NCHW"
            and value.ty.ndim == 4)


def _is_permute(value, axes: tuple) -> bool:
    return isinstance(value, Call) and value.op == "permute_dims" and tuple(value.attrs["axes"] or ()) == axes


class _Converter:
    """One walk over a function's bindings, emitting the converted ones in order."""

    def __init__(self, func: Function):
        self.func = func
        self.out: list[Binding] = []
        self.bound = {id(b.var): b.value for b in func.bindings}
        self.names = {v.name for v in func.params} | {b.var.name for b in func.bindings}
        self.nhwc: dict[int, Expr] = {}  # id(variable of the input) -> its value in NHWC
        self.pending: dict[int, tuple[Var, Callable[[], Call]]] = {}  # NCHW values not made yet
        self.from_constants: set[int] = set()  # variables computed from constants alone (fold's work)
        self.flat_tokens: dict[int, Expr] = {}  # id((N, C, H*W) variable) -> the (N, H*W, C) value
        self.constants: dict[int, Constant] = {}  # id(constant) -> it transposed
        self.returned = {id(v) for v in leaves(func.ret)}

    def run(self) -> Function:
        for b in self.func.bindings:
            self.visit(b)
        ret = substitute(self.func.ret, self.nchw)
        return attrs.evolve(self.func, bindings=tuple(self.out), ret=ret)

    # -- values in either layout ---------------------------------------------------------

    def emit(self, base: str, call: Call) -> Var:
        name, i = f"{base}_nhwc", 1
        while name in self.names:
            name, i = f"{base}_nhwc{i}", i + 1
        self.names.add(name)
        var = Var(name, call.ty)
        self.out.append(Binding(var, call))
        return var

    def nchw(self, e: Expr) -> Expr:
        """The NCHW (input-module) value of leaf ``e``, made from its NHWC one where it has no other."""
        made = self.pending.pop(id(e), None) if isinstance(e, Var) else None
        if made is not None:
            var, make = made
            self.out.append(Binding(var, make()))  # the input's own variable: names and types kept
        return e

    def to_nhwc(self, e: Expr) -> Expr:
        """Leaf ``e`` (a 4-D NCHW value) in NHWC: its channels-last twin, a cancelled permute, a
        transposed constant, or a new ``permute_dims``."""
        if id(e) in self.nhwc:
            return self.nhwc[id(e)]
        if isinstance(e, Constant):
            return self.transposed(e)
        value = self.bound.get(id(e))
        if _is_permute(value, TO_NCHW):  # permute_dims(permute_dims(v, TO_NCHW), TO_NHWC) is v
            return self.nchw(value.args[0])
        twin = self.emit(e.name, make_call("permute_dims", [self.nchw(e)], {"axes": TO_NHWC}))
        self.nhwc[id(e)] = twin
        return twin

    def transposed(self, c: Constant) -> Constant:
        """Constant ``c`` (rank <= 4, NCHW or OIHW, broadcast from the right) channels-last,
        once per constant."""
        if id(c) not in self.constants:
            value = np.transpose(c.value.reshape((1,) * (4 - c.value.ndim) + c.value.shape), TO_NHWC)
            self.constants[id(c)] = Constant(np.ascontiguousarray(value), name=None if c.name is None else f"{c.name}_nhwc")
        return self.constants[id(c)]

    def broadcast_operand(self, e: Expr) -> Expr | None:
        """An operand of an elementwise op with a 4-D NCHW result, as the NHWC op reads it;
        None where that would cost a permute at run time (a value not from constants)."""
        if id(e) in self.nhwc:
            return self.nhwc[id(e)]
        ty = e.ty
        if not isinstance(ty, TensorType) or ty.ndim == 0:
            return e
        if isinstance(e, Constant):
            return self.transposed(e)
        if isinstance(e, Var) and id(e) in self.from_constants:
            if ty.ndim < 4:
                e = self.emit(e.name, make_call("expand_dims", [e], {"axis": tuple(range(4 - ty.ndim))}))
            return self.emit(e.name, make_call("permute_dims", [e], {"axes": TO_NHWC}))
        return None

    def keep(self, b: Binding) -> None:
        """``b`` as the input wrote it, its operands in NCHW."""
        value = substitute(b.value, self.nchw)
        self.out.append(b if value is b.value else Binding(b.var, value))
        if isinstance(value, Call) and all(isinstance(a, Constant) or id(a) in self.from_constants
                                           for a in leaves(value)):
            self.from_constants.add(id(b.var))

    def channels_last(self, b: Binding, call: Call) -> None:
        """``b``'s value is ``call``, in NHWC: the NCHW one made only if something reads it."""
        twin = self.emit(b.var.name, call)
        self.nhwc[id(b.var)] = twin
        self.pending[id(b.var)] = (b.var, lambda: make_call("permute_dims", [twin], {"axes": TO_NCHW}))

    # -- the rules -----------------------------------------------------------------------

    def visit(self, b: Binding) -> None:
        value = b.value
        if not isinstance(value, Call) or not isinstance(value.op, str):
            return self.keep(b)
        op = value.op
        if _is_nchw_conv(value):
            x, w = value.args
            new_attrs = {**value.attrs, "data_layout": "NHWC", "kernel_layout": "OHWI"}
            return self.channels_last(b, make_call(op, [self.to_nhwc(x), self.to_nhwc(w)], new_attrs))
        args = value.args
        if op in GLOBAL_POOLS and id(args[0]) in self.returned:
            return self.keep(b)  # its NCHW input is made anyway, and pools faster as it lies
        if op in POOLS and value.attrs.get("layout", "NCHW") == "NCHW" and id(args[0]) in self.nhwc:
            return self.channels_last(b, make_call(op, [self.nhwc[id(args[0])]], {**value.attrs, "layout": "NHWC"}))
        if get_op(op).c_expr is not None and _rank(value) == 4 and any(id(a) in self.nhwc for a in args):
            operands = [self.broadcast_operand(a) for a in args]
            if all(o is not None for o in operands):
                return self.channels_last(b, make_call(op, operands, value.attrs))
        if op in REDUCTIONS and args and id(args[0]) in self.nhwc and self.spatial_reduce(b, value):
            return None
        if op == "reshape" and args and self.reshape(b, value):
            return None
        if op == "permute_dims" and args and id(args[0]) in self.flat_tokens and tuple(value.attrs["axes"] or ()) == (0, 2, 1):
            return self.out.append(Binding(b.var, self.flat_tokens[id(args[0])]))  # the tokens as they lie
        return self.keep(b)

    def spatial_reduce(self, b: Binding, value: Call) -> bool:
        """A reduction over H and W (a global pool): over axes 1 and 2 of the NHWC value."""
        axes = value.attrs.get("axis")
        if axes is None or sorted(a % 4 for a in axes) != [2, 3]:
            return False
        call = make_call(value.op, [self.nhwc[id(value.args[0])]], {**value.attrs, "axis": (1, 2)})
        if value.attrs.get("keepdims"):
            self.channels_last(b, call)
        else:  # (N, C) either way
            self.out.append(Binding(b.var, call))
        return True

    def reshape(self, b: Binding, value: Call) -> bool:
        """Reshapes that read an NHWC value's elements in the order NCHW would: a map of one
        pixel flattened to (N, C), and (N, C, H, W) -> (N, C, H*W), whose transpose to
        (N, H*W, C) (a patch embedding's tokens) is the NHWC value reshaped."""
        x = value.args[0]
        if id(x) not in self.nhwc:
            return False
        twin = self.nhwc[id(x)]
        n, c, h, w = value.args[0].ty.shape
        shape = value.ty.shape
        if h == 1 and w == 1 and tuple(shape) == (n, c):
            self.out.append(Binding(b.var, make_call("reshape", [twin], {"shape": tuple(shape)})))
            return True
        if len(shape) == 3 and shape[0] == n and shape[1] == c and self._flattens(h, w, shape[2]):
            tokens = make_call("reshape", [twin], {"shape": (n, shape[2], c)})
            self.flat_tokens[id(b.var)] = tokens
            self.pending[id(b.var)] = (b.var, lambda: make_call("permute_dims", [self.emit(b.var.name, tokens)],
                                                                {"axes": (0, 2, 1)}))
            return True
        return False

    @staticmethod
    def _flattens(h, w, hw) -> bool:
        return isinstance(h, int) and isinstance(w, int) and hw == h * w


def _rank(call: Call) -> int:
    ty = call.ty
    return ty.ndim if isinstance(ty, TensorType) else -1
