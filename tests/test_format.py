"""``dpl fmt``: the canonical layout of .dpl files, comments kept, idempotent, ``--check``."""

import glob
import os
import re
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpl.cli import main
from dpl.errors import DplError
from dpl.lang.format import _flatten, _parse, format_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = sorted(glob.glob(os.path.join(ROOT, "dpl", "patterns", "*.dpl")) + glob.glob(os.path.join(ROOT, "patterns", "*.dpl")))


def _parses(path):
    try:
        format_text(open(path, encoding="utf-8").read(), path)
        return True
    except DplError:
        return False


TEST_FILES = sorted(p for p in glob.glob(os.path.join(ROOT, "tests", "**", "*.dpl"), recursive=True) if _parses(p))

MESSY = """\
# header comment

codegen   cublas # trailing on codegen
equiv power(x,2.0)==multiply(x,x)
def act(y)=nn.relu(y)|nn.gelu(y)
## doc for mb
pattern matmul_bias{ mm=matmul(x,w) # after mm
  # before out
  out=add(mm,b);
  x: f16[_,4096]
  c : const


  where rank(b)==1 and dtype(x) in [f16,f32] and shape(x)[0] > -1
  annotate lhs=x,rhs=w
  # before close
}
rewrite silu { s = sigmoid(x); out = multiply(x, s) => nn.silu(x, axis=[-1], epsilon=value(eps)) } # one-liner
rewrite r2 {
  h = astype?(h0, dtype=f32)
  t = (h, h)[0]
  u = ~exp(_) & where(c, a, 1.0:f16)
  =>
    add(h,  # inside
        1.0) # after
}
# end
"""

TIDY = """\
# header comment

codegen cublas  # trailing on codegen
equiv power(x, 2.0) == multiply(x, x)
def act(y) = nn.relu(y) | nn.gelu(y)

## doc for mb
pattern matmul_bias {
  mm  = matmul(x, w)  # after mm
  # before out
  out = add(mm, b)
  x: f16[_, 4096]
  c: const

  where rank(b) == 1 and dtype(x) in [f16, f32] and shape(x)[0] > -1
  annotate lhs = x, rhs = w
  # before close
}

rewrite silu {
  s   = sigmoid(x)
  out = multiply(x, s)
  => nn.silu(x, axis=[-1], epsilon=value(eps))
}  # one-liner

rewrite r2 {
  h = astype?(h0, dtype=f32)
  t = (h, h)[0]
  u = ~exp(_) & where(c, a, 1.0:f16)
  # inside
  => add(h, 1.0)  # after
}
# end
"""


def test_golden_layout():
    assert format_text(MESSY) == TIDY
    assert format_text(TIDY) == TIDY


def test_every_comment_is_kept_once():
    def comments(text):
        return sorted(c.rstrip() for c in re.findall(r"#[^\n]*", text))

    assert comments(format_text(MESSY)) == comments(MESSY) and len(comments(MESSY)) == 10


def test_docs_stay_with_their_declaration():
    from dpl.lang.parser import parse_file

    text = "codegen k ## the doc of p (the parser reads it so)\npattern p { out = exp(x)\n## doc of q\n} rewrite q {\n  ## not a doc\n  out = multiply(x, sigmoid(x)) => nn.silu(x) }\n"
    out = format_text(text)
    assert [d.doc for d in parse_file(out).decls[1:]] == [d.doc for d in parse_file(text).decls[1:]] == [
        "the doc of p (the parser reads it so)", "doc of q"]
    assert format_text(out) == out and "  ## not a doc\n  out = multiply" in out


@pytest.mark.parametrize("path", SHIPPED, ids=os.path.basename)
def test_shipped_libraries_are_formatted(path):
    text = open(path, encoding="utf-8").read()
    assert format_text(text, path) == text, f"run: dpl fmt -i {path}"


@pytest.mark.parametrize("path", SHIPPED + TEST_FILES, ids=lambda p: os.path.relpath(p, ROOT))
def test_idempotent_on_every_file(path):
    once = format_text(open(path, encoding="utf-8").read(), path)
    assert format_text(once, path) == once


def _tokens(path):
    tree, _ = _parse(open(path, encoding="utf-8").read())
    return [str(t) for t, _ in _flatten(tree, "start", [])]


# the whitespace properties draw one separator per token: files hypothesis can draw for (the
# limit tests' 13,000-token macro chain is covered by the idempotence test above)
CORPUS = [t for t in (_tokens(p) for p in SHIPPED + TEST_FILES) if len(t) <= 5000]


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_layout_does_not_depend_on_the_whitespace_written(data):
    """Any spacing and line breaking of a file's tokens formats to the same text; comments
    added at line ends all survive, the result is a fixed point, and without them it is the
    layout of the bare tokens."""
    tokens = data.draw(st.sampled_from(CORPUS))
    seps = data.draw(st.lists(st.sampled_from([" ", "  ", "\t", "\n", " \n  "]), min_size=len(tokens), max_size=len(tokens)))
    commented = data.draw(st.lists(st.booleans(), min_size=len(tokens), max_size=len(tokens)))
    plain = format_text(" ".join(tokens))
    text, wanted = [], []
    for i, (tok, sep, c) in enumerate(zip(tokens, seps, commented)):
        text.append(tok)
        if c and "\n" in sep:
            wanted.append(f"# c{i}")
            sep = f"  # c{i}" + sep
        text.append(sep)
    out = format_text("".join(text))
    assert format_text(out) == out
    for w in wanted:
        assert out.count(w + "\n") == 1
    kept = [re.sub(r"  # c\d+$", "", ln) for ln in out.split("\n") if not re.fullmatch(r"\s*# c\d+", ln)]
    assert "\n".join(kept) == plain


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_never_refuses_comments_anywhere(data):
    """Comments of both kinds and blank lines anywhere between tokens: the formatter keeps
    tokens, comments and docs (format_text verifies it and would raise FormatError) and is
    idempotent."""
    tokens = data.draw(st.sampled_from(CORPUS))
    gaps = data.draw(st.lists(st.sampled_from([" ", "\n", "\n\n", "  # c\n", "\n## d\n", " ## t\n", "\n  # e\n"]),
                              min_size=len(tokens), max_size=len(tokens)))
    out = format_text("".join(t + g for t, g in zip(tokens, gaps)))
    assert format_text(out) == out


# -- the command -----------------------------------------------------------------------------------


def test_check_lists_what_would_change_and_exits_1(tmp_path, capsys):
    messy, tidy = tmp_path / "messy.dpl", tmp_path / "tidy.dpl"
    messy.write_text(MESSY)
    tidy.write_text(TIDY)
    assert main(["fmt", "--check", str(messy), str(tidy)]) == 1
    assert capsys.readouterr().out.split() == [str(messy)]
    assert messy.read_text() == MESSY  # --check changes nothing
    assert main(["fmt", "--check", str(tidy)]) == 0


def test_write_rewrites_in_place_and_prints_to_stdout_otherwise(tmp_path, capsys):
    f = tmp_path / "a.dpl"
    f.write_text(MESSY)
    assert main(["fmt", str(f)]) == 0
    assert capsys.readouterr().out == TIDY and f.read_text() == MESSY
    assert main(["fmt", "-i", str(f)]) == 0
    assert f.read_text() == TIDY and capsys.readouterr().out == ""
    assert main(["fmt", "--write", str(f)]) == 0 and f.read_text() == TIDY


def test_stdin(monkeypatch, capsys):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(MESSY))
    assert main(["fmt", "-"]) == 0
    assert capsys.readouterr().out == TIDY


def test_syntax_error_is_located_and_other_files_still_formatted(tmp_path, capsys):
    bad, good = tmp_path / "bad.dpl", tmp_path / "good.dpl"
    bad.write_text("pattern p {\n  out = exp(x) $\n}\n")
    good.write_text(MESSY)
    assert main(["fmt", "-i", str(bad), str(good)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:2:16: error: unexpected character '$'" in err and "Traceback" not in err
    assert good.read_text() == TIDY and bad.read_text() == "pattern p {\n  out = exp(x) $\n}\n"


def test_check_and_write_exclude_each_other():
    r = subprocess.run([sys.executable, "-m", "dpl", "fmt", "--check", "-i", "x.dpl"], capture_output=True, text=True)
    assert r.returncode == 2 and "not allowed with" in r.stderr


def test_write_goes_through_a_symlink_and_keeps_it(tmp_path):
    real = tmp_path / "patterns" / "real.dpl"
    real.parent.mkdir()
    real.write_text(MESSY)
    os.chmod(real, 0o640)
    link = tmp_path / "link.dpl"
    link.symlink_to(real)
    assert main(["fmt", "-i", str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text() == TIDY and os.stat(real).st_mode & 0o777 == 0o640
    assert sorted(p.name for p in real.parent.iterdir()) == ["real.dpl"]  # no temporary left
