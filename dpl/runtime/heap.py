"""Keep the C heap's freed memory mapped, so that a library that allocates its work buffers on
every call (torch's oneDNN convolutions reorder an NCHW input into a blocked scratch buffer) does
not fault them in afresh each time.

glibc serves a block larger than its mmap threshold (128 KiB at start, raised as such blocks are
freed, up to 32 MiB) with a fresh mapping, unmapped again when freed, and gives the top of its
heap back to the system beyond its trim threshold. Either way the next call's buffers are new
pages, and faulting them in costs more than the arithmetic: ResNet's stem convolution (7x7,
stride 2, 3 -> 64 channels at 224², one thread) took 6.3 ms by ``torch.conv2d`` in a fresh
process and 2.3 ms with the thresholds below (the same process, measured back to back), and the
zoo's ResNet at batch 1 went from 10.2 to 6.9 ms (``bench/bench_zoo.py``, torch.compile's 5.2
unchanged).

:func:`keep_mapped` raises both thresholds once per process (``mallopt``), on glibc only, and
only where the user has not set them (the ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``
environment variables win, and ``DPL_KEEP_MAPPED=0`` turns it off). The cost: up to
:data:`TRIM_THRESHOLD` of freed memory stays with the process instead of going back to the
system, as it would with jemalloc or tcmalloc, the allocators Intel recommends for torch on the
CPU.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
import threading

log = logging.getLogger(__name__)

MMAP_THRESHOLD = 64 << 20  # blocks below this come from the heap, not a fresh mapping
TRIM_THRESHOLD = 128 << 20  # free memory at the heap's top kept up to this
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")

_lock = threading.Lock()
_state: list[str] = []  # what keep_mapped did, once decided


def _mallopt():
    """glibc's ``mallopt``, or None off glibc (musl, macOS, Windows)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        if not hasattr(libc, "gnu_get_libc_version"):
            return None
        fn = libc.mallopt
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return fn


def keep_mapped() -> str:
    """Raise glibc's mmap and trim thresholds once per process (see the module docstring); says
    what was done, for ``exe.summary()``."""
    with _lock:
        if _state:
            return _state[0]
        if os.environ.get("DPL_KEEP_MAPPED", "1") == "0":
            said = "freed memory: left to the C library (DPL_KEEP_MAPPED=0)"
        elif any(name in os.environ for name in USER_SETTINGS):
            said = "freed memory: the MALLOC_*_THRESHOLD_ environment settings, as given"
        elif (mallopt := _mallopt()) is None:
            said = "freed memory: left to the C library (not glibc)"
        elif mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1:
            said = (f"freed memory: kept mapped (glibc mmap threshold {MMAP_THRESHOLD >> 20} MiB, "
                    f"trim threshold {TRIM_THRESHOLD >> 20} MiB)")
        else:
            said = "freed memory: left to the C library (mallopt refused)"
        log.debug(said)
        _state.append(said)
        return said
