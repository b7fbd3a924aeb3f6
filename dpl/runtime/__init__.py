"""The runtime: build a module for a target, run it, and decide which groups to fuse.

``build`` makes an :class:`Executable`; ``FusionConfig``, ``FusionHeuristics`` and
``FusionScheduler`` are the InfiniCore seed's fusion runtime; ``profile_module`` writes the
profile file the heuristics read.
"""

from dpl.runtime.cache import KernelCache
from dpl.runtime.config import FusionConfig
from dpl.runtime.executable import Executable, Fallback, FallbackError, ProfileReport, RunError, build, check_target
from dpl.runtime.heuristics import SEED_FUSION_OPS, FusionDecision, FusionHeuristics
from dpl.runtime.keys import compatible_key, exact_key, graph_structure
from dpl.runtime.plan import Plan
from dpl.runtime.profile_data import ProfileData, ProfileError, load_profile, save_profile
from dpl.runtime.profiler import profile_module
from dpl.runtime.scheduler import FusionError, FusionScheduler, ScheduledGroup
from dpl.runtime.shapes import ShapeError

__all__ = [
    "Executable", "Fallback", "FallbackError", "FusionConfig", "FusionDecision", "FusionError", "FusionHeuristics", "FusionScheduler",
    "KernelCache", "Plan", "ProfileData", "ProfileError", "ProfileReport", "RunError", "SEED_FUSION_OPS",
    "ScheduledGroup", "ShapeError", "build", "check_target", "compatible_key", "exact_key", "graph_structure", "load_profile",
    "profile_module", "save_profile",
]
