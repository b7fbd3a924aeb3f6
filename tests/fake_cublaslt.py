"""A stand-in for libcublasLt: the functions ``backends/cuda/cublaslt.py`` calls, with cuBLASLt's
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

from dpl.backends.cuda import cublaslt as lt

DTYPES = {lt.CUDA_R_32F: np.dtype(np.float32), lt.CUDA_R_16F: np.dtype(np.float16), lt.CUDA_R_64F: np.dtype(np.float64)}


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
        return self._new(layout, self.layouts, (data_type.value, rows.value, cols.value, ld.value, 1, 0))

    def cublasLtMatrixLayoutSetAttribute(self, layout, attribute, buf, size):  # noqa: N802
        assert isinstance(size, ctypes.c_size_t) and size.value == ctypes.sizeof(buf._obj)
        want = {lt.LAYOUT_BATCH_COUNT: ctypes.c_int32, lt.LAYOUT_STRIDED_BATCH_OFFSET: ctypes.c_int64}[attribute.value]
        assert isinstance(buf._obj, want), f"layout attribute {attribute.value} takes {want.__name__}"
        code, rows, cols, ld, batch, stride = self.layouts[_value(layout)]
        if attribute.value == lt.LAYOUT_BATCH_COUNT:
            batch = _value(buf)
        else:
            stride = _value(buf)
        self.layouts[_value(layout)] = (code, rows, cols, ld, batch, stride)
        return 0

    def cublasLtMatmul(self, handle, desc, alpha, a, a_layout, b, b_layout, beta, c, c_layout, d, d_layout,  # noqa: N802
                       algo, workspace, workspace_size, stream):
        self.calls.append(("matmul", _value(desc)))
        if self.fail_matmul:
            return self.fail_matmul
        attrs = self.descs[_value(desc)]
        assert algo is None and _value(workspace) and _value(workspace_size) == lt.WORKSPACE
        assert attrs[lt.DESC_TRANSA] == attrs[lt.DESC_TRANSB] == lt.CUBLAS_OP_N
        assert _value(beta) == 0.0
        scale, alpha, epilogue = alpha._obj, _value(alpha), attrs[lt.DESC_EPILOGUE]
        A, B, D = self._matrices(a, a_layout), self._matrices(b, b_layout), self._matrices(d, d_layout)
        assert len(A) == len(B) == len(D), "batch counts that differ"
        assert all(x.shape[1] == y.shape[0] and z.shape == (x.shape[0], y.shape[1]) for x, y, z in zip(A, B, D)), \
            "layouts that do not multiply"
        code = self.layouts[_value(d_layout)][0]
        f64 = code == lt.CUDA_R_64F
        assert attrs["compute"] == (lt.CUBLAS_COMPUTE_64F if f64 else lt.CUBLAS_COMPUTE_32F)
        assert attrs["scale"] == (lt.CUDA_R_64F if f64 else lt.CUDA_R_32F)
        assert isinstance(scale, ctypes.c_double if f64 else ctypes.c_float), "alpha in the scale type"
        acc_type = np.float64 if f64 else np.float32
        bias = None if epilogue == lt.EPILOGUE_DEFAULT else self._vector(attrs[lt.DESC_BIAS_POINTER], D[0].shape[0], code)

        def gemm():  # reads its operands when it runs (a replayed graph's inputs are copied in then)
            for x, y, z in zip(A, B, D):
                acc = alpha * (x.astype(acc_type) @ y.astype(acc_type))
                if bias is not None:
                    acc = acc + bias.astype(acc_type)[:, None]
                if epilogue == lt.EPILOGUE_RELU_BIAS:
                    acc = np.maximum(acc, 0)
                elif epilogue == lt.EPILOGUE_GELU_BIAS:
                    acc = 0.5 * acc * (1 + np.tanh(np.sqrt(2 / np.pi) * (acc + 0.044715 * acc**3)))
                else:
                    assert epilogue in (lt.EPILOGUE_BIAS, lt.EPILOGUE_DEFAULT), epilogue
                z[...] = acc.astype(z.dtype)

        if self.cupy is not None:
            self.cupy._run_or_record(gemm)
        else:
            gemm()
        return 0

    def _dtype(self, code):
        return _bf16() if code == lt.CUDA_R_16BF else DTYPES[code]

    def _matrices(self, pointer, layout):
        """The column-major ``rows x cols`` matrices (leading dimension ``ld``) of a strided batch
        at ``pointer``, as writable NumPy views."""
        code, rows, cols, ld, batch, stride = self.layouts[_value(layout)]
        dtype = self._dtype(code)
        size = cols * ld if batch == 1 else (batch - 1) * stride + cols * ld
        raw = (ctypes.c_char * (size * dtype.itemsize)).from_address(_value(pointer))
        flat = np.frombuffer(raw, dtype)
        return [flat[i * stride:i * stride + cols * ld].reshape(cols, ld)[:, :rows].T for i in range(batch)]

    def _vector(self, pointer, n, code):
        dtype = self._dtype(code)
        raw = (ctypes.c_char * (n * dtype.itemsize)).from_address(pointer)
        return np.frombuffer(raw, dtype)
