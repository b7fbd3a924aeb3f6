"""Build the same function in dpl and in TVM 0.27 Relax from one small spec, and drive the
same pattern code on both sides (the oracle tests of dpl.pattern).

A spec is a list of statements:
    ("param", name, shape, dtype)
    (name, op, args, attrs)       op is a dpl op name; args are names, float scalars
                                  (f32 constants) or ("tuple", [names])
    (name, "item", src, index)    a tuple item
    (name, "alias", src)          ``name = src``
    (name, "tuple", [names])      ``name = (a, b, ...)``
The last statement is returned.
"""

from __future__ import annotations

import dpl.pattern as dp
from dpl.ir import FunctionBuilder, Tuple, const


def build_dpl(spec):
    fb = FunctionBuilder("main")
    env = {}

    def arg(a):
        if isinstance(a, str):
            return env[a]
        if isinstance(a, float):
            return const(a)
        if isinstance(a, tuple) and a[0] == "tuple":
            return Tuple(tuple(arg(x) for x in a[1]))
        raise ValueError(a)

    last = None
    for st in spec:
        if st[0] == "param":
            env[st[1]] = last = fb.param(st[1], st[3], st[2])
        elif st[1] == "item":
            env[st[0]] = last = fb.item(env[st[2]], st[3], name=st[0])
        elif st[1] == "alias":
            env[st[0]] = last = fb.bind(env[st[2]], name=st[0])
        elif st[1] == "tuple":
            env[st[0]] = last = fb.bind(Tuple(tuple(env[a] for a in st[2])), name=st[0])
        else:
            name, op, args = st[0], st[1], st[2]
            attrs = st[3] if len(st) > 3 else {}
            from dpl.ops import make_call

            env[name] = last = fb.bind(make_call(op, [arg(a) for a in args], attrs), name=name)
    return fb.ret(last), env


def build_tvm(spec):
    from tvm import relax as rx
    from tvm.script import relax as R

    bb = rx.BlockBuilder()
    params = [rx.Var(st[1], R.Tensor(st[2], st[3])) for st in spec if st[0] == "param"]
    env = {p.name: p for p in params}

    def arg(a):
        if isinstance(a, str):
            return env[a]
        if isinstance(a, float):
            return rx.const(a, "float32")
        if isinstance(a, tuple) and a[0] == "tuple":
            return [arg(x) for x in a[1]]
        raise ValueError(a)

    def op_fn(name):
        mod = rx.op
        for part in name.split("."):
            mod = getattr(mod, part)
        return mod

    with bb.function("main", params):
        with bb.dataflow():
            last = None
            body = [st for st in spec if st[0] != "param"]
            for i, st in enumerate(body):
                emit = bb.emit_output if i == len(body) - 1 else bb.emit
                if st[1] == "item":
                    value = rx.TupleGetItem(env[st[2]], st[3])
                elif st[1] == "alias":
                    value = env[st[2]]
                elif st[1] == "tuple":
                    value = rx.Tuple([env[a] for a in st[2]])
                else:
                    attrs = dict(st[3]) if len(st) > 3 else {}
                    value = op_fn(st[1])(*[arg(a) for a in st[2]], **attrs)
                env[st[0]] = last = emit(value, name_hint=st[0])
        bb.emit_func_output(last)
    fn = bb.get()["main"]
    block = fn.body.blocks[0]
    benv = {b.var.name: b.var for b in block.bindings}
    benv.update({p.name: p for p in fn.params})
    return fn, benv


class DplNS:
    """The pattern vocabulary on the dpl side."""

    wildcard = staticmethod(dp.wildcard)
    is_const = staticmethod(dp.is_const)
    is_var = staticmethod(dp.is_var)
    is_tuple = staticmethod(dp.is_tuple)
    is_tuple_get_item = staticmethod(dp.is_tuple_get_item)
    has_dtype = staticmethod(dp.has_dtype)
    is_op = staticmethod(dp.is_op)

    @staticmethod
    def call(op, *args, varg_default_wildcard=False):
        return op(*args, varg_default_wildcard=varg_default_wildcard)


class TvmNS:
    """The same vocabulary on TVM's side (op names get the ``relax.`` prefix)."""

    def __init__(self):
        from tvm.relax import dpl as t

        self.t = t
        self.wildcard = t.wildcard
        self.is_const = t.is_const
        self.is_var = lambda name=None: t.is_var(name or "")
        self.is_tuple = t.is_tuple
        self.is_tuple_get_item = t.is_tuple_get_item
        self.has_dtype = t.has_dtype

    def is_op(self, name):
        op = self.t.is_op("relax." + name)
        return _TvmOp(op)

    @staticmethod
    def call(op, *args, varg_default_wildcard=False):
        return op(*args, varg_default_wildcard=varg_default_wildcard)


class _TvmOp:
    """TVM's is_op, called without registering graph edges (dpl never adds them implicitly)."""

    def __init__(self, p):
        self.p = p

    def __call__(self, *args, varg_default_wildcard=False):
        return self.p(*args, varg_default_wildcard=varg_default_wildcard, add_constraint=False)

    def __or__(self, other):
        return _TvmOp(self.p | other.p)
