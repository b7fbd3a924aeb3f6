"""The fusion runtime's options (the InfiniCore seed's FusionConfig)."""

from __future__ import annotations

import attrs

from dpl.errors import DplError


def _fallback(value: str) -> str:
    if value not in ("fuse", "no_fuse"):
        raise DplError(f"profile_fallback must be 'fuse' or 'no_fuse', got {value!r}")
    return value


def _flag(name: str, value) -> None:
    if not isinstance(value, bool):
        raise DplError(f"{name} must be True or False, got {value!r}")


def _count(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DplError(f"{name} must be a non-negative integer, got {value!r}")


def _margin(value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise DplError(f"margin must be a number >= 0, got {value!r}")


@attrs.frozen
class FusionConfig:
    """When a Primitive group runs as one fused kernel, and what happens when it cannot.

    - ``enable_fusion``: the master switch (rule 0).
    - ``min_nodes_for_fusion`` / ``max_graph_size``: op count bounds of a group (rules 1, 2).
    - ``min_tensor_elements``: every input of the group has at least this many elements (rule 3).
    - ``profile_path``: a profile file written by ``dpl profile``; ``margin``: fuse only when the
      separate time exceeds the fused time by more than this fraction.
    - ``profile_fallback``: ``"fuse"`` or ``"no_fuse"`` when the profile lacks the data.
    - ``fallback_on_error``: run the group op by op when its fused kernel fails to compile,
      instead of raising.
    """

    enable_fusion: bool = attrs.field(default=True, validator=lambda _i, a, v: _flag(a.name, v))
    min_nodes_for_fusion: int = attrs.field(default=2, validator=lambda _i, a, v: _count(a.name, v))
    max_graph_size: int = attrs.field(default=10, validator=lambda _i, a, v: _count(a.name, v))
    min_tensor_elements: int = attrs.field(default=1024, validator=lambda _i, a, v: _count(a.name, v))
    profile_path: str | None = None
    margin: float = attrs.field(default=0.1, validator=lambda _i, a, v: _margin(v))
    profile_fallback: str = attrs.field(default="fuse", validator=lambda _i, _a, v: _fallback(v))
    fallback_on_error: bool = attrs.field(default=True, validator=lambda _i, a, v: _flag(a.name, v))
