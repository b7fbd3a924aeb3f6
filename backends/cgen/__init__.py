"""The C that both targets share: the statement emitter of the kernel IR (``emitter``: the CPU's
kernels, and the body the CUDA wrapper maps onto threads) and the allocator of C names (``names``)."""
