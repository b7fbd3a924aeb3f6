"""Lowering: a Primitive function (one fused group) becomes one :class:`~dpl.kernel.ir.Kernel`.

Each output gets a loop nest over its index space, and the group is inlined into the stored
value by asking, recursively, "what is binding ``v`` at index ``idx``?" (:meth:`Lowerer.value`).
Elementwise and injective producers answer with an index map onto their operands; reductions,
matrix products and the high-level row ops answer with :class:`~dpl.kernel.ir.Reduce`
statements. Every statement is hoisted to the outermost loop at which all it reads is defined,
so a reduction over a row lands once per row, before the loop that uses it: that is what makes
a softmax, a norm or a matmul with its epilogue one pass. The per-op rules live in
:mod:`dpl.kernel.rules`. No intermediate buffer exists in the result: the only buffers are the
function's parameters, its non-scalar constants and its outputs.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Callable, Sequence

import numpy as np

from dpl import dtypes
from dpl.errors import DplError
from dpl.ir.dim_binding import undetermined
from dpl.ir.extent_symbols import with_extent_symbols
from dpl.ir.expr import Call, Constant, Expr as IRExpr, Function, GlobalVar, Module, Tuple, TupleGetItem, Var as IRVar
from dpl.ir.types import TensorType
from dpl.kernel import ir
from dpl.kernel.ir import INDEX, Axis, Bin, Buffer, Const, Kernel, Let, Load, Loop, Op, Reduce, Store, Var
from dpl.ops.registry import CallInfo, check_attrs, describe, get_op

# How each op lowers: filled by dpl.kernel.rules (imported by the dpl.kernel package, so before
# any lowering), keyed by op name; ELEMENTWISE lowers an op by its C template, TUPLE_ITEM an item
# of a tuple. The table lives here, below the rules, so that the rules import the Lowerer and
# not the other way round.
RULES: dict = {}
ELEMENTWISE, TUPLE_ITEM = "<elementwise>", "<tuple item>"


class LoweringError(DplError):
    """A fused group holds something that has no place in a single kernel."""


def op_lowering(name: str) -> tuple[bool, str]:
    """Whether the kernel IR lowers op ``name``, and how, as the Lowerer decides: by a rule of
    its own (one that only raises refuses the op: ``take``), else by its C template; an op with
    a tuple result lowers item by item when the tuple-item rule names it (``split``). The
    backends ask it which single ops they have kernels for; ``dpl ops`` prints it."""
    import dis

    def returns(fn) -> bool:  # a rule whose body only raises has no return
        return any(i.opname.startswith("RETURN") for i in dis.get_instructions(fn))

    def where(fn) -> str:
        return f"{fn.__module__}.{fn.__name__}"

    rule = RULES.get(name)
    if rule is not None:
        if not returns(rule):
            return False, f"its rule {where(rule)} only raises LoweringError: the op never joins a dpl kernel"
        return True, f"its rule {where(rule)}"
    if get_op(name).c_expr is not None:
        return True, "its C template"
    item = RULES[TUPLE_ITEM]
    if name in item.__code__.co_consts:
        return True, f"the tuple-item rule {where(item)}, one item at a time"
    return False, "the kernel IR has no lowering for it: it runs by its NumPy reference"


def lower_function(fn: Function, name: str | None = None) -> Kernel:
    """The one kernel computing ``fn``, or a :class:`LoweringError` naming what cannot be lowered.
    An extent no buffer determines the symbols of (``(n + 1) // 2 - 1``) gets a kernel symbol of
    its own (:func:`dpl.ir.extent_symbols.with_extent_symbols`)."""
    # inlining recurses along the group's chains: allow a few frames per binding
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 1000 + 8 * len(fn.bindings)))
    try:
        return Lowerer(with_extent_symbols(flatten_tuples(fn))).kernel(name or fn.name)
    finally:
        sys.setrecursionlimit(limit)


def flatten_tuples(fn: Function) -> Function:
    """``fn`` with tuple parameters split into one tensor parameter per leaf and tuple results
    into one result per leaf, in the order the runtime flattens them: a single ``concat`` (its
    operand is a tuple) or ``split`` (its result is one) is then a kernel like any other."""
    from dpl.ir.types import TupleType
    from dpl.ir.traverse import substitute

    if not any(isinstance(p.ty, TupleType) for p in fn.params) and \
            not any(isinstance(r.ty, TupleType) for r in (fn.ret.fields if isinstance(fn.ret, Tuple) else (fn.ret,))):
        return fn
    params, table = [], {}

    def leaves_of(name: str, ty):
        if isinstance(ty, TupleType):
            return Tuple(tuple(leaves_of(f"{name}_{i}", t) for i, t in enumerate(ty.fields)))
        params.append(IRVar(name, ty))
        return params[-1]

    for p in fn.params:
        if isinstance(p.ty, TupleType):
            table[id(p)] = leaves_of(p.name, p.ty)
        else:
            params.append(p)
    results = []

    def flatten_result(e):
        if isinstance(e.ty, TupleType):
            for i in range(len(e.ty.fields)):
                flatten_result(e.fields[i] if isinstance(e, Tuple) else TupleGetItem(e, i))
        else:
            results.append(e)

    flatten_result(fn.ret)
    bindings = tuple(b if not table else type(b)(b.var, substitute(b.value, table)) for b in fn.bindings)
    ret = substitute(results[0] if len(results) == 1 else Tuple(tuple(results)), table)
    return Function(fn.name, tuple(params), bindings, ret, fn.attrs)


def symbolic_dims(fn: Function) -> set[str]:
    """Every symbolic dim of the types in ``fn`` (its parameters, bindings and results)."""
    from dpl.ir.types import TupleType

    found: set[str] = set()

    def visit(ty):
        if isinstance(ty, TupleType):
            for t in ty.fields:
                visit(t)
        elif isinstance(ty, TensorType):
            for d in ty.shape:
                found.update(ir.dim_symbols(d))

    for v in (*fn.params, *(b.var for b in fn.bindings)):
        visit(v.ty)
    for r in fn.ret.fields if isinstance(fn.ret, Tuple) else (fn.ret,):
        visit(r.ty)
    return found


def is_kernel_function(fn: Function) -> bool:
    """Functions dpl's own kernels compile: fused groups and ``kernel.*`` composites."""
    composite = fn.attrs.get("Composite")
    return bool(fn.attrs.get("Primitive")) and (composite is None or str(composite).startswith("kernel."))


def lower_module(mod: Module) -> dict[str, Kernel]:
    """A kernel for every Primitive function of ``mod`` (other composites are left to their backend)."""
    return {name: lower_function(fn) for name, fn in mod.functions.items() if is_kernel_function(fn)}


# -- index arithmetic with constant folding ----------------------------------------------------


def idx_const(v: int) -> Const:
    return Const(int(v), INDEX)


def dim(d) -> ir.Expr:
    """A dimension (int, symbol or expression) as index arithmetic (see ``ir.dim_expr``)."""
    return ir.dim_expr(d)


def _is(e, v) -> bool:
    return isinstance(e, Const) and e.value == v


def add(a, b):
    if isinstance(a, Const) and isinstance(b, Const):
        return idx_const(a.value + b.value)
    if _is(b, 0):
        return a
    if _is(a, 0):
        return b
    if isinstance(b, Const) and b.value < 0:
        return Bin("-", a, idx_const(-b.value))
    return Bin("+", a, b)


def sub(a, b):
    if isinstance(b, Const):
        return add(a, idx_const(-b.value))
    return Bin("-", a, b)


def mul(a, b):
    if isinstance(a, Const) and isinstance(b, Const):
        return idx_const(a.value * b.value)
    if _is(a, 0) or _is(b, 0):
        return idx_const(0)
    if _is(b, 1):
        return a
    if _is(a, 1):
        return b
    return Bin("*", a, b)


def div(a, b):
    if isinstance(a, Const) and isinstance(b, Const):
        return idx_const(a.value // b.value)
    return a if _is(b, 1) else Bin("/", a, b)


def mod(a, b):
    if isinstance(a, Const) and isinstance(b, Const):
        return idx_const(a.value % b.value)
    return idx_const(0) if _is(b, 1) else Bin("%", a, b)


def conj(*conds):
    conds = [c for c in conds if c is not None]
    if not conds:
        return None
    out = conds[0]
    for c in conds[1:]:
        out = Bin("&&", out, c)
    return out


def accum_dtype(dtype: str) -> str:
    """Accumulate and compute row statistics in f32 at least, integers in i64: the numerical
    contract's accumulator, which the interpreter's references use too."""
    return dtypes.accumulator(dtype)


def broadcast_index(arg_shape: Sequence, out_shape: Sequence, idx: tuple) -> tuple:
    """The index of a broadcast operand: aligned from the right, unit dims read at 0."""
    r, R = len(arg_shape), len(idx)
    return tuple(
        idx_const(0) if arg_shape[k] == 1 and out_shape[R - r + k] != 1 else idx[R - r + k] for k in range(r)
    )


# -- the lowerer -------------------------------------------------------------------------------


def _operands(e: IRExpr):
    if isinstance(e, Call):
        return e.args
    if isinstance(e, Tuple):
        return e.fields
    if isinstance(e, TupleGetItem):
        return (e.tuple_value,)
    return ()


MAX_INLINE = 48  # a binding's expression larger than this many nodes becomes a local


def _larger_than(e: ir.Expr, limit: int) -> bool:
    """Whether ``e`` has more than ``limit`` nodes (stops counting early)."""
    todo, n = [e], 0
    while todo:
        n += 1
        if n > limit:
            return True
        todo.extend(ir.children(todo.pop()))
    return False


def _trivial(e: ir.Expr) -> bool:
    return isinstance(e, (Const, Var, Load, Bin))


class Lowerer:
    """Lowers one function. Holds the open scopes: ``scopes[0]`` is the kernel level, each loop
    or reduction opens one more; a statement goes to the deepest scope among what it reads."""

    def __init__(self, fn: Function):
        self.fn = fn
        for p in fn.params:
            if not isinstance(p.ty, TensorType):
                raise LoweringError(f"function '{fn.name}': parameter '{p.name}' has type {p.ty}; kernels take tensors")
        self.params = {id(p): p for p in fn.params}
        self.defs = {id(b.var): b for b in fn.bindings}
        self.uses = Counter(id(a) for b in fn.bindings for a in _operands(b.value))
        self.uses.update(id(a) for a in (fn.ret.fields if isinstance(fn.ret, Tuple) else (fn.ret,)))
        # loop variables, locals and buffers share one namespace with the symbolic dims
        self.taken: set[str] = {p.name for p in fn.params} | symbolic_dims(fn)
        self.constants: dict[str, np.ndarray] = {}
        self.const_names: dict[int, str] = {}
        self.anchors: list[str] = []
        self.requires: list[tuple] = []  # (small, large) dims a rule's index map assumes
        self.scopes: list[list] = [[]]
        self.depth: dict[str, int] = {}
        self.memo: dict = {}
        self.guarded = 0

    # -- names and scopes

    def fresh(self, hint: str) -> str:
        name, k = hint, 1
        while name in self.taken:
            name, k = f"{hint}_{k}", k + 1
        self.taken.add(name)
        return name

    def place(self, stmt, name: str) -> None:
        where = max((self.depth.get(v, 0) for v in ir.free_vars(stmt)), default=0)
        self.scopes[where].append(stmt)
        self.depth[name] = where

    def let(self, hint: str, value: ir.Expr) -> ir.Expr:
        if _trivial(value) or self.guarded:
            return value  # inside a guarded branch nothing may run unconditionally
        name = self.fresh(hint)
        self.place(Let(name, value), name)
        return Var(name, value.dtype)

    def read_first(self, hint: str, value: ir.Expr) -> ir.Expr:
        """``value`` as a local when it reads a buffer (evaluated before the statement that
        uses it, whatever that statement selects)."""
        if isinstance(value, (Const, Var)) or not any(isinstance(e, Load) for e in ir.walk_exprs(value)):
            return value
        name = self.fresh(hint)
        self.place(Let(name, value), name)
        return Var(name, value.dtype)

    def invariant(self, value: ir.Expr) -> bool:
        """Whether ``value`` does not change in the innermost open loop (so a Let hoists it)."""
        if _trivial(value):
            return False
        return max((self.depth.get(v, 0) for v in ir.free_vars(value)), default=0) < len(self.scopes) - 1

    def reduce(self, hint: str, combiner: str, dtype: str, extents: Sequence, body: Callable[[list], ir.Expr]) -> ir.Expr:
        """A local folded with ``combiner`` over fresh loops of ``extents``; ``body(rvars)`` is
        the value at one point. Unit extents become the index 0 and no loop."""
        if self.guarded:
            raise LoweringError("a reduction cannot feed a padded window (convolution or pooling) in the same kernel")
        rvars, axes = [], []
        self.scopes.append([])
        level = len(self.scopes) - 1
        for e in extents:
            if e == 1:
                rvars.append(idx_const(0))
                continue
            v = Var(self.fresh("r"), INDEX)
            self.depth[v.name] = level
            rvars.append(v)
            axes.append(Axis(v, dim(e)))
        value = self.cast(body(rvars), dtype)
        stmts = self.scopes.pop()
        if not axes:
            for s in stmts:  # nothing to fold: the prologue's locals move out
                self.place(s, s.name)
            return value
        name = self.fresh(hint)
        self.place(Reduce(name, dtype, combiner, reduce_init(combiner, dtype), axes, stmts, value), name)
        return Var(name, dtype)

    def guard(self, cond, then: Callable[[], ir.Expr], otherwise: ir.Expr) -> ir.Expr:
        """``cond ? then() : otherwise``, with ``then`` evaluated only where ``cond`` holds."""
        if cond is None:
            return then()
        self.guarded += 1
        try:
            value = then()
        finally:
            self.guarded -= 1
        return ir.Select(cond, value, self.cast(otherwise, value.dtype))

    # -- scalar constructors

    def op(self, name: str, *args: ir.Expr, **attrs) -> Op:
        opdef = get_op(name)
        full = check_attrs(opdef, attrs)
        if opdef.c_expr is not None:  # a template naming an operand twice gets it as a local
            args = tuple(self.let(f"{name.split('.')[-1]}_arg", a) if opdef.c_expr.count(f"{{{k}}}") > 1 else a for k, a in enumerate(args))
        if name == "where" and not self.guarded:
            # both sides are whole tensors, in bounds at every index: read before the select,
            # as C's ?: would read only one. GCC vectorises a conditional read only where it
            # is contiguous (a masked load), so one strided side kept the whole loop scalar
            # (T5's position bias, read with the heads' stride: 0.73 ms at 1x512)
            args = (args[0], *(self.read_first(f"where_{side}", a) for side, a in zip("ab", args[1:])))
        info = CallInfo(name, tuple(TensorType((), a.dtype) for a in args), full)
        return Op(name, args, tuple(full.items()), opdef.infer(info).dtype)

    def cast(self, e: ir.Expr, dtype: str) -> ir.Expr:
        if e.dtype == dtype:
            return e
        if isinstance(e, Const):
            return const(e.value, dtype)
        return self.op("astype", e, dtype=dtype)

    # -- the group, inlined

    def load(self, name: str, dtype: str, idx: tuple) -> Load:
        return Load(name, idx, dtype)

    def value(self, e: IRExpr, idx: tuple) -> ir.Expr:
        """The scalar value of dataflow expression ``e`` at index ``idx``."""
        if isinstance(e, IRVar):
            if id(e) in self.params:
                return self.load(e.name, e.ty.dtype, idx)
            binding = self.defs.get(id(e))
            if binding is None:
                raise LoweringError(f"function '{self.fn.name}': '{e.name}' is not defined in it")
            key = (id(e), idx, self.guarded > 0)
            hit = self.memo.get(key)
            if hit is not None:
                return hit
            try:
                v = self.value(binding.value, idx)
            except LoweringError as err:
                if "binding '" not in err.message:
                    err.message = f"function '{self.fn.name}', binding '{e.name} = {describe(binding.value)}': {err.message}"
                    err.args = (err.message,)
                raise
            if self.uses[id(e)] > 1 or self.invariant(v) or _larger_than(v, MAX_INLINE):
                v = self.let(e.name, v)
            self.memo[key] = v
            return v
        if isinstance(e, Constant):
            if e.is_scalar:
                return const(e.value.item(), e.ty.dtype)
            name = self.const_names.get(id(e))
            if name is None:
                name = self.fresh(e.name or "c")
                self.const_names[id(e)] = name
                self.constants[name] = np.asarray(e.value)
            return self.load(name, e.ty.dtype, idx)
        if isinstance(e, Call):
            return self.call(e, idx)
        if isinstance(e, TupleGetItem):
            return RULES[TUPLE_ITEM](self, e, idx)
        raise LoweringError(f"a {type(e).__name__} value cannot be used as a tensor inside a kernel")

    def call(self, c: Call, idx: tuple) -> ir.Expr:
        if isinstance(c.op, GlobalVar):
            raise LoweringError(f"call of function '{c.op.name}' cannot be inlined into a kernel")
        rule = RULES.get(c.op)
        if rule is not None:
            return rule(self, c, idx)
        if get_op(c.op).c_expr is not None:
            return RULES[ELEMENTWISE](self, c, idx)
        raise LoweringError(f"op '{c.op}' has no kernel lowering (it is opaque to fusion)")

    # -- nests and the kernel

    def nest(self, shape: tuple, stores: list, order: Sequence[int] | None = None) -> list:
        """One loop nest over ``shape`` storing each output ``(buffer, value, axes)``, where
        ``axes`` maps each output axis to a nest axis (None: a unit axis, index 0);
        ``order`` lists the nest axes from the outermost loop in."""
        self.memo = {}
        self.scopes = [[]]
        idx = [idx_const(0) if d == 1 else None for d in shape]
        loops = []
        self.loop_axis: dict[str, int] = {}
        for k in order if order is not None else range(len(shape)):
            if shape[k] == 1:
                continue
            v = Var(self.fresh(f"i{k}"), INDEX)
            self.scopes.append([])
            self.depth[v.name] = len(self.scopes) - 1
            loops.append((v, dim(shape[k])))
            self.loop_axis[v.name] = k
            idx[k] = v
        idx = tuple(idx)
        for buf, e, axes in stores:
            at = tuple(idx_const(0) if a is None else idx[a] for a in axes)
            store = Store(buf.name, at, self.cast(self.value(e, at), buf.dtype))
            # an output over fewer axes is stored in the loop of the last axis it has
            self.scopes[max((self.depth.get(v, 0) for v in ir.free_vars(store)), default=0)].append(store)
        body = list(self.scopes[-1])
        for k in reversed(range(len(loops))):
            var, extent = loops[k]
            body = self.scopes[k] + [Loop(var, extent, tuple(body))]
        return body

    def ordered_nest(self, shape: tuple, stores: list) -> list:
        """The nest, with the axes a reduction does not depend on moved innermost when that
        saves recomputing it (a softmax over a middle axis runs once per row, not per element)."""
        saved = set(self.taken), dict(self.constants), dict(self.const_names), list(self.anchors)
        body = self.nest(shape, stores)
        order = [k for k, d in enumerate(shape) if d != 1]
        var_axis = self.loop_axis
        wasted = set()
        for stmt, loops in _with_loops(body, ()):
            if isinstance(stmt, Reduce):
                free = ir.free_vars(stmt)
                wasted |= {var_axis[v] for v in loops if v in var_axis and v not in free}
        if not wasted or order[-len(wasted):] == sorted(wasted):
            return body
        self.taken, self.constants, self.const_names, self.anchors = set(saved[0]), dict(saved[1]), dict(saved[2]), list(saved[3])
        return self.nest(shape, stores, [k for k in order if k not in wasted] + sorted(wasted))

    def kernel(self, name: str) -> Kernel:
        fn = self.fn
        rets = fn.ret.fields if isinstance(fn.ret, Tuple) else (fn.ret,)
        outputs = []
        for k, r in enumerate(rets):
            if not isinstance(r.ty, TensorType):
                raise LoweringError(f"function '{fn.name}': result {k} has type {r.ty}; kernels write tensors")
            hint = r.name if isinstance(r, IRVar) else f"out{k}"
            outputs.append(Buffer(self.fresh(hint if hint not in self.taken else f"{hint}_out"), r.ty.shape, r.ty.dtype))
        # outputs share a nest when one's axes fit into another's (a row statistic and the row)
        nests: list[tuple[tuple, list]] = []
        by_size = sorted(range(len(rets)), key=lambda k: -sum(d != 1 for d in rets[k].ty.shape))
        for k in by_size:
            shape = rets[k].ty.shape
            for nest_shape, stores in nests:
                axes = fit_axes(shape, nest_shape)
                if axes is not None:
                    stores.append((outputs[k], rets[k], axes))
                    break
            else:
                nests.append((shape, [(outputs[k], rets[k], fit_axes(shape, shape))]))
        body = []
        for shape, stores in nests:
            body.extend(self.ordered_nest(shape, stores))
        params = [Buffer(p.name, p.ty.shape, p.ty.dtype) for p in fn.params]
        kernel = Kernel(name, params, outputs, body, classify(body, self.anchors), self.constants,
                        tuple(dict.fromkeys(self.requires)))
        requires = {s for pair in kernel.requires for d in pair for s in ir.dim_symbols(d)}
        unknown = sorted((ir.block_free_vars(body) | requires) - set(kernel.dims))
        if unknown:  # e.g. arange(end=n) reduced away: no buffer tells the kernel what n is
            raise LoweringError(f"function '{fn.name}': symbolic dimension(s) {', '.join(unknown)} appear in no "
                                "parameter or result, so the kernel cannot know their values")
        unsolved = undetermined([b.shape for b in (*params, *outputs)])
        if unsolved:  # only n * m and m * k: the sizes give no one value of each
            raise LoweringError(f"function '{fn.name}': the symbol(s) {', '.join(unsolved)} appear only in "
                                "dimensions that no buffer's size determines (each must be a lone symbol or "
                                "linear in one unknown once the others are bound)")
        return kernel


def fit_axes(sub: tuple, shape: tuple) -> list | None:
    """Nest axes for each axis of an output of shape ``sub`` inside a nest over ``shape``, in
    order and with equal sizes (None for unit axes); None when it does not fit."""
    axes, k = [], 0
    for d in sub:
        if d == 1:
            axes.append(None)
            continue
        while k < len(shape) and shape[k] != d:
            k += 1
        if k == len(shape):
            return None
        axes.append(k)
        k += 1
    return axes


def _with_loops(stmts, loops: tuple):
    """Each statement with the names of the output loops around it."""
    for s in stmts:
        yield s, loops
        if isinstance(s, Loop):
            yield from _with_loops(s.body, loops + (s.var.name,))
        elif isinstance(s, Reduce):
            yield from _with_loops(s.body, loops)


def const(value, dtype: str) -> Const:
    if dtype == "bool":
        return Const(bool(value), dtype)
    if dtypes.is_float(dtype):
        return Const(float(value), dtype)
    return Const(int(value), dtype)


def reduce_init(combiner: str, dtype: str) -> Const:
    if combiner == "add":
        return const(0, dtype)
    if combiner == "multiply":
        return const(1, dtype)
    big = float("inf") if dtypes.is_float(dtype) else np.iinfo(dtype).max
    if combiner == "maximum":
        return const(-big if dtypes.is_float(dtype) else np.iinfo(dtype).min, dtype)
    if combiner == "minimum":
        return const(big, dtype)
    raise LoweringError(f"no identity for the reduction combiner '{combiner}'")


def classify(body, anchors: list[str]) -> str:
    """``matmul``/``conv2d``/``pool`` for an anchor; ``row`` when a block computes a reduction
    and then loops over the row with it; ``reduce``; else ``elementwise``."""
    for a in ("matmul", "conv2d", "pool"):
        if a in anchors:
            return a
    blocks = [body] + [s.body for s in ir.walk(body) if isinstance(s, Loop)]
    has_reduce = False
    for block in blocks:
        seen = False
        for s in block:
            if isinstance(s, Reduce):
                seen = has_reduce = True
            elif seen and isinstance(s, Loop):
                return "row"
    return "reduce" if has_reduce else "elementwise"
