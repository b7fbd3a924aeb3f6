"""The Executable: a module built for a target, run on NumPy arrays.

It chooses a backend for every function the entry calls (the first of the target that is
available and capable; every one passed over is recorded with its reason), asks the fusion
scheduler about every Primitive group at each concrete shape, compiles kernels through the
kernel cache, and keeps one memory-planned :class:`~dpl.runtime.plan.Plan` per signature of
input shapes: walked for the first signature of a bucket of sizes, rebound from that one for
the others (:mod:`dpl.runtime.rebinding`). A kernel that fails to compile falls back to the next
backend of the target (composites, codegen functions, single ops) or to running its ops one by
one (groups).

Fall-backs are loud: a unit that does not run where it was meant to (its backend is
unavailable or failed to compile it, its codegen prefix's owner cannot run it, or no backend
owns its prefix) is a :class:`Fallback`, logged as a warning on the ``dpl`` logger naming the
unit (the first of a reason in full, the next ones shortened, past ``WARNED_PER_REASON`` one
line saying where the rest are), listed by ``exe.summary()`` and ``exe.fallbacks``; a target
whose first backend is unavailable is said once, up front, for all its units. A backend passed over because its
capability table does not cover the unit is the target's order at work, not a fall-back.
``strict=True`` makes every fall-back a :class:`FallbackError` instead. What the plans run each
unit on is :meth:`Executable.ran_on`.

When compiling happens: a module whose inputs have static shapes is planned, and so compiled,
at build, so ``summary()`` says the same before and after the first call; with symbolic shapes
each input signature is planned at its first call, and until then ``summary()`` marks every
function "not compiled yet" (it may still fall back then).

Builds: while a plan is made, the C compiler runs for several kernels at once
(:mod:`dpl.runtime.build_pool`), with a progress line on a terminal; the plan is handed out
once every build is done. A build that fails there makes the plan again with builds in turn,
so the failure meets the fall-back path above.

Threads: one Executable may be called from several threads at once. Planning (and the
compiling it does) runs under a lock, once per input signature; running a plan needs no lock,
as every call borrows its own arena of temporaries from the plan (:class:`~dpl.runtime.plan.Plan`)
and the kernels keep their scratch buffers per thread (``backends/cpu/segments.py``,
``backends/cpu/im2col.py``). Per-call state rather than one lock around the call: threads calling
at once run at once.
"""

from __future__ import annotations

import difflib
import logging
import re
import threading
import time
from collections import OrderedDict
from typing import Any, Sequence, TextIO

import attrs
import numpy as np

from dpl import dtypes as dt
from dpl.backends.registry import (Backend, BackendError, Choice, Unit, backends, choose, classify, function_dtypes, get_backend,
                                   leaf_types, resolve_target)
from dpl.errors import DplError, count
from dpl.ir.expr import Call, Function, GlobalVar, Module, Tuple, TupleGetItem
from dpl.ir.types import TupleType
from dpl.runtime.build_pool import parallel_builds, serial_builds
from dpl.runtime.cache import KernelCache
from dpl.runtime.config import FusionConfig
from dpl.runtime.heuristics import FusionDecision
from dpl.runtime.keys import exact_key
from dpl.runtime.plan import Compiler, Plan, Planner
from dpl.runtime.progress import terminal_stderr
from dpl.runtime.rebinding import bucket
from dpl.runtime.scheduler import FusionScheduler, ScheduledGroup
from dpl.runtime.shapes import ShapeError, bind_dims
from dpl.runtime.timed_choice import SAMPLES


log = logging.getLogger(__name__)


class RunError(DplError):
    """Arrays given to an Executable that do not fit its entry function or its outputs."""


def _loose_name(name: str) -> str:
    """A name with what a frontend changes when it makes a parameter of it (characters other
    than letters, digits and _, a leading _ added) taken out: ``input.1`` and ``input_1`` meet."""
    return re.sub(r"\W", "_", name).lstrip("_")


WARNED_PER_REASON = 8  # units named in warnings per fall-back reason; the rest are in exe.fallbacks
# plans made by rebinding kept (the latest used), at most so many and so many bytes of arenas: a
# generate of 32 tokens meets 32 cache lengths, which the next generate of that prompt meets again
REBOUND_PLANS, REBOUND_BYTES = 64, 256 << 20


class FallbackError(DplError):
    """A strict build met a fall-back: a unit would not run on the backend meant for it."""


@attrs.frozen
class Fallback:
    """A unit that does not run where it was meant to: ``skipped`` is the backend asked for it
    (or the codegen prefix no backend owns), ``reason`` why it did not run there (read after
    the name: "is unavailable: ...", "failed to compile: ..."), ``runs_on`` what runs it
    instead: a backend, "op by op" (a fused group), or None (nothing)."""

    unit: str
    skipped: str
    reason: str
    runs_on: str | None

    def __str__(self) -> str:
        return self.describe("runs")

    def describe(self, runs: str = "runs") -> str:
        """One line: the unit, what ``runs`` it instead of which backend, and why."""
        if self.runs_on == "op by op":
            instead = f"{runs} op by op instead of as one {self.skipped} kernel"
        elif self.runs_on is None:
            instead = f"has no backend to run it instead of {self.skipped}"
        else:
            instead = f"{runs} on {self.runs_on} instead of {self.skipped}"
        return f"{self.unit} {instead} ({self.skipped} {self.reason})"

    def as_dict(self) -> dict[str, str | None]:
        return {"unit": self.unit, "asked": self.skipped, "ran_on": self.runs_on, "reason": f"{self.skipped} {self.reason}"}


def target_name(target: Any) -> str:
    """``target`` as the summary and messages write it."""
    if isinstance(target, str):
        return target
    if isinstance(target, Backend):
        return target.name
    return "[" + ", ".join(t if isinstance(t, str) else t.name for t in target) + "]"


def unavailable_head(backends: tuple[Backend, ...]) -> tuple[list[tuple[str, str]], Backend | None]:
    """The backends at the head of a target that are unavailable, with their reasons, and the
    first available one, which runs what they would have run."""
    skipped = []
    for b in backends:
        ok, why = b.available()
        if ok:
            return skipped, b
        skipped.append((b.name, why))
    return skipped, None


def check_target(target: Any, *, strict: bool = False, name: str | None = None) -> str | None:
    """What a build for ``target`` says up front when the target's first backend is unavailable
    (``--target cuda`` without CuPy or a device): the warning text, or None when it is
    available. With ``strict`` that is a :class:`FallbackError` instead. ``name``: how to
    write the target (default :func:`target_name`)."""
    skipped, first = unavailable_head(resolve_target(target))
    if not skipped:
        return None
    name = name or target_name(target)
    why = "; ".join(f"{b} is unavailable: {reason}" for b, reason in skipped)
    if first is None:
        instead = "no backend of it is available"
    else:
        instead = f"{first.name} runs instead"
    if strict:
        raise FallbackError(f"target {name}: {why}; a strict build does not fall back",
                            hint=f"without strict (--strict), {instead}, with a warning" if first is not None else None)
    return f"target {name}: {why}; {instead}"


class Executable(Compiler):
    """A module built for a target: call it with NumPy arrays.

    Safe to call from several threads at once, by per-call state: planning a new input
    signature takes a lock (so each signature is planned and compiled once), and each call
    runs its plan on an arena of temporaries it borrows for the call (see the module text).
    """

    def __init__(self, module: Module, target: Any = "cpu", config: FusionConfig | None = None, *, entry: str = "main",
                 cache: KernelCache | None = None, progress: TextIO | bool | None = True, threads: int | None = None,
                 adapt_threads: bool = True, strict: bool = False):
        if not isinstance(module, Module):
            raise DplError(f"build takes a Module, got {type(module).__name__}")
        if entry not in module.functions:
            raise DplError(f"module has no function '{entry}' (it has: {', '.join(module.functions)})")
        self.module, self.entry = module, module[entry]
        self.target: tuple[Backend, ...] = resolve_target(target)
        self.target_name = target_name(target)
        self.strict = strict  # every fall-back is a FallbackError
        self.config = config or FusionConfig()
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise DplError(f"threads must be a positive integer or None, got {threads!r}")
        self.threads = threads  # the thread budget of every call (dpl.runtime.threads)
        self.adapt_threads = adapt_threads  # a call may take one thread where that is faster (dpl.runtime.timed_choice)
        self.progress = terminal_stderr() if progress is True else (progress or None)  # where build progress is drawn
        self.scheduler = FusionScheduler(self.config, cache=cache)
        self.fallbacks: list[Fallback] = []
        self._warned: set[tuple[str, str]] = set()  # (backend, reason) the target's head warning said for every unit
        self._reasons: dict[tuple[str, str], int] = {}  # (backend, reason) -> units warned of so far
        self._compiled: set[str] = set()  # choice keys some plan compiled
        self.choices: dict[str, Choice] = {}  # by module function name, or "op NAME dtypes"
        self._failed: dict[str, dict[str, str]] = {}  # choice key -> {backend: compile error}
        self._plans: dict[tuple, Plan] = {}  # planned by a walk, by input signature
        # made from one of those at another binding of the symbols (dpl.runtime.rebinding), the
        # latest used last; and the plan each bucket of bindings is rebound from
        self._rebound: OrderedDict[tuple, Plan] = OrderedDict()
        self._rebound_bytes = 0  # their arenas' bytes
        self._families: dict[tuple, Plan] = {}
        self._planning = threading.RLock()  # plans and the compile state they change, one thread at a time
        self._resident: Any = None  # the device runner (see _device_runner), False: none
        # (plan, ((shape, dtype) of each input)) of the latest call, where inputs are not tuples (_last_plan)
        self._last: tuple[Plan, tuple] | None = None
        self._flat_entry = not any(isinstance(p.ty, TupleType) for p in self.entry.params)
        head = check_target(self.target, strict=strict, name=self.target_name)  # said once here, not again per unit
        if head is not None:
            log.warning("%s", head)
            self._warned.update((name, f"is unavailable: {why}") for name, why in unavailable_head(self.target)[0])
        for name in _called_functions(module, self.entry):
            unit = classify(module[name], module)
            self._choose(name, unit)
        if all(t.is_static for p in self.entry.params for t in leaf_types(p.ty)):
            self._plan_for([(t.shape, dt.to_numpy(t.dtype)) for p in self.entry.params for t in leaf_types(p.ty)])

    # -- choosing and compiling ------------------------------------------------------------------
    def _choose(self, key: str, unit: Unit) -> Choice:
        choice = choose(unit, self.target, self._failed.get(key))
        runs_on = choice.backend.name if choice.backend else "op by op" if unit.kind == "primitive" else None
        for name, reason in choice.fell_back:
            self._fall_back(Fallback(unit.describe(), name, reason, runs_on))
        self.choices[key] = choice
        return choice

    def _fall_back(self, fallback: Fallback) -> None:
        """Record a fall-back and warn about it (every unit named; see the module docstring); strict: raise."""
        if self.strict:
            hint = "without strict=True (--strict) it falls back, with a warning"
            if fallback.skipped not in backends():  # a codegen prefix nothing owns
                hint = (f"register a backend for codegen prefix '{fallback.skipped}' (dpl.register_codegen) or install "
                        f"the plugin that provides it; {hint}")
            raise FallbackError(f"strict build for target {self.target_name}: {fallback.describe('would run')}", hint=hint)
        if any((f.unit, f.skipped) == (fallback.unit, fallback.skipped) for f in self.fallbacks):
            return
        self.fallbacks.append(fallback)
        reason = (fallback.skipped, fallback.reason)
        if reason in self._warned:  # the target's head warning said it for every unit
            return
        # every unit is named: the first in full, the next few with their reason shortened,
        # then one line saying where the rest are listed
        seen = self._reasons[reason] = self._reasons.get(reason, 0) + 1
        if seen == 1:
            log.warning("fall-back: %s", fallback)
        elif seen <= WARNED_PER_REASON:
            log.warning("fall-back: %s (the same reason)", fallback.describe("runs").split(f" ({fallback.skipped} ")[0])
        elif seen == WARNED_PER_REASON + 1:
            log.warning("fall-back: more units fall back from %s for the same reason: exe.fallbacks (--json) lists them",
                        fallback.skipped)

    def _compile(self, key: str, unit: Unit, shapes, dtypes):
        """Compile ``unit`` on its chosen backend, falling back along the target on errors."""
        choice = self.choices.get(key) or self._choose(key, unit)
        self._compiled.add(key)
        while True:
            backend = choice.backend
            if backend is None:
                why = "; ".join(f"{n} {r}" for n, r in choice.passed_over)
                raise BackendError(f"no backend of target {self.target_name} can run {unit.describe()}: {why}")
            ekey = exact_key(unit.function, shapes, dtypes)
            kernel = self.scheduler.cache.get(backend.name, ekey)
            if kernel is not None:
                return kernel, backend.name
            try:
                kernel = backend.compile(unit.function, module=self.module, shapes=tuple(shapes))
            except Exception as err:  # a backend's compiler failing is a reason to fall back
                why = err.message if isinstance(err, DplError) else f"{type(err).__name__}: {err}"
                self._failed.setdefault(key, {})[backend.name] = f"failed to compile: {why}"
                choice = self._choose(key, unit)
                continue
            self.scheduler.cache.put(backend.name, ekey, kernel)
            return kernel, backend.name

    def op_kernel(self, fn: Function, shapes, dtypes):
        dts = function_dtypes(fn)
        unit = Unit("op", fn.name, fn, (fn.name,), dts)
        return self._compile(f"op {fn.name} {','.join(sorted(dts))}", unit, shapes, dtypes)

    def function_kernel(self, fn: Function, shapes, dtypes):
        return self._compile(fn.name, classify(fn, self.module), shapes, dtypes)

    def group(self, fn: Function, shapes, dtypes) -> tuple[ScheduledGroup, str | None]:
        choice = self.choices.get(fn.name) or self._choose(fn.name, classify(fn, self.module))
        self._compiled.add(fn.name)
        if choice.backend is None:
            decision = FusionDecision(False, "backend", "no backend of the target compiles this group")
            return ScheduledGroup(None, decision, "runs op by op"), None
        group = self.scheduler.prepare(fn, choice.backend, shapes, dtypes, self.module)
        if group.error is not None:
            self._fall_back(Fallback(choice.unit.describe(), choice.backend.name, f"failed to compile: {group.error}", "op by op"))
        return group, choice.backend.name

    # -- plans ----------------------------------------------------------------------------------
    def _plan_for(self, specs) -> Plan:
        signature = tuple((tuple(s), np.dtype(d)) for s, d in specs)  # dtype objects: str() of one costs microseconds
        plan = self._plans.get(signature) or self._rebound_plan(signature)
        if plan is not None:
            return plan
        with self._planning:
            plan = self._plans.get(signature) or self._rebound_plan(signature)  # another thread may have planned it meanwhile
            if plan is not None:
                return plan
            family = self._family(signature)
            template = self._families.get(family[:2]) if family is not None else None
            plan = template.rebound(family[2]) if template is not None else None
            if plan is not None:  # the same kernels at another size of the bucket: no walk, no lookups
                self._rebound[signature] = plan
                self._rebound_bytes += plan.peak_bytes
                while len(self._rebound) > 1 and (len(self._rebound) > REBOUND_PLANS or self._rebound_bytes > REBOUND_BYTES):
                    self._rebound_bytes -= self._rebound.popitem(last=False)[1].peak_bytes
                return plan
            plan = self._make_plan(specs)
            self._plans[signature] = plan
            if family is not None and self._serves_every_binding(plan):
                self._families[family[:2]] = plan
                plan.for_bucket({s: (1 << v.bit_length()) - 1 for s, v in family[2].items()})  # arenas the bucket shares
        return plan

    def _rebound_plan(self, signature) -> Plan | None:
        plan = self._rebound.get(signature)
        if plan is not None:
            self._rebound.move_to_end(signature)
        return plan

    def _family(self, signature) -> tuple | None:
        """(dtypes, bucket, dims) of the entry's symbols at ``signature``: the plans of one
        (dtypes, bucket) share their steps (dpl.runtime.rebinding); None at static shapes or where
        the shapes do not fit (the planner's walk says why)."""
        types = [t for p in self.entry.params for t in leaf_types(p.ty)]
        if len(types) != len(signature) or all(t.is_static for t in types):
            return None
        try:
            dims = bind_dims(types, [s for s, _ in signature], ["input"] * len(types))
        except ShapeError:
            return None
        return tuple(d for _, d in signature), bucket(dims), dims

    def _serves_every_binding(self, plan: Plan) -> bool:
        """Whether ``plan``'s steps may run at other bindings of its symbols: it could follow its
        shapes (``plan.rebinding``) and every step's backend compiles kernels that read their
        sizes at run time (``Backend.shape_generic``)."""
        if plan.rebinding is None:
            return False
        known = backends()
        return all(s.backend in known and known[s.backend].shape_generic for s in plan.steps)

    def _make_plan(self, specs) -> Plan:
        """Plan with the kernels' builds in parallel; when one of them failed, plan again with
        builds in turn (each failure then falls back where it arises)."""
        kept, fallbacks = self.scheduler.cache.keys(), len(self.fallbacks)
        with parallel_builds(progress=self.progress) as pool:
            plan = Planner(self.module, self.entry, self, self.threads, self.adapt_threads).plan(specs)
            failed = pool.wait()
        if not failed:
            return plan
        log.info("%d kernel build(s) failed; planning again with builds in turn", len(failed))
        self.scheduler.cache.keep_only(kept)
        del self.fallbacks[fallbacks:]
        with serial_builds():
            return Planner(self.module, self.entry, self, self.threads, self.adapt_threads).plan(specs)

    def _by_name(self, arrays: tuple, named: dict) -> tuple:
        """``arrays`` and then the ``named`` inputs in the entry's parameter order."""
        params = [p.name for p in self.entry.params]
        loose = {}  # a name as a model spells it (input.1) -> the parameter it became (input_1)
        for name in params:
            loose.setdefault(_loose_name(name), []).append(name)
        given: dict[str, Any] = {}
        for key, value in named.items():
            found = [key] if key in params else loose.get(_loose_name(key), [])
            if len(found) != 1:
                close = difflib.get_close_matches(key, params, n=1)
                guess = f"; did you mean {close[0]!r}?" if close and not found else ""
                why = "names no input" if not found else f"could be any of {', '.join(found)}"
                raise RunError(f"'{self.entry.name}' got the keyword {key!r}, which {why}{guess}",
                               hint=f"its inputs, in order: {', '.join(params)}")
            given[found[0]] = value
        if len(arrays) > len(params):
            raise RunError(f"'{self.entry.name}' takes {len(params)} inputs ({', '.join(params)}), got {len(arrays)} by position")
        twice = [n for n in params[:len(arrays)] if n in given]
        if twice:
            raise RunError(f"input {twice[0]!r} of '{self.entry.name}' is given by position and by name")
        missing = [n for n in params[len(arrays):] if n not in given]
        if missing:
            raise RunError(f"'{self.entry.name}' misses the input{'s' if len(missing) > 1 else ''} {', '.join(missing)}",
                           hint=f"its inputs, in order: {', '.join(params)}")
        return (*arrays, *(given[n] for n in params[len(arrays):]))

    def _flat_inputs(self, arrays) -> list[np.ndarray]:
        params = self.entry.params
        if len(arrays) != len(params):
            names = ", ".join(p.name for p in params)
            raise RunError(f"'{self.entry.name}' takes {len(params)} inputs ({names}), got {len(arrays)}")
        flat = []
        for p, a in zip(params, arrays):
            if isinstance(p.ty, TupleType):
                flat.extend(np.asarray(x) for x in _flatten_value(a))
            else:
                flat.append(np.asarray(a))
        return flat

    def plan_for(self, specs) -> Plan:
        """The plan of inputs of these (shape, dtype), one per tensor leaf of the parameters."""
        return self._plan_for(specs)

    def plan(self, *arrays) -> Plan:
        """The plan that runs these inputs (made at the first call of each input signature)."""
        flat = self._flat_inputs(arrays)
        return self._plan_for([(a.shape, a.dtype) for a in flat])

    @property
    def plans(self) -> dict[tuple, Plan]:
        """Every plan held, by input signature: those planned by a walk, then those made from
        them at other sizes (the latest ``REBOUND_PLANS``)."""
        return {**self._plans, **self._rebound}

    # -- running --------------------------------------------------------------------------------
    def __call__(self, *arrays, out=None, **named) -> Any:
        """Run the entry function; returns fresh arrays, or fills and returns ``out``. Inputs go
        by position, or by the entry's parameter names (``exe(input_ids=ids)``, as the model was
        called when it was imported; a name as the model wrote it, ``input.1``, finds the
        parameter it became, ``input_1``)."""
        arrays = self._by_name(arrays, named) if named else arrays
        resident = self._device_runner()
        if resident is not None:  # the whole plan on the device (backends/cuda/resident.py)
            return resident.run(self, arrays, out)
        plan, flat = self._plan_of(arrays)
        outs = None if out is None else self._check_out(plan, out, flat)
        return plan.run(flat, outs)

    def _plan_of(self, arrays) -> tuple[Plan, Sequence]:
        """The plan of a call's ``arrays`` and its flat inputs: the latest call's where they fit it."""
        plan, flat = self._last_plan(arrays), arrays
        if plan is None:
            flat = self._flat_inputs(arrays)
            plan = self._plan_for([(a.shape, a.dtype) for a in flat])
            if self._flat_entry:
                self._last = (plan, tuple((a.shape, a.dtype) for a in flat))
        return plan, flat

    def call_in_place(self, arrays: Sequence[np.ndarray], pairs: Sequence[tuple[int, int]]) -> Any:
        """Run like a call on the flat NumPy ``arrays``, writing output ``k`` in input ``j``'s
        array for each pair ``(k, j)`` the plan can (:meth:`Plan.in_place`: the output is that
        input updated by one step, a lone index_put, and nothing else reads it); that array is
        then the result there, and the input's old values are gone. Where the plan cannot, or
        the array is not C-contiguous and writable, that output is a fresh array as in a call.
        For a caller that would write the output back into its input anyway (AOTAutograd's
        input mutations: dpl.frontend.dynamo_call)."""
        if self._device_runner() is not None:  # device-resident: outputs are the device's arrays
            return self(*arrays)
        plan, arrays = self._plan_of(arrays)
        usable = [(k, j) for k, j in plan.in_place(pairs) if arrays[j].flags.c_contiguous and arrays[j].flags.writeable]
        return plan.run(arrays, None, in_place=usable)

    def _last_plan(self, arrays) -> Plan | None:
        """The latest call's plan where ``arrays`` are NumPy arrays of its very shapes and dtypes
        (then they are the flat inputs as they stand): a decode step's call skips flattening and
        building and hashing its signature (issue 31: 20 us of Python per call). Anything else,
        None: the general path."""
        last = self._last
        if last is None or len(arrays) != len(last[1]):
            return None
        for a, (shape, dtype) in zip(arrays, last[1]):
            if type(a) is not np.ndarray or a.shape != shape or a.dtype is not dtype:
                return None
        return last[0]

    def _device_runner(self):
        """What runs calls device-resident: offered by the target's first available backend
        (CuPy: ``resident()``), or None."""
        if self._resident is None:
            first = next((b for b in self.target if b.available()[0]), None)
            self._resident = first.resident() if hasattr(first, "resident") else False
        return self._resident or None

    def _check_out(self, plan: Plan, out, inputs) -> list[np.ndarray]:
        outs = _flatten_value(out)
        if len(outs) != len(plan.out_specs):
            raise RunError(f"out= needs {len(plan.out_specs)} arrays, got {len(outs)}")
        for i, (o, (shape, dtype)) in enumerate(zip(outs, plan.out_specs)):
            if not isinstance(o, np.ndarray) or o.shape != tuple(shape) or o.dtype != dtype:
                got = f"{o.dtype}{list(o.shape)}" if isinstance(o, np.ndarray) else type(o).__name__
                raise RunError(f"out[{i}] must be a {dtype} array of shape {tuple(shape)}, got {got}")
            if not o.flags.writeable:
                raise RunError(f"out[{i}] is read-only")
            if any(np.may_share_memory(o, a) for a in inputs):
                raise RunError(f"out[{i}] overlaps an input; outputs are written while inputs are read")
            if any(np.may_share_memory(o, p) for p in outs[:i]):
                raise RunError(f"out[{i}] overlaps another output")
        return outs

    def profile(self, *arrays, repeat: int = 10) -> "ProfileReport":
        """Per-kernel times of running these inputs: each step's median and minimum over
        ``repeat`` calls, beside the median of those whole calls (wall-clock, so their steps add
        up to about the call at any thread count).

        The steps timed are those a call runs now. Where the plan chooses its thread count by
        timing its calls (:mod:`dpl.runtime.timed_choice`), calls first run until it has chosen:
        timing the many-thread steps of a plan whose calls had chosen one thread, and averaging
        over the calls a loaded machine stalled, put 51 ms on a ResNet call of 6.9 ms (issue 30;
        bench_zoo's ResNet at 224x224, threads=2, on a 2-core host at load 1.5: a profile total of
        209.7 ms for calls of 15.7, and 14.9 for calls of 20.5 at load 9 once it timed the chosen
        count's steps by their medians)."""
        flat = self._flat_inputs(arrays)
        plan = self._plan_for([(a.shape, a.dtype) for a in flat])
        plan.run(flat, None)  # warm up
        for _ in range(2 * SAMPLES):  # at most what the thread choice needs to choose
            if plan.thread_choice is None or plan.thread_choice.settled():
                break
            plan.run(flat, None)
        threads, steps = plan.steps_now()
        times: dict[int, list[float]] = {id(s): [] for s in steps}

        def timer(step, run):
            t0 = time.perf_counter()
            run()
            times[id(step)].append((time.perf_counter() - t0) * 1e3)

        calls = []
        for _ in range(max(1, repeat)):
            t0 = time.perf_counter()
            plan.run(flat, None, timer=timer)
            calls.append((time.perf_counter() - t0) * 1e3)
        rows = [ProfileRow(i, s.label, s.function, s.backend, float(np.median(times[id(s)])), float(np.min(times[id(s)])))
                for i, s in enumerate(steps)]
        return ProfileReport(tuple(rows), float(np.median(calls)), threads)

    # -- reporting ------------------------------------------------------------------------------
    def ran_on(self) -> dict[str, str]:
        """What runs each unit in the plans made so far: by module function (a Primitive group,
        a composite, a codegen wrapper) and by ``op NAME`` for the ops outside them. The value
        is a backend name, ``op by op on B`` for a group whose ops run one by one (on B, the
        backends of its ops), or ``views (no kernel)``. A unit that runs differently in two
        plans (input signatures) lists both ways, comma-separated."""
        ways: dict[str, dict[str, None]] = {}
        for plan in self._plans.values():
            loose: dict[str, dict[str, None]] = {}  # group -> backends of its ops run one by one
            for step in plan.steps:
                fn = self.module.functions.get(step.function)
                if step.label.startswith("op ") and fn is not None and fn.attrs.get("Primitive"):
                    loose.setdefault(step.function, {})[step.backend] = None
                elif step.label.startswith("op "):
                    ways.setdefault(step.label, {})[step.backend] = None
                else:
                    ways.setdefault(step.function, {})[step.backend] = None
            for name, used in loose.items():
                ways.setdefault(name, {})[f"op by op on {', '.join(used)}"] = None
            for name in plan.view_groups:
                ways.setdefault(name, {})["views (no kernel)"] = None
        return {name: ", ".join(how) for name, how in ways.items()}

    def summary(self) -> str:
        """The target and its backends; every function with the backend that runs it (or "not
        compiled yet" before the first call of a module with symbolic input shapes); each plan
        made so far; last, the fall-backs. The same before and after the first call where the
        inputs have static shapes: those modules compile at build."""
        self._device_runner()  # what the first call would settle, so the plan lines do not change with it
        lines = [f"target {self.target_name}: " + " -> ".join(b.name for b in self.target)]
        for b in self.target:
            ok, why = b.available()
            lines.append(f"  {b.name:<8} {'available' if ok else 'unavailable: ' + why}")
            lines.extend(f"    {note}" for note in getattr(b, "notes", lambda: ())())
        in_target = {b.name for b in self.target}
        owners = {n: c.unit.prefix for c in self.choices.values() for n in c.by_prefix if n not in in_target}
        for name, prefix in owners.items():  # outside the target, tried first for their prefix
            ok, why = get_backend(name).available()
            lines.append(f"  {name:<8} {'available' if ok else 'unavailable: ' + why} (owns codegen prefix '{prefix}', outside the target)")
        lines.append("functions:")
        broke = {f.unit for f in self.fallbacks if f.runs_on == "op by op"}  # groups whose fused kernel failed
        for key, choice in self.choices.items():
            unit = choice.unit
            text = choice.explain()
            if unit.describe() in broke and choice.backend is not None:
                text += f"; op by op, by fall-back, where {choice.backend.name} failed to compile it"
            if key not in self._compiled:
                text += "; not compiled yet"
            lines.append(f"  {unit.describe():<44} -> {text}")
        if not self._plans:
            lines.append("  (no plan yet: the inputs have symbolic shapes, so each input shape is planned and compiled, ops outside "
                         "groups included, at its first call)")
        for sig, plan in self._plans.items():
            shapes = ", ".join(f"{dt.short(dt.from_numpy(np.dtype(d)))}{list(s)}" for s, d in sig)
            lines.append(f"plan for ({shapes}): {count(len(plan.steps), 'kernel call')}, {count(plan.view_count, 'view')} (no kernel, no copy), "
                         f"arena {plan.peak_bytes} bytes in {count(len(plan.slot_sizes), 'buffer')} "
                         f"(without reuse {plan.unplanned_bytes}), outputs {plan.output_bytes} bytes")
            if self._resident:
                lines.append(f"  {self._resident.note(plan)}")
            if plan.threads_note:
                lines.append(f"  {plan.threads_note}")
            lines.extend(f"  {line}" for line in self._rebinding_note(sig, plan))
            if plan.thread_choice is not None:
                lines.append(f"  {plan.thread_choice.describe()}")
            for name in dict.fromkeys(plan.view_groups):
                lines.append(f"  group {name}: views only, no kernel")
            for name, shapes_, group in plan.decisions:
                lines.append(f"  group {name} at {' '.join(map(str, (list(s) for s in shapes_)))}: {group}")
            in_use = plan.single_steps if plan.thread_choice is not None and plan.thread_choice.current() == 1 else plan.steps
            for step in in_use:  # what a backend chose inside a kernel (flash or segments attention)
                note = getattr(step.kernel, "note", None)
                if note:
                    lines.append(f"  {step.label} ({step.function}) on {step.backend}: {note}")
        if self.fallbacks:
            lines.append(f"fall-backs: {len(self.fallbacks)}")
            lines.extend(f"  {f}" for f in self.fallbacks)
        else:  # worded so that a search for "fall-back" finds only real ones
            lines.append("every unit so far runs on the backend meant for it")
        return "\n".join(lines)

    def _rebinding_note(self, signature, plan: Plan) -> list[str]:
        """What the summary says of a plan of symbolic inputs: which other sizes it serves."""
        family = self._family(signature)
        if family is None:
            return []
        if self._families.get(family[:2]) is not plan:
            why = plan.unbound_why or "a step's backend compiles kernels for the shapes they were compiled at"
            return [f"for these sizes only ({why})"]
        rebound = [sig for sig, p in self._rebound.items() if p.origin is plan]
        sizes = ", ".join(f"{s} {(1 << v.bit_length()) >> 1}..{(1 << v.bit_length()) - 1}" for s, v in sorted(family[2].items()))
        held = f"; {count(len(rebound), 'other signature')} made so far and held" if rebound else ""
        return [f"serves {sizes} by rebinding (dpl.runtime.rebinding){held}"]

    def __repr__(self) -> str:
        return f"<Executable of '{self.entry.name}' for target {self.target_name}, {count(len(self._plans), 'plan')}>"


@attrs.frozen
class ProfileRow:
    index: int
    label: str
    function: str
    backend: str
    median_ms: float
    min_ms: float


@attrs.frozen
class ProfileReport:
    rows: tuple[ProfileRow, ...]
    call_ms: float | None = None  # the median of the whole calls the rows were timed in
    threads: int | None = None  # the thread budget they ran on (None: each pool's own)

    @property
    def total_ms(self) -> float:
        """The steps' medians added up: about :attr:`call_ms`, less the time between steps."""
        return sum(r.median_ms for r in self.rows)

    def __str__(self) -> str:
        out = [f"{'#':>3}  {'kernel':<36} {'function':<24} {'backend':<8} {'median ms':>9} {'min ms':>9}"]
        for r in self.rows:
            out.append(f"{r.index:>3}  {r.label:<36} {r.function:<24} {r.backend:<8} {r.median_ms:>9.4f} {r.min_ms:>9.4f}")
        out.append(f"     {'total':<36} {'':<24} {'':<8} {self.total_ms:>9.4f}")
        if self.call_ms is not None:
            on = "each pool's own threads" if self.threads is None else count(self.threads, "thread")
            out.append(f"     {'whole call (median), ' + on:<70} {self.call_ms:>9.4f}")
        return "\n".join(out)


def _flatten_value(value) -> list:
    if isinstance(value, (tuple, list)):
        return [a for v in value for a in _flatten_value(v)]
    return [value]


def _called_functions(module: Module, fn: Function) -> list[str]:
    """Module functions ``fn`` calls, in order; plain (attribute-free) ones are looked through."""
    out: list[str] = []

    def visit(e):
        if isinstance(e, Call):
            for a in e.args:
                visit(a)
            if isinstance(e.op, GlobalVar) and e.op.name in module.functions and e.op.name not in out:
                callee = module[e.op.name]
                if callee.attrs:
                    out.append(e.op.name)
                else:
                    for b in callee.bindings:
                        visit(b.value)
        elif isinstance(e, Tuple):
            for f in e.fields:
                visit(f)
        elif isinstance(e, TupleGetItem):
            visit(e.tuple_value)

    for b in fn.bindings:
        visit(b.value)
    visit(fn.ret)
    return out


def build(mod: Module, target: Any = "cpu", *, config: FusionConfig | None = None, entry: str = "main", cache: KernelCache | None = None,
          progress: TextIO | bool | None = True, threads: int | None = None, adapt_threads: bool = True,
          strict: bool = False) -> Executable:
    """Build ``mod`` for ``target``: ``"cpu"``, ``"numpy"``, ``"cuda"``, a backend name, a
    Backend, comma-separated names (``"mylib,cpu"``), or a list of them tried in order. A
    function carrying a codegen prefix goes first to the backend registered for that prefix,
    whatever the target. ``progress``: where the C compiles draw their progress line (True: on
    stderr when it is a terminal; None or False: nowhere). ``threads``: the thread budget of
    every call, for the BLAS and the OpenMP kernels alike (None: each pool's own default;
    :mod:`dpl.runtime.threads`). ``adapt_threads``: where the budget allows several threads,
    each call runs on them or on one, whichever recent calls found faster (a loaded machine
    makes more threads far slower; :mod:`dpl.runtime.timed_choice`); False: always the budget.

    Fall-backs (a unit whose backend is unavailable or fails to compile it, a codegen prefix no
    backend owns, a fused group run op by op after a compile error, a target whose first
    backend is unavailable) are warnings on the ``dpl`` logger, each unit named, and
    are listed by ``exe.fallbacks`` and ``exe.summary()``. ``strict``: each is a
    :class:`FallbackError` naming the unit, the backend and the reason instead, raised by the
    build, or by the first call of an input shape where the inputs have symbolic shapes."""
    return Executable(mod, target, config, entry=entry, cache=cache, progress=progress, threads=threads,
                      adapt_threads=adapt_threads, strict=strict)
