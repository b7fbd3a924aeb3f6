"""Pausing Python's cyclic garbage collector around a pass.

A pass over a large module makes many small IR objects that reference counting frees on its
own; the cyclic collector would walk every live object of the module again and again (a full
collection is triggered by allocation counts, and its cost grows with the heap), which makes
a linear pass superlinear. The passes run with it paused and restore its state afterwards;
what cyclic garbage a pass leaves (a few closures) is collected at the next collection after.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def paused_collector() -> Iterator[None]:
    """Run the block with the cyclic collector disabled; its earlier state comes back after
    (nested uses are fine: only the outermost one that disabled it enables it again)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
