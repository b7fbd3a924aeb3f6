"""Pattern libraries found by name: the ones dpl ships and the ones installed plugins declare.

A plugin declares its libraries in the entry-point group ``dpl.patterns``; each entry point
maps a library name to its ``.dpl`` file, either as a package holding ``<name>.dpl``
(``mylib = "dpl_mylib"``) or as an object that is the file (``mylib = "dpl_mylib:PATTERNS"``,
a path or an ``importlib.resources`` resource). So ``-p mylib``, ``dpl.apply(mod, ["mylib"])``
and ``dpl check mylib`` find it as they find ``cublas``. A shipped library of the same name
wins; the plugin's is not used (a warning says so).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from importlib import resources

from dpl.errors import DplError

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "dpl.patterns"


class LibraryError(DplError):
    """A library name that no one ships, or a plugin's library that cannot be read."""


def shipped_libraries() -> list[str]:
    return sorted(p.name[:-4] for p in resources.files("dpl.patterns").iterdir() if p.name.endswith(".dpl"))


def plugin_libraries() -> dict[str, importlib.metadata.EntryPoint]:
    """The libraries installed plugins declare, by name (shipped names left out)."""
    shipped = set(shipped_libraries())
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in shipped:
            log.warning("installed pattern library '%s' (%s) is not used: dpl ships a library of that name", ep.name, ep.value)
            continue
        if ep.name in found and found[ep.name].value != ep.value:
            log.warning("two installed pattern libraries are named '%s' (%s, %s); the first is used", ep.name, found[ep.name].value, ep.value)
            continue
        found.setdefault(ep.name, ep)
    return found


def library_names() -> list[str]:
    """Every library a name can select: shipped ones, then installed ones."""
    return [*shipped_libraries(), *sorted(plugin_libraries())]


def read_library(name: str) -> tuple[str, str]:
    """(text, filename) of the library called ``name``: shipped, else from a plugin."""
    entry = resources.files("dpl.patterns").joinpath(f"{name}.dpl")
    if entry.is_file():
        return entry.read_text(encoding="utf-8"), f"{name}.dpl"
    installed = plugin_libraries()
    if name not in installed:
        hint = f"shipped libraries: {', '.join(shipped_libraries())}" + (f"; installed: {', '.join(sorted(installed))}" if installed else "")
        raise LibraryError(f"no shipped or installed pattern library '{name}'", hint=hint)
    ep = installed[name]
    return _read_plugin_library(ep)


def _read_plugin_library(ep: importlib.metadata.EntryPoint) -> tuple[str, str]:
    try:
        if ep.attr is None:  # a package holding <name>.dpl
            resource = resources.files(ep.module).joinpath(f"{ep.name}.dpl")
        else:  # the file itself: a path or a resource
            resource = ep.load()
        if isinstance(resource, (str, os.PathLike)):
            with open(resource, encoding="utf-8") as f:
                return f.read(), os.fspath(resource)
        text = resource.read_text(encoding="utf-8")
    except Exception as err:  # a broken plugin is reported with its entry point, never a traceback
        raise LibraryError(f"installed pattern library '{ep.name}' ({ep.value}) cannot be read: {type(err).__name__}: {err}") from None
    # a library on disk is named by its path, so its errors point there and its imports resolve
    path = os.fspath(resource) if isinstance(resource, os.PathLike) else str(resource)
    return text, path if os.path.isfile(path) else f"{ep.name}.dpl"
