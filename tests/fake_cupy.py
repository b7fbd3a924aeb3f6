"""A stand-in for CuPy on a machine without a GPU, for testing the CuPy backend end to end.

"Device" arrays are NumPy arrays of the subclass :class:`DeviceArray`, so a host array that
reaches a kernel, a product or a copy where a device array belongs is caught. Copies between
host and device are counted (``to_device``, ``to_host``); ``from_dlpack`` takes a
:class:`Tensor` (a stand-in for a torch CUDA tensor) without a copy, and this module's own
``from_dlpack`` hands device arrays back as Tensors.

Streams capture: between ``begin_capture`` and ``end_capture`` kernel launches and device
copies are recorded into a :class:`Graph` (not run), and copies from or to the host and
allocations fail as they do in CUDA, and so does ``matmul`` as it does in CuPy (which refuses
any cuBLAS call while a stream captures); ``graph.launch`` replays what was recorded. ``RawModule``
compiles its source with NVRTC (when asked) and builds the host twin of the kernel; launching
it checks the launch (block size equal to the ``-DDPL_BLOCK`` option, device arrays that are
C-contiguous, int64 scalars) and runs the twin on those arrays. Every call is recorded.
"""

import contextlib
from types import SimpleNamespace

import numpy as np

from dpl.backends.cuda.host import HostTwin


# what cupy.cuda.compiler adds to a RawModule's options (besides -arch), as of CuPy 14
CUPY_ADDS = ("-ftz=true", "--device-as-default-execution-space")


class DeviceArray(np.ndarray):
    """An array "on the device"."""

    @property
    def data(self):
        """As CuPy's: ``.data.ptr`` is the address (here in host memory)."""
        return SimpleNamespace(ptr=self.ctypes.data)


class Tensor:
    """A DLPack producer on the device (what a torch CUDA tensor is to the runner)."""

    def __init__(self, array):
        self.array = _on_device(array, "Tensor")

    def __dlpack__(self, stream=None):
        return self.array  # the stand-in capsule: the very device memory

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA, device 0


def from_dlpack(x):
    """The framework side (``torch.from_dlpack``): a device array as a Tensor, no copy."""
    return Tensor(x.__dlpack__() if hasattr(x, "__dlpack__") and not isinstance(x, np.ndarray) else x)


class Graph:
    def __init__(self, calls):
        self.calls = list(calls)  # what the capture recorded: zero-argument callables
        self.launches = 0

    def launch(self, stream=None):
        self.launches += 1
        for call in self.calls:
            call()


class Stream:
    def __init__(self, fake, non_blocking=False):
        self.fake = fake
        self.synchronized = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self):
        self.synchronized += 1

    def wait_event(self, event):
        assert event == "event", "waits on an event the current stream recorded"

    def begin_capture(self, mode=None):
        assert self.fake.capturing is None, "a capture is under way already"
        self.fake.capturing = []

    def end_capture(self):
        calls, self.fake.capturing = self.fake.capturing, None
        graph = Graph(calls)
        self.fake.graphs.append(graph)
        return graph


def _on_device(a, what):
    if not isinstance(a, DeviceArray):
        raise AssertionError(f"{what}: a host array ({type(a).__name__}) where a device array belongs")
    return a


class FakeCupy:
    def __init__(self, devices: int = 1, nvrtc=None, fail_compile: bool = False, compute_capability: str = "90"):
        self.nvrtc = nvrtc  # the dpl.backends.cuda.nvrtc module, to compile every source; None: skip
        self.fail_compile = fail_compile
        self.arch = f"compute_{compute_capability}"  # CuPy compiles for the device's own architecture
        self.sources: list[str] = []
        self.launches: list[tuple] = []  # (kernel name, grid, block, argument kinds)
        self.matmuls = 0
        self.to_device = self.to_host = 0
        self.from_dlpacks = 0
        self.capturing: list | None = None  # the calls a stream capture records
        self.graphs: list[Graph] = []
        self.ndarray = DeviceArray
        self.cuda = SimpleNamespace(runtime=SimpleNamespace(getDeviceCount=lambda: devices, getDevice=lambda: 0),
                                    Device=lambda: SimpleNamespace(compute_capability=compute_capability),
                                    Stream=lambda non_blocking=False: Stream(self, non_blocking),
                                    get_current_stream=lambda: SimpleNamespace(ptr=0, record=lambda: "event"),
                                    using_allocator=self._using_allocator)
        self.allocator = None  # what cupy.cuda.using_allocator set, for this "thread"

    @contextlib.contextmanager
    def _using_allocator(self, allocator):
        saved, self.allocator = self.allocator, allocator
        try:
            yield
        finally:
            self.allocator = saved

    def _not_capturing(self, what):
        if self.capturing is not None:
            raise RuntimeError(f"{what} while the stream is capturing (cudaErrorStreamCaptureUnsupported)")

    def _run_or_record(self, call):
        if self.capturing is not None:
            self.capturing.append(call)
        else:
            call()

    # -- arrays ---------------------------------------------------------------------------------
    def asarray(self, a):
        if isinstance(a, DeviceArray):
            return a
        self._not_capturing("a copy from the host")
        if not isinstance(a, (np.ndarray, np.generic, int, float)):
            raise AssertionError(f"asarray of {type(a).__name__}")
        self.to_device += 1
        return np.array(a, copy=True).view(DeviceArray)

    def ascontiguousarray(self, a):
        _on_device(a, "ascontiguousarray")
        return a if a.flags.c_contiguous else np.ascontiguousarray(a).view(DeviceArray)

    def asnumpy(self, a):
        _on_device(a, "asnumpy")
        self._not_capturing("a copy to the host")
        self.to_host += 1
        return np.array(a, copy=True).view(np.ndarray)

    def empty(self, shape, dtype):
        """Filled with all-ones bytes (NaN, -1, True), so an element a kernel forgets shows."""
        if self.allocator is not None:
            self.allocator(int(np.prod(shape)) * np.dtype(dtype).itemsize)
        self._not_capturing("an allocation")
        a = np.empty(shape, dtype)
        a.reshape(-1).view(np.uint8)[...] = 0xFF
        return a.view(DeviceArray)

    def result_type(self, *arrays):
        return np.result_type(*arrays)

    def matmul(self, a, b, out=None):
        _on_device(a, "matmul")
        _on_device(b, "matmul")
        if out is not None:
            _on_device(out, "matmul out")
        self.matmuls += 1
        if self.capturing is not None:  # CuPy's cublas.setStream refuses a capturing stream
            raise NotImplementedError("calling cuBLAS API during stream capture is currently unsupported")
        if out is None:
            return np.matmul(a, b).view(DeviceArray)
        np.matmul(a, b, out=out)
        return out

    def copyto(self, dst, src):
        _on_device(dst, "copyto"), _on_device(src, "copyto")
        self._run_or_record(lambda: np.copyto(dst, src))

    def from_dlpack(self, x):
        """``cupy.from_dlpack``: the producer's device memory itself, no copy."""
        self.from_dlpacks += 1
        return _on_device(x.__dlpack__(), "from_dlpack")

    # -- kernels --------------------------------------------------------------------------------
    def RawModule(self, code, options=()):  # noqa: N802 (CuPy's name)
        if self.fail_compile:
            raise RuntimeError("NVRTC_ERROR_COMPILATION (a stand-in failure)")
        block = next(int(o.split("=", 1)[1]) for o in options if o.startswith("-DDPL_BLOCK="))
        if self.nvrtc is not None:  # with the options CuPy's RawModule adds to the caller's
            self.nvrtc.compile_ptx(code, arch=self.arch, options=(*options, *CUPY_ADDS))
        self.sources.append(code)
        return _Module(self, code, block)


class _Module:
    def __init__(self, fake, code, block):
        self.fake, self.code, self.block = fake, code, block

    def get_function(self, name):
        return _Function(self.fake, name, HostTwin.from_code(name, self.code, self.block), self.block)


class _Function:
    def __init__(self, fake, name, twin, block):
        self.fake, self.name, self.twin, self.block = fake, name, twin, block

    def __call__(self, grid, block, args, **_):
        assert isinstance(grid, tuple) and isinstance(block, tuple), "grid and block are tuples"
        assert block == (self.block,), f"launched with block {block}, compiled for {self.block} threads"
        kinds = []
        for a in args:
            if isinstance(a, np.ndarray):
                _on_device(a, f"argument of {self.name}")
                assert a.flags.c_contiguous, "kernels take C-contiguous arrays"
                kinds.append(f"{a.dtype}{list(a.shape)}")
            else:
                assert isinstance(a, np.int64), f"scalar arguments are int64, got {type(a).__name__}"
                kinds.append("int64")
        self.fake.launches.append((self.name, grid, block, tuple(kinds)))
        self.fake._run_or_record(lambda: self.twin.launch(self.name, grid[0], args))
