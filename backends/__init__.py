"""Shipped as dpl.backends: the registry and the backends dpl ships (numpy, cupy, ...)."""

from dpl.backends.registry import (
    ENTRY_POINT_GROUP, TARGETS, Backend, BackendError, Capabilities, Choice, CompileError, Unit,
    UnavailableBackend, backends, choose, classify, get_backend, load_plugins, register_backend,
    register_codegen, resolve_target, unregister_backend,
)

__all__ = [
    "ENTRY_POINT_GROUP", "TARGETS", "Backend", "BackendError", "Capabilities", "Choice", "CompileError", "Unit",
    "UnavailableBackend", "backends", "choose", "classify", "get_backend", "load_plugins", "register_backend",
    "register_codegen", "resolve_target", "unregister_backend",
]
