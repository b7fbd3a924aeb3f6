"""The command line as a table: every subcommand's --help, its exit codes (0 ok, 1 bad input,
2 usage, 3 internal failure, 130 interrupted), its --json output and documented keys; and the
options every command shares (-v/-q, --version, - as stdin, -o with the .npz sidecar)."""

from __future__ import annotations

import ast
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dpl
import dpl.cli.command
import needs
from dpl.cli import build_parser, main
from dpl.cli.run import compare

ROOT = Path(__file__).parent.parent

MODULE = """\
func main(x: f32[n, 8], w: f32[8, 4], b: f32[4]) -> f32[n, 4] {
  y = matmul(x, w)
  z = add(y, b)
  out = nn.relu(z)
  return out
}
"""

PATTERNS = """\
codegen mylib

## matmul + bias
pattern mm_bias {
  mm = matmul(x, w)
  out = add(mm, b)
}
"""


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.ir").write_text(MODULE)
    (tmp_path / "p.dpl").write_text(PATTERNS)
    (tmp_path / "bad.ir").write_text("func main(x: f32[2]) -> f32[2] {\n  return nope\n}\n")
    return tmp_path


# command -> (arguments that succeed, arguments that are bad input); "demo" takes no input
TABLE = {
    "print": (["m.ir"], ["bad.ir"]),
    "run": (["m.ir", "--dim", "n=3"], ["m.ir", "--dim", "m=3"]),
    "check": (["p.dpl", "llm"], ["missing.dpl"]),
    "fuse": (["m.ir", "-p", "p.dpl"], ["m.ir", "-p", "nolib"]),
    "profile": (["m.ir", "--dim", "n=4", "--repeat", "1", "--target", "numpy"], ["missing.ir"]),
    "demo": ([], None),
}

# command -> (--json arguments, the documented keys)
JSON_KEYS = {
    "run": (["m.ir", "--target", "numpy", "--check", "--time", "--repeat", "2"],
            {"file", "entry", "target", "patterns", "outputs", "ran_on", "fallbacks", "check", "time", "package"}),
    "check": (["p.dpl"], {"rules", "count", "shadowed"}),
    "fuse": (["m.ir", "-p", "p.dpl", "--report"], {"module", "output", "events"}),
    "profile": (["m.ir", "--dim", "n=4", "--repeat", "1", "--target", "numpy"], {"module", "output", "fused_first", "groups"}),
}


def subcommands() -> list[str]:
    parser = build_parser()
    [sub] = [a for a in parser._actions if a.dest == "command"]
    return list(sub.choices)


def test_the_table_covers_the_commands_of_this_file():
    assert set(TABLE) <= set(subcommands())


@pytest.mark.parametrize("command", subcommands())
def test_help_and_usage_errors(command, capsys):
    assert main([command, "--help"]) == 0
    assert f"usage: dpl {command}" in capsys.readouterr().out
    assert main([command, "--no-such-option"]) == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("command", list(TABLE))
def test_ok_and_bad_input(command, files, capsys):
    ok, bad = TABLE[command]
    assert main([command, *ok]) == 0, capsys.readouterr().err
    capsys.readouterr()
    if bad is None:
        return
    assert main([command, *bad]) == 1
    err = capsys.readouterr().err
    assert "error" in err and "Traceback" not in err


@pytest.mark.parametrize("command", list(TABLE))
def test_internal_failures_and_interrupts(command, files, capsys, monkeypatch):
    def failing(exc):
        real = build_parser

        def patched():
            parser = real()
            [sub] = [a for a in parser._actions if a.dest == "command"]
            sub.choices[command].set_defaults(func=lambda args: (_ for _ in ()).throw(exc))
            return parser

        monkeypatch.setattr(dpl.cli.command, "build_parser", patched)

    failing(RuntimeError("boom"))
    assert main([command, *TABLE[command][0]]) == 3
    err = capsys.readouterr().err
    assert "internal error (RuntimeError: boom)" in err and "report it as a bug" in err and "Traceback" not in err
    assert main(["-v", command, *TABLE[command][0]]) == 3
    assert "Traceback" in capsys.readouterr().err  # -v shows where
    failing(KeyboardInterrupt())
    assert main([command, *TABLE[command][0]]) == 130
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("command", list(JSON_KEYS))
def test_json_outputs(command, files, capsys):
    args, keys = JSON_KEYS[command]
    assert main([command, *args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == keys
    if command == "run":
        assert out["check"]["ok"] is True and out["check"]["max_abs_error"] == 0.0
        assert out["time"]["runs"] == 2 and out["time"]["median_ms"] > 0
        assert out["ran_on"] == {"fused_matmul_add_nn_relu": "numpy"} and out["fallbacks"] == []  # dpl.apply fused the three ops
        [o] = out["outputs"]
        assert o["shape"] == [8, 4] and o["dtype"] == "float32" and o["checksum"] > 0  # relu: non-negative, not all 0
    if command == "check":
        assert out["count"] == 1 and out["rules"][0]["name"] == "mylib.mm_bias" and out["rules"][0]["location"].startswith("p.dpl:")
    if command == "fuse":
        assert [e["pattern"] for e in out["events"]] == ["mylib.mm_bias"] and out["events"][0]["accepted"] is True
        assert f'func {out["events"][0]["composite"]}(' in out["module"]  # the composite the match became
        assert '@composite("mylib.mm_bias")' in out["module"] and out["output"] is None
    if command == "profile":
        assert out["fused_first"] is True and out["output"] is None and len(out["groups"]) == 1


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"dpl {dpl.__version__}"


def test_the_installed_entry_point_exit_codes(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "dpl", *args], capture_output=True, text=True, cwd=tmp_path)

    assert run("--version").returncode == 0
    assert run("nosuchcommand").returncode == 2
    r = run("run", "missing.ir")
    assert r.returncode == 1 and "missing.ir' does not exist" in r.stderr


def test_run_check_reports_a_mismatch_and_exits_1(files, capsys, monkeypatch):
    import dpl.runtime

    class Wrong:
        plans, fallbacks = {}, []

        def __init__(self, mod, target, entry="main", strict=False):
            self.mod = mod

        def __call__(self, *args):
            return dpl.interpret(self.mod, *args) + 0.5

        def summary(self):
            return "wrong on purpose"

        def ran_on(self):
            return {}

    monkeypatch.setattr(dpl.runtime, "build", Wrong)
    assert main(["run", "m.ir", "--target", "numpy", "--check"]) == 1
    text = capsys.readouterr()
    assert "max abs error 0.5" in text.out and "MISMATCH" in text.out
    # the bound printed is the one used: atol scaled by the output's largest magnitude
    assert "differs from the interpreter beyond the bound |got - want| <= " in text.err and " + 0.0001 * |want|" in text.err
    assert main(["run", "m.ir", "--target", "numpy", "--check", "--atol", "1"]) == 0  # within a loose tolerance


def test_compare_treats_nans_integers_and_shapes():
    nan = np.array([1.0, np.nan], "float32")
    assert compare([nan], [nan.copy()], None, None)["ok"]
    assert not compare([np.array([1, 2])], [np.array([1, 3])], None, None)["ok"]
    assert not compare([np.zeros(3, "float32")], [np.zeros(4, "float32")], None, None)["ok"]
    a, b = np.array([100.0, 1.0], "float32"), np.array([100.0, 1.001], "float32")
    assert compare([a], [b], 0.0, 1e-4)["ok"]  # atol counts in units of the largest magnitude, 100
    got = compare([a], [b], 0.0, 1e-6)
    assert not got["ok"] and got["max_abs_error"] == pytest.approx(1e-3, rel=1e-3) and got["max_rel_error"] == pytest.approx(1e-3, rel=1e-2)
    # a value near 0 against another near 0 is within the absolute bound: no relative "100%"
    tiny = compare([np.array([-0.0, 5.0], "float32")], [np.array([-8e-38, 5.0], "float32")], None, None)
    assert tiny["ok"] and tiny["max_rel_error"] == 0.0 and tiny["max_abs_error"] == pytest.approx(8e-38)


def test_unknown_dims_name_the_dims_that_exist(files, capsys):
    assert main(["run", "m.ir", "--dim", "m=3"]) == 1
    assert "function 'main' has no dimension 'm' (its symbolic dimensions are n)" in capsys.readouterr().err


def test_dash_reads_stdin(files, capsys, monkeypatch):
    def stdin(text):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))

    stdin(MODULE)
    assert main(["print", "-"]) == 0
    assert capsys.readouterr().out == dpl.parse(MODULE).script()
    stdin(MODULE)
    assert main(["run", "-", "--dim", "n=2"]) == 0
    assert "output 0: shape (2, 4)" in capsys.readouterr().out
    stdin(PATTERNS)
    assert main(["check", "-"]) == 0
    assert "mylib.mm_bias" in capsys.readouterr().out
    stdin("pattern broken {")
    assert main(["check", "-"]) == 1
    assert capsys.readouterr().err.startswith("<stdin>:1:")


def test_print_and_fuse_write_the_sidecar_so_run_reads_the_module_back(files, capsys):
    fb = dpl.FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", 100))
    w = dpl.const(np.random.default_rng(0).standard_normal((100, 10)).astype("float32"))
    out = fb.emit("nn.relu", fb.emit("matmul", x, w), name="out")
    mod = dpl.Module([fb.ret(out)])
    (files / "big.ir").write_text(mod.script())  # no values: what `dpl print > big.ir` used to give
    dpl.save(mod, files / "whole.ir")
    assert main(["run", "big.ir"]) == 1
    assert "has no value" in capsys.readouterr().err
    assert main(["run", "whole.ir"]) == 0
    want = capsys.readouterr().out
    for command in ("print", "fuse"):
        assert main([command, "whole.ir", "-o", f"{command}.ir"]) == 0
        assert (files / f"{command}.ir.npz").exists() and f"wrote {command}.ir and {command}.ir.npz" in capsys.readouterr().err
        assert main(["run", f"{command}.ir"]) == 0
        assert capsys.readouterr().out == want
    assert main(["-q", "print", "whole.ir", "-o", "quiet.ir"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["print", "whole.ir", "-o", "no/such/dir/m.ir"]) == 1
    assert "cannot write 'no/such/dir/m.ir'" in capsys.readouterr().err


def test_warnings_go_through_the_dpl_logger(files, capsys, monkeypatch):
    import warnings

    def warn(args):
        warnings.warn("dpl: something to know", RuntimeWarning)  # dpl's own say "dpl:"
        np.exp(np.array([1000.0], "float32"))  # another library's: whose, and where
        return 0

    real = build_parser

    def patched():
        parser = real()
        [sub] = [a for a in parser._actions if a.dest == "command"]
        sub.choices["demo"].set_defaults(func=warn)
        return parser

    monkeypatch.setattr(dpl.cli.command, "build_parser", patched)
    assert main(["demo"]) == 0
    line = warn.__code__.co_firstlineno + 2
    assert capsys.readouterr().err == ("dpl: warning: something to know\n"
                                       f"dpl: warning: RuntimeWarning from tests/test_cli.py:{line}: overflow encountered in exp\n")
    assert main(["demo", "-q"]) == 0
    assert capsys.readouterr().err == ""


def test_the_library_never_prints():
    """print() belongs to the command line (dpl/cli/); the library logs."""
    offenders = []
    for path in [*(ROOT / "dpl").rglob("*.py"), *(ROOT / "backends").rglob("*.py")]:
        if path.parent.name == "cli" or path.name == "__main__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


def test_dash_reads_an_onnx_model_from_stdin(files, capsys, monkeypatch):
    needs.package("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4)).astype("float32"), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [w])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert main(["run", "-", "--dim", "batch=5", "--target", "numpy", "--check"]) == 0
    assert "output 0: shape (5, 4)" in capsys.readouterr().out
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xff\xfe not a model")))
    assert main(["print", "-"]) == 1
    assert "stdin is neither UTF-8 module text nor an ONNX model" in capsys.readouterr().err
