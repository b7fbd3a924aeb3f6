"""The profile file: measured single-op and fused times, in milliseconds.

The seed's format, extended with shapes::

    {
      "version": 1,
      "single":   {"nn.silu": 0.021, "multiply": 0.018},          # op -> ms
      "fused":    {"<exact key>": 0.025, "nn.silu+multiply": 0.025},  # exact or compatible key -> ms
      "separate": {"<exact key>": 0.041},                          # per shape: the group run op by op
      "groups":   [{"function": ..., "exact_key": ..., "compatible_key": ..., "ops": [...],
                    "input_shapes": [[...]], "input_dtypes": [...], "single": {...},
                    "separate": ..., "fused": ...}]
    }

``single``, ``fused`` and ``separate`` are what the heuristics read; ``groups`` is the record
a person reads. When a key was measured several times the last measurement wins.
"""

from __future__ import annotations

import json
import os

import attrs

from dpl.errors import DplError


class ProfileError(DplError):
    """A profile file that cannot be read or does not have the expected form."""


@attrs.frozen
class ProfileData:
    single: dict = attrs.field(factory=dict)
    fused: dict = attrs.field(factory=dict)
    separate: dict = attrs.field(factory=dict)
    groups: tuple = ()

    def to_json(self) -> dict:
        return {"version": 1, "single": self.single, "fused": self.fused, "separate": self.separate, "groups": list(self.groups)}


_CACHE: dict[str, tuple[tuple[int, int], ProfileData]] = {}


def load_profile(path: str | os.PathLike) -> ProfileData:
    """Read a profile file (re-read when its time stamp or size changed)."""
    path = os.fspath(path)
    try:
        st = os.stat(path)
        stamp = (st.st_mtime_ns, st.st_size)
    except OSError as err:
        raise ProfileError(f"cannot read profile '{path}': {err.strerror}") from None
    hit = _CACHE.get(path)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except json.JSONDecodeError as err:
        raise ProfileError(f"profile '{path}' is not JSON: {err.msg} at line {err.lineno}") from None
    if not isinstance(raw, dict):
        raise ProfileError(f"profile '{path}' must hold a JSON object with 'single' and 'fused'")
    tables = {}
    for key in ("single", "fused", "separate"):
        table = raw.get(key, {})
        if not isinstance(table, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in table.values()):
            raise ProfileError(f"profile '{path}': '{key}' must map names to times in milliseconds")
        tables[key] = {str(k): float(v) for k, v in table.items()}
    data = ProfileData(**tables, groups=tuple(raw.get("groups", ())))
    _CACHE[path] = (stamp, data)
    return data


def save_profile(data: ProfileData, path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data.to_json(), f, indent=2, sort_keys=False)
        f.write("\n")
