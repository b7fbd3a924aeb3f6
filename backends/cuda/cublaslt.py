"""cuBLASLt through ctypes: ``cublas.matmul_bias(_act)`` as one GEMM with its epilogue, and
every other product of a group on CUDA (:meth:`Lt.gemm`).

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

:meth:`Lt.gemm` is a plain product (batched by strides, a 2-D weight folded into m) for the
segments' products: CuPy refuses any cuBLAS call while a stream captures (its ``setStream``
raises), so ``cupy.matmul`` would keep a plan with products out of its CUDA graph; cuBLASLt
given its workspace and stream explicitly is captured like a kernel. Each stream has a
workspace of its own, so graphs replayed on two streams at once never share one.
"""

from __future__ import annotations

import ctypes
import importlib.util
import math
from pathlib import Path

import attrs
import numpy as np

from dpl import dtypes as dt
from dpl.errors import DplError
from dpl.ir.expr import Call, Function, Var

# cublasLt.h / library_types.h
CUDA_R_32F, CUDA_R_64F, CUDA_R_16F, CUDA_R_16BF = 0, 1, 2, 14
CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_64F = 68, 70
DESC_TRANSA, DESC_TRANSB, DESC_EPILOGUE, DESC_BIAS_POINTER = 3, 4, 7, 8
EPILOGUE_DEFAULT, EPILOGUE_BIAS, EPILOGUE_RELU_BIAS, EPILOGUE_GELU_BIAS = 1, 4, 6, 36
LAYOUT_BATCH_COUNT, LAYOUT_STRIDED_BATCH_OFFSET = 5, 6
CUBLAS_OP_N = 0

DATA_TYPES = {"float32": CUDA_R_32F, "float16": CUDA_R_16F, "bfloat16": CUDA_R_16BF}
GEMM_TYPES = {**DATA_TYPES, "float64": CUDA_R_64F}  # a plain product takes f64 too (computed in f64)
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


@attrs.frozen
class GemmShape:
    """``out = a @ b`` as cuBLASLt's strided batch: ``batch`` products of ``[m, k] @ [k, n]``,
    ``a`` and ``b`` advancing ``stride_a`` / ``stride_b`` elements per product (0: broadcast)."""

    dtype: str
    batch: int
    m: int
    n: int
    k: int
    stride_a: int
    stride_b: int


def gemm_shape(a, b, out) -> GemmShape | None:
    """The GemmShape of ``out = a @ b`` on C-contiguous arrays of one float type, or None (a
    view, mixed types, an integer product, batch dims that broadcast other than whole)."""
    dtype = a.dtype.name if a.dtype == b.dtype == out.dtype else None
    if dtype not in GEMM_TYPES or a.ndim < 2 or b.ndim < 2:
        return None
    if not (a.flags.c_contiguous and b.flags.c_contiguous and out.flags.c_contiguous):
        return None
    (m, k), (k2, n) = a.shape[-2:], b.shape[-2:]
    if k != k2 or 0 in (m, n, k):
        return None
    if b.ndim == 2:  # a weight: a's batch dims fold into m
        m = math.prod(a.shape[:-1])
        shape = GemmShape(dtype, 1, m, n, k, 0, 0)
        batch_dims = a.shape[:-2]
    else:
        batch_a, batch_b = tuple(a.shape[:-2]), tuple(b.shape[:-2])
        try:
            batch_dims = np.broadcast_shapes(batch_a, batch_b)
        except ValueError:
            return None
        batch = math.prod(batch_dims)
        whole_a, whole_b = math.prod(batch_a) == batch, math.prod(batch_b) == batch
        if not (whole_a or math.prod(batch_a) == 1) or not (whole_b or math.prod(batch_b) == 1):
            return None  # a partial broadcast ([2, 1] against [1, 3]): no single stride says it
        shape = GemmShape(dtype, batch, m, n, k, m * k if whole_a else 0, k * n if whole_b else 0)
    if tuple(out.shape) != (*batch_dims, a.shape[-2], n):
        return None
    return shape


class Lt:
    """A cuBLASLt handle and the GEMMs it runs; descriptors kept per (plan, m, n, k)."""

    def __init__(self, lib, cp):
        """``lib``: the library (a ctypes CDLL, or a stand-in with its functions);
        ``cp``: CuPy (its workspace, its current stream)."""
        self.lib, self._cp = lib, cp
        self.handle = ctypes.c_void_p()
        self._check(lib.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        self._descs: dict[tuple, tuple] = {}
        self._workspaces: dict[int, object] = {}
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self.alpha64, self.beta64 = ctypes.c_double(1.0), ctypes.c_double(0.0)

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise CublasLtError(f"{what} failed with cuBLAS status {status}")

    def _layout(self, data_type: int, rows: int, cols: int, ld: int, batch: int = 1, stride: int = 0):
        layout = ctypes.c_void_p()
        self._check(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), ctypes.c_int(data_type), ctypes.c_uint64(rows),
                                                        ctypes.c_uint64(cols), ctypes.c_int64(ld)), "cublasLtMatrixLayoutCreate")
        if batch > 1:
            for attribute, value in ((LAYOUT_BATCH_COUNT, ctypes.c_int32(batch)), (LAYOUT_STRIDED_BATCH_OFFSET, ctypes.c_int64(stride))):
                self._check(self.lib.cublasLtMatrixLayoutSetAttribute(layout, ctypes.c_int(attribute), ctypes.byref(value),
                                                                      ctypes.c_size_t(ctypes.sizeof(value))),
                            "cublasLtMatrixLayoutSetAttribute")
        return layout

    def _set(self, desc, attribute: int, value) -> None:
        self._check(self.lib.cublasLtMatmulDescSetAttribute(desc, ctypes.c_int(attribute), ctypes.byref(value),
                                                            ctypes.c_size_t(ctypes.sizeof(value))), "cublasLtMatmulDescSetAttribute")

    def _desc(self, compute: int, scale: int, epilogue: int):
        desc = ctypes.c_void_p()
        self._check(self.lib.cublasLtMatmulDescCreate(ctypes.byref(desc), ctypes.c_int(compute), ctypes.c_int(scale)),
                    "cublasLtMatmulDescCreate")
        self._set(desc, DESC_TRANSA, ctypes.c_int32(CUBLAS_OP_N))
        self._set(desc, DESC_TRANSB, ctypes.c_int32(CUBLAS_OP_N))
        self._set(desc, DESC_EPILOGUE, ctypes.c_uint32(epilogue))
        return desc

    def descriptors(self, plan: LtPlan, m: int, n: int, k: int):
        """(matmul descriptor, A, B, D layouts) of ``out[m, n] = x[m, k] @ w[k, n]``."""
        key = (plan, m, n, k)
        found = self._descs.get(key)
        if found is None:
            data_type = DATA_TYPES[plan.dtype]
            found = (self._desc(CUBLAS_COMPUTE_32F, CUDA_R_32F, plan.epilogue),
                     self._layout(data_type, n, k, n), self._layout(data_type, k, m, k), self._layout(data_type, n, m, n))
            self._descs[key] = found
        return found

    def _workspace(self):
        """(workspace pointer, stream pointer) of the current stream; the workspace is the
        stream's own (allocated at its first GEMM, which is never inside a capture)."""
        stream = self._cp.cuda.get_current_stream().ptr
        found = self._workspaces.get(stream)
        if found is None:
            found = self._workspaces[stream] = self._cp.empty((WORKSPACE,), "uint8")
        return ctypes.c_void_p(_pointer(found)), ctypes.c_void_p(stream)

    def _run(self, desc, alpha, beta, a, a_layout, b, b_layout, out, d_layout) -> None:
        workspace, stream = self._workspace()
        self._check(self.lib.cublasLtMatmul(
            self.handle, desc, ctypes.byref(alpha), ctypes.c_void_p(_pointer(a)), a_layout, ctypes.c_void_p(_pointer(b)), b_layout,
            ctypes.byref(beta), ctypes.c_void_p(_pointer(out)), d_layout, ctypes.c_void_p(_pointer(out)), d_layout,
            None, workspace, ctypes.c_size_t(WORKSPACE), stream), "cublasLtMatmul")

    def matmul(self, plan: LtPlan, x, w, bias, out) -> None:
        """``out = act(x @ w + bias)`` on device arrays (C-contiguous; bf16 as its bits)."""
        k, n = w.shape
        m = math.prod(x.shape[:-1])
        if x.shape[-1] != k or bias.shape != (n,) or math.prod(out.shape) != m * n:
            raise CublasLtError(f"cuBLASLt GEMM operands do not fit: x{list(x.shape)} w{list(w.shape)} b{list(bias.shape)}")
        desc, a_layout, b_layout, d_layout = self.descriptors(plan, m, n, k)
        self._set(desc, DESC_BIAS_POINTER, ctypes.c_void_p(_pointer(bias)))
        self._run(desc, self.alpha, self.beta, w, a_layout, x, b_layout, out, d_layout)

    def gemm(self, shape: GemmShape, a, b, out) -> None:
        """``out = a @ b`` (no epilogue) as ``shape`` says (:func:`gemm_shape`); in the operands'
        type, accumulated in f32 (f64 for f64)."""
        key = ("gemm", shape)
        found = self._descs.get(key)
        if found is None:
            data_type, f64 = GEMM_TYPES[shape.dtype], shape.dtype == "float64"
            desc = self._desc(CUBLAS_COMPUTE_64F if f64 else CUBLAS_COMPUTE_32F, CUDA_R_64F if f64 else CUDA_R_32F, EPILOGUE_DEFAULT)
            m, n, k, batch = shape.m, shape.n, shape.k, shape.batch
            found = (desc, self._layout(data_type, n, k, n, batch, shape.stride_b), self._layout(data_type, k, m, k, batch, shape.stride_a),
                     self._layout(data_type, n, m, n, batch, m * n))
            self._descs[key] = found
        desc, b_layout, a_layout, d_layout = found
        alpha, beta = (self.alpha64, self.beta64) if shape.dtype == "float64" else (self.alpha, self.beta)
        self._run(desc, alpha, beta, b, b_layout, a, a_layout, out, d_layout)


def _pointer(a) -> int:
    return int(a.data.ptr)
