"""What the torch.compile backend did with each graph dynamo gave it: its partitions, which ran
in dpl (how many ATen ops, which composites the patterns made) and which stayed in torch, and
why. ``dpl.compile(model).dpl_report`` holds the graphs of that model,
:func:`dpl.frontend.dynamo.reports` every graph the backend compiled in this process.

A record is live: a partition that fails at run time (an input size dpl cannot plan) or whose
weights changed since its build goes to torch for good, and its record says so from then on.

To see inside a partition, :meth:`Report.save` writes the text and each translated partition's
dpl module (``graph0_dpl_0.ir``, weights in its ``.npz`` sidecar), which ``dpl viz FILE -o
OUT.html`` draws before and after fusion and ``dpl build``/``dpl run`` take as any module.
"""

from __future__ import annotations

import os
from collections import Counter

import attrs


@attrs.define
class PartitionRecord:
    """One piece of a graph: ``runs`` is ``"dpl"`` or ``"torch"``; ``ops`` the ATen ops by
    name and count; ``why`` the reason a torch piece is not dpl's (empty for a dpl one)."""

    name: str
    runs: str
    ops: dict[str, int]
    why: str = ""
    composites: dict[str, int] = attrs.field(factory=dict)
    calls: int = 0  # calls dpl ran (a generate's decode steps each call the decode graph's partitions)
    in_place: int = 0  # inputs its last call updated in their own memory (a static cache's layers), not copied back
    module: object = attrs.field(default=None, repr=False, eq=False)  # the dpl Module it was translated to, if it was

    @property
    def op_count(self) -> int:
        return sum(self.ops.values())

    def to_torch(self, why: str) -> None:
        """The partition runs in torch from now on (a failure at run time)."""
        self.runs, self.why = "torch", why

    def line(self) -> str:
        ops = ", ".join(f"{name.removeprefix('aten.')} x{n}" if n > 1 else name.removeprefix("aten.")
                        for name, n in sorted(self.ops.items(), key=lambda item: (-item[1], item[0])))
        if self.runs == "dpl":
            made = ", ".join(f"{c} x{n}" if n > 1 else c for c, n in sorted(self.composites.items()))
            written = f", {self.in_place} inputs updated in place" if self.in_place else ""
            return f"{self.name}: dpl, {self.op_count} ops" + (f", composites {made}" if made else "") + written + f" ({ops})"
        return f"{self.name}: torch, {self.op_count} ops ({ops}): {self.why}"


@attrs.define
class GraphRecord:
    """One graph dynamo captured (a model without graph breaks has one per input signature
    and grad mode). ``note`` says why the whole graph ran in torch, where it did."""

    index: int
    inputs: str
    parts: list[PartitionRecord] = attrs.field(factory=list)
    note: str = ""

    def ops(self, runs: str) -> int:
        return sum(p.op_count for p in self.parts if p.runs == runs)

    def in_torch(self) -> dict[str, str]:
        """The ops that run in torch, each with the reason (the first one met)."""
        out: dict[str, str] = {}
        for part in self.parts:
            if part.runs == "torch":
                for op in part.ops:
                    out.setdefault(op, part.why)
        return out

    def headline(self) -> str:
        if self.note:
            return f"graph {self.index} ({self.inputs}): all in torch: {self.note}"
        calls = sum(1 for p in self.parts if p.runs == "dpl")
        return (f"graph {self.index} ({self.inputs}): {self.ops('dpl')} ops in dpl ({calls} call{'s' if calls != 1 else ''}), "
                f"{self.ops('torch')} in torch")

    def text(self) -> str:
        return "\n".join([self.headline(), *(f"  {p.line()}" for p in self.parts)])


@attrs.define
class Report:
    """The graphs of one compiled model (or of the whole process), in the order compiled."""

    graphs: list[GraphRecord] = attrs.field(factory=list)

    def add(self, record: GraphRecord) -> None:
        self.graphs.append(record)

    def in_torch(self) -> dict[str, str]:
        """Every op that ran in torch in some graph, with a reason."""
        out: dict[str, str] = {}
        for graph in self.graphs:
            for op, why in graph.in_torch().items():
                out.setdefault(op, why)
        return out

    def ops(self, runs: str) -> int:
        return sum(g.ops(runs) for g in self.graphs)

    def share(self) -> float:
        """The share of the ops that run in dpl, of all the graphs' ops (0.0 before any)."""
        total = self.ops("dpl") + self.ops("torch")
        return self.ops("dpl") / total if total else 0.0

    def text(self) -> str:
        if not self.graphs:
            return "no graph compiled yet (torch.compile compiles at the first call)"
        return "\n".join(g.text() for g in self.graphs)

    __str__ = text

    def save(self, folder: str | os.PathLike) -> list[str]:
        """Write ``report.txt`` (:meth:`text`) and, per partition translated to dpl, its module
        as ``graph<G>_<name>.ir`` (a partition that stayed in torch after translation, a failed
        build say, as ``graph<G>_torch<N>.ir``) into ``folder``; the paths written."""
        from dpl.ir.serialize import save

        os.makedirs(folder, exist_ok=True)
        paths = [os.path.join(folder, "report.txt")]
        with open(paths[0], "w", encoding="utf-8") as f:
            f.write(self.text() + "\n")
        for graph in self.graphs:
            kept = 0
            for part in graph.parts:
                if part.module is None:
                    continue
                name = part.name if part.name.startswith("dpl_") else f"torch{kept}"
                kept += part.name == "torch"
                paths.append(os.path.join(folder, f"graph{graph.index}_{name}.ir"))
                save(part.module, paths[-1])
        return paths


def count_ops(nodes) -> dict[str, int]:
    """The ops of ``nodes`` by name: ATen's (``aten.add.Tensor``), or in a graph of dynamo's the
    torch function or method (``linear``); getitem, which only picks a result, left out."""
    import operator

    names = []
    for n in nodes:
        if n.op == "call_method":
            names.append(str(n.target))
        elif n.op == "call_function" and n.target is not operator.getitem:
            text = str(n.target)
            names.append(text if text.startswith(("aten.", "prims.")) else getattr(n.target, "__name__", text))
    return dict(Counter(names))
