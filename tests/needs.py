"""What a test needs from the machine (a C compiler, an optional package): missing, the test
skips locally but fails under CI, so CI can never stop running it silently."""

import importlib
import os
import shutil

import pytest


def missing(why: str, module_level: bool = False):
    """Fail under CI, skip elsewhere, saying ``why``."""
    if os.environ.get("CI"):
        pytest.fail(f"{why} under CI", pytrace=False)
    pytest.skip(why, allow_module_level=module_level)


def c_compiler() -> None:
    if shutil.which("cc") is None:
        missing("no C compiler ('cc') on this machine")


def package(name: str, module_level: bool = False):
    """The imported package ``name``."""
    try:
        return importlib.import_module(name)
    except ImportError as err:
        missing(f"{name} is not installed ({err})", module_level)


def program(name: str, install: str) -> str:
    """The path of program ``name``; ``install`` says how to get it."""
    path = shutil.which(name)
    if path is None:
        missing(f"no '{name}' on this machine ({install})")
    return path


def gpu():
    """CuPy, with a CUDA device to run on. Without one the test is skipped with the reason,
    also under CI (which has no GPU): a GPU test never passes silently, it reports skipped.
    ``pytest -m gpu`` runs only these tests."""
    try:
        cp = importlib.import_module("cupy")
    except ImportError as err:
        pytest.skip(f"no GPU: CuPy is not installed ({err})")
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except Exception as err:  # noqa: BLE001 (no driver, no runtime: CuPy's own error types)
        pytest.skip(f"no GPU: {type(err).__name__}: {err}")
    if count == 0:
        pytest.skip("no GPU: no CUDA device")
    return cp


# the instruction sets kernels are built for in the per-ISA tests, by -march: this CPU's own
# (AVX-512 where it has it) and AVX2 with FMA only, as on a host without AVX-512 (a Zen 3, a Haswell)
BUILDS = {"native": (), "haswell": ("avx2", "fma")}


def build_runs_here(march: str) -> None:
    """Skip where this CPU cannot run a ``-march`` build of :data:`BUILDS` (an AVX2 build on a
    CPU without AVX2: the build's code would not run at all)."""
    from dpl.host_cpu import isa_flags

    if not set(BUILDS[march]) <= set(isa_flags()):
        pytest.skip(f"this CPU cannot run a -march={march} build")
