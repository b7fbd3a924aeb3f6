"""Every op's pattern kind, checked against TVM 0.27.

For each representative call we build the same call twice: in dpl (``dpl.ir.call``, then
``dpl.op_kind``) and in Relax (``relax.BlockBuilder``, then ``LegalizeOps`` and
``AnnotateTIROpPattern``, reading the ``op_pattern`` attribute of the PrimFunc it became).
When a call legalizes into several PrimFuncs we take the largest kind among them, the kind
FuseOps would have to give them were they one call (in TVM 0.27 every call here legalizes into
exactly one PrimFunc, so the rule is only there for the day one does not).

Where the two disagree, dpl's kind function (``kind=`` in ``dpl/ops/*.py``) is wrong, never
this table.
"""

from __future__ import annotations

import pytest

import dpl
from dpl.ir import Tuple, Var, const
from dpl.ir import call as dpl_call
from dpl.ir.types import TensorType
from dpl.ops import OpPatternKind as K

pytestmark = pytest.mark.oracle


# -- the calls ---------------------------------------------------------------------------------
#
# A case is (id, dpl op, operands, attributes, the kind TVM 0.27 gives). An operand is a tensor
# ``(dtype, shape)`` (a string dimension is symbolic), a float (an f32 scalar constant) or a
# list of tensors (a tuple operand). The recorded kind is TVM's answer, checked live by
# test_tvm_gives_the_recorded_kind; dpl must agree with the live answer.

F = "float32"
E, B, I, R, O, X = K.ELEMWISE, K.BROADCAST, K.INJECTIVE, K.COMM_REDUCE, K.OUT_EWISE_FUSABLE, K.OPAQUE
BINARY = ("add", "subtract", "multiply", "divide", "power", "maximum", "minimum")
COMPARE = ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")
UNARY = (
    "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "sin", "cos", "negative", "abs", "square",
    "nn.relu", "nn.gelu", "nn.gelu_tanh", "nn.silu",
)  # fmt: skip


def t(*shape, dtype=F):
    return (dtype, shape)


CASES = [
    # binary arithmetic and comparisons: one operand read at the output index makes the whole
    # call ElemWise (a bias add); only a pure broadcast, every operand broadcast, is Broadcast
    ("add/same", "add", [t(4, 8), t(4, 8)], {}, E),
    ("add/bias", "add", [t(4, 8), t(8)], {}, E),
    ("add/row", "add", [t(4, 8), t(1, 8)], {}, E),
    ("add/scalar-const", "add", [t(4, 8), 1.5], {}, E),
    ("add/scalar-var", "add", [t(), t(4, 8)], {}, E),
    ("add/broadcast", "add", [t(8, 1), t(1, 8)], {}, B),
    ("add/rank-up", "add", [t(8), t(4, 1, 8)], {}, E),
    ("add/unit", "add", [t(1, 8), t(8)], {}, E),
    ("add/symbolic-bias", "add", [t("n", 8), t(8)], {}, E),
    ("add/symbolic-broadcast", "add", [t("n", 1), t(1, 8)], {}, B),
    *[(f"{op}/bias", op, [t(4, 8), t(8)], {}, E) for op in BINARY[1:] + COMPARE],
    *[(f"{op}/scalar-const", op, [t(4, 8), 2.0], {}, E) for op in BINARY[1:]],
    *[(f"{op}/broadcast", op, [t(8, 1), t(1, 8)], {}, B) for op in BINARY[1:] + COMPARE],
    # elementwise
    *[(op, op, [t(4, 8)], {}, E) for op in UNARY],
    ("abs/int", "abs", [t(4, 8, dtype="int32")], {}, E),
    ("clip", "clip", [t(4, 8)], {"min": -1.0, "max": 1.0}, E),
    ("astype", "astype", [t(4, 8)], {"dtype": "float16"}, E),
    ("astype/int", "astype", [t(4, 8)], {"dtype": "int32"}, E),
    ("where/full", "where", [t(4, 8, dtype="bool"), t(4, 8), t(8)], {}, E),
    ("where/full-cond", "where", [t(4, 8, dtype="bool"), t(8), t(4, 1)], {}, E),
    ("where/scalar-consts", "where", [t(4, 8, dtype="bool"), 1.0, 0.0], {}, E),
    ("where/broadcast", "where", [t(4, 1, dtype="bool"), t(1, 8), t(4, 1)], {}, B),
    ("where/broadcast-const", "where", [t(4, 1, dtype="bool"), 1.0, t(1, 8)], {}, B),
    # reductions: a pure reduction is CommReduce; mean and variance end in an elementwise
    # output block after the reduction, which TVM calls OutEWiseFusable; no axes is a copy
    ("sum", "sum", [t(4, 8)], {"axis": [1]}, R),
    ("sum/keepdims", "sum", [t(4, 8)], {"axis": [1], "keepdims": True}, R),
    ("sum/all", "sum", [t(4, 8)], {}, R),
    ("sum/unit-axis", "sum", [t(4, 1)], {"axis": [1]}, R),
    ("sum/symbolic", "sum", [t("n", 8)], {"axis": [1]}, R),
    ("sum/no-axes", "sum", [t(4, 8)], {"axis": []}, E),
    ("sum/0d", "sum", [t()], {}, E),
    ("prod", "prod", [t(4, 8)], {"axis": [1]}, R),
    ("prod/keepdims", "prod", [t(4, 8)], {"axis": [0], "keepdims": True}, R),
    ("max", "max", [t(4, 8)], {"axis": [1]}, R),
    ("max/keepdims", "max", [t(4, 8)], {"axis": [0], "keepdims": True}, R),
    ("max/no-axes", "max", [t(4, 8)], {"axis": []}, E),
    ("min", "min", [t(4, 8)], {"axis": [1]}, R),
    ("min/keepdims", "min", [t(4, 8)], {"axis": [1], "keepdims": True}, R),
    ("mean", "mean", [t(4, 8)], {"axis": [1]}, O),
    ("mean/keepdims", "mean", [t(4, 8)], {"axis": [1], "keepdims": True}, O),
    ("mean/all", "mean", [t(4, 8)], {}, O),
    ("mean/no-axes", "mean", [t(4, 8)], {"axis": []}, E),
    ("mean/0d", "mean", [t()], {}, E),
    ("variance", "variance", [t(4, 8)], {"axis": [1]}, O),
    ("variance/keepdims", "variance", [t(4, 8)], {"axis": [1], "keepdims": True}, O),
    ("variance/no-axes", "variance", [t(4, 8)], {"axis": []}, E),
    # matmul is a multiply-add (OutEWiseFusable) only when each operand misses an output index
    ("matmul", "matmul", [t(4, 8), t(8, 16)], {}, O),
    ("matmul/batched", "matmul", [t(2, 4, 8), t(8, 16)], {}, O),
    ("matmul/broadcast-batch", "matmul", [t(1, 4, 8), t(2, 8, 16)], {}, O),
    ("matmul/out_dtype", "matmul", [t(4, 8, dtype="float16"), t(8, 16, dtype="float16")], {"out_dtype": F}, O),
    ("matmul/row", "matmul", [t(1, 8), t(8, 4)], {}, O),
    ("matmul/symbolic", "matmul", [t("n", 8), t(8, 16)], {}, O),
    ("matmul/vector-matrix", "matmul", [t(8), t(8, 4)], {}, R),
    ("matmul/matrix-vector", "matmul", [t(4, 8), t(8)], {}, R),
    ("matmul/dot", "matmul", [t(8), t(8)], {}, R),
    # the rest of nn: reductions with elementwise output blocks or windows
    ("nn.conv2d", "nn.conv2d", [t(1, 4, 8, 8), t(6, 4, 3, 3)], {"padding": [1, 1]}, O),
    ("nn.conv2d/1x1", "nn.conv2d", [t(1, 4, 8, 8), t(6, 4, 1, 1)], {}, O),
    ("nn.conv2d/groups", "nn.conv2d", [t(1, 4, 8, 8), t(4, 1, 3, 3)], {"groups": 4, "strides": [2, 2]}, O),
    ("nn.max_pool2d", "nn.max_pool2d", [t(1, 4, 8, 8)], {"pool_size": [2, 2], "strides": [2, 2]}, O),
    ("nn.max_pool2d/pad-ceil", "nn.max_pool2d", [t(1, 4, 7, 7)], {"pool_size": [3, 3], "padding": [1, 1], "ceil_mode": True}, O),
    ("nn.softmax", "nn.softmax", [t(4, 8)], {"axis": -1}, O),
    ("nn.softmax/axis0", "nn.softmax", [t(4, 8)], {"axis": 0}, O),
    ("nn.log_softmax", "nn.log_softmax", [t(4, 8)], {"axis": -1}, O),
    ("nn.layer_norm", "nn.layer_norm", [t(2, 4, 8), t(8), t(8)], {"axes": [-1]}, O),
    ("nn.rms_norm", "nn.rms_norm", [t(4, 8), t(8)], {"axes": [-1]}, O),
    ("nn.rms_norm/two-axes", "nn.rms_norm", [t(2, 4, 8), t(4, 8)], {"axes": [1, 2]}, O),
    # data movement
    ("take", "take", [t(16, 8), t(4, dtype="int64")], {"axis": 0}, X),
    ("take/axis1", "take", [t(16, 8), t(4, dtype="int32")], {"axis": 1}, X),
    ("take/1d", "take", [t(16), t(4, dtype="int64")], {}, X),
    ("reshape", "reshape", [t(4, 8)], {"shape": [2, 16]}, I),
    ("reshape/same", "reshape", [t(4, 8)], {"shape": [4, 8]}, I),
    ("reshape/flatten", "reshape", [t(4, 8)], {"shape": [-1]}, I),
    ("permute_dims", "permute_dims", [t(4, 8)], {"axes": [1, 0]}, I),
    ("permute_dims/default", "permute_dims", [t(2, 4, 8)], {}, I),
    ("permute_dims/unit", "permute_dims", [t(4, 1, 8)], {"axes": [1, 0, 2]}, I),
    ("permute_dims/identity", "permute_dims", [t(4, 8)], {"axes": [0, 1]}, E),
    ("permute_dims/1d", "permute_dims", [t(8)], {}, E),
    ("concat", "concat", [[t(4, 8), t(2, 8)]], {"axis": 0}, I),
    ("concat/axis1", "concat", [[t(4, 8), t(4, 2), t(4, 1)]], {"axis": 1}, I),
    ("concat/one", "concat", [[t(4, 8)]], {"axis": 0}, E),
    ("concat/empty-field", "concat", [[t(4, 0), t(4, 8)]], {"axis": 1}, E),
    ("split", "split", [t(4, 8)], {"indices_or_sections": 2, "axis": 1}, I),
    ("split/indices", "split", [t(4, 8)], {"indices_or_sections": [2, 6], "axis": 1}, I),
    ("split/axis0", "split", [t(4, 8)], {"indices_or_sections": 2, "axis": 0}, I),
    ("split/one", "split", [t(4, 8)], {"indices_or_sections": 1, "axis": 1}, E),
    ("split/no-indices", "split", [t(4, 8)], {"indices_or_sections": [], "axis": 1}, E),
    ("strided_slice/begin0", "strided_slice", [t(4, 8)], {"axes": [1], "begin": [0], "end": [4]}, E),
    ("strided_slice/begin0-two-axes", "strided_slice", [t(4, 8)], {"axes": [0, 1], "begin": [0, 0], "end": [2, 3]}, E),
    ("strided_slice/begin0-end-past", "strided_slice", [t(4, 8)], {"axes": [1], "begin": [0], "end": [100]}, E),
    ("strided_slice/begin-minus-size", "strided_slice", [t(4, 8)], {"axes": [1], "begin": [-8], "end": [8]}, E),
    ("strided_slice/begin-clamped", "strided_slice", [t(4, 8)], {"axes": [1], "begin": [-100], "end": [8]}, E),
    ("strided_slice/symbolic", "strided_slice", [t("n", 8)], {"axes": [1], "begin": [0], "end": [4]}, E),
    ("strided_slice/begin1", "strided_slice", [t(4, 8)], {"axes": [1], "begin": [1], "end": [5]}, I),
    ("strided_slice/stride2", "strided_slice", [t(4, 8)], {"axes": [1], "begin": [0], "end": [8], "strides": [2]}, I),
    ("strided_slice/stride2-one-row", "strided_slice", [t(4, 8)], {"axes": [1], "begin": [0], "end": [1], "strides": [2]}, I),
    ("strided_slice/negative-begin", "strided_slice", [t(4, 8)], {"axes": [1], "begin": [-4], "end": [8]}, I),
    ("strided_slice/reverse", "strided_slice", [t(4, 8)], {"axes": [1], "begin": [7], "end": [-9], "strides": [-1]}, I),
    ("broadcast_to", "broadcast_to", [t(1, 8)], {"shape": [4, 8]}, B),
    ("broadcast_to/rank", "broadcast_to", [t(8)], {"shape": [1, 8]}, B),
    ("broadcast_to/same", "broadcast_to", [t(4, 1)], {"shape": [4, 1]}, E),
    ("expand_dims", "expand_dims", [t(4, 8)], {"axis": [1]}, B),
    ("expand_dims/first", "expand_dims", [t(4, 8)], {"axis": [0]}, B),
    ("expand_dims/no-axes", "expand_dims", [t(4, 8)], {"axis": []}, E),
    ("squeeze", "squeeze", [t(4, 1, 8)], {"axis": [1]}, B),
    ("squeeze/all", "squeeze", [t(1, 4, 1)], {}, B),
    ("squeeze/nothing", "squeeze", [t(4, 8)], {}, E),
    # creation: a constant fill is folded into the kernel (no load); a tensor fill is broadcast
    ("full/const", "full", [1.0], {"shape": [4, 8]}, E),
    ("full/tensor", "full", [t()], {"shape": [4, 8]}, B),
    ("full/tensor-cast", "full", [t(dtype="int64")], {"shape": [4, 8], "dtype": F}, B),
    ("full/0d", "full", [t()], {"shape": []}, E),
    ("zeros", "zeros", [], {"shape": [4, 8], "dtype": F}, E),
    ("zeros/int", "zeros", [], {"shape": [4, 8], "dtype": "int64"}, E),
    ("ones", "ones", [], {"shape": [4, 8], "dtype": F}, E),
]

# Calls dpl accepts that TVM 0.27 has no Relax form for, so no kind to compare: dpl's kind, why,
# and TVM's complaint. test_tvm_rejects_the_dpl_only_calls keeps this list true. (Every registered op itself
# legalizes on the CPU: test_kind_matches_tvm fails for a case whose call stays unlegalized.)
DPL_ONLY = [
    # take without an axis gathers from the flattened tensor; Relax allows it on 1-D data only.
    # Opaque like every take: the load index is read from another tensor.
    ("take/flattened", "take", [t(16, 8), t(4, dtype="int64")], {}, X, "1-dimensional"),
    # an empty first section; Relax wants strictly increasing split points above 0. Injective:
    # the second piece is read at an offset.
    ("split/at-0", "split", [t(4, 8)], {"indices_or_sections": [0], "axis": 1}, I, "must be sorted"),
]

# -- dpl side ----------------------------------------------------------------------------------


def dpl_operand(spec, name):
    if isinstance(spec, float):
        return const(spec)
    if isinstance(spec, list):
        return Tuple(tuple(dpl_operand(s, f"{name}_{i}") for i, s in enumerate(spec)))
    dtype, shape = spec
    return Var(name, TensorType(shape, dtype))


def dpl_kind(op, args, attrs):
    call = dpl_call(op, *[dpl_operand(a, f"x{i}") for i, a in enumerate(args)], **attrs)
    return dpl.op_kind(call)


# -- TVM side ----------------------------------------------------------------------------------
#
# dpl op -> the Relax call. Every op takes its operands and attributes under the same names in
# Relax (``rx.op.<name>(*operands, **attrs)``) except these four.
RELAX_SPELLING = {
    "clip": lambda r, x, min, max: r.clip(x, min, max),
    "full": lambda r, fill, shape, dtype=None: r.full(shape, fill, dtype),
    "zeros": lambda r, shape, dtype: r.zeros(shape, dtype),
    "ones": lambda r, shape, dtype: r.ones(shape, dtype),
}


def relax_call(op, operands, attrs):
    from tvm import relax as rx

    if op in RELAX_SPELLING:
        return RELAX_SPELLING[op](rx.op, *operands, **attrs)
    fn = rx.op
    for part in op.split("."):
        fn = getattr(fn, part)
    return fn(*operands, **attrs)


def tvm_operand(spec, name, params, dims):
    from tvm import relax as rx
    from tvm import tirx
    from tvm.script import relax as R

    if isinstance(spec, float):
        return rx.const(spec, F)
    if isinstance(spec, list):
        return rx.Tuple([tvm_operand(s, f"{name}_{i}", params, dims) for i, s in enumerate(spec)])
    dtype, shape = spec
    shape = [dims.setdefault(d, tirx.Var(d, "int64")) if isinstance(d, str) else d for d in shape]
    var = rx.Var(name, R.Tensor(shape, dtype))
    params.append(var)
    return var


def tvm_module(op, args, attrs):
    from tvm import relax as rx

    params, dims = [], {}
    operands = [tvm_operand(a, f"x{i}", params, dims) for i, a in enumerate(args)]
    bb = rx.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(relax_call(op, operands, attrs), name_hint="y")
        bb.emit_func_output(out)
    return bb.get()


def tvm_kinds(op, args, attrs):
    """The op_pattern of each PrimFunc the call legalizes into, and the Relax ops left over in
    ``main`` (an op LegalizeOps could not lower stays a Relax call)."""
    import tvm
    from tvm import relax as rx

    mod = rx.transform.LegalizeOps()(tvm_module(op, args, attrs))
    mod = rx.transform.AnnotateTIROpPattern()(mod)
    kinds = [K(int(fn.attrs["op_pattern"])) for _, fn in mod.functions.items() if not isinstance(fn, rx.Function)]
    left = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            callee = getattr(b.value, "op", None)
            if isinstance(callee, tvm.ir.Op) and callee.name != "relax.call_tir":
                left.append(callee.name)
    return kinds, left


def tvm_kind(op, args, attrs):
    """TVM's kind of the call: the largest kind of its PrimFuncs, as FuseOps would have to treat
    them if they were one call."""
    kinds, left = tvm_kinds(op, args, attrs)
    assert not left, f"TVM left {left} unlegalized; list the call in DPL_ONLY or an unlegalized table"
    assert kinds, f"TVM made no PrimFunc of {op}"
    return max(kinds)


# -- the tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("cid, op, args, attrs, recorded", CASES, ids=[c[0] for c in CASES])
def test_kind_matches_tvm(tvm, cid, op, args, attrs, recorded):
    want = tvm_kind(op, args, attrs)
    got = dpl_kind(op, args, attrs)
    assert got == want, f"{cid}: dpl says {got.name}, TVM 0.27 says {want.name}; fix kind= of '{op}' in dpl/ops"
    assert want == recorded, f"{cid}: TVM says {want.name} now, the table records {recorded.name}"


def test_every_registered_op_is_compared():
    covered = {c[1] for c in CASES}
    missing = sorted(set(dpl.ops.all_ops()) - covered)
    assert not missing, f"ops with no case in CASES: {missing}"
    unknown = sorted(covered - set(dpl.ops.all_ops()))
    assert not unknown, f"CASES name ops the registry lacks: {unknown}"


def test_the_spec_cases_are_there():
    """The calls the issue names stay in the table, with the kinds it names."""
    by_id = {c[0]: c[4] for c in CASES}
    assert by_id["add/bias"] == E and by_id["add/broadcast"] == B and by_id["add/scalar-const"] == E
    assert by_id["strided_slice/begin0"] == E and by_id["strided_slice/begin1"] == I
    assert by_id["strided_slice/stride2"] == I
    assert by_id["sum"] == by_id["max"] == R and by_id["mean"] == O
    for op in ("nn.softmax", "nn.layer_norm", "matmul", "nn.conv2d", "nn.max_pool2d"):
        assert by_id[op] == O, op
    assert by_id["take"] == X


@pytest.mark.parametrize("cid, op, args, attrs, kind, tvm_error", DPL_ONLY, ids=[c[0] for c in DPL_ONLY])
def test_tvm_rejects_the_dpl_only_calls(tvm, cid, op, args, attrs, kind, tvm_error):
    assert dpl_kind(op, args, attrs) == kind
    with pytest.raises(Exception, match=tvm_error):
        tvm_kinds(op, args, attrs)


def test_kind_depends_on_constness():
    """``full`` of a constant is ElemWise, of a tensor Broadcast: the kind reads the call."""
    fill = Var("v", TensorType((), F))
    assert dpl.op_kind(dpl_call("full", const(1.0), shape=[4, 8])) == E
    assert dpl.op_kind(dpl_call("full", fill, shape=[4, 8])) == B
