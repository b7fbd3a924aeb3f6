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


# -- the build's progress line, and the log lines around it (issue 34, item 6) -------------------


def fractions(text: str) -> list[tuple[int, int]]:
    import re

    return [(int(a), int(b)) for a, b in re.findall(r"\] (\d+)/(\d+) ", text)]


def test_a_growing_total_is_not_shown_until_it_is_known():
    """Builds are submitted while the plan is walked: the line counts what is done, and shows
    a fraction only once no more work can come, so it never goes from 3/3 to 3/4."""
    import io

    from dpl.runtime.progress import Progress

    stream = io.StringIO()
    bar = Progress(None, stream, title="dpl: compiling kernels ")
    bar.grow(3)
    for name in "abc":
        bar.step(name)
    bar.grow(2)  # the walk met two more kernels
    bar.step("d")
    assert fractions(stream.getvalue()) == [] and "4 done d" in stream.getvalue()
    bar.settle()  # the walk is over
    bar.step("e")
    bar.finish()
    assert fractions(stream.getvalue()) == [(4, 5), (5, 5)]
    assert stream.getvalue().endswith("\n") and stream.getvalue().count("\n") == 1


def test_a_log_line_goes_above_the_progress_line():
    import io
    import logging

    from dpl.cli.command import _Formatter, _Handler
    from dpl.runtime.progress import Progress

    stream = io.StringIO()
    bar = Progress(4, stream, title="dpl: compiling kernels ")
    bar.step("k1")
    handler = _Handler(stream)
    handler.setFormatter(_Formatter())
    handler.emit(logging.LogRecord("dpl.x", logging.INFO, __file__, 1, "measuring the products' libraries", (), None))
    bar.step("k2")
    lines = stream.getvalue().split("\n")
    # the bar's line was wiped before the log line, which stands alone on its line; the bar comes back below it
    assert lines[0].endswith("\rdpl: measuring the products' libraries") and lines[0].split("\r")[-2].strip() == ""
    assert "] 1/4 k1" in lines[1] and "] 2/4 k2" in lines[1]
    bar.finish()


def test_no_library_log_message_says_dpl_itself():
    """The CLI's formatter adds "dpl: "; a message that said it too printed "dpl: dpl: measuring"."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    said = []
    for path in [*root.glob("dpl/**/*.py"), *root.glob("backends/**/*.py")]:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"\blog(ger)?\.(debug|info|warning|error|exception|critical)\(f?[\"']dpl:", line):
                said.append(f"{path.relative_to(root)}:{n}")
    assert said == []


def test_a_warning_that_says_dpl_is_not_doubled(files, capsys):
    from dpl.cli import command

    handler = command._configure_logging(0, 0)
    try:
        command._log_warning(RuntimeWarning("dpl: no C compiler; the CPU target runs on the NumPy backend"),
                             RuntimeWarning, __file__, 1)
    finally:
        command.log.removeHandler(handler)
    assert capsys.readouterr().err == "dpl: warning: no C compiler; the CPU target runs on the NumPy backend\n"


@pytest.mark.parametrize("level, label", [(10, "dpl:   "), (20, "dpl: "), (30, "dpl: warning: "), (40, "dpl: error: ")])
def test_log_levels_are_labelled_for_people(level, label):
    """-v's detail is indented under what it details, not labelled 'debug:'."""
    import logging

    from dpl.cli.command import _Formatter

    record = logging.LogRecord("dpl", level, __file__, 1, "said", (), None)
    assert _Formatter().format(record) == label + "said"


def test_verbose_lines_carry_no_debug_label(files, capsys):
    assert main(["run", "one.ir", "--target", "numpy", "-v"]) == 0
    err = capsys.readouterr().err
    assert "debug:" not in err and "\ndpl:   " in "\n" + err


# -- a file written is said on stderr, through the logger, and -q silences it -------------------


@pytest.mark.parametrize("argv, written", [
    (["viz", "m.ir", "--target", "numpy", "-o", "m.html"], "m.html"),
    (["print", "m.ir", "-o", "p.ir"], "p.ir"),
    (["fuse", "m.ir", "-o", "f.ir"], "f.ir"),
])
def test_a_written_file_is_reported_on_stderr_and_q_silences_it(files, capsys, argv, written):
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"dpl: wrote {written}")
    assert main(argv + ["-q"]) == 0
    assert capsys.readouterr() == ("", "")
    assert (files / written).exists()


# -- counts of one -------------------------------------------------------------------------------


def test_a_repeat_of_one_box_says_box():
    from dpl.viz.graph import Edge, Node, View, collapse_repeats

    nodes = [Node(f"n{i}", "nn.relu", f"r{i}", "alone") for i in range(12)]
    view = View("after", tuple(nodes), tuple(Edge(f"n{i}", f"n{i + 1}", "f32[4]") for i in range(11)))
    short = collapse_repeats(view)
    [placeholder] = [n for n in short.nodes if n.claim == "repeat"]
    assert placeholder.lines[0].startswith("1 box each (")
    assert "12 layers of 1 box each are alike" in placeholder.detail["repeated layers"]


def test_check_warns_of_a_codegen_prefix_no_backend_owns(tmp_path, capsys):
    (tmp_path / "nobody.dpl").write_text("codegen nobody\npattern g { out = nn.gelu(x) }\n")
    assert main(["check", str(tmp_path / "nobody.dpl")]) == 0
    err = capsys.readouterr().err
    assert "warning: codegen 'nobody' (nobody.g): no registered backend owns this prefix" in err
    assert main(["check", "llm", "cublas"]) == 0
    assert "no registered backend owns" not in capsys.readouterr().err  # kernel and cublas are the shipped backends'
