"""See what fusion did, and why: coverage (``coverage``), runtime decisions (``decide``),
pictures (``draw``) and the closest misses of rules (``dpl explain``)."""

from dpl.viz.coverage import Coverage, FunctionCoverage, GroupCoverage, LoneOp, RuntimeDecision, coverage
from dpl.viz.runtime import decide

__all__ = ["Coverage", "FunctionCoverage", "GroupCoverage", "LoneOp", "RuntimeDecision", "coverage", "decide"]
