"""Measure every group of a module op by op and fused, on this machine (what ``dpl profile``
runs; the command, which reads the model file, is :mod:`dpl.cli.profile`).

For each Primitive group the entry calls (at the concrete shapes of the given or random
inputs), each op is timed alone with the single-op kernel of the target's backend, then the
group as one fused kernel; the medians go into the profile file (see
:mod:`dpl.runtime.profile_data`), merged into what the file already holds.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Sequence, TextIO

import numpy as np

from dpl import dtypes as dt
from dpl.backends.registry import flatten, leaf_types, unflatten
from dpl.ir.dims import evaluate, free_symbols
from dpl.ir.expr import Call, Constant, Function, Module, Tuple, TupleGetItem, Var
from dpl.ir.types import TupleType
from dpl.runtime.config import FusionConfig
from dpl.runtime.executable import FallbackError, build
from dpl.runtime.keys import compatible_key, exact_key, group_ops
from dpl.runtime.plan import single_op_function
from dpl.runtime.profile_data import ProfileData, load_profile, save_profile
from dpl.runtime.progress import Progress
from dpl.runtime.shapes import bind_dims, concrete

log = logging.getLogger(__name__)

def _median_ms(run, repeat: int) -> float:
    run()  # warm up (and compile caches)
    samples = []
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        run()
        samples.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(samples))


def _random(shape, dtype: str, rng) -> np.ndarray:
    npd = dt.to_numpy(dtype)
    if dt.is_float_numpy(npd):
        return (rng.standard_normal(shape) * 0.5 + 0.1).astype(npd)
    if npd.kind == "b":
        return rng.random(shape) < 0.5
    return rng.integers(1, 4, shape).astype(npd)


def _empty_like_type(ty) -> list[np.ndarray]:
    return [np.empty(t.shape, dt.to_numpy(t.dtype)) for t in leaf_types(ty)]


def profile_module(
    mod: Module,
    path: str | os.PathLike | None,
    *,
    target: Any = "cpu",
    inputs: Sequence[np.ndarray] | None = None,
    dims: dict[str, int] | None = None,
    repeat: int = 20,
    seed: int = 0,
    progress: TextIO | bool | None = True,
    strict: bool = False,
) -> ProfileData:
    """Measure the Primitive groups of ``mod`` and write (merge into) the profile at ``path``
    (None: write nothing, just return the measurements).

    Inputs are ``inputs`` or random arrays, symbolic dims taking their size from ``dims``
    (default 1024 so groups are big enough to be worth measuring). ``progress`` draws a bar on
    stderr (True), on a given stream, or not at all (None / False). Fall-backs are warnings, as
    in :func:`~dpl.runtime.build`, and so is a group whose fused kernel fails to compile (no
    fused time); ``strict``: each is a :class:`~dpl.runtime.FallbackError`.
    """
    if progress is True:
        progress = sys.stderr
    rng = np.random.default_rng(seed)
    exe = build(mod, target, config=FusionConfig(enable_fusion=False), strict=strict)
    if inputs is None:
        dims = dict(dims or {})
        inputs = []
        for p in exe.entry.params:
            for t in leaf_types(p.ty):  # a symbol no one sized is 1024; an expression dim is evaluated
                for s in sorted(set().union(*map(free_symbols, t.shape))):
                    dims.setdefault(s, 1024)
            leaves = [_random(tuple(evaluate(d, dims) for d in t.shape), t.dtype, rng) for t in leaf_types(p.ty)]
            inputs.append(tuple(leaves) if isinstance(p.ty, TupleType) else leaves[0])
    plan = exe.plan(*inputs)

    old = load_profile(path) if path is not None and os.path.exists(path) else ProfileData()
    single, fused, separate = dict(old.single), dict(old.fused), dict(old.separate)
    groups = [g for g in old.groups]
    seen: set[str] = set()
    todo = []
    for name, shapes, _ in plan.decisions:
        fn = mod[name]
        dtypes = [t.dtype for p in fn.params for t in leaf_types(p.ty)]
        key = exact_key(fn, shapes, dtypes)
        if key not in seen:
            seen.add(key)
            todo.append((fn, shapes, dtypes, key))
    bar = Progress(len(todo), progress or None)
    for fn, shapes, dtypes, key in todo:
        arrays = [_random(s, d, rng) for s, d in zip(shapes, dtypes)]
        op_ms = _time_ops(exe, fn, arrays, repeat)
        sep = sum(ms for _, ms in op_ms)
        choice = exe.choices.get(fn.name)
        fused_ms = None
        if choice is not None and choice.backend is not None:
            fused_ms = _time_fused(exe, choice.backend, fn, arrays, repeat, strict)
        for op, ms in op_ms:
            single[op] = ms
        separate[key] = sep
        record = {
            "function": fn.name, "exact_key": key, "compatible_key": compatible_key(fn), "ops": list(group_ops(fn)),
            "input_shapes": [list(s) for s in shapes], "input_dtypes": list(dtypes),
            "single": {op: ms for op, ms in op_ms}, "separate": sep, "fused": fused_ms,
            "backend": choice.backend.name if choice is not None and choice.backend is not None else None,
        }
        if fused_ms is not None:
            fused[key] = fused_ms
            fused[compatible_key(fn)] = fused_ms
        groups = [g for g in groups if g.get("exact_key") != key] + [record]
        bar.step(fn.name)
    data = ProfileData(single, fused, separate, tuple(groups))
    if path is not None:
        save_profile(data, path)
    return data


def _time_ops(exe, fn: Function, arrays, repeat: int) -> list[tuple[str, float]]:
    """Time every op of ``fn`` alone with its single-op kernel, feeding each the real values."""
    env: dict[int, Any] = {id(p): a for p, a in zip(fn.params, unflatten([p.ty for p in fn.params], arrays))}
    dims = bind_dims([t for p in fn.params for t in leaf_types(p.ty)], [a.shape for a in arrays], [p.name for p in fn.params])

    out: list[tuple[str, float]] = []

    def value(e):
        if isinstance(e, Var):
            return env[id(e)]
        if isinstance(e, Constant):
            return e.value
        if isinstance(e, Tuple):
            return tuple(value(f) for f in e.fields)
        if isinstance(e, TupleGetItem):
            return value(e.tuple_value)[e.index]
        if isinstance(e, Call) and isinstance(e.op, str):
            return timed(e)
        raise TypeError(f"a group holds {type(e).__name__}, which is not timed")

    def timed(call: Call):
        """Time ``call`` alone on its operands' real values (nested calls first)."""
        single, operands = single_op_function(call)
        ins = [a for o in operands for a in flatten(value(o))]
        kernel, _ = exe.op_kernel(single, [a.shape for a in ins], [dt.from_numpy(a.dtype) for a in ins])
        outs = _empty_like_type(concrete(call.ty, dims, call.op))
        out.append((call.op, _median_ms(lambda: kernel(ins, outs), repeat)))
        return unflatten([call.ty], outs)[0]

    for b in fn.bindings:
        env[id(b.var)] = value(b.value)
    value(fn.ret)  # a call written in the return itself
    return out


def _time_fused(exe, backend, fn: Function, arrays, repeat: int, strict: bool = False) -> float | None:
    try:
        kernel = backend.compile(fn, module=exe.module, shapes=tuple(a.shape for a in arrays))
    except Exception as err:  # no fused time: the heuristics then decide by profile_fallback
        why = getattr(err, "message", None) or f"{type(err).__name__}: {err}"
        text = f"group '{fn.name}': {backend.name} failed to compile it ({why}); no fused time"
        if strict:
            raise FallbackError(f"strict profile: {text}") from None
        log.warning("fall-back: %s", text)
        return None
    dims = bind_dims([t for p in fn.params for t in leaf_types(p.ty)], [a.shape for a in arrays], [p.name for p in fn.params])
    outs = _empty_like_type(concrete(fn.ret.ty, dims, fn.name))
    return _median_ms(lambda: kernel(arrays, outs), repeat)
