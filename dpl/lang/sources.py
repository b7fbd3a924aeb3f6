"""Where ``.dpl`` text comes from: files named by the user, shipped libraries, and imports.

An ``import "x.dpl"`` reads only inside the importing file's directory tree (or the tree of a
directory the caller put on the search path): no absolute paths, no ``..`` out of the tree, no
symbolic link out of it. Every file read is a regular ``.dpl`` file of at most
MAX_SOURCE_BYTES, so a device (``/dev/zero``), a FIFO or a file that is not a pattern file is
refused before a byte of it is read, and no error ever quotes such a file.
"""

from __future__ import annotations

import os
import stat
import sys
from typing import Sequence

from dpl.errors import DplError, excerpt
from dpl.lang import ast
from dpl.lang.libraries import LibraryError, read_library
from dpl.limits import MAX_SOURCE_BYTES, LimitError


class PatternFileError(DplError):
    """A pattern file or library that cannot be found or read."""


def read_source(path: str) -> str:
    """The text of a ``.dpl`` file: a regular file, UTF-8, at most MAX_SOURCE_BYTES."""
    if not path.endswith(".dpl"):
        raise PatternFileError(f"'{path}' is not a .dpl file", hint="pattern files are named *.dpl")
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise PatternFileError(f"pattern file '{path}' does not exist") from None
    except OSError as err:
        raise PatternFileError(f"cannot read '{path}': {err.strerror}") from None
    if stat.S_ISDIR(info.st_mode):
        raise PatternFileError(f"'{path}' is a directory, not a pattern file")
    if not stat.S_ISREG(info.st_mode):
        raise PatternFileError(f"'{path}' is not a regular file")
    if info.st_size > MAX_SOURCE_BYTES:
        raise LimitError(f"'{path}' has {info.st_size} bytes; the limit is MAX_SOURCE_BYTES = {MAX_SOURCE_BYTES}")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SOURCE_BYTES + 1)  # the file may have grown since stat
    except OSError as err:
        raise PatternFileError(f"cannot read '{path}': {err.strerror}") from None
    if len(data) > MAX_SOURCE_BYTES:
        raise LimitError(f"'{path}' has more than MAX_SOURCE_BYTES = {MAX_SOURCE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise PatternFileError(f"'{path}' is not a UTF-8 text file") from None


def library(name: str) -> tuple[str, str]:
    """(text, filename) of a library by name: shipped, or installed by a plugin."""
    if not name.isidentifier():
        looks_like_rules = any(word in name for word in ("pattern ", "rewrite ", "codegen ", "{"))
        raise PatternFileError(f"'{excerpt(name, 80)}' is neither a .dpl file nor a library name",
                               hint="to load rules written in a string, call dpl.parse_patterns(text)" if looks_like_rules else None)
    try:
        return read_library(name)
    except LibraryError as err:
        raise PatternFileError(err.message, hint=err.hint) from None


def read(source: str) -> tuple[str, str]:
    """(text, filename) of what the user named: a path to a ``.dpl`` file, a library, or stdin
    (``-``, as the command line names it)."""
    if source == "-":
        text = sys.stdin.read(MAX_SOURCE_BYTES + 1)
        if len(text) > MAX_SOURCE_BYTES:
            raise LimitError(f"stdin has more than MAX_SOURCE_BYTES = {MAX_SOURCE_BYTES} characters")
        return text, "<stdin>"
    if source.endswith(".dpl") or os.sep in source or "/" in source:
        return read_source(source), source
    return library(source)


def _inside(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return os.path.commonpath([path, root]) == root


def resolve_import(decl: ast.ImportDecl, importer: str, search_path: Sequence[str] = ()) -> tuple[str, str]:
    """(text, filename) of an import: a library by name, or a relative ``.dpl`` path inside the
    importing file's directory tree, else inside one of ``search_path``'s directories."""
    if not decl.is_path:
        return library(decl.target)
    target = decl.target
    if os.path.isabs(target) or not target.endswith(".dpl"):
        raise PatternFileError(f"cannot import '{target}': an import names a relative path to a .dpl file",
                               hint="use a path inside this file's directory, or put the directory on the search path")
    home = os.path.dirname(importer) if os.path.isfile(importer) else os.getcwd()
    roots = [home, *map(os.fspath, search_path)]
    inside = [r for r in roots if _inside(os.path.join(r, target), r)]
    for root in inside:
        path = os.path.normpath(os.path.join(root, target))
        if os.path.lexists(path):
            return read_source(path), path
    if not inside:
        raise PatternFileError(f"cannot import '{target}': it is outside the importing file's directory tree",
                               hint="pass the directory that holds it on the search path (search_path=...)")
    raise PatternFileError(f"pattern file '{os.path.normpath(os.path.join(inside[0], target))}' does not exist",
                           hint=f"looked in: {', '.join(inside)}" if search_path else None)
