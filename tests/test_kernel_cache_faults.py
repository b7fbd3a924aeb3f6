"""The kernel cache trusts nothing it finds: a truncated, swapped, symlinked or planted library
is rebuilt (never loaded, its constructor never runs), whatever the umask the files are 0600
and the folders 0700, a folder others can write is refused, builds a SIGKILL left are swept,
concurrent builders compile once, and the store keeps under its size cap."""

import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import platformdirs
import pytest
from filelock import FileLock

import needs

import dpl
from dpl.backends.cpu.backend import CpuBackend, default_cache_dir
from dpl.cache_dir import why_unsafe
from dpl.runtime import disk_cache
from dpl.runtime.disk_cache import LOCKS, LibraryCache

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def c_compiler():
    needs.c_compiler()


def unary(op: str):
    mod = dpl.parse(f"func main(x: f32[64]) -> f32[64] {{\n  y = {op}(x)\n  return y\n}}")
    return mod["main"], mod


X = np.linspace(-2, 2, 64, dtype=np.float32)


def run(backend, op):
    fn, mod = unary(op)
    kernel = backend.compile(fn, module=mod)
    out = np.empty(64, np.float32)
    kernel([X], [out])
    return out, kernel


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Two kernels of the same signature (exp, negative) in a cache of their own, and their keys."""
    directory = tmp_path_factory.mktemp("built")
    backend = CpuBackend(cache_dir=directory)
    keys = {}
    for op in ("exp", "negative"):
        _, kernel = run(backend, op)
        keys[op] = backend.cache.key(kernel.source)
    return directory, keys


def entry(directory, key):
    return Path(directory) / f"{key}.so", Path(directory) / f"{key}.json"


def fresh_copy(built, tmp_path, so_of="exp", manifest_of="exp"):
    """A new cache folder (whose paths this process never loaded) holding exp's key with the
    library of ``so_of`` and the manifest of ``manifest_of``."""
    directory, keys = built
    target = tmp_path / "cache"
    target.mkdir(mode=0o700)
    so, manifest = entry(target, keys["exp"])
    shutil.copy(entry(directory, keys[so_of])[0], so)
    shutil.copy(entry(directory, keys[manifest_of])[1], manifest)
    return target


def test_a_verified_entry_is_a_hit_and_private(built, tmp_path):
    directory = fresh_copy(built, tmp_path)
    backend = CpuBackend(cache_dir=directory)
    out, _ = run(backend, "exp")
    np.testing.assert_allclose(out, np.exp(X), rtol=1e-6)
    assert backend.cache.compiles == 0
    so, manifest = entry(built[0], built[1]["exp"])
    assert stat.S_IMODE(so.stat().st_mode) == 0o600 and stat.S_IMODE(manifest.stat().st_mode) == 0o600
    assert '"sha256"' in manifest.read_text()


def test_the_default_folder_is_platformdirs_user_cache():
    assert default_cache_dir() == platformdirs.user_cache_path("dpl", appauthor=False) / "kernels"


def test_another_kernels_library_under_a_key_is_rebuilt(built, tmp_path):
    directory = fresh_copy(built, tmp_path, so_of="negative")
    backend = CpuBackend(cache_dir=directory)
    out, _ = run(backend, "exp")
    np.testing.assert_allclose(out, np.exp(X), rtol=1e-6)  # loaded as is, it computes -x
    assert backend.cache.compiles == 1


def test_a_symlinked_library_is_not_followed(built, tmp_path):
    directory = fresh_copy(built, tmp_path)
    so = entry(directory, built[1]["exp"])[0]
    so.unlink()
    so.symlink_to(entry(built[0], built[1]["negative"])[0])
    backend = CpuBackend(cache_dir=directory)
    out, _ = run(backend, "exp")
    np.testing.assert_allclose(out, np.exp(X), rtol=1e-6)
    assert backend.cache.compiles == 1 and not so.is_symlink()


@pytest.mark.parametrize("manifest", ["genuine", "missing"])
def test_a_planted_library_never_runs_its_constructor(built, tmp_path, manifest):
    directory = fresh_copy(built, tmp_path)
    so, manifest_path = entry(directory, built[1]["exp"])
    marker = tmp_path / "constructor-ran"
    planted = tmp_path / "planted.c"
    planted.write_text(textwrap.dedent(f"""\
        #include <stdio.h>
        __attribute__((constructor)) static void boom(void) {{ FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}
        void dpl_kernel(void **a, long long *d) {{ (void)a; (void)d; }}
        """))
    subprocess.run(["cc", "-shared", "-fPIC", str(planted), "-o", str(so)], check=True)
    if manifest == "missing":
        manifest_path.unlink()
    backend = CpuBackend(cache_dir=directory)
    out, _ = run(backend, "exp")
    np.testing.assert_allclose(out, np.exp(X), rtol=1e-6)
    assert not marker.exists()
    assert backend.cache.compiles == 1


def test_a_truncated_library_is_rebuilt_in_a_new_process(built, tmp_path):
    """Loaded as it is, a truncated library kills the process with SIGBUS: a child loads it."""
    directory = fresh_copy(built, tmp_path)
    so = entry(directory, built[1]["exp"])[0]
    with open(so, "r+b") as f:
        f.truncate(so.stat().st_size // 2)
    child = textwrap.dedent(f"""\
        import numpy as np, dpl
        from dpl.backends.cpu.backend import CpuBackend
        b = CpuBackend(cache_dir={str(directory)!r})
        mod = dpl.parse("func main(x: f32[64]) -> f32[64] {{\\n  y = exp(x)\\n  return y\\n}}")
        k = b.compile(mod["main"], module=mod)
        x = np.linspace(-2, 2, 64, dtype=np.float32); out = np.empty(64, np.float32)
        k([x], [out])
        print(b.cache.compiles, bool(np.allclose(out, np.exp(x), rtol=1e-6)))
        """)
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "True"]


def test_umask_000_still_gives_private_folders_and_files(built, tmp_path):
    directory = tmp_path / "made" / "here" / "kernels"
    old = os.umask(0)
    try:
        backend = CpuBackend(cache_dir=directory)
        out, _ = run(backend, "exp")
    finally:
        os.umask(old)
    np.testing.assert_allclose(out, np.exp(X), rtol=1e-6)
    for folder in (tmp_path / "made", tmp_path / "made" / "here", directory, directory / LOCKS):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    files = [p for p in directory.rglob("*") if p.is_file()]
    assert {p.suffix for p in files} == {".so", ".json", ".lock", ".TAG"}  # .TAG: the store's marker
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p


def test_a_folder_others_can_write_is_refused(built, tmp_path, caplog):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with caplog.at_level(logging.WARNING, logger="dpl.cache_dir"):
        backend = CpuBackend(cache_dir=shared)
        out, _ = run(backend, "exp")
    np.testing.assert_allclose(out, np.exp(X), rtol=1e-6)
    assert backend.cache.directory != shared and list(shared.iterdir()) == []
    assert "writable by others (mode 777)" in caplog.text and str(shared) in caplog.text
    assert stat.S_IMODE(backend.cache.directory.stat().st_mode) == 0o700


def test_a_folder_of_another_user_is_refused(tmp_path, monkeypatch):
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    assert why_unsafe(mine) is None
    uid = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: uid + 1)  # as another user sees it
    assert "owned by another user" in why_unsafe(mine)


def test_a_world_writable_parent_is_refused(tmp_path):
    parent = tmp_path / "open"
    parent.mkdir()
    os.chmod(parent, 0o777)
    (parent / "kernels").mkdir(mode=0o700)
    assert "which others can write" in why_unsafe(parent / "kernels")
    os.chmod(parent, 0o1777)  # sticky, as /tmp: nobody can swap another's folder
    assert why_unsafe(parent / "kernels") is None


def test_builds_a_dead_process_left_are_swept(tmp_path):
    directory = tmp_path / "store"
    LibraryCache(directory).directory  # noqa: B018 - creates it
    stale = directory / ("ab" + "0" * 62 + ".build-x1abcdef")  # mkdtemp's 8 characters
    stale.mkdir()
    (stale / "lib.so").write_bytes(b"half")
    live = directory / ("cd" + "0" * 62 + ".build-x2abcdef")
    live.mkdir()
    legacy, recent = directory / "tmpab12cdef", directory / "tmpcd34efgh"  # an older dpl's, no lock to tell
    legacy.mkdir()
    recent.mkdir()
    os.utime(legacy, (time.time() - 7200, time.time() - 7200))
    LibraryCache(directory).directory  # noqa: B018 - swept already in this process: left for the next
    assert stale.exists() and legacy.exists()
    with FileLock(directory / LOCKS / "cd.lock"):  # its build is still running
        new_process()
        LibraryCache(directory).directory  # noqa: B018 - a process's first store sweeps on first use
        assert not stale.exists() and live.exists()
        assert not legacy.exists() and recent.exists()
    LibraryCache(directory).clear()
    assert not live.exists()


def new_process() -> None:
    """Forget which cache folders this process swept, as a new process starts."""
    disk_cache._SWEPT.clear()


def test_a_build_killed_by_sigkill_is_swept(tmp_path):
    """A real SIGKILL mid-build: its lock dies with it, so the next store removes its folder."""
    directory = tmp_path / "store"
    child = textwrap.dedent(f"""\
        import time
        from dpl.runtime.disk_cache import LibraryCache
        def build(out):
            print("building", flush=True)
            time.sleep(60)
        LibraryCache({str(directory)!r}).load("ef" + "0" * 62, build)
        """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == "building"
        assert len(list(directory.glob("*.build-*"))) == 1
        new_process()
        LibraryCache(directory).directory  # noqa: B018 - the build is alive: kept
        assert len(list(directory.glob("*.build-*"))) == 1
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    new_process()
    LibraryCache(directory).directory  # noqa: B018
    assert list(directory.glob("*.build-*")) == []


def test_concurrent_builders_compile_once(built, tmp_path):
    so = entry(built[0], built[1]["exp"])[0]
    key = "12" + "3" * 62
    builds = []

    def build(out):
        builds.append(1)
        time.sleep(0.2)  # long enough for every thread to meet the lock
        shutil.copy(so, out)

    def load():
        LibraryCache(tmp_path / "store").load(key, build, "dpl_kernel")

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1


def test_past_its_cap_the_least_recently_used_entries_go(built, tmp_path):
    so = entry(built[0], built[1]["exp"])[0]
    size = so.stat().st_size
    store = LibraryCache(tmp_path / "store", max_bytes=int((3 * size + 2000) / 0.9))  # 3 entries fit, 4 do not
    keys = [f"{i:02x}" + "0" * 62 for i in range(5)]
    for i, key in enumerate(keys[:3]):
        store.load(key, lambda out: shutil.copy(so, out))
        os.utime(store.directory / f"{key}.json", (1000 + i, 1000 + i))
    store.load(keys[0], lambda out: pytest.fail("a hit must not build"))  # keys[0] used again: newest
    store.load(keys[3], lambda out: shutil.copy(so, out))
    assert [e.key for e in store.entries()][-1] == keys[3]
    assert {e.key for e in store.entries()} == {keys[0], keys[2], keys[3]}  # keys[1] was least recent
    info = store.info()
    assert info.entries == 3 and info.bytes <= store.max_bytes
    assert store.clear() == 3 and store.info().entries == 0


def test_group_write_is_fine_only_for_a_user_private_group(tmp_path, monkeypatch):
    import dpl.cache_dir

    folder = tmp_path / "upg"
    folder.mkdir()
    os.chmod(folder, 0o770)  # umask 002 on a user-private-group system
    monkeypatch.setattr(dpl.cache_dir, "_private_group", lambda gid: True)
    assert why_unsafe(folder) is None
    monkeypatch.setattr(dpl.cache_dir, "_private_group", lambda gid: False)  # a shared group, as "users"
    assert "writable by others (mode 770)" in why_unsafe(folder)


def test_a_process_sweeps_a_folder_once(tmp_path, monkeypatch):
    """Every build opens its backend's cache anew; listing a folder of thousands of kernels at
    each one had made a warm build 3x slower (21 ms against 6.4, 6,300 files), so only the
    first store of a process sweeps."""
    swept = []
    monkeypatch.setattr(LibraryCache, "_sweep", lambda self, directory: swept.append(directory))
    for _ in range(3):
        LibraryCache(tmp_path / "a").directory  # noqa: B018
    LibraryCache(tmp_path / "b").directory  # noqa: B018
    assert swept == [tmp_path / "a", tmp_path / "b"]
