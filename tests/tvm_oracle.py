"""Run TVM 0.27's FuseOps on the same graph as dpl's and read its groups back.

``tvm_fusion_groups(func)`` translates a dpl function into Relax with the same binding names
(BlockBuilder), runs LegalizeOps -> AnnotateTIROpPattern -> FuseOps, and returns the groups as
a set of frozensets of original binding names. TVM renames a group's outputs, so bindings are
recognised by structure: the legalized callee plus the keys of the arguments (tvm-semantics.md,
section g). ``dpl_fusion_groups`` reads dpl's result the same way.
"""

from __future__ import annotations

import numpy as np

from dpl.ir import Call, Constant, GlobalVar, Tuple, TupleGetItem, Var

# dpl ops whose Relax spelling differs (the rest: same name under relax.op, same keywords)
SPECIAL = {}


def _relax_op(name):
    from tvm import relax

    fn = relax.op
    for part in name.split("."):
        fn = getattr(fn, part)
    return fn


def prim_expr(d, symbols: dict):
    """A dpl dim (int, symbol, :mod:`dpl.ir.dims` expression) as a TIR PrimExpr, one int64
    ``tirx.Var`` per symbol name (kept in ``symbols``, so every use shares it)."""
    from tvm import tirx

    from dpl.ir import dims as D

    if isinstance(d, int):
        return tirx.IntImm("int64", d)
    if isinstance(d, str):
        return symbols.setdefault(d, tirx.Var(d, "int64"))
    if isinstance(d, D.Poly):
        out = None
        for mono, coef in d.terms:
            term = tirx.IntImm("int64", coef)
            for atom in mono:
                term = term * prim_expr(atom, symbols)
            out = term if out is None else out + term
        return out
    if isinstance(d, D.MinMax):
        pick = tirx.min if isinstance(d, D.Min) else tirx.max
        out = prim_expr(d.args[0], symbols)
        for a in d.args[1:]:
            out = pick(out, prim_expr(a, symbols))
        return out
    a, b = prim_expr(d.a, symbols), prim_expr(d.b, symbols)
    return tirx.floordiv(a, b) if isinstance(d, D.FloorDiv) else tirx.floormod(a, b)


def to_relax(func):
    """A Relax IRModule holding ``func`` as ``main``, binding for binding, names kept. Symbolic
    dims, expressions included, become shared TIR vars and PrimExprs, in types and in the
    attributes that hold dims (``reshape(shape=[n * 2, 4])``)."""
    from tvm import relax
    from tvm.script import relax as R

    from dpl.ir.dims import DimExpr
    from dpl.ops.registry import DIM_ATTR_KINDS, get_op

    symbols: dict = {}

    def rtype(ty):
        return R.Tensor(tuple(d if isinstance(d, int) else prim_expr(d, symbols) for d in ty.shape), ty.dtype)

    def attr(op, key, x):
        if isinstance(x, tuple):
            x = [attr(op, key, v) for v in x]
        spec = get_op(op).attrs.get(key)
        if spec is not None and spec.kind in DIM_ATTR_KINDS and isinstance(x, (str, DimExpr)):
            return prim_expr(x, symbols)
        return x

    bb = relax.BlockBuilder()
    params = [relax.Var(p.name, rtype(p.ty)) for p in func.params]
    env = {id(p): rp for p, rp in zip(func.params, params)}
    returned = set()
    stack = [func.ret]
    while stack:
        e = stack.pop()
        if isinstance(e, Var):
            returned.add(id(e))
        elif isinstance(e, Tuple):
            stack.extend(e.fields)

    def arg(e):
        if isinstance(e, Var):
            return env[id(e)]
        if isinstance(e, Constant):
            return relax.const(np.asarray(e.value), e.ty.dtype)
        if isinstance(e, Tuple):
            return relax.Tuple([arg(f) for f in e.fields])
        raise TypeError(e)

    with bb.function("main", params):
        with bb.dataflow():
            for b in func.bindings:
                v = b.value
                if isinstance(v, TupleGetItem):
                    value = relax.TupleGetItem(arg(v.tuple_value), v.index)
                else:
                    kwargs = {k: attr(v.op, k, x) for k, x in v.attrs.items() if x is not None}
                    value = _relax_op(v.op)(*[arg(a) for a in v.args], **kwargs)
                emit = bb.emit_output if id(b.var) in returned else bb.emit
                env[id(b.var)] = emit(value, name_hint=b.var.name)
            ret = func.ret
        out = relax.Tuple([arg(f) for f in ret.fields]) if isinstance(ret, Tuple) else arg(ret)
        bb.emit_func_output(out)
    return bb.get()


def _bindings(fn):
    return [b for blk in fn.body.blocks for b in blk.bindings]


def tvm_fusion_groups(func, max_depth: int = 256, opt_level: int = 3):
    import tvm
    from tvm import relax

    mod = to_relax(func)
    with tvm.transform.PassContext(opt_level=opt_level, config={"relax.FuseOps.max_depth": max_depth}):
        legal = relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(mod))
        fused = relax.transform.FuseOps()(legal)

    def key(e, env):
        if isinstance(e, relax.Var):
            return env.get(e.name, ("param", e.name))
        if type(e).__name__ in ("Constant", "GenericConst"):
            return ("const",)
        if isinstance(e, relax.Tuple):
            return ("tuple", tuple(key(f, env) for f in e.fields))
        if isinstance(e, relax.TupleGetItem):
            inner = key(e.tuple_value, env)
            return inner[1][e.index] if inner[0] == "tuple" else ("item", inner, e.index)
        if isinstance(e, relax.Call):
            if e.op.name == "relax.call_tir":
                return ("tir", e.args[0].name_hint, tuple(key(a, env) for a in e.args[1].fields))
            return ("call", str(e.op), tuple(key(a, env) for a in e.args))
        return ("other",)

    names = {}
    env = {}
    for b in _bindings(legal["main"]):
        env[b.var.name] = key(b.value, env)
        names[env[b.var.name]] = b.var.name
    groups = set()
    env = {}
    for b in _bindings(fused["main"]):
        v = b.value
        if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.GlobalVar) and isinstance(fused[v.op], relax.Function):
            fn = fused[v.op]
            inner = {p.name: key(a, env) for p, a in zip(fn.params, v.args)}
            members = set()
            for ib in _bindings(fn):
                inner[ib.var.name] = key(ib.value, inner)
                if not isinstance(ib.value, relax.TupleGetItem):
                    members.add(names[inner[ib.var.name]])
                else:
                    members.add(names.get(inner[ib.var.name], ib.var.name))
            env[b.var.name] = key(fn.body.body, inner)
            groups.add(frozenset(members))
        else:
            env[b.var.name] = key(v, env)
    return groups


def _dpl_key(e, env):
    if isinstance(e, Var):
        return env.get(id(e), ("param", e.name))
    if isinstance(e, Constant):
        return ("const", e.value.tobytes())
    if isinstance(e, Tuple):
        return ("tuple", tuple(_dpl_key(f, env) for f in e.fields))
    if isinstance(e, TupleGetItem):
        inner = _dpl_key(e.tuple_value, env)
        return inner[1][e.index] if inner[0] == "tuple" else ("item", inner, e.index)
    return (e.op if isinstance(e.op, str) else e.op.name, repr(sorted(e.attrs.items())), tuple(_dpl_key(a, env) for a in e.args))


def dpl_fusion_groups(original, fused_mod):
    """The groups of a fused module, as sets of the original binding names."""
    names, env = {}, {}
    for b in original.bindings:
        env[id(b.var)] = _dpl_key(b.value, env)
        names[env[id(b.var)]] = b.var.name
    main = fused_mod["main"]
    env = {}
    groups = set()
    for b in main.bindings:
        v = b.value
        if isinstance(v, Call) and isinstance(v.op, GlobalVar):
            fn = fused_mod[v.op.name]
            inner = {id(p): _dpl_key(a, env) for p, a in zip(fn.params, v.args)}
            members = set()
            for ib in fn.bindings:
                inner[id(ib.var)] = _dpl_key(ib.value, inner)
                members.add(names[inner[id(ib.var)]])
            env[id(b.var)] = _dpl_key(fn.ret, inner)
            groups.add(frozenset(members))
        else:
            env[id(b.var)] = _dpl_key(v, env)
    return groups
