"""The cache removes only what it wrote (issue 33): a user's own folder given as ``cache_dir=``
keeps its ``tmp_results/`` and its own ``x.so``/``y.json`` through builds, ``dpl cache info`` and
``dpl cache clear``, while what dpl wrote there goes; a report creates and removes nothing; an
older dpl's store (no marker, nothing but dpl's names) is adopted and cleaned as before."""

import os
import time

import numpy as np
import pytest

import needs

import dpl
from dpl.backends.cpu.backend import CpuBackend
from dpl.cache_dir import MARKER, is_marked
from dpl.cli import main
from dpl.runtime import disk_cache
from dpl.runtime.disk_cache import BUILD_MARKER, LibraryCache

HOURS_AGO = time.time() - 7200
KEY = "ab" + "0" * 62


@pytest.fixture(autouse=True)
def c_compiler():
    needs.c_compiler()


def new_process() -> None:
    """Forget which cache folders this process swept, as a new process starts."""
    disk_cache._SWEPT.clear()


def build_exp(cache_dir) -> np.ndarray:
    mod = dpl.parse("func main(x: f32[64]) -> f32[64] {\n  y = exp(x)\n  return y\n}")
    backend = CpuBackend(cache_dir=cache_dir)
    kernel = backend.compile(mod["main"], module=mod)
    x, out = np.linspace(-2, 2, 64, dtype=np.float32), np.empty(64, np.float32)
    kernel([x], [out])
    np.testing.assert_allclose(out, np.exp(x), rtol=1e-6)
    return backend.cache.directory


@pytest.fixture
def users_folder(tmp_path):
    """A folder of the user's, with their results in ``tmp_results/`` (untouched for two hours)
    and a library with its notes, named as dpl's entries are but not dpl's."""
    folder = tmp_path / "mine"
    folder.mkdir()
    results = folder / "tmp_results"
    results.mkdir()
    (results / "run1.csv").write_text("1,2,3\n")
    (folder / "x.so").write_bytes(b"\x7fELF not dpl's")
    (folder / "y.json").write_text('{"mine": true}')
    (folder / "x.json").write_text('{"key": "x"}')
    for path in (results, folder / "x.so", folder / "y.json"):
        os.utime(path, (HOURS_AGO, HOURS_AGO))
    return folder


def the_users_files_are_there(folder):
    assert (folder / "tmp_results" / "run1.csv").read_text() == "1,2,3\n"
    assert (folder / "x.so").read_bytes() == b"\x7fELF not dpl's"
    assert (folder / "y.json").read_text() == '{"mine": true}' and (folder / "x.json").exists()
    assert not (folder / MARKER).exists()  # never taken for dpl's own


def test_a_users_folder_keeps_everything_dpl_did_not_write(users_folder, capsys):
    new_process()
    assert build_exp(users_folder) == users_folder  # used, not refused
    new_process()
    build_exp(users_folder)  # a later process opens (and sweeps) it again
    the_users_files_are_there(users_folder)
    entries = [p for p in users_folder.glob("*.json") if len(p.stem) == 64]
    assert len(entries) == 1

    new_process()
    assert main(["cache", "info", "--dir", str(users_folder)]) == 0
    assert f"kernels: {users_folder}: 1 entry" in capsys.readouterr().out
    the_users_files_are_there(users_folder)

    new_process()
    assert main(["cache", "clear", "--dir", str(users_folder)]) == 0
    assert "kernels: removed 1 entry" in capsys.readouterr().out
    the_users_files_are_there(users_folder)
    assert not entries[0].exists() and not entries[0].with_suffix(".so").exists()


def test_only_entries_whose_manifest_names_them_are_cleared_or_evicted(users_folder):
    store = LibraryCache(users_folder, max_bytes=0)  # every entry is over the cap
    # named as dpl's entries are, but the manifest is not one dpl wrote for that key
    (users_folder / f"{KEY}.so").write_bytes(b"someone's")
    (users_folder / f"{KEY}.json").write_text('{"key": "another"}')
    (users_folder / ("cd" + "0" * 62 + ".so")).write_bytes(b"no manifest")
    assert store.evict() == 0 and store.clear() == 0
    assert (users_folder / f"{KEY}.so").read_bytes() == b"someone's"
    assert (users_folder / ("cd" + "0" * 62 + ".so")).exists()  # in a store of dpl's own it would go
    the_users_files_are_there(users_folder)


def test_in_a_users_folder_only_marked_or_empty_build_folders_are_swept(users_folder):
    LibraryCache(users_folder).directory  # noqa: B018 - dpl makes its locks/ here
    dead = users_folder / (KEY + ".build-dead1234")
    dead.mkdir()
    (dead / BUILD_MARKER).write_bytes(b"")
    (dead / "lib.so").write_bytes(b"half")
    empty = users_folder / ("cd" + "0" * 62 + ".build-empty123")
    empty.mkdir()
    unmarked = users_folder / ("ef" + "0" * 62 + ".build-notmine1")
    unmarked.mkdir()
    (unmarked / "data.bin").write_bytes(b"mine")
    legacy = users_folder / "tmpab12cdef"  # looks like an older dpl's build, but the folder is not dpl's
    legacy.mkdir()
    (legacy / "kernel.c").write_text("int x;")
    os.utime(legacy, (HOURS_AGO, HOURS_AGO))
    new_process()
    LibraryCache(users_folder).directory  # noqa: B018
    assert not dead.exists() and not empty.exists()
    assert (unmarked / "data.bin").exists() and (legacy / "kernel.c").exists()
    the_users_files_are_there(users_folder)


def test_an_older_dpls_store_is_adopted_and_cleaned(tmp_path):
    """A store an older dpl made (no marker, nothing but dpl's names) still loads its entries, is
    marked as dpl's, and loses the build folders a dead build of that dpl left."""
    old = tmp_path / "kernels"
    new_process()
    build_exp(old)
    (old / MARKER).unlink()  # as an older dpl left it
    legacy = old / "tmpab12cdef"
    legacy.mkdir()
    (legacy / "kernel.c").write_text("int x;")
    (legacy / "kernel.so").write_bytes(b"half")
    os.utime(legacy, (HOURS_AGO, HOURS_AGO))
    orphan = old / ("cd" + "0" * 62 + ".so")  # a build died before its manifest
    orphan.write_bytes(b"half")
    new_process()
    build_exp(old)
    assert is_marked(old) and not legacy.exists()
    assert LibraryCache(old).clear() == 1
    assert not orphan.exists()
    assert sorted(p.name for p in old.iterdir()) == [MARKER, "locks"]


def test_a_folder_with_other_files_is_not_adopted(tmp_path):
    folder = tmp_path / "kernels"
    folder.mkdir()
    (folder / "README").write_text("my notes")
    new_process()
    LibraryCache(folder).directory  # noqa: B018
    assert not is_marked(folder)
    empty = tmp_path / "empty"
    empty.mkdir()
    LibraryCache(empty).directory  # noqa: B018
    assert is_marked(empty)  # nothing in it but what dpl puts there


def test_a_report_creates_and_removes_nothing(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    assert main(["cache", "info", "--dir", str(missing)]) == 0
    assert f"kernels: {missing}: 0 entries" in capsys.readouterr().out
    assert main(["cache", "clear", "--dir", str(missing)]) == 0
    assert not missing.exists()
    store = tmp_path / "store"
    new_process()
    LibraryCache(store).directory  # noqa: B018
    stale = store / (KEY + ".build-dead1234")
    stale.mkdir()
    (stale / BUILD_MARKER).write_bytes(b"")
    new_process()
    assert main(["cache", "info", "--dir", str(store)]) == 0
    assert "1 build in progress" in capsys.readouterr().out and stale.exists()


def test_the_products_and_parsers_stores_are_marked_when_dpl_creates_them(tmp_path):
    from dpl.cache_dir import private_dir

    made = private_dir(tmp_path / "dpl" / "products", "products")
    assert is_marked(made) and not is_marked(tmp_path / "dpl")
    existing = tmp_path / "theirs"
    existing.mkdir()
    assert private_dir(existing, "parsers") == existing and not is_marked(existing)
