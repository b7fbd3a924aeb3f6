"""``dpl.save`` / ``dpl.load``: the text form plus a sidecar ``.npz`` for constants too large
to print inline, so modules with weights round-trip exactly."""

from __future__ import annotations

import os
import stat

import numpy as np

from dpl.errors import DplError
from dpl.limits import MAX_SOURCE_BYTES, LimitError
from dpl.ir.expr import Module
from dpl.ir.parser import parse
from dpl.ir.printer import INLINE_CONSTANT_LIMIT, collect_constants, constant_names, print_module


def sidecar(path: str | os.PathLike) -> str:
    return os.fspath(path) + ".npz"


def save(mod: Module, path: str | os.PathLike) -> None:
    """Write ``path`` (text) and, when some constant is too large to print, ``path + '.npz'``."""
    constants = collect_constants(mod)
    names = constant_names(constants)
    large = {names[id(c)]: np.asarray(c.value) for c in constants if c.value.size > INLINE_CONSTANT_LIMIT}
    with open(path, "w", encoding="utf-8") as f:
        f.write(print_module(mod))
    if large:
        np.savez(sidecar(path), **large)
    elif os.path.exists(sidecar(path)):
        os.remove(sidecar(path))  # a stale sidecar must not feed a later load


def read_text(path: str | os.PathLike) -> str:
    """The text of a module file: a regular UTF-8 file of at most MAX_SOURCE_BYTES (a device
    such as /dev/zero is refused before it is read)."""
    try:
        if os.path.exists(path) and not os.path.isdir(path) and not stat.S_ISREG(os.stat(path).st_mode):
            raise DplError(f"'{os.fspath(path)}' is not a regular file")
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_SOURCE_BYTES + 1)
        if len(text.encode("utf-8", "surrogatepass")) > MAX_SOURCE_BYTES:
            raise LimitError(f"'{os.fspath(path)}' has more than MAX_SOURCE_BYTES = {MAX_SOURCE_BYTES} bytes")
        return text
    except FileNotFoundError:
        raise DplError(f"'{os.fspath(path)}' does not exist") from None
    except IsADirectoryError:
        raise DplError(f"'{os.fspath(path)}' is a directory, not a module file") from None
    except UnicodeDecodeError:
        raise DplError(f"'{os.fspath(path)}' is not a UTF-8 text file") from None
    except OSError as err:
        raise DplError(f"cannot read '{os.fspath(path)}': {err.strerror}") from None


def load(path: str | os.PathLike) -> Module:
    """The module saved at ``path`` (and its sidecar ``.npz``, if there is one)."""
    text = read_text(path)
    values = {}
    if os.path.exists(sidecar(path)):
        try:
            with np.load(sidecar(path), allow_pickle=False) as npz:
                values = {k: npz[k] for k in npz.files}
        except (OSError, ValueError) as err:
            raise DplError(f"cannot read the constants of '{os.fspath(path)}' from {sidecar(path)}: {err}") from None
    return parse(text, os.fspath(path), values)
