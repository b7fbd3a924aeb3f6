"""What the ``dpl`` subcommands share: reading a module (``-`` is stdin), ``--dim`` sizes checked
against the function, random inputs, writing a module with its ``.npz`` sidecar, JSON output."""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any, Iterable

import numpy as np

from dpl.errors import DplError

log = logging.getLogger(__name__)

STDIN = "-"


def load_module(path: str):
    """The module in ``path`` by its suffix (:func:`dpl.frontend.load_model`); ``-`` reads the
    text form, or an ONNX model's bytes, from stdin."""
    if path != STDIN:
        from dpl.frontend import load_model

        return load_model(path)
    data = sys.stdin.buffer.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        from dpl.frontend.onnx_import import from_onnx

        log.debug("stdin is not UTF-8 text: reading it as an ONNX model")
        return from_onnx(_onnx_model(data))
    from dpl.ir.parser import parse

    return parse(text, "<stdin>")


def _onnx_model(data: bytes):
    try:
        import onnx
    except ImportError:
        raise DplError("stdin is neither UTF-8 module text nor readable as ONNX (onnx is not installed)",
                       hint="pip install 'dpl[onnx]'") from None
    try:
        return onnx.load_model_from_string(data)
    except Exception as err:  # protobuf's DecodeError and friends
        raise DplError(f"stdin is neither UTF-8 module text nor an ONNX model ({type(err).__name__})") from None


def entry_function(mod, entry: str, source: str):
    if entry not in mod.functions:
        raise DplError(f"'{source}' has no function '{entry}' (it has: {', '.join(mod.functions)})")
    return mod[entry]


def symbolic_dims(fn) -> list[str]:
    """The symbolic dimension names of ``fn``'s parameters, in first-seen order."""
    from dpl.backends.registry import leaf_types

    names: dict[str, None] = {}
    for p in fn.params:
        for t in leaf_types(p.ty):
            names.update((d, None) for d in t.shape if isinstance(d, str))
    return list(names)


def parse_dims(items: Iterable[str], fn) -> dict[str, int]:
    """``--dim NAME=SIZE`` options as a dict; a name ``fn`` has no dimension of is an error."""
    known = symbolic_dims(fn)
    dims: dict[str, int] = {}
    for text in items:
        name, _, value = text.partition("=")
        if not name or not value.isdigit() or len(value) > 18:
            raise DplError(f"--dim takes NAME=SIZE, got '{text}'")
        if name not in known:
            have = f"its symbolic dimensions are {', '.join(known)}" if known else "it has no symbolic dimensions"
            raise DplError(f"--dim {text}: function '{fn.name}' has no dimension '{name}' ({have})")
        dims[name] = int(value)
    return dims


def random_inputs(fn, seed: int = 0, dims: dict[str, int] | None = None, default_dim: int = 8):
    """Random arrays for a function's parameters (symbolic dims default to ``default_dim``);
    a tuple parameter gets a tuple of arrays."""
    from dpl import dtypes
    from dpl.backends.registry import leaf_types
    from dpl.ir.types import TensorType, TupleType

    rng = np.random.default_rng(seed)
    dims = dict(dims or {})

    def array(t, name):
        shape = tuple(dims.setdefault(d, default_dim) if isinstance(d, str) else d for d in t.shape)
        try:
            TensorType(shape, t.dtype)  # with the dims bound: within dpl.limits' shape sizes
        except DplError as err:
            raise DplError(f"input '{name}': {err.message}") from None
        dtype = dtypes.to_numpy(t.dtype)
        try:
            if dtypes.is_float_numpy(dtype):
                return rng.standard_normal(shape).astype(dtype)
            if dtype.kind == "b":
                return rng.random(shape) < 0.5
            return rng.integers(0, 4, shape).astype(dtype)
        except MemoryError:
            raise DplError(f"not enough memory for a random input '{name}' of shape {list(shape)}",
                           hint="give smaller sizes with --dim") from None

    arrays = []
    for p in fn.params:
        leaves = [array(t, p.name) for t in leaf_types(p.ty)]
        arrays.append(tuple(leaves) if isinstance(p.ty, TupleType) else leaves[0])
    return arrays


def write_module(mod, output: str | None) -> None:
    """The module's text on stdout (``output`` None or ``-``), or ``dpl.save`` into ``output``:
    the text plus the ``.npz`` sidecar of constants too large to print, so ``dpl run`` reads it back."""
    if output in (None, STDIN):
        sys.stdout.write(mod.script())
        return
    from dpl.ir.serialize import save, sidecar

    try:
        save(mod, output)
    except OSError as err:
        raise DplError(f"cannot write '{output}': {err.strerror}") from None
    extra = f" and {sidecar(output)}" if os.path.exists(sidecar(output)) else ""
    log.info("wrote %s%s", output, extra)


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, default=_jsonable)
    sys.stdout.write("\n")


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (tuple, set)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def target_arg(text: str):
    """``--target``: a backend name, or several separated by commas (tried in order)."""
    parts = [t.strip() for t in text.split(",") if t.strip()]
    if not parts:
        raise DplError(f"--target takes a backend name or a comma-separated list, got '{text}'")
    return parts[0] if len(parts) == 1 else parts


def add_patterns_option(parser) -> None:
    """``-p/--patterns``, the same for every command that fuses."""
    parser.add_argument("--patterns", "-p", action="append", default=[], metavar="P",
                        help="a .dpl file or a shipped or installed library (cublas, llm, rewrites); repeat it: rules "
                             "run by priority, then in the order given, and a rule named like an earlier one is left out")
