"""Every benchmark script answers ``--help`` with its usage and a bad argument with argparse's
one-line error, never a traceback (a help string with a bare ``%`` had made argparse raise)."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if 'if __name__ == "__main__"' in p.read_text())


def test_every_script_answers_help():
    assert len(SCRIPTS) >= 15
    runs = {p.name: subprocess.Popen([sys.executable, str(p), "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, cwd=BENCH) for p in SCRIPTS}
    for name, run in runs.items():
        out, err = run.communicate(timeout=600)
        assert run.returncode == 0 and "usage:" in out, f"{name}: rc {run.returncode}\n{err[-2000:]}"


@pytest.mark.parametrize("script, args", [("bench_cpu.py", ["many"]), ("bench_zoo_import.py", ["no_such_model"]),
                                          ("bench_runtime_choices.py", ["no_such_part"]), ("cuda_rows.py", ["8", "wide"])])
def test_a_bad_argument_is_named_without_a_traceback(script, args):
    run = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True, timeout=600, cwd=BENCH)
    assert run.returncode == 2 and "error:" in run.stderr and "Traceback" not in run.stderr, run.stderr[-2000:]
