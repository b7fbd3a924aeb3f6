"""The address of an array's memory, for a C call, at the least cost a call pays per array.

A kernel's C entry takes its arrays as addresses, and a small model's call passes a handful of
them per kernel, so the way to read one is part of every call's dispatch (issue 31: 20 us of
Python per compiled partition). NumPy's ``a.ctypes.data`` builds a helper object each time
(1.7 us on the bench host); ctypes' view of the array's buffer gives the same address in 0.45 us
where the buffer protocol hands it out writable and C-contiguous. A read-only array (a weight
bound as a constant, passed at every call) is looked up by identity: its address is read once
and kept while it lives (a weak reference says when it dies, so a later array with the same
``id`` is never taken for it). The rest (empty, strided) take NumPy's way.
"""

from __future__ import annotations

import ctypes
import weakref

import numpy as np

_READ_ONLY: dict[int, tuple[weakref.ref, int]] = {}  # id -> (the array, its address), while it lives


def address(a: np.ndarray) -> int:
    """The address of ``a``'s first element (``a.ctypes.data``)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError):  # read-only, empty or not C-contiguous: the buffer protocol refuses it
        pass
    if a.flags.writeable:
        return a.ctypes.data
    key = id(a)
    found = _READ_ONLY.get(key)
    if found is not None and found[0]() is a:
        return found[1]
    at = a.ctypes.data
    _READ_ONLY[key] = (weakref.ref(a, lambda _dead, key=key: _READ_ONLY.pop(key, None)), at)
    return at
