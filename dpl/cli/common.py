"""What the ``dpl`` subcommands share: reading a module (``-`` is stdin), ``--dim`` sizes checked
against the function, random inputs, writing a module with its ``.npz`` sidecar, JSON output,
and a did-you-mean for a misspelt pattern library or target before any work is done."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import logging
import os
import sys
from typing import Any, Iterable, Iterator

import numpy as np

from dpl.errors import DplError

log = logging.getLogger(__name__)

STDIN = "-"


def load_module(path: str):
    """The module in ``path`` by its suffix (:func:`dpl.frontend.load_model`); ``-`` reads the
    text form, or an ONNX model's bytes, from stdin. A module with no function is an error:
    every command would otherwise do nothing and say nothing."""
    mod = _read_module(path)
    if not mod.functions:
        from dpl.errors import Span

        raise DplError("empty module: no function", Span("<stdin>" if path == STDIN else path, 1, 1),
                       hint="a module defines at least one function: func main(...) -> ... { ... }")
    return mod


def _read_module(path: str):
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


def dim_arg(text: str) -> tuple[str, int]:
    """``--dim NAME=SIZE`` as argparse reads it: bad syntax is a usage error (exit 2)."""
    name, _, value = text.partition("=")
    if not name or not (value.isascii() and value.isdigit()) or len(value) > 18:
        raise argparse.ArgumentTypeError(f"takes NAME=SIZE, SIZE a whole number, got '{text}'")
    return name, int(value)


def parse_dims(items: Iterable[tuple[str, int]], fn) -> dict[str, int]:
    """``--dim`` options (:func:`dim_arg` pairs) as a dict; a name ``fn`` has no dimension of is an error."""
    known = symbolic_dims(fn)
    dims: dict[str, int] = {}
    for name, value in items:
        if name not in known:
            have = f"its symbolic dimensions are {', '.join(known)}" if known else "it has no symbolic dimensions"
            raise DplError(f"--dim {name}={value}: function '{fn.name}' has no dimension '{name}' ({have})")
        dims[name] = value
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


@contextlib.contextmanager
def each_warning_once() -> Iterator[None]:
    """Within a command, a warning logged again (the target's up-front warning, said by the
    command before any work and by the build; one per Executable a command builds) is shown
    once on stderr."""
    seen: set[str] = set()

    def first_time(record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        message = record.getMessage()
        if message in seen:
            return False
        seen.add(message)
        return True

    handlers = list(logging.getLogger("dpl").handlers)
    for h in handlers:
        h.addFilter(first_time)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(first_time)


def early_target_check(target, strict: bool) -> None:
    """Say before any work that the target's first backend is unavailable, and what runs
    instead, in the words the build uses (``--strict``: an error, exit 1)."""
    from dpl.runtime import check_target

    note = check_target(target, strict=strict)
    if note is not None:
        logging.getLogger("dpl.runtime.executable").warning("%s", note)  # as the build says it: shown once


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


def check_names(patterns: Iterable[str] = (), target: str | None = None) -> None:
    """Fail fast on a pattern library or target name that does not exist, with the closest
    names as a hint (the error itself is the library's or the backend registry's)."""
    from dpl.lang import library_names, shipped_libraries
    from dpl.lang.sources import library

    for name in patterns:
        if name == STDIN or name.endswith(".dpl") or "/" in name or os.sep in name or not name.isidentifier():
            continue  # a file: read_source says what is wrong with it
        if name in shipped_libraries():
            continue
        try:
            library(name)  # an installed one reads; a misspelt one raises the loader's own error
        except DplError as err:
            raise _suggest(err, name, library_names()) from None
    if target is None:
        return
    from dpl.backends.registry import TARGETS, BackendError, backends, resolve_target

    try:
        resolve_target(target)
    except BackendError as err:
        known = [*TARGETS, *backends()]
        unknown = [n.strip() for n in target.split(",") if n.strip() and n.strip() not in known]
        raise (_suggest(err, unknown[0], known) if unknown else err) from None


def _suggest(err: DplError, name: str, choices: Iterable[str]) -> DplError:
    close = difflib.get_close_matches(name, list(dict.fromkeys(choices)), n=3)
    if close:
        guess = f"did you mean {', '.join(repr(c) for c in close)}?"
        err.hint = f"{guess} ({err.hint})" if err.hint else guess
    return err


def module_parser(sub, name: str, help: str, *, runtime: bool = True) -> argparse.ArgumentParser:
    """The subcommand ``name`` over one model file and the rules given with -p; with ``runtime``,
    the options that say which target's runtime decisions to show."""
    p = sub.add_parser(name, help=help)
    p.add_argument("file")
    add_patterns_option(p)
    if runtime:
        runtime_options(p)
    return p


def dims_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dim", action="append", default=[], type=dim_arg, metavar="NAME=SIZE",
                   help="size of a symbolic dimension for the runtime decisions (default 8)")


def runtime_options(p: argparse.ArgumentParser) -> None:
    dims_option(p)
    p.add_argument("--target", default="cpu", help="the build target whose backends and heuristics decide (default cpu)")
    p.add_argument("--profile", metavar="FILE", help="a profile written by `dpl profile`, for the heuristics' stage two")


def fusion_config(args):
    from dpl.runtime.config import FusionConfig

    return FusionConfig(profile_path=args.profile) if args.profile else None


def applied(args):
    """(module, trace) after dpl.apply of the file with the given patterns."""
    from dpl.apply import apply
    from dpl.trace import Trace

    mod = load_module(args.file)
    trace = Trace()
    apply(mod, args.patterns or (), trace=trace)
    return mod, trace
