"""The ``.dpl`` pattern language: grammar (grammar/dpl.lark), parser, compiler.

    patterns = dpl.load_patterns("cublas")               # a shipped library, by name
    patterns = dpl.load_patterns(["my.dpl", "cublas"])   # files and libraries, in priority order
    patterns = dpl.parse_patterns(text, "inline.dpl")    # text
    mod = patterns.apply_rewrites(mod)                   # the rewrite rules, to a fixed point

Both return a :class:`dpl.pattern.PatternSet`; ``load_rules`` / ``parse_rules`` give the
compiled rules themselves (names, docs, ops, spans) for tools such as ``dpl check``.
"""

from __future__ import annotations

import os
from typing import Iterable, Sequence

from dpl.errors import DplError
from dpl.lang.compiler import CompiledFile, DplErrors, LangError, Rule, compile_file, pattern_set
from dpl.pattern.fusion import PatternSet
from dpl.lang.hooks import check_hook
from dpl.lang.parser import DplSyntaxError, parse_file
from dpl.lang.sources import PatternFileError, read, resolve_import, shipped_libraries


def parse_rules(text: str, filename: str = "<string>", search_path: Sequence[str] = ()) -> tuple[Rule, ...]:
    """Compile ``.dpl`` text; every error of the text (and of what it imports) is reported together.
    Imports resolve inside the file's directory tree, then inside ``search_path``'s directories."""
    return compile_file(parse_file(text, filename), _resolver(tuple(search_path))).rules


def _resolver(search_path: tuple[str, ...]):
    def resolve(decl, importer: str):
        text, filename = resolve_import(decl, importer, search_path)
        return filename, parse_file(text, filename)

    return resolve


def load_rules(sources: str | Sequence[str], search_path: Sequence[str] = ()) -> tuple[Rule, ...]:
    """Rules of one or several files/libraries, in the order given (that order is priority)."""
    if isinstance(sources, (str, os.PathLike)):
        sources = [os.fspath(sources)]
    rules: list[Rule] = []
    errors: list[DplError] = []
    for source in sources:
        text, filename = read(os.fspath(source))
        try:
            rules.extend(parse_rules(text, filename, search_path))
        except DplErrors as err:
            errors.extend(err.errors)
        except DplError as err:
            errors.append(err)
    if errors:
        raise errors[0] if len(errors) == 1 else DplErrors(errors)
    return tuple(rules)


def parse_patterns(text: str, filename: str = "<string>", search_path: Sequence[str] = ()) -> PatternSet:
    return pattern_set(parse_rules(text, filename, search_path))


def load_patterns(sources: str | Sequence[str], search_path: Sequence[str] = ()) -> PatternSet:
    return pattern_set(load_rules(sources, search_path))


__all__ = [
    "PatternSet", "load_patterns", "parse_patterns",
    "CompiledFile", "DplErrors", "DplSyntaxError", "LangError", "PatternFileError", "Rule", "check_hook",
    "load_rules", "parse_rules", "shipped_libraries",
]
