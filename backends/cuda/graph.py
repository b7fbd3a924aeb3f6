"""A whole plan as one CUDA graph, captured once per input shape and replayed.

A decoder step at batch 1 is dozens of small kernels; launched one by one from Python, the
launches cost more than the kernels. CuPy's stream capture (``Stream.begin_capture`` /
``end_capture``) records every launch of one run into a ``cupy.cuda.Graph``, and
``graph.launch`` replays them all in one call.

A graph holds the device addresses of its arguments, so the captured run reads fixed input
buffers and writes fixed output buffers: each call copies its inputs into the former (device
to device, or the one host-to-device copy of a NumPy input) and its results out of the
latter. The first call runs step by step (it compiles, and allocates the scratch buffers the
kernels keep), then captures; the graph replays from the second call on. A plan with steps
on the host, or whose capture fails (an allocation or a copy from the host inside a kernel),
runs step by step; ``note`` says which and why. Allocations are refused during the capture
(a thread-local allocator that raises), so the graph never holds memory it does not own.

A graph pays for its launches saved with those copies, so a plan whose edges are large against
its launch count (one kernel over 8192 x 8192 floats: 800 MB copied to save one launch) runs
step by step on the caller's arrays. Two tests decide. Before the capture,
:func:`worth_capturing` weighs the most a step from Python could cost (``STEP_S``) against the
copies at ``COPY_BYTES_PER_S``, a device-to-device rate below any recent data-centre GPU's: a
plan it refuses is never captured (nor its fixed buffers allocated). After it, the second call
times both ways once (``measured``: the steps on the caller's arrays, then the graph with
its copies, each ended by a synchronisation) and keeps the faster; on an H100 a step of a
CuPy plan cost 70-100 us of Python and launches, far above a launch alone, so neither a
constant nor a model of the host would hold on another machine.
"""

from __future__ import annotations

import contextlib
import logging
import time

log = logging.getLogger(__name__)

STEP_S = 100e-6  # the most a graph saves per step: its launches and the runner's Python around them
COPY_BYTES_PER_S = 1.5e12  # what the copies in and out cost (bytes read and written)


def worth_capturing(steps: int, edge_bytes: int) -> str | None:
    """None when a graph of ``steps`` launches is worth copying ``edge_bytes`` of inputs and
    results through its fixed buffers at every call; else why not."""
    copy_s, saved_s = 2 * edge_bytes / COPY_BYTES_PER_S, steps * STEP_S
    if copy_s <= saved_s:
        return None
    return (f"{steps} step(s) save at most {saved_s * 1e6:.0f} us, copying {edge_bytes / 1e6:.1f} MB in and out "
            f"of a graph costs about {copy_s * 1e6:.0f} us")


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us"


class AllocationInCapture(RuntimeError):
    """Memory asked for while a plan is captured: the graph would keep its address after the
    memory pool has handed the block to someone else."""


def _refuse(size: int):
    raise AllocationInCapture(f"an allocation of {size} bytes inside the captured plan")


def _no_allocations(cp):
    """CuPy's thread-local allocator refusing every request, for the capture: an allocation
    from the memory pool's cached blocks would not fail by itself, but the graph would write
    into a block that later belongs to another array."""
    using = getattr(cp.cuda, "using_allocator", None)
    return using(_refuse) if using is not None else contextlib.nullcontext()


class GraphRunner:
    """Runs a DevicePlan: step by step, or as its captured graph."""

    clock = staticmethod(time.perf_counter)  # what the trial times with (the tests' stand-in ticks)

    def __init__(self, cp, device_plan, why_not: str | None = None):
        self._cp, self._plan = cp, device_plan
        self.why_not = why_not  # None: not yet captured, or captured
        self.graph = None
        self.stream = None
        self.replays = 0
        self.measured: tuple[float, float] | None = None  # (steps, graph) seconds, once timed
        self._static_in: list | None = None
        self._static_out: list | None = None

    @property
    def note(self) -> str:
        timed = "" if self.measured is None else f" (a call timed {_us(self.measured[1])} replayed, {_us(self.measured[0])} step by step)"
        if self.graph is not None:
            return f"CUDA graph captured, replayed {self.replays} time(s){timed}"
        if self.why_not is not None:
            return f"step by step: {self.why_not}"
        return "step by step until the second call (then captured as a CUDA graph)"

    def run(self, inputs: list) -> list:
        cp = self._cp
        if self.why_not is not None:
            outs = self._plan.new_outputs()
            self._plan.run_steps(inputs, outs)
            return outs
        if self.stream is None:
            self.stream = cp.cuda.Stream(non_blocking=True)
        # the inputs were written on the caller's stream (a copy in, torch's stream): wait for it
        self.stream.wait_event(cp.cuda.get_current_stream().record())
        with self.stream:
            if self.graph is None:
                outs = self._plan.new_outputs()
                self._plan.run_steps(inputs, outs)  # compiles, warms the scratch buffers
                self.why_not = worth_capturing(len(self._plan.steps), sum(a.nbytes for a in (*inputs, *outs)))
                if self.why_not is None:
                    self._capture(inputs)
                self.stream.synchronize()
                return outs
            if self.measured is None:
                return self._trial(inputs)
            return self._replay(inputs)

    def _replay(self, inputs: list) -> list:
        for static, a in zip(self._static_in, inputs):
            self._cp.copyto(static, a)
        self.graph.launch(self.stream)
        self.replays += 1
        outs = [o.copy() for o in self._static_out]
        self.stream.synchronize()
        return outs

    def _trial(self, inputs: list) -> list:
        """The first call after the capture: one run step by step and one replay, each timed
        to its synchronisation; the graph is kept only if it was faster."""
        start = self.clock()
        outs = self._plan.new_outputs()
        self._plan.run_steps(inputs, outs)
        self.stream.synchronize()
        steps_s = self.clock() - start
        start = self.clock()
        outs = self._replay(inputs)
        graph_s = self.clock() - start
        self.measured = (steps_s, graph_s)
        if graph_s > steps_s:
            self.graph = self._static_in = self._static_out = None
            self.why_not = f"measured faster than its CUDA graph ({_us(steps_s)} a call, {_us(graph_s)} replayed with its copies)"
            log.info("plan runs step by step: %s", self.why_not)
        return outs

    def _capture(self, inputs: list) -> None:
        cp = self._cp
        static_in = [cp.empty(a.shape, a.dtype) for a in inputs]
        static_out = self._plan.new_outputs()
        self.stream.synchronize()
        try:
            self.stream.begin_capture()
        except Exception as err:  # noqa: BLE001 (CuPy's or the driver's error)
            self.why_not = f"stream capture is not available ({type(err).__name__}: {err})"
            return
        try:
            with _no_allocations(cp):
                self._plan.run_steps(static_in, static_out)
        except Exception as err:  # noqa: BLE001 (a step that cannot be captured)
            try:
                self.stream.end_capture()
            except Exception:  # noqa: BLE001 (the capture is invalid already)
                pass
            self.why_not = f"a step cannot be captured ({type(err).__name__}: {err})"
            log.info("plan not captured as a CUDA graph: %s", self.why_not)
            return
        self.graph = self.stream.end_capture()
        self._static_in, self._static_out = static_in, static_out
