"""Shipped as dpl.backends: the registry and the backends dpl ships (numpy, cupy, ...).

For backend authors: the registry (``Backend``, ``Capabilities``, ``register_codegen``, ...),
``read_composite`` (a composite as plain data, ``dpl.backends.composite``) and ``KernelCache``
(dpl's disk cache of compiled C, ``dpl.backends.cpu.toolchain``). Those two are imported on
first use: ``import dpl`` loads this package, and neither is needed to run a model."""

from dpl.backends.registry import (
    ENTRY_POINT_GROUP, KINDS, TARGETS, Backend, BackendError, Capabilities, Choice, CompileError, Unit,
    UnavailableBackend, backend_origin, backends, candidates, choose, classify, get_backend, load_plugins,
    parse_target, prefix_owners, register_backend, register_codegen, resolve_target, unregister_backend,
    wrapped_composite,
)

__all__ = [
    "ENTRY_POINT_GROUP", "KINDS", "TARGETS", "Backend", "BackendError", "Capabilities", "Choice", "CompileError",
    "Composite", "CompositeError", "KernelCache", "Unit", "UnavailableBackend", "backend_origin", "backends", "candidates",
    "choose", "classify", "get_backend", "load_plugins", "parse_target", "prefix_owners", "read_composite",
    "register_backend", "register_codegen", "resolve_target", "unregister_backend", "wrapped_composite",
]


# name -> the module that defines it, imported when the name is first asked for
_LAZY = {"Composite": "dpl.backends.composite", "CompositeError": "dpl.backends.composite",
         "read_composite": "dpl.backends.composite", "KernelCache": "dpl.backends.cpu.toolchain"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dpl.backends' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
