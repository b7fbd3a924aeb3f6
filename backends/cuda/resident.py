"""Device-resident runs: a whole plan on the device, arrays crossing only at its edges.

An Executable whose first available backend is CuPy hands every call here
(:meth:`~dpl.backends.cuda.backend.CupyBackend.resident`). Each memory plan
(:class:`~dpl.runtime.plan.Plan`, one per input signature) gets a :class:`DevicePlan`: its
arena's slots allocated once as device arrays, its constants copied once, its steps run on
device arrays through each kernel's ``.device`` entry (the part of a CuPy kernel that works on
device arrays). A call then copies its NumPy inputs in once and its results out once; CuPy
arrays go in and come out with no copy; DLPack tensors (``__dlpack__``: a torch CUDA tensor)
are taken by ``cupy.from_dlpack`` and the results handed back through their framework's
``from_dlpack``, no copy either way.

A step whose kernel is not CuPy's (one that fell back to the CPU) still runs, its operands
copied down and its results up around it; the DevicePlan names such steps in ``host_steps``.

With every step on the device the plan is captured as one CUDA graph
(:mod:`dpl.backends.cuda.graph`) and replayed from the second call on; otherwise, or when the
capture fails, it runs step by step and ``graph_note`` says why.

A DevicePlan owns one arena, so calls of one plan run one at a time (a lock); different
shapes run at once.
"""

from __future__ import annotations

import importlib
import logging
import threading

import numpy as np

from dpl import dtypes as dt
from dpl.backends.cuda.graph import GraphRunner
from dpl.errors import DplError, count
from dpl.ir.types import TupleType

log = logging.getLogger(__name__)

KDL_CPU = 1  # DLPack device types
HOST, CUPY, DLPACK = "numpy", "cupy", "dlpack"


class DeviceRunError(DplError):
    """Arrays given to a device-resident Executable that it cannot take."""


def bits_dtype(dtype) -> np.dtype:
    """The dtype an array of ``dtype`` has on the device: bfloat16 travels as its 16 bits."""
    return np.dtype(np.uint16) if np.dtype(dtype).name == "bfloat16" else np.dtype(dtype)


def bits(a):
    return a.view(np.uint16) if a.dtype.name == "bfloat16" else a


class DevicePlan:
    """One plan's buffers on the device, and the run of its steps over them."""

    def __init__(self, plan, cp, graphs: bool = True):
        self.plan, self._cp = plan, cp
        self.steps = [(s, getattr(s.kernel, "device", None)) for s in plan.steps]
        self.host_steps = [s.label for s, device in self.steps if device is None]
        self.arena = [cp.empty((n,), np.uint8) for n in plan.slot_sizes]
        self.views: list = [None] * len(plan.buffers)
        for b, buf in enumerate(plan.buffers):
            if buf.kind == "const":
                self.views[b] = cp.asarray(bits(np.require(buf.value, requirements="C")))
            elif b in plan.slot_of:
                raw = self.arena[plan.slot_of[b]][: buf.nbytes]
                self.views[b] = raw.view(bits_dtype(dt.to_numpy(buf.dtype))).reshape(buf.shape)
        plan.fill_views(self.views)  # views of temporaries and constants cost nothing on the device either
        self.lock = threading.Lock()
        why = f"steps on the host: {', '.join(self.host_steps)}" if self.host_steps else None
        if not graphs:
            why = "CUDA graphs are off"
        self.graph = GraphRunner(cp, self, why)

    @property
    def graph_note(self) -> str:
        return self.graph.note

    def new_outputs(self) -> list:
        return [self._cp.empty(shape, bits_dtype(dtype)) for shape, dtype in self.plan.out_specs]

    def run_steps(self, inputs: list, outs: list) -> None:
        """Every step of the plan over device ``inputs``, writing device ``outs``."""
        cp, plan = self._cp, self.plan
        bufs = list(self.views)
        late = plan.bind(bufs, inputs, outs)  # inputs, outputs and the views of them
        for step, device in self.steps:
            ins = [bufs[b] for b in step.inputs]
            dst = [bufs[b] for b in step.outputs]
            if device is not None:
                device(ins, dst)
            else:
                self._on_host(step, ins, dst)
        for pos, b in plan.copies:
            cp.copyto(outs[pos], bufs[b])
        for pos, b in late:
            cp.copyto(outs[pos], bufs[b].reshape(outs[pos].shape))

    def _on_host(self, step, ins, dst) -> None:
        """A step that fell back to the CPU: its operands down, its results up."""
        cp, bufs = self._cp, self.plan.buffers
        host_in = [cp.asnumpy(a).view(dt.to_numpy(bufs[b].dtype)) for a, b in zip(ins, step.inputs)]
        host_out = [np.empty(bufs[b].shape, dt.to_numpy(bufs[b].dtype)) for b in step.outputs]
        step.kernel(host_in, host_out)
        for d, h in zip(dst, host_out):
            cp.copyto(d, cp.asarray(bits(h)))

    def run(self, inputs: list) -> list:
        with self.lock:
            return self.graph.run(inputs)


class DeviceRunner:
    """Runs an Executable's calls on the device: edges in, the DevicePlan, edges out."""

    def __init__(self, cp, graphs: bool = True):
        self._cp, self.graphs = cp, graphs
        self._plans: dict[int, DevicePlan] = {}
        self._lock = threading.Lock()

    def device_plan(self, plan) -> DevicePlan:
        found = self._plans.get(id(plan))
        if found is None:
            with self._lock:
                found = self._plans.get(id(plan))
                if found is None:
                    found = self._plans[id(plan)] = DevicePlan(plan, self._cp, self.graphs)
        return found

    def note(self, plan) -> str:
        """How the plan runs on the device, for ``exe.summary()``."""
        found = self._plans.get(id(plan))
        if found is None:
            return "device-resident: not run yet"
        host = f"; {count(len(found.host_steps), 'step')} on the host" if found.host_steps else ""
        return f"device-resident, arena {sum(found.plan.slot_sizes)} bytes on the device{host}; {found.graph_note}"

    def run(self, exe, arrays, out=None):
        """The results of one call: of the kind of the first input, or written into ``out``
        (NumPy or CuPy arrays)."""
        cp = self._cp
        flat, kinds, frameworks = self._inputs(exe, arrays)
        plan = exe.plan_for([(shape, dtype) for _, shape, dtype in flat])
        outs = self.device_plan(plan).run([a for a, _, _ in flat])
        if out is not None:
            return self._fill(plan, outs, out)
        kind = kinds[0] if kinds else HOST
        if kind == HOST:
            results = [cp.asnumpy(o).view(dtype) for o, (_, dtype) in zip(outs, plan.out_specs)]
        elif kind == DLPACK:
            results = [frameworks[0].from_dlpack(o) for o in outs]
        else:
            results = outs
        return _nest(plan.result, results)

    # -- the edges ------------------------------------------------------------------------------
    def _fill(self, plan, outs, out):
        cp = self._cp
        targets = _flatten(out)
        if len(targets) != len(outs):
            raise DeviceRunError(f"out= needs {len(outs)} arrays, got {len(targets)}")
        for i, (o, d, (shape, dtype)) in enumerate(zip(targets, outs, plan.out_specs)):
            device = isinstance(o, cp.ndarray)
            if not (device or isinstance(o, np.ndarray)) or tuple(o.shape) != tuple(shape) or o.dtype not in (dtype, bits_dtype(dtype)):
                got = f"{o.dtype}{list(o.shape)}" if hasattr(o, "shape") else type(o).__name__
                raise DeviceRunError(f"out[{i}] must be a {np.dtype(dtype)} NumPy or CuPy array of shape {tuple(shape)}, got {got}")
            if device:
                cp.copyto(o, d)
            else:
                np.copyto(o, cp.asnumpy(d).view(o.dtype))
        return out

    def _inputs(self, exe, arrays):
        """(device array, shape, dtype) per tensor leaf; the kind of each argument; the
        frameworks of the DLPack arguments."""
        params = exe.entry.params
        if len(arrays) != len(params):
            names = ", ".join(p.name for p in params)
            raise DeviceRunError(f"'{exe.entry.name}' takes {len(params)} inputs ({names}), got {len(arrays)}")
        flat, kinds, frameworks = [], [], []
        leaves = [leaf for p, a in zip(params, arrays) for leaf in (_flatten(a) if isinstance(p.ty, TupleType) else [a])]
        for want, leaf in zip(_leaf_dtypes(exe.entry), leaves):
            kind, device = self._to_device(leaf)
            kinds.append(kind)
            if kind == DLPACK:
                frameworks.append(_framework(leaf))
            dtype = np.dtype(want) if (want.name == "bfloat16" and device.dtype == np.uint16) else device.dtype
            flat.append((device, tuple(device.shape), dtype))
        if len(leaves) != len(flat):
            raise DeviceRunError(f"'{exe.entry.name}' takes {len(flat)} arrays, got {len(leaves)}")
        return flat, kinds, frameworks

    def _to_device(self, a):
        cp = self._cp
        if isinstance(a, cp.ndarray):
            return CUPY, a if a.flags.c_contiguous else cp.ascontiguousarray(a)
        if isinstance(a, (np.ndarray, np.generic, int, float, bool, list)):
            return HOST, cp.asarray(bits(np.require(np.asarray(a), requirements="C")))
        if hasattr(a, "__dlpack__"):
            if hasattr(a, "__dlpack_device__") and a.__dlpack_device__()[0] == KDL_CPU:
                return DLPACK, cp.asarray(np.from_dlpack(a))  # a host tensor: one copy in
            try:
                device = cp.from_dlpack(a)
            except Exception as err:  # noqa: BLE001 (the producer's own error type)
                raise DeviceRunError(f"a DLPack tensor the device cannot take: {type(err).__name__}: {err}") from None
            return DLPACK, device if device.flags.c_contiguous else cp.ascontiguousarray(device)
        raise DeviceRunError(f"inputs are NumPy arrays, CuPy arrays or DLPack tensors, got {type(a).__name__}")


def _leaf_dtypes(fn):
    from dpl.backends.registry import leaf_types

    return [dt.to_numpy(t.dtype) for p in fn.params for t in leaf_types(p.ty)]


def _framework(tensor):
    """The module whose ``from_dlpack`` turns results back into ``tensor``'s kind."""
    name = type(tensor).__module__.split(".")[0]
    module = importlib.import_module(name)
    if not hasattr(module, "from_dlpack"):
        raise DeviceRunError(f"'{name}' (of a DLPack input) has no from_dlpack to hand results back through")
    return module


def _flatten(value) -> list:
    if isinstance(value, (tuple, list)):
        return [a for v in value for a in _flatten(v)]
    return [value]


def _nest(shape, outs):
    if isinstance(shape, tuple):
        return tuple(_nest(s, outs) for s in shape)
    return outs[shape]
