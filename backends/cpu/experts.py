"""The experts' grouped products of mixture-of-experts layers on the CPU: a lone
``grouped_matmul`` and the ``kernel.grouped_matmul_glu`` composite (patterns/llm.dpl: the merged
gate and up product, then ``silu(gate) * up`` of its halves).

Each expert's run of rows (:func:`dpl.ops.experts.expert_runs`, the reference's own runs) is one
product into that run of the result, the rows past the last offset zero: nothing larger than
the result is ever held. The composite computes each run's gated unit as the run's product
finishes: by the packed routine's ``dpl_glu`` (backends/cpu/packed_gemm.py) where the products
pack (float32, a constant weight whose halves are whole panels), each expert's weight packed
once at the first call, gate and up panels alternating, so the run's 2F product columns are
never stored. Elsewhere the composite runs as the CPU's segments (backends/cpu/segments.py):
the grouped product by :func:`product` (the BLAS, run by run) and the gated unit as a
generated-C kernel over its result, as the unfused ops run. bench/bench_experts.py (Mixtral-like
layer, 8 experts, top-2, 128 tokens, one thread): the packed composite took 0.81-0.87x the
unfused ops' CPU time at K = 256..1024; the segments' path is the unfused ops' work (1.01-1.06x,
within the shared host's noise).
"""

from __future__ import annotations

import ctypes
import threading

import attrs
import numpy as np

from dpl import dtypes
from dpl.backends.cpu import packed_gemm
from dpl.backends.cpu.addresses import address
from dpl.ir.expr import Call, Constant
from dpl.ops.experts import expert_runs
from dpl.runtime.threads import openmp_kernel

GLU = "kernel.grouped_matmul_glu"


@attrs.frozen
class Grouped:
    """A function the runners compute: its grouped product and, for the composite, which half
    of the product's columns is the gate (None: the product is the result)."""

    product: Call
    gate_first: bool | None
    # per operand of the product: (the function's parameter index, None) or (None, a constant's value)
    operands: tuple


def takes(call) -> bool:
    """Whether ``call`` is a grouped product :func:`product` computes (the segments' rule)."""
    return isinstance(call, Call) and call.op == "grouped_matmul"


def read(function) -> Grouped | None:
    """The lone ``grouped_matmul`` or the ``kernel.grouped_matmul_glu`` composite ``function``
    is, or None (another function, or a composite whose slices are not the two halves of the
    product's columns)."""
    bindings = function.bindings
    if not bindings or not (isinstance(bindings[0].value, Call) and bindings[0].value.op == "grouped_matmul"):
        return None
    product = bindings[0].value
    params = {id(p): k for k, p in enumerate(function.params)}
    if not all(isinstance(a, Constant) or id(a) in params for a in product.args):
        return None
    operands = tuple((None, a.value) if isinstance(a, Constant) else (params[id(a)], None) for a in product.args)
    if len(bindings) == 1 and function.ret is bindings[0].var:
        return Grouped(product, None, operands)
    if function.attrs.get("Composite") != GLU:
        return None
    gate_first = _gate_first(bindings, function.ret)
    return None if gate_first is None else Grouped(product, gate_first, operands)


def _gate_first(bindings, ret) -> bool | None:
    """Whether the gate is the first half of the product's columns, for a body that is exactly
    the product, its two column halves, ``nn.silu`` of one and that times the other (returned),
    in any order the fusion wrote them; None for any other body."""
    if len(bindings) != 5 or ret is not bindings[4].var:
        return None
    p = bindings[0].var
    width = p.ty.shape[-1]
    if not (isinstance(width, int) and width % 2 == 0):
        return None
    half, halves, acts = width // 2, {}, []
    for b in bindings[1:4]:
        v = b.value
        if isinstance(v, Call) and v.op == "nn.silu":
            acts.append(b)
            continue
        if not (isinstance(v, Call) and v.op == "strided_slice" and v.args[0] is p):
            return None
        a = v.attrs
        if [x % 2 for x in a["axes"]] != [1] or list(a.get("strides") or [1]) != [1] or (a["begin"][0], a["end"][0]) not in ((0, half), (half, width)):
            return None
        halves[a["begin"][0]] = b.var
    if len(halves) != 2 or len(acts) != 1:
        return None
    act, mul = acts[0], bindings[4].value
    gate = act.value.args[0]
    if not any(gate is h for h in halves.values()):
        return None
    up = halves[half] if gate is halves[0] else halves[0]
    if not (isinstance(mul, Call) and mul.op == "multiply" and {id(a) for a in mul.args} == {id(act.var), id(up)}):
        return None
    return gate is halves[0]


def packs(grouped: Grouped) -> bool:
    """Whether the packed routine takes the composite: float32, a constant weight whose halves
    are whole panels of the widest vector (``packed_gemm.takes_glu``'s rule)."""
    x, w, _ = grouped.product.args
    n = w.ty.shape[-1]
    return (grouped.gate_first is not None and x.ty.dtype == w.ty.dtype == "float32" and isinstance(w, Constant)
            and isinstance(n, int) and (n // 2) % (packed_gemm.VECTOR * 4) == 0)


def runner(function, grouped: Grouped, routine: packed_gemm.Routine | None, threads: int | None = None):
    """``run(inputs, outputs)`` computing ``function`` (:func:`read` gave ``grouped``): a lone
    product by :func:`product`, the composite by the packed routine; None for a composite the
    routine does not take (``routine`` None, or not :func:`packs`): the segments run it."""
    if grouped.gate_first is None:
        return _lone(function.name, grouped)
    if routine is not None and packs(grouped):
        return _packed_glu(function.name, grouped, routine, threads, _PackedExperts(grouped.operands[1][1], routine, grouped.gate_first))
    return None


def _operands(grouped: Grouped, inputs):
    return [value if k is None else inputs[k] for k, value in grouped.operands]


class _PackedExperts:
    """Each expert's packed gate and up panels, packed at its first run (an expert no call
    routes rows to is never packed) and shared by every thread cap of the runner."""

    def __init__(self, w: np.ndarray, routine: packed_gemm.Routine, gate_first: bool):
        self.w, self.routine, self.gate_first = w, routine, gate_first
        self.panels: list[np.ndarray | None] = [None] * w.shape[0]
        self.lock = threading.Lock()

    def get(self, e: int) -> np.ndarray:
        if self.panels[e] is None:
            with self.lock:
                if self.panels[e] is None:
                    self.panels[e] = self.routine.pack_glu(self.w[e], self.gate_first)
        return self.panels[e]


def _packed_glu(name: str, grouped: Grouped, routine: packed_gemm.Routine, threads: int | None, packed: _PackedExperts):
    _, k, n = grouped.product.args[1].ty.shape
    cap, local = int(threads or 0), threading.local()

    def run(inputs, outputs):
        x, _, offsets = _operands(grouped, inputs)
        x = np.ascontiguousarray(x, np.float32)
        out = outputs[0]
        target = out if out.flags.c_contiguous else np.empty_like(out, order="C")
        end = 0
        for e, start, end in expert_runs(offsets, x.shape[0]):
            m = end - start
            scratch = getattr(local, "buf", None)
            if k > packed_gemm.KC and (scratch is None or scratch.size < m * n):  # the run's product, as glu_runner keeps it
                scratch = local.buf = np.empty(m * n, np.float32)
            routine.glu(address(x[start:end]), address(packed.get(e)), address(target[start:end]), (ctypes.c_int64 * 3)(m, k, n // 2),
                        cap, None if scratch is None else address(scratch))
        target[end:] = 0  # rows past the last offset: silu(0) * 0
        if target is not out:
            np.copyto(out, target)

    return openmp_kernel(run, f"cpu:packed-grouped-matmul {k}x{n} + silu-gated unit:{name}", packed_gemm.SOURCE, threads,
                         lambda t: _packed_glu(name, grouped, routine, t, packed))


def product(x: np.ndarray, w: np.ndarray, offsets: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``grouped_matmul(x, w, offsets)`` into ``out``: each expert's run of rows by the BLAS
    (NumPy's matmul, in the reference's accumulator dtype), the rows past the last offset zero."""
    acc = dtypes.accumulator_numpy(x.dtype)
    end = 0
    for e, start, end in expert_runs(offsets, x.shape[0]):
        rows, weight = x[start:end].astype(acc, copy=False), w[e].astype(acc, copy=False)
        if out.dtype == acc:
            np.matmul(rows, weight, out=out[start:end])
        else:
            out[start:end] = np.matmul(rows, weight)
    out[end:] = 0
    return out


def _lone(name: str, grouped: Grouped):
    def run(inputs, outputs):
        product(*_operands(grouped, inputs), outputs[0])

    run.__qualname__ = f"cpu-blas-grouped-matmul:{name}"
    return run
