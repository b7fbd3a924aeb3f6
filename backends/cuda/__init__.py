"""The CUDA target: the CUDA emitter (``emitter``, its row kernels in ``rows``), NVRTC, the host
twin that checks the CUDA arithmetic on the CPU (``host``), the CuPy backend (``backend``), its
resident runs and CUDA graphs (``resident``, ``graph``), cuBLASLt and flash attention."""
