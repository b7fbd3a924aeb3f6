"""A compiled package (``dpl.save_package`` / ``dpl.load_package``, ``dpl run x.dplpkg``): it runs
in a fresh process with no C compiler, on its own kernels, computing what the executable that
saved it computed; anything wrong with it (a changed, truncated, missing or unlisted member, an
unknown format version, another architecture or CPU, a target not available here) is refused
with a PackageError naming the problem, before anything in it is used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest

import needs

import dpl
from dpl.backends.cpu.backend import CpuBackend
from dpl.cli import main
from dpl.package import PackageError

ROOT = Path(__file__).resolve().parent.parent

# a product with its bias and activation (segments: the products provider and a C part), then a
# fused elementwise tail (one C kernel); the weight (2,048 values) travels in the .npz
MODULE = """\
const w: f32[64, 32]
func main(x: f32[8, 64], b: f32[32]) -> f32[8, 32] {
  y = matmul(x, w)
  z = add(y, b)
  r = nn.gelu(z)
  s = multiply(r, r)
  t = subtract(s, r)
  return t
}
"""
WEIGHT = np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)


@pytest.fixture(autouse=True)
def c_compiler():
    needs.c_compiler()


def inputs():
    rng = np.random.default_rng(0)
    return rng.standard_normal((8, 64)).astype(np.float32), rng.standard_normal(32).astype(np.float32)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The executable (built in a kernel cache of its own), its output, and its package."""
    tmp = tmp_path_factory.mktemp("saved")
    mod = dpl.fuse_ops(dpl.parse(MODULE, "m.ir", {"w": WEIGHT}))
    exe = dpl.build(mod, [CpuBackend(cache_dir=tmp / "kernels"), "numpy"], progress=None)
    want = exe(*inputs())
    path = dpl.save_package(exe, tmp / "m.dplpkg")
    return exe, want, path


def members(path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def rewrite(src, dst, change) -> Path:
    """A copy of package ``src`` at ``dst`` with ``change(members)`` applied (manifest untouched
    unless ``change`` edits it)."""
    found = members(src)
    change(found)
    with zipfile.ZipFile(dst, "w") as zf:
        for name, data in found.items():
            zf.writestr(name, data)
    return Path(dst)


def edit_manifest(edit):
    def change(found):
        manifest = json.loads(found["manifest.json"])
        edit(manifest)
        found["manifest.json"] = json.dumps(manifest).encode()
    return change


def test_the_package_holds_the_module_weights_and_kernels(saved):
    exe, _, path = saved
    found = members(path)
    manifest = json.loads(found["manifest.json"])
    kernels = [n for n in found if n.startswith("kernels/")]
    assert manifest["format"] == "dpl-package" and manifest["version"] == 1
    assert {"module.dpl", "module.dpl.npz"} <= set(found) and kernels
    assert set(manifest["members"]) == set(found) - {"manifest.json"}
    assert manifest["cpu"]["isa"]["machine"] and manifest["cpu"]["toolchain"]["flags"]
    assert manifest["signatures"] == [[[[8, 64], "float32"], [[32], "float32"]]]
    assert b"allow_pickle" not in found["module.dpl.npz"] and found["module.dpl.npz"][:2] == b"PK"  # an npz, no pickle


def test_a_loaded_package_runs_its_own_kernels(saved, tmp_path):
    exe, want, path = saved
    loaded = dpl.load_package(path, cache_dir=tmp_path / "packaged")
    np.testing.assert_array_equal(loaded(*inputs()), want)
    assert loaded.ran_on() == exe.ran_on() and set(loaded.ran_on().values()) == {"cpu"}
    assert loaded.fallbacks == []
    packaged = {n[len("kernels/"):-3] for n in members(path) if n.startswith("kernels/")}
    assert loaded.target[0].cache.served == packaged  # every library the plan loaded is one of the package's, and all are used


NO_COMPILER = textwrap.dedent('''
    import json, shutil, sys
    import numpy as np
    assert shutil.which("cc") is None and shutil.which("gcc") is None, "a compiler is on PATH"
    import dpl
    from dpl.backends.cpu.backend import CpuBackend
    assert not CpuBackend().available()[0]  # a plain build here would fall back to NumPy
    exe = dpl.load_package(sys.argv[1])
    x, b = np.load(sys.argv[2]), np.load(sys.argv[3])
    np.save(sys.argv[4], exe(x, b))
    print(json.dumps({"ran_on": exe.ran_on(), "fallbacks": [str(f) for f in exe.fallbacks]}))
''')


def test_a_package_runs_in_a_fresh_process_without_a_c_compiler(saved, tmp_path):
    exe, want, path = saved
    x, b = inputs()
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "b.npy", b)
    (tmp_path / "child.py").write_text(NO_COMPILER)
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "CXX")}
    # no compiler anywhere: PATH holds an empty folder, CC names none, and dpl's cache is new
    env.update(PATH=str(empty), CC=str(tmp_path / "no-such-cc"), XDG_CACHE_HOME=str(tmp_path / "cache"),
               PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "child.py", str(path), "x.npy", "b.npy", "out.npy"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"ran_on": exe.ran_on(), "fallbacks": []}
    assert set(report["ran_on"].values()) == {"cpu"}  # the C kernels ran, not the NumPy fall-back
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), want)


def test_a_changed_kernel_is_refused(saved, tmp_path):
    def flip(found):
        name = next(n for n in found if n.startswith("kernels/"))
        data = bytearray(found[name])
        data[len(data) // 2] ^= 0xFF
        found[name] = bytes(data)
    bad = rewrite(saved[2], tmp_path / "bad.dplpkg", flip)
    with pytest.raises(PackageError, match=r"member kernels/[0-9a-f]{64}\.so does not match its SHA-256"):
        dpl.load_package(bad, cache_dir=tmp_path / "packaged")
    assert not (tmp_path / "packaged").exists()  # refused before anything was written or loaded


def test_changed_weights_are_refused(saved, tmp_path):
    def scale(found):
        found["module.dpl.npz"] = found["module.dpl.npz"][:-30] + bytes(30)
    with pytest.raises(PackageError, match="member module.dpl.npz"):
        dpl.load_package(rewrite(saved[2], tmp_path / "bad.dplpkg", scale))


def test_a_truncated_package_is_refused(saved, tmp_path):
    data = saved[2].read_bytes()
    (tmp_path / "cut.dplpkg").write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(PackageError, match="truncated"):
        dpl.load_package(tmp_path / "cut.dplpkg")


def test_a_missing_member_is_refused(saved, tmp_path):
    bad = rewrite(saved[2], tmp_path / "bad.dplpkg", lambda found: found.pop("module.dpl.npz"))
    with pytest.raises(PackageError, match="misses its member module.dpl.npz"):
        dpl.load_package(bad)


def test_an_unlisted_member_is_refused(saved, tmp_path):
    bad = rewrite(saved[2], tmp_path / "bad.dplpkg", lambda found: found.update({"kernels/extra.so": b"\x7fELF"}))
    with pytest.raises(PackageError, match="kernels/extra.so, which its manifest does not list"):
        dpl.load_package(bad)


def test_an_unknown_format_version_is_refused(saved, tmp_path):
    bad = rewrite(saved[2], tmp_path / "bad.dplpkg", edit_manifest(lambda m: m.update(version=99)))
    with pytest.raises(PackageError, match="format version 99.*this dpl reads version 1"):
        dpl.load_package(bad)


@pytest.mark.parametrize("edit, match", [
    (lambda m: m.pop("threads"), "no valid threads"),
    (lambda m: m.pop("adapt_threads"), "no valid threads"),
    (lambda m: m.update(signatures=[[["x"]]]), "no valid signatures"),
    (lambda m: m.update(signatures=[5]), "no valid signatures"),
    (lambda m: m["signatures"][0][0].__setitem__(1, "floatx"), "no valid signatures"),
    (lambda m: m["cpu"]["isa"].update(features=5), "no valid cpu"),
    (lambda m: m["cpu"].update(stream_bytes="x"), "no valid cpu"),
    (lambda m: m["cpu"].update(attention="bogus"), "its CPU record does not fit this dpl"),
])
def test_a_manifest_of_wrong_fields_is_refused_with_a_package_error(saved, tmp_path, edit, match):
    bad = rewrite(saved[2], tmp_path / "bad.dplpkg", edit_manifest(edit))
    with pytest.raises(PackageError, match=match):
        dpl.load_package(bad, cache_dir=tmp_path / "packaged")


def test_another_architecture_is_refused(saved, tmp_path):
    other = "aarch64" if os.uname().machine != "aarch64" else "x86_64"
    bad = rewrite(saved[2], tmp_path / "bad.dplpkg", edit_manifest(lambda m: m["cpu"]["isa"].update(machine=other)))
    with pytest.raises(PackageError, match=f"its kernels are {other} code"):
        dpl.load_package(bad)


def test_a_cpu_without_the_kernels_features_is_refused(saved, tmp_path):
    manifest = json.loads(members(saved[2])["manifest.json"])
    if "-march=native" not in manifest["cpu"]["toolchain"]["flags"]:
        pytest.skip("this compiler does not take -march=native: the kernels need no CPU features")
    bad = rewrite(saved[2], tmp_path / "bad.dplpkg",
                  edit_manifest(lambda m: m["cpu"]["isa"]["features"].append("avx1024")))
    with pytest.raises(PackageError, match="on a CPU with avx1024, which this CPU lacks"):
        dpl.load_package(bad)


def test_a_target_not_available_here_is_refused_and_another_can_be_asked(saved, tmp_path):
    from dpl.backends.registry import get_backend

    if get_backend("cupy").available()[0]:
        pytest.skip("CuPy has a device here")
    cuda = edit_manifest(lambda m: m.update(target=["cupy", "cpu", "numpy"], target_name="cuda"))
    bad = rewrite(saved[2], tmp_path / "cuda.dplpkg", cuda)
    with pytest.raises(PackageError, match="is for target cuda, whose backend cupy is unavailable here") as err:
        dpl.load_package(bad)
    assert "target='cpu'" in err.value.hint
    on_cpu = dpl.load_package(bad, target="cpu", cache_dir=tmp_path / "packaged")
    np.testing.assert_array_equal(on_cpu(*inputs()), saved[1])
    assert on_cpu.fallbacks == []


@pytest.mark.parametrize("content, match", [
    (b"func main() {}", "is not a dpl package, or it is truncated"),
    (None, "has no manifest.json"),
])
def test_a_file_that_is_no_package_is_refused(tmp_path, content, match):
    path = tmp_path / "x.dplpkg"
    if content is None:
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("hello.txt", "hi")
    else:
        path.write_bytes(content)
    with pytest.raises(PackageError, match=match):
        dpl.load_package(path)
    with pytest.raises(PackageError, match="does not exist"):
        dpl.load_package(tmp_path / "nothing.dplpkg")


def test_a_kernel_missing_from_the_package_falls_back_visibly(saved, tmp_path):
    """A package lists its kernels; one taken out (manifest and all) is a compile error at load,
    and the unit runs on the target's next backend, said as a fall-back, never compiled."""
    def drop(found):
        manifest = json.loads(found["manifest.json"])
        name = min((n for n in found if n.startswith("kernels/")), key=lambda n: len(found[n]))  # not the packed routine
        found.pop(name)
        manifest["members"].pop(name)
        found["manifest.json"] = json.dumps(manifest).encode()
    loaded = dpl.load_package(rewrite(saved[2], tmp_path / "less.dplpkg", drop), cache_dir=tmp_path / "packaged")
    assert loaded.fallbacks and "holds no kernel" in loaded.fallbacks[0].reason
    np.testing.assert_allclose(loaded(*inputs()), saved[1], rtol=1e-5, atol=1e-5)
    with pytest.raises(PackageError, match="holds no kernel"):
        dpl.load_package(tmp_path / "less.dplpkg", cache_dir=tmp_path / "packaged", strict=True)


def test_dpl_run_saves_and_runs_a_package(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.ir").write_text(MODULE.replace("const w: f32[64, 32]\n", "").replace("b: f32[32]", "b: f32[32], w: f32[64, 32]"))
    assert main(["run", "m.ir", "--target", "cpu", "--save-package", "m.dplpkg", "--check"]) == 0
    assert "package: saved m.dplpkg" in capsys.readouterr().out
    assert main(["run", "m.dplpkg", "--check", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["check"]["ok"] and set(report["ran_on"].values()) == {"cpu"} and report["fallbacks"] == []
    assert main(["run", "m.ir", "--save-package", "x.dplpkg"]) == 1
    assert "--save-package needs --target" in capsys.readouterr().err
    (tmp_path / "bad.dplpkg").write_text("not a package")
    assert main(["run", "bad.dplpkg"]) == 1
    assert "is not a dpl package" in capsys.readouterr().err


def test_save_package_takes_an_executable(tmp_path):
    with pytest.raises(PackageError, match="takes an Executable"):
        dpl.save_package(dpl.parse(MODULE, "m.ir", {"w": WEIGHT}), tmp_path / "m.dplpkg")


def test_a_loaded_package_saves_again_as_it_was(saved, tmp_path):
    loaded = dpl.load_package(saved[2], cache_dir=tmp_path / "packaged")
    again = dpl.save_package(loaded, tmp_path / "again.dplpkg")
    first, second = members(saved[2]), members(again)
    assert {n for n in first if n.startswith("kernels/")} == {n for n in second if n.startswith("kernels/")}
    assert json.loads(first["manifest.json"])["cpu"] == json.loads(second["manifest.json"])["cpu"]
    np.testing.assert_array_equal(dpl.load_package(again, cache_dir=tmp_path / "packaged")(*inputs()), saved[1])
