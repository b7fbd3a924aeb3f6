"""Keys of a fused group: its structure, the exact key and the compatible key.

The exact key is the SHA-256 of the group's structure (ops, attributes, how values flow,
constants' bytes — never names), the input dtypes and the concrete input shapes; it keys the
kernel cache and the profile's per-shape entries. The compatible key is the group's op names
joined with ``+`` (``nn.silu+multiply``), the seed's shape-free fall-back key.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from typing import Sequence

import numpy as np

from dpl.ir.expr import Call, Constant, Expr, Function, GlobalVar, Tuple, TupleGetItem, Var


_DIGESTS: dict[int, tuple[weakref.ref, str]] = {}  # id(array) -> (the array, the digest of its bytes)
_DIGESTS_LOCK = threading.Lock()


def constant_digest(value: np.ndarray) -> str:
    """The SHA-256 (16 hex digits) of a constant's bytes, once per array: a model's weights are
    constants, and hashing them again for every key of every build cost a warm build of the
    2-layer Llama 150 of its 340 ms. Arrays of constants are never written (IR values are
    immutable); an entry goes when its array does."""
    key = id(value)
    hit = _DIGESTS.get(key)
    if hit is not None and hit[0]() is value:
        return hit[1]
    digest = hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()[:16]
    try:
        ref = weakref.ref(value, lambda _r, key=key: _DIGESTS.pop(key, None))
    except TypeError:  # not weakly referable (a NumPy scalar): not remembered
        return digest
    with _DIGESTS_LOCK:
        _DIGESTS[key] = (ref, digest)
    return digest


def graph_structure(fn: Function) -> str:
    """A canonical, name-free text of ``fn``'s dataflow."""
    ids: dict[int, str] = {id(p): f"%p{i}" for i, p in enumerate(fn.params)}
    parts = [f"params {len(fn.params)}"]

    def text(e: Expr) -> str:
        if isinstance(e, Var):
            return ids[id(e)]
        if isinstance(e, Constant):
            digest = constant_digest(e.value)
            return f"const({e.value.dtype},{e.value.shape},{digest})"
        if isinstance(e, Call):
            op = e.op if isinstance(e.op, str) else f"@{e.op.name}"
            attrs = ",".join(f"{k}={v!r}" for k, v in sorted(e.attrs.items()))
            return f"{op}({', '.join(text(a) for a in e.args)})[{attrs}]"
        if isinstance(e, Tuple):
            return "(" + ", ".join(text(f) for f in e.fields) + ")"
        if isinstance(e, TupleGetItem):
            return f"{text(e.tuple_value)}.{e.index}"
        if isinstance(e, GlobalVar):
            return f"@{e.name}"
        raise TypeError(f"not an expression: {type(e).__name__}")

    for i, b in enumerate(fn.bindings):
        parts.append(f"%b{i} = {text(b.value)}")
        ids[id(b.var)] = f"%b{i}"
    parts.append(f"return {text(fn.ret)}")
    return "\n".join(parts)


def group_ops(fn: Function) -> tuple[str, ...]:
    """Every op ``fn`` calls, nested calls included, in evaluation order (the seed's
    ``graph.op_types``): what rules 1 and 2 count and the compatible key joins."""
    from dpl.backends.registry import function_ops

    return function_ops(fn, None)


def exact_key(fn: Function, shapes: Sequence[Sequence[int]], dtypes: Sequence[str]) -> str:
    h = hashlib.sha256()
    h.update(graph_structure(fn).encode())
    h.update(b"\0dtypes:" + ",".join(dtypes).encode())
    h.update(b"\0shapes:" + ";".join("x".join(map(str, s)) for s in shapes).encode())
    return h.hexdigest()


def compatible_key(fn: Function) -> str:
    return "+".join(group_ops(fn))
