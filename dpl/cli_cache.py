"""``dpl cache info|clear``: dpl's on-disk caches (``dpl.cache_dir``) — where they are, how
many entries and bytes they hold against their cap, and emptying them."""

from __future__ import annotations

from pathlib import Path

from dpl.cache_dir import private_dir, store_dir, user_cache_root

STORES = ("kernels", "cuda-twin")  # libraries (dpl.runtime.disk_cache); "parsers" holds Lark's tables


def add_cache_command(sub) -> None:
    p = sub.add_parser("cache", help="show or empty dpl's on-disk caches (compiled kernels, parse tables)")
    actions = p.add_subparsers(dest="action", required=True, metavar="{info,clear}")
    for name, text in (("info", "print where the caches are, their entries, size and cap"),
                       ("clear", "remove every cached kernel and parse table")):
        q = actions.add_parser(name, help=text)
        q.add_argument("--dir", metavar="DIR", help="a kernel cache directory given to CpuBackend(cache_dir=...) "
                                                    "instead of the user cache")
        q.set_defaults(func=cmd_cache)


def _stores(directory: str | None):
    from dpl.runtime.disk_cache import LibraryCache

    if directory is not None:
        return [("kernels", LibraryCache(directory))]
    return [(name, LibraryCache(store_dir(name))) for name in STORES]


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _parser_tables(directory: str | None) -> list[Path]:
    if directory is not None:
        return []
    folder = private_dir(store_dir("parsers"), "parsers")
    return [p for p in folder.iterdir() if p.suffix in (".lark", ".sha256")]


def cmd_cache(args) -> int:
    stores = _stores(args.dir)
    if args.action == "clear":
        for name, store in stores:
            print(f"{name}: removed {store.clear()} entries from {store.directory}")
        tables = _parser_tables(args.dir)
        for p in tables:
            p.unlink(missing_ok=True)
        if args.dir is None:
            print(f"parsers: removed {sum(p.suffix == '.lark' for p in tables)} parse tables")
        return 0
    print(f"location: {args.dir or user_cache_root()}")
    for name, store in stores:
        info = store.info()
        building = f", {info.builds_in_progress} build(s) in progress" if info.builds_in_progress else ""
        print(f"{name}: {info.directory}: {info.entries} entries, {_size(info.bytes)} of a {_size(info.max_bytes)} cap{building}")
    tables = _parser_tables(args.dir)
    if args.dir is None:
        print(f"parsers: {sum(p.suffix == '.lark' for p in tables)} parse tables, {_size(sum(p.stat().st_size for p in tables))}")
    return 0
