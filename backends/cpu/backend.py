"""The CPU backend: each group's kernel IR as C with OpenMP, compiled by the system C compiler,
cached on disk, loaded with ctypes. Codegen prefixes ``cpu`` and ``kernel``; ``cublas.*``
composites run here too when no GPU is there.

The disk cache (``dpl.runtime.disk_cache``: platformdirs' user cache directory, or
``cache_dir``) is keyed by the SHA-256 of the source, the flags, the compiler's version and
the host CPU's identity (``-march=native`` code must never run on another CPU). An entry is
loaded only when its bytes hash to its manifest's SHA-256; anything else is rebuilt, never
trusted. Two processes compiling the same kernel meet at a file lock: one compiles, the other
loads its result.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import warnings

import attrs
import numpy as np

from dpl import dtypes
from dpl.errors import DplError
from dpl.backends.cpu import (
    blas, call_list, conv_direct, conv_lanes, conv_nhwc, experts, im2col, index_put, max_pool, packed_gemm, products_choice, take,
)
from dpl.backends.cpu.addresses import address
from dpl.backends.cgen.emitter import STREAM_BYTES, EmitError, emit_kernel
from dpl.backends.registry import Backend, BackendError, Capabilities, CompileError, wrapped_composite
from dpl.backends.cpu.segments import NotSegmentable, Part, Product, fold_epilogues, fold_pools, is_product, segment, segment_runner
from dpl.ir import dims as dimexpr
from dpl.ir.expr import Call, Constant, Var
from dpl.ir.traverse import vars_in
from dpl.ir.types import TensorType
from dpl.kernel.lower import op_lowering
from dpl.runtime import build_pool
from dpl.runtime.disk_cache import DEFAULT_MAX_BYTES
from dpl.runtime.heap import keep_mapped
from dpl.runtime.keys import graph_structure
from dpl.runtime.prepared import Address, CCall
from dpl.runtime.timed_choice import RacedKernel
from dpl.runtime.threads import OPENMP, openmp_kernel

# the toolchain's names, as the CPU backend's own (tests and benchmarks import them from here)
from dpl.backends.cpu.toolchain import (  # noqa: E402,F401
    BASE_FLAGS, FAST_FLAGS, SYMBOL, KernelCache, compiler_version, cpu_identity, default_cache_dir, march_missing, usable_flags,
    vector_math,
)


class CpuBackend(Backend):
    """Generated C for every group the kernel IR lowers; what does not lower (``take``, calls)
    is a compile error, and the target's next backend runs it."""

    name = "cpu"
    prefixes = ("cpu", "kernel")
    capabilities = Capabilities(kinds=("op", "primitive", "composite", "codegen"), composites=("cublas.*",),
                                dtypes=("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"))
    dispatch_by_prefix = False  # shipped backends share "kernel": the target picks among them
    # the C reads its dims from the arrays of each call; compile's shapes choose only the path
    # of an attention (flash or two products from so many keys, decode for one query row)
    shape_generic = True

    def __init__(self, cache_dir: str | os.PathLike | None = None, cc: str | None = None,
                 stream_bytes: int | None = STREAM_BYTES, products: str = "auto", cache_max_bytes: int = DEFAULT_MAX_BYTES,
                 attention: str = "auto", convolutions: str = "auto", march: str = "native"):
        self.cc = cc or os.environ.get("CC") or "cc"
        # the instruction sets the C is built for: this CPU's, or another's that this one can run
        # (``"haswell"``: AVX2 and FMA only, what an AVX2 host runs, measured on an AVX-512 one)
        if march != "native" and shutil.which(self.cc) is not None:
            missing = march_missing(self.cc, march)
            if missing is None:
                raise BackendError(f"the C compiler '{self.cc}' does not take -march={march}",
                                   hint="march='native' (default), or an -march it knows, such as 'haswell'")
            if missing:
                raise BackendError(f"-march={march} builds code this CPU cannot run: it lacks {', '.join(missing)}",
                                   hint="march='native' (default), or an -march of a CPU this one is a superset of")
        self.march = march
        # who computes matrix products and convolutions: "auto" (the fastest here, measured once
        # and cached: backends/cpu/products_choice.py), "numpy", "torch" or "dpl" (NumPy's, float32
        # products by backends/cpu/packed_gemm.py); resolved at the first
        # product a build meets, so a plan without products never imports torch or measures
        if products not in blas.NAMES:
            raise BackendError(f"unknown products library {products!r}", hint="products='auto' (default), 'numpy', 'torch' or 'dpl'")
        self.products_name = products
        self._products = None
        self._packed = None  # the packed product routine (backends/cpu/packed_gemm.py), made at the first product
        self._direct_conv = None  # the direct convolution's routine (backends/cpu/conv_direct.py), made at the first one
        self._lanes_conv = None  # the channels-last one's (backends/cpu/conv_lanes.py)
        # float32 convolutions: "provider" (the products' provider, or im2col and a product),
        # "direct" (backends/cpu/conv_direct.py and conv_lanes.py, every one they take) or "auto"
        # (direct where conv_direct.wins says it does or an epilogue folds into it, every
        # channels-last one of constant weights, the rest as "provider")
        if convolutions not in ("auto", "provider", "direct"):
            raise BackendError(f"CpuBackend(convolutions=...) takes 'auto', 'provider' or 'direct', got {convolutions!r}")
        self.convolutions = convolutions
        self.stream_bytes = stream_bytes  # outputs this large are written with streaming stores
        self.cache = KernelCache(cache_dir, self.cc, cache_max_bytes, march=march)  # cache_dir: None is the user cache
        # runs a prepared call's C calls (dpl.runtime.prepared), built through whatever cache the backend has then
        self.call_list = call_list.CallList(lambda source: self.cache.load(source))
        self._index_put = index_put.routine(lambda source: self.cache.load(source))  # a lone index_put's C
        self._take = take.routine(lambda source: self.cache.load(source))  # a lone take's C
        self._warned = False
        self._has_cc: bool | None = None  # whether the compiler is on PATH (see available)
        # kernel.attention: "auto" (flash_attention.choose's rule), "flash" or "segments"
        if attention not in ("auto", "flash", "segments"):
            raise BackendError(f"CpuBackend(attention=...) takes 'auto', 'flash' or 'segments', got {attention!r}")
        self.attention = attention

    @property
    def products(self):
        """The provider of matrix products and convolutions (backends/cpu/blas.py), chosen on first use."""
        if self._products is None:
            self._heap = keep_mapped()  # before any measurement: torch's convolutions allocate per call
            self._products = products_choice.products(self.products_name, self.cc, load=self.cache.load, march=self.march)
        return self._products

    def notes(self) -> tuple[str, ...]:
        """What ``exe.summary()`` says under this backend: who computes the products, and why."""
        if self._products is None:
            return (f"products: {self.products_name} (not chosen yet: no product built)", *self._built_for())
        p = self._products
        pools = f"threads: products on {p.pool_of(_MATMUL)}, convolutions on {p.pool_of(_CONV)}"
        packed = f"; {blas.PACKED}, on {OPENMP}" if p.packs else ""
        return (f"products: {p.name} ({p.library}; {pools}){packed}; {p.why}", self._heap, *self._built_for())

    def _built_for(self) -> tuple[str, ...]:
        """The build's instruction sets, where they are not this CPU's own."""
        return () if self.march == "native" else (f"C built for -march={self.march}, not this CPU's own instruction sets",)

    def can_run(self, unit):
        """The capability table, and for a single op whether it has a C kernel here: one the
        kernel IR lowers, or a lone ``take``, ``cumsum`` or ``grouped_matmul`` (their runners); the rest
        (``topk``, the scatters) go to the target's next backend, which is routing, not a
        fall-back."""
        ok, why = super().can_run(unit)
        if ok and unit.kind == "op" and unit.name not in RUNNERS and not op_lowering(unit.name)[0]:
            return False, f"has no kernel for op {unit.name}"
        return ok, why

    def available(self) -> tuple[bool, str]:
        if self._has_cc is None:  # looked up once: asked for every function a build places
            self._has_cc = shutil.which(self.cc) is not None
        if not self._has_cc:
            reason = f"no C compiler ('{self.cc}') on this machine"
            if not self._warned:  # one warning per backend, then only the summary says it
                self._warned = True
                warnings.warn(f"dpl: {reason}; the CPU target runs on the NumPy backend", RuntimeWarning, stacklevel=2)
            return False, reason
        return True, "available"

    def compile(self, function, *, module=None, shapes=()):
        function = wrapped_composite(function, module)  # a Codegen wrapper: the composite it calls
        note = None  # the path an attention took, and why (exe.summary() shows it)
        if function.attrs.get("Composite") == "kernel.attention":
            flash, note = self._compile_flash(function, shapes)
            # one query row: the decode kernel alone, not raced (4-6x the two products at 130 to
            # 4096 keys, Llama's 8 query / 4 key-value heads of 64, bench_attention --decode)
            decode = flash is not None and flash.__qualname__.startswith("cpu-decode:")
            if flash is not None:
                return self._race_segments(function, flash, note) if self.attention == "auto" and not decode else flash
        lone = (take.runner(function, self._take, self.call_list) or _cumsum_runner(function)
                or index_put.runner(function, self._index_put, self.call_list))
        if lone is not None:
            return lone
        grouped = experts.read(function)  # the experts' grouped product, alone or with its gated unit
        run = grouped and experts.runner(function, grouped, self._routine() if self.products.packs else None)
        if run is not None:
            return run  # else the segments below: the grouped product, then the gated unit's C
        if any(_blas_product(b) for b in function.bindings):
            try:
                return self._compile_segments(function, note)
            except NotSegmentable:
                pass  # an operand or result the segments cannot hold: the kernel IR's own loops
        return self._compile_kernel(function)

    def _compile_segments(self, function, note: str | None = None):
        """Each matrix product (and each convolution: torch's, or im2col's product,
        backends/cpu/im2col.py) by the products provider (backends/cpu/blas.py), each run of the other
        bindings between products as one generated-C kernel: a product and its epilogue, a
        prologue and its product, attention's two products with the softmax between them;
        ``note``: the path an attention took and why, for exe.summary() (kept when capped)."""
        steps = segment(function, _blas_product, starts_part=_pool)
        # a packed product of a weight applies its bias, residual and activation (or its gated
        # unit) to its tiles
        steps = fold_epilogues(steps, lambda p: (self._packs(p.call) or self._direct(p.call, folds=True) or self._lanes(p.call)) and isinstance(p.args[1], Constant),
                               vars_in(function.ret),
                               glu=lambda p: self._packs(p.call) and packed_gemm.takes_glu(p.call), acts=packed_gemm.ACTS)
        # a max pool right after a channels-last convolution of dpl's own: pooled from its rows
        steps = fold_pools(steps, lambda conv, pool: (self._lanes(conv.call) and isinstance(conv.args[1], Constant)
                                                      and all(e[0] != "residual" for e in conv.epilogue)
                                                      and conv_lanes.pools(pool.call)), vars_in(function.ret))
        pools = {self._pool_of(s.call, bool(s.epilogue)) for s in steps if isinstance(s, Product)}
        # beside NumPy's BLAS every part runs on one thread: BLAS's worker threads spin between
        # products, and an OpenMP team sharing their cores waits for the scheduler
        # (dpl.runtime.threads; measured: the Llama MLP's SiLU-times-up group 4.5 ms with two
        # threads, 3.2 with one). Products on the kernels' own OpenMP team (torch's, where it
        # shares it): one pool, the parts keep every core
        threads = None if pools <= {OPENMP} else 1
        # a part whose results only feed the next product keeps them in cache: no streaming
        kernels = [self._compile_kernel(s.function, threads=threads, stream_bytes=self.stream_bytes if s.feeds_result else None)
                   for s in steps if isinstance(s, Part)]
        try:
            run = segment_runner(function, steps, kernels, np, products=lambda step: self._product(step.call, threads, step.epilogue))
        except CompileError:  # the max pool routine did not compile: the kernel IR's loops run the group
            raise NotSegmentable from None
        source = "\n".join(k.source for k in run.parts)
        thread_pools = frozenset(pools | {OPENMP} if kernels else pools)

        def dressed(run, cap):
            """``run`` as a kernel of dpl.runtime.threads' protocol, its OpenMP parts capped at
            ``cap`` threads: a plan's budget reaches every product and part (without it they
            took OpenMP's default team, every core, whatever ``threads=`` said)."""
            run.__qualname__ = f"cpu-blas+c:{function.name}"
            run.source = source  # type: ignore[attr-defined]
            run.thread_pools = thread_pools  # type: ignore[attr-defined]
            run.call_list = self.call_list  # type: ignore[attr-defined]
            run.threads = cap  # type: ignore[attr-defined]
            if note:
                run.note = note  # type: ignore[attr-defined]
            # beside a BLAS every part stays on one thread, whatever the budget
            run.with_threads = lambda n: run if n == cap or threads == 1 else dressed(run.capped(n), n)  # type: ignore[attr-defined]
            return run

        return dressed(run, threads)

    def _race_segments(self, function, flash, note: str):
        """Flash (or decode) and segments both, each call on the one recent calls found faster:
        the flash kernel skips the tiles a causal mask hides, the segments' products win where
        the mask hides nothing, and no build sees the mask's values (dpl.runtime.timed_choice)."""
        try:
            segments = self._compile_segments(function)
        except NotSegmentable:
            return flash
        kind = flash.__qualname__.split(":", 1)[0].removeprefix("cpu-")  # "flash" or "decode"
        return RacedKernel(flash, segments, (kind, "segments"), "attention", f"both built; the build's rule: {note}")

    def _compile_flash(self, function, shapes):
        """A kernel.attention composite as one flash-style kernel (backends/cpu/flash_attention.py;
        for one query row at the build's shapes, backends/cpu/decode_attention.py), or None for
        the segments path; and a note saying which and why."""
        from dpl.backends.cpu import decode_attention as da
        from dpl.backends.cpu import flash_attention as fa
        from dpl.kernel.attention import NotAttention, read_attention

        try:
            spec = read_attention(function)
        except NotAttention as err:
            return None, f"segments (no flash kernel: {err})"
        use, why = fa.choose(spec, shapes, self.attention)
        if not use:
            return None, f"segments ({why})"
        decode, rows_why = da.takes(spec, shapes)
        rows = da.task_rows(spec, shapes) if decode else fa.ROWS
        if decode:
            source = da.emit_decode(spec, rows, vector_math=self.cache.vector_math())
        else:
            source = fa.emit_flash(spec, vector_math=self.cache.vector_math())
        try:
            lib = self.cache.load(source)
        except CompileError as err:  # the segments still run it
            return None, f"segments (the {'decode' if decode else 'flash'} kernel did not compile: {err.message[:200]})"
        if decode:
            note = f"decode attention ({rows_why}, {rows} a task; {why})"
            return da.decode_runner(function.name, spec, source, lib, rows, note=note, calls=self.call_list), note
        note = f"flash attention ({why})"
        return fa.flash_runner(function.name, spec, source, lib, note=note, calls=self.call_list), note

    def _pool_of(self, call, folded: bool = False) -> str:
        """The thread pool a library step runs on (``folded``: with an epilogue folded into it):
        a max pool, a packed product and a direct convolution on OpenMP, the rest the provider's."""
        if experts.takes(call):  # NumPy's BLAS, run by run
            return blas.BLAS
        if self._lanes(call):
            return OPENMP
        if conv_nhwc.takes(call):  # torch's convolution, or the provider's product
            return self.products.thread_pool if conv_nhwc.uses_torch(call, self.products) else self.products.pool_of(_MATMUL)
        direct = self._direct(call, folds=folded)
        return OPENMP if max_pool.takes(call) or self._packs(call) or self._packs_conv(call) or direct else self.products.pool_of(call)

    def _packs(self, call) -> bool:
        """Whether product ``call`` runs by dpl's packed-weight routine (backends/cpu/packed_gemm.py)."""
        return call.op == "matmul" and self.products.packs and packed_gemm.takes(call) and self._routine() is not None

    def _direct(self, call, folds: bool = False) -> bool:
        """Whether convolution ``call`` runs by dpl's direct routine (backends/cpu/conv_direct.py):
        with an epilogue to fold into it (``folds``) wherever the routine takes it (its batch
        norm, residual and ReLU otherwise cost a pass over the output: ResNet's 3x3 at stride 2
        on 32 channels 0.31 -> 0.18 ms, its 1x1s 0.14-0.17 -> 0.11-0.13 ms in the zoo model, one
        thread), alone where :func:`conv_direct.wins`."""
        if self.convolutions == "provider" or not conv_direct.takes(call):
            return False
        if self.convolutions == "auto" and not isinstance(call.args[1], Constant):
            return False  # weights of a parameter would be packed at every call
        return (self.convolutions == "direct" or folds or conv_direct.wins(call)) and self._conv_routine() is not None

    def _lanes(self, call) -> bool:
        """Whether channels-last convolution ``call`` runs by dpl's own (backends/cpu/conv_lanes.py):
        every one it takes of constant weights (or any, with ``convolutions="direct"``)."""
        if self.convolutions == "provider" or not conv_lanes.takes(call):
            return False
        if self.convolutions == "auto" and not isinstance(call.args[1], Constant):
            return False  # weights of a parameter would be packed at every call
        return self._lanes_routine() is not None

    def _packs_conv(self, call) -> bool:
        """Whether convolution ``call`` runs as im2col and the packed routine's product (float32,
        one group, not taken by the provider's own convolution)."""
        return (call.op == "nn.conv2d" and self.products.packs and im2col.takes(call) and call.ty.dtype == "float32"
                and int(call.attrs.get("groups", 1)) == 1 and self.products.conv2d(call) is None
                and self._routine() is not None)

    def _routine(self):
        """The packed routine (one per backend), or None where it failed to compile (the provider
        keeps every product)."""
        return self._shared_routine("_packed", packed_gemm.source(self.cache.vector_math()), "packed products", packed_gemm.Routine)

    def _shared_routine(self, attr: str, source: str, label: str, wrap):
        """A routine of the backend's own kept in ``attr``: loaded when the cache has it, else
        compiled on the build pool beside the kernels (a pool's failed build is made again at the
        next plan); ``wrap(lib)`` makes it, None where it failed to compile."""
        current = getattr(self, attr)
        if current is None or (current and current.failed):
            lib = self.cache.cached(source)
            if lib is None:
                lib = build_pool.submit(lambda: self.cache.load(source), label)
                if lib.done():  # no pool: compiled now
                    try:
                        lib = lib.result()
                    except (CompileError, OSError):
                        lib = False
            current = wrap(lib) if lib is not False else False
            setattr(self, attr, current)
        return current or None

    def _product(self, call, threads: int | None = None, epilogue: tuple = ()):
        """How a product of the segments runs: a convolution by the provider's own (torch's
        oneDNN) or im2col and the provider's matmul (or dpl's routine), a float32 product by dpl's
        packed routine where the choice says so (with the ``epilogue`` the segments folded into
        it: bias, residual and activation, or the gated unit), a matmul by the provider (None:
        the segment runner's own NumPy matmul, then the epilogue)."""
        if experts.takes(call):  # the experts' grouped product, each expert's rows by the BLAS
            return experts.product
        packs = self._packs(call)
        if epilogue and call.op == "nn.conv2d":  # folded only where the direct routine runs it
            return self._conv(call, threads, epilogue)
        if epilogue and not packs:  # the routine did not build: the runner's matmul, then the adds
            return None
        if max_pool.takes(call):  # its C routine, compiled once per dtype, capped at ``threads``
            return max_pool.runner(call, self.cache.load(max_pool.source(call.ty.dtype)), threads)
        if packs and epilogue[:1] and epilogue[0][0] == "glu":  # the gated unit on the product's tiles
            return packed_gemm.glu_runner(call, self._routine(), epilogue[0][1], threads)
        if packs:  # the weights packed now, once
            bias = next((e[1] for e in epilogue if e[0] == "bias"), None)
            return packed_gemm.runner(call, self._routine(), threads, bias=bias, residual=any(e[0] == "residual" for e in epilogue),
                                      act=next((e[1] for e in epilogue if e[0] == "act"), None))
        if call.op == "nn.conv2d":
            return self._conv(call, threads)
        return self.products.matmul if getattr(self.products, "matmuls", False) else None

    def _conv(self, call, threads: int | None = None, epilogue: tuple = ()):
        """A convolution of the segments: dpl's direct convolution (backends/cpu/conv_direct.py)
        where :meth:`_direct` says so, with the ``epilogue`` the segments folded into it (its
        per-channel steps, residual and activation); else the provider's own (torch's oneDNN) or
        im2col and a product (the packed routine's where it packs). Chosen by shape, not raced:
        with each ResNet conv raced per input shape (a TimedChoice per conv), ResNet at 224 took
        4.77 ms of CPU time a call against 4.40 (issue 30, item 4)."""
        steps = tuple((conv_direct.step_code(op, first), values) for kind, op, first, values in
                      (e for e in epilogue if e[0] == "channel"))
        if self._lanes(call):  # channels-last (the convert-layout pass): dpl's own
            return conv_lanes.runner(call, self._lanes_routine(), threads, residual=any(e[0] == "residual" for e in epilogue),
                                     act=next((e[1] for e in epilogue if e[0] == "act"), None), steps=steps,
                                     pool=next((e[1] for e in epilogue if e[0] == "pool"), None))
        if conv_nhwc.takes(call):  # channels-last, else: torch's on views, or products
            return conv_nhwc.runner(call, self.products)
        if self._direct(call, folds=bool(epilogue)):
            return conv_direct.runner(call, self._conv_routine(), threads, residual=any(e[0] == "residual" for e in epilogue),
                                      act=next((e[1] for e in epilogue if e[0] == "act"), None), steps=steps)
        if self._packs_conv(call):  # the columns read in place: one pool with the C kernels
            return im2col.conv2d_product(call, packed_gemm.array_matmul(self._routine(), self.products.matmul, threads))
        return self.products.conv2d(call) or im2col.conv2d_product(call, self.products.matmul)

    def _conv_routine(self):
        """The direct convolution's routine (one per backend), None where it failed to compile."""
        return self._shared_routine("_direct_conv", conv_direct.SOURCE, "direct convolutions", conv_direct.Routine)

    def _lanes_routine(self):
        """The channels-last convolution's routine (one per backend), None where it failed to compile."""
        return self._shared_routine("_lanes_conv", conv_lanes.SOURCE, "channels-last convolutions", conv_lanes.Routine)

    def _compile_kernel(self, function, threads: int | None = None, stream_bytes: int | None | str = "default"):
        """The kernel IR's loops as C; ``threads`` caps its OpenMP team (default: all cores);
        ``stream_bytes`` overrides the backend's streaming-store threshold."""
        from dpl.kernel import LoweringError, lower_function
        stream = self.stream_bytes if stream_bytes == "default" else stream_bytes
        key = (graph_structure(function), tuple(str(p.ty) for p in function.params), self.cache.vector_math(), stream)
        lowered = _LOWERED.get(key)
        if lowered is None:
            try:
                kernel = lower_function(function)
                lowered = kernel, emit_kernel(kernel, SYMBOL, vector_math=key[2], stream_bytes=stream)
            except (LoweringError, EmitError) as err:
                raise CompileError(f"'{function.name}' has no C kernel: {err.message}") from None
            _remember(key, lowered)
        kernel, source = lowered
        if kernel.name != function.name:  # the same structure met under another name: messages say this one
            kernel = attrs.evolve(kernel, name=function.name)
        lib = self.cache.cached(source)
        if lib is None:  # the compiler runs: on the build pool while a plan is made (dpl.runtime.build_pool)
            lib = build_pool.submit(lambda: self.cache.load(source), function.name)
            if lib.done():  # no pool: compiled now, and a compile error is raised here
                lib = lib.result()
        return _c_runner(function.name, kernel, source, _Library(lib), threads, self.call_list)


# a group's kernel IR and C by its structure, parameter types and emitter options, for this
# process: lowering and emitting took 8 of a warm build's 17-19 ms (the 2-layer Llama, 14
# kernels), and a rebuild (another thread count, another target) lowers the same groups again
_LOWERED: dict = {}
_LOWERED_MAX = 4096


def _remember(key, lowered) -> None:
    if len(_LOWERED) >= _LOWERED_MAX:
        _LOWERED.pop(next(iter(_LOWERED)), None)  # the oldest entry
    _LOWERED[key] = lowered


RUNNERS = ("take", "cumsum", "index_put", "grouped_matmul")  # lone ops the backend runs without the kernel IR (below; experts.py)


def _cumsum_runner(function):
    """A lone ``cumsum`` (OPT's positions from its padding mask) as NumPy's cumsum writing
    straight into the output, or None. A scan is opaque to the kernel IR, so the group had gone
    to the next backend as a failure to compile; NumPy's sequential sum in the output dtype's
    accumulator is the reference's own, bit for bit."""
    if len(function.bindings) != 1 or function.ret is not function.bindings[0].var or len(function.params) != 1:
        return None
    call = function.bindings[0].value
    if not (isinstance(call, Call) and call.op == "cumsum" and call.args[0] is function.params[0]):
        return None
    axis, dtype = int(call.attrs["axis"]), dtypes.to_numpy(call.ty.dtype)
    acc = dtypes.accumulator_numpy(dtype)  # the reference's accumulator

    def run(inputs, outputs):
        out = outputs[0]
        if out.flags.c_contiguous and out.dtype == acc:
            np.cumsum(inputs[0], axis=axis, dtype=acc, out=out)
        else:
            np.copyto(out, np.cumsum(inputs[0], axis=axis, dtype=acc), casting="unsafe")

    run.__qualname__ = f"cpu-cumsum:{function.name}"
    return run


def _probe(op: str, weight: tuple[int, ...], attrs) -> Call:
    """A small call of ``op``, for asking a provider which pool such calls run on."""
    x, out = TensorType((1, 8, 8, 8), "float32"), TensorType((1, 8, 8, 8), "float32")
    return Call(op, (Var("x", x), Var("w", TensorType(weight, "float32"))), attrs, out)


_MATMUL = _probe("matmul", (8, 8), {})
_CONV = _probe("nn.conv2d", (8, 8, 3, 3), {"padding": [1, 1, 1, 1]})


# pools begin a part of their own: in the part of the epilogue before them, the C recomputed
# that epilogue for every window (the zoo's ResNet stem at 224x224: 15.5 ms against 7.1 with
# the activation written out)
POOLS = frozenset({"nn.max_pool2d", "nn.avg_pool2d", "nn.adaptive_avg_pool2d"})


def _pool(b) -> bool:
    return isinstance(b.value, Call) and b.value.op in POOLS


def _blas_product(b) -> bool:
    """A binding a library computes: a matrix product, a convolution (torch's, or im2col's
    product), a max pool (backends/cpu/max_pool.py), the experts' grouped product (experts.py)."""
    return (is_product(b) or im2col.takes(b.value) or conv_nhwc.takes(b.value) or max_pool.takes(b.value)
            or experts.takes(b.value))


class _Library:
    """A kernel's loaded library, or the future of one still compiling: resolved at the first
    call (the Executable waits for every build before it hands out a plan)."""

    def __init__(self, lib):
        self._lib = lib
        self._resolved = None

    def resolve(self):
        """(entry, omp_set_num_threads or None, omp_get_max_threads or None)."""
        if self._resolved is None:
            lib = self._lib.result() if hasattr(self._lib, "result") else self._lib
            entry = getattr(lib, SYMBOL)
            entry.restype = None
            entry.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64)]
            # the OpenMP runtime the kernel links (found through its handle), to cap its team
            get_threads = getattr(lib, "omp_get_max_threads", None)
            set_threads = getattr(lib, "omp_set_num_threads", None) if get_threads is not None else None
            self._resolved = (entry, set_threads, get_threads)
        return self._resolved


def _c_runner(name, kernel, source, library: _Library, threads, calls: call_list.CallList | None = None):
    """``run(inputs, outputs)`` calling a compiled kernel's entry; ``threads`` caps its OpenMP
    team for the call (the calling thread's setting is restored after). ``run.prepare`` says the
    same call as a record of ``calls`` (dpl.runtime.prepared)."""
    constants = [np.ascontiguousarray(v) for v in kernel.constants.values()]
    constant_addresses = [c.ctypes.data for c in constants]  # read once: ``constants`` keeps them alive
    dim_names = kernel.dims
    n_params = len(kernel.params)
    # (position among inputs and outputs, axis, dim) of each lone symbol: none at static shapes
    buffers = (*kernel.params, *kernel.outputs)
    symbolic = [(i, k, d) for i, buf in enumerate(buffers) for k, d in enumerate(buf.shape) if isinstance(d, str)]
    # an expression dim (n * 2) binds its symbols by solving and is checked against the arrays
    expressions = any(not isinstance(d, (int, str)) for buf in buffers for d in buf.shape)
    static = not (symbolic or dim_names or kernel.requires)  # nothing to bind or check per call
    no_dims = (ctypes.c_int64 * 1)(0)

    # where every dim is some buffer's size alone, it is read there and the other dims evaluated
    # to check: 5 us where the general binding (solving, messages) took 45, at every new size of a
    # decode step's cache (issue 31); a disagreement goes to the general binding for its message
    lone = {}
    for i, buf in enumerate(buffers):
        for k, d in enumerate(buf.shape):
            if type(d) is str:
                lone.setdefault(d, (i, k))
    # a symbol no buffer has alone, solved from an axis linear in it (the key cache's ``s + 1``
    # after a decode step's concatenation: the permute and the attention that read it went to
    # the general binding at every new length, 0.4 ms a call); the checks below catch a miss
    linear = {}
    for i, buf in enumerate(buffers):
        for k, d in enumerate(buf.shape):
            if isinstance(d, (int, str)) or len(names := dimexpr.free_symbols(d)) != 1:
                continue
            (name,) = names
            if name not in lone and dimexpr.solve(d, dimexpr.evaluate(d, {name: 5})):  # solve: None where not linear
                linear.setdefault(name, (i, k, d))
    fast = expressions and set(dim_names) <= lone.keys() | linear.keys()
    checks = [(i, k, d) for i, buf in enumerate(buffers) for k, d in enumerate(buf.shape) if (i, k) not in lone.values()]

    def quick_dims(shapes) -> dict[str, int] | None:
        try:
            bound = {d: int(shapes[i][k]) for d, (i, k) in lone.items()}
            for i, k, d in linear.values():
                solved = dimexpr.solve(d, int(shapes[i][k]))
                if not solved:
                    return None
                bound.update(solved)
            for i, k, d in checks:
                if (d if type(d) is int else bound[d] if type(d) is str else dimexpr.evaluate(d, bound)) != shapes[i][k]:
                    return None
        except (IndexError, DplError):  # a rank or a value the general binding explains
            return None
        return bound

    def dims_of(shapes) -> list[int]:
        """The kernel's dims at these shapes of its inputs and outputs, checked."""
        if expressions:
            bound = (quick_dims(shapes) if fast else None) or kernel.bind_dims(shapes)
        else:
            bound: dict[str, int] = {}
            for i, k, d in symbolic:
                bound.setdefault(d, int(shapes[i][k]))
        kernel.check_requires(bound)
        return [bound[d] for d in dim_names]

    def run(inputs, outputs):
        inputs = [np.ascontiguousarray(a) for a in inputs]
        if static:
            dims = no_dims
        else:
            values = dims_of([a.shape for a in (*inputs[:n_params], *outputs)])
            dims = (ctypes.c_int64 * max(1, len(dim_names)))(*values)
        targets = [o if o.flags.c_contiguous else np.empty_like(o, order="C") for o in outputs]
        addresses = [*[address(a) for a in inputs[:n_params]], *constant_addresses, *[address(t) for t in targets]]
        ptrs = (ctypes.c_void_p * len(addresses))(*addresses)
        entry, set_threads, get_threads = library.resolve()
        before = get_threads() if threads and set_threads is not None else threads
        if before == threads:  # no cap, or the calling thread's team is that size already
            entry(ptrs, dims)
        else:  # the calling thread's OpenMP setting, restored after
            set_threads(threads)
            try:
                entry(ptrs, dims)
            finally:
                set_threads(before)
        for o, t in zip(outputs, targets):
            if o is not t:
                np.copyto(o, t)

    def prepare(inputs, outputs):
        """The call at these ``(ref, shape)`` of its inputs and outputs, as one record; None where
        the shapes fail the kernel's checks (the general path raises it)."""
        try:
            dims = () if static else tuple(dims_of([shape for _, shape in (*inputs[:n_params], *outputs)]))
        except DplError:
            return None
        entry, set_threads, _ = library.resolve()
        args = (*[ref for ref, _ in inputs[:n_params]], *map(Address.of, constants), *[ref for ref, _ in outputs])
        cap = int(threads) if threads and set_threads is not None else 0
        return [CCall(call_list.entry_address(entry), call_list.KERNEL, args, dims, cap)]

    run.prepare, run.call_list = prepare, calls  # type: ignore[attr-defined]
    return openmp_kernel(run, f"cpu:{name}", source, threads, lambda n: _c_runner(name, kernel, source, library, n, calls))
