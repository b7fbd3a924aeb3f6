"""Frontends: bring real models into dpl's IR.

Each frontend lives in its own module and imports its framework lazily, so torch and onnx
stay optional extras: importing :mod:`dpl` never imports them.
"""

from dpl.errors import DplError


class FrontendError(DplError):
    """A model construct a frontend cannot bring in: the message names the operator or node,
    where it is in the model, and what dpl supports instead."""
