"""CuPy + cuBLAS on CUDA: owns the ``cupy``, ``cublas`` and (on the CUDA target) ``kernel``
codegen prefixes.

Each group's kernel IR becomes one CUDA kernel (``cuda.emitter``), compiled by
``cupy.RawModule`` and launched with the configuration ``launch_config`` gives. A group with
matrix products (``cublas.*`` composites, attention, an MLP's products with their epilogues)
is cut into segments as on the CPU: each product by ``cupy.matmul`` (cuBLAS), each run of the
other bindings between them as one CUDA kernel.

Arrays cross to the device at the kernel boundary the Executable calls: inputs by
``cupy.asarray``, results copied back into the host outputs. bfloat16 (which CuPy has no
dtype for) crosses as its 16 bits; a bfloat16 product is not given to cuBLAS, its group runs
as one kernel.

An Executable whose first available backend is this one runs device-resident
(``backends/cuda/resident.py``): the whole plan on device arrays, captured as a CUDA graph per input
shape (``backends/cuda/graph.py``); the per-kernel boundary below is what ``profile`` and a group
called on its own use.

Kernels compile through ``cupy.RawModule``, which pins NVRTC to the current device's
architecture (it adds ``-arch=sm_XY`` from the device's compute capability, capped at what its
NVRTC knows: ``cupy.cuda.compiler._get_arch``; an ``-arch`` of ours would be a second one) and
caches the binary on disk; the backend keeps each compiled module in memory too, keyed by
(source, options, device), so a source met again (the same group at another shape, another
Executable) is not handed to CuPy again.

A ``kernel.attention`` composite runs as the CUDA flash kernel (``backends/cuda/flash_attention.py``)
when ``cuda.flash_attention.choose`` says so (``attention=``), else as the segments; the plan step's
note in ``exe.summary()`` says which and why.

Without CuPy or without a device the backend is unavailable and says why; the "cuda" target
then falls back along cupy -> cpu -> numpy, and ``exe.summary()`` shows it. No GPU is on this
project's machines: the tests run this backend on a stand-in CuPy whose kernels are the host
twin (``backends/cuda/host.py``), with every source also compiled by NVRTC.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import threading

import numpy as np

from dpl.backends.cuda import cublaslt
from dpl.backends.cuda.emitter import BLOCK, BLOCK_ROWS_FROM, emit_cuda, launch_arguments, launch_config
from dpl.backends.cuda.resident import DeviceRunner, bits as _bits, bits_dtype as _bits_dtype
from dpl.backends.registry import Backend, BackendError, Capabilities, CompileError, function_dtypes, wrapped_composite
from dpl.backends.cpu.segments import NotSegmentable, Part, is_product, segment, segment_runner
from dpl.errors import count as plural
from dpl.transform.normalize import normalize_function

SYMBOL = "dpl_kernel"
FLASH_SYMBOL = "dpl_flash_attention"
log = logging.getLogger(__name__)
LT_COMPOSITES = ("cublas.matmul_bias_act", "cublas.matmul_bias")
DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")


class CudaKernel:
    """One generated kernel, compiled; called on device arrays ``(inputs, outputs)``."""

    def __init__(self, source, function, cupy, block: int):
        self.source, self.function, self.block = source, function, block
        self._cupy = cupy
        self.constants = [cupy.asarray(_bits(np.require(v, requirements="C"))) for v in source.kernel.constants.values()]

    def arguments(self, inputs, outputs) -> tuple[tuple[int, int], tuple]:
        """(blocks, threads) and the argument tuple of one launch: arrays, then dims as int64."""
        arrays, dims = launch_arguments(self.source, list(inputs), list(outputs), constants=self.constants)
        bound = dict(zip(self.source.dims, dims))
        self.source.kernel.check_requires(bound)  # a slice past its buffer: an error, never a stray read
        grid, block = launch_config(self.source, bound, block=self.block)
        return (grid, block), (*arrays, *(np.int64(d) for d in dims))

    def __call__(self, inputs, outputs) -> None:
        cp = self._cupy
        inputs = [a if a.flags.c_contiguous else cp.ascontiguousarray(a) for a in map(_bits, inputs)]
        (grid, block), args = self.arguments(inputs, [_bits(o) for o in outputs])
        self.function((grid,), (block,), args)


class CupyBackend(Backend):
    name = "cupy"
    prefixes = ("cupy", "cublas", "kernel")
    capabilities = Capabilities(kinds=("op", "primitive", "composite", "codegen"),
                                composites=("cublas.*", "cupy.*", "kernel.*"), dtypes=DTYPES)
    dispatch_by_prefix = False  # "cuda" runs it; "cpu" keeps cuBLAS composites on the CPU

    def __init__(self, cupy=None, block: int = BLOCK, block_rows_from: int = BLOCK_ROWS_FROM, options: tuple[str, ...] = (),
                 cublaslt=None, attention: str = "auto"):
        """``cupy``: the module to use (CuPy itself, imported when first needed, or a stand-in);
        ``block``: threads per block (a power of two); ``options``: more NVRTC options;
        ``cublaslt``: the cuBLASLt library (None: libcublasLt, loaded when first needed;
        False: products and epilogue kernels only); ``attention``: how ``kernel.attention``
        composites run: "auto" (``cuda.flash_attention.choose``'s rule), "flash" (the CUDA flash
        kernel, ``backends/cuda/flash_attention.py``) or "segments" (cuBLAS products, a softmax kernel)."""
        if block < 1 or block & (block - 1):
            raise CompileError(f"threads per block must be a power of two, got {block}")
        if attention not in ("auto", "flash", "segments"):
            raise BackendError(f"CupyBackend(attention=...) takes 'auto', 'flash' or 'segments', got {attention!r}")
        self.attention = attention
        self._cupy = cupy
        self.block, self.block_rows_from, self.options = block, block_rows_from, tuple(options)
        self.graphs = True  # device-resident runs capture CUDA graphs
        self._modules: dict[tuple, object] = {}  # (source, options, device) -> compiled RawModule
        self._modules_lock = threading.Lock()
        self.compiles = 0  # RawModules built (a module from the cache is not one)
        self._cublaslt_library = cublaslt
        self._lt: cublaslt.Lt | str | None = None  # the handle, or why there is none
        self._notes: dict[str, str] = {}  # function -> how its cuBLAS composite runs

    def cupy(self):
        if self._cupy is None:
            self._cupy = importlib.import_module("cupy")
        return self._cupy

    def available(self) -> tuple[bool, str]:
        if self._cupy is None and importlib.util.find_spec("cupy") is None:
            return False, "CuPy is not installed"
        try:
            cp = self.cupy()
            count = cp.cuda.runtime.getDeviceCount()
        except Exception as err:  # the CUDA driver or runtime is missing or broken
            return False, f"no CUDA device ({type(err).__name__}: {err})"
        if count == 0:
            return False, "no CUDA device"
        return True, f"{plural(count, 'CUDA device')}{_arch_note(cp)}"

    def resident(self) -> DeviceRunner:
        """What runs an Executable's calls with every intermediate on the device."""
        return DeviceRunner(self.cupy(), graphs=self.graphs)

    # -- compiling ------------------------------------------------------------------------------

    def notes(self) -> list[str]:
        """How each cuBLAS epilogue composite compiled runs (for ``exe.summary()``)."""
        return list(self._notes.values())

    def compile(self, function, *, module=None, shapes=()):
        function = wrapped_composite(function, module)  # a Codegen wrapper: the composite it calls
        if function.attrs.get("Composite") in LT_COMPOSITES:
            run = self._cublaslt(function)
            if run is not None:
                return self._boundary(run, function)
        if function.attrs.get("Composite") == "kernel.attention":
            flash, note = self._flash(function, shapes)
            run = self._boundary(flash or self._device_run(function), function)
            run.note = note  # type: ignore[attr-defined]  # the path and why (exe.summary() shows it)
            return run
        return self._boundary(self._device_run(function), function)

    def _flash(self, function, shapes):
        """A kernel.attention composite as the CUDA flash kernel (``backends/cuda/flash_attention.py``) on
        device arrays, or None for the segments; and a note saying which and why."""
        from dpl.backends.cuda import flash_attention as fac
        from dpl.kernel.attention import NotAttention, read_attention

        try:
            spec = read_attention(function)
        except NotAttention as err:
            return None, f"segments (no flash kernel: {err})"
        use, why = fac.choose(spec, shapes, self.attention)
        if not use:
            return None, f"segments ({why})"
        code = fac.emit_flash_cuda(spec, FLASH_SYMBOL)
        try:
            compiled = self.module(code, (f"-DDPL_BLOCK={self.block}", *self.options)).get_function(FLASH_SYMBOL)
        except Exception as err:  # noqa: BLE001 (NVRTC's log, through CuPy): the segments still run it
            return None, f"segments (the flash kernel did not compile: {str(err)[:200]})"
        note = f"flash attention, CUDA ({why})"
        return fac.device_runner(function.name, spec, compiled, self.cupy(), self.block, note), note

    def _device_run(self, function):
        """``run(inputs, outputs)`` on device arrays: products by cuBLAS between kernels, or
        one kernel. A product nested in a binding (``nn.relu(add(matmul(x, w), b))``, as a
        composite holds it) gets a binding of its own first, so it too goes to cuBLAS."""
        function = normalize_function(function)
        if any(is_product(b) for b in function.bindings) and not _has_bf16(function):
            try:
                return self._compile_segments(function)
            except NotSegmentable:
                pass  # an operand or result the segments cannot hold: the kernel IR's own loops
        return self.kernel(function)

    def kernel(self, function) -> CudaKernel:
        """The CUDA kernel of a group (its kernel IR's loops), compiled by ``cupy.RawModule``."""
        from dpl.kernel import LoweringError, lower_function
        from dpl.backends.cgen.emitter import EmitError

        try:
            source = emit_cuda(lower_function(function), SYMBOL, block_rows_from=self.block_rows_from)
        except (LoweringError, EmitError) as err:
            raise CompileError(f"'{function.name}' has no CUDA kernel: {err.message}") from None
        options = (f"-DDPL_BLOCK={self.block}", *self.options)  # CuPy adds the architecture and -ftz=true
        cp = self.cupy()
        try:
            compiled = self.module(source.code, options).get_function(SYMBOL)
        except Exception as err:  # NVRTC's log, through CuPy
            raise CompileError(f"'{function.name}': the CUDA kernel does not compile: {err}") from None
        return CudaKernel(source, compiled, cp, self.block)

    def module(self, code: str, options: tuple[str, ...]):
        """The RawModule of ``code``, built once per (source, options, device)."""
        cp = self.cupy()
        key = (code, options, _device_id(cp), _arch_note(cp))  # the device, and the architecture CuPy compiles for
        found = self._modules.get(key)
        if found is None:
            with self._modules_lock:
                found = self._modules.get(key)
                if found is None:
                    found = cp.RawModule(code=code, options=options)
                    self.compiles += 1
                    self._modules[key] = found
        return found

    # -- cuBLASLt ---------------------------------------------------------------------------------

    def lt(self) -> cublaslt.Lt | str:
        """The cuBLASLt handle, or why there is none."""
        if self._lt is None:
            if self._cublaslt_library is False:
                self._lt = "cuBLASLt is off"
            else:
                try:
                    lib = self._cublaslt_library or cublaslt.load_library(_cuda_major(self.cupy()))
                    self._lt = cublaslt.Lt(lib, self.cupy())
                except cublaslt.CublasLtError as err:
                    self._lt = err.message
                except (AttributeError, OSError) as err:  # a library without cuBLASLt's functions
                    self._lt = f"libcublasLt is unusable ({type(err).__name__}: {err})"
        return self._lt

    def _cublaslt(self, function):
        """A ``matmul_bias(_act)`` composite as one cuBLASLt GEMM with its epilogue, or None
        (and the reason noted) for the product and a generated epilogue kernel."""
        what = f"{function.attrs['Composite']} '{function.name}'"
        plan = cublaslt.plan_of(function)
        lt = self.lt() if not isinstance(plan, str) else None
        why = plan if isinstance(plan, str) else lt if isinstance(lt, str) else None
        if why is not None:
            self._notes[function.name] = f"{what}: cupy.matmul and a generated epilogue kernel, not cuBLASLt ({why})"
            return None
        self._notes[function.name] = f"{what}: one cuBLASLt GEMM with its epilogue ({plan.describe()})"
        fallback = []

        def run(inputs, outputs):
            if fallback:
                return fallback[0](inputs, outputs)
            try:
                lt.matmul(plan, inputs[plan.x], inputs[plan.w], inputs[plan.b], outputs[0])
            except cublaslt.CublasLtError as err:  # a shape or type this cuBLASLt does not take
                self._notes[function.name] = f"{what}: cupy.matmul and a generated epilogue kernel, not cuBLASLt ({err.message})"
                fallback.append(self._device_run(function))
                fallback[0](inputs, outputs)

        run.__qualname__ = f"cublaslt:{function.name}"
        return run

    def _compile_segments(self, function):
        """Each product by cuBLASLt (``cupy.matmul`` where it cannot take it), each part between
        them one kernel."""
        steps = segment(function)
        kernels = [self.kernel(s.function) for s in steps if isinstance(s, Part)]
        run = segment_runner(function, steps, kernels, self.cupy(), matmul=self.matmul, scratch_per_shape=True)
        run.__qualname__ = f"cupy-cublas+cuda:{function.name}"
        return run

    def matmul(self, a, b, out=None):
        """``a @ b`` on device arrays: a GEMM of cuBLASLt where it takes the operands (one float
        type, C-contiguous, batches that broadcast whole) and ``out`` is given, so that a CUDA
        graph can capture it (CuPy refuses cuBLAS calls while a stream captures); else
        ``cupy.matmul``."""
        lt = self.lt() if out is not None else None
        shape = cublaslt.gemm_shape(a, b, out) if lt is not None and not isinstance(lt, str) else None
        if shape is not None:
            try:
                lt.gemm(shape, a, b, out)
                return out
            except cublaslt.CublasLtError as err:  # a shape or type this cuBLASLt refuses: cuBLAS then
                log.debug("cuBLASLt GEMM %s refused (%s); cupy.matmul runs it", shape, err.message)
        return self.cupy().matmul(a, b, out=out)

    def _boundary(self, device_run, function):
        """``kernel(inputs, outputs)`` on host arrays around a run on device arrays."""
        cp = self.cupy()

        def run(inputs, outputs):
            dev_in = [cp.asarray(_bits(np.require(a, requirements="C"))) for a in inputs]  # 0-d stays 0-d
            dev_out = [cp.empty(o.shape, _bits_dtype(o.dtype)) for o in outputs]
            device_run(dev_in, dev_out)
            for o, d in zip(outputs, dev_out):
                np.copyto(o, cp.asnumpy(d).view(o.dtype))

        run.__qualname__ = f"cupy:{function.name}"
        run.device = device_run  # type: ignore[attr-defined]
        run.parts = getattr(device_run, "parts", [device_run])  # type: ignore[attr-defined]
        return run


def _has_bf16(function) -> bool:
    return "bfloat16" in function_dtypes(function)


def _cuda_major(cp) -> int | None:
    """The CUDA major version of CuPy's runtime (13 for 13.0), or None."""
    try:
        return int(cp.cuda.runtime.runtimeGetVersion()) // 1000
    except Exception:  # noqa: BLE001 (a stand-in without it)
        return None


def _device_id(cp) -> int:
    return int(cp.cuda.runtime.getDevice())


def _arch_note(cp) -> str:
    """", sm_90" for the current device: the architecture CuPy's NVRTC compiles for."""
    try:
        return f", sm_{cp.cuda.Device().compute_capability}"
    except Exception:  # noqa: BLE001 (a stand-in or a broken driver: no architecture to report)
        return ""
