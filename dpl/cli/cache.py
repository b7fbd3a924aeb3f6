"""``dpl cache info|clear|reset-choices``: dpl's on-disk caches (``dpl.cache_dir``) — where they
are, how many entries and bytes they hold against their cap, and emptying them.

Every store dpl writes is covered: the libraries (``kernels``, ``cuda-twin``, and ``packaged``, the
kernels of loaded packages: ``dpl.runtime.disk_cache``), Lark's parse tables (``parsers``: ``dpl.syntax``) and the products
choices (``products``: ``dpl.backends.cpu.products_choice``, one file per CPU, core count and
library versions; ``info`` says what each chose, by which medians, when and on which CPU, and
which is this machine's). ``info`` only reads: it creates and removes nothing. ``clear`` removes
only what dpl wrote: entries whose manifests name them, and in the other stores files of their
exact names; anything else in a folder is left alone. ``reset-choices`` removes the products
choices alone (the next build measures again), the compiled kernels kept."""

from __future__ import annotations

import os
import re
from pathlib import Path

from dpl.cache_dir import store_dir, user_cache_root

STORES = ("kernels", "cuda-twin", "packaged")  # libraries (dpl.runtime.disk_cache; packaged: dpl.package)
# the stores of plain files, by the exact names dpl gives them: (name, pattern, counted, (what one is, what many are))
CHOICES = ("products", re.compile(r"[0-9a-f]{24}\.json"), ".json", ("products choice", "products choices"))
FILE_STORES = (
    ("parsers", re.compile(r"[a-z_]+-[0-9a-f]{32}\.(?:lark|sha256)"), ".lark", ("parse table", "parse tables")),
    CHOICES,
)


def add_cache_command(sub) -> None:
    p = sub.add_parser("cache", help="show or empty dpl's on-disk caches (compiled kernels, parse tables, products choices)")
    actions = p.add_subparsers(dest="action", required=True, metavar="{info,clear,reset-choices}")
    for name, text in (("info", "print where the caches are, their entries, size and cap (changes nothing)"),
                       ("clear", "remove every cached kernel, parse table and products choice dpl wrote")):
        q = actions.add_parser(name, help=text)
        q.add_argument("--dir", metavar="DIR", help="a kernel cache directory given to CpuBackend(cache_dir=...) "
                                                    "instead of the user cache")
        q.set_defaults(func=cmd_cache)
    q = actions.add_parser("reset-choices", help="remove the measured products choices only (the next build measures again)")
    q.set_defaults(func=cmd_cache, dir=None)


def _stores(directory: str | None):
    from dpl.runtime.disk_cache import LibraryCache

    if directory is not None:
        return [("kernels", LibraryCache(directory))]
    return [(name, LibraryCache(store_dir(name))) for name in STORES]


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _files(name: str, pattern: re.Pattern) -> list[Path]:
    """The files of the store ``name`` that dpl wrote (regular files of its exact names); a
    missing folder is not created."""
    try:
        with os.scandir(store_dir(name)) as listing:
            return [Path(e.path) for e in listing if pattern.fullmatch(e.name) and e.is_file(follow_symlinks=False)]
    except OSError:
        return []


def _bytes(files: list[Path]) -> int:
    total = 0
    for p in files:
        try:
            total += p.lstat().st_size
        except OSError:
            continue
    return total


def _products_choices(files: list[Path]) -> list[str]:
    """One line per kept products choice: what it chose, where it was measured, whether it is
    this machine's (the others are of another CPU or other library versions: never read here)."""
    from dpl.backends.cpu import products_choice

    here = products_choice.stored_here()
    lines = []
    for p in sorted(files, key=lambda p: (p.name != here, p.name)):
        m = products_choice.read_stored(p)
        whose = "this machine" if p.name == here else "another CPU or other library versions, unused here"
        if m is None:
            lines.append(f"  {p.name} ({whose}): unreadable; measured again when needed")
            continue
        when = f" at {m.when}" if m.when else ""
        measured = f"; measured{when} on {m.machine}" if m.machine else ""
        try:
            lines.append(f"  {p.name} ({whose}): {m.choice()}{measured}\n    {m.medians()}")
        except (TypeError, ValueError):  # a damaged file: times that are not numbers
            lines.append(f"  {p.name} ({whose}): unreadable; measured again when needed")
    return lines


def _remove_files(name: str, pattern: re.Pattern, counted: str, what: tuple[str, str]) -> str:
    """Remove the files of the store ``name`` that dpl wrote; what was removed, in words."""
    files = _files(name, pattern)
    for p in files:
        p.unlink(missing_ok=True)
    return f"{name}: removed {_count(sum(p.suffix == counted for p in files), *what)} from {store_dir(name)}"


def cmd_cache(args) -> int:
    if args.action == "reset-choices":
        print(_remove_files(*CHOICES))
        return 0
    stores = _stores(args.dir)
    if args.action == "clear":
        for name, store in stores:
            print(f"{name}: removed {_count(store.clear(), 'entry', 'entries')} from {store.where}")
        if args.dir is None:
            for store in FILE_STORES:
                print(_remove_files(*store))
        return 0
    print(f"location: {args.dir or user_cache_root()}")
    for name, store in stores:
        info = store.info()
        building = f", {_count(info.builds_in_progress, 'build', 'builds')} in progress" if info.builds_in_progress else ""
        print(f"{name}: {info.directory}: {_count(info.entries, 'entry', 'entries')}, {_size(info.bytes)} of a {_size(info.max_bytes)} cap{building}")
    if args.dir is None:
        for name, pattern, counted, what in FILE_STORES:
            files = _files(name, pattern)
            print(f"{name}: {store_dir(name)}: {_count(sum(p.suffix == counted for p in files), *what)}, {_size(_bytes(files))}")
            if name == "products":
                for line in _products_choices(files):
                    print(line)
    return 0
