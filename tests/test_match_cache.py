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


def _decomposed_layer():
    """A decoder layer written out by hand (RMSNorm, SiLU and softmax decomposed), as the
    rewrites and the fusion patterns meet it."""
    fb = FunctionBuilder("main")
    h = fb.param("x", "f32", (8, 16))
    w, g = fb.param("w", "f32", (16, 16)), fb.param("g", "f32", (16,))
    h32 = fb.emit("astype", h, dtype="float32")
    var = fb.emit("mean", fb.emit("power", h32, 2.0), axis=[-1], keepdims=True)
    n = fb.emit("multiply", g, fb.emit("astype", fb.emit("multiply", h32, fb.emit("rsqrt", fb.emit("add", var, 1e-6))), dtype="float32"))
    q = fb.emit("matmul", n, w)
    s = fb.emit("multiply", fb.emit("matmul", q, fb.emit("permute_dims", q)), 0.125)
    e = fb.emit("exp", fb.emit("subtract", s, fb.emit("max", s, axis=[-1], keepdims=True)))
    a = fb.emit("matmul", fb.emit("divide", e, fb.emit("sum", e, axis=[-1], keepdims=True)), q)
    gate = fb.emit("matmul", a, w)
    act = fb.emit("multiply", gate, fb.emit("sigmoid", gate))
    return fb.ret(fb.emit("add", fb.emit("multiply", act, fb.emit("matmul", n, w)), h))


def test_a_matcher_without_reasons_finds_the_same_matches():
    """Matcher(reasons=False), which skips argument orders whose ops cannot match, matches
    exactly what the explaining matcher matches (every shipped pattern, every binding)."""
    from dpl.apply import as_pattern_set

    f = _decomposed_layer()
    patterns = as_pattern_set(["rewrites", "llm", "cublas"])
    quiet, full = dpl.pattern.Matcher(f, reasons=False), dpl.pattern.Matcher(f)
    found = 0
    for rule in (*patterns.patterns, *patterns.rewrites):
        for b in f.bindings:
            m, reference = quiet.match(rule.pattern, b.value), full.match(rule.pattern, b.value)
            assert bool(m) == bool(reference), (rule.name, b.var.name)
            assert not m or dict(m.items()) == dict(reference.items())
            found += bool(m)
    assert found >= 6  # rms_norm, silu, softmax, matmuls, attention...


def test_a_failure_without_reasons_is_cached_as_a_failure():
    """Only the swapped order of a commutative call is tried, and fails: the failure (not
    nothing) is what the cache keeps for the next pattern that meets the call."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4,))
    e = fb.emit("exp", x)
    m = fb.emit("multiply", fb.emit("abs", x), e)  # abs(x) * exp(x)
    f = fb.ret(fb.emit("add", m, x))
    # abs(x) * exp(x) against exp(_) * abs(exp(_)): as written the first argument cannot be an
    # exp, so only the swapped order is tried, and it fails inside abs(...)
    inner = is_op("multiply")(is_op("exp")(wildcard()), is_op("abs")(is_op("exp")(wildcard())))
    matcher = dpl.pattern.Matcher(f, reasons=False)
    for _ in range(2):  # the second time from the cache
        assert not matcher.match(is_op("add")(inner, wildcard()), f.bindings[-1].value)
        result = matcher.match(inner, f.bindings[-2].value)
        assert not result and isinstance(result, dpl.pattern.NoMatch)
