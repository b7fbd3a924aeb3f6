import os

import pytest


@pytest.fixture(scope="session")
def tvm():
    """TVM 0.27, the oracle. Missing TVM skips locally but fails under CI, so an oracle test
    can never silently stop running."""
    try:
        import tvm
        from tvm import relax  # noqa: F401
    except ImportError as err:
        if os.environ.get("CI"):
            pytest.fail(f"TVM oracle missing under CI: {err}")
        pytest.skip(f"TVM oracle not installed: {err}")
    return tvm


@pytest.fixture
def no_c_compiler():
    """The CPU backend as on a machine without a C compiler: unavailable, so "cpu" targets run
    on the NumPy backend by recorded fall-back (the runtime tests that check fall-back and the
    NumPy baseline use this)."""
    from dpl.backends.cpu_backend import CpuBackend
    from dpl.backends.registry import get_backend, register_backend

    old = get_backend("cpu")
    register_backend(CpuBackend(cc="dpl-no-such-compiler"))
    yield
    register_backend(old)
