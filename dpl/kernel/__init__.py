"""One kernel per fused group: the kernel IR, lowering, a NumPy evaluator, a traffic model,
and the row-fusion partitioner (``fuse_reductions``)."""

from dpl.kernel.evaluate import KernelEvalError, evaluate
from dpl.kernel.ir import Buffer, Kernel, print_kernel, to_c
from dpl.kernel.lower import LoweringError, is_kernel_function, lower_function, lower_module
from dpl.kernel import rules as _rules  # noqa: F401 (fills lower.RULES)
from dpl.kernel import rules_image as _rules_image  # noqa: F401 (resize, convolutions of any rank, group norm)

__all__ = [
    "Buffer", "Kernel", "KernelEvalError", "LoweringError", "evaluate", "is_kernel_function", "lower_function",
    "lower_module", "print_kernel", "to_c",
]
