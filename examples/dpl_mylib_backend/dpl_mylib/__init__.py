"""dpl_mylib: a worked example of a dpl backend plugin.

Installed, it declares two entry points (see pyproject.toml): the backend ``mylib`` in the
group ``dpl.backends`` and the pattern library ``mylib`` in the group ``dpl.patterns``. Then

    mod = dpl.apply(mod, ["mylib"])       # composites mylib.dense_relu, mylib.dense, ...
    exe = dpl.build(mod, "cpu")           # they run on mylib: the prefix picks the backend
"""

from dpl_mylib.backend import MyLibBackend

__all__ = ["MyLibBackend"]
