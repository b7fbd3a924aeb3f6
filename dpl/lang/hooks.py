"""Named check hooks: the one way a pattern file reaches Python, by a name registered from Python.

    @dpl.check_hook("mybackend.ok")
    def ok(view) -> bool: ...        # view: dpl.lang.predicates.MatchView

A ``.dpl`` file says ``check mybackend.ok``; it never imports or executes code itself.
"""

from __future__ import annotations

from typing import Callable

from dpl.errors import DplError

_HOOKS: dict[str, Callable] = {}


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
