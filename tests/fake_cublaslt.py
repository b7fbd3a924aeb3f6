"""A stand-in for libcublasLt: the functions ``backends/cublaslt.py`` calls, with cuBLASLt's
column-major meaning, computed in NumPy on memory at the addresses given (the stand-in CuPy's
"device" arrays live in host memory).

So the binding's whole argument logic is checked without a GPU: the ctypes values of each
argument, the descriptor attributes (epilogue, bias pointer, transposes), the layouts (rows,
columns, leading dimension) and the row-major to column-major swap of the operands. Every call
is recorded. Given the stand-in CuPy, a GEMM launched while its stream captures goes into the
graph (as on a GPU) instead of running.
"""

import ctypes
import itertools

import numpy as np

from dpl.backends import cublaslt as lt

DTYPES = {lt.CUDA_R_32F: np.dtype(np.float32), lt.CUDA_R_16F: np.dtype(np.float16)}


def _bf16():
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def _value(arg):
    """What a ctypes argument holds (``byref(x)`` gives ``x``)."""
    obj = getattr(arg, "_obj", arg)
    return obj.value if hasattr(obj, "value") else obj


class FakeCublasLt:
    def __init__(self, cupy=None, fail_matmul: int = 0):
        self.cupy = cupy  # the FakeCupy whose stream captures
        self.fail_matmul = fail_matmul  # a status cublasLtMatmul answers (0: it runs)
        self.calls: list[tuple] = []
        self.descs: dict[int, dict] = {}
        self.layouts: dict[int, tuple] = {}
        self._ids = itertools.count(0x1000)

    def _new(self, out, table, value) -> int:
        handle = next(self._ids)
        table[handle] = value
        out._obj.value = handle
        return 0

    def cublasLtCreate(self, handle):  # noqa: N802 (the C names)
        self.calls.append(("create",))
        handle._obj.value = 1
        return 0

    def cublasLtMatmulDescCreate(self, desc, compute, scale):  # noqa: N802
        assert isinstance(compute, ctypes.c_int) and isinstance(scale, ctypes.c_int)
        self.calls.append(("desc", compute.value, scale.value))
        return self._new(desc, self.descs, {"compute": compute.value, "scale": scale.value})

    def cublasLtMatmulDescSetAttribute(self, desc, attribute, buf, size):  # noqa: N802
        assert isinstance(size, ctypes.c_size_t) and size.value == ctypes.sizeof(buf._obj)
        self.descs[_value(desc)][attribute.value] = _value(buf)
        return 0

    def cublasLtMatrixLayoutCreate(self, layout, data_type, rows, cols, ld):  # noqa: N802
        assert (type(rows), type(cols), type(ld)) == (ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64), "64-bit sizes"
        self.calls.append(("layout", data_type.value, rows.value, cols.value, ld.value))
        return self._new(layout, self.layouts, (data_type.value, rows.value, cols.value, ld.value))

    def cublasLtMatmul(self, handle, desc, alpha, a, a_layout, b, b_layout, beta, c, c_layout, d, d_layout,  # noqa: N802
                       algo, workspace, workspace_size, stream):
        self.calls.append(("matmul", _value(desc)))
        if self.fail_matmul:
            return self.fail_matmul
        attrs = self.descs[_value(desc)]
        assert attrs["compute"] == lt.CUBLAS_COMPUTE_32F and algo is None
        assert attrs[lt.DESC_TRANSA] == attrs[lt.DESC_TRANSB] == lt.CUBLAS_OP_N
        A, B = self._matrix(a, a_layout), self._matrix(b, b_layout)
        D = self._matrix(d, d_layout)
        assert A.shape[1] == B.shape[0] and D.shape == (A.shape[0], B.shape[1]), "layouts that do not multiply"
        assert _value(beta) == 0.0
        alpha, epilogue = _value(alpha), attrs[lt.DESC_EPILOGUE]
        bias = self._vector(attrs[lt.DESC_BIAS_POINTER], D.shape[0], self.layouts[_value(d_layout)][0])

        def gemm():
            acc = alpha * (A.astype(np.float32) @ B.astype(np.float32)) + bias.astype(np.float32)[:, None]
            if epilogue == lt.EPILOGUE_RELU_BIAS:
                acc = np.maximum(acc, 0)
            elif epilogue == lt.EPILOGUE_GELU_BIAS:
                acc = 0.5 * acc * (1 + np.tanh(np.sqrt(2 / np.pi) * (acc + 0.044715 * acc**3)))
            else:
                assert epilogue == lt.EPILOGUE_BIAS, epilogue
            D[...] = acc.astype(D.dtype)

        if self.cupy is not None:
            self.cupy._run_or_record(gemm)
        else:
            gemm()
        return 0

    def _dtype(self, code):
        return _bf16() if code == lt.CUDA_R_16BF else DTYPES[code]

    def _matrix(self, pointer, layout):
        """The column-major ``rows x cols`` matrix (leading dimension ``ld``) at ``pointer``,
        as a writable NumPy view."""
        code, rows, cols, ld = self.layouts[_value(layout)]
        dtype = self._dtype(code)
        raw = (ctypes.c_char * (cols * ld * dtype.itemsize)).from_address(_value(pointer))
        return np.frombuffer(raw, dtype).reshape(cols, ld)[:, :rows].T

    def _vector(self, pointer, n, code):
        dtype = self._dtype(code)
        raw = (ctypes.c_char * (n * dtype.itemsize)).from_address(pointer)
        return np.frombuffer(raw, dtype)
