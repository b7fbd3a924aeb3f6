"""Rules of the same name in two pattern files: the earlier file wins (apply, load_patterns,
PatternSet +), with a logged note; ``dpl check`` warns naming both places."""

import logging

import numpy as np

import dpl
from dpl.cli import main
from dpl.lang import load_patterns, load_rules, shadowed_rules
from dpl.lang.libraries import read_library

MINE = """\
# my_patterns.dpl (the README's)
codegen cublas

## matmul + bias + activation
pattern matmul_bias_act {
  mm  = matmul(x, w)
  y   = add(mm, b)
  out = nn.relu(y) | nn.gelu(y) | nn.silu(y)
  where rank(b) == 1 and dtype(x) in [f16, f32]
  annotate lhs = x, bias = b
}

rewrite silu { out = multiply(x, sigmoid(x)) => nn.silu(x) }
"""

MODEL = """\
func main(x: f32[4, 8], w: f32[8, 16], b: f32[16]) -> f32[4, 16] {
  mm = matmul(x, w)
  y = add(mm, b)
  out = nn.relu(y)
  return out
}
"""


def test_earlier_file_wins_in_load_and_apply(tmp_path, caplog):
    mine = tmp_path / "my_patterns.dpl"
    mine.write_text(MINE)
    with caplog.at_level(logging.WARNING):
        rules = load_rules([str(mine), "cublas"])
    act = [r for r in rules if r.name == "cublas.matmul_bias_act"]
    assert len(act) == 1 and act[0].span.file == str(mine)
    assert "cublas.dpl:" in caplog.text and "the earlier one wins" in caplog.text
    assert load_patterns([str(mine), "cublas"])["cublas.matmul_bias_act"].origin.startswith(str(mine))

    mod = dpl.parse(MODEL)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        fused = dpl.apply(mod, [str(mine), "cublas"], fuse=False)  # used to raise "two rules named"
    assert "shadowed" in caplog.text and str(mine) in caplog.text
    composites = [f for f in fused.functions.values() if "Composite" in f.attrs]
    assert [f.attrs["Composite"] for f in composites] == ["cublas.matmul_bias_act"]
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(p.ty.shape).astype("float32") for p in mod["main"].params]
    np.testing.assert_allclose(dpl.interpret(fused, *args), dpl.interpret(mod, *args), rtol=1e-5, atol=1e-6)


def test_check_warns_naming_both_places(tmp_path, capsys):
    mine = tmp_path / "my_patterns.dpl"
    mine.write_text(MINE)
    assert main(["check", str(mine), "cublas"]) == 0
    out = capsys.readouterr().out
    shipped = read_library("cublas")[0].splitlines()
    line = shipped.index("pattern matmul_bias_act {") + 1
    assert (f"cublas.dpl:{line}:1: warning: pattern 'cublas.matmul_bias_act' is also defined at {mine}:5:1; "
            "the earlier one wins") in out
    assert out.rstrip().endswith("1 shadowed by an earlier file")
    [(dropped, kept)] = shadowed_rules([str(mine), "cublas"])
    assert (dropped.span.file, kept.span.file) == ("cublas.dpl", str(mine))
    assert shadowed_rules(["cublas", "llm"]) == []
