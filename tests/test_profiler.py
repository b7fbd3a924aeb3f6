"""dpl profile: measures single-op and fused times per group and shape, writes the seed's file."""

import io
import json
from pathlib import Path

import numpy as np
import pytest

import dpl
from dpl.cli import main
from dpl.runtime import FusionConfig, exact_key, load_profile, profile_module
from runtime_corpus import inputs_for, primitive_groups, symbolic


def test_profile_module_writes_single_fused_and_shapes(tmp_path, no_c_compiler):
    path = tmp_path / "p.json"
    bar = io.StringIO()
    data = profile_module(symbolic(), path, dims={"n": 256}, repeat=3, progress=bar)
    raw = json.loads(path.read_text())
    assert set(raw) == {"version", "single", "fused", "separate", "groups"}
    assert set(raw["single"]) == {"nn.silu", "multiply"} and all(v > 0 for v in raw["single"].values())
    g = symbolic()["fused_silu_multiply"]
    key = exact_key(g, [(256, 64), (256, 64)], ["float32", "float32"])
    assert raw["fused"][key] == raw["fused"]["nn.silu+multiply"] > 0
    assert raw["separate"][key] == pytest.approx(raw["single"]["nn.silu"] + raw["single"]["multiply"])
    [rec] = raw["groups"]
    assert rec["input_shapes"] == [[256, 64], [256, 64]] and rec["ops"] == ["nn.silu", "multiply"] and rec["backend"] == "numpy"
    assert "1/1 fused_silu_multiply" in bar.getvalue() and "[" + "#" * 30 + "]" in bar.getvalue()
    assert load_profile(path) == data


def test_profiles_merge_and_drive_the_heuristics(tmp_path):
    path = tmp_path / "p.json"
    profile_module(symbolic(), path, dims={"n": 256}, repeat=2, progress=None)
    profile_module(primitive_groups(), path, repeat=2, progress=None)
    raw = json.loads(path.read_text())
    assert len(raw["groups"]) == 4  # the swiglu at n=256 and the three groups of the second module
    assert {"nn.silu+multiply", "add+nn.rms_norm", "multiply+exp"} <= set(raw["fused"])
    mod = symbolic()
    exe = dpl.build(mod, "numpy", config=FusionConfig(profile_path=str(path)))
    args = inputs_for(mod, {"n": 256})
    np.testing.assert_array_equal(exe(*args), dpl.interpret(mod, *args))
    [(_, _, decision)] = exe.plan(*args).decisions
    assert decision.decision.rule == "profile: exact key"


def test_the_cli_command(tmp_path, monkeypatch, capsys):
    out = tmp_path / "prof.json"
    assert main(["profile", str(tmp_path / "missing.ir"), "-o", str(out)]) == 1
    assert "missing.ir' does not exist" in capsys.readouterr().err
    dpl.save(symbolic(), tmp_path / "m.ir")
    monkeypatch.chdir(tmp_path)
    assert main(["profile", "m.ir", "-o", str(out), "--dim", "n=128", "--repeat", "2"]) == 0
    text = capsys.readouterr()
    assert "fused_silu_multiply" in text.out and "128x64 128x64" in text.out and f"wrote {out}" in text.err
    assert json.loads(out.read_text())["groups"][0]["input_shapes"] == [[128, 64], [128, 64]]
    assert main(["profile", "m.ir", "--dim", "n"]) == 2  # a usage error, as argparse reports them
    assert "argument --dim: takes NAME=SIZE, SIZE a whole number, got 'n'" in capsys.readouterr().err
    assert main(["profile", "m.ir", "--dim", "m=4"]) == 1
    assert "has no dimension 'm' (its symbolic dimensions are n)" in capsys.readouterr().err


def test_the_cli_fuses_an_unfused_module_first_and_writes_only_where_told(tmp_path, monkeypatch, capsys):
    """An unfused module (the README's examples/llama_mlp.ir) is fused first, and its groups
    profiled; without -o no file appears in the working directory."""
    monkeypatch.chdir(tmp_path)
    example = str(Path(__file__).parent.parent / "examples" / "llama_mlp.ir")
    assert main(["profile", example, "--dim", "n=4", "--repeat", "1", "--target", "numpy"]) == 0
    text = capsys.readouterr()
    assert "no fused groups: fusing it first" in text.err and "not saved" in text.err
    assert "fused_matmul_nn_silu" in text.out and "4x256 256x688" in text.out
    assert list(tmp_path.iterdir()) == []
    assert main(["profile", example, "--dim", "n=4", "--repeat", "1", "--target", "numpy", "-p", "llm", "-o", "p.json", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["fused_first"] is True and report["output"] == "p.json"
    assert report["groups"] and all(g["separate"] > 0 for g in report["groups"])
    assert json.loads((tmp_path / "p.json").read_text())["groups"] == report["groups"]
