"""The CLI's small courtesies (issue 34): a did-you-mean for a misspelt pattern library or
target, ``--dim`` syntax as a usage error, an empty module or pattern file said out loud, and
counts of one in the singular."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dpl.cli import main

from test_cli import MODULE

ONE_OP = """\
func main(x: f32[4, 8]) -> f32[4, 8] {
  out = nn.relu(x)
  return out
}
"""


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.ir").write_text(MODULE)
    (tmp_path / "one.ir").write_text(ONE_OP)
    (tmp_path / "empty.ir").write_text("")
    (tmp_path / "comments.ir").write_text("# nothing here\n")
    (tmp_path / "empty.dpl").write_text("")
    return tmp_path


@pytest.mark.parametrize("argv", [
    ["fuse", "m.ir", "-p", "llmm"],
    ["run", "m.ir", "-p", "llmm", "--dim", "n=2"],
    ["explain", "m.ir", "-p", "llmm"],
    ["report", "m.ir", "-p", "rewrites", "-p", "llmm"],
    ["check", "llmm"],
])
def test_a_misspelt_library_gets_a_did_you_mean(files, capsys, argv):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "no shipped or installed pattern library 'llmm'" in err
    assert "hint: did you mean 'llm'? (shipped libraries: " in err


@pytest.mark.parametrize("argv", [
    ["run", "m.ir", "--target", "cpuu"],
    ["run", "m.ir", "--target", "numpy,cpuu"],
    ["profile", "m.ir", "--target", "cpuu"],
    ["report", "m.ir", "--target", "cpuu"],
])
def test_a_misspelt_target_gets_a_did_you_mean(files, capsys, argv):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "unknown backend 'cpuu'" in err and "hint: did you mean 'cpu'? (named targets: " in err


def test_a_name_close_to_nothing_keeps_the_plain_hint(files, capsys):
    assert main(["run", "m.ir", "--target", "zzzz"]) == 1
    err = capsys.readouterr().err
    assert "unknown backend 'zzzz'" in err and "did you mean" not in err and "named targets: " in err
    assert main(["fuse", "m.ir", "-p", "zzzz"]) == 1
    assert "did you mean" not in capsys.readouterr().err


@pytest.mark.parametrize("command", [["run", "m.ir"], ["profile", "m.ir"], ["report", "m.ir"], ["viz", "m.ir"]])
@pytest.mark.parametrize("dim", ["n=abc", "n", "=4", "n=-1", "n=²"])
def test_dim_syntax_is_a_usage_error(files, capsys, command, dim):
    assert main([*command, "--dim", dim]) == 2
    err = capsys.readouterr().err
    assert f"argument --dim: takes NAME=SIZE, SIZE a whole number, got '{dim}'" in err and "usage: dpl" in err


def test_dim_syntax_exit_code_from_the_shell(files):
    done = subprocess.run([sys.executable, "-m", "dpl", "run", "m.ir", "--dim", "n=abc"], capture_output=True, text=True)
    assert done.returncode == 2 and "--dim" in done.stderr and "Traceback" not in done.stderr


def test_a_dim_the_function_lacks_is_still_bad_input(files, capsys):
    assert main(["run", "m.ir", "--dim", "m=3"]) == 1
    assert "--dim m=3: function 'main' has no dimension 'm'" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["empty.ir", "comments.ir"])
@pytest.mark.parametrize("command", ["print", "run", "fuse", "report", "explain"])
def test_an_empty_module_is_a_located_error(files, capsys, name, command):
    argv = [command, name] + (["-p", "llm"] if command == "explain" else [])
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"{name}:1:1: error: empty module: no function\n")


def test_an_empty_module_on_stdin(files):
    done = subprocess.run([sys.executable, "-m", "dpl", "print", "-"], input="", capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout == ""
    assert "<stdin>:1:1: error: empty module: no function" in done.stderr


def test_a_pattern_file_with_no_rules_is_a_warning(files, capsys):
    """A file of ``def`` macros only is a valid library for others to import, so exit 0; but
    the user hears that nothing was checked."""
    assert main(["check", "empty.dpl"]) == 0
    out, err = capsys.readouterr()
    assert out == "0 rules ok\n"
    assert "dpl: warning: empty.dpl defines no rules" in err
    assert main(["check", "empty.dpl", "--json"]) == 0
    assert "dpl: warning: empty.dpl defines no rules" in capsys.readouterr().err
    assert main(["check", "empty.dpl", "llm"]) == 0  # rules from another file: nothing to warn of
    assert "warning" not in capsys.readouterr().err


def test_counts_of_one_are_singular(files, capsys):
    assert main(["report", "one.ir"]) == 0
    out = capsys.readouterr().out
    assert "coverage of 'main': 1 op\n" in out
    assert main(["run", "one.ir", "--target", "numpy", "--time", "--repeat", "1", "-v"]) == 0
    out, err = capsys.readouterr()
    assert "over 1 run\n" in out + "\n" and ": 1 kernel call," in err
    assert main(["report", "m.ir"]) == 0
    assert "coverage of 'main': 3 ops" in capsys.readouterr().out
