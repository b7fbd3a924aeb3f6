"""The CPU target: generated C compiled by the system's compiler (``backend``, ``toolchain``), the
products' provider and its measured choice (``blas``, ``products_choice``), dpl's packed products
(``packed_gemm``), flash attention and its decode-step form (``decode_attention``), im2col, max pooling, and the segments that run a group's
products between generated kernels (``segments``, which the CUDA target shares)."""
