"""Malformed IR texts and the full diagnostics they produce (golden text), through the API and
through the `dpl` command (exit code 1, the diagnostic on stderr, never a traceback).

Regenerate after an intended change with ``python tests/test_ir_diagnostics.py --regen`` and
read every changed ``.err`` file: the goldens are the spec of the messages.
"""

import pathlib
import subprocess
import sys

import pytest

import dpl
from dpl.errors import DplError

HERE = pathlib.Path(__file__).parent / "ir_errors"
CASES = sorted(HERE.glob("*.ir"))


def diagnostic(path: pathlib.Path) -> str:
    try:
        dpl.parse(path.read_text(), path.name)
    except DplError as err:
        return str(err) + "\n"
    return "no error\n"


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_diagnostic(path):
    golden = path.with_suffix(".err")
    assert golden.exists(), f"missing golden {golden.name}: run python tests/test_ir_diagnostics.py --regen"
    assert diagnostic(path) == golden.read_text()


def test_enough_cases():
    assert len(CASES) >= 25
    assert sum(p.with_suffix(".err").read_text().rstrip().endswith("errors") for p in CASES) >= 2


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "dpl", *args], capture_output=True, text=True, cwd=cwd)


@pytest.mark.parametrize("command", ["print", "run"])
def test_cli_on_malformed_texts(command):
    for path in CASES:
        r = run_cli(command, str(path))
        assert r.returncode == 1, (path.name, r.stderr)
        assert "Traceback" not in r.stderr + r.stdout
        assert r.stderr.strip().splitlines()[0].startswith(str(path)), r.stderr


if __name__ == "__main__" and "--regen" in sys.argv:
    for path in CASES:
        path.with_suffix(".err").write_text(diagnostic(path))
        print(path.with_suffix(".err").name)
