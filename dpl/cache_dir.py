"""Where dpl keeps what it caches between processes, and whether a directory is safe to trust.

Everything lives under platformdirs' user cache directory (``~/.cache/dpl`` on Linux, which
follows ``XDG_CACHE_HOME`` as the platform's convention says), one folder per store:
``kernels`` (the CPU backend's compiled kernels), ``packaged`` (the kernels of loaded packages,
``dpl.package``, and the profiles they carry), ``cuda-twin`` (the host twins of the CUDA
kernels), ``parsers`` (Lark's parse tables) and ``products`` (the measured choice of products
library, ``dpl.backends.cpu.products_choice``). A caller may name another directory instead
(``CpuBackend(cache_dir=...)``); nothing here reads an environment variable of dpl's own. A folder
several machines share (an NFS home) is safe to use at once: see ``dpl.runtime.disk_cache``.

What is loaded from a cache runs in this process, so a directory is used only when it is
private: owned by this user, writable by nobody else, and inside parents that nobody else can
swap it out of (each owned by this user or root and writable by no one else, unless sticky like
``/tmp``). dpl creates its directories 0700 and its files 0600, whatever the umask. A directory
that fails is refused with a logged warning, and the store works in a private temporary
directory of this process instead (removed at exit): slower, never unsafe.

A cache never removes what it did not write. A directory dpl creates for a store gets a
``CACHEDIR.TAG`` (the Cache Directory Tagging convention, so backup tools skip it, with a line
naming dpl): the store's *marker*, saying that dpl made the folder. Each store removes only names
of its own exact format (a kernel entry also only when its manifest names it), and the riskier
clean-ups (folders an older dpl's builds left, libraries without a manifest) only where the
marker is. A directory that exists without the marker is adopted (marked) only when it holds
nothing but names of dpl's format (the store of an older dpl, or an empty folder); a folder that
holds anything else (a user's own, given as ``cache_dir=``) is used as it is, and nothing in it
that dpl did not write is touched. Reports (``dpl cache info``) create and remove nothing.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path

import platformdirs

log = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600
MARKER = "CACHEDIR.TAG"
_SIGNATURE = "Signature: 8a477f597d28d172789f06886806bc55"  # https://bford.info/cachedir/
_MARKER_LINE = "# dpl store: "

_lock = threading.Lock()
_fallback_root: Path | None = None
_warned: set[str] = set()


def user_cache_root() -> Path:
    """dpl's folder in the user cache directory (not created here)."""
    return platformdirs.user_cache_path("dpl", appauthor=False)


def store_dir(name: str) -> Path:
    """The default folder of one store (``kernels``, ``cuda-twin``, ``parsers``)."""
    return user_cache_root() / name


def _owned_by_others(st: os.stat_result) -> bool:
    return hasattr(os, "geteuid") and st.st_uid != os.geteuid()


def _others_can_write(st: os.stat_result) -> bool:
    """Whether someone besides the owner may write: world-writable, or group-writable by a group
    other than this user's own private group (the user-private-group setups of umask 002)."""
    if st.st_mode & stat.S_IWOTH:
        return True
    return bool(st.st_mode & stat.S_IWGRP) and not _private_group(st.st_gid)


def _private_group(gid: int) -> bool:
    """The user-private-group convention: this user's primary group, named after the user, with
    no other members (a shared primary group such as ``users`` is not private)."""
    import grp
    import pwd

    try:
        user, group = pwd.getpwuid(os.geteuid()), grp.getgrgid(gid)
    except KeyError:
        return False
    return gid == user.pw_gid and group.gr_name == user.pw_name and set(group.gr_mem) <= {user.pw_name}


def why_unsafe(directory: Path) -> str | None:
    """Why ``directory`` (which exists) must not be trusted, or None when it is private."""
    if not hasattr(os, "geteuid"):
        return None  # no POSIX owners and modes to check (Windows: the profile's ACLs protect it)
    try:
        st = os.stat(directory)
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if _owned_by_others(st):
        return f"is owned by another user (uid {st.st_uid})"
    if _others_can_write(st):
        return f"is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    for parent in Path(os.path.realpath(directory)).parents:
        try:
            pst = os.stat(parent)
        except OSError as err:
            return f"has a parent {parent} that cannot be read ({err.strerror})"
        if pst.st_uid not in (0, os.geteuid()):
            return f"is inside {parent}, owned by another user (uid {pst.st_uid})"
        if _others_can_write(pst) and not pst.st_mode & stat.S_ISVTX:
            return f"is inside {parent}, which others can write (mode {stat.S_IMODE(pst.st_mode):o})"
    return None


def make_private_dirs(directory: Path) -> list[Path]:
    """Create ``directory`` and its missing parents, each 0700 whatever the umask; returns
    those this call created."""
    missing = []
    path = Path(directory)
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    created = []
    for path in reversed(missing):
        try:
            os.mkdir(path, DIR_MODE)
        except FileExistsError:
            continue  # another process made it meanwhile: why_unsafe judges it
        os.chmod(path, DIR_MODE)  # the umask may have taken the owner's own bits
        created.append(path)
    return created


def private_dir(directory: str | os.PathLike, purpose: str) -> Path:
    """``directory``, created if missing, when it is safe to trust; else (with a warning logged
    once per directory) a private temporary folder of this process for ``purpose``."""
    directory = Path(directory)
    created = False
    try:
        created = directory in make_private_dirs(directory)
        why = why_unsafe(directory)
    except OSError as err:
        why = f"cannot be created ({err.strerror})"
    if why is None and not os.access(directory, os.W_OK | os.X_OK):
        why = "is not writable"
    if why is None:
        if created:
            mark(directory, purpose)
        return directory
    fallback = _process_dir() / purpose
    if fallback in make_private_dirs(fallback):
        mark(fallback, purpose)
    with _lock:
        first = str(directory) not in _warned
        _warned.add(str(directory))
    if first:
        log.warning("not using the cache directory %s: it %s; using the private %s for this process "
                    "(fix its owner and mode, or name another directory)", directory, why, fallback)
    return fallback


def mark(directory: Path, store: str) -> None:
    """Record that ``directory`` is a store of dpl's (its marker); a failure only costs the
    clean-ups that need the marker."""
    text = (f"{_SIGNATURE}\n{_MARKER_LINE}{store}\n# dpl created this folder and removes only what it wrote in it.\n"
            "# For information about cache directory tags, see https://bford.info/cachedir/\n")
    try:
        write_private_file(Path(directory) / MARKER, text.encode())
    except OSError as err:
        log.info("could not mark %s as dpl's cache: %s", directory, err)


def is_marked(directory: Path) -> bool:
    """Whether ``directory`` holds dpl's marker (a regular file of this user naming dpl)."""
    try:
        text = read_own_file(Path(directory) / MARKER, 4096).decode("utf-8", "replace")
    except OSError:
        return False
    return text.startswith(_SIGNATURE) and _MARKER_LINE in text


def _process_dir() -> Path:
    """A private temporary folder (0700, made by mkdtemp) removed when this process exits."""
    global _fallback_root
    with _lock:
        if _fallback_root is None:
            _fallback_root = Path(tempfile.mkdtemp(prefix="dpl-cache-"))
            atexit.register(shutil.rmtree, _fallback_root, True)
        return _fallback_root


def read_own_file(path: Path, limit: int | None = None) -> bytes:
    """The bytes of ``path`` when it is a regular file of this user; never follows a symlink and
    never blocks on a FIFO (OSError otherwise)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        if _owned_by_others(st):
            raise OSError(f"{path} is owned by another user")
        if limit is not None and st.st_size > limit:
            raise OSError(f"{path} is larger than {limit} bytes")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def write_private_file(path: Path, data: bytes) -> None:
    """Write ``path`` atomically (a temporary file beside it, then a rename), mode 0600."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
