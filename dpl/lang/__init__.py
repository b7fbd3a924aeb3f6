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
from typing import Sequence

from dpl.errors import DplError
from dpl.lang.compiler import CompiledFile, DplErrors, LangError, Rule, compile_file, pattern_set
from dpl.pattern.fusion import PatternSet
from dpl.lang.hooks import check_hook
from dpl.lang.libraries import library_names, shipped_libraries
from dpl.lang.parser import DplSyntaxError, parse_file
from dpl.lang.sources import PatternFileError, read, resolve_import


_log = logging.getLogger(__name__)


def parse_rules(text: str, filename: str = "<string>", search_path: Sequence[str] = ()) -> tuple[Rule, ...]:
    """Compile ``.dpl`` text; every error of the text (and of what it imports) is reported together.
    A quoted import resolves inside the file's directory tree, then inside ``search_path``'s
    directories (see :mod:`dpl.lang.sources`)."""
    return compile_file(parse_file(text, filename), _resolver(tuple(search_path))).rules


def _resolver(search_path: tuple[str, ...]):
    def resolve(decl, importer: str):
        text, filename = resolve_import(decl, importer, search_path)
        return filename, parse_file(text, filename)

    return resolve


def load_rules(sources: str | Sequence[str], search_path: Sequence[str] = ()) -> tuple[Rule, ...]:
    """Rules of one or several files/libraries, in the order given (that order is priority;
    a rule's ``priority N`` moves it ahead of every rule of a lower number, whichever file).
    A rule named like one of an earlier file is left out with a logged note: the earlier one
    wins (:func:`shadowed_rules` lists such pairs, as ``dpl check`` reports them)."""
    rules, shadowed = _load(sources, search_path)
    for dropped, kept in shadowed:
        _log.warning("%s: %s '%s' is shadowed by the earlier one at %s; the earlier one wins",
                     dropped.span, dropped.kind, dropped.name, kept.span)
    return rules


def shadowed_rules(sources: str | Sequence[str], search_path: Sequence[str] = ()) -> list[tuple[Rule, Rule]]:
    """(left-out rule, the earlier rule of that name) for every name defined by two of the
    files given."""
    return _load(sources, search_path)[1]


def _load(sources, search_path: Sequence[str] = ()) -> tuple[tuple[Rule, ...], list[tuple[Rule, Rule]]]:
    if isinstance(sources, (str, os.PathLike)):
        sources = [os.fspath(sources)]
    rules: list[Rule] = []
    shadowed: list[tuple[Rule, Rule]] = []
    by_name: dict[str, Rule] = {}
    errors: list[DplError] = []
    for source in sources:
        text, filename = read(os.fspath(source))
        try:
            compiled = parse_rules(text, filename, search_path)
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
    # ``priority N`` orders across the files too (stable: file order among equals), so a
    # library can put a composite ahead of another library's (cublas' epilogue over kernel.gelu)
    rules.sort(key=lambda r: -r.priority)
    return tuple(rules), shadowed


def parse_patterns(text: str, filename: str = "<string>", search_path: Sequence[str] = ()) -> PatternSet:
    return pattern_set(parse_rules(text, filename, search_path))


def load_patterns(sources: str | Sequence[str], search_path: Sequence[str] = ()) -> PatternSet:
    return pattern_set(load_rules(sources, search_path))


__all__ = [
    "PatternSet", "load_patterns", "parse_patterns",
    "CompiledFile", "DplErrors", "DplSyntaxError", "LangError", "PatternFileError", "Rule", "check_hook",
    "library_names", "load_rules", "parse_rules", "shadowed_rules", "shipped_libraries",
]
