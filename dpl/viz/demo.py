"""The model ``dpl demo`` runs: a Llama-style decoder block shipped as package data
(``data/decoder_block.ir`` plus its ``.npz`` weights; ``scripts/make_demo_model.py`` wrote
them), and the timing helper the demo uses."""

from __future__ import annotations

import time
from importlib import resources
from typing import Callable

import numpy as np

from dpl.ir.expr import Module
from dpl.ir.serialize import load


def decoder_block() -> Module:
    """The shipped decoder block: RMSNorm, causal attention, SwiGLU MLP and two residuals,
    written out op by op as Hugging Face code is (no torch needed)."""
    with resources.as_file(resources.files("dpl.viz") / "data" / "decoder_block.ir") as path:
        return load(path)


def best_time_ms(fn: Callable[[], object], budget_s: float = 0.5, min_runs: int = 5) -> float:
    """The best of repeated runs of ``fn`` in ms (after one warm-up run), within about
    ``budget_s`` seconds."""
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
        if len(times) >= 1000:
            break
    return float(np.min(times))
