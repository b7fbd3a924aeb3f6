"""A stand-in for CuPy on a machine without a GPU, for testing the CuPy backend end to end.

"Device" arrays are NumPy arrays of the subclass :class:`DeviceArray`, so a host array that
reaches a kernel, a product or a copy where a device array belongs is caught. ``RawModule``
compiles its source with NVRTC (when asked) and builds the host twin of the kernel; launching
it checks the launch (block size equal to the ``-DDPL_BLOCK`` option, device arrays that are
C-contiguous, int64 scalars) and runs the twin on those arrays. Every call is recorded.
"""

from types import SimpleNamespace

import numpy as np

from dpl.backends.cuda_host import HostTwin


# what cupy.cuda.compiler adds to a RawModule's options (besides -arch), as of CuPy 14
CUPY_ADDS = ("-ftz=true", "--device-as-default-execution-space")


class DeviceArray(np.ndarray):
    """An array "on the device"."""


def _on_device(a, what):
    if not isinstance(a, DeviceArray):
        raise AssertionError(f"{what}: a host array ({type(a).__name__}) where a device array belongs")
    return a


class FakeCupy:
    def __init__(self, devices: int = 1, nvrtc=None, fail_compile: bool = False):
        self.nvrtc = nvrtc  # the dpl.backends.nvrtc module, to compile every source; None: skip
        self.fail_compile = fail_compile
        self.sources: list[str] = []
        self.launches: list[tuple] = []  # (kernel name, grid, block, argument kinds)
        self.matmuls = 0
        self.to_device = self.to_host = 0
        self.cuda = SimpleNamespace(runtime=SimpleNamespace(getDeviceCount=lambda: devices))

    # -- arrays ---------------------------------------------------------------------------------
    def asarray(self, a):
        if isinstance(a, DeviceArray):
            return a
        if not isinstance(a, (np.ndarray, np.generic, int, float)):
            raise AssertionError(f"asarray of {type(a).__name__}")
        self.to_device += 1
        return np.array(a, copy=True).view(DeviceArray)

    def ascontiguousarray(self, a):
        _on_device(a, "ascontiguousarray")
        return a if a.flags.c_contiguous else np.ascontiguousarray(a).view(DeviceArray)

    def asnumpy(self, a):
        _on_device(a, "asnumpy")
        self.to_host += 1
        return np.array(a, copy=True).view(np.ndarray)

    def empty(self, shape, dtype):
        """Filled with all-ones bytes (NaN, -1, True), so an element a kernel forgets shows."""
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
        return np.matmul(a, b, out=out).view(DeviceArray)

    def copyto(self, dst, src):
        np.copyto(_on_device(dst, "copyto"), _on_device(src, "copyto"))

    # -- kernels --------------------------------------------------------------------------------
    def RawModule(self, code, options=()):  # noqa: N802 (CuPy's name)
        if self.fail_compile:
            raise RuntimeError("NVRTC_ERROR_COMPILATION (a stand-in failure)")
        block = next(int(o.split("=", 1)[1]) for o in options if o.startswith("-DDPL_BLOCK="))
        if self.nvrtc is not None:  # with the options CuPy's RawModule adds to the caller's
            self.nvrtc.compile_ptx(code, options=(*options, *CUPY_ADDS))
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
        self.twin.launch(self.name, grid[0], args)
