"""Type errors name the op and the operands; the messages are part of the interface."""

import pytest

from dpl.errors import ArityError, AttributeValueError, TypeInferenceError, UnknownAttributeError, UnknownOpError
from dpl.ir import FunctionBuilder, call


@pytest.fixture
def fb():
    return FunctionBuilder("main")


def test_broadcast_mismatch_names_op_and_operands(fb):
    a, b = fb.param("a", "f32", (4, 8)), fb.param("b", "f32", (5,))
    with pytest.raises(TypeInferenceError) as err:
        fb.emit("add", a, b)
    assert err.value.message == "op 'add': operands a: f32[4, 8] and b: f32[5] cannot broadcast (dimension 1: 8 vs 5)"


def test_symbolic_dims_only_match_themselves(fb):
    a, b = fb.param("a", "f32", ("n", 8)), fb.param("b", "f32", ("m", 8))
    with pytest.raises(TypeInferenceError, match=r"operands a: f32\[n, 8\] and b: f32\[m, 8\] cannot broadcast \(dimension 0: n vs m\)"):
        fb.emit("multiply", a, b)
    c = fb.param("c", "f32", (1, 8))
    assert fb.emit("multiply", a, c).ty.shape == ("n", 8)


def test_dtype_mismatch(fb):
    a, b = fb.param("a", "f32", (4,)), fb.param("b", "f16", (4,))
    with pytest.raises(TypeInferenceError) as err:
        fb.emit("subtract", a, b)
    assert err.value.message == "op 'subtract': operands a: f32[4] and b: f16[4] have different dtypes"


def test_scalar_literal_dtype_must_match(fb):
    a = fb.param("a", "f16", (4,))
    with pytest.raises(TypeInferenceError, match=r"operands a: f16\[4\] and constant: f32\[\] have different dtypes"):
        fb.emit("add", a, 1.0)


def test_matmul_reduction_dim_mismatch(fb):
    x, w = fb.param("x", "f32", ("n", 64)), fb.param("w", "f32", (32, 16))
    with pytest.raises(TypeInferenceError) as err:
        fb.emit("matmul", x, w)
    assert err.value.message == "op 'matmul': operands x: f32[n, 64] and w: f32[32, 16] have mismatched reduction dimensions (64 vs 32)"


def test_rank_errors(fb):
    x = fb.param("x", "f32", (2, 3))
    with pytest.raises(TypeInferenceError, match=r"op 'nn.conv2d': operands x: f32\[2, 3\] and x: f32\[2, 3\] must have rank 4"):
        fb.emit("nn.conv2d", x, x)
    with pytest.raises(TypeInferenceError, match=r"op 'sum': axis 2 is out of range for rank 2"):
        fb.emit("sum", x, axis=[2])
    with pytest.raises(TypeInferenceError, match=r"op 'permute_dims': axes \[1\] must list all 2 axes of x: f32\[2, 3\]"):
        fb.emit("permute_dims", x, axes=[1])


def test_reshape_element_count(fb):
    x = fb.param("x", "f32", ("n", 6))
    assert fb.emit("reshape", x, shape=["n", 2, 3]).ty.shape == ("n", 2, 3)
    assert fb.emit("reshape", x, shape=["n", -1]).ty.shape == ("n", 6)
    assert fb.emit("reshape", x, shape=[-1, 2, 3]).ty.shape == ("n", 2, 3)
    with pytest.raises(TypeInferenceError, match=r"op 'reshape': cannot reshape x: f32\[n, 6\] to \[n, 4\]: element counts differ"):
        fb.emit("reshape", x, shape=["n", 4])


def test_unknown_op_suggests():
    with pytest.raises(UnknownOpError) as err:
        call("nn.rmsnorm", 1.0)
    assert err.value.message == "unknown op 'nn.rmsnorm'"
    assert "'nn.rms_norm'" in err.value.hint


def test_wrong_arity(fb):
    x = fb.param("x", "f32", (4,))
    with pytest.raises(ArityError) as err:
        fb.emit("add", x)
    assert err.value.message == "op 'add' takes 2 arguments, got 1"
    with pytest.raises(ArityError, match="op 'exp' takes 1 argument, got 2"):
        fb.emit("exp", x, x)


def test_unknown_attribute(fb):
    x = fb.param("x", "f32", (4, 4))
    with pytest.raises(UnknownAttributeError) as err:
        fb.emit("sum", x, axes=[0])
    assert err.value.message == "op 'sum' has no attribute 'axes' (its attributes: axis, keepdims)"
    with pytest.raises(UnknownAttributeError, match=r"op 'exp' has no attribute 'alpha' \(its attributes: none\)"):
        fb.emit("exp", x, alpha=1)


def test_bad_attribute_values(fb):
    x = fb.param("x", "f32", (4, 4))
    with pytest.raises(AttributeValueError, match=r"op 'sum': attribute 'keepdims' must be true or false, got 1"):
        fb.emit("sum", x, keepdims=1)
    with pytest.raises(AttributeValueError, match=r"op 'astype': attribute 'dtype' must be a dtype such as f32, f16 or i64, got 'float33'"):
        fb.emit("astype", x, dtype="float33")
    with pytest.raises(AttributeValueError, match=r"op 'astype' needs attribute 'dtype'"):
        fb.emit("astype", x)


def test_duplicate_binding_name(fb):
    x = fb.param("x", "f32", (4,))
    fb.emit("exp", x, name="y")
    with pytest.raises(Exception, match="function 'main' already defines 'y'"):
        fb.emit("exp", x, name="y")


def test_kinds_depend_on_the_call(fb):
    from dpl.ops import OpPatternKind as K, op_kind

    x, b, col, row = fb.param("x", "f32", (4, 8)), fb.param("b", "f32", (8,)), fb.param("col", "f32", (8, 1)), fb.param("row", "f32", (1, 8))
    assert op_kind(call("add", x, b)) == K.ELEMWISE
    assert op_kind(call("add", col, row)) == K.BROADCAST
    assert op_kind(call("strided_slice", x, axes=[0], begin=[0], end=[2])) == K.ELEMWISE
    assert op_kind(call("strided_slice", x, axes=[0], begin=[1], end=[3])) == K.INJECTIVE
    assert op_kind(call("sum", x, axis=[1])) == K.COMM_REDUCE
    assert op_kind(call("mean", x, axis=[1])) == K.OUT_EWISE_FUSABLE
    assert op_kind(call("take", x, dpl_const_idx())) == K.OPAQUE


def dpl_const_idx():
    from dpl.ir import const

    return const([0, 1])


def test_symbolic_window_dims_are_errors_not_crashes(fb):
    x = fb.param("x", "f32", (1, 4, 8, 8))
    w = fb.param("w", "f32", (4, 4, 3, "k"))
    with pytest.raises(TypeInferenceError, match="op 'nn.conv2d': window dimension 'k' must be static"):
        fb.emit("nn.conv2d", x, w)


def test_window_attributes_must_be_positive(fb):
    x = fb.param("x", "f32", (1, 4, 8, 8))
    w = fb.param("w", "f32", (4, 4, 3, 3))
    with pytest.raises(TypeInferenceError, match="stride 0 and dilation 1 must be positive"):
        fb.emit("nn.conv2d", x, w, strides=[0, 1])
    with pytest.raises(TypeInferenceError, match="groups must be positive, got 0"):
        fb.emit("nn.conv2d", x, w, groups=0)
    with pytest.raises(TypeInferenceError, match="padding \\(-1, -1\\) not negative"):
        fb.emit("nn.max_pool2d", x, pool_size=2, padding=-1)
