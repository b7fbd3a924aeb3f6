"""Passes over modules: FuseOps (automatic fusion), FuseOpsByPattern (composites), and the
outlining of groups into functions that both share."""

from dpl.transform.fold_constants import fold_constants
from dpl.transform.fuse_by_pattern import annotate_codegen_functions, fuse_ops_by_pattern
from dpl.transform.fuse_ops import FuseOps, fuse_ops, fusion_groups

__all__ = ["FuseOps", "fold_constants", "annotate_codegen_functions", "fuse_ops", "fuse_ops_by_pattern", "fusion_groups"]
