"""dpl.apply end to end: text module and pattern libraries in, fused module out; the result
computes what the original computes, the input is untouched, and applying twice is a no-op."""

from pathlib import Path

import numpy as np
import pytest

import dpl
from dpl.errors import DplError

EXAMPLES = Path(__file__).parent.parent / "examples"


def random_args(func, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for p in func.params:
        shape = tuple(5 if isinstance(d, str) else d for d in p.ty.shape)
        out.append(rng.standard_normal(shape).astype(dpl.dtypes.to_numpy(p.ty.dtype)))
    return out


def assert_same_numbers(a, b, func, tol=1e-4):
    args = random_args(func)
    x, y = dpl.interpret(a, *args), dpl.interpret(b, *args)
    for u, v in zip(x if isinstance(x, tuple) else (x,), y if isinstance(y, tuple) else (y,)):
        t = 5e-3 if u.dtype == np.float16 else tol
        np.testing.assert_allclose(u.astype(np.float64), v.astype(np.float64), rtol=t, atol=t)


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.ir")), ids=lambda p: p.stem)
@pytest.mark.parametrize("libraries", [["cublas"], ["rewrites", "llm", "cublas"], ["llm"]], ids="+".join)
def test_apply_keeps_numbers_input_and_is_idempotent(example, libraries):
    mod = dpl.load(example)
    before = mod.script()
    out = dpl.apply(mod, libraries, fuse=False)
    assert mod.script() == before
    assert_same_numbers(mod, out, mod["main"])
    again = dpl.apply(out, libraries, fuse=False)
    assert dpl.structural_equal(again, out)


def test_decomposed_rmsnorm_becomes_one_two_output_composite():
    mod = dpl.load(EXAMPLES / "residual_rmsnorm.ir")
    trace = dpl.Trace()
    out = dpl.apply(mod, ["rewrites", "llm"], fuse=False, trace=trace)
    [comp] = [f for f in out.functions.values() if "Composite" in f.attrs]
    assert comp.attrs["Composite"] == "kernel.add_rms_norm"
    assert [b.value.op for b in comp.bindings] == ["add", "nn.rms_norm"]
    assert isinstance(comp.ret, dpl.Tuple) and [v.name for v in comp.ret.fields] == ["s", "out"]
    assert trace.accepted("kernel.add_rms_norm")
    assert_same_numbers(mod, out, mod["main"])


def test_switches_bisect_the_flow():
    mod = dpl.load(EXAMPLES / "residual_rmsnorm.ir")
    only_rewrites = dpl.apply(mod, ["rewrites", "llm"], composites=False, fuse=False)
    assert not any("Composite" in f.attrs for f in only_rewrites.functions.values())
    assert "nn.rms_norm" in only_rewrites.script()
    no_rewrites = dpl.apply(mod, ["rewrites", "llm"], rewrites=False, fuse=False)
    assert "nn.rms_norm" not in no_rewrites.script()
    no_codegen = dpl.apply(mod, ["rewrites", "llm"], annotate_codegen=False, fuse=False)
    assert not any("Codegen" in f.attrs for f in no_codegen.functions.values())


def test_patterns_given_every_way(tmp_path):
    mod = dpl.load(EXAMPLES / "llama_mlp.ir")
    path = tmp_path / "mine.dpl"
    path.write_text("pattern mine.silu_mul { a = nn.silu(g); out = multiply(a, u) }\n")
    for patterns in [str(path), path, [path, "cublas"], dpl.load_patterns(str(path)), list(dpl.load_patterns(str(path)).patterns)]:
        out = dpl.apply(mod, patterns, fuse=False)
        assert any(f.attrs.get("Composite") == "mine.silu_mul" for f in out.functions.values())
    with pytest.raises(DplError, match="patterns must be"):
        dpl.apply(mod, 3, fuse=False)
    with pytest.raises(DplError, match="no shipped or installed pattern library 'cublass'"):
        dpl.apply(mod, "cublass", fuse=False)


def test_outputs_clause_errors():
    with pytest.raises(DplError, match="'t' in outputs is not a binding of the pattern"):
        dpl.parse_patterns("pattern k.p { s = add(a, b); out = exp(s); outputs t }")


def test_full_flow_fuses_what_patterns_left_and_never_inside_composites():
    mod = dpl.load(EXAMPLES / "llama_mlp.ir")
    out = dpl.apply(mod, ["llm", "cublas"])
    for name, fn in out.functions.items():
        if "Composite" in fn.attrs or "Codegen" in fn.attrs:
            assert not any(isinstance(b.value.op, dpl.GlobalVar) and "Primitive" in out[b.value.op.name].attrs
                           and "Composite" not in out[b.value.op.name].attrs for b in fn.bindings)
    kinds = sorted(fn.attrs.get("Composite", "primitive") for fn in out.functions.values() if "Primitive" in fn.attrs or "Composite" in fn.attrs)
    assert kinds.count("kernel.swiglu") == 1 and kinds.count("cublas.matmul") >= 1
    assert_same_numbers(mod, out, mod["main"])
    assert dpl.structural_equal(dpl.apply(out, ["llm", "cublas"]), out)


def test_multi_root_pattern_becomes_one_composite_returning_every_root():
    mod = dpl.parse(
        "func main(x: f32[8, 64], wq: f32[64, 64], g: f32[64, 128], u: f32[64, 128]) -> (f32[8, 64], f32[8, 128]) {\n"
        "  q = matmul(x, wq)\n  gate = matmul(x, g)\n  up = matmul(x, u)\n  a = nn.silu(gate)\n  h = multiply(a, up)\n"
        "  return (q, h)\n}\n"
    )
    patterns = dpl.parse_patterns(
        "## gate and up projections of one input, as one kernel\n"
        "pattern kernel.gate_up {\n  gate = matmul(x, wg)\n  up = matmul(x, wu)\n"
        "  where shape(wg)[1] == 128 and shape(wu)[1] == 128\n}\n"
    )
    [fp] = patterns.patterns
    assert fp.multi_root
    out = dpl.apply(mod, patterns, fuse=False, annotate_codegen=False)
    [comp] = [f for f in out.functions.values() if "Composite" in f.attrs]
    assert [b.var.name for b in comp.bindings] == ["gate", "up"]
    assert isinstance(comp.ret, dpl.Tuple) and [v.name for v in comp.ret.fields] == ["gate", "up"]
    assert [b.var.name for b in out["main"].bindings] == ["q", "lv0", "gate", "up", "a", "h"]
    assert_same_numbers(mod, out, mod["main"])
    # the same x: two matmuls of different inputs are not one match
    other = dpl.parse(
        "func main(x: f32[8, 64], y: f32[8, 64], g: f32[64, 128], u: f32[64, 128]) -> (f32[8, 128], f32[8, 128]) {\n"
        "  gate = matmul(x, g)\n  up = matmul(y, u)\n  return (gate, up)\n}\n"
    )
    assert dpl.structural_equal(dpl.apply(other, patterns, fuse=False), other)


def test_multi_root_combinations_with_a_taken_root_are_not_tried():
    """Three gate/up pairs: three composites, and the trace holds no rejection for orderings of
    roots an accepted match already took (before, (up, gate) was rejected after (gate, up))."""
    lines = ["func main(x0: f32[4, 16], x1: f32[4, 16], x2: f32[4, 16], g: f32[16, 32], u: f32[16, 32])"
             " -> (f32[4, 32], f32[4, 32], f32[4, 32]) {"]
    for k in range(3):
        lines += [f"  gate{k} = matmul(x{k}, g)", f"  up{k} = matmul(x{k}, u)", f"  h{k} = multiply(gate{k}, up{k})"]
    mod = dpl.parse("\n".join(lines + ["  return (h0, h1, h2)", "}"]))
    patterns = dpl.parse_patterns("pattern kernel.gate_up {\n  gate = matmul(x, wg)\n  up = matmul(x, wu)\n}\n")
    trace = dpl.Trace()
    out = dpl.apply(mod, patterns, fuse=False, annotate_codegen=False, trace=trace)
    [comp] = [f for f in out.functions.values() if "Composite" in f.attrs]  # three calls of one function
    assert [b.var.name for b in comp.bindings] == ["gate0", "up0"]
    assert sum(isinstance(b.value, dpl.Call) and b.value.op == dpl.GlobalVar(comp.name) for b in out["main"].bindings) == 3
    assert len(trace.accepted("kernel.gate_up")) == 3 and trace.rejected("kernel.gate_up") == []
    assert_same_numbers(mod, out, mod["main"])


def test_fuse_reductions_makes_a_decomposed_rmsnorm_one_kernel():
    from dpl.kernel import evaluate, lower_function

    mod = dpl.load(EXAMPLES / "residual_rmsnorm.ir")
    tvm_like = dpl.apply(mod, fuse=True, multi_output=False)
    rows = dpl.apply(mod, fuse=True, fuse_reductions=True)
    # TVM leaves add, astype and power as three kernels before the mean's group...
    assert [b.var.name for b in tvm_like["main"].bindings] == ["s", "h32", "sq", "out"]
    # ...the row fusion makes the whole residual + norm one kernel
    prims = [f for f in rows.functions.values() if "Primitive" in f.attrs]
    assert len(prims) == 1 and all(isinstance(b.value, dpl.TupleGetItem) or isinstance(b.value.op, dpl.GlobalVar)
                                   for b in rows["main"].bindings)
    [fn] = prims
    assert [b.value.op for b in fn.bindings if isinstance(b.value, dpl.Call)].count("mean") == 1
    kernel = lower_function(fn)
    args = random_args(fn)
    want, got = dpl.interpret(fn, *args), evaluate(kernel, *args)
    for w, g in zip(want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,)):
        np.testing.assert_allclose(np.asarray(g, np.float64), w.astype(np.float64), rtol=5e-3, atol=5e-3)
    assert_same_numbers(mod, rows, mod["main"])


def test_the_report_names_the_rules_that_never_matched():
    """A rule with no match is said in the report (a fresh user's rule was silently missing)."""
    mod = dpl.parse((Path(__file__).resolve().parents[1] / "examples" / "mlp.ir").read_text())
    trace = dpl.Trace()
    dpl.apply(mod, dpl.parse_patterns("codegen kernel\npattern act { out = nn.gelu(x) }\n"
                                      "pattern never { out = nn.relu(x) }\n"), trace=trace)
    report = trace.report()
    assert "kernel.act: 1 accepted, 0 rejected" in report
    assert "no match: kernel.never (dpl explain shows each one's closest misses)" in report
