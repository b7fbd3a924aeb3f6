"""The ``.dpl`` pattern language: grammar (grammar/dpl.lark), parser, compiler.

    patterns = dpl.load_patterns("cublas")               # a shipped library, by name
    patterns = dpl.load_patterns(["my.dpl", "cublas"])   # files and libraries, in priority order
    patterns = dpl.parse_patterns(text, "inline.dpl")    # text
    mod = patterns.apply_rewrites(mod)                   # the rewrite rules, to a fixed point

Both return a :class:`dpl.pattern.PatternSet`; ``load_rules`` / ``parse_rules`` give the
compiled rules themselves (names, docs, ops, spans) for tools such as ``dpl check``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Iterable, Sequence

from dpl.errors import DplError
from dpl.lang.compiler import CompiledFile, DplErrors, LangError, Rule, compile_file, pattern_set
from dpl.pattern.fusion import PatternSet
from dpl.lang.hooks import check_hook
from dpl.lang.libraries import LibraryError, library_names, read_library, shipped_libraries
from dpl.lang.parser import DplSyntaxError, parse_file


_log = logging.getLogger(__name__)


class PatternFileError(DplError):
    """A pattern file or library that cannot be found or read."""


def parse_rules(text: str, filename: str = "<string>") -> tuple[Rule, ...]:
    """Compile ``.dpl`` text; every error of the text (and of what it imports) is reported together."""
    return compile_file(parse_file(text, filename), _resolve).rules


def _resolve(decl, importer: str):
    """(key, syntax tree) of an import: a quoted path relative to the importing file, or a
    library by name (shipped or installed)."""
    if decl.is_path:
        base = os.path.dirname(importer) if os.path.isfile(importer) else os.getcwd()
        source = os.path.normpath(os.path.join(base, decl.target))
    else:
        source = decl.target
    text, filename = _read(source)
    return filename, parse_file(text, filename)


def _read(source: str) -> tuple[str, str]:
    """(text, filename) of a path, of a library name such as ``"cublas"`` (shipped) or
    ``"mylib"`` (installed by a plugin in the entry-point group ``dpl.patterns``), or of stdin
    (``-``, as the command line names it)."""
    if source == "-":
        return sys.stdin.read(), "<stdin>"
    if source.endswith(".dpl") or os.sep in source or "/" in source:
        try:
            with open(source, encoding="utf-8") as f:
                return f.read(), source
        except FileNotFoundError:
            raise PatternFileError(f"pattern file '{source}' does not exist") from None
        except IsADirectoryError:
            raise PatternFileError(f"'{source}' is a directory, not a pattern file") from None
        except UnicodeDecodeError:
            raise PatternFileError(f"'{source}' is not a UTF-8 text file") from None
        except OSError as err:
            raise PatternFileError(f"cannot read '{source}': {err.strerror}") from None
    if not source.isidentifier():
        raise PatternFileError(f"'{source}' is neither a .dpl file nor a library name")
    try:
        return read_library(source)  # shipped, or installed by a plugin (dpl/lang/libraries.py)
    except LibraryError as err:
        raise PatternFileError(err.message, hint=err.hint) from None


def load_rules(sources: str | Sequence[str]) -> tuple[Rule, ...]:
    """Rules of one or several files/libraries, in the order given (that order is priority).
    A rule named like one of an earlier file is left out with a logged note: the earlier one
    wins (:func:`shadowed_rules` lists such pairs, as ``dpl check`` reports them)."""
    rules, shadowed = _load(sources)
    for dropped, kept in shadowed:
        _log.warning("%s: %s '%s' is shadowed by the earlier one at %s; the earlier one wins",
                     dropped.span, dropped.kind, dropped.name, kept.span)
    return rules


def shadowed_rules(sources: str | Sequence[str]) -> list[tuple[Rule, Rule]]:
    """(left-out rule, the earlier rule of that name) for every name defined by two of the
    files given."""
    return _load(sources)[1]


def _load(sources) -> tuple[tuple[Rule, ...], list[tuple[Rule, Rule]]]:
    if isinstance(sources, (str, os.PathLike)):
        sources = [os.fspath(sources)]
    rules: list[Rule] = []
    shadowed: list[tuple[Rule, Rule]] = []
    by_name: dict[str, Rule] = {}
    errors: list[DplError] = []
    for source in sources:
        text, filename = _read(os.fspath(source))
        try:
            compiled = parse_rules(text, filename)
        except DplErrors as err:
            errors.extend(err.errors)
            continue
        except DplError as err:
            errors.append(err)
            continue
        for rule in compiled:  # one file never defines a name twice (the compiler refuses)
            if rule.name in by_name:
                shadowed.append((rule, by_name[rule.name]))
                continue
            by_name[rule.name] = rule
            rules.append(rule)
    if errors:
        raise errors[0] if len(errors) == 1 else DplErrors(errors)
    return tuple(rules), shadowed


def parse_patterns(text: str, filename: str = "<string>") -> PatternSet:
    return pattern_set(parse_rules(text, filename))


def load_patterns(sources: str | Sequence[str]) -> PatternSet:
    return pattern_set(load_rules(sources))


__all__ = [
    "PatternSet", "load_patterns", "parse_patterns",
    "CompiledFile", "DplErrors", "DplSyntaxError", "LangError", "PatternFileError", "Rule", "check_hook",
    "library_names", "load_rules", "parse_rules", "shadowed_rules", "shipped_libraries",
]
