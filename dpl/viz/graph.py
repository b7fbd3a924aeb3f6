"""The picture's data: an entry function before and after ``dpl.apply`` as nodes and edges.

Before: one node per op (coloured by what finally claimed it; an op the rewrites replaced is
``rewritten``). After: one node per call in the entry function: a fused group is one box
listing its ops, coloured by what claimed it (``composite``, ``automatic``), ``fallback`` when
the runtime runs it op by op, ``alone`` for an op no group claimed. Edges carry the value's
type (shape and dtype). A node's ``detail`` is what a click shows: IR text, the pattern's
file:line, the runtime decision, the generated kernel source.
"""

from __future__ import annotations

from typing import Mapping

import attrs

from dpl.ir.expr import Call, Function, GlobalVar, Module, Tuple, TupleGetItem, Var
from dpl.ir.printer import print_module
from dpl.viz.coverage import Coverage, GroupCoverage, LoneOp

CLAIMS = ("composite", "automatic", "alone", "fallback", "rewritten", "input", "output", "repeat")


@attrs.frozen
class Node:
    id: str
    title: str  # the op, or the composite name / "automatic fusion"
    name: str  # the binding (or parameter) it defines
    claim: str  # one of CLAIMS
    lines: tuple[str, ...] = ()  # a group's ops, one "binding = op" a line
    detail: Mapping[str, str] = attrs.field(factory=dict)
    group: str = ""  # the composite (or op) that claimed it, for colours
    rewritten: bool = False  # an op of the input a rewrite replaced (drawn dashed)


@attrs.frozen
class Edge:
    src: str
    dst: str
    label: str  # the value's type, "f32[64, 128]"


@attrs.frozen
class View:
    title: str
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]


def _vars_read(e) -> list[Var]:
    out = []
    if isinstance(e, Var):
        out.append(e)
    elif isinstance(e, Call):
        for a in e.args:
            out += _vars_read(a)
    elif isinstance(e, Tuple):
        for f in e.fields:
            out += _vars_read(f)
    elif isinstance(e, TupleGetItem):
        out += _vars_read(e.tuple_value)
    return out


def _op_text(e) -> str:
    if isinstance(e, Call):
        return e.op if isinstance(e.op, str) else e.op.name
    return type(e).__name__.lower()


def _edges_into(fn: Function, node_of: dict[int, str], dst: str, value, seen: set) -> list[Edge]:
    out = []
    for v in _vars_read(value):
        src = node_of.get(id(v))
        if src is None or (src, dst, str(v.ty)) in seen:
            continue
        seen.add((src, dst, str(v.ty)))
        out.append(Edge(src, dst, str(v.ty)))
    return out


def _params(fn: Function, prefix: str, node_of: dict[int, str]) -> list[Node]:
    nodes = []
    for p in fn.params:
        nid = f"{prefix}p:{p.name}"
        node_of[id(p)] = nid
        nodes.append(Node(nid, p.name, p.name, "input", (str(p.ty),)))
    return nodes


def _output(fn: Function, prefix: str, node_of, seen) -> tuple[Node, list[Edge]]:
    nid = f"{prefix}return"
    return Node(nid, "return", "return", "output", (str(fn.ret.ty),)), _edges_into(fn, node_of, nid, fn.ret, seen)


def before_view(fn: Function, claims: Mapping[str, tuple[str, str]], kept: set[str] | frozenset = frozenset(),
                title: str = "before apply") -> View:
    """Every op of ``fn`` a node, coloured by ``claims`` (binding name -> (claim, by what),
    from :func:`claims_by_binding`); an op whose binding is not in ``kept`` (the bindings
    after the rewrites) is marked as rewritten."""
    node_of: dict[int, str] = {}
    nodes = _params(fn, "b:", node_of)
    edges: list[Edge] = []
    seen: set = set()
    for b in fn.bindings:
        nid = f"b:{b.var.name}"
        if isinstance(b.value, (Var, TupleGetItem)):  # an alias or a tuple item: no op of its own
            src = _vars_read(b.value)
            if src and id(src[0]) in node_of:
                node_of[id(b.var)] = node_of[id(src[0])]
                continue
        node_of[id(b.var)] = nid
        text = f"{b.var.name} = {_op_text(b.value)}  : {b.var.ty}"
        claim, by = claims.get(b.var.name, ("rewritten", ""))
        detail = {"ir": text, "claimed by": by}
        if kept and b.var.name not in kept:
            detail["rewritten"] = "a rewrite replaced this op (see the rewrites applied)"
        nodes.append(Node(nid, _op_text(b.value), b.var.name, claim, detail=detail, group=by,
                          rewritten=bool(kept) and b.var.name not in kept))
        edges += _edges_into(fn, node_of, nid, b.value, seen)
    out, out_edges = _output(fn, "b:", node_of, seen)
    return View(title, tuple(nodes + [out]), tuple(edges + out_edges))


def after_view(mod: Module, fn: Function, cov: Coverage, sources: Mapping[str, str] | None = None,
               title: str = "after apply") -> View:
    """Every call of ``fn`` (an entry of the applied module) a node: groups as boxes."""
    fc = cov[fn.name]
    groups = {g.bindings[0]: g for g in fc.groups}
    alone = {a.binding: a for a in fc.alone}
    sources = sources or {}
    node_of: dict[int, str] = {}
    nodes = _params(fn, "a:", node_of)
    edges: list[Edge] = []
    seen: set = set()
    for b in fn.bindings:
        v = b.value
        if isinstance(v, (Var, TupleGetItem)):
            src = _vars_read(v)
            if src and id(src[0]) in node_of:
                node_of[id(b.var)] = node_of[id(src[0])]
                continue
        nid = f"a:{b.var.name}"
        node_of[id(b.var)] = nid
        if b.var.name in groups:
            nodes.append(_group_node(mod, nid, groups[b.var.name], sources))
        else:
            nodes.append(_op_node(nid, b, alone.get(b.var.name)))
        edges += _edges_into(fn, node_of, nid, v, seen)
    # edges leave a group through its tuple items: label them with the item's type
    out, out_edges = _output(fn, "a:", node_of, seen)
    return View(title, tuple(nodes + [out]), tuple(edges + out_edges))


def _group_node(mod: Module, nid: str, g: GroupCoverage, sources: Mapping[str, str]) -> Node:
    callee = mod[g.function]
    inner = _innermost(mod, callee)
    lines = tuple(f"{b.var.name} = {_op_text(b.value)}" for b in inner.bindings if isinstance(b.value, Call))
    claim = g.claim
    if g.runtime is not None and not g.runtime.fused:
        claim = "fallback"
    names = [g.function] + ([inner.name] if inner is not callee else [])
    detail = {
        "ir": print_module(Module([mod[n] for n in names])),
        "claimed by": (f"composite {g.composite}" if g.claim == "composite" else "automatic fusion (FuseOps)"),
        "pattern": g.origin or ("" if g.claim == "composite" else "none: FuseOps grouped it"),
        "runtime": _runtime_text(g),
        "kernel source": sources.get(g.function, ""),
    }
    return Node(nid, g.label, g.function, claim, lines, detail, group=g.label)


def _runtime_text(g: GroupCoverage) -> str:
    if g.runtime is None:
        return ""
    how = "one fused kernel" if g.runtime.fused else "op by op"
    return f"{how} on {g.runtime.backend or 'nothing'}: {g.runtime.why}"


def _op_node(nid: str, b, lone: LoneOp | None) -> Node:
    detail = {"ir": f"{b.var.name} = {_op_text(b.value)}  : {b.var.ty}"}
    if lone is not None:
        detail["why alone"] = lone.detail
    claim = "alone" if isinstance(b.value, Call) and isinstance(b.value.op, str) else "input"
    return Node(nid, _op_text(b.value), b.var.name, claim, (), detail)


def _innermost(mod: Module, fn: Function) -> Function:
    """A Codegen wrapper's composite; otherwise ``fn``."""
    if "Codegen" in fn.attrs:
        for b in fn.bindings:
            if isinstance(b.value, Call) and isinstance(b.value.op, GlobalVar) and b.value.op.name in mod.functions:
                return mod[b.value.op.name]
    return fn


def claims_by_binding(mod: Module, fn: Function, cov: Coverage, before: Function) -> dict[str, tuple[str, str]]:
    """binding name of ``before`` -> (claim, the composite or op that claimed it). Each group
    (and each op alone) of the applied ``fn`` claims what lies between its results and its
    operands in ``before``: walking back from its results, stopping at its operands, so ops a
    rewrite replaced are claimed by what took their place."""
    reads = {b.var.name: [v.name for v in _vars_read(b.value)] for b in before.bindings}
    params = {p.name for p in before.params}
    groups = {g.bindings[0]: g for g in cov[fn.name].groups}
    alone = {a.binding for a in cov[fn.name].alone}
    out: dict[str, tuple[str, str]] = {}
    for b in fn.bindings:
        name = b.var.name
        if name in groups:
            g = groups[name]
            claim = ("fallback" if g.runtime is not None and not g.runtime.fused else g.claim, g.label)
            results = list(g.bindings)
        elif name in alone:
            claim, results = ("alone", _op_text(b.value)), [name]
        else:
            continue
        stop = {v.name for v in _vars_read(b.value)} | params
        stack = [r for r in results if r in reads]
        while stack:
            cur = stack.pop()
            if cur in out or cur in stop or cur not in reads:
                continue
            out[cur] = claim
            stack.extend(reads[cur])
    return out


def _signature(node: Node) -> tuple:
    """What a node does, names aside: layers of a model look alike by this."""
    ops = tuple(line.split(" = ", 1)[-1] for line in node.lines)
    return (node.claim, node.title, ops)


def find_repeat(signatures: list[tuple], limit: int = 3000, min_saved: int = 8) -> tuple[int, int, int] | None:
    """(start, period, count) of the run of a block repeated back to back (count >= 2) that
    hides the most nodes; None when no run hides ``min_saved`` nodes. For each period, one
    pass marks where the sequence equals itself shifted by the period: a stretch of ``r``
    such marks is a block repeated ``r // period + 1`` times."""
    n = len(signatures)
    if n > limit:
        return None
    best, best_saved = None, min_saved - 1
    for period in range(1, n // 2 + 1):
        run = 0
        for i in range(n - period):
            run = run + 1 if signatures[i] == signatures[i + period] else 0
            if run >= period:
                count = run // period + 1
                saved = period * (count - 1)
                if saved > best_saved:
                    best, best_saved = (i - run + 1, period, count), saved
    return best


def collapse_repeats(view: View) -> View | None:
    """``view`` with a run of repeated layers drawn once, the repeats after the first as one
    box; None when nothing repeats."""
    body = [node for node in view.nodes if node.claim not in ("input", "output")]
    found = find_repeat([_signature(node) for node in body])
    if found is None:
        return None
    start, period, count = found
    hidden = {node.id for node in body[start + period:start + period * count]}
    readers: dict[str, set[str]] = {}
    for e in view.edges:
        readers.setdefault(e.src, set()).add(e.dst)
    # the inputs (weights) only the collapsed layers read go with them
    hidden |= {node.id for node in view.nodes if node.claim == "input" and readers.get(node.id) and readers[node.id] <= hidden}
    first = body[start:start + period]
    nid = f"{body[start + period].id}:repeats"
    names = f"{body[start + period].name} .. {body[start + period * count - 1].name}"
    placeholder = Node(nid, f"x{count - 1} more like the layer above", names, "repeat",
                       (f"{period} box{'es' if period != 1 else ''} each ({first[0].name} .. {first[-1].name} is the first)",),
                       {"repeated layers": f"{count} layers of {period} box{'es' if period != 1 else ''} each are alike (same ops, same claims); "
                                           f"the {count - 1} after the first are collapsed: {names}. "
                                           "Untick 'collapse repeated layers' to see them all."})
    nodes, placed = [], False
    for node in view.nodes:
        if node.id in hidden:
            if not placed and node.claim != "input":
                nodes.append(placeholder)
                placed = True
            continue
        nodes.append(node)
    edges, seen = [], set()
    for e in view.edges:
        src = nid if e.src in hidden else e.src
        dst = nid if e.dst in hidden else e.dst
        if src == dst or (src, dst) in seen:
            continue
        seen.add((src, dst))
        edges.append(Edge(src, dst, e.label))
    return View(view.title + f" ({count} repeated layers collapsed)", tuple(nodes), tuple(edges))
