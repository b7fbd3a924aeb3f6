"""``dpl explain`` agrees with fusion: per site where a rule matches (or did, before a rewrite
consumed its ops), what fusion made of it, read off the trace of ``dpl.apply``: used (the
composite it became), rejected (a leak, a where conjunct and its values, a check hook), taken
by a higher-priority rule (which, and its composite), consumed by a rewrite (which, and what
it made); no closest miss at a binding a match covers; the same as JSON."""

import importlib.resources
import json

import pytest

import dpl
from dpl.cli import main as dpl_main
from dpl.trace import Trace
from dpl.viz.explain import explain_module

# s is returned as well as normed: a composite of both would swallow it (a leak)
LEAK_IR = """func main(x: f32[n, 64], r: f32[n, 64], w: f32[64]) -> (f32[n, 64], f32[n, 64]) {
  s = add(x, r)
  out = nn.rms_norm(s, w, axes=[-1], epsilon=1e-06)
  return (s, out)
}"""

MINE_DPL = """codegen mine
pattern add_norm {
  s   = add(a, b)
  out = nn.rms_norm(s, w)
}
pattern wide_norm {
  out = nn.rms_norm(x, w)
  where shape(x)[-1] >= 128
}
pattern add3 {
  s   = add(a, b)
  out = add(s, c)
}
"""

# two RMSNorm sites: the first alone, the second after a residual add, which llm's
# add_rms_norm (earlier in the file, so ahead of rms_norm) takes with it
TWO_NORMS_IR = """func main(x: f32[n, 64], r: f32[n, 64], w: f32[64], v: f32[64]) -> f32[n, 64] {
  a = nn.rms_norm(x, w, axes=[-1], epsilon=1e-06)
  s = add(a, r)
  out = nn.rms_norm(s, v, axes=[-1], epsilon=1e-06)
  return out
}"""

# an RMSNorm written out, which the shipped rms_norm rewrite turns into nn.rms_norm
DECOMPOSED_IR = """func main(x: f32[n, 64], w: f32[64]) -> f32[n, 64] {
  sq = power(x, 2.0)
  var = mean(sq, axis=[-1], keepdims=true)
  ve = add(var, 1e-06)
  inv = rsqrt(ve)
  normed = multiply(x, inv)
  out = multiply(w, normed)
  return out
}"""

MEAN_SQ_DPL = """codegen mine
pattern mean_sq {
  sq = power(x, 2.0)
  m  = mean(sq, axis=[-1], keepdims=true)
}
"""

HOOK_DPL = """codegen mine
pattern picky_norm {
  out = nn.rms_norm(x, w)
  check explain_test.never
}
"""


@pytest.fixture
def files(tmp_path):
    def write(name, text):
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    return write


def rule(report, name):
    return next(r for r in report.rules if r.rule.split(".", 1)[-1] == name)


def test_used_names_the_composite(files):
    report = explain_module(dpl.parse(TWO_NORMS_IR), ["llm"])
    (site,) = rule(report, "add_rms_norm").sites
    assert (site.at, site.members, site.fate, site.composite) == ("out", ("s", "out"), "used", "fused_add_nn_rms_norm")
    assert "at out (s, out): used: became fused_add_nn_rms_norm" in str(rule(report, "add_rms_norm"))


def test_taken_by_an_earlier_rule_names_it_and_its_composite():
    """add_rms_norm and rms_norm are both priority 0: the earlier rule of the file wins, and
    explain says so rather than calling it higher-priority."""
    text = str(rule(explain_module(dpl.parse(TWO_NORMS_IR), ["llm"]), "rms_norm"))
    assert "matches at 2 bindings: 1 used, 1 taken" in text
    assert "at a: used: became fused_nn_rms_norm" in text
    assert (f"at out: taken by kernel.add_rms_norm (llm.dpl:{shipped_line('add_rms_norm')}:1), an earlier rule of the same priority (0: the order "
            "of the files and rules decides): its match at out (s, out) became fused_add_nn_rms_norm") in text
    assert "closest miss" not in text


PRODUCT_NORM_IR = """func main(x: f32[n, 64], r: f32[n, 64], w: f32[64, 64], g: f32[64]) -> f32[n, 64] {
  mm = matmul(x, w)
  s = add(r, mm)
  out = nn.rms_norm(s, g, axes=[-1], epsilon=1e-06)
  return out
}"""


def shipped_line(rule_name: str, library: str = "llm") -> int:
    """The line of ``pattern RULE_NAME`` in a shipped library, so that a rule added above it
    moves the expected location with it."""
    text = importlib.resources.files("dpl.patterns").joinpath(f"{library}.dpl").read_text()
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith(f"pattern {rule_name} "))


def test_taken_by_a_higher_priority_rule_says_both_priorities():
    text = str(rule(explain_module(dpl.parse(PRODUCT_NORM_IR), ["llm"]), "add_rms_norm"))
    where = f"llm.dpl:{shipped_line('matmul_add_rms_norm')}:1"
    assert f"taken by kernel.matmul_add_rms_norm ({where}), a higher-priority rule (priority 5, this one 0)" in text


def test_a_leak_is_a_rejection_not_a_match(files):
    report = explain_module(dpl.parse(LEAK_IR), [files("mine.dpl", MINE_DPL)], rule="add_norm")
    text = str(report.rules[0])
    assert "at out (s, out): rejected: its intermediate s is returned by 'main'" in text
    assert "used" not in text and "closest miss" not in text
    assert report.rules[0].sites[0].fate == "rejected"


def test_the_where_conjunct_that_refused_and_its_values(files):
    text = str(explain_module(dpl.parse(LEAK_IR), [files("mine.dpl", MINE_DPL)], rule="wide_norm").rules[0])
    assert "at out: rejected: check said no: " in text
    assert "mine.dpl:8:9: 'shape(x)[-1] >= 128' does not hold: shape(x)[-1] = 64" in text


def test_a_check_hook_that_refused(files):
    @dpl.check_hook("explain_test.never", replace=True)
    def never(view):
        return False

    text = str(explain_module(dpl.parse(LEAK_IR), [files("hook.dpl", HOOK_DPL)]).rules[0])
    assert "at out: rejected: check said no: check hook 'explain_test.never' said no" in text


def test_no_closest_miss_inside_a_match(files):
    """add3 tried at s (the inner add) fails one binding in: s is part of the match at out."""
    r = explain_module(dpl.parse(LEAK_IR.replace("out = nn.rms_norm(s, w, axes=[-1], epsilon=1e-06)", "out = add(s, x)")),
                       [files("mine.dpl", MINE_DPL)], rule="add3").rules[0]
    assert [s.at for s in r.sites] == ["out"] and not r.misses
    assert "closest miss" not in str(r)


def test_consumed_by_a_rewrite_names_it_and_what_it_made(files):
    report = explain_module(dpl.parse(DECOMPOSED_IR), ["rewrites", files("mean_sq.dpl", MEAN_SQ_DPL)], rule="mean_sq")
    r = report.rules[0]
    assert not r.matches
    (site,) = r.sites
    assert (site.at, site.members, site.fate, site.by) == ("var", ("sq", "var"), "consumed", "rms_norm")
    text = str(r)
    assert "matched before the rewrites at 1 binding: 1 consumed" in text
    assert ("at var (sq, var): consumed by rewrite rms_norm (rewrites.dpl:18:1), "
            "which folded sq, var into out = nn.rms_norm") in text
    assert "no binding gets past the root op" not in text
    # without the rewrite, the same rule is used
    alone = explain_module(dpl.parse(DECOMPOSED_IR), [files("mean_sq.dpl", MEAN_SQ_DPL)]).rules[0]
    assert [(s.at, s.fate, s.composite) for s in alone.sites] == [("var", "used", "fused_power_mean")]


def test_the_trace_names_the_composite_of_each_accepted_match():
    trace = Trace()
    out = dpl.apply(dpl.parse(TWO_NORMS_IR), "llm", trace=trace, fuse=False, annotate_codegen=False)
    accepted = {(e.pattern, e.root): e.composite for e in trace.accepted()}
    assert accepted == {("kernel.add_rms_norm", "out"): "fused_add_nn_rms_norm", ("kernel.rms_norm", "a"): "fused_nn_rms_norm"}
    assert all(name in out.functions for name in accepted.values())
    claims = trace.claims()
    assert claims["main", "s"].pattern == "kernel.add_rms_norm" and ("main", "x") not in claims


def test_explain_json(files, capsys):
    path = files("two.ir", TWO_NORMS_IR)
    assert dpl_main(["explain", path, "-p", "llm", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"rewrites", "rules"}
    rules = {r["rule"]: r for r in out["rules"]}
    assert set(rules["kernel.rms_norm"]) == {"rule", "kind", "origin", "applied", "sites", "misses"}
    sites = {s["binding"]: s for s in rules["kernel.rms_norm"]["sites"]}
    assert sites["a"]["fate"] == "used" and sites["a"]["composite"] == "fused_nn_rms_norm"
    assert sites["out"]["fate"] == "taken" and sites["out"]["by"] == "kernel.add_rms_norm"
    assert sites["out"]["composite"] == "fused_add_nn_rms_norm" and "earlier rule of the same priority" in sites["out"]["detail"]
    assert set(sites["out"]) == {"function", "binding", "members", "fate", "detail", "composite", "by"}

    leak = files("leak.ir", LEAK_IR)
    assert dpl_main(["explain", leak, "-p", files("mine.dpl", MINE_DPL), "--json"]) == 0
    rules = {r["rule"]: r for r in json.loads(capsys.readouterr().out)["rules"]}
    (site,) = rules["mine.add_norm"]["sites"]
    assert site["fate"] == "rejected" and "returned by 'main'" in site["detail"] and site["members"] == ["s", "out"]
    assert "'shape(x)[-1] >= 128' does not hold" in rules["mine.wide_norm"]["sites"][0]["detail"]

    decomposed = files("dec.ir", DECOMPOSED_IR)
    assert dpl_main(["explain", decomposed, "-p", "rewrites", "-p", files("m.dpl", MEAN_SQ_DPL), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["rule"] for r in out["rewrites"]] == ["rms_norm"]
    rules = {r["rule"]: r for r in out["rules"]}
    assert [s["fate"] for s in rules["mine.mean_sq"]["sites"]] == ["consumed"]
    assert [(s["binding"], s["fate"]) for s in rules["rms_norm"]["sites"]] == [("out", "applied")]

    off = files("off.ir", DECOMPOSED_IR.replace("rsqrt(ve)", "sqrt(ve)"))
    assert dpl_main(["explain", off, "-p", "rewrites", "--rule", "rms_norm", "--json"]) == 0
    (r,) = json.loads(capsys.readouterr().out)["rules"]
    assert r["sites"] == [] and r["misses"][0]["at"] == "out" and r["misses"][0]["failed_binding"] == "r"
    assert "expected op rsqrt, found sqrt" in r["misses"][0]["why"] and "inv = sqrt(ve)" in r["misses"][0]["met"]
    assert set(r["misses"][0]) == {"function", "at", "matched", "total", "failed_binding", "sub_pattern", "met", "why", "refused"}
