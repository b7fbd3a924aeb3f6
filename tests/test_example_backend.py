"""The worked example backend (examples/dpl_mylib_backend), installed as its users install it:
``pip install`` of the example and of dpl into a fresh venv that borrows this interpreter's
packages (numpy, lark, attrs) and nothing of this checkout. Then the installed plugin claims
its composites under ``target="cpu"`` (by their codegen prefix) and under ``"mylib,cpu"``, its
numbers equal the interpreter's, and ``dpl check mylib`` finds its pattern library."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

import needs

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "dpl_mylib_backend"
JUNK = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis",
                              ".benchmarks", ".venv*")

SCRIPT = textwrap.dedent('''
    import json, sys
    import numpy as np
    import dpl
    from dpl.backends import backend_origin, get_backend

    mod = dpl.parse(open(sys.argv[1]).read())
    fused = dpl.apply(mod, ["mylib"])  # the library, found by name through its entry point
    report = {"composites": sorted(f.attrs["Composite"] for f in fused.functions.values() if "Composite" in f.attrs)}
    rng = np.random.default_rng(0)
    for target in ("cpu", "mylib,cpu", ["mylib", "cpu"]):
        exe = dpl.build(fused, target)
        errors = []
        for n in (3, 17):
            args = [rng.standard_normal([n if d == "n" else d for d in p.ty.shape]).astype(np.float32) for p in mod["main"].params]
            got, want = exe(*args), dpl.interpret(mod, *args)
            # float32 sums in another order: within a few ulps of the reference, elementwise
            errors.append(float(np.max(np.abs(got - want) / (1e-5 + 1e-4 * np.abs(want)))))
            assert np.any(got != 0) and got.shape == want.shape
        report[str(target)] = {"summary": exe.summary(), "error": max(errors),
                               "steps": sorted({s.backend for p in exe.plans.values() for s in p.steps})}
    mylib = get_backend("mylib")
    report["origin"] = backend_origin("mylib")
    report["compiled"] = sorted(set(mylib.compiled))
    report["c_compiles"] = mylib.cache.compiles
    print(json.dumps(report))
''')


def run(cmd, **kw):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def _imports(py, env, modules: str) -> bool:
    return subprocess.run([str(py), "-c", f"import {modules}"], capture_output=True, env=env).returncode == 0


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python, dpl script, environment) of a venv holding dpl and the example, installed."""
    needs.c_compiler()
    tmp = tmp_path_factory.mktemp("example_backend")
    env_dir = tmp / "venv"
    # no pip or setuptools of its own: the interpreter's (this pip, the base's setuptools) build
    venv.EnvBuilder(with_pip=False, system_site_packages=True, symlinks=os.name != "nt").create(env_dir)
    py, bin_dir = env_dir / "bin" / "python", env_dir / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env.update(PYTHONNOUSERSITE="1", XDG_CACHE_HOME=str(tmp / "cache"))
    if not _imports(py, env, "numpy, lark, attrs"):
        # this interpreter is a venv of its own: borrow its packages as plain paths (no .pth
        # file of theirs runs, so an editable dpl of this checkout stays invisible)
        purelib = run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], env=env).stdout.strip()
        Path(purelib, "_outer_site.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    if not _imports(py, env, "setuptools.command.bdist_wheel") and not _imports(py, env, "wheel"):
        needs.missing("no setuptools >= 70.1 (or wheel) to build the example without build isolation")
    for src in (ROOT, EXAMPLE):  # built from copies: the builds leave nothing in the checkout
        copy = tmp / f"src_{src.name}"
        shutil.copytree(src, copy, ignore=JUNK)
        run([sys.executable, "-m", "pip", "--python", py, "install", "--quiet", "--disable-pip-version-check",
             "--no-deps", "--no-build-isolation", copy], env=env)
    return py, bin_dir / "dpl", env, tmp


@pytest.mark.slow
def test_the_installed_example_claims_its_composites_and_matches_the_interpreter(installed):
    py, _, env, tmp = installed
    (tmp / "check.py").write_text(SCRIPT)
    out = json.loads(run([py, tmp / "check.py", EXAMPLE / "mlp.ir"], cwd=tmp, env=env).stdout.splitlines()[-1])
    assert out["composites"] == ["mylib.bias_act", "mylib.dense", "mylib.dense_relu"]
    assert out["origin"] == "plugin mylib (dpl_mylib.backend:MyLibBackend)"
    assert out["compiled"] == ["mylib.bias_act", "mylib.dense", "mylib.dense_relu"]
    assert out["c_compiles"] == 3  # one C library per composite, shared by every n
    for target in ("cpu", "mylib,cpu", "['mylib', 'cpu']"):
        report = out[target]
        assert report["error"] <= 1, (target, report["error"])  # |got - want| <= 1e-5 + 1e-4 |want|
        assert report["steps"] == ["mylib"], report["summary"]
    assert "mylib    available (owns codegen prefix 'mylib', outside the target)" in out["cpu"]["summary"]
    assert "codegen 'mylib' (fused_matmul_add_nn_relu_mylib) -> mylib (owns codegen prefix 'mylib')" in out["cpu"]["summary"]
    assert "target mylib,cpu: mylib -> cpu -> numpy" in out["mylib,cpu"]["summary"]


@pytest.mark.slow
def test_dpl_check_and_fuse_find_the_installed_library(installed):
    _, dpl_script, env, tmp = installed
    check = run([dpl_script, "check", "mylib"], cwd=tmp, env=env).stdout
    for name in ("mylib.dense_relu", "mylib.dense", "mylib.bias_act"):
        assert name in check
    assert "3 rules ok" in check
    fused = run([dpl_script, "fuse", EXAMPLE / "mlp.ir", "-p", "mylib"], cwd=tmp, env=env).stdout
    assert '@composite("mylib.dense_relu")' in fused and '@codegen("mylib")' in fused


# -- the example's backend in this process (fast: no install) --------------------------------------

@pytest.fixture
def mylib_in_process(tmp_path):
    needs.c_compiler()
    sys.path.insert(0, str(EXAMPLE))
    try:
        from dpl_mylib import MyLibBackend
        import dpl

        backend = dpl.register_codegen("mylib", MyLibBackend(cache_dir=tmp_path))
        yield backend
    finally:
        from dpl.backends import unregister_backend

        unregister_backend("mylib")
        sys.path.remove(str(EXAMPLE))
        for name in [m for m in sys.modules if m == "dpl_mylib" or m.startswith("dpl_mylib.")]:
            del sys.modules[name]


def test_the_example_compiles_its_composites_for_every_n(mylib_in_process):
    import numpy as np

    import dpl
    from runtime_corpus import inputs_for

    mod = dpl.parse((EXAMPLE / "mlp.ir").read_text())
    exe = dpl.build(dpl.apply(mod, EXAMPLE / "dpl_mylib" / "mylib.dpl"), "cpu")
    for n in (1, 9, 33):
        args = inputs_for(mod, {"n": n}, seed=n)
        np.testing.assert_allclose(exe(*args), dpl.interpret(mod, *args), rtol=1e-4, atol=1e-5)
    assert {s.backend for p in exe.plans.values() for s in p.steps} == {"mylib"}
    assert mylib_in_process.cache.compiles == 3  # one C library per composite serves every n
    assert "void dpl_kernel(void **buffers, const int64_t *dims)" in exe.plans[next(iter(exe.plans))].steps[0].kernel.source


def test_a_composite_the_example_cannot_compile_falls_back_with_its_reason(mylib_in_process):
    import numpy as np

    import dpl
    from runtime_corpus import inputs_for

    mod = dpl.parse(textwrap.dedent("""\
        func main(x: f32[n, 8], b: f32[8]) -> f32[n, 8] {
          y = add(x, b)
          z = nn.silu(y)
          return z
        }
        """))
    pats = dpl.parse_patterns("codegen mylib\npattern bias_silu {\n  y = add(x, b)\n  out = nn.silu(y)\n}\n")
    exe = dpl.build(dpl.apply(mod, pats), "cpu")
    args = inputs_for(mod, {"n": 4})
    np.testing.assert_allclose(exe(*args), dpl.interpret(mod, *args), rtol=1e-6)
    text = exe.summary()
    assert "by fall-back (mylib failed to compile: mylib: no C for op 'nn.silu' in 'fused_add_nn_silu'" in text
