"""cuBLASLt through ctypes: ``cublas.matmul_bias(_act)`` as one GEMM with its epilogue.

CuPy has no high-level binding of cuBLASLt, whose epilogues add the bias and apply ReLU or
(tanh) GELU while the GEMM's tile is still in registers, so this is a small one: a handle,
a matmul descriptor (compute in f32; the epilogue and the bias pointer set as attributes),
three matrix layouts and ``cublasLtMatmul`` with no algorithm given (cuBLASLt then asks its
own heuristics).

dpl's arrays are row-major and cuBLASLt's column-major: ``out[m, n] = x[m, k] @ w[k, n]`` is
the column-major ``out^T[n, m] = w^T[n, k] @ x^T[k, m]``, and a row-major array is its own
transpose in column-major, so A is ``w`` (n x k, leading dimension n), B is ``x`` (k x m,
leading dimension k), D is ``out`` (n x m, leading dimension n), no transposes; the bias, one
value per row of D, is one per output feature. Leading batch dimensions of ``x`` fold into m.

:func:`plan_of` reads the composite (which of its parameters is x, w and b, and which
epilogue), or says why cuBLASLt cannot run it (erf GELU and SiLU have no epilogue); the
backend then runs the product and a generated epilogue kernel, and records why.
"""

from __future__ import annotations

import ctypes
import importlib.util
import math
from pathlib import Path

import attrs

from dpl import dtypes as dt
from dpl.errors import DplError
from dpl.ir.expr import Call, Function, Var

# cublasLt.h / library_types.h
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14
CUBLAS_COMPUTE_32F = 68
DESC_TRANSA, DESC_TRANSB, DESC_EPILOGUE, DESC_BIAS_POINTER = 3, 4, 7, 8
EPILOGUE_BIAS, EPILOGUE_RELU_BIAS, EPILOGUE_GELU_BIAS = 4, 6, 36
CUBLAS_OP_N = 0

DATA_TYPES = {"float32": CUDA_R_32F, "float16": CUDA_R_16F, "bfloat16": CUDA_R_16BF}
EPILOGUES = {None: EPILOGUE_BIAS, "nn.relu": EPILOGUE_RELU_BIAS, "nn.gelu_tanh": EPILOGUE_GELU_BIAS}
NO_EPILOGUE = {"nn.gelu": "cuBLASLt's GELU epilogue is the tanh approximation, nn.gelu is erf's",
               "nn.silu": "cuBLASLt has no SiLU epilogue"}
WORKSPACE = 32 << 20


class CublasLtError(DplError):
    """libcublasLt is missing, or a call of it failed."""


@attrs.frozen
class LtPlan:
    """Which parameter of the composite is x, w and b; the epilogue; the data type."""

    x: int
    w: int
    b: int
    activation: str | None
    dtype: str

    @property
    def epilogue(self) -> int:
        return EPILOGUES[self.activation]

    def describe(self) -> str:
        return f"{self.activation or 'bias'}, {self.dtype}"


def plan_of(function: Function) -> LtPlan | str:
    """The LtPlan of a ``matmul_bias(_act)`` composite, or why it has none."""
    bound = {id(b.var): b.value for b in function.bindings}

    def value(e):
        while isinstance(e, Var) and id(e) in bound:
            e = bound[id(e)]
        return e

    params = {id(p): i for i, p in enumerate(function.params)}
    top, activation = value(function.ret), None
    if isinstance(top, Call) and str(top.op) != "add":
        name = str(top.op)
        if name in NO_EPILOGUE:
            return NO_EPILOGUE[name]
        if name not in EPILOGUES or len(top.args) != 1:
            return f"no cuBLASLt epilogue for {name}"
        activation, top = name, value(top.args[0])
    if not (isinstance(top, Call) and top.op == "add" and len(top.args) == 2):
        return "not a product plus a bias"
    product, bias = (value(a) for a in top.args)
    if isinstance(bias, Call):
        product, bias = bias, product
    if not (isinstance(product, Call) and product.op == "matmul") or not isinstance(bias, Var):
        return "not a product plus a bias"
    x, w = product.args
    if not all(isinstance(v, Var) and id(v) in params for v in (x, w, bias)):
        return "an operand is computed inside the composite"
    if len(w.ty.shape) != 2 or len(bias.ty.shape) != 1 or len(x.ty.shape) < 2:
        return "the weight is not 2-D or the bias not 1-D"
    dtype = dt.to_numpy(x.ty.dtype).name
    if dtype not in DATA_TYPES or {dt.to_numpy(v.ty.dtype).name for v in (w, bias, function.ret)} != {dtype}:
        return f"cuBLASLt epilogues here take f32, f16 or bf16 throughout (got {dtype})"
    return LtPlan(params[id(x)], params[id(w)], params[id(bias)], activation, dtype)


def _wheel_libraries() -> list[str]:
    found = []
    for package in ("nvidia.cublas", "nvidia.cu13", "nvidia.cu12"):
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        for root in (spec.submodule_search_locations or []) if spec else []:
            found += [str(p) for p in sorted(Path(root).glob("lib/libcublasLt.so.*"))]
    return found


def load_library(cuda_major: int | None = None):
    """libcublasLt, from an NVIDIA wheel or the loader's path, the one of CUDA ``cuda_major``
    (CuPy's runtime) first; a CublasLtError saying where it was looked for."""
    tried = []
    candidates = [*_wheel_libraries(), "libcublasLt.so", "libcublasLt.so.13", "libcublasLt.so.12"]
    if cuda_major is not None:
        candidates.sort(key=lambda c: not c.endswith(f".so.{cuda_major}"))  # stable: the matching ones first
    for candidate in candidates:
        try:
            return ctypes.CDLL(candidate)
        except OSError as err:
            tried.append(f"{candidate}: {err}")
    raise CublasLtError("libcublasLt is not installed", hint="; ".join(tried) or None)


class Lt:
    """A cuBLASLt handle and the GEMMs it runs; descriptors kept per (plan, m, n, k)."""

    def __init__(self, lib, cp):
        """``lib``: the library (a ctypes CDLL, or a stand-in with its functions);
        ``cp``: CuPy (its workspace, its current stream)."""
        self.lib, self._cp = lib, cp
        self.handle = ctypes.c_void_p()
        self._check(lib.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        self._descs: dict[tuple, tuple] = {}
        self._workspace = None
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise CublasLtError(f"{what} failed with cuBLAS status {status}")

    def _layout(self, data_type: int, rows: int, cols: int, ld: int):
        layout = ctypes.c_void_p()
        self._check(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), ctypes.c_int(data_type), ctypes.c_uint64(rows),
                                                        ctypes.c_uint64(cols), ctypes.c_int64(ld)), "cublasLtMatrixLayoutCreate")
        return layout

    def _set(self, desc, attribute: int, value) -> None:
        self._check(self.lib.cublasLtMatmulDescSetAttribute(desc, ctypes.c_int(attribute), ctypes.byref(value),
                                                            ctypes.c_size_t(ctypes.sizeof(value))), "cublasLtMatmulDescSetAttribute")

    def descriptors(self, plan: LtPlan, m: int, n: int, k: int):
        """(matmul descriptor, A, B, D layouts) of ``out[m, n] = x[m, k] @ w[k, n]``."""
        key = (plan, m, n, k)
        found = self._descs.get(key)
        if found is not None:
            return found
        desc = ctypes.c_void_p()
        self._check(self.lib.cublasLtMatmulDescCreate(ctypes.byref(desc), ctypes.c_int(CUBLAS_COMPUTE_32F), ctypes.c_int(CUDA_R_32F)),
                    "cublasLtMatmulDescCreate")
        self._set(desc, DESC_TRANSA, ctypes.c_int32(CUBLAS_OP_N))
        self._set(desc, DESC_TRANSB, ctypes.c_int32(CUBLAS_OP_N))
        self._set(desc, DESC_EPILOGUE, ctypes.c_uint32(plan.epilogue))
        data_type = DATA_TYPES[plan.dtype]
        found = (desc, self._layout(data_type, n, k, n), self._layout(data_type, k, m, k), self._layout(data_type, n, m, n))
        self._descs[key] = found
        return found

    def matmul(self, plan: LtPlan, x, w, bias, out) -> None:
        """``out = act(x @ w + bias)`` on device arrays (C-contiguous; bf16 as its bits)."""
        k, n = w.shape
        m = math.prod(x.shape[:-1])
        if x.shape[-1] != k or bias.shape != (n,) or math.prod(out.shape) != m * n:
            raise CublasLtError(f"cuBLASLt GEMM operands do not fit: x{list(x.shape)} w{list(w.shape)} b{list(bias.shape)}")
        desc, a_layout, b_layout, d_layout = self.descriptors(plan, m, n, k)
        self._set(desc, DESC_BIAS_POINTER, ctypes.c_void_p(_pointer(bias)))
        if self._workspace is None:
            self._workspace = self._cp.empty((WORKSPACE,), "uint8")
        stream = self._cp.cuda.get_current_stream().ptr
        self._check(self.lib.cublasLtMatmul(
            self.handle, desc, ctypes.byref(self.alpha),
            ctypes.c_void_p(_pointer(w)), a_layout, ctypes.c_void_p(_pointer(x)), b_layout,
            ctypes.byref(self.beta), ctypes.c_void_p(_pointer(out)), d_layout, ctypes.c_void_p(_pointer(out)), d_layout,
            None, ctypes.c_void_p(_pointer(self._workspace)), ctypes.c_size_t(WORKSPACE), ctypes.c_void_p(stream)), "cublasLtMatmul")


def _pointer(a) -> int:
    return int(a.data.ptr)
