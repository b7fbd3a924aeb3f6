"""The package as users get it: the wheel's contents, and the wheel installed in a fresh venv.

The wheel is built from a copy of the source tree (so the build leaves nothing in the
checkout) with ``python -m build``, which fetches its build backend like any pip install.
The fresh venv has no system site-packages; its pip fetches dpl's own dependencies.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

import needs

try:
    import tomllib
except ImportError:  # Python 3.10: pytest brings tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = {"grammar": ["ir.lark", "dpl.lark", "types.lark"], "patterns": ["cnn.dpl", "cublas.dpl", "llm.dpl", "rewrites.dpl"]}
MAPPED = {"dpl.grammar": "grammar", "dpl.patterns": "patterns", "dpl.backends": "backends"}
DATA_SUFFIXES = (".lark", ".dpl")


def package_dirs() -> dict[str, Path]:
    """Every package of the source tree (a folder with ``__init__.py``) by its import name,
    including subpackages of the folders mapped into dpl (``backends/cuda`` is dpl.backends.cuda)."""
    roots = {"dpl": ROOT / "dpl", **{pkg: ROOT / folder for pkg, folder in MAPPED.items()}}
    found = {}
    for pkg, root in roots.items():
        for init in root.rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                found[".".join((pkg, *init.parent.relative_to(root).parts))] = init.parent
    return found


def run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def clean_env():
    """The environment without anything that would let the fresh venv see this checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    junk = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis", ".benchmarks", ".venv*")
    shutil.copytree(ROOT, src, ignore=junk)
    run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp / "dist"), str(src)], env=clean_env())
    wheels = list((tmp / "dist").glob("dpl-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.mark.slow
def test_wheel_ships_grammar_patterns_and_backends_inside_dpl(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for folder, files in SHIPPED.items():
        assert f"dpl/{folder}/__init__.py" in names, f"dpl/{folder}/ missing from the wheel"
        for f in files:
            assert f"dpl/{folder}/{f}" in names, f"dpl/{folder}/{f} missing from the wheel"
    assert "dpl/backends/__init__.py" in names
    for data in ("decoder_block.ir", "decoder_block.ir.npz"):  # the model `dpl demo` runs
        assert f"dpl/viz/data/{data}" in names, f"dpl/viz/data/{data} missing from the wheel"
    tops = {n.split("/")[0] for n in names} - {"dpl"}
    assert len(tops) == 1 and tops.pop().endswith(".dist-info"), f"top-level entries besides dpl/: {tops}"
    for stray in ("backends", "grammar", "patterns", "tests", "examples"):
        assert not any(n.startswith(stray + "/") for n in names), f"top-level {stray}/ in the wheel"


@pytest.mark.slow
def test_wheel_holds_every_module_and_data_file_of_the_source(wheel):
    """Not only the files named above: every .py, .lark and .dpl file of every package folder,
    so a new grammar, pattern library or subpackage cannot be left out of installs."""
    names = set(zipfile.ZipFile(wheel).namelist())
    for pkg, folder in package_dirs().items():
        inside = pkg.replace(".", "/")
        for f in sorted(folder.iterdir()):
            if f.suffix == ".py" or f.suffix in DATA_SUFFIXES:
                assert f"{inside}/{f.name}" in names, f"the wheel lacks {inside}/{f.name} (from {f.relative_to(ROOT)})"


SMOKE = textwrap.dedent(
    '''
    import importlib.util, sys
    from pathlib import Path

    import numpy as np

    import dpl

    here = Path(dpl.__file__).resolve()
    assert Path(sys.prefix).resolve() in here.parents, f"dpl imported from {here}, not the venv"
    for name in ("backends", "grammar", "patterns"):
        assert importlib.util.find_spec(name) is None, f"top-level '{name}' is importable"
    try:
        import backends  # noqa: F401
    except ImportError:
        pass
    else:
        raise AssertionError("import backends worked")
    import dpl.backends, dpl.grammar, dpl.patterns  # noqa: E401,F401

    mod = dpl.parse("""
    func main(x: f32[2, 3], b: f32[3]) -> f32[2, 3] {
      y = add(x, b)
      z = nn.relu(y)
      return z
    }
    """)
    pats = dpl.load_patterns("cublas")
    assert [p.name for p in pats.patterns][:1] == ["cublas.matmul_bias_act"], pats
    x = np.array([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]], dtype=np.float32)
    b = np.array([0.5, 0.5, -0.5], dtype=np.float32)
    out = dpl.interpret(mod, x, b)
    assert np.array_equal(out, np.maximum(x + b, 0)), out
    print("dpl", dpl.__version__, "ok")
    '''
)


@pytest.mark.slow
def test_wheel_works_in_a_fresh_venv(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False, symlinks=os.name != "nt").create(env_dir)
    py = env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    env = clean_env()
    run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)], env=env)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    (cwd / "smoke.py").write_text(SMOKE)
    proc = run([py, "smoke.py"], cwd=cwd, env=env)
    assert proc.stdout.strip().endswith("ok"), proc.stdout
    # the README's first command: the demo runs from the installed package's own data
    dpl_exe = env_dir / ("Scripts/dpl.exe" if os.name == "nt" else "bin/dpl")
    proc = run([dpl_exe, "demo", "--budget", "0.05"], cwd=cwd, env=env)
    assert "-> OK" in proc.stdout and (cwd / "demo.html").is_file(), proc.stdout
    # a compiled package saved by this checkout runs there on its own kernels with no C compiler
    # on PATH (dpl.save_package; tests/test_compiled_package.py tests the same in a plain process)
    package = saved_package(tmp_path / "model.dplpkg")
    bare = {**env, "PATH": str(py.parent), "CC": str(tmp_path / "no-such-cc"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = run([dpl_exe, "run", str(package), "--json"], cwd=cwd, env=bare)
    report = json.loads(proc.stdout)
    assert set(report["ran_on"].values()) == {"cpu"} and report["fallbacks"] == [], report


def saved_package(path: Path) -> Path:
    """A package of a small fused module built for the CPU here (it needs a C compiler)."""
    import numpy as np

    import dpl

    needs.c_compiler()
    mod = dpl.fuse_ops(dpl.parse("func main(x: f32[4, 8], w: f32[8, 8]) -> f32[4, 8] {\n  y = matmul(x, w)\n"
                                 "  z = nn.silu(y)\n  return z\n}"))
    exe = dpl.build(mod, "cpu", progress=None)
    exe(np.ones((4, 8), np.float32), np.ones((8, 8), np.float32))
    return dpl.save_package(exe, path)


def test_every_package_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    mapped = config.get("package-dir", {})
    found = set(package_dirs())
    assert found - listed == set(), f"packages missing from [tool.setuptools] packages: {sorted(found - listed)}"
    for name, folder in mapped.items():
        assert name in listed, f"mapped package {name} is not in [tool.setuptools] packages"
        assert (ROOT / folder / "__init__.py").is_file(), f"{name} maps to {folder}/, which has no __init__.py"
    for folder in ("grammar", "patterns", "backends"):
        assert mapped.get(f"dpl.{folder}") == folder, f"dpl.{folder} must map to the top-level {folder}/"
    for name in listed:  # by the longest mapped prefix (dpl.backends.cpu lives in backends/cpu)
        parts = name.split(".")
        cut = max((i for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in mapped), default=None)
        folder = Path(mapped[".".join(parts[:cut])], *parts[cut:]) if cut else Path(*parts)
        assert (ROOT / folder / "__init__.py").is_file(), f"listed package {name} has no {folder}/__init__.py"
    data = config.get("package-data", {})
    assert "*.lark" in data.get("dpl.grammar", []) and "*.dpl" in data.get("dpl.patterns", [])
