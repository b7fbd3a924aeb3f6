"""``dpl.save`` / ``dpl.load``: the text form plus a sidecar ``.npz`` for constants too large
to print inline, so modules with weights round-trip exactly.

The sidecar is input like any other: an entry is read only when the module declares a constant
of its name (``const w: f32[4096, 4096]`` without a value), and only after its ``.npy`` header,
read inside the zip without inflating the data, says the dtype and shape declared, within the
size limits of :mod:`dpl.limits`, and a data size that agrees with the entry's. Entries the
module never names are never opened. A bad entry is reported at the declaration that names it.
"""

from __future__ import annotations

import os
import re
import stat
import zipfile
import zlib

import numpy as np

from dpl import dtypes
from dpl.errors import DplError, Span
from dpl.limits import MAX_INT_DIGITS, MAX_NPY_HEADER, MAX_SOURCE_BYTES, LimitError, excerpt, shape_size_error
from dpl.syntax import Source
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
        parts, size = [], 0
        with open(path, encoding="utf-8") as f:
            while size <= MAX_SOURCE_BYTES:  # a piece at a time: read(MAX_SOURCE_BYTES) would allocate it all
                part = f.read(1 << 20)
                if not part:
                    break
                parts.append(part)
                size += len(part.encode("utf-8", "surrogatepass"))
        if size > MAX_SOURCE_BYTES:
            raise LimitError(f"'{os.fspath(path)}' has more than MAX_SOURCE_BYTES = {MAX_SOURCE_BYTES} bytes")
        return "".join(parts)
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
        values = read_sidecar(sidecar(path), text, os.fspath(path))
    return parse(text, os.fspath(path), values)


class SidecarError(DplError):
    """An entry of a module's ``.npz`` sidecar that does not fit the constant it is read for."""


# a constant declared without a value: ``const NAME: DTYPE[dims]`` not followed by ``=``
_DECLARATION = re.compile(r"\bconst\s+([A-Za-z_]\w*)\s*:\s*([A-Za-z_]\w*)\s*\[([^\[\]]*)\]")
# what may hold the word ``const`` without declaring anything: string literals and comments
_NOISE = re.compile(r'"(?:[^"\\\n]|\\.)*"|#[^\n]*')


def declared_constants(text: str, filename: str) -> dict[str, tuple[np.dtype, tuple[int, ...], Span]]:
    """{name: (dtype, shape, span)} of the constants ``text`` declares without a value. A
    declaration this scan cannot read (an unknown dtype, a symbolic dim) is left to the parser,
    which reports it; so is every other error of the text."""
    plain = _NOISE.sub(lambda m: " " * len(m.group()), text)  # same length: offsets stay true
    src = Source(text, filename)
    found = {}
    for m in _DECLARATION.finditer(plain):
        if plain[m.end():].lstrip().startswith("="):
            continue  # the value is written inline
        name, dtype, dims = m.group(1), m.group(2), [d.strip() for d in m.group(3).split(",")]
        dims = [] if dims == [""] else dims
        if not all(d.isdigit() and len(d) <= MAX_INT_DIGITS for d in dims):
            continue
        try:
            np_dtype = np.dtype(dtypes.to_numpy(dtypes.canonical(dtype)))
        except (DplError, TypeError, ValueError):
            continue
        line = plain.count("\n", 0, m.start(1)) + 1
        col = m.start(1) - (plain.rfind("\n", 0, m.start(1)) + 1) + 1
        found[name] = (np_dtype, tuple(int(d) for d in dims), src.span(line, col, line, col + len(name)))
    return found


def read_sidecar(file: str, text: str, filename: str) -> dict[str, np.ndarray]:
    """The values of ``file`` (a ``.npz``) for the constants ``text`` declares without one;
    each checked against its declaration before it is inflated, the other entries unread."""
    declared = declared_constants(text, filename)
    if not declared:
        return {}
    values = {}
    try:
        with zipfile.ZipFile(file) as zf:
            entries = {}
            for info in zf.infolist():
                key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                entries.setdefault(key, info)
            for name, (dtype, shape, span) in declared.items():
                info = entries.get(name)
                if info is not None:  # a missing value is the parser's to report, at the declaration
                    values[name] = _read_entry(zf, info, name, dtype, shape, span, file)
    except SidecarError:
        raise
    except (OSError, EOFError, ValueError, RuntimeError, zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error,
            NotImplementedError) as err:  # RuntimeError: an encrypted entry
        first = next(iter(declared.values()))[2]  # the first declaration that reads the file
        raise SidecarError(f"cannot read the constants of '{filename}' from {file}: {excerpt(str(err), 300)}", first,
                           hint="the sidecar is the .npz that dpl.save (or `dpl print -o`) writes beside the module") from None
    return values


def _read_entry(zf: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, dtype: np.dtype, shape: tuple[int, ...],
                span: Span, file: str) -> np.ndarray:
    """The array of one entry, after its header is checked against the declaration."""
    fmt = np.lib.format

    def bad(why: str, hint: str | None = None) -> SidecarError:
        return SidecarError(f"constant '{name}': its entry '{info.filename}' in {file} {why}", span, hint)

    with zf.open(info) as f:
        try:
            version = fmt.read_magic(f)
            if version == (1, 0):  # what np.savez writes
                got_shape, _, got_dtype = fmt.read_array_header_1_0(f, max_header_size=MAX_NPY_HEADER)
            elif version == (2, 0):  # a header over 64 KiB, refused by its size but read as NumPy would
                got_shape, _, got_dtype = fmt.read_array_header_2_0(f, max_header_size=MAX_NPY_HEADER)
            else:
                raise bad(f"is .npy version {version[0]}.{version[1]}, which dpl does not read")
        except SidecarError:
            raise
        except Exception as err:  # noqa: BLE001 (NumPy tokenizes and evaluates the header text: its errors are many)
            raise bad(f"has no readable .npy header ({type(err).__name__}: {excerpt(str(err), 200)})") from None
        offset = f.tell()
    if got_dtype.hasobject:
        raise bad("holds Python objects", "a sidecar holds plain numbers only; write it with dpl.save")
    # NumPy writes a dtype it has no name for (ml_dtypes' bfloat16) as raw bytes of its size
    raw = dtype.kind == "V" and got_dtype == np.dtype(f"V{dtype.itemsize}")
    if tuple(got_shape) != shape or (got_dtype != dtype and not raw):
        declared = f"{_describe(dtype)}[{', '.join(map(str, shape))}]"
        raise bad(f"holds {_describe(got_dtype)}[{excerpt(', '.join(map(str, got_shape)), 200)}], not the declared {declared}",
                  "write the module and its sidecar together with dpl.save (or `dpl print -o`)")
    too_large = shape_size_error(got_shape, got_dtype.itemsize)
    if too_large is not None:
        raise LimitError(f"constant '{name}' {too_large}", span)
    size = got_dtype.itemsize * int(np.prod(got_shape, dtype=object))
    if info.file_size != offset + size:
        raise bad(f"holds {info.file_size - offset} bytes of data where its header declares {size}")
    try:
        with zf.open(info) as f:
            array = fmt.read_array(f, allow_pickle=False, max_header_size=MAX_NPY_HEADER)
    except MemoryError:
        raise bad(f"needs {size} bytes, more memory than there is") from None
    return array.view(dtype) if raw else array


def _describe(dtype: np.dtype) -> str:
    try:
        return dtypes.short(dtype.name)
    except (DplError, KeyError, ValueError):
        return str(dtype)
