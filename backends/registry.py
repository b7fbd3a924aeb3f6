"""The backend registry: who can run what, and the targets that order them.

A backend is data plus a small class: a name, the codegen prefixes it owns, a
:class:`Capabilities` table and ``compile(function, ...)`` returning a kernel. A kernel uses
destination passing: ``kernel(inputs, outputs)`` reads the flat list of input arrays and
writes every output array in place; it never writes an input. The whole contract a backend
keeps is docs/writing-a-backend.md.

Backends come from three places: the ones shipped here, ``register_codegen("prefix")`` in the
running process, and installed plugins that declare an entry point in the group
``dpl.backends`` (the object named there is a Backend subclass, an instance, or a function
returning one). When two share a name, an in-process registration wins over an installed
plugin, and a plugin over a shipped backend; every replacement is logged as a warning.

A target is an ordered list of backends; each function runs on the first one that is
available and capable, and every backend passed over is recorded with the reason. A function
carrying a codegen prefix (a ``Codegen`` wrapper, a ``prefix.name`` composite) goes first to
the registered backends that own the prefix, whatever the target, as TVM's RunCodegen
dispatches by the ``Codegen`` attribute; the target is its fall-back. The shipped backends
share their prefixes (``kernel``, ``cublas``) and leave that choice to the target.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.metadata
import logging
from typing import Any, Callable, Iterable, Mapping, Sequence

import attrs
import numpy as np

from dpl.errors import DplError
from dpl.ir.expr import Call, Function, GlobalVar, Module, Tuple, TupleGetItem
from dpl.ir.types import TensorType, TupleType, Type

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "dpl.backends"

KINDS = ("op", "primitive", "composite", "codegen", "function")

Kernel = Callable[[Sequence[np.ndarray], Sequence[np.ndarray]], None]


class CompileError(DplError):
    """A backend could not compile a function it was offered."""


class BackendError(DplError):
    """A backend or target name that does not resolve, or a plugin that does not load."""


@attrs.frozen
class Capabilities:
    """What a backend can run. ``None`` means "anything" for dtypes and ops.

    The defaults claim only the backend's own codegen prefixes: composites and codegen
    wrappers named ``prefix.*``. Single ops and fused groups are claimed by naming their kinds.
    """

    kinds: frozenset[str] = attrs.field(default=frozenset(("composite", "codegen")), converter=frozenset)
    composites: tuple[str, ...] = attrs.field(default=(), converter=tuple)  # fnmatch globs over composite names
    dtypes: frozenset[str] | None = attrs.field(default=None, converter=lambda v: None if v is None else frozenset(v))
    ops: frozenset[str] | None = attrs.field(default=None, converter=lambda v: None if v is None else frozenset(v))


@attrs.frozen
class Unit:
    """One thing to run: a single op, a Primitive group, a composite or a codegen wrapper.

    ``name`` is the op name, the composite name, the codegen prefix or the function name;
    ``composites`` are the composite names a codegen wrapper calls; ``ops`` every op inside.
    """

    kind: str
    name: str
    function: Function
    ops: tuple[str, ...]
    dtypes: frozenset[str]
    composites: tuple[str, ...] = ()

    @property
    def prefix(self) -> str | None:
        if self.kind == "codegen":
            return self.name
        if self.kind == "composite":
            return self.name.split(".", 1)[0]
        return None

    def describe(self) -> str:
        if self.kind == "op":
            return f"op {self.name}"
        if self.kind in ("composite", "codegen"):
            return f"{self.kind} '{self.name}' ({self.function.name})"
        return f"{self.kind} function '{self.function.name}'"


class Backend:
    """Base of every backend. Subclasses set the class attributes and override ``compile``."""

    name: str = "backend"
    prefixes: tuple[str, ...] = ()
    capabilities: Capabilities = Capabilities()
    # functions carrying one of ``prefixes`` come here first under any target (False for the
    # shipped backends, which share their prefixes and leave the choice to the target)
    dispatch_by_prefix: bool = True
    # a kernel compiled for a function with symbolic dims runs right at every binding of them
    # (compile's shapes guide only choices of speed), so a plan may serve other sizes with it
    # (dpl.runtime.rebinding); False: a kernel is for the shapes it was compiled at
    shape_generic: bool = False

    def available(self) -> tuple[bool, str]:
        """Whether this backend can run on this machine, and why not."""
        return True, "available"

    def compile(self, function: Function, *, module: Module | None = None, shapes: Sequence[tuple[int, ...]] = ()) -> Kernel:
        """A kernel for ``function`` at these concrete input ``shapes``; raise CompileError when not."""
        raise CompileError(f"backend '{self.name}' does not compile anything")

    def can_run(self, unit: Unit) -> tuple[bool, str]:
        """Whether the capability table covers ``unit``, and why not."""
        caps = self.capabilities
        if unit.kind not in caps.kinds:
            return False, f"runs no {unit.kind} functions"
        if caps.dtypes is not None and not unit.dtypes <= caps.dtypes:
            return False, f"has no support for dtype {', '.join(sorted(unit.dtypes - caps.dtypes))}"
        if unit.kind == "composite" and not self._claims(unit.name):
            return False, f"has no kernel for composite '{unit.name}'"
        if unit.kind == "codegen" and unit.prefix not in self.prefixes:
            unclaimed = [c for c in unit.composites if not self._claims(c)]
            if unclaimed or not unit.composites:
                return False, f"does not own codegen prefix '{unit.prefix}'"
        if unit.kind in ("op", "primitive") and caps.ops is not None:
            missing = sorted(set(unit.ops) - caps.ops)
            if missing:
                return False, f"has no kernel for op {', '.join(missing)}"
        return True, "capable"

    def _claims(self, composite: str) -> bool:
        prefix = composite.split(".", 1)[0]
        return prefix in self.prefixes or any(fnmatch.fnmatchcase(composite, g) for g in self.capabilities.composites)

    def __repr__(self) -> str:
        return f"<backend {self.name}>"


class UnavailableBackend(Backend):
    """A backend the design names but this installation cannot provide; it says why."""

    def __init__(self, name: str, prefixes: Sequence[str], reason: str):
        self.name, self.prefixes, self.reason = name, tuple(prefixes), reason

    def available(self) -> tuple[bool, str]:
        return False, self.reason


# ---------------------------------------------------------------------------------------------
# the registry

_BACKENDS: dict[str, Backend] = {}
_ORIGINS: dict[str, str] = {}  # name -> "shipped", "in-process" or "plugin NAME (module:attr)"
_PLUGIN_ERRORS: dict[str, str] = {}
_plugins_loaded = False
_builtin_loaded = False
# the backends dpl ships, found by name as plugins are (they build on this module, a layer below them)
SHIPPED_BACKENDS = ("dpl.backends.numpy_backend:NumpyBackend", "dpl.backends.numpy_backend:NumpyKernelBackend",
                    "dpl.backends.cuda.backend:CupyBackend", "dpl.backends.cpu.backend:CpuBackend")

IN_PROCESS, SHIPPED = "in-process", "shipped"

# named targets: the order in which backends are tried
TARGETS: dict[str, tuple[str, ...]] = {
    "numpy": ("numpy",),
    "cpu": ("cpu", "numpy"),
    "cuda": ("cupy", "cpu", "numpy"),
    "numpy-kernel": ("numpy-kernel", "numpy"),  # fused groups through dpl.kernel, the rest by reference
}


def register_backend(backend: Backend, *, replace: bool = True, origin: str = IN_PROCESS) -> Backend:
    """Add ``backend`` under its name; ``origin`` says where it came from (for the precedence
    rules and the warning logged when it replaces another). A real backend replaces a
    placeholder of the same name silently."""
    if not isinstance(backend, Backend):
        raise BackendError(f"{backend!r} is not a dpl Backend")
    old = _BACKENDS.get(backend.name)
    if old is not None and not isinstance(old, UnavailableBackend):
        if not replace:
            raise BackendError(f"a backend named '{backend.name}' is already registered")
        if old is not backend:
            log.warning("backend '%s' (%s) replaces the one registered before (%s)", backend.name, origin, _ORIGINS.get(backend.name, "?"))
    _BACKENDS[backend.name] = backend
    _ORIGINS[backend.name] = origin
    return backend


def unregister_backend(name: str) -> None:
    _BACKENDS.pop(name, None)
    _ORIGINS.pop(name, None)


def backend_origin(name: str) -> str | None:
    """Where the backend registered as ``name`` came from: "shipped", "in-process" or the plugin."""
    return _ORIGINS.get(name)


def _as_backend(obj: Any, prefix: str | None = None) -> Backend:
    """A Backend from a subclass, an instance, or a plain compile function."""
    if isinstance(obj, type) and issubclass(obj, Backend):
        obj = obj()
    elif not isinstance(obj, Backend) and callable(obj):
        obj = _FunctionBackend(prefix or getattr(obj, "__name__", "plugin"), obj)
    if not isinstance(obj, Backend):
        raise BackendError(f"{obj!r} is neither a Backend nor a compile function")
    if prefix is not None and obj.name == Backend.name:  # an unnamed backend takes its prefix's name
        obj.name = prefix
    if prefix is not None and prefix not in obj.prefixes:
        obj.prefixes = (*obj.prefixes, prefix)
    return obj


class _FunctionBackend(Backend):
    """``@register_codegen("x") def compile(fn, module=..., shapes=...)`` — a backend from a function."""

    capabilities = Capabilities(kinds=("composite", "codegen"))

    def __init__(self, name: str, fn: Callable[..., Kernel]):
        self.name, self._fn = name, fn

    def compile(self, function, *, module=None, shapes=()):
        return self._fn(function, module=module, shapes=shapes)


def register_codegen(prefix: str, backend: Any = None):
    """Claim codegen ``prefix`` for a backend, in-process.

    Use as a decorator on a Backend subclass or a compile function, or call it with an
    instance: ``register_codegen("mylib", MyBackend())``. Returns what it was given. An
    installed plugin of the same name never replaces it (a warning says so).
    """
    if not isinstance(prefix, str) or not prefix or "." in prefix:
        raise BackendError(f"a codegen prefix is a name without dots, got {prefix!r}")

    def decorate(obj):
        register_backend(_as_backend(obj, prefix))
        return obj

    return decorate if backend is None else decorate(backend)


def load_plugins(*, reload: bool = False) -> dict[str, str]:
    """Register every backend installed under the entry-point group ``dpl.backends``.

    A plugin that fails to load never breaks dpl: it becomes an unavailable backend whose
    reason is the error. A plugin whose backend has the name of an in-process registration is
    not used (a warning says so). Returns the errors by entry-point name.
    """
    global _plugins_loaded
    if _plugins_loaded and not reload:
        return dict(_PLUGIN_ERRORS)
    _plugins_loaded = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        origin = f"plugin {ep.name} ({ep.value})"
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, type) and not isinstance(obj, Backend):
                obj = obj()  # a factory
            backend = _as_backend(obj)
            _PLUGIN_ERRORS.pop(ep.name, None)
        except Exception as err:  # a broken plugin is reported, not fatal
            reason = f"plugin '{ep.name}' ({ep.value}) failed to load: {type(err).__name__}: {err}"
            _PLUGIN_ERRORS[ep.name] = reason
            log.warning("%s", reason)
            if ep.name not in _BACKENDS:  # its entry point's name is most likely its prefix too:
                # functions of that prefix then say why the plugin is missing
                register_backend(UnavailableBackend(ep.name, (ep.name,), reason), origin=origin)
            continue
        if _ORIGINS.get(backend.name) == IN_PROCESS:
            log.warning("installed %s is not used: backend '%s' is registered in-process, which takes precedence",
                        origin, backend.name)
            continue
        if _ORIGINS.get(backend.name) == origin:  # the same entry point loaded again
            unregister_backend(backend.name)
        register_backend(backend, origin=origin)
    return dict(_PLUGIN_ERRORS)


def _ensure_builtin() -> None:
    global _builtin_loaded
    if _builtin_loaded:
        return
    _builtin_loaded = True
    for where in SHIPPED_BACKENDS:
        module, _, name = where.partition(":")
        make = getattr(importlib.import_module(module), name)
        if make.name not in _BACKENDS:  # one registered before (in-process) takes precedence
            register_backend(make(), origin=SHIPPED)


def get_backend(name: str) -> Backend:
    _ensure_builtin()
    load_plugins()
    if name not in _BACKENDS:
        raise BackendError(f"unknown backend '{name}' (registered: {', '.join(sorted(_BACKENDS))})")
    return _BACKENDS[name]


def backends() -> dict[str, Backend]:
    """Every registered backend by name (built-in, in-process and plugins)."""
    _ensure_builtin()
    load_plugins()
    return dict(_BACKENDS)


def parse_target(text: str) -> tuple[str, ...]:
    """The names of a target written as text: ``"cpu"``, ``"mylib,cpu"`` (for ``--target``).

    Only the syntax is checked here; :func:`resolve_target` says whether the names exist.
    """
    if not isinstance(text, str):
        raise BackendError(f"a target is written as text, got {type(text).__name__}")
    names = tuple(part.strip() for part in text.split(","))
    if not text.strip() or any(not n for n in names):
        raise BackendError(f"target '{text}' has an empty name", hint="write backend or target names separated by commas, e.g. mylib,cpu")
    return names


def resolve_target(target: str | Backend | Iterable[str | Backend]) -> tuple[Backend, ...]:
    """The ordered backends of a target: a named target, a backend name, comma-separated names
    (``"mylib,cpu"``), or a list of any of these and Backends."""
    if isinstance(target, (str, Backend)):
        target = [target]
    if not isinstance(target, Iterable):
        raise BackendError(f"a target is a name, a Backend or a list of them, got {target!r}", hint=f"named targets: {', '.join(TARGETS)}")
    out: list[Backend] = []
    for item in target:
        if isinstance(item, Backend):
            out.append(item)
            continue
        if not isinstance(item, str):
            raise BackendError(f"a target is a name or a Backend, got {item!r}")
        for name in parse_target(item):
            if name in TARGETS:
                out.extend(get_backend(n) for n in TARGETS[name])
                continue
            try:
                out.append(get_backend(name))
            except BackendError as err:
                raise BackendError(err.message, hint=f"named targets: {', '.join(TARGETS)}") from None
    if not out:
        raise BackendError("the target names no backend")
    unique: dict[str, Backend] = {}
    for b in out:
        unique.setdefault(b.name, b)
    return tuple(unique.values())


def prefix_owners(prefix: str | None) -> tuple[Backend, ...]:
    """The registered backends that take functions of codegen ``prefix`` under any target."""
    if prefix is None:
        return ()
    return tuple(b for b in backends().values() if b.dispatch_by_prefix and prefix in b.prefixes)


# ---------------------------------------------------------------------------------------------
# what a function is, for choosing its backend


def _leaf_dtypes(ty: Type) -> set[str]:
    if isinstance(ty, TupleType):
        return set().union(*(_leaf_dtypes(t) for t in ty.fields)) if ty.fields else set()
    return {ty.dtype}


def function_ops(fn: Function, module: Module | None) -> tuple[str, ...]:
    """Every op called in ``fn``, in order, following calls of module functions."""
    out: list[str] = []

    def visit(e):
        if isinstance(e, Call):
            for a in e.args:
                visit(a)
            if isinstance(e.op, str):
                out.append(e.op)
            elif module is not None and e.op.name in module.functions:
                out.extend(function_ops(module[e.op.name], module))
        elif isinstance(e, Tuple):
            for f in e.fields:
                visit(f)
        elif isinstance(e, TupleGetItem):
            visit(e.tuple_value)

    for b in fn.bindings:
        visit(b.value)
    visit(fn.ret)
    return tuple(out)


def function_dtypes(fn: Function) -> frozenset[str]:
    tys = [p.ty for p in fn.params] + [b.var.ty for b in fn.bindings] + [fn.ret.ty]
    return frozenset(set().union(*(_leaf_dtypes(t) for t in tys)))


def classify(fn: Function, module: Module | None) -> Unit:
    """The unit a call of module function ``fn`` is: codegen, composite, primitive or plain."""
    ops, dts = function_ops(fn, module), function_dtypes(fn)
    attrs_ = fn.attrs
    if "Codegen" in attrs_:
        inner = []
        for b in fn.bindings:
            v = b.value
            if isinstance(v, Call) and isinstance(v.op, GlobalVar) and module is not None and v.op.name in module.functions:
                comp = module[v.op.name].attrs.get("Composite")
                if comp:
                    inner.append(comp)
        return Unit("codegen", str(attrs_["Codegen"]), fn, ops, dts, tuple(inner))
    if "Composite" in attrs_:
        return Unit("composite", str(attrs_["Composite"]), fn, ops, dts)
    if attrs_.get("Primitive"):
        return Unit("primitive", fn.name, fn, ops, dts)
    return Unit("function", fn.name, fn, ops, dts)


@attrs.frozen
class Choice:
    """The backend chosen for a unit, and every backend passed over before it, with reasons.

    ``by_prefix`` names the backends tried first because they own the unit's codegen prefix.
    ``fell_back`` is the part of ``passed_over`` that is a fall-back: a backend that would have
    run the unit but is unavailable or failed to compile it, an owner of its prefix that cannot
    run it, or a prefix no backend owns (named by the prefix). The rest is the target's order
    at work: a backend whose capability table does not cover the unit.
    """

    unit: Unit
    backend: Backend | None
    passed_over: tuple[tuple[str, str], ...]  # (backend name, reason)
    by_prefix: tuple[str, ...] = ()
    fell_back: tuple[tuple[str, str], ...] = ()

    @property
    def by_fallback(self) -> bool:
        return bool(self.fell_back)

    def explain(self) -> str:
        if self.backend is None:
            return "no backend of the target can run it: " + "; ".join(f"{n} {r}" for n, r in self.passed_over)
        if self.fell_back:  # the order's own passes ("cpu does not own codegen prefix ...") would only add noise
            return f"{self.backend.name} by fall-back (" + "; ".join(f"{n} {r}" for n, r in self.fell_back) + ")"
        if self.passed_over:
            return f"{self.backend.name} (" + "; ".join(f"{n} {r}" for n, r in self.passed_over) + ")"
        if self.backend.name in self.by_prefix:
            return f"{self.backend.name} (owns codegen prefix '{self.unit.prefix}')"
        return f"{self.backend.name} (first choice)"


def candidates(unit: Unit, target: Sequence[Backend]) -> tuple[tuple[Backend, ...], tuple[str, ...]]:
    """The backends to try for ``unit`` in order: the owners of its codegen prefix first (under
    any target), then the target's. Also the names of the owners put first."""
    owners = prefix_owners(unit.prefix)
    names = tuple(b.name for b in owners)
    return (*owners, *(b for b in target if b.name not in names)), names


def unowned_prefix(unit: Unit) -> str | None:
    """The codegen prefix ``unit`` names (a ``Codegen`` wrapper's, a ``prefix.name``
    composite's) when no registered backend declares it, else None."""
    if unit.kind == "codegen" or (unit.kind == "composite" and "." in unit.name):
        if not any(unit.prefix in b.prefixes for b in backends().values()):
            return unit.prefix
    return None


def choose(unit: Unit, target: Sequence[Backend], skip: Mapping[str, str] | None = None) -> Choice:
    """The first backend that is available and capable for ``unit``: an owner of its codegen
    prefix, else the first of ``target``."""
    order, by_prefix = candidates(unit, target)
    passed: list[tuple[str, str]] = []
    fell: list[tuple[str, str]] = []
    prefix = unowned_prefix(unit)
    if prefix is not None:
        fell.append((prefix, f"is not a registered backend: no backend owns codegen prefix '{prefix}'"))
    for backend in order:
        if skip and backend.name in skip:
            passed.append((backend.name, skip[backend.name]))
            fell.append(passed[-1])
            continue
        ok, why = backend.available()
        if not ok:
            passed.append((backend.name, f"is unavailable: {why}"))
            fell.append(passed[-1])
            continue
        ok, why = backend.can_run(unit)
        if not ok:
            passed.append((backend.name, why))
            if backend.name in by_prefix:  # it owns the prefix: the unit was meant for it
                fell.append(passed[-1])
            continue
        return Choice(unit, backend, tuple(passed), by_prefix, tuple(fell))
    return Choice(unit, None, tuple(passed), by_prefix, tuple(fell))


# ---------------------------------------------------------------------------------------------
# helpers for kernels: the composite of a wrapper; flat lists of arrays <-> the nested values
# of a function's signature


def wrapped_composite(function: Function, module: Module | None) -> Function:
    """The composite a ``Codegen`` wrapper calls (its whole body is one call of it with the
    wrapper's parameters, as FuseOpsByPattern writes it); any other function is itself."""
    if "Codegen" not in function.attrs:
        return function
    body = function.bindings
    if (module is None or len(body) != 1 or not isinstance(body[0].value, Call) or not isinstance(body[0].value.op, GlobalVar)
            or body[0].value.op.name not in module.functions
            or list(body[0].value.args) != list(function.params) or function.ret is not body[0].var):
        raise CompileError(f"codegen function '{function.name}' is not a plain call of one composite")
    return module[body[0].value.op.name]


def flatten(value: Any) -> list[np.ndarray]:
    if isinstance(value, tuple):
        return [a for v in value for a in flatten(v)]
    return [value]


def unflatten(types: Sequence[Type], flat: Sequence[np.ndarray]) -> list[Any]:
    it = iter(flat)

    def build(ty):
        if isinstance(ty, TupleType):
            return tuple(build(t) for t in ty.fields)
        return next(it)

    return [build(t) for t in types]


def leaf_types(ty: Type) -> list[TensorType]:
    if isinstance(ty, TupleType):
        return [t for f in ty.fields for t in leaf_types(f)]
    return [ty]
