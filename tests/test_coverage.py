"""Coverage (``Trace.coverage()``, ``dpl report``): what the report says about each op agrees
with an independent count over the fused module's functions, on the shipped examples and on
models built with torch.nn; alone ops carry their reason."""

import json
from pathlib import Path

import pytest

import needs

import dpl
from dpl.cli import main as dpl_main
from dpl.ir.expr import Call, GlobalVar, Tuple, TupleGetItem
from dpl.ir.simplify import remove_dead_bindings
from dpl.transform.normalize import normalize_function
from dpl.transform.rematerialize import copy_sources

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CASES = [("llama_mlp.ir", ["rewrites", "llm"]), ("conv_block.ir", ["llm"]),
         ("residual_rmsnorm.ir", ["rewrites", "llm"]), ("attention.ir", ["rewrites", "llm"]), ("llama_mlp.ir", [])]


def ops_in(mod, fn):
    """Every op call inside ``fn``, nested expressions and called functions included."""
    count = 0
    stack = [b.value for b in fn.bindings] + [fn.ret]
    while stack:
        e = stack.pop()
        if isinstance(e, Call):
            stack.extend(e.args)
            if isinstance(e.op, str):
                count += 1
            elif e.op.name in mod.functions:
                count += ops_in(mod, mod[e.op.name])
        elif isinstance(e, Tuple):
            stack.extend(e.fields)
        elif isinstance(e, TupleGetItem):
            stack.append(e.tuple_value)
    return count


def independent_count(mod, entry="main"):
    """(ops per composite name, ops in Primitive groups, number of groups, ops in the entry)."""
    composites, auto, groups, alone = {}, 0, 0, 0
    for b in mod[entry].bindings:
        v = b.value
        if not isinstance(v, Call):
            continue
        if isinstance(v.op, str):
            alone += ops_in(mod, dpl.Function("f", (), (dpl.Binding(b.var, v),), b.var))
            continue
        callee = mod[v.op.name]
        inner = [mod[c.value.op.name] for c in callee.bindings
                 if isinstance(c.value, Call) and isinstance(c.value.op, GlobalVar)]
        comp = callee.attrs.get("Composite") or next((f.attrs["Composite"] for f in inner if "Composite" in f.attrs), None)
        if comp is not None:
            composites[comp] = composites.get(comp, 0) + ops_in(mod, callee)
        elif callee.attrs.get("Primitive"):
            auto += ops_in(mod, callee)
            groups += 1
    return composites, auto, groups, alone


def check_agrees(trace):
    fused = trace.result
    cov = trace.coverage(target="cpu")["main"]
    composites, auto, groups, alone = independent_count(fused)
    assert cov.by_composite() == composites
    assert cov.in_automatic == auto
    assert sum(g.claim == "automatic" for g in cov.groups) == groups
    assert len(cov.alone) == alone
    assert cov.total == sum(composites.values()) + auto + alone
    # fusion moves ops into functions: it never adds one, nor drops one that is used (a dead
    # group goes, as in TVM; a dead op inside a live group stays in its function); it adds at
    # most a copy of a cheap source per extra reader (FuseOps' rematerialize: T5's arange)
    live = ops_in(trace.rewritten, remove_dead_bindings(trace.rewritten["main"]))
    _, copies = copy_sources(normalize_function(trace.rewritten["main"]))
    most = ops_in(trace.rewritten, trace.rewritten["main"]) + sum(len(c) - 1 for c in copies)
    assert live <= cov.total <= most
    data = cov.to_json()
    assert data["ops"] == cov.total
    assert abs(data["composite"]["share"] + data["automatic"]["share"] + data["alone"]["share"] - 100) < 0.2
    assert all(g.runtime is not None and g.runtime.backend for g in cov.groups)
    return cov


@pytest.mark.parametrize("name, patterns", CASES)
def test_report_agrees_with_the_modules_functions_on_the_examples(name, patterns):
    trace = dpl.Trace()
    dpl.apply(dpl.load(EXAMPLES / name), patterns, trace=trace)
    cov = check_agrees(trace)
    if not patterns:
        assert cov.in_composites == 0


def test_alone_ops_say_why():
    mod = dpl.parse("""
func main(x: f32[16, 64], i: i64[4], w: f32[64]) -> (f32[4, 64], f32[16, 64]) {
  g = take(x, i, axis=0)
  r = nn.relu(g)
  h = nn.rms_norm(x, w)
  return (r, h)
}""")
    rules = dpl.parse_patterns("""codegen kernel
pattern wide_norm {
  out = nn.rms_norm(x, w)
  where rank(w) == 1 and rank(x) == 3
}
""", "rules.dpl")
    trace = dpl.Trace()
    dpl.apply(mod, rules, trace=trace)
    alone = {a.binding: a for a in trace.coverage()["main"].alone}
    assert alone["g"].reason == "opaque"
    assert alone["h"].reason == "refused" and alone["h"].rule == "kernel.wide_norm"
    # the conjunct that failed, where it is written, and the values it saw
    assert "'rank(x) == 3' does not hold: rank(x) = 2" in alone["h"].detail
    assert "rules.dpl:4:26" in alone["h"].detail and "rank(w) == 1" not in alone["h"].detail
    assert alone["r"].reason == "unmatched"  # its only neighbour is the opaque take


def test_dpl_report_prints_shares_and_json(capsys):
    path = str(EXAMPLES / "llama_mlp.ir")
    assert dpl_main(["report", path, "-p", "llm"]) == 0
    table = capsys.readouterr().out
    assert "kernel.swiglu" in table and "%" in table and "at run time" in table
    assert dpl_main(["report", path, "-p", "llm", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["functions"][0]
    trace = dpl.Trace()
    dpl.apply(dpl.load(path), ["llm"], trace=trace)
    assert data == trace.coverage(target="cpu")["main"].to_json()


# -- models built with torch.nn ----------------------------------------------------------------

def torch_models():
    torch = needs.package("torch")
    from torch import nn

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), nn.LayerNorm(16))
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 4 * 4, 10))
    return [(mlp.eval(), (torch.randn(4, 16),)), (cnn.eval(), (torch.randn(2, 3, 8, 8),))]


@pytest.mark.parametrize("which", [0, 1])
def test_report_agrees_on_torch_nn_models(which):
    model, args = torch_models()[which]
    trace = dpl.Trace()
    dpl.apply(dpl.from_torch(model, args), ["rewrites", "llm"], trace=trace)
    cov = check_agrees(trace)
    assert cov.total > 3


def test_runtime_decisions_agree_with_what_a_build_did():
    """decide() asks the heuristics without compiling; from_executable() reads the plans of a
    real build: on conv_block (the seed's rule 3 sends both groups op by op) and llama_mlp they agree."""
    needs.c_compiler()
    from dpl.cli import random_inputs
    from dpl.viz.runtime import decide, from_executable

    for name, patterns in (("conv_block.ir", ["llm"]), ("llama_mlp.ir", ["llm"])):
        fused = dpl.apply(dpl.load(EXAMPLES / name), patterns)
        exe = dpl.build(fused, "cpu", config=dpl.FusionConfig.seed())
        exe(*random_inputs(fused["main"], 0))
        built, asked = from_executable(exe), decide(fused, "cpu", dpl.FusionConfig.seed())
        assert built.keys() == asked.keys()
        for fn in built:
            assert built[fn].fused == asked[fn].fused and built[fn].backend == asked[fn].backend, fn
    fused = dpl.apply(dpl.load(EXAMPLES / "conv_block.ir"), ["llm"])
    exe = dpl.build(fused, "cpu", config=dpl.FusionConfig.seed())
    exe(*random_inputs(fused["main"], 0))
    decision = from_executable(exe)["fused_nn_conv2d_add_nn_relu"]
    assert not decision.fused and "rule 3" in decision.why
    exe = dpl.build(fused, "cpu")  # the default: its small bias no longer sends the group op by op
    exe(*random_inputs(fused["main"], 0))
    assert from_executable(exe)["fused_nn_conv2d_add_nn_relu"].fused


def test_trace_report_and_dpl_fuse_report_end_with_the_coverage_table(capsys):
    path = str(EXAMPLES / "attention.ir")
    trace = dpl.Trace()
    dpl.apply(dpl.load(path), ["rewrites", "llm"], trace=trace)
    table = trace.coverage().table()
    assert "coverage of 'main'" in table and trace.report().endswith(table)
    assert dpl_main(["fuse", path, "-p", "rewrites", "-p", "llm", "--report"]) == 0
    out = capsys.readouterr().out
    assert "\n".join(f"# {line}" for line in table.splitlines()) in out
