"""dpl.ir.simplify: the clean-up Relax's rewrite_call runs between rounds (CanonicalizeBindings,
EliminateCommonSubexpr, RemoveAllUnused), and the two inputs that used to raise AttributeError."""

import numpy as np
import pytest

import dpl
from dpl.errors import DplError
from dpl.ir import GlobalVar, Tuple, TupleGetItem, Var, structural_equal
from dpl.ir.simplify import canonicalize_bindings, eliminate_common_subexpr, simplify
from dpl.ir.types import TensorType, TupleType


def parse(text):
    return dpl.parse(text)["main"]


def names(fn):
    return [b.var.name for b in fn.bindings]


def same_numbers(a, b):
    rng = np.random.default_rng(0)
    args = [rng.uniform(0.5, 2.0, p.ty.shape).astype(p.ty.dtype) for p in a.params]
    np.testing.assert_allclose(dpl.interpret(b, *args), dpl.interpret(a, *args), rtol=1e-6)


def test_known_tuple_items_fold_into_the_fields():
    fn = parse("func main(a: f32[4], b: f32[4]) -> f32[4] { d = (a, b) e = d[0] f = d[1] g = add(e, f) return g }")
    out = simplify(fn)
    assert names(out) == ["g"] and [v.name for v in out.bindings[0].value.args] == ["a", "b"]
    same_numbers(fn, out)


def test_trivial_bindings_go_and_a_returned_alias_keeps_its_name():
    fn = parse("func main(x: f32[4]) -> f32[4] { a = add(x, x) b = a return b }")
    out = canonicalize_bindings(fn)
    assert names(out) == ["b"] and out.ret is out.bindings[0].var  # Relax keeps the output's name
    fn2 = parse("func main(x: f32[4]) -> f32[4] { a = add(x, x) b = a c = exp(b) return c }")
    out2 = canonicalize_bindings(fn2)
    assert names(out2) == ["a", "c"] and out2.bindings[1].value.args[0] is out2.bindings[0].var


def test_duplicate_bindings_merge():
    fn = parse("func main(x: f32[4]) -> f32[4] { a = exp(x) b = exp(x) c = add(a, b) return c }")
    out = simplify(fn)
    assert names(out) == ["a", "c"] and out.bindings[1].value.args == (out.bindings[0].var,) * 2
    same_numbers(fn, out)
    assert eliminate_common_subexpr(out) is out and simplify(out) is out


def test_nothing_to_do_returns_the_same_object():
    fn = parse("func main(x: f32[4]) -> f32[4] { a = exp(x) return a }")
    assert simplify(fn) is fn and structural_equal(simplify(fn), fn)


def test_concat_of_a_tuple_holding_a_tuple_is_a_type_error():
    with pytest.raises(DplError, match="must be a tuple of tensors"):
        parse("func main(t: (f32[2], f32[2])) -> f32[4] { b = concat((t,), axis=0) return b }")


def test_a_tuple_holding_a_function_reference_is_not_a_value():
    y = Var("y", TensorType((2,), "float32"))
    with pytest.raises(DplError, match="function reference @f"):
        TupleGetItem(Tuple((GlobalVar("f"), y)), 0)
    assert Tuple((y, y)).ty == TupleType((y.ty, y.ty))


@pytest.mark.oracle
def test_tvm_rejects_concat_of_a_tuple_holding_a_tuple_too(tvm):
    from tvm import relax as rx
    from tvm.script import relax as R

    t = rx.Var("t", R.Tuple(R.Tensor((2,), "float32"), R.Tensor((2,), "float32")))
    bb = rx.BlockBuilder()
    with bb.function("main", [t]):
        with pytest.raises(Exception, match="Tuple"):
            bb.normalize(rx.op.concat(rx.Tuple([t]), axis=0))
        bb.emit_func_output(t)
