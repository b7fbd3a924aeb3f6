"""The matcher's per-(pattern, expression) cache must never serve a result that depended on
what a shared sub-pattern was bound to at the time (regression: the dependency analysis
visited shared nodes in pre-order and cached `exp(w0)` while `w0` was bound to a constant)."""

import dpl
from dpl import is_const, is_op, wildcard
from dpl.ir import FunctionBuilder


def test_alternatives_sharing_sub_patterns_do_not_reuse_stale_failures():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4, 16))
    a = fb.emit("add", fb.emit("exp", x), 1.0)
    out = fb.emit("multiply", fb.emit("multiply", a, x), 0.5)
    f = fb.ret(out)
    w0 = wildcard()
    p1 = is_op("add")(is_op("exp")(w0), is_const(1.0))
    first = is_op("multiply")(w0, is_op("multiply")(p1, is_const(0.5)))  # fails, binding w0 to 0.5 on the way
    second = is_op("multiply")(is_op("multiply")(w0, p1), is_const(0.5))
    assert dpl.match(second, f.bindings[-1].value, f)
    assert dpl.match(first | second, f.bindings[-1].value, f)
    matcher = dpl.pattern.Matcher(f)
    assert not matcher.match(first, f.bindings[-1].value)
    assert matcher.match(second, f.bindings[-1].value)  # the same matcher, its cache warm
