"""FuseOps on graphs with expression shapes, against TVM 0.27 (issue 32: "TVM stays the oracle
where it applies"). Random DAGs whose parameters have dims such as ``n * 2``, ``(n + 1) // 2``
and ``min(n, 4) + 4``, and whose ops make more of them (concat, pad, reshape, split), go through
dpl's FuseOps and through Relax's LegalizeOps -> AnnotateTIROpPattern -> FuseOps with the same
dims as shared TIR vars and PrimExprs (``tvm_oracle.to_relax``); the groups must be equal, and
the fused module must compute what the original does at two bindings of n."""

import numpy as np
import pytest

import dpl
from dpl.ir import FunctionBuilder, Module, Tuple
from dpl.ir import dims as D
from dpl.transform import fuse_ops

from test_fuse_ops import RandomDag
from tvm_oracle import dpl_fusion_groups, tvm_fusion_groups

pytestmark = pytest.mark.oracle

P = D.parse
PARAMS = [  # name, shape: n binds from x; the others only hold expressions of it
    ("x", (P("n * 2"), 8)),
    ("y", (P("n * 2"), 8)),
    ("h", (P("(n + 1) // 2"), 8)),
    ("k", (P("min(n, 4) + 4"), 8)),
    ("b", (8,)),
    ("col", (P("n * 2"), 1)),
]
class ExprDag(RandomDag):
    """A random DAG over the PARAMS, seeded (test_fuse_ops' generator, other shapes and ops):
    elementwise and broadcast ops between values of equal or broadcastable shapes, row
    reductions, softmax, matmul, and the ops that make new expression dims (concat along the
    rows, pad, a reshape of the rows, split into halves, along the rows too)."""

    def build(self):
        r = self.rng
        fb = FunctionBuilder("main")
        pool = [fb.param(name, "f32", shape) for name, shape in PARAMS[:1]]
        pool += [fb.param(name, "f32", shape) for name, shape in PARAMS[1:] if r.random() < 0.6]
        made, seen = [], set()
        for _ in range(int(r.integers(4, 14)) * 3):
            if len(made) >= 12:
                break
            try:
                v = self.op(fb, pool, seen, f"v{len(made)}")
            except dpl.DplError:  # shapes that do not fit: another draw
                continue
            if v is not None:
                pool.append(v)
                made.append(v)
        if not made:
            made.append(fb.emit("exp", pool[0], name="v0"))
        outs = [made[-1]]
        if r.random() < 0.4 and len(made) > 2:
            outs.insert(0, made[int(r.integers(len(made) - 1))])
        return fb.ret(*outs)

    def op(self, fb, pool, seen, name):
        r = self.rng
        x = self.pick(pool[-4:] if r.random() < 0.7 else pool)
        y = self.pick(pool)
        kind = self.pick(["unary", "unary", "binary", "binary", "bias", "reduce", "softmax", "matmul", "concat",
                          "pad", "reshape", "split"])
        if x.ty.ndim != 2 and kind != "unary":
            return None
        if kind == "unary":
            op, args, attrs = self.pick(self.UNARY), (x,), {}
        elif kind in ("binary", "bias"):
            if kind == "bias":
                y = self.pick([p for p in pool if p.ty.ndim == 1 or p.ty.shape[-1] == 1] or [y])
            op, args, attrs = self.pick(self.BINARY), (x, y), {}
        elif kind == "reduce":
            op, args, attrs = self.pick(["sum", "max", "mean"]), (x,), {"axis": [1], "keepdims": bool(r.integers(2))}
        elif kind == "softmax":
            op, args, attrs = "nn.softmax", (x,), {}
        elif kind == "matmul":
            op, args, attrs = "matmul", (x, y), {}
        elif kind == "concat":
            op, args, attrs = "concat", (Tuple((x, y)),), {"axis": self.pick([0, 0, 1])}
        elif kind == "pad":
            op, args, attrs = "nn.pad", (x,), {"pad_width": [int(r.integers(0, 2)), 1, 0, int(r.integers(0, 2))]}
        elif kind == "reshape":  # [rows, 8] -> [rows * 2, 4], an expression dim in an attribute
            if x.ty.shape[1] != 8:
                return None
            op, args, attrs = "reshape", (x,), {"shape": [D.mul(x.ty.shape[0], 2), 4]}
        else:  # along the rows the pieces start at a symbolic offset (Opaque to TVM)
            axis = self.pick([0, 1])
            if axis == 1 and x.ty.shape[1] != 8:
                return None
            t = fb.emit("split", x, indices_or_sections=2, axis=axis, name=name + "_t")
            return fb.item(t, int(r.integers(2)), name=name)
        sig = (op, tuple(id(a) for a in args), repr(attrs))
        if sig in seen:
            return None
        seen.add(sig)
        return fb.emit(op, *args, name=name, **attrs)


def _inputs(func, n, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(tuple(D.evaluate(d, {"n": n}) for d in p.ty.shape)).astype(np.float32)
            for p in func.params]


def test_random_expression_shape_dags_match_tvm(tvm):
    mismatches, with_groups, expression_groups = [], 0, 0
    for seed in range(250):
        func = ExprDag(seed).build()
        mod = Module([func])
        fused = fuse_ops(mod)
        got = dpl_fusion_groups(func, fused)
        want = tvm_fusion_groups(func)
        with_groups += bool(want)
        expression_groups += any(isinstance(d, D.DimExpr) for fn in fused.functions.values() if fn.name != "main"
                                 for p in fn.params for d in getattr(p.ty, "shape", ()))
        if got != want:
            mismatches.append((seed, got, want))
            continue
        for n in (1, 4):
            args = _inputs(func, n, seed)
            a, b = dpl.interpret(mod, *args), dpl.interpret(fused, *args)
            for u, v in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
                np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-5)
    assert not mismatches, mismatches[:3]
    assert with_groups >= 100 and expression_groups >= 80, (with_groups, expression_groups)
