"""The clean-up Relax runs between rewrites: CanonicalizeBindings, EliminateCommonSubexpr and
RemoveAllUnused, on dpl functions (one block of pure bindings; the returned variables play
the part of Relax's non-dataflow outputs).

``canonicalize_bindings`` folds what is known about a binding into its uses:
* a trivial binding ``y = x`` is removed and ``y`` read as ``x`` (chains followed);
* a tuple item of a tuple known at that point (``d = (a, b); e = d[0]``, through aliases) is
  the field itself, so ``e`` becomes a trivial binding of ``a``;
* a binding of a constant is inlined into its uses;
* when the alias ``y = x`` is returned and ``x`` is an intermediate nobody returns, ``x``'s
  binding is renamed ``y`` instead (Relax keeps the output variable's name).

``eliminate_common_subexpr`` turns a binding whose value equals an earlier one's (same op,
attributes, type and operands) into a trivial binding of the earlier variable.
``remove_dead_bindings`` drops what the return does not (transitively) use. ``simplify``
repeats the three until nothing changes, as Relax's ``rewrite_call`` does after every round.
Each returns its input object when it changes nothing.
"""

from __future__ import annotations

from typing import Any, Mapping

import attrs
import numpy as np

from dpl.ir.expr import Binding, Call, Constant, Expr, Function, GlobalVar, Tuple, TupleGetItem, Var, with_args
from dpl.ir.traverse import substitute, vars_in
from dpl.ir.types import TensorType


def simplify(func: Function, keys: dict | None = None) -> Function:
    """``func`` after canonicalize / CSE / dead-binding removal, repeated to a fixed point.
    ``keys`` (see :func:`eliminate_common_subexpr`) may be shared between calls; the fixed
    point is recorded there for :func:`simplify_changed`."""
    if keys is None:
        keys = {}
    current = func
    while True:
        kept, seen = _eliminate_common_subexpr(canonicalize_bindings(current), keys)
        new, reads, ops = _live(kept)
        if kept is current:
            # canonicalize and CSE found nothing: removing bindings gives them nothing to find
            # (no trivial binding, constant or repeated value appears), and a second removal
            # removes nothing, so ``new`` is the fixed point
            _record(keys, new, seen, reads, ops)
            return new
        current = new


def simplify_changed(base: Function, func: Function, changed: list[Binding], keys: dict,
                     removed: list[Binding] | None = None, values: Mapping[Var, Expr] | None = None) -> Function:
    """``simplify(func, keys)`` for a ``func`` that is ``base`` with the bindings ``changed``
    replaced or added, in less time when ``simplify`` made ``base`` (with these ``keys``).

    ``base`` then has no trivial, constant or known-tuple-item binding and no two bindings
    with one value; when every changed binding is a call whose op and operands no binding of
    ``base`` (nor another changed one) has, canonicalize and CSE find nothing in ``func``
    either, and the result is ``func`` without its dead bindings — what ``simplify`` returns,
    without keying every binding again. Anything else runs ``simplify`` itself.

    ``removed`` (the bindings of ``base`` that ``changed`` replaced) and ``values`` (``{var:
    value}`` of base's bindings) let the dead bindings be found from base's read counts: a
    binding dies when the reads it lost leave it none (``base`` has no dead binding and is
    acyclic, so counting finds exactly what a walk from the return would), without walking
    the function."""
    hit = keys.get(("simplified", id(base)))
    if hit is None or hit[0] is not base:
        return simplify(func, keys)
    seen = hit[1]  # the coarse CSE keys of base's bindings (and of bindings it had before)
    mine: dict = {}
    for b in changed:
        if type(b.value) is not Call:
            return simplify(func, keys)
        coarse = _coarse_key(b.value)
        if coarse in seen or coarse in mine:
            return simplify(func, keys)  # perhaps a repeated value: CSE decides
        mine[coarse] = b
    # base's counts are taken over (base is not simplified again; a caller that does so
    # anyway finds no counts and walks)
    counted = keys.pop(("reads", id(base)), None)
    if removed is None or values is None or counted is None or counted[0] is not base:
        new, reads, ops = _live(func)
    else:
        new, reads, ops = _live_after(func, counted[1], counted[2], removed, changed, values)
    seen.update(mine)  # more keys than new's bindings have only sends a later call to simplify
    _record(keys, new, seen, reads, ops)
    return new


def _record(keys: dict, func: Function, seen: dict, reads: dict, ops: dict[str, int]) -> None:
    """What ``keys`` remembers of a fixed point of :func:`simplify`: the coarse CSE keys its
    bindings had (for :func:`simplify_changed`), how often each variable is read and each op
    called (``("reads", id)``, for the next :func:`simplify_changed`) and the op names it
    calls (``("ops", id)``, read by the rewrite driver's required-ops test), each entry
    holding the function so that its id stays its own."""
    keys[("simplified", id(func))] = (func, seen)
    keys[("reads", id(func))] = (func, reads, ops)
    keys[("ops", id(func))] = (func, {op for op, k in ops.items() if k})


# -- CanonicalizeBindings ----------------------------------------------------------------------


def _returned(func: Function) -> set[Var]:
    return set(vars_in(func.ret))


def canonicalize_bindings(func: Function) -> Function:
    """``func`` with trivial bindings, known tuple items and bound constants folded."""
    known: dict[Var, Expr] = {}
    trivial: dict[Var, Var] = {}
    constant: dict[Var, Constant] = {}
    for b in func.bindings:
        value = b.value
        if type(value) is Call:
            continue  # the common case: nothing to fold, and no tuple item can look through it
        value = _known_item(value, known)
        if isinstance(value, Var):
            trivial[b.var] = value
        elif isinstance(value, Constant):
            constant[b.var] = value
        known[b.var] = value  # only what a tuple item's lookup can go through (tuples, aliases)
    if not trivial and not constant:
        return func
    returned = _returned(func)
    is_binding = {b.var for b in func.bindings}
    replace_usage: dict[Var, Expr] = dict(constant)
    rename: dict[Var, Var] = {}
    remove: set[Var] = set()
    for var, target in trivial.items():
        while target in trivial:
            target = trivial[target]
        target = rename.get(target, target)
        remove.add(var)
        if var in returned and target in is_binding and target not in returned and target not in rename:
            rename[target] = var  # keep the returned name: ``x = f(..)`` becomes ``y = f(..)``
            replace_usage[target] = var
        else:
            replace_usage[var] = target

    def use(v: Var) -> Expr:
        seen = 0
        e: Expr = v
        while isinstance(e, Var) and e in replace_usage and seen <= len(replace_usage):
            e, seen = replace_usage[e], seen + 1
        return e

    out: list[Binding] = []
    for b in func.bindings:
        if b.var in remove:
            continue
        value = substitute(b.value, use)
        var = rename.get(b.var, b.var)
        out.append(b if value is b.value and var is b.var else Binding(var, value))
    ret = substitute(func.ret, use)
    return attrs.evolve(func, bindings=tuple(out), ret=ret)


def _known_item(value: Expr, known: Mapping[Var, Expr]) -> Expr:
    """A tuple item of a tuple known here is that field; anything else is itself."""
    if not isinstance(value, TupleGetItem):
        return value
    tup = value.tuple_value
    while isinstance(tup, Var) and tup in known:
        tup = known[tup]
    if isinstance(tup, Tuple):
        return tup.fields[value.index]
    return value


# -- EliminateCommonSubexpr --------------------------------------------------------------------


def _attr_key(value: Any) -> Any:
    if isinstance(value, tuple):
        return ("t",) + tuple(_attr_key(v) for v in value)
    if isinstance(value, float) and np.isnan(value):
        return ("nan",)
    return (type(value).__name__, value)


def value_key(e: Expr) -> Any:
    """A hashable key: equal keys mean the same value (variables by identity: a variable is
    its own key; types compare structurally)."""
    t = type(e)
    if t is Var:
        return e
    if t is Call:
        op = e.op if type(e.op) is str else ("gv", e.op.name)
        attrs_key = tuple([(k, _attr_key(v)) for k, v in sorted(e.attrs.items())]) if e.attrs else ()
        ty = e.ty
        ty_key = (ty.shape, ty.dtype) if type(ty) is TensorType else ty  # a plain tuple hashes fast
        return ("call", op, attrs_key, ty_key, tuple([a if type(a) is Var else value_key(a) for a in e.args]))
    if t is Constant:
        return ("const", e.ty, e.value.tobytes())
    if t is GlobalVar:
        return ("gv", e.name)
    if t is Tuple:
        return ("tuple", tuple(value_key(f) for f in e.fields))
    if t is TupleGetItem:
        return ("item", value_key(e.tuple_value), e.index)
    raise TypeError(f"not an expression: {type(e).__name__}")


def _renamed(e: Expr, remap: Mapping[Var, Var]) -> Expr:
    """``e`` with each variable of ``remap`` read as its image (the same object when none is);
    the common case, a call of variables and constants, without a closure per operand."""
    if type(e) is not Call:
        return substitute(e, lambda v: remap.get(v, v))
    args = e.args
    new = None
    for k, a in enumerate(args):
        t = type(a)
        if t is Var:
            image = remap.get(a)
            if image is not None:
                if new is None:
                    new = list(args)
                new[k] = image
        elif t is not Constant:
            return substitute(e, lambda v: remap.get(v, v))
    return e if new is None else with_args(e, tuple(new))


def _coarse_key(e: Expr) -> Any:
    """A cheap key that values with equal :func:`value_key` share (a call's op and operands,
    without its attributes and type): CSE computes full keys only where two values share it."""
    if type(e) is not Call:
        return value_key(e)
    args = e.args
    for a in args:
        if type(a) is not Var:
            args = tuple([a if type(a) is Var else value_key(a) for a in args])
            break
    return (e.op, args)


def eliminate_common_subexpr(func: Function, keys: dict | None = None) -> Function:
    """``func`` with each repeated value bound once: a later ``y = v`` of an already bound
    ``v`` becomes ``y = x`` (the earlier variable), and later uses read ``x``.

    Values are first told apart by :func:`_coarse_key` (op and operands); the full
    :func:`value_key` is computed only for values that share one, so a function without
    repeats costs one cheap key per binding. ``keys`` caches full keys by value object
    (``{id(value): (value, key)}``, the value kept alive so its id stays its own): a caller
    simplifying one version of a function after another passes the same dict, and the values
    the versions share are keyed once."""
    return _eliminate_common_subexpr(func, keys)[0]


def _eliminate_common_subexpr(func: Function, keys: dict | None) -> tuple[Function, dict]:
    """:func:`eliminate_common_subexpr`, and the coarse keys of the bindings it read."""
    first: dict[Any, Any] = {}  # coarse key -> its first binding (or (var, value) when renamed)
    shared: dict[Any, list] = {}  # coarse key met again -> [(full key, var)], first binding first
    remap: dict[Var, Var] = {}
    out: list[Binding] | None = None  # made at the first change
    if keys is None:
        keys = {}

    def full_key(value) -> Any:
        hit = keys.get(id(value))
        if hit is not None and hit[0] is value:
            return hit[1]
        key = value_key(value)
        keys[id(value)] = (value, key)
        return key

    bindings = func.bindings
    first_get = first.get  # bound once: the loop below is the pass's cost
    for i, b in enumerate(bindings):
        value = _renamed(b.value, remap) if remap else b.value
        if type(value) is Call:  # _coarse_key's common case, inline: a call of variables
            for a in value.args:
                if type(a) is not Var:
                    coarse = _coarse_key(value)
                    break
            else:
                coarse = (value.op, value.args)
        else:
            coarse = _coarse_key(value)
        earlier = None
        seen = first_get(coarse)
        if seen is None:
            first[coarse] = b if value is b.value else (b.var, value)
        else:
            bucket = shared.get(coarse)
            if bucket is None:
                seen_var, seen_value = (seen.var, seen.value) if type(seen) is Binding else seen
                bucket = shared[coarse] = [(full_key(seen_value), seen_var)]
            key = full_key(value)
            for other, var in bucket:
                if other == key:
                    earlier = var
                    break
            else:
                bucket.append((key, b.var))
        if earlier is not None:
            value = earlier
            remap[b.var] = earlier
        if value is not b.value:
            if out is None:
                out = list(bindings[:i])
            out.append(Binding(b.var, value))
        elif out is not None:
            out.append(b)
    if out is None:
        return func, first
    ret = substitute(func.ret, lambda v: remap.get(v, v))
    return attrs.evolve(func, bindings=tuple(out), ret=ret), first


# -- RemoveAllUnused ---------------------------------------------------------------------------


def _tally(value: Expr, reads: dict, ops: dict[str, int], step: int) -> list[Var]:
    """Adds ``step`` to the read count of each variable ``value`` reads and to the call count
    of each op it calls (nested calls included); the variables, repeats included."""
    if type(value) is Call:
        op = value.op
        if type(op) is str:
            ops[op] = ops.get(op, 0) + step
        read = value.args
        for a in read:
            t = type(a)
            if t is not Var and t is not Constant:
                read = list(vars_in(value))
                for arg in value.args:
                    if type(arg) is not Var and type(arg) is not Constant:
                        _count_ops(arg, ops, step)
                break
    else:
        read = list(vars_in(value))
        _count_ops(value, ops, step)
    for a in read:
        if type(a) is Var:
            reads[a] = reads.get(a, 0) + step
    return read


def _count_ops(e: Expr, ops: dict[str, int], step: int) -> None:
    if type(e) is Call:
        if type(e.op) is str:
            ops[e.op] = ops.get(e.op, 0) + step
        for a in e.args:
            _count_ops(a, ops, step)
    elif type(e) is Tuple:
        for f in e.fields:
            _count_ops(f, ops, step)
    elif type(e) is TupleGetItem:
        _count_ops(e.tuple_value, ops, step)


def _live(func: Function) -> tuple[Function, dict, dict[str, int]]:
    """``func`` without its dead bindings, how often each variable is read there (by
    bindings and the return) and how often each op is called."""
    reads: dict = {}
    get = reads.get  # bound once: the loop below is the pass's cost
    for v in vars_in(func.ret):
        reads[v] = get(v, 0) + 1
    ops: dict[str, int] = {}
    keep: list[Binding] = []
    for b in reversed(func.bindings):
        if b.var not in reads:
            continue
        keep.append(b)
        value = b.value
        if type(value) is Call:  # _tally's common case, inline: a call of variables and constants
            op = value.op
            if type(op) is str:
                ops[op] = ops.get(op, 0) + 1
            for a in value.args:
                t = type(a)
                if t is Var:
                    reads[a] = get(a, 0) + 1
                elif t is not Constant:
                    for v in vars_in(a):
                        reads[v] = get(v, 0) + 1
                    _count_ops(a, ops, 1)
        else:
            _tally(value, reads, ops, 1)
    if len(keep) == len(func.bindings):
        return func, reads, ops
    return attrs.evolve(func, bindings=tuple(reversed(keep))), reads, ops


def _live_after(func: Function, base_reads: dict, base_ops: dict[str, int], removed: list[Binding],
                changed: list[Binding], values: Mapping[Var, Expr]) -> tuple[Function, dict, dict[str, int]]:
    """:func:`_live` of ``func``, base with ``removed`` replaced by ``changed`` (see
    :func:`simplify_changed`), from base's counts (updated in place: they become func's): the
    reads ``removed`` lose, those ``changed`` gain, then every binding left unread is dropped,
    and what it read loses a read."""
    reads, ops = base_reads, base_ops
    candidates: list[Var] = []
    for b in removed:
        candidates.extend(_tally(b.value, reads, ops, -1))
    now = {}
    for b in changed:
        _tally(b.value, reads, ops, 1)
        now[b.var] = b.value
    dead: set = set()
    while candidates:
        v = candidates.pop()
        if type(v) is not Var or v in dead or reads.get(v, 0) != 0:
            continue
        value = now.get(v)
        if value is None:
            value = values.get(v)
            if value is None:
                continue  # a parameter
        dead.add(v)
        reads.pop(v, None)
        candidates.extend(_tally(value, reads, ops, -1))
    if not dead:
        return func, reads, ops
    return attrs.evolve(func, bindings=tuple([b for b in func.bindings if b.var not in dead])), reads, ops


def remove_dead_bindings(func: Function, ops: set[str] | None = None) -> Function:
    """``func`` without the bindings nothing (transitively) returned uses. ``ops``, when
    given, receives the op names the result calls (calls nested in values included)."""
    live: set = set(vars_in(func.ret))
    keep: list[Binding] = []
    for b in reversed(func.bindings):
        if b.var not in live:
            continue
        keep.append(b)
        value = b.value
        if type(value) is Call:
            if ops is not None and type(value.op) is str:
                ops.add(value.op)
            for a in value.args:
                t = type(a)
                if t is Var:
                    live.add(a)
                elif t is not Constant:
                    live.update(vars_in(a))
                    if ops is not None:
                        _nested_ops(a, ops)
        else:
            live.update(vars_in(value))
            if ops is not None:
                _nested_ops(value, ops)
    if len(keep) == len(func.bindings):
        return func
    return attrs.evolve(func, bindings=tuple(reversed(keep)))


def _nested_ops(e: Expr, ops: set[str]) -> None:
    if type(e) is Call:
        if type(e.op) is str:
            ops.add(e.op)
        for a in e.args:
            _nested_ops(a, ops)
    elif type(e) is Tuple:
        for f in e.fields:
            _nested_ops(f, ops)
    elif type(e) is TupleGetItem:
        _nested_ops(e.tuple_value, ops)
