"""NVRTC through ctypes: CUDA C++ to PTX without a GPU, a driver or CuPy.

The library comes from the ``nvidia-cuda-nvrtc-cu12`` wheel (``nvidia/cuda_nvrtc/lib``) or,
failing that, from the system's loader path. It is how the tests check that every kernel the
CUDA emitter writes compiles; the CuPy backend compiles through CuPy's own NVRTC instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
from functools import lru_cache
from pathlib import Path

from dpl.errors import DplError

DEFAULT_ARCH = "compute_80"


class NvrtcError(DplError):
    """NVRTC is missing, or rejected a source (the message holds its log)."""


def _wheel_libraries() -> list[Path]:
    try:
        spec = importlib.util.find_spec("nvidia.cuda_nvrtc")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    found = []
    for root in spec.submodule_search_locations:
        found += sorted((Path(root) / "lib").glob("libnvrtc.so.*"))
    return found


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The NVRTC shared library, or an NvrtcError saying where it was looked for."""
    tried = []
    for candidate in [*map(str, _wheel_libraries()), "libnvrtc.so", "libnvrtc.so.12"]:
        try:
            lib = ctypes.CDLL(candidate)
        except OSError as err:
            tried.append(f"{candidate}: {err}")
            continue
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        return lib
    raise NvrtcError("NVRTC is not installed (pip install nvidia-cuda-nvrtc-cu12)", hint="; ".join(tried) or None)


def available() -> tuple[bool, str]:
    try:
        lib = library()
    except NvrtcError as err:
        return False, err.message
    return True, f"NVRTC {'.'.join(map(str, version()))} ({lib._name})"


def version() -> tuple[int, int]:
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(library().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def _check(status: int, what: str, log: str = "") -> None:
    if status != 0:
        reason = library().nvrtcGetErrorString(status).decode()
        raise NvrtcError(f"{what} failed: {reason}" + (f"\n{log}" if log else ""))


def compile_ptx(source: str, name: str = "kernel.cu", arch: str = DEFAULT_ARCH, options: tuple[str, ...] = ()) -> str:
    """The PTX of ``source`` for virtual architecture ``arch``; an NvrtcError with NVRTC's log
    when it does not compile (warnings alone do not fail)."""
    with _program(source, name, arch, options, f"NVRTC compiling '{name}'") as (lib, prog, _):
        return _output(lib, prog, lib.nvrtcGetPTXSize, lib.nvrtcGetPTX, "nvrtcGetPTX").value.decode()


def compile_cubin(source: str, name: str = "kernel.cu", arch: str = "sm_90", options: tuple[str, ...] = ()) -> tuple[bytes, str]:
    """The CUBIN of ``source`` for the real architecture ``arch`` (``sm_80``, ``sm_90``), and
    NVRTC's log: ptxas runs inside NVRTC, so what only the assembler checks (static shared
    memory over 48 KiB, registers under ``__launch_bounds__``) fails here too, without a GPU.
    With ``--ptxas-options=-v`` among ``options`` the log holds ptxas's resource usage."""
    if not arch.startswith("sm_"):
        raise NvrtcError(f"a CUBIN needs a real architecture (sm_XY), got {arch!r}")
    with _program(source, name, arch, options, f"NVRTC compiling '{name}' for {arch}") as (lib, prog, log):
        return _output(lib, prog, lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN, "nvrtcGetCUBIN").raw, log


@contextlib.contextmanager
def _program(source: str, name: str, arch: str, options: tuple[str, ...], what: str):
    """(library, compiled program, its log), the program destroyed on leaving; an NvrtcError
    saying ``what`` failed, with the log, when it does not compile."""
    lib = library()
    prog = ctypes.c_void_p()
    _check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None), "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={arch}", "--std=c++17", *options]
        argv = (ctypes.c_char_p * len(opts))(*(o.encode() for o in opts))
        status = lib.nvrtcCompileProgram(prog, len(opts), argv)
        log = _log(lib, prog)
        if status != 0:
            _check(status, what, log)
        yield lib, prog, log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _output(lib, prog, get_size, get, what: str):
    size = ctypes.c_size_t()
    _check(get_size(prog, ctypes.byref(size)), f"{what}Size")
    out = ctypes.create_string_buffer(size.value)
    _check(get(prog, out), what)
    return out


def _log(lib, prog) -> str:
    size = ctypes.c_size_t()
    if lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)) != 0:
        return ""
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    return log.value.decode(errors="replace").strip()
