"""The old name of :mod:`dpl.backends.cpu.backend`, kept for plugins and scripts written against it."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("dpl.backends.cpu.backend")
