"""Imports run one way down the layers: no module of dpl imports, even inside a function, a
module that imports it back (docs/architecture.md). A circle is broken by moving the shared
piece down a layer, not by hiding the import in a function, so every import counts."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"dpl": "dpl", "dpl.backends": "backends", "dpl.grammar": "grammar", "dpl.patterns": "patterns"}


def modules() -> dict[str, Path]:
    found = {}
    for pkg, folder in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((pkg, *parts))] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of dpl that ``name`` imports anywhere (TYPE_CHECKING blocks aside)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test)
                   for n in ast.walk(node)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            submodules = {f"{base}.{a.name}" for a in node.names} & known
            out.update(submodules or {base})
    return (out & known) - {name}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each set of modules that reach one another (a strongly connected component of size > 1)."""
    reach = {}
    for start in graph:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        reach[start] = seen
    found = []
    for m in sorted(graph):
        if m in reach[m] and not any(m in c for c in found):
            found.append(sorted(x for x in reach[m] if m in reach[x]))
    return found


def test_no_import_circles():
    mods = modules()
    graph = {name: imports(name, path, set(mods)) for name, path in mods.items()}
    assert len(graph) > 100, "the walk found too few modules to mean anything"
    assert circles(graph) == []


def test_the_walk_sees_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    known = {"dpl.x", "dpl.y"}
    source = ROOT / "tests" / "_import_probe.py"
    try:  # an import inside a function counts, a TYPE_CHECKING one does not
        source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import dpl.y\n\ndef f():\n    from dpl import x\n")
        assert imports("dpl.z", source, known) == {"dpl.x"}
    finally:
        source.unlink()
