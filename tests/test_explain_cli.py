"""``dpl explain``: a decomposed RMSNorm written one step off each spelling the shipped
``rms_norm`` rewrite covers (f32 or cast from f16, power or a product, rsqrt or 1/sqrt, a
constant epsilon, a 1-D weight) is reported with the exact rule binding and sub-pattern that
broke the match, the binding of the module it met, and why; rewrites applied are listed in
order."""

import pytest

import dpl
from dpl.cli import main as dpl_main
from dpl.viz.explain import explain_module

F32 = """func main(x: f32[n, 64], w: f32[64], y: f32[n, 64]) -> f32[n, 64] {
  sq = power(x, 2.0)
  var = mean(sq, axis=[-1], keepdims=true)
  ve = add(var, 1e-06)
  inv = rsqrt(ve)
  normed = multiply(x, inv)
  out = multiply(w, normed)
  return out
}"""

F16 = """func main(x: f16[n, 64], w: f16[64]) -> f16[n, 64] {
  h32 = astype(x, dtype=f32)
  sq = power(h32, 2.0)
  var = mean(sq, axis=[-1], keepdims=true)
  ve = add(var, 1e-06)
  inv = rsqrt(ve)
  normed = multiply(h32, inv)
  back = astype(normed, dtype=f16)
  out = multiply(w, back)
  return out
}"""

# (name, module text, rule binding that fails, sub-pattern text, module binding met, why)
OFF_BY_ONE = [
    ("f32, mean over the wrong axis", F32.replace("axis=[-1]", "axis=[0]"),
     "var", "mean(sq, axis=[-1], keepdims=true)", "var = mean(", "attribute axis: expected (-1,), found (0,)"),
    ("f32, cubed instead of squared", F32.replace("power(x, 2.0)", "power(x, 3.0)"),
     "sq", "2.0", "in sq = power(x, 3.0", "expected the constant 2.0, found 3.0"),
    ("f32, x * y instead of x * x", F32.replace("power(x, 2.0)", "multiply(x, y)"),
     "h32", "astype?(h", "y, in sq = multiply(x, y)", "it already matched x, and here meets y"),
    ("f32, sqrt instead of rsqrt", F32.replace("rsqrt(ve)", "sqrt(ve)"),
     "r", "rsqrt(add(var, eps))", "inv = sqrt(ve)", "expected op rsqrt, found sqrt"),
    ("f32, 2 / sqrt instead of 1 / sqrt", F32.replace("inv = rsqrt(ve)", "s = sqrt(ve)\n  inv = divide(2.0, s)"),
     "r", "1.0", "in inv = divide(2.0", "expected the constant 1.0, found 2.0"),
    ("f32, subtracting epsilon", F32.replace("add(var, 1e-06)", "subtract(var, 1e-06)"),
     "r", "add(var, eps)", "ve = subtract(var", "expected op add, found subtract"),
    ("f16, cast to f32 twice", F16.replace("  sq = power(h32, 2.0)", "  again = astype(x, dtype=f32)\n  sq = power(again, 2.0)"),
     "h32", "astype?(h", "again = astype(x", "a repeated pattern must bind the same value"),
]


@pytest.mark.parametrize("name, text, binding, sub, met, why", OFF_BY_ONE, ids=[c[0] for c in OFF_BY_ONE])
def test_one_step_off_names_the_binding_and_sub_pattern(name, text, binding, sub, met, why):
    report = explain_module(dpl.parse(text), ["rewrites"], rule="rms_norm")
    (rule,) = report.rules
    assert not rule.matches and not rule.applied
    closest = rule.misses[0]
    assert closest.failed_binding == binding, str(rule)
    assert closest.sub_pattern.startswith(sub), str(rule)
    assert "rewrites.dpl:" in closest.sub_pattern
    assert met in closest.met, str(rule)
    assert why in closest.why, str(rule)
    assert 0 < len(closest.matched) < closest.total


def test_the_where_conjunct_that_failed_and_its_values():
    report = explain_module(dpl.parse(F16.replace("w: f16[64]", "w: f16[1, 64]")), ["rewrites"], rule="rms_norm")
    closest = report.rules[0].misses[0]
    assert closest.refused and closest.full
    assert "rewrites.dpl:25:27: 'rank(w) == 1' does not hold: rank(w) = 2" in closest.why and "is_const" not in closest.why
    text = F16.replace("w: f16[64])", "w: f16[64], eps: f32[])").replace("add(var, 1e-06)", "add(var, eps)")
    closest = explain_module(dpl.parse(text), ["rewrites"], rule="rms_norm").rules[0].misses[0]
    assert "'is_const(eps)' does not hold: is_const(eps) = false, eps = variable eps: f32[]" in closest.why


def test_a_replacement_that_cannot_be_built_is_a_miss():
    """Scaled by the weight cast to f32, then cast back: the pattern matches whole (the cast
    back is optional), but nn.rms_norm(x: f16, w: f32) cannot be built, so the rewrite leaves
    the module alone: say so."""
    text = F16.replace("back = astype(normed, dtype=f16)\n  out = multiply(w, back)",
                       "w32 = astype(w, dtype=f32)\n  scaled = multiply(w32, normed)\n  out = astype(scaled, dtype=f16)")
    closest = explain_module(dpl.parse(text), ["rewrites"], rule="rms_norm").rules[0].misses[0]
    assert closest.refused and closest.at == "scaled"
    assert "the replacement cannot be built" in closest.why and "different dtypes" in closest.why


def test_the_rewrites_applied_on_the_way_in_order():
    report = explain_module(dpl.parse(F16), ["rewrites", "llm"])
    assert [e.rule for e in report.rewrites] == ["rms_norm"]
    assert "out = nn.rms_norm" in str(report.rewrites[0]) and "sq" in report.rewrites[0].removed
    rms = next(r for r in report.rules if r.rule == "rms_norm")
    assert rms.applied and "applied: out = nn.rms_norm" in str(rms)


def test_dpl_explain_command(tmp_path, capsys):
    path = tmp_path / "off.ir"
    path.write_text(F32.replace("rsqrt(ve)", "sqrt(ve)"))
    assert dpl_main(["explain", str(path), "-p", "rewrites", "-p", "llm", "--rule", "rms_norm", "--at", "out"]) == 0
    out = capsys.readouterr().out
    assert "failed at binding 'r' of the rule" in out and "inv = sqrt(ve)" in out
    assert dpl_main(["explain", str(path), "-p", "rewrites", "--at", "nowhere"]) == 1
    assert "no binding 'nowhere'" in capsys.readouterr().err
    assert dpl_main(["explain", str(path)]) == 1
    assert "-p" in capsys.readouterr().err


def test_a_misspelt_rule_gets_a_did_you_mean(capsys):
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[1] / "examples" / "residual_rmsnorm.ir")
    assert dpl_main(["explain", src, "-p", "rewrites", "-p", "llm", "--rule", "add_rms_nrm"]) == 1
    err = capsys.readouterr().err
    assert "no rule named 'add_rms_nrm' in rewrites, llm; did you mean 'add_rms_norm'?" in err
    assert dpl_main(["explain", src, "-p", "llm", "--rule", "zzzz"]) == 1
    assert "did you mean" not in capsys.readouterr().err
