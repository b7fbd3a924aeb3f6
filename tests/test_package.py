"""The package as users get it: the wheel's contents, and the wheel installed in a fresh venv.

``grammar/``, ``patterns/`` and ``backends/`` live at the top of the repository but ship inside
``dpl`` (pyproject's ``package-dir``), so a wheel that holds a top-level ``grammar`` package,
or lacks a ``.lark`` file, would break every install that is not editable. These tests build
the wheel from a copy of the source tree (nothing is written into the checkout), read its file
list, then install it with its dependencies into a venv without system site-packages and use
it from a directory outside the repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
MAPPED = {"dpl.grammar": "grammar", "dpl.patterns": "patterns", "dpl.backends": "backends"}
DATA_SUFFIXES = (".lark", ".dpl")


def pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built (with build isolation) from a copy of the source tree."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    junk = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis", "tmp", ".venv")
    shutil.copytree(ROOT, src, ignore=junk)
    run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp / "dist"), str(src)])
    (built,) = (tmp / "dist").glob("dpl-*.whl")
    return built


def package_dirs() -> dict[str, Path]:
    """Every package of the source tree (a folder with ``__init__.py``), by its import name."""
    roots = {"dpl": ROOT / "dpl", **{pkg: ROOT / folder for pkg, folder in MAPPED.items()}}
    found = {}
    for pkg, root in roots.items():
        for init in root.rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            rel = init.parent.relative_to(root).parts
            found[".".join((pkg, *rel))] = init.parent
    return found


def test_pyproject_maps_the_top_level_folders_into_dpl():
    setuptools = pyproject()["tool"]["setuptools"]
    for pkg, folder in MAPPED.items():
        assert setuptools["package-dir"][pkg] == folder
    data = setuptools["package-data"]
    assert "*.lark" in data["dpl.grammar"] and "*.dpl" in data["dpl.patterns"]


def test_every_package_is_listed_in_pyproject():
    listed = set(pyproject()["tool"]["setuptools"]["packages"])
    found = package_dirs()
    assert {"dpl", *MAPPED} <= set(found)
    missing = sorted(set(found) - listed)
    assert not missing, f"add these packages to [tool.setuptools] packages in pyproject.toml: {missing}"
    stale = sorted(listed - set(found))
    assert not stale, f"pyproject.toml lists packages that do not exist: {stale}"


@pytest.mark.slow
def test_wheel_holds_dpl_and_only_dpl(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith((".dist-info", ".data"))}
    assert top == {"dpl"}, f"the wheel has top-level entries besides dpl: {sorted(top - {'dpl'})}"
    for pkg, folder in package_dirs().items():
        inside = pkg.replace(".", "/")
        for f in sorted(folder.iterdir()):
            if f.suffix == ".py" or f.suffix in DATA_SUFFIXES:
                assert f"{inside}/{f.name}" in names, f"the wheel lacks {inside}/{f.name} (from {f.relative_to(ROOT)})"
    for pkg in MAPPED:
        assert f"{pkg.replace('.', '/')}/__init__.py" in names
    shipped = [n for n in names if n.endswith(DATA_SUFFIXES)]
    assert any(n.startswith("dpl/grammar/") for n in shipped) and any(n.startswith("dpl/patterns/") for n in shipped)


SMOKE = textwrap.dedent(
    """
    import importlib, importlib.resources, os, sys
    import numpy as np

    import dpl, dpl.grammar, dpl.patterns, dpl.backends
    from dpl.ir import FunctionBuilder, Module
    from dpl.lang import shipped_libraries

    venv = os.path.realpath(sys.argv[1])
    assert os.path.realpath(dpl.__file__).startswith(venv), f"dpl imported from {dpl.__file__}"
    for name in ("backends", "grammar", "patterns"):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            pass
        else:
            raise AssertionError(f"'import {name}' works: the wheel installed a top-level package")

    # a small function, interpreted
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", 3))
    w = fb.param("w", "f32", (3, 4))
    y = fb.emit("matmul", x, w, name="y")
    z = fb.emit("nn.relu", fb.emit("add", y, 0.5), name="z")
    mod = Module([fb.ret(z)])
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((2, 3)).astype("float32")
    wv = rng.standard_normal((3, 4)).astype("float32")
    got = dpl.interpret(mod, xv, wv)
    assert np.allclose(got, np.maximum(xv @ wv + 0.5, 0), atol=1e-5), got

    # the grammar and pattern files are package data, read through importlib.resources
    grammars = sorted(p.name for p in importlib.resources.files("dpl.grammar").iterdir() if p.name.endswith(".lark"))
    assert grammars, "no .lark file in dpl.grammar"
    assert dpl.structural_equal(dpl.parse(str(mod)), mod)
    for lib in shipped_libraries():
        dpl.load_patterns(lib)
    print("ok", len(grammars), "grammars,", len(shipped_libraries()), "pattern libraries")
    """
)


@pytest.mark.slow
def test_wheel_works_in_a_fresh_venv(wheel, tmp_path):
    venv = tmp_path / "venv"
    # no pip inside the venv (faster); the running pip installs into it through --python
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    cfg = (venv / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in cfg
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--disable-pip-version-check", str(wheel)])
    work = tmp_path / "elsewhere"
    work.mkdir()
    script = work / "smoke.py"
    script.write_text(SMOKE)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    proc = run([str(python), "-I", str(script), str(venv)], cwd=work, env=env)
    assert proc.stdout.startswith("ok"), proc.stdout
