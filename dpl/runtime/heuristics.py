"""Should this group run as one fused kernel? The seed's two stages.

Stage one, static rules, in order; the first that fails says no:

0. fusion is enabled;
1. the group has at least ``min_nodes_for_fusion`` ops;
2. and at most ``max_graph_size``;
3. every input has at least ``min_tensor_elements`` elements (off by default, 1024 in
   :meth:`FusionConfig.seed`);
4. every op of the group is one the chosen backend can fuse.

Stage two, the profile: ``separate_time > fused_time * (1 + margin)``. The fused time is
looked up by the exact key (structure + dtypes + shapes), then by the compatible key (op names
joined with ``+``); the separate time is the per-shape measurement under the exact key when the
profile has one, else the sum of the ops' single times. Missing data is decided by
``profile_fallback``: by default ``"model"``, the traffic model of :mod:`dpl.runtime.cost`
(fuse when one kernel's calls, bytes and arithmetic are estimated cheaper than the ops'
apart); the seed's ``"fuse"`` / ``"no_fuse"`` decide flatly. So measurements override the
model per shape (the exact key) or per op sequence (the compatible key).
"""

from __future__ import annotations

import math
from typing import Collection, Sequence

import attrs

from dpl.errors import count
from dpl.ir.expr import Function
from dpl.runtime.config import FusionConfig
from dpl.runtime.cost import group_cost
from dpl.runtime.keys import compatible_key, exact_key, group_ops
from dpl.runtime.profile_data import ProfileData, load_profile
from dpl.runtime.shapes import ShapeError

# the seed's V1 list of fusable ops, in dpl's names (for backends that want the seed's set)
SEED_FUSION_OPS = frozenset({
    "nn.silu", "nn.gelu", "nn.relu", "sigmoid", "add", "multiply", "subtract", "divide", "nn.rms_norm", "nn.layer_norm",
})


@attrs.frozen
class FusionDecision:
    """Fuse or not, which rule or profile branch decided, and why. Truthy when fusing."""

    fuse: bool
    rule: str  # "rule 0".."rule 4", "profile: exact key", "profile: compatible key", "profile: missing data", "model"
    reason: str

    def __bool__(self) -> bool:
        return self.fuse

    def __str__(self) -> str:
        return f"{'fuse' if self.fuse else 'do not fuse'} ({self.rule}: {self.reason})"


class FusionHeuristics:
    def __init__(self, config: FusionConfig | None = None, profile: ProfileData | None = None):
        self.config = config or FusionConfig()
        self._profile = profile

    @property
    def profile(self) -> ProfileData | None:
        if self._profile is not None:
            return self._profile
        if self.config.profile_path is None:
            return None
        return load_profile(self.config.profile_path)

    def should_fuse(
        self,
        graph: Function,
        input_shapes: Sequence[Sequence[int]],
        input_dtypes: Sequence[str] = (),
        supported_ops: Collection[str] | None = None,
    ) -> FusionDecision:
        """Decide for ``graph`` (a Primitive function) at these concrete input shapes.
        ``supported_ops`` is what the chosen backend can fuse (``None``: anything)."""
        cfg = self.config
        ops = group_ops(graph)
        if not cfg.enable_fusion:
            return FusionDecision(False, "rule 0", "fusion is disabled")
        if len(ops) < cfg.min_nodes_for_fusion:
            return FusionDecision(False, "rule 1", f"{count(len(ops), 'op')} < min_nodes_for_fusion {cfg.min_nodes_for_fusion}")
        if len(ops) > cfg.max_graph_size:
            return FusionDecision(False, "rule 2", f"{len(ops)} ops > max_graph_size {cfg.max_graph_size}")
        for param, shape in zip(graph.params, input_shapes):
            n = math.prod(shape)
            if n < cfg.min_tensor_elements:
                return FusionDecision(False, "rule 3", f"input '{param.name}' has {n} elements < min_tensor_elements {cfg.min_tensor_elements}")
        if supported_ops is not None:
            missing = sorted(set(ops) - set(supported_ops))
            if missing:
                return FusionDecision(False, "rule 4", f"the backend cannot fuse {', '.join(missing)}")
        return self._profile_decision(graph, ops, input_shapes, input_dtypes)

    def _profile_decision(self, graph, ops, shapes, dtypes) -> FusionDecision:
        cfg = self.config
        data = self.profile
        exact = exact_key(graph, shapes, [str(d) for d in dtypes])
        compatible = compatible_key(graph)

        def missing(what: str) -> FusionDecision:
            if cfg.profile_fallback == "model":
                return self._model_decision(graph, shapes, what)
            fuse = cfg.profile_fallback == "fuse"
            return FusionDecision(fuse, "profile: missing data", f"{what}; profile_fallback is '{cfg.profile_fallback}'")

        if data is None:
            return missing("no profile file")
        if exact in data.fused:
            branch, fused = "profile: exact key", data.fused[exact]
        elif compatible in data.fused:
            branch, fused = "profile: compatible key", data.fused[compatible]
        else:
            return missing(f"no fused time for '{compatible}' at these shapes")
        if exact in data.separate:
            separate = data.separate[exact]
        else:
            absent = sorted({op for op in ops if op not in data.single})
            if absent:
                return missing(f"no single time for {', '.join(absent)}")
            separate = sum(data.single[op] for op in ops)
        fuse = separate > fused * (1.0 + cfg.margin)
        cmp = ">" if fuse else "<="
        return FusionDecision(fuse, branch, f"separate {separate:.4g} ms {cmp} fused {fused:.4g} ms x (1 + {cfg.margin:g})")

    def _model_decision(self, graph, shapes, what: str) -> FusionDecision:
        try:
            cost = group_cost(graph, shapes)
        except ShapeError:  # a size the caller binds (arange(end=seq) in a group): no price, fuse as the seed did
            return FusionDecision(True, "model", f"{what}; sizes not all known from the group's inputs, fused as by default")
        fuse = cost.seconds(True) < cost.seconds(False)
        return FusionDecision(fuse, "model", f"{what}; {cost}")
