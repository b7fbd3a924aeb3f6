"""Shipped as dpl.backends: the registry and the backends dpl ships (numpy, cupy, ...)."""

from dpl.backends.registry import (
    ENTRY_POINT_GROUP, KINDS, TARGETS, Backend, BackendError, Capabilities, Choice, CompileError, Unit,
    UnavailableBackend, backend_origin, backends, candidates, choose, classify, get_backend, load_plugins,
    parse_target, prefix_owners, register_backend, register_codegen, resolve_target, unregister_backend,
    wrapped_composite,
)

__all__ = [
    "ENTRY_POINT_GROUP", "KINDS", "TARGETS", "Backend", "BackendError", "Capabilities", "Choice", "CompileError", "Unit",
    "UnavailableBackend", "backend_origin", "backends", "candidates", "choose", "classify", "get_backend", "load_plugins",
    "parse_target", "prefix_owners", "register_backend", "register_codegen", "resolve_target", "unregister_backend",
    "wrapped_composite",
]
