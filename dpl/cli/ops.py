"""``dpl ops [NAME]``: the op registry as a table, or one op in full.

Everything shown is read from the code, never from a list kept beside it: the arguments from
each op's arity and its NumPy reference's parameter names, the attributes and their defaults
from its schema, the pattern kinds from its kind rule (the :class:`OpPatternKind` values the
rule can return), and the kernel columns from the kernel IR's lowering table
(``dpl.kernel.lower.RULES``: a rule that only raises refuses its op; every op with a C template;
the ops the tuple-item rule lowers item by item) and the CUDA emitter, which writes each op
through the statement emitter it shares with C. The registry declares no dtypes: type
inference checks them call by call, so they are shown as not declared.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from dpl.cli.common import print_json

def add_ops_command(sub) -> None:
    p = sub.add_parser("ops", help="list the registered ops: arguments, attributes, pattern kinds, C and CUDA kernels")
    p.add_argument("name", nargs="?", metavar="NAME", help="show this op in full (its documentation, kind rule, C template)")
    p.add_argument("--json", action="store_true", help="print JSON (keys: ops, count; each op: name, signature, arguments, "
                                                      "arity, attributes, kinds, kind_by_call, kind_rule, dtypes, c_kernel, "
                                                      "cuda_kernel, lowering, c_template, doc); with NAME, that op alone")
    p.set_defaults(func=cmd_ops)


def cmd_ops(args) -> int:
    from dpl.ops import all_ops, get_op

    if args.name is not None:
        info = describe_op(get_op(args.name))  # an unknown name: UnknownOpError with a did-you-mean
        if args.json:
            print_json(info)
        else:
            print(format_details(info))
        return 0
    rows = [describe_op(op) for op in all_ops().values()]
    if args.json:
        print_json({"ops": rows, "count": len(rows)})
    else:
        print(format_table(rows))
    return 0


# -- what the code says of one op ----------------------------------------------------------------


def describe_op(op) -> dict[str, Any]:
    """One op as plain data (the ``--json`` form)."""
    kinds, by_call = pattern_kinds(op.kind)
    lowers, lowering = kernel_lowering(op)
    arguments = argument_names(op)
    attributes = [{"name": k, "kind": spec.kind, "required": _required(spec), "default": None if _required(spec) else spec.default}
                  for k, spec in op.attrs.items()]
    return {
        "name": op.name,
        "signature": f"{op.name}({', '.join([*arguments, *(_attr_text(a) for a in attributes)])})",
        "arguments": arguments,
        "arity": list(op.num_args),
        "attributes": attributes,
        "kinds": [kind_name(k) for k in kinds],
        "kind_by_call": by_call,
        "kind_rule": f"{_where(op.kind)}: {_rule_text(op.kind)}" if by_call else None,
        "dtypes": None,  # the registry declares none: type inference checks each call
        "c_kernel": lowers,
        "cuda_kernel": lowers and cuda_shares_c_ops(),
        "lowering": lowering,
        "c_template": op.c_expr,
        "doc": op.doc,
    }


def kind_name(kind) -> str:
    """TVM's spelling of a pattern kind: ``comm-reduce`` for COMM_REDUCE."""
    return kind.name.lower().replace("_", "-")


def argument_names(op) -> list[str]:
    """The operands' names, from the reference function's leading positional parameters when
    they match the op's arity (``where(c, a, b)``); else x, or a, b, ... An optional operand
    is written ``[name]``, any number of them ``*args``."""
    lo, hi = op.num_args
    names = []
    try:
        params = list(inspect.signature(op.ref).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature
        params = []
    for p in params:
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) or p.name in op.attrs or p.name.startswith("_") \
                or p.name == "out":
            break
        names.append(p.name)
    want = hi if hi >= 0 else lo
    if len(names) != want:
        names = ["x"] if want == 1 else [chr(ord("a") + i) for i in range(want)]
    names = [n if i < lo else f"[{n}]" for i, n in enumerate(names)]
    return names + (["*args"] if hi < 0 else [])


def pattern_kinds(rule, seen: set | None = None) -> tuple[list, bool]:
    """The pattern kinds ``rule`` (an op's kind function) can return, in TVM's order, and
    whether there are several (the call decides). A constant kind is the default argument of
    the lambda ``register`` wraps it in; a rule names its kinds as constants, closed-over
    values or ``OpPatternKind.X`` attributes, and may defer to another rule (a function whose
    return annotation is OpPatternKind), which is read too."""
    from dpl.ops.registry import OpPatternKind

    seen = set() if seen is None else seen
    seen.add(rule)
    found = {v for v in (rule.__defaults__ or ()) if isinstance(v, OpPatternKind)}
    names = inspect.getclosurevars(rule)
    for value in (*names.nonlocals.values(), *names.globals.values()):
        if isinstance(value, OpPatternKind):
            found.add(value)
        elif inspect.isfunction(value) and value not in seen and "OpPatternKind" in str(inspect.signature(value).return_annotation):
            found.update(pattern_kinds(value, seen)[0])
    found.update(OpPatternKind[n] for n in names.unbound if n in OpPatternKind.__members__)
    kinds = sorted(found)
    return kinds, len(kinds) > 1


def kernel_lowering(op) -> tuple[bool, str]:
    """Whether dpl's kernel IR lowers ``op``, and how (``dpl.kernel.lower.op_lowering``)."""
    from dpl.kernel.lower import op_lowering  # the dpl.kernel package, imported first, fills its rules

    return op_lowering(op.name)


def cuda_shares_c_ops() -> bool:
    """Whether the CUDA emitter writes ops through the statement emitter it shares with C
    (``backends/cgen``), so that every op the kernel IR lowers has a CUDA kernel too."""
    from dpl.backends.cgen.emitter import StatementEmitter
    from dpl.backends.cuda.emitter import CudaEmitter

    return issubclass(CudaEmitter, StatementEmitter) and CudaEmitter.op is StatementEmitter.op


def _required(spec) -> bool:
    from dpl.ops.registry import REQUIRED

    return spec.default is REQUIRED


def _attr_text(attribute: dict) -> str:
    """``axis=-1`` as the IR's text writes it; a required attribute ``shape=<shape>``."""
    from dpl import dtypes
    from dpl.ir.printer import format_attr_value

    value = attribute["default"]
    if attribute["required"]:
        return f"{attribute['name']}=<{attribute['kind']}>"
    if attribute["kind"] == "dtype" and value is not None:
        return f"{attribute['name']}={dtypes.short(value)}"
    return f"{attribute['name']}={format_attr_value(value)}"


def _rule_text(rule) -> str:
    """What a kind rule says of itself: its docstring, else the comment that opens its body;
    a lambda is its own text (``K.ELEMWISE if len(out.fields) == 1 else K.INJECTIVE``)."""
    doc = inspect.getdoc(rule)
    if doc:
        return " ".join(doc.split())
    try:
        lines = inspect.getsource(rule).splitlines()
    except (OSError, TypeError):
        return rule.__name__
    if rule.__name__ == "<lambda>":  # the line it is on, from its body to the end of the line
        body = lines[0].split("lambda", 1)[-1].split(":", 1)[-1]
        return body.strip().rstrip(",")
    comment = []
    for line in lines[1:]:
        if not line.strip().startswith("#"):
            break
        comment.append(line.strip().lstrip("#").strip())
    return " ".join(comment) or rule.__name__


def _where(fn) -> str:
    """``dpl/ops/reduce.py:86``: where a function is written, from the checkout's root."""
    import dpl

    path = Path(inspect.getsourcefile(fn) or "?")
    root = Path(dpl.__file__).parent.parent
    if path.is_relative_to(root):
        path = path.relative_to(root)
    return f"{path.as_posix()}:{fn.__code__.co_firstlineno}"


# -- text --------------------------------------------------------------------------------------


def format_table(rows: list[dict]) -> str:
    head = ("op", "arguments", "kind", "C", "CUDA", "attributes")
    body = [(r["name"], ", ".join(r["arguments"]) or "-", "|".join(r["kinds"]), _yes(r["c_kernel"]), _yes(r["cuda_kernel"]),
             " ".join(_attr_text(a) for a in r["attributes"])) for r in rows]
    widths = [max(len(line[i]) for line in (head, *body)) for i in range(len(head) - 1)]
    lines = ["  ".join([*(cell.ljust(w) for cell, w in zip(line, widths)), line[-1]]).rstrip() for line in (head, *body)]
    lines.append(f"{len(rows)} ops. kind: TVM's OpPatternKind (a|b: the call decides); C, CUDA: dpl's kernel IR lowers the op "
                 "and that target emits it. 'dpl ops NAME': one op in full.")
    return "\n".join(lines)


def format_details(r: dict) -> str:
    lines = [r["signature"]]
    if r["doc"]:
        lines.append(f"  {r['doc']}")
    lines.append("")
    lo, hi = r["arity"]
    count = str(lo) if lo == hi else f"{lo} to {hi}" if hi >= 0 else f"at least {lo}"
    lines.append(f"  arguments    {count}: {', '.join(r['arguments']) or 'none'}")
    if r["attributes"]:
        for i, a in enumerate(r["attributes"]):
            value = "required" if a["required"] else _attr_text(a).split("=", 1)[1]
            lines.append(f"  {'attributes' if i == 0 else '':<11}  {a['name']}: {a['kind']} = {value}")
    else:
        lines.append("  attributes   none")
    lines.append(f"  kind         {' or '.join(r['kinds'])}")
    if r["kind_by_call"]:
        lines.append(f"               the call decides: {r['kind_rule']}")
    lines.append("  dtypes       not declared in the registry; type inference checks each call")
    lines.append(f"  C kernel     {_yes(r['c_kernel'])} ({r['lowering']})")
    lines.append(f"  CUDA kernel  {_yes(r['cuda_kernel'])}")
    if r["c_template"]:
        lines.append(f"  C template   {r['c_template']}")
    return "\n".join(lines)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
