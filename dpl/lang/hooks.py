"""Named check hooks: the one way a pattern file reaches Python, by a name registered from Python.

    @dpl.check_hook("mybackend.ok")
    def ok(view) -> bool: ...        # view: dpl.lang.predicates.MatchView

A ``.dpl`` file says ``check mybackend.ok``; it never imports or executes code itself.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from dpl.errors import DplError, Span
from dpl.limits import excerpt
from dpl.pattern.match import Match, NoMatch

_HOOKS: dict[str, Callable] = {}


class CheckHookError(DplError):
    """A check hook that raised, or answered something other than a bool or a Match/NoMatch."""


def check_hook(name: str, *, replace: bool = False) -> Callable[[Callable], Callable]:
    """Register ``fn`` as the check hook ``name`` (a hook may return a bool or a Match/NoMatch)."""

    def register(fn: Callable) -> Callable:
        if name in _HOOKS and not replace:
            raise DplError(f"check hook '{name}' is already registered", hint="pass replace=True to override it")
        _HOOKS[name] = fn
        return fn

    return register


def lookup_hook(name: str) -> Callable | None:
    return _HOOKS.get(name)


def unregister_hook(name: str) -> None:
    _HOOKS.pop(name, None)


def ask_hook(name: str, hook: Callable, view, rule: str, span: Span | None) -> bool | Match | NoMatch:
    """``hook(view)``, its answer checked: an exception it raises, or an answer without a plain
    truth value (a NumPy array, None), becomes a :class:`CheckHookError` naming the hook and the
    rule, at the rule's ``span``. A hook is user code: its failure must not look like dpl's."""
    try:
        answer = hook(view)
    except Exception as err:  # noqa: BLE001 (any failure of user code is reported, located)
        raise CheckHookError(f"check hook '{name}' of rule '{rule}' raised {type(err).__name__}: {excerpt(str(err), 300)}",
                             span, hint="a check hook must not raise: return False (or a NoMatch with a reason) to refuse a match") from err
    if isinstance(answer, (bool, np.bool_, Match, NoMatch)):
        return answer
    raise CheckHookError(f"check hook '{name}' of rule '{rule}' returned {_kind(answer)}, not a bool or a Match/NoMatch", span,
                         hint="return a bool: for an array, say which with .all() or .any()")


def _kind(answer) -> str:
    if isinstance(answer, np.ndarray):
        return f"a NumPy array of shape {answer.shape}"
    return "None" if answer is None else f"a value of type {type(answer).__name__}"
