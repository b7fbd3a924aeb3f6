"""Frontends: bring real models into dpl's IR.

Each frontend lives in its own module and imports its framework lazily, so torch and onnx
stay optional extras: importing :mod:`dpl` never imports them.
"""

from dpl.frontend.errors import FrontendError

__all__ = ["FrontendError", "load_model"]


def load_model(path) -> "Module":  # noqa: F821 - dpl.ir.Module, imported lazily
    """A module from a file, by its suffix: an ONNX model (``.onnx``) through
    :func:`dpl.from_onnx`, a saved ExportedProgram (``.pt2``, ``torch.export.save``) through
    :func:`dpl.from_torch`, anything else as dpl's text form (:func:`dpl.load`). What the
    command line reads."""
    import os

    if os.fspath(path).endswith(".onnx"):
        from dpl.frontend.onnx_import import from_onnx

        return from_onnx(path)
    if os.fspath(path).endswith(".pt2"):
        from dpl.frontend.torch_export import load_exported

        return load_exported(path)
    from dpl.ir.serialize import load

    return load(path)
