"""Compiled shared libraries on disk, by key, checked before they are loaded.

A store is one private directory (``dpl.cache_dir``: refused, and replaced by a private
temporary one, when others could write it) holding, per key, ``KEY.so`` and its manifest
``KEY.json``: the key, the library's size and SHA-256, and what built it. :meth:`load` reads
the library (a regular file of this user, never through a symlink), and only when its bytes
hash to the manifest's does it ``dlopen`` it; a missing, truncated, swapped or planted library
is never loaded (its constructors never run) and is built again. Files are written to a
temporary name and renamed, mode 0600.

Concurrent processes meet through ``filelock`` locks in ``locks/``: building a key holds its
bucket's lock (one of 256, by the key's first two hex digits; lock files are never deleted, so
two processes can never hold "the same" lock on two inodes), so a kernel is compiled once and
the others load it. A lock not had within ``LOCK_TIMEOUT`` (a lock server that hangs, on NFS, or
a process stopped holding it) is logged and the build runs without it: every write goes to a
temporary name in the same folder and is renamed into place, and every read is verified, so
racing builds cost compile time, never a corrupt entry. One directory may so be shared by many
processes and machines (of one user: see ``dpl.cache_dir``), each CPU under keys of its own. A build works in ``KEY.build-*`` beside the entries; one a SIGKILL left
behind is swept when its bucket's lock is free. The manifest's modification time is the entry's
last use: past ``max_bytes`` the least recently used entries are evicted (to 90% of it), by
one process at a time.

The store removes only what it wrote (see ``dpl.cache_dir``): an entry only when its manifest
names its key, a build folder only when it holds the build marker a build writes first (or is
empty). A directory that holds dpl's marker (dpl made it), or that holds nothing but names of
this store's exact format (an older dpl's store, an empty folder: it is marked then), is dpl's:
there a build folder without the marker (of a dpl before it), a library whose manifest never
came, and a ``tmp*`` folder an older dpl's build left (no lock tells: it must be an hour old and
hold only that build's ``kernel.c``, ``kernel.so`` and ``manifest.json``) are removed too. A
directory holding anything else, a user's own folder given as ``cache_dir=``, is used as it is:
its other files and folders are never swept, evicted or cleared. :meth:`info` reads only.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import attrs
from filelock import FileLock, Timeout

from dpl.cache_dir import (FILE_MODE, MARKER, is_marked, make_private_dirs, mark, private_dir, read_own_file,
                           write_private_file)
from dpl.errors import DplError, count

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
MANIFEST_LIMIT = 64 * 1024  # a manifest is a few hundred bytes; anything larger is not ours
LOCKS = "locks"
BUILD_MARKER = ".dpl-build"  # the first file a build folder gets: dpl made it
LEGACY_BUILD_AGE = 3600  # seconds: a tmp* folder of an older dpl this old is no live build
LEGACY_BUILD_FILES = frozenset({"kernel.c", "kernel.so", "manifest.json"})  # all such a folder held
LOCK_TIMEOUT = 600.0  # seconds a build waits for its bucket's lock before it builds without it

# the names this store writes, exactly (mkdtemp's names: 8 of [a-z0-9_])
_KEY = re.compile(r"[0-9a-f]{64}")  # a SHA-256
_ENTRY = re.compile(r"[0-9a-f]{64}\.(?:so|json)")
_PENDING = re.compile(r"\.[0-9a-f]{64}\.json\.[a-z0-9_]{8}")  # write_private_file's temporary name
_BUILD = re.compile(r"([0-9a-f]{64})\.build-[a-z0-9_]{8}")
_LEGACY_BUILD = re.compile(r"tmp[a-z0-9_]{8}")


class CacheError(DplError):
    """A library that could not be built or loaded from its store."""


@attrs.frozen
class Entry:
    key: str
    bytes: int  # the library and its manifest
    last_used: float  # the manifest's modification time


@attrs.frozen
class Info:
    directory: Path
    entries: int
    bytes: int
    max_bytes: int
    builds_in_progress: int


# the cache folders this process has swept (see LibraryCache._sweep)
_SWEPT: set[Path] = set()
_SWEPT_LOCK = threading.Lock()


class LibraryCache:
    """Shared libraries under keys in ``directory`` (created 0700 when missing)."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int = DEFAULT_MAX_BYTES):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise DplError(f"max_bytes must be a non-negative integer, got {max_bytes!r}")
        self.requested = Path(directory)
        self.max_bytes = max_bytes
        self.builds = 0  # how many times this store ran a build (for tests and reports)
        self._directory: Path | None = None
        self._lock = threading.Lock()

    @property
    def where(self) -> Path:
        """The directory in use, or the requested one before its first use (nothing created)."""
        return self._directory or self.requested

    @property
    def directory(self) -> Path:
        """Where entries live: the requested directory, or a private one when it was refused."""
        with self._lock:
            if self._directory is None:
                self._directory = private_dir(self.requested, self.requested.name or "cache")
                make_private_dirs(self._directory / LOCKS)
                with _SWEPT_LOCK:
                    first = self._directory not in _SWEPT
                    _SWEPT.add(self._directory)
                if first:  # once a process: each backend of a build opens its cache anew
                    self._sweep(self._directory)
            return self._directory

    # -- loading --------------------------------------------------------------------------------
    def load(self, key: str, build: Callable[[Path], None], symbol: str | None = None,
             about: dict | None = None, sha256: str | None = None) -> ctypes.CDLL:
        """The library under ``key``, built by ``build(path)`` (which writes a shared library at
        ``path``) when no verified one is there. ``symbol``: a name the library must export;
        ``sha256``: the hash its bytes must have (a package's kernel), else it is written anew."""
        if not _KEY.fullmatch(key):
            raise CacheError(f"a cache key is a SHA-256 in lowercase hex (64 digits), got {key!r}")
        lib = self._verified(key, symbol, sha256)
        if lib is not None:
            return lib
        try:
            lib = self._build_once(key, build, symbol, about or {}, sha256)
        except OSError as err:  # a full disk, a folder made read-only meanwhile, a directory under a key
            raise CacheError(f"cannot write the cache entry {key[:16]} in {self._directory or self.requested}: {err}") from None
        if lib is None:
            raise CacheError(f"the library built for key {key[:16]} in {self.directory} does not load")
        self.evict()
        return lib

    def _build_once(self, key: str, build: Callable[[Path], None], symbol: str | None, about: dict,
                    sha256: str | None) -> ctypes.CDLL | None:
        """Build under the bucket's lock, so that one process compiles and the others load its
        result; past ``LOCK_TIMEOUT`` without the lock, build anyway (see the module text)."""
        lock = self._bucket(key)
        try:
            lock.acquire(timeout=LOCK_TIMEOUT)
        except Timeout:
            log.warning("waited %.0f s for the lock of cache entry %s in %s; building without it", LOCK_TIMEOUT, key[:16],
                        self.directory)
            locked = False
        else:
            locked = True
        try:
            lib = self._verified(key, symbol, sha256)  # built by another process while this one waited
            if lib is None:
                self._build(key, build, about)
                lib = self._verified(key, symbol, sha256)
            return lib
        finally:
            if locked:
                lock.release()

    def _paths(self, key: str) -> tuple[Path, Path]:
        d = self.directory
        return d / f"{key}.so", d / f"{key}.json"

    def read(self, key: str) -> tuple[bytes, dict] | None:
        """The bytes of the library under ``key`` and its manifest, when the bytes hash to the
        manifest's; else None (missing, foreign, truncated or replaced)."""
        lib_path, manifest = self._paths(key)
        try:
            meta = json.loads(read_own_file(manifest, MANIFEST_LIMIT))
            data = read_own_file(lib_path, int(meta["size"]) + 1)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if meta.get("key") != key or len(data) != meta["size"] or hashlib.sha256(data).hexdigest() != meta.get("sha256"):
            log.info("cache entry %s does not match its manifest (truncated or replaced)", lib_path)
            return None
        return data, meta

    def _verified(self, key: str, symbol: str | None, sha256: str | None = None) -> ctypes.CDLL | None:
        lib_path, manifest = self._paths(key)
        found = self.read(key)
        if found is None:
            return None  # missing, foreign, unreadable or not what its manifest says: (re)build
        meta = found[1]
        if sha256 is not None and meta["sha256"] != sha256:
            log.info("cache entry %s holds another library than the one asked for; writing it anew", lib_path)
            return None
        try:
            lib = ctypes.CDLL(str(lib_path))
            if symbol is not None:
                getattr(lib, symbol)
        except (OSError, AttributeError) as err:
            log.info("cache entry %s does not load (%s); rebuilding", lib_path, err)
            return None
        try:
            os.utime(manifest)  # its last use, for eviction
        except OSError:
            pass
        return lib

    def _build(self, key: str, build: Callable[[Path], None], about: dict) -> None:
        lib_path, manifest = self._paths(key)
        self.builds += 1
        work = Path(tempfile.mkdtemp(prefix=f"{key}.build-", dir=self.directory))
        try:
            (work / BUILD_MARKER).write_bytes(b"")
            out = work / "lib.so"
            build(out)
            data = out.read_bytes()
            os.chmod(out, FILE_MODE)  # the compiler made it 0777 less the umask
            os.replace(out, lib_path)
            meta = {"key": key, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), **about}
            write_private_file(manifest, json.dumps(meta, sort_keys=True).encode())
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _bucket(self, key: str) -> FileLock:
        return FileLock(self.directory / LOCKS / f"{key[:2]}.lock", mode=FILE_MODE)

    # -- housekeeping ---------------------------------------------------------------------------
    def entries(self) -> list[Entry]:
        """The store's entries (``KEY.json`` beside ``KEY.so``), least recently used first."""
        return _entries(self.directory)

    def info(self) -> Info:
        """What the store holds; reads only (never creates, sweeps or removes anything)."""
        directory = self.where
        entries = _entries(directory)
        building = sum(1 for n in _names(directory) if _BUILD.fullmatch(n) and (directory / n).is_dir())
        return Info(directory, len(entries), sum(e.bytes for e in entries), self.max_bytes, building)

    def evict(self) -> int:
        """Remove least recently used entries while the store is over ``max_bytes`` (down to 90%
        of it); returns how many. One process evicts at a time; a busy one is not waited for."""
        entries = self.entries()
        total = sum(e.bytes for e in entries)
        if total <= self.max_bytes:
            return 0
        removed = 0
        try:
            with FileLock(self.directory / LOCKS / "evict.lock", mode=FILE_MODE, timeout=0):
                for e in entries:
                    if total <= self.max_bytes * 0.9:
                        break
                    if self._remove(e.key):
                        total -= e.bytes
                        removed += 1
        except Timeout:
            return 0
        log.info("evicted %s from %s (cap %d bytes)", count(removed, "kernel"), self.directory, self.max_bytes)
        return removed

    def clear(self) -> int:
        """Remove every entry this store wrote (and every build a dead process left); returns how
        many entries. A directory that does not exist is not created."""
        if self._directory is None and not self.requested.is_dir():
            return 0
        directory = self.directory
        removed = sum(self._remove(e.key) for e in _entries(directory))
        if is_marked(directory):
            self._remove_orphans(directory)
        self._sweep(directory)
        return removed

    def _remove(self, key: str) -> bool:
        """Remove the entry under ``key`` when its manifest says this store wrote it."""
        lib_path, manifest = self._paths(key)
        try:
            meta = json.loads(read_own_file(manifest, MANIFEST_LIMIT))
        except (OSError, ValueError):
            meta = None
        if not isinstance(meta, dict) or meta.get("key") != key:
            log.info("left %s alone: its manifest is not one dpl wrote", manifest)
            return False
        manifest.unlink(missing_ok=True)  # first: a reader meets a missing manifest, a plain miss
        lib_path.unlink(missing_ok=True)
        return True

    def _remove_orphans(self, directory: Path) -> None:
        """In a store of dpl's own: the libraries whose build died before their manifest came."""
        names = set(_names(directory))
        for name in names:
            key = name[:-3]
            if not name.endswith(".so") or not _KEY.fullmatch(key) or f"{key}.json" in names:
                continue
            try:
                with FileLock(directory / LOCKS / f"{key[:2]}.lock", mode=FILE_MODE, timeout=0):
                    if not (directory / f"{key}.json").exists():  # a build may have finished meanwhile
                        (directory / name).unlink(missing_ok=True)
            except Timeout:
                continue  # a build of this bucket is running

    def _sweep(self, directory: Path) -> None:
        """Remove the build folders of builds that are over (a process killed mid-build): their
        bucket's lock is free. One listing of the folder, its names tested as strings first (two
        pathlib globs matched a regex per entry: 12 ms a build in a folder of 6,300 files)."""
        try:
            with os.scandir(directory) as listing:
                names = [e.name for e in listing]
        except OSError:
            return
        owned = is_marked(directory) or _adopt(directory, names)
        for name in names:
            if ".build-" in name:
                found = _BUILD.fullmatch(name)
                if found is not None:
                    _sweep_build(directory, name, found[1], owned)
            elif owned and name.startswith("tmp") and _legacy_build(directory / name):
                _sweep_legacy_build(directory / name)


def _names(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


def _entries(directory: Path) -> list[Entry]:
    names = set(_names(directory))
    out = []
    for name in names:
        key = name[:-5]
        if not name.endswith(".json") or not _KEY.fullmatch(key) or f"{key}.so" not in names:
            continue
        try:
            m, size = os.stat(directory / name), os.stat(directory / f"{key}.so").st_size
        except OSError:
            continue
        out.append(Entry(key, m.st_size + size, m.st_mtime))
    return sorted(out, key=lambda e: e.last_used)


def _real_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _legacy_build(path: Path) -> bool:
    """Whether ``path`` is a build folder of a dpl before the locks: its name and all it holds."""
    return bool(_LEGACY_BUILD.fullmatch(path.name)) and _real_dir(path) and set(_names(path)) <= LEGACY_BUILD_FILES


def _ours(directory: Path, name: str) -> bool:
    """Whether ``name`` in a store is one this store (or an older dpl's) writes."""
    if name in (MARKER, LOCKS) or _ENTRY.fullmatch(name) or _PENDING.fullmatch(name):
        return True
    if _BUILD.fullmatch(name):
        return _real_dir(directory / name)
    return _legacy_build(directory / name)


def _adopt(directory: Path, names: list[str]) -> bool:
    """Mark ``directory`` as dpl's when it holds nothing else (an older dpl's store, an empty
    folder); whether it did."""
    if not all(_ours(directory, n) for n in names):
        return False
    mark(directory, directory.name or "cache")
    log.info("%s holds only dpl's cache entries: marked as dpl's store", directory)
    return True


def _sweep_build(directory: Path, name: str, key: str, owned: bool) -> None:
    """Remove the build folder ``name`` when its build is over: its bucket's lock is free. Outside
    a store of dpl's own, only a folder holding the build marker (or nothing)."""
    work = directory / name
    if not _real_dir(work):
        return
    if not owned and set(_names(work)) - {BUILD_MARKER} and not (work / BUILD_MARKER).is_file():
        return  # not shown to be a build of dpl's
    try:
        with FileLock(directory / LOCKS / f"{key[:2]}.lock", mode=FILE_MODE, timeout=0):
            shutil.rmtree(work, ignore_errors=True)
            log.info("removed %s, left by a build that did not finish", work)
    except Timeout:
        pass  # a build of this bucket is running


def _sweep_legacy_build(work: Path) -> None:
    """A build folder of a dpl before the locks: no lock tells whether it is live; age does."""
    try:
        if time.time() - work.stat().st_mtime > LEGACY_BUILD_AGE:
            shutil.rmtree(work, ignore_errors=True)
    except OSError:
        pass
