"""The call of one dpl partition inside a torch graph: tensors in, tensors out.

Inputs go to the Executable as NumPy views of the tensors' memory (a copy only where a tensor
is not contiguous); its outputs come back as tensors over the arrays' memory
(``torch.from_numpy``; a copy only where an array is read-only: a view of a weight). dpl reads
sizes from the tensors' shapes; a size argument (a SymInt of dynamo's) that no tensor's shape
determines comes in as the shape of an array of no elements, ``[s, 0]`` (dynamo.py's size
carriers), so the plan binds it as it binds any dim.

What never gives a wrong result: the weights were bound into the build as constants, so each
call checks that every weight tensor is the one built with, unchanged (its storage and
version counter); a weight changed in place since (an optimizer step) sends the partition to
torch for good, with a warning. Any error of a dpl call (an input size it cannot plan) does the
same, and that call's result is torch's.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from dpl import dtypes
from dpl.errors import DplError

logger = logging.getLogger(__name__)


def _bfloat16():
    """NumPy's bfloat16, looked up once (every call compares its outputs' dtype with it); None
    without ml_dtypes, where no array holds one."""
    try:
        return dtypes.to_numpy("bfloat16")
    except DplError:
        return None


_BFLOAT16 = _bfloat16()


def as_array(tensor: torch.Tensor) -> np.ndarray:
    t = tensor.detach() if tensor.requires_grad else tensor  # a detached view costs a microsecond of each call
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(dtypes.to_numpy("bfloat16"))
    return t.numpy()


def as_tensor(array) -> torch.Tensor:
    a = np.asarray(array)
    if not a.flags.writeable:  # a weight's memory (or a view of it): never hand it out writable
        a = a.copy()
    if a.dtype == _BFLOAT16:
        return as_tensor(a.view(np.int16)).view(torch.bfloat16)
    try:
        return torch.from_numpy(a)
    except ValueError:  # negative strides, which torch cannot view
        return torch.from_numpy(np.ascontiguousarray(a))


class DplCall(torch.nn.Module):
    """Runs ``exe`` on the tensor arguments at ``tensor_at``, then the size arguments at
    ``size_at`` as arrays of shape ``[size, 0]``; ``weights`` are ``(position, name, tensor)`` of
    the arguments built in as constants; ``fallback`` is the partition's torch GraphModule (same
    arguments, a tuple of results); ``record`` its report entry."""

    def __init__(self, exe, fallback, tensor_at, weights, record, size_at=(), in_place=()):
        super().__init__()
        self.exe = exe
        # (output, Executable input, argument) of each result that AOTAutograd writes back into
        # that argument after the call (a static cache's update): written there by dpl instead
        # and returned as the argument itself, so the write-back copies nothing
        self.in_place = tuple(in_place)
        self.fallback = fallback
        self.tensor_at = tuple(tensor_at)
        self.size_at = tuple(size_at)
        # the built tensor is kept, so no other tensor's memory can start where its data did:
        # the same data_ptr (and version) is the same memory, unchanged; one call per weight,
        # where storage and offset took two and a storage object (48 us a decode step)
        self.weights = [(i, name, w, w.data_ptr(), w._version) for i, name, w in weights]
        self.record = record
        self.in_torch = False

    def __call__(self, *args):
        """:meth:`forward`, without nn.Module's call machinery (hook checks: 2-5 us of every
        call on the bench host, issue 31): only the graph it was put in calls it."""
        return self.forward(*args)

    def forward(self, *args):
        if self.in_torch:
            return self.fallback(*args)
        changed = self._changed_weight(args)
        if changed is not None:
            return self._to_torch(args, f"weight '{changed}' changed since the build (dpl built it in as a constant); "
                                        "compile again (torch._dynamo.reset()) to build with the new values")
        try:
            sizes = [np.empty((int(args[i]), 0), np.uint8) for i in self.size_at]
            arrays = [as_array(args[i]) for i in self.tensor_at]
            pairs = [(k, j) for k, j, i in self.in_place if args[i].is_contiguous()]  # else as_array copied it
            out = self.exe.call_in_place([*arrays, *sizes], pairs) if pairs else self.exe(*arrays, *sizes)
        except Exception as err:  # any failure of a dpl call: this partition is torch's from now on
            return self._to_torch(args, f"dpl failed at run time: {_first_line(err)}")
        self.record.calls += 1
        outs = out if isinstance(out, tuple) else (out,)
        # a result written in its argument's memory: the argument itself is the result
        written = {k: i for k, j, i in self.in_place if outs[k] is arrays[j]}
        self.record.in_place = len(written)
        return tuple(args[written[k]] if k in written else as_tensor(o) for k, o in enumerate(outs))

    def _changed_weight(self, args) -> str | None:
        for i, name, _built, ptr, version in self.weights:  # _built: keeps the memory dpl reads alive
            t = args[i]
            if t._version != version or t.data_ptr() != ptr:
                return name
        return None

    def _to_torch(self, args, why: str):
        logger.warning("%s runs in torch from now on: %s", self.record.name, why)
        self.record.to_torch(why)
        self.in_torch = True
        return self.fallback(*args)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__
